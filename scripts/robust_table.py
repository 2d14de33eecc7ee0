"""Tables and figures of the robust-aggregation reproduction (scripts/reproduce_robust.sh) from Hydra multiruns.

Grid mode (``DIRS``): every run folder (``config_resolved.yaml``, ``summary.json``) under the directories is one
(rule, attack fraction, privacy, seed); the script writes ``<out>.md`` (the final round's benign test RMSE and the
target item's exposure, mean ± std over seeds, one row per rule, one column per fraction and privacy setting),
``<out>.csv`` (long format) and ``<out>.png`` (both against the fraction, a panel per metric and privacy setting).

Server mode (``--servers DIRS``): runs of ``fedgnn_ml100k`` with and without ``server=...``; writes ``<out>.md``
(final and best test RMSE per server optimiser) and ``<out>.png`` (test RMSE against the round, mean over seeds).

    .venv/bin/python scripts/robust_table.py reproductions/robust/grid --out reproductions/robust/robust
    .venv/bin/python scripts/robust_table.py --servers reproductions/robust/servers --out reproductions/robust/servers
"""
from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

#: rule label of each aggregator class, in the table's order
RULES = {"FedSGD": "mean (FedSGD)", "FedAvg": "mean (FedAvg, 5 local steps)", "CoordinateMedian": "median",
         "TrimmedMean": "trimmed mean", "Krum": "Krum", "MultiKrum": "Multi-Krum", "NormBound": "norm bound"}
#: label of each server optimiser class (None: task.optimizer, Adam, on the aggregate)
SERVERS = {None: "Adam on the aggregate (default)", "FedAvgM": "FedAvgM", "FedAdagrad": "FedAdagrad",
           "FedAdam": "FedAdam", "FedYogi": "FedYogi"}
METRICS = {"final_test_benign_rmse": "benign test RMSE", "final_test_target_exposure": "target exposure (top-10)"}


def runs_under(dirs: list[Path]) -> list[tuple[dict, dict, Path]]:
    """(resolved config, summary, folder) of every finished run under ``dirs``."""
    out = []
    for d in dirs:
        for summary in sorted(Path(d).rglob("summary.json")):
            folder = summary.parent
            cfg = yaml.safe_load((folder / "config_resolved.yaml").read_text())
            out.append((cfg, json.loads(summary.read_text()), folder))
    return out


def setting(cfg: dict) -> tuple[str, float, str]:
    """(aggregator class, attack fraction, privacy) of a run."""
    privacy = (cfg.get("privacy") or {}).get("mechanism", "none")
    privacy = "none" if privacy == "none" else f"{privacy} ε={float(cfg['privacy']['epsilon']):g}"
    return cfg["aggregator"]["_target_"].rsplit(".", 1)[1], float((cfg.get("attack") or {}).get("fraction", 0.0)), \
        privacy


def mean_std(values: list[float]) -> tuple[float, float, int]:
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0, len(a)


def grid(dirs: list[Path], out: Path) -> str:
    cells: dict[tuple[str, float, str, str], list[float]] = defaultdict(list)
    for cfg, summary, _ in runs_under(dirs):
        rule, fraction, privacy = setting(cfg)
        for metric in METRICS:
            if summary.get(metric) is not None:
                cells[(rule, fraction, privacy, metric)].append(float(summary[metric]))
    if not cells:
        raise SystemExit(f"no finished runs under {[str(d) for d in dirs]}")
    stats = {k: mean_std(v) for k, v in cells.items()}
    fractions = sorted({k[1] for k in stats})
    privacies = sorted({k[2] for k in stats}, key=lambda p: p != "none")
    rules = [r for r in RULES if any(k[0] == r for k in stats)]
    parts = []
    for metric, label in METRICS.items():
        cols = [(p, f) for p in privacies for f in fractions]
        lines = [f"### {label} (final round; mean ± std over seeds)\n",
                 "| rule | " + " | ".join(f"{p}, {100 * f:g}% malicious" for p, f in cols) + " |",
                 "|---" * (len(cols) + 1) + "|"]
        for rule in rules:
            row = [f"{stats[k][0]:.4f} ± {stats[k][1]:.4f}" if (k := (rule, f, p, metric)) in stats else "–"
                   for p, f in cols]
            lines.append(f"| {RULES[rule]} | " + " | ".join(row) + " |")
        parts.append("\n".join(lines) + "\n")
    seeds = sorted({n for *_, n in stats.values()})
    parts.append(f"Seeds per cell: {', '.join(map(str, seeds))}.\n")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(parts))
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["rule", "fraction", "privacy", "metric", "mean", "std", "runs"])
        for (rule, fraction, privacy, metric), (m, s, n) in sorted(stats.items()):
            w.writerow([rule, fraction, privacy, metric, m, s, n])
    plot_grid(stats, rules, fractions, privacies, out.with_suffix(".png"))
    return "\n".join(parts)


def plot_grid(stats: dict, rules: list[str], fractions: list[float], privacies: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(METRICS), len(privacies), figsize=(5 * len(privacies), 7), squeeze=False)
    for row, (metric, label) in enumerate(METRICS.items()):
        for col, privacy in enumerate(privacies):
            ax = axes[row][col]
            for rule in rules:
                pts = [(100 * f, *stats[(rule, f, privacy, metric)][:2]) for f in fractions
                       if (rule, f, privacy, metric) in stats]
                if pts:
                    x, m, s = (np.array(v) for v in zip(*pts))
                    ax.errorbar(x, m, yerr=s, marker="o", capsize=3, label=RULES[rule])
            ax.set_title(f"{label}, privacy {privacy}", fontsize=10)
            ax.set_xlabel("malicious clients, %")
            ax.set_xticks([100 * f for f in fractions])
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("FedGNN on ML-100K under item promotion", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def servers(dirs: list[Path], out: Path) -> str:
    curves: dict[str | None, list[np.ndarray]] = defaultdict(list)
    finals: dict[str | None, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for cfg, summary, folder in runs_under(dirs):
        server = cfg.get("server")
        name = None if server is None else server["_target_"].rsplit(".", 1)[1]
        if name == "FedAvgM" and float(server.get("beta1", 0.0)) == 0.0:
            name = "FedAvg"  # server=fedavg: FedAvgM without momentum
        with open(folder / "metrics.csv", newline="") as f:
            curves[name].append(np.array([float(r["test_rmse"]) for r in csv.DictReader(f)]))
        for metric in ("final_test_rmse", "best_test_rmse"):
            finals[name][metric].append(float(summary[metric]))
    if not curves:
        raise SystemExit(f"no finished runs under {[str(d) for d in dirs]}")
    labels = {**SERVERS, "FedAvg": "FedAvg (server x + ηΔ)"}
    order = [k for k in labels if k in curves]
    lines = ["| server | final test RMSE | best test RMSE | seeds |", "|---|---|---|---|"]
    for name in order:
        f, b = mean_std(finals[name]["final_test_rmse"]), mean_std(finals[name]["best_test_rmse"])
        lines.append(f"| {labels[name]} | {f[0]:.4f} ± {f[1]:.4f} | {b[0]:.4f} ± {b[1]:.4f} | {f[2]} |")
    text = "\n".join(lines) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name in order:
        length = min(len(c) for c in curves[name])
        mean = np.mean([c[:length] for c in curves[name]], axis=0)
        ax.plot(np.arange(1, length + 1), mean, label=labels[name])
    ax.set_xlabel("round")
    ax.set_ylabel("test RMSE (ratings / 5)")
    ax.set_title("FedGNN on ML-100K (FedSGD clients): server optimisers", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    plt.close(fig)
    return text


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="*", type=Path, help="the grid's sweep folders")
    p.add_argument("--servers", nargs="+", type=Path, help="the server optimisers' sweep folders (server mode)")
    p.add_argument("--out", type=Path, required=True, help="output path without extension")
    args = p.parse_args(argv)
    if bool(args.dirs) == bool(args.servers):
        p.error("give either the grid's folders or --servers FOLDERS")
    print(grid(args.dirs, args.out) if args.dirs else servers(args.servers, args.out))


if __name__ == "__main__":
    main()

"""Tables and figures of the robust-aggregation reproduction (scripts/reproduce_robust.sh) from Hydra multiruns.

Reads the ``runs.csv`` (server mode: and ``rounds.csv``) of every sweep folder under the given directories, the
tables fedrec.app.sweeps writes when a multirun ends; only finished jobs count.

Grid mode (``DIRS``): every job is one (rule, attack fraction, privacy, seed); the script writes ``<out>.md`` (the
final round's benign test RMSE and the target item's exposure, mean ± std over seeds, one row per rule, one column
per fraction and privacy setting), ``<out>.csv`` (long format) and ``<out>.png`` (both against the fraction, a panel
per metric and privacy setting). The fraction is the job's ``attack.fraction`` override (0 without an attack).

Server mode (``--servers DIRS``): runs of ``fedgnn_ml100k`` with and without ``server=...``; writes ``<out>.md``
(final and best test RMSE per server optimiser) and ``<out>.png`` (test RMSE against the round, mean over seeds).

A table pools seeds only: a rule, model, attack or server optimiser the script has no label for, two attacks in one
table, or jobs of one cell that differ in any other override (e.g. ``task.rounds``) are ``error: ...`` naming it.

    .venv/bin/python scripts/robust_table.py reproductions/robust/grid --out reproductions/robust/robust
    .venv/bin/python scripts/robust_table.py --servers reproductions/robust/servers --out reproductions/robust/servers
"""
from __future__ import annotations

import argparse
import csv
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from fedrec.app.plots import integer_ticks, legend_below, save_figure, set_title, subplots
from fedrec.app.sweeps import finished_runs, read_rounds, refuse_pooling
from fedrec.errors import ConfigError, run_script

#: rule label of each aggregator class, in the table's order
RULES = {"FedSGD": "mean (FedSGD)", "FedAvg": "mean (FedAvg, 5 local steps)", "CoordinateMedian": "median",
         "TrimmedMean": "trimmed mean", "Krum": "Krum", "MultiKrum": "Multi-Krum", "NormBound": "norm bound",
         "GeometricMedian": "geometric median", "Bulyan": "Bulyan", "CenteredClipping": "centered clipping"}
#: label of each attack class (``none``: no attack configured)
ATTACKS = {"none": "no attack", "ItemPromotion": "item promotion", "GaussianNoise": "Gaussian noise",
           "ScaledUpdates": "scaled updates", "ALittleIsEnough": "a little is enough (ALIE)", "MinMax": "min-max"}
#: label of each model class
MODELS = {"FedGNN": "FedGNN", "MatrixFactorization": "MF"}
#: label of each server optimiser class (default: no server optimiser, task.optimizer, Adam, on the aggregate;
#: FedAvg: server=fedavg, FedAvgM without momentum)
SERVERS = {"default": "Adam on the aggregate (default)", "FedAvgM": "FedAvgM", "FedAdagrad": "FedAdagrad",
           "FedAdam": "FedAdam", "FedYogi": "FedYogi", "FedAvg": "FedAvg (server x + ηΔ)"}
METRICS = {"final_test_benign_rmse": "benign test RMSE", "final_test_target_exposure": "target exposure (top-10)"}
#: why a table refuses jobs of one cell that differ in more than the seed, and what to do
POOLS = "the table pools seeds only: give each value its own table"


def known(field: str, names: Iterable[str], labels: dict[str, str]) -> None:
    """Refuse the ``names`` that ``labels`` has no label for, naming them and the summary ``field``."""
    unknown = sorted(set(names) - set(labels))
    if unknown:
        raise ConfigError(f"{field}: no label for {', '.join(unknown)} in scripts/robust_table.py "
                          f"(it knows {', '.join(labels)})")


def column(results: pd.DataFrame, name: str, default: str = "none") -> pd.Series:
    """A text field of the jobs' summaries, ``default`` where a job has none (e.g. no attack)."""
    values = results[name] if name in results else pd.Series(default, index=results.index, dtype=object)
    return values.fillna(default)


def privacy_labels(results: pd.DataFrame) -> pd.Series:
    """Each job's privacy setting: none, or its mechanism and total ε."""
    epsilon = results["epsilon_total"] if "epsilon_total" in results else pd.Series(np.nan, index=results.index)
    return pd.Series(["none" if p == "none" else f"{p} ε={float(e):g}"
                      for p, e in zip(column(results, "privacy"), epsilon)], index=results.index)


def attack_fractions(overrides: pd.DataFrame, attacks: pd.Series) -> pd.Series:
    """Each job's share of malicious clients: its ``attack.fraction`` override, 0 without an attack."""
    given = pd.to_numeric(overrides["attack.fraction"], errors="coerce") if "attack.fraction" in overrides \
        else pd.Series(np.nan, index=overrides.index)
    fraction = given.where(attacks != "none", 0.0)
    if fraction.isna().any():
        raise ConfigError("attack.fraction: the table's columns are attack fractions, but some jobs under attack "
                          "were not given one on the command line (sweep attack.fraction=0,0.05,0.2)")
    return fraction


def grid_stats(dirs: list[Path]) -> tuple[dict, str]:
    """(stats, title): mean, std and runs of each (rule, fraction, privacy, metric), and what the runs are."""
    overrides, results = finished_runs(dirs)
    missing = [m for m in METRICS if m not in results]
    if missing:
        raise ConfigError(f"the jobs report no {', '.join(missing)} (runs of *_ml100k_robust expected)")
    attacks = column(results, "attack")
    for field, labels in (("aggregator", RULES), ("model", MODELS), ("attack", ATTACKS)):
        known(field, column(results, field), labels)
    kinds = sorted(set(attacks) - {"none"})
    if len(kinds) > 1:
        raise ConfigError(f"attack: the jobs run {', '.join(kinds)}: {POOLS}")
    frame = pd.DataFrame({"rule": results["aggregator"], "fraction": attack_fractions(overrides, attacks),
                          "privacy": privacy_labels(results), **{m: results[m] for m in METRICS}})
    cells = frame["rule"] + ", " + frame["fraction"].map("{:g} malicious".format) + ", " + frame["privacy"]
    refuse_pooling(overrides, cells, POOLS)
    long = frame.melt(id_vars=["rule", "fraction", "privacy"], var_name="metric").dropna(subset=["value"])
    agg = long.groupby(["rule", "fraction", "privacy", "metric"])["value"].agg(["mean", "std", "count"])
    stats = {key: (m, 0.0 if n == 1 else s, int(n)) for key, (m, s, n) in zip(agg.index, agg.to_numpy())}
    models = " / ".join(MODELS[m] for m in dict.fromkeys(results["model"]))
    datasets = " / ".join(str(d).upper() for d in dict.fromkeys(column(results, "dataset", "?")))
    return stats, f"{models} on {datasets} under {ATTACKS[kinds[0]] if kinds else 'no attack'}"


def grid(dirs: list[Path], out: Path) -> str:
    stats, title = grid_stats(dirs)
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
    plot_grid(stats, rules, fractions, privacies, out.with_suffix(".png"), title)
    return "\n".join(parts)


def plot_grid(stats: dict, rules: list[str], fractions: list[float], privacies: list[str], path: Path,
              title: str) -> None:
    fig, axes = subplots(len(METRICS), len(privacies), figsize=(5 * len(privacies), 7.8), squeeze=False)
    for row, (metric, label) in enumerate(METRICS.items()):
        for col, privacy in enumerate(privacies):
            ax = axes[row][col]
            for rule in rules:
                pts = [(100 * f, *stats[(rule, f, privacy, metric)][:2]) for f in fractions
                       if (rule, f, privacy, metric) in stats]
                if pts:
                    x, m, s = (np.array(v) for v in zip(*pts))
                    ax.errorbar(x, m, yerr=s, marker="o", capsize=3, label=RULES[rule])
            set_title(ax, f"{label}, privacy {privacy}")
            ax.set_xlabel("malicious clients, %")
            ax.set_xticks([100 * f for f in fractions])
            ax.grid(alpha=0.3)
    set_title(fig, title, fontsize="large")
    legend_below(fig, axes[0][0])
    save_figure(fig, path)


def server_names(overrides: pd.DataFrame, results: pd.DataFrame) -> pd.Series:
    """Each job's server optimiser: its class, ``default`` without one, ``FedAvg`` for server=fedavg (FedAvgM
    without momentum)."""
    names = column(results, "server_optimizer", "default")
    if "server" in overrides:
        names = names.where(~((names == "FedAvgM") & (overrides["server"] == "fedavg")), "FedAvg")
    known("server_optimizer", names, SERVERS)
    return names


def servers(dirs: list[Path], out: Path) -> str:
    overrides, results = finished_runs(dirs)
    names = server_names(overrides, results)
    refuse_pooling(overrides, names, POOLS)
    rounds = {sweep: read_rounds(Path(sweep)) for sweep in dict.fromkeys(results["sweep"])}
    curves: dict[str, list[np.ndarray]] = defaultdict(list)
    for name, sweep, job in zip(names, results["sweep"], results["job"]):
        curves[name].append(rounds[sweep][str(job)]["test_rmse"].dropna().to_numpy())
    order = [k for k in SERVERS if k in curves]
    lines = ["| server | final test RMSE | best test RMSE | seeds |", "|---|---|---|---|"]
    for name in order:
        f, b = (mean_std(results.loc[names == name, m].astype(float)) for m in ("final_test_rmse", "best_test_rmse"))
        lines.append(f"| {SERVERS[name]} | {f[0]:.4f} ± {f[1]:.4f} | {b[0]:.4f} ± {b[1]:.4f} | {f[2]} |")
    text = "\n".join(lines) + "\n"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    plot_servers(curves, order, out.with_suffix(".png"))
    return text


def mean_std(values: pd.Series) -> tuple[float, float, int]:
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0, len(a)


def plot_servers(curves: dict[str, list[np.ndarray]], order: list[str], path: Path) -> None:
    fig, ax = subplots(figsize=(6.5, 4.4))
    for name in order:
        length = min(len(c) for c in curves[name])
        mean = np.mean([c[:length] for c in curves[name]], axis=0)
        ax.plot(np.arange(1, length + 1), mean, label=SERVERS[name])
    ax.set_xlabel("round")
    integer_ticks(ax)
    ax.set_ylabel("test RMSE (ratings / 5)")
    set_title(ax, "FedGNN on ML-100K (FedSGD clients): server optimisers")
    ax.grid(alpha=0.3)
    legend_below(fig, ax)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="*", type=Path, help="the grid's sweep folders")
    p.add_argument("--servers", nargs="+", type=Path, help="the server optimisers' sweep folders (server mode)")
    p.add_argument("--out", type=Path, required=True, help="output path without extension")
    args = p.parse_args(argv)
    if bool(args.dirs) == bool(args.servers):
        p.error("give either the grid's folders or --servers FOLDERS")
    run_script(lambda: print(grid(args.dirs, args.out) if args.dirs else servers(args.servers, args.out)))


if __name__ == "__main__":
    main()

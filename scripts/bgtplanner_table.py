"""BGTplanner's Table II from Hydra multiruns: our mean ± std over seeds beside the paper's numbers.

Reads every ``summary.json`` under the given directories (runs of ``fedgnn_<ds>`` and ``bgtplanner_<ds>`` with
``planner=...`` and ``privacy=...``), groups them by (dataset, mechanism, method) and writes ``<out>.md`` (one
table per metric: final and best-over-rounds test RMSE and F1, and for runs under ``privacy.conventions=authors``
the authors' nominal ε beside the accountant's true ε) and ``<out>.csv`` (long format).

    .venv/bin/python scripts/bgtplanner_table.py reproductions/bgtplanner/table2_* \\
        reproductions/bgtplanner/fedsgd_* --out reproductions/bgtplanner/table2
"""
from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

DATASETS = {"filmtrust": "FT", "ml-100k": "100K", "ml-1m": "1M"}
MECHANISMS = {"gaussian": "GM", "laplace": "LM"}
METHODS = {"fedsgd": "FedSGD (no DP)", "bgtplanner": "BGTplanner", "adpml": "ADPML", "adap": "ADAP",
           "uniform": "Uniform (DPSGD for GM)"}
#: paper Table II; FedSGD spans both mechanisms; DPSGD has no LM column
PAPER = {
    "rmse": {
        "fedsgd": {"filmtrust": 0.2905, "ml-100k": 0.2017, "ml-1m": 0.2006},
        "bgtplanner": {("filmtrust", "gaussian"): 0.3746, ("filmtrust", "laplace"): 0.4114,
                       ("ml-100k", "gaussian"): 0.3223, ("ml-100k", "laplace"): 0.3449,
                       ("ml-1m", "gaussian"): 0.3135, ("ml-1m", "laplace"): 0.3484},
        "adpml": {("filmtrust", "gaussian"): 0.3898, ("filmtrust", "laplace"): 0.4258,
                  ("ml-100k", "gaussian"): 0.3442, ("ml-100k", "laplace"): 0.3815,
                  ("ml-1m", "gaussian"): 0.3558, ("ml-1m", "laplace"): 0.4217},
        "adap": {("filmtrust", "gaussian"): 0.3970, ("filmtrust", "laplace"): 0.4435,
                 ("ml-100k", "gaussian"): 0.3553, ("ml-100k", "laplace"): 0.4092,
                 ("ml-1m", "gaussian"): 0.3958, ("ml-1m", "laplace"): 0.4621},
        "uniform": {("filmtrust", "gaussian"): 0.4093, ("ml-100k", "gaussian"): 0.3356,
                    ("ml-1m", "gaussian"): 0.3210},
    },
    "f1": {
        "fedsgd": {"filmtrust": 0.8354, "ml-100k": 0.9018, "ml-1m": 0.9137},
        "bgtplanner": {("filmtrust", "gaussian"): 0.6685, ("filmtrust", "laplace"): 0.6517,
                       ("ml-100k", "gaussian"): 0.6444, ("ml-100k", "laplace"): 0.6421,
                       ("ml-1m", "gaussian"): 0.6524, ("ml-1m", "laplace"): 0.6431},
        "adpml": {("filmtrust", "gaussian"): 0.6395, ("filmtrust", "laplace"): 0.6338,
                  ("ml-100k", "gaussian"): 0.6358, ("ml-100k", "laplace"): 0.6404,
                  ("ml-1m", "gaussian"): 0.6407, ("ml-1m", "laplace"): 0.6417},
        "adap": {("filmtrust", "gaussian"): 0.6389, ("filmtrust", "laplace"): 0.6194,
                 ("ml-100k", "gaussian"): 0.6366, ("ml-100k", "laplace"): 0.6312,
                 ("ml-1m", "gaussian"): 0.6404, ("ml-1m", "laplace"): 0.6379},
        "uniform": {("filmtrust", "gaussian"): 0.6680, ("ml-100k", "gaussian"): 0.6412,
                    ("ml-1m", "gaussian"): 0.6501},
    },
}


def paper_value(metric: str, method: str, dataset: str, mechanism: str) -> float | None:
    kind = metric.split("_")[-1]
    if kind not in PAPER:
        return None
    table = PAPER[kind].get(method, {})
    return table.get(dataset) if method == "fedsgd" else table.get((dataset, mechanism))


def improvements(cell: dict[tuple[str, str, str], float], metric: str) -> dict[str, float]:
    """BGTplanner's relative gain over the best other DP method per (dataset, mechanism) cell, in % (the paper's
    "average improvement"): RMSE (best - ours) / best, F1 (ours - best) / best; with per-mechanism and overall
    means. ``cell`` maps (dataset, mechanism, method) to a value. Only the methods the paper reports in that cell
    compete (so not Uniform under Laplace, where the paper has no DPSGD), to keep the figures comparable."""
    lower_better = metric == "rmse"
    gains: dict[str, float] = {}
    for d, mech in sorted({(d, m) for d, m, _ in cell}):
        ours = cell.get((d, mech, "bgtplanner"))
        others = [v for (dd, mm, meth), v in cell.items() if dd == d and mm == mech and meth != "bgtplanner"
                  and paper_value(metric, meth, d, mech) is not None]
        if ours is None or not others:
            continue
        best = min(others) if lower_better else max(others)
        gains[f"{d} {mech}"] = 100 * ((best - ours) if lower_better else (ours - best)) / best
    for mech in MECHANISMS:
        vals = [v for k, v in gains.items() if k.endswith(mech)]
        if vals:
            gains[f"mean {mech}"] = float(np.mean(vals))
    cells = [v for k, v in gains.items() if not k.startswith("mean")]
    if cells:
        gains["mean"] = float(np.mean(cells))
    return gains


def paper_cells(metric: str) -> dict[tuple[str, str, str], float]:
    """The paper's DP cells of Table II as (dataset, mechanism, method) -> value."""
    return {(d, m, method): v for method, table in PAPER[metric].items() if method != "fedsgd"
            for (d, m), v in table.items()}


def load_runs(dirs: list[Path]) -> list[dict]:
    runs = []
    for d in dirs:
        for path in sorted(Path(d).rglob("summary.json")):
            s = json.loads(path.read_text())
            if s.get("privacy") == "none":
                s["method"], s["mechanism"] = "fedsgd", "none"
            else:
                s["method"], s["mechanism"] = s.get("planner", "uniform"), s["privacy"]
            runs.append(s)
    return runs


def aggregate(runs: list[dict], metrics: list[str]) -> dict:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for s in runs:
        groups[(s["dataset"], s["mechanism"], s["method"])].append(s)
    out = {}
    for key, members in groups.items():
        for m in metrics:
            if any(s.get(m) is None for s in members):  # e.g. epsilon_spent of non-private runs
                continue
            vals = np.array([s[m] for s in members], dtype=float)
            out[key + (m,)] = (float(vals.mean()), float(vals.std(ddof=1)) if len(vals) > 1 else 0.0, len(vals))
    return out


def markdown(stats: dict, metric: str, datasets: list[str]) -> str:
    cols = [(d, m) for d in datasets for m in MECHANISMS]
    head = "| method | " + " | ".join(f"{DATASETS[d]} {MECHANISMS[m]}" for d, m in cols) + " |"
    lines = [head, "|---" * (len(cols) + 1) + "|"]
    for method, label in METHODS.items():
        cells = []
        for d, mech in cols:
            key = (d, "none" if method == "fedsgd" else mech, method, metric)
            paper = paper_value(metric, method, d, mech)
            ours = f"{stats[key][0]:.4f} ± {stats[key][1]:.4f}" if key in stats else "–"
            cells.append(f"{ours} ({paper:.4f})" if paper is not None else ours)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def epsilon_table(stats: dict, datasets: list[str]) -> str | None:
    """The authors' nominal ε (Σ_t ε_t) beside the accountant's true ε for the same noise (max over clients, mean
    over seeds), per cell; None when no run reports a nominal ε (the paper's conventions)."""
    if not any(k[3] == "epsilon_nominal" for k in stats):
        return None
    cols = [(d, m) for d in datasets for m in MECHANISMS]
    lines = ["| method | " + " | ".join(f"{DATASETS[d]} {MECHANISMS[m]}" for d, m in cols) + " |",
             "|---" * (len(cols) + 1) + "|"]
    for method, label in METHODS.items():
        if method == "fedsgd":
            continue
        cells = []
        for d, mech in cols:
            nominal, true = stats.get((d, mech, method, "epsilon_nominal")), stats.get((d, mech, method,
                                                                                       "epsilon_spent"))
            cells.append(f"{nominal[0]:.2f} / {true[0]:.4g}" if nominal and true else "–")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True, help="output path without extension")
    args = p.parse_args()
    metrics = ["final_test_rmse", "best_test_rmse", "final_test_f1", "best_test_f1", "rounds_run", "epsilon_spent",
               "epsilon_nominal"]
    runs = load_runs(args.dirs)
    if not runs:
        raise SystemExit(f"no summary.json under {[str(d) for d in args.dirs]}")
    stats = aggregate(runs, metrics)
    datasets = [d for d in DATASETS if any(s["dataset"] == d for s in runs)]
    parts = ["Our mean ± std over seeds (paper's Table II value in brackets). Rounds and ε per cell in the CSV.\n"]
    for metric in ("final_test_rmse", "best_test_rmse", "final_test_f1", "best_test_f1"):
        parts.append(f"### {metric}\n\n{markdown(stats, metric, datasets)}\n")
        kind = metric.split("_")[-1]
        ours = {(d, m, meth): v[0] for (d, m, meth, mt), v in stats.items() if mt == metric and meth != "fedsgd"}
        gain, paper = improvements(ours, kind), improvements(paper_cells(kind), kind)
        parts.append("BGTplanner's gain over the best other DP method, %: "
                     + ", ".join(f"{k} {v:+.2f} (paper {paper[k]:+.2f})" if k in paper else f"{k} {v:+.2f}"
                                 for k, v in gain.items()) + "\n")
    eps = epsilon_table(stats, datasets)
    if eps is not None:
        parts.append("### epsilon: the authors' nominal / the accountant's true (delta = 1e-5 for GM)\n\n" + eps + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text("\n".join(parts))
    with open(args.out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["dataset", "mechanism", "method", "metric", "mean", "std", "runs", "paper"])
        for (d, mech, method, metric), (mean, std, n) in sorted(stats.items()):
            w.writerow([d, mech, method, metric, mean, std, n, paper_value(metric, method, d, mech) or ""])
    print("\n".join(parts))


if __name__ == "__main__":
    main()

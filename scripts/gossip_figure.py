"""Fig. 2 of Zhu et al. from run directories of the gossip experiments: regret over time per ε (mean over trials
and agents, min–max band over trials), and the table of R(t) at t = 6·10^5 with the ratios R(1) : R(2) : R(5), in
total and in excess of ε = ∞ (the paper claims about 1 : 1/2 : 1/5).

    .venv/bin/python scripts/gossip_figure.py OUT.png RUN_DIR...      # each RUN_DIR holds metrics.csv, summary.json
"""
from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter

from fedrec.app.plots import legend_below, save_figure, set_title, subplots

AT = 600_000


def load(run: Path) -> tuple[float, list[dict[str, float]]]:
    summary = json.loads((run / "summary.json").read_text())
    with open(run / "metrics.csv", newline="") as f:
        rows = [{k: float(v) for k, v in r.items() if v != ""} for r in csv.DictReader(f)]
    return float(summary["epsilon"]), rows


def regret_at(rows: list[dict[str, float]], t: int) -> float:
    """The logged mean regret at the first logged step >= t."""
    return next(r["cumulative_regret"] for r in rows if r["steps"] >= t)


def draw(runs: list[tuple[float, list[dict[str, float]]]], title: str) -> Figure:
    """Mean regret against the round per ε, with the min–max band over trials; the legend under the axes."""
    fig, ax = subplots(figsize=(5.5, 4.2))
    for eps, rows in runs:
        t = [r["steps"] for r in rows]
        ax.plot(t, [r["cumulative_regret"] for r in rows], label=f"ε = {eps:g}".replace("inf", "∞"))
        ax.fill_between(t, [r["cumulative_regret_min"] for r in rows], [r["cumulative_regret_max"] for r in rows],
                        alpha=0.2)
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 200k, 1M: no offset text beside the axis
    ax.set_xlabel("round $t$")
    ax.set_ylabel("regret (mean over agents and trials)")
    if title:
        set_title(ax, title)
    ax.grid(alpha=0.3)
    legend_below(fig, ax)
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("runs", type=Path, nargs="+")
    p.add_argument("--title", default="")
    args = p.parse_args()
    runs = sorted((load(r) for r in args.runs), key=lambda e: e[0])
    save_figure(draw(runs, args.title), args.out)
    at = {eps: regret_at(rows, AT) for eps, rows in runs if rows[-1]["steps"] >= AT}
    base = at.get(math.inf, 0.0)
    print("| ε | R(6·10^5) | in excess of ε = ∞ | final R(T) (min–max over trials) |\n|---|---|---|---|")
    for eps, rows in runs:
        last = rows[-1]
        r = at.get(eps, math.nan)
        print(f"| {eps:g} | {r:.0f} | {r - base:.0f} | {last['cumulative_regret']:.0f} "
              f"({last['cumulative_regret_min']:.0f}–{last['cumulative_regret_max']:.0f}) |")
    finite = [e for e in (1.0, 2.0, 5.0) if e in at]
    if len(finite) == 3:
        total = [at[e] / at[1.0] for e in finite]
        excess = [(at[e] - base) / (at[1.0] - base) for e in finite]
        print(f"\nR(1) : R(2) : R(5) = {' : '.join(f'{v:.2f}' for v in total)} in total, "
              f"{' : '.join(f'{v:.2f}' for v in excess)} in excess of ε = ∞ (paper: 1 : 0.50 : 0.20)")


if __name__ == "__main__":
    main()

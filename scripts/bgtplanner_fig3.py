"""BGTplanner's Figure 3 from Hydra multiruns: final test RMSE and F1 against the total budget ε, per planner.

Reads every ``summary.json`` under the given directories (``bgtplanner_<ds>`` runs swept over
``privacy.epsilon`` and ``planner``, one mechanism per directory or mixed), averages over seeds, draws one row
of panels (RMSE, F1) per mechanism into a PNG and prints the numbers as a Markdown table.

    .venv/bin/python scripts/bgtplanner_fig3.py reproductions/bgtplanner/fig3_* --out fig3.png
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from fedrec.app.plots import legend_below, save_figure, set_title, subplots

PLANNERS = ("bgtplanner", "uniform", "adpml", "adap")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    cells: dict[tuple[str, str, float], list[dict]] = defaultdict(list)
    for d in args.dirs:
        for path in sorted(d.rglob("summary.json")):
            s = json.loads(path.read_text())
            if s.get("planner"):
                cells[(s["privacy"], s["planner"], float(s["epsilon_total"]))].append(s)
    if not cells:
        raise SystemExit("no planner runs found")
    rows = ["| mechanism | planner | ε | final RMSE | final F1 | rounds | seeds |", "|---|---|---|---|---|---|---|"]
    for mech, planner, e in sorted(cells, key=lambda k: (k[0], PLANNERS.index(k[1]) if k[1] in PLANNERS else -1, k[2])):
        if planner in PLANNERS:
            r = cells[(mech, planner, e)]
            rmse, f1 = np.mean([s["final_test_rmse"] for s in r]), np.mean([s["final_test_f1"] for s in r])
            rounds = np.mean([s["rounds_run"] for s in r])
            rows.append(f"| {mech} | {planner} | {e:g} | {rmse:.4f} | {f1:.4f} | {rounds:.1f} | {len(r)} |")
    save_figure(draw(cells), args.out)
    print("\n".join(rows))


def draw(cells: dict[tuple[str, str, float], list[dict]]) -> Figure:
    """One row of panels (RMSE, F1 against ε, mean over seeds) per mechanism, one line per planner."""
    mechanisms = sorted({k[0] for k in cells})
    fig, axes = subplots(len(mechanisms), 2, figsize=(9, 3.4 * len(mechanisms) + 0.6), squeeze=False)
    for i, mech in enumerate(mechanisms):
        for planner in PLANNERS:
            eps = sorted(e for m, pl, e in cells if m == mech and pl == planner)
            if not eps:
                continue
            runs = [cells[(mech, planner, e)] for e in eps]
            axes[i, 0].plot(eps, [np.mean([s["final_test_rmse"] for s in r]) for r in runs], marker="o",
                            label=planner)
            axes[i, 1].plot(eps, [np.mean([s["final_test_f1"] for s in r]) for r in runs], marker="o",
                            label=planner)
        for j, name in enumerate(("final test RMSE", "final test F1")):
            axes[i, j].set_xlabel("total budget ε per client")
            axes[i, j].set_ylabel(name)
            set_title(axes[i, j], f"{mech} mechanism")
            axes[i, j].grid(alpha=0.3)
    legend_below(fig, axes[0, 0])
    return fig


if __name__ == "__main__":
    main()

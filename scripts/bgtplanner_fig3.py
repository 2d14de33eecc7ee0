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

from fedrec.plots import plt, save_figure

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
    mechanisms = sorted({k[0] for k in cells})
    fig, axes = plt.subplots(len(mechanisms), 2, figsize=(9, 3.4 * len(mechanisms)), dpi=120, squeeze=False)
    rows = ["| mechanism | planner | ε | final RMSE | final F1 | rounds | seeds |", "|---|---|---|---|---|---|---|"]
    for i, mech in enumerate(mechanisms):
        for planner in PLANNERS:
            eps = sorted(e for m, pl, e in cells if m == mech and pl == planner)
            if not eps:
                continue
            runs = [cells[(mech, planner, e)] for e in eps]
            rmse = [np.mean([s["final_test_rmse"] for s in r]) for r in runs]
            f1 = [np.mean([s["final_test_f1"] for s in r]) for r in runs]
            axes[i, 0].plot(eps, rmse, marker="o", label=planner)
            axes[i, 1].plot(eps, f1, marker="o", label=planner)
            for e, r, a, b in zip(eps, runs, rmse, f1):
                rounds = np.mean([s["rounds_run"] for s in r])
                rows.append(f"| {mech} | {planner} | {e:g} | {a:.4f} | {b:.4f} | {rounds:.1f} | {len(r)} |")
        for j, name in enumerate(("final test RMSE", "final test F1")):
            axes[i, j].set_xlabel("total budget ε per client")
            axes[i, j].set_ylabel(name)
            axes[i, j].set_title(f"{mech} mechanism")
            axes[i, j].grid(alpha=0.3)
        axes[i, 0].legend()
    fig.tight_layout()
    save_figure(fig, args.out)
    print("\n".join(rows))


if __name__ == "__main__":
    main()

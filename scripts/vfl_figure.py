"""Fig. 4 and Fig. 6(a, b) of Cao et al. from the run directories that ``scripts/reproduce_vfl.sh`` writes.

Fig. 4: cumulative regret of central, VFCB and partial (ratio 0.2) for UCB and TS (log y), and the differences to
central over time (‖θ‖ − ‖θ_central‖ and the regret difference). Fig. 6: partial 0.2 / 0.8 / full. Every curve is
the mean over seeds (replicates); the table adds the spread over seeds.

    .venv/bin/python scripts/vfl_figure.py OUT_DIR   # every OUT_DIR/*/ with summary.json, metrics.csv and
                                                     # config_resolved.yaml
    .venv/bin/python scripts/vfl_figure.py --replay OUT_DIR   # the relative-CTR table of the MovieLens replay
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np
import yaml
from matplotlib.figure import Figure

from fedrec.app.plots import integer_ticks, legend_beside, save_figure, set_title, subplots


def identify(run: Path) -> tuple[str, str, str]:
    """(name, label, family) of a run directory, from its resolved config."""
    cfg = yaml.safe_load((run / "config_resolved.yaml").read_text())["protocol"]
    family = "ts" if cfg["policy"]["_target_"].endswith("LinTS") else "ucb"
    policy = {"ucb": "LinUCB", "ts": "LinTS"}[family]
    if cfg["mode"] == "vertical":
        return "vertical", {"ucb": "VFUCB", "ts": "VFTS"}[family], family
    if cfg["mode"] == "central":
        return "central", f"central {policy}", family
    return f"partial {cfg['partial_ratio']:g}", f"partial {policy} {cfg['partial_ratio']:g}", family


def load(run: Path) -> tuple[dict, dict[str, np.ndarray]]:
    summary = json.loads((run / "summary.json").read_text())
    with open(run / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("cumulative_regret")]
    cols = {k: np.array([float(r[k]) for r in rows]) for k in ("steps", "cumulative_regret",
                                                                 "theta_norm_diff_central")}
    return summary, cols


def replay_table(out: Path) -> None:
    """Relative CTR (mean ± std over seeds) of every replay run, by context construction and method."""
    rows = []
    for path in sorted(out.glob("*/summary.json")):
        summary = json.loads(path.read_text())
        combine = yaml.safe_load((path.parent / "config_resolved.yaml").read_text())["env"]["combine"]
        name, label, _ = identify(path.parent)
        rank = ("central", "vertical", "partial 0.8", "partial 0.2").index(name)
        rows.append((combine, rank, label, summary))
    print("| contexts | method | relative CTR (mean ± std over seeds) | CTR | counted steps | seconds |")
    print("|---|---|---|---|---|---|")
    for combine, _, label, s in sorted(rows, key=lambda r: r[:2]):
        print(f"| {combine} | {label} | {s['relative_ctr']:.4f} ± {s.get('relative_ctr_std', 0.0):.4f} | "
              f"{s['ctr']:.4f} | {s['matched_steps']:.0f} | {s['wall_seconds']:.0f} |")


Runs = dict[tuple[str, str], tuple[str, dict, dict[str, np.ndarray]]]


def draw_fig4(runs: Runs) -> Figure:
    """Fig. 4: per family (rows), the regret of vertical, central and partial 0.2 (log y) and their differences to
    central (‖θ‖ and regret)."""
    fig, axes = subplots(2, 2, figsize=(12, 7.5))
    for row, family in enumerate(("ucb", "ts")):
        central = runs.get((family, "central"))
        for (fam, name), (label, _, cols) in runs.items():
            if fam != family or name == "partial 0.8":
                continue
            axes[row, 0].plot(cols["steps"], cols["cumulative_regret"], label=label)
            if central is not None and name != "central":
                axes[row, 1].plot(cols["steps"], cols["theta_norm_diff_central"], label=f"{label}: ‖θ‖ − ‖θ_central‖")
                axes[row, 1].plot(cols["steps"], cols["cumulative_regret"] - central[2]["cumulative_regret"], "--",
                                  label=f"{label}: regret − central")
        policy = {"ucb": "LinUCB", "ts": "LinTS"}[family]
        axes[row, 0].set_yscale("log")
        axes[row, 0].set_ylabel("cumulative regret (mean of seeds)")
        set_title(axes[row, 0], f"{policy}: cumulative regret")
        axes[row, 1].set_yscale("symlog", linthresh=1e-3)
        axes[row, 1].set_ylabel("difference to central")
        set_title(axes[row, 1], f"{policy}: difference to the central run")
        for ax in axes[row]:
            ax.set_xlabel("round t")
            integer_ticks(ax)
            ax.grid(alpha=0.3)
            legend_beside(ax)
    return fig


def draw_fig6(runs: Runs) -> Figure:
    """Fig. 6(a, b): the regret of full (central) and partial 0.2 / 0.8, one panel per family (log y)."""
    fig, axes = subplots(1, 2, figsize=(12, 3.8))
    for ax, family in zip(axes, ("ucb", "ts")):
        for (fam, name), (label, _, cols) in runs.items():
            if fam == family and name != "vertical":
                ax.plot(cols["steps"], cols["cumulative_regret"], label=label.replace("central", "full"))
        set_title(ax, f"{'LinUCB' if family == 'ucb' else 'LinTS'}: full and partial contexts")
        ax.set_yscale("log")
        ax.set_xlabel("round t")
        integer_ticks(ax)
        ax.set_ylabel("cumulative regret (mean of seeds)")
        ax.grid(alpha=0.3)
        legend_beside(ax)
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--replay", action="store_true", help="print the replay (relative CTR) table instead")
    args = p.parse_args()
    if args.replay:
        replay_table(args.out)
        return
    runs: Runs = {}
    for path in sorted(args.out.glob("*/summary.json")):
        name, label, family = identify(path.parent)
        runs[(family, name)] = (label, *load(path.parent))
    order = ("vertical", "central", "partial 0.2", "partial 0.8")
    runs = {k: runs[k] for f in ("ucb", "ts") for n in order for k in [(f, n)] if k in runs}
    save_figure(draw_fig4(runs), args.out / "vfl_fig4.png")
    save_figure(draw_fig6(runs), args.out / "vfl_fig6.png")

    print("| method | R(T) mean ± std over seeds | ÷ central | ‖θ‖ − ‖θ_central‖ at T | seconds |")
    print("|---|---|---|---|---|")
    for (family, _), (label, summary, _) in runs.items():
        base = runs[(family, "central")][1]["cumulative_regret"] if (family, "central") in runs else float("nan")
        print(f"| {label} | {summary['cumulative_regret']:.2f} ± {summary.get('cumulative_regret_std', 0.0):.2f} | "
              f"{summary['cumulative_regret'] / base:.2f} | {summary['theta_norm_diff_central']:.2e} | "
              f"{summary['wall_seconds']:.1f} |")


if __name__ == "__main__":
    main()

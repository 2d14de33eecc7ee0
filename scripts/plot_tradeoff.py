"""Regret (or normalised reward) against communication, one dot per threshold: the paper's Fig. 2 / Fig. 4.

Reads one or more Hydra multirun folders (each job folder holds summary.json and .hydra/config.yaml), writes a
PNG (by default ``tradeoff.png`` in the first multirun folder) and prints a Markdown table. Example:

    python train.py -m +experiment=async_linucb_synthetic protocol.gamma_u=1.01,1.5,3,10,100,inf
    python train.py -m +experiment=sync_linucb_synthetic protocol.threshold=0.1,1,10,100,1000
    python scripts/plot_tradeoff.py multirun/async_linucb_synthetic/<date> multirun/sync_linucb_synthetic/<date> \
        --out fig2a.png
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from matplotlib.figure import Figure
from omegaconf import OmegaConf

from fedrec.app.plots import label_points, legend_below, save_figure, set_title, subplots

PROTOCOL_NAMES = {"AsyncLinUCB": "Async-LinUCB", "SyncLinUCB": "Sync-LinUCB", "AsyncLinUCBAM": "Async-LinUCB-AM",
                  "CentralizedLinUCB": "centralised"}


def load_jobs(folders: list[Path]) -> list[dict]:
    """One record per finished job: protocol name, threshold, and the summary."""
    jobs = []
    for folder in folders:
        for summary in sorted(folder.glob("**/summary.json")):
            cfg = OmegaConf.load(summary.parent / ".hydra" / "config.yaml")
            proto = cfg.protocol._target_.rsplit(".", 1)[-1]
            # the centralised protocol is the γ = 1 end of the trade-off
            threshold = cfg.protocol.get("threshold", cfg.protocol.get("gamma_u", 1.0))
            jobs.append({"protocol": PROTOCOL_NAMES.get(proto, proto), "threshold": float(threshold),
                         **json.loads(summary.read_text())})
    return jobs


def draw(jobs: list[dict], metric: str) -> Figure:
    """``metric`` against communication, one point per job labelled with its threshold, one colour per protocol."""
    fig, ax = subplots(figsize=(6, 4.8))
    names = sorted({j["protocol"] for j in jobs})
    for name in names:
        rows = sorted((j for j in jobs if j["protocol"] == name), key=lambda j: j["threshold"])
        ax.scatter([j["comm_messages"] for j in rows], [j[metric] for j in rows], label=name)
    ax.set_xscale("symlog", linthresh=1.0)
    values = [j[metric] for j in jobs]
    if min(values) > 0 and max(values) / min(values) > 10:
        ax.set_yscale("log")
    ax.set_xlabel("communication cost $C_T$ (messages)")
    ax.set_ylabel(metric.replace("_", " "))
    ax.grid(alpha=0.3)
    set_title(ax, f"{metric.replace('_', ' ')} against communication of {', '.join(names)}; each point is labelled "
                  "with its threshold ($\\gamma_U$, or $D$)")
    legend_below(fig, ax)
    label_points(ax, [j["comm_messages"] for j in jobs], [j[metric] for j in jobs],
                 [f"{j['threshold']:g}" for j in jobs])
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="Hydra multirun folders")
    parser.add_argument("--out", type=Path, default=None,
                        help="the PNG (default: tradeoff.png in the first multirun folder, beside its jobs)")
    parser.add_argument("--metric", default=None, help="y axis (default: normalized_reward on real data, else regret)")
    args = parser.parse_args()

    jobs = load_jobs(args.folders)
    if not jobs:
        raise SystemExit(f"no summary.json found under {', '.join(map(str, args.folders))}")
    out = args.out or args.folders[0] / "tradeoff.png"
    metric = args.metric or ("normalized_reward" if "normalized_reward" in jobs[0] else "cumulative_regret")

    print(f"| protocol | threshold | C_T (messages) | {metric} | replicates |")
    print("|---|---|---|---|---|")
    for j in sorted(jobs, key=lambda j: (j["protocol"], j["threshold"])):
        print(f"| {j['protocol']} | {j['threshold']:g} | {j['comm_messages']:.0f} | {j[metric]:.4g} | "
              f"{j['replicates']} |")
    save_figure(draw(jobs, metric), out)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()

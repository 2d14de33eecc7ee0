"""The recommendation kit's table and figure (docs/papers/recsys_kit.md) from run folders of the implicit experiments.

Reads every run folder (``summary.json`` with its ``metrics.csv``) under the given directories, groups the runs by
model and setting (central: ``task.federated=false``; federated; federated with client DP, named by its ε) and writes
``<out>.md``, one row per model with the final test HR@K and NDCG@K (mean ± sample std over seeds, K = ``--k``), and
``<out>.png``, the test NDCG@K over rounds (mean over seeds, min-max band), one panel per setting. ``--popularity``
adds the result of ranking every user's candidates by the items' training popularity, on the same split and, for
sampled ranking, against the same negatives as the runs (their seeds).

    .venv/bin/python scripts/recsys_table.py reproductions/recsys/* --out reproductions/recsys/table --popularity
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

#: the models in the page's order: a run's ``summary["model"]`` (its class name) -> the name in the table
MODELS = {"MatrixFactorization": "MF", "NeuMF": "NeuMF", "LightGCN": "LightGCN", "FedGNN": "FedGNN"}


def ordered(models: set[str]) -> list[str]:
    """The page's models in its order, then any other model class by name."""
    return [m for m in MODELS if m in models] + sorted(models - set(MODELS))


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def setting(summary: dict[str, Any]) -> str:
    """The column a run belongs to: central, federated, or federated with client DP at its ε."""
    if not summary.get("federated", True):
        return "central"
    if summary.get("privacy", "none") == "none":
        return "federated"
    return f"federated + DP ε={summary['epsilon']:g}"


def load_runs(dirs: list[Path]) -> list[dict[str, Any]]:
    """Every finished run under ``dirs``: its summary, its per-round metrics and its resolved config."""
    runs = []
    for d in dirs:
        if not d.is_dir():
            fail(f"{d}: no such folder")
        for path in sorted(d.rglob("summary.json")):
            metrics, config = path.parent / "metrics.csv", path.parent / "config_resolved.yaml"
            if not metrics.is_file() or not config.is_file():
                continue
            cfg = yaml.safe_load(config.read_text())
            summary = json.loads(path.read_text())
            summary["epsilon"] = (cfg.get("privacy") or {}).get("epsilon")
            runs.append({"summary": summary, "metrics": pd.read_csv(metrics), "config": cfg})
    if not runs:
        fail(f"no run folders (summary.json, metrics.csv and config_resolved.yaml) under {[str(d) for d in dirs]}")
    return runs


def cell(values: list[float]) -> str:
    if not values:
        return "–"
    spread = f" ± {np.std(values, ddof=1):.4f}" if len(values) > 1 else ""
    return f"{np.mean(values):.4f}{spread}"


def popularity(runs: list[dict[str, Any]], k: int) -> dict[str, list[float]]:
    """HR@k and NDCG@k of ranking by training popularity (:func:`fedrec.recsys.ranking.split_popularity`), per seed
    of the runs, ranked as the runs rank (full, or sampled against the same keyed negatives)."""
    from fedrec.data import load_implicit
    from fedrec.recsys.ranking import negatives_key, split_popularity

    cfg = runs[0]["config"]
    data_cfg = {key: v for key, v in cfg["data"].items() if key != "_target_"}
    data_cfg["data_dir"] = os.environ.get("FEDREC_DATA_DIR", data_cfg["data_dir"])
    sampled = cfg["task"]["eval"]["ranking"] == "sampled"
    out: dict[str, list[float]] = defaultdict(list)
    for seed in sorted({r["summary"]["seed"] for r in runs}):
        m = split_popularity(load_implicit(seed=seed, **data_cfg), k,
                             negatives=cfg["task"]["eval"]["negatives"] if sampled else None,
                             key=negatives_key(seed, 0) if sampled else None)
        out["hr"].append(m[f"hr@{k}"])
        out["ndcg"].append(m[f"ndcg@{k}"])
    return out


def settings_of(runs: list[dict[str, Any]]) -> list[str]:
    """The runs' settings in the page's order: central, federated, then the private ones by name."""
    return sorted({setting(r["summary"]) for r in runs}, key=lambda s: (s != "central", s != "federated", s))


def table(runs: list[dict[str, Any]], k: int, pop: dict[str, list[float]] | None) -> str:
    settings = settings_of(runs)
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        groups[(r["summary"]["model"], setting(r["summary"]))].append(r["summary"])
    head = "| model | " + " | ".join(f"{s} HR@{k} | {s} NDCG@{k}" for s in settings) + " | seeds |"
    lines = [head, "|---" * (2 * len(settings) + 2) + "|"]
    for model in ordered({g[0] for g in groups}):
        cells, seeds = [], set()
        for s in settings:
            members = groups.get((model, s), [])
            seeds |= {len(members)}
            cells += [cell([m[f"final_test_hr@{k}"] for m in members]),
                      cell([m[f"final_test_ndcg@{k}"] for m in members])]
        lines.append(f"| {MODELS.get(model, model)} | " + " | ".join(cells)
                     + f" | {'/'.join(map(str, sorted(seeds)))} |")
    if pop is not None:
        lines += ["", (f"Ranking by training popularity on the same split and candidates: HR@{k} {cell(pop['hr'])}, "
                       f"NDCG@{k} {cell(pop['ndcg'])} ({len(pop['hr'])} seeds).")]
    return "\n".join(lines)


def figure(runs: list[dict[str, Any]], k: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = settings_of(runs)
    fig, axes = plt.subplots(1, len(settings), figsize=(4.2 * len(settings), 3.4), sharey=True, squeeze=False)
    column = f"test_ndcg@{k}"
    for ax, s in zip(axes[0], settings):
        for model in ordered({r["summary"]["model"] for r in runs}):
            members = [r["metrics"] for r in runs if r["summary"]["model"] == model and setting(r["summary"]) == s]
            if not members:
                continue
            length = min(len(m) for m in members)
            curves = np.stack([m[column].to_numpy()[:length] for m in members])
            rounds = members[0]["step"].to_numpy()[:length] + 1
            ax.plot(rounds, curves.mean(0), label=f"{MODELS.get(model, model)} ({len(members)})")
            ax.fill_between(rounds, curves.min(0), curves.max(0), alpha=0.2)
        ax.set_title(s)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"test NDCG@{k}")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", type=Path)
    p.add_argument("--out", type=Path, required=True, help="output path without extension (.md and .png)")
    p.add_argument("--k", type=int, default=10, help="list length of HR@K and NDCG@K (one the runs logged)")
    p.add_argument("--popularity", action="store_true", help="add the popularity ranking's row")
    args = p.parse_args(argv)
    runs = load_runs(args.dirs)
    modes = {r["summary"].get("ranking") for r in runs}
    if len(modes) != 1:
        fail(f"the runs rank in different ways ({sorted(map(str, modes))}): give one kind per table")
    missing = [str(r["summary"].get("experiment")) for r in runs if f"final_test_ndcg@{args.k}" not in r["summary"]]
    if missing:
        fail(f"--k {args.k}: runs without test NDCG@{args.k} ({missing[0]}, …)")
    pop = popularity(runs, args.k) if args.popularity else None
    text = table(runs, args.k, pop)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text + "\n")
    figure(runs, args.k, args.out.with_suffix(".png"))
    print(text)


if __name__ == "__main__":
    main()

"""The recommendation kit's table and figure (docs/papers/recsys_kit.md) from the sweeps of the implicit experiments.

Reads the ``runs.csv`` and ``rounds.csv`` of every sweep folder under the given directories (fedrec.app.sweeps writes
them when a multirun ends; only finished jobs count), groups the jobs by model and setting (central:
``task.federated=false``; federated; federated with client DP, named by its ε) and writes ``<out>.md``, one row per
model with the final test HR@K and NDCG@K (mean ± sample std over seeds, K = ``--k``), and ``<out>.png``, the test
NDCG@K over rounds (mean over seeds, min-max band), one panel per setting. ``--popularity`` adds the result of
ranking every user's candidates by the items' training popularity, on the same split and, for sampled ranking,
against the same negatives as the runs (their seeds; the split is read from one job's ``config_resolved.yaml``).
A model the table has no name for, or jobs of one cell that differ in an override other than the seed (e.g. two
aggregators), are ``error: ...`` naming it: a cell pools seeds only.

    .venv/bin/python scripts/recsys_table.py reproductions/recsys/* --out reproductions/recsys/table --popularity
"""
from __future__ import annotations

import argparse
import os
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from matplotlib.figure import Figure

from fedrec.app.plots import integer_ticks, legend_below, save_figure, set_title, subplots
from fedrec.app.sweeps import finished_runs, read_rounds, refuse_pooling
from fedrec.errors import ConfigError, run_script

#: the models in the page's order: a run's ``summary["model"]`` (its class name) -> the name in the table
MODELS = {"MatrixFactorization": "MF", "NeuMF": "NeuMF", "LightGCN": "LightGCN", "FedGNN": "FedGNN"}


def setting(federated: object, privacy: object, epsilon: object) -> str:
    """The column a job belongs to: central, federated, or federated with client DP at its total ε."""
    if federated in (False, "False"):
        return "central"
    if pd.isna(privacy) or privacy == "none":
        return "federated"
    return f"federated + DP ε={float(epsilon):g}"


def load_runs(dirs: list[Path]) -> pd.DataFrame:
    """Every finished job under ``dirs``: its summary's keys, its ``sweep`` folder and its ``setting``; a model
    without a name in :data:`MODELS`, or a cell whose jobs differ in more than the seed, is refused."""
    overrides, runs = finished_runs(dirs)
    for key in ("model", "federated", "privacy", "epsilon_total"):
        if key not in runs:
            runs[key] = np.nan  # a key no job's summary has
    unknown = sorted(set(runs["model"].fillna("none")) - set(MODELS))
    if unknown:
        raise ConfigError(f"model: no name for {', '.join(map(str, unknown))} in scripts/recsys_table.py "
                          f"(it knows {', '.join(MODELS)})")
    runs["setting"] = [setting(*v) for v in zip(runs["federated"], runs["privacy"], runs["epsilon_total"])]
    refuse_pooling(overrides, runs["model"].map(MODELS) + ", " + runs["setting"],
                   "a cell pools seeds only: give each value its own table")
    return runs


def cell(values: list[float]) -> str:
    if not values:
        return "–"
    spread = f" ± {np.std(values, ddof=1):.4f}" if len(values) > 1 else ""
    return f"{np.mean(values):.4f}{spread}"


def popularity(runs: pd.DataFrame, k: int) -> dict[str, list[float]]:
    """HR@k and NDCG@k of ranking by training popularity (:func:`fedrec.recsys.ranking.split_popularity`), per seed
    of the runs, ranked as the runs rank (full, or sampled against the same keyed negatives); the data split is the
    first job's (its ``config_resolved.yaml``)."""
    from fedrec.data import load_implicit
    from fedrec.recsys.ranking import negatives_key, split_popularity

    first = Path(runs["sweep"].iloc[0]) / str(runs["job"].iloc[0]) / "config_resolved.yaml"
    if not first.is_file():
        raise ConfigError(f"--popularity: {first} is missing (the job's data split)")
    cfg = yaml.safe_load(first.read_text())
    data_cfg = {key: v for key, v in cfg["data"].items() if key != "_target_"}
    data_cfg["data_dir"] = os.environ.get("FEDREC_DATA_DIR", data_cfg["data_dir"])
    sampled = cfg["task"]["eval"]["ranking"] == "sampled"
    out: dict[str, list[float]] = defaultdict(list)
    for seed in sorted({int(seed) for seed in runs["seed"]}):
        m = split_popularity(load_implicit(seed=seed, **data_cfg), k,
                             negatives=cfg["task"]["eval"]["negatives"] if sampled else None,
                             key=negatives_key(seed, 0) if sampled else None)
        out["hr"].append(m[f"hr@{k}"])
        out["ndcg"].append(m[f"ndcg@{k}"])
    return out


def settings_of(runs: pd.DataFrame) -> list[str]:
    """The runs' settings in the page's order: central, federated, then the private ones by name."""
    return sorted(set(runs["setting"]), key=lambda s: (s != "central", s != "federated", s))


def models_of(runs: pd.DataFrame) -> list[str]:
    """The runs' model classes in the page's order."""
    return [m for m in MODELS if m in set(runs["model"])]


def table(runs: pd.DataFrame, k: int, pop: dict[str, list[float]] | None) -> str:
    settings = settings_of(runs)
    head = "| model | " + " | ".join(f"{s} HR@{k} | {s} NDCG@{k}" for s in settings) + " | seeds |"
    lines = [head, "|---" * (2 * len(settings) + 2) + "|"]
    for model in models_of(runs):
        cells, seeds = [], set()
        for s in settings:
            members = runs[(runs["model"] == model) & (runs["setting"] == s)]
            seeds |= {len(members)}
            cells += [cell(members[f"final_test_hr@{k}"].tolist()), cell(members[f"final_test_ndcg@{k}"].tolist())]
        lines.append(f"| {MODELS[model]} | " + " | ".join(cells) + f" | {'/'.join(map(str, sorted(seeds)))} |")
    if pop is not None:
        lines += ["", (f"Ranking by training popularity on the same split and candidates: HR@{k} {cell(pop['hr'])}, "
                       f"NDCG@{k} {cell(pop['ndcg'])} ({len(pop['hr'])} seeds).")]
    return "\n".join(lines)


def figure(runs: pd.DataFrame, k: int, path: Path) -> None:
    rounds = {sweep: read_rounds(Path(sweep)) for sweep in dict.fromkeys(runs["sweep"])}
    curves: dict[str, dict[str, list[pd.DataFrame]]] = {}
    column = f"test_ndcg@{k}"
    for s in settings_of(runs):
        for model in models_of(runs):
            jobs = runs[(runs["model"] == model) & (runs["setting"] == s)]
            members = [rounds[sweep][str(job)].dropna(subset=[column])
                       for sweep, job in zip(jobs["sweep"], jobs["job"])]
            if members:
                curves.setdefault(s, {})[MODELS[model]] = [(m["step"].to_numpy() + 1, m[column].to_numpy())
                                                           for m in members]
    save_figure(draw(curves, f"test NDCG@{k}"), path)


def draw(curves: dict[str, dict[str, list[tuple[np.ndarray, np.ndarray]]]], ylabel: str) -> Figure:
    """One panel per setting, one line per model: the mean over seeds of (round, value) curves with the min–max
    band; the models' legend (with their seed counts) under the panels."""
    fig, axes = subplots(1, len(curves), figsize=(4.2 * len(curves), 3.9), sharey=True, squeeze=False)
    for ax, (setting, models) in zip(axes[0], curves.items()):
        for model, members in models.items():
            length = min(len(y) for _, y in members)
            stacked = np.stack([y[:length] for _, y in members])
            ax.plot(members[0][0][:length], stacked.mean(0), label=f"{model} ({len(members)} seeds)")
            ax.fill_between(members[0][0][:length], stacked.min(0), stacked.max(0), alpha=0.2)
        set_title(ax, setting)
        ax.set_xlabel("round")
        integer_ticks(ax)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    legend_below(fig, axes[0][0])
    return fig


def write(args: argparse.Namespace) -> None:
    """Check the runs, then write and print the table and draw the figure."""
    runs = load_runs(args.dirs)
    modes = sorted(map(str, set(runs["ranking"]))) if "ranking" in runs else ["none"]
    if len(modes) != 1:
        raise ConfigError(f"the runs rank in different ways ({modes}): give one kind per table")
    column = f"final_test_ndcg@{args.k}"
    missing = runs["experiment"][runs[column].isna()] if column in runs else runs["experiment"]
    if len(missing):
        raise ConfigError(f"--k {args.k}: runs without test NDCG@{args.k} ({missing.iloc[0]}, …)")
    pop = popularity(runs, args.k) if args.popularity else None
    text = table(runs, args.k, pop)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text + "\n")
    figure(runs, args.k, args.out.with_suffix(".png"))
    print(text)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dirs", nargs="+", type=Path, help="sweep folders, or folders above them")
    p.add_argument("--out", type=Path, required=True, help="output path without extension (.md and .png)")
    p.add_argument("--k", type=int, default=10, help="list length of HR@K and NDCG@K (one the runs logged)")
    p.add_argument("--popularity", action="store_true", help="add the popularity ranking's row")
    args = p.parse_args(argv)
    run_script(lambda: write(args))


if __name__ == "__main__":
    main()

"""The recommendation kit's table script on hand-made sweeps (job folders and the runs.csv / rounds.csv that
fedrec.app.sweeps writes from them), and the reproduction script's bad arguments."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from fedrec.app.sweeps import read_jobs, write_runs

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"central": dict(federated=False, privacy="none"), "federated": dict(federated=True, privacy="none"),
            "dp": dict(federated=True, privacy="gaussian", epsilon_total=10.0)}


def write_run(folder: Path, model: str, setting: str, seed: int, hr: float, ndcg: float, ranking: str = "sampled",
              rounds: int = 4, overrides: tuple[str, ...] = ()) -> None:
    """A finished job's folder: its overrides, summary.json, metrics.csv and config_resolved.yaml."""
    (folder / ".hydra").mkdir(parents=True)
    experiment = f"{model.lower()}_ml100k_implicit"
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump([f"+experiment={experiment}", f"seed={seed}",
                                                                      *overrides]))
    summary = dict(model=model, seed=seed, ranking=ranking, experiment=experiment,
                   **SETTINGS[setting], **{"final_test_hr@10": hr, "final_test_ndcg@10": ndcg})
    (folder / "summary.json").write_text(json.dumps(summary))
    curve = np.linspace(0.0, ndcg, rounds)
    (folder / "metrics.csv").write_text("step,test_ndcg@10\n" + "".join(f"{t},{v}\n" for t, v in enumerate(curve)))
    config = {"data": {"_target_": "fedrec.data.load_implicit", "name": "ml-100k", "data_dir": "data",
                       "threshold": None, "split": "leave_one_out", "test_fraction": 0.2, "val_fraction": 0.1,
                       "val": True, "num_clients": None},
              "task": {"eval": {"ranking": ranking, "negatives": 99}}}
    (folder / "config_resolved.yaml").write_text(yaml.safe_dump(config))


def tidy(*sweeps: Path) -> None:
    """Write each sweep's runs.csv and rounds.csv, as the multirun's end does."""
    for sweep in sweeps:
        write_runs(sweep, read_jobs(sweep))


def table(*args: str | Path, data_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **({"FEDREC_DATA_DIR": str(data_dir)} if data_dir else {})}
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "recsys_table.py"), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=300)


def test_table_groups_runs_by_model_and_setting_and_draws_the_curves(tmp_path: Path) -> None:
    values = {}
    for model in ("MatrixFactorization", "LightGCN"):
        for setting in SETTINGS:
            for seed in (0, 1, 2):
                hr, ndcg = 0.1 * seed + len(model) / 100, 0.05 * seed + len(setting) / 100
                values.setdefault((model, setting), []).append((hr, ndcg))
                write_run(tmp_path / "runs" / f"{model}_{setting}" / str(seed), model, setting, seed, hr, ndcg)
            tidy(tmp_path / "runs" / f"{model}_{setting}")
    res = table(tmp_path / "runs", "--out", tmp_path / "out" / "table")
    assert res.returncode == 0, res.stderr
    lines = (tmp_path / "out" / "table.md").read_text().splitlines()
    assert lines[0] == ("| model | central HR@10 | central NDCG@10 | federated HR@10 | federated NDCG@10 | "
                        "federated + DP ε=10 HR@10 | federated + DP ε=10 NDCG@10 | seeds |")
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:-1] for line in lines[2:]}
    assert list(rows) == ["MF", "LightGCN"]  # the page's names, in its order
    for model, cells in zip(("MatrixFactorization", "LightGCN"), rows.values()):
        for j, setting in enumerate(SETTINGS):
            hr, ndcg = np.array(values[(model, setting)]).T
            assert cells[2 * j] == f"{hr.mean():.4f} ± {hr.std(ddof=1):.4f}"
            assert cells[2 * j + 1] == f"{ndcg.mean():.4f} ± {ndcg.std(ddof=1):.4f}"
    assert (tmp_path / "out" / "table.png").stat().st_size > 0


def test_popularity_uses_the_runs_split_and_negatives(tmp_path: Path, data_dir: Path) -> None:
    from fedrec.data import load_implicit
    from fedrec.recsys.ranking import negatives_key, split_popularity

    write_run(tmp_path / "runs" / "0", "MatrixFactorization", "federated", 0, 0.5, 0.3)
    tidy(tmp_path / "runs")
    res = table(tmp_path / "runs", "--out", tmp_path / "table", "--popularity", data_dir=data_dir)
    assert res.returncode == 0, res.stderr
    want = split_popularity(load_implicit("ml-100k", data_dir, seed=0), 10, negatives=99, key=negatives_key(0, 0))
    assert f"HR@10 {want['hr@10']:.4f}, NDCG@10 {want['ndcg@10']:.4f} (1 seeds)" in res.stdout


@pytest.mark.parametrize("case, message", [
    ("empty", "no finished jobs in the runs.csv"),
    ("mixed", "rank in different ways"),
    ("k", "--k 5: runs without test NDCG@5"),
    ("model", "model: no name for Pinsage"),  # a class the table does not know
    ("aggregator", "aggregator differs between the jobs of one cell (MF, central: fedavg, fedsgd)"),  # not seeds
])
def test_table_refuses_bad_input(tmp_path: Path, case: str, message: str) -> None:
    (tmp_path / "runs").mkdir()
    if case != "empty":
        write_run(tmp_path / "runs" / "0", "MatrixFactorization", "central", 0, 0.5, 0.3,
                  overrides=("aggregator=fedavg",) if case == "aggregator" else ())
    if case in ("mixed", "model", "aggregator"):
        write_run(tmp_path / "runs" / "1", "Pinsage" if case == "model" else "MatrixFactorization", "central", 1,
                  0.5, 0.3, ranking="full" if case == "mixed" else "sampled",
                  overrides=("aggregator=fedsgd",) if case == "aggregator" else ())
    tidy(tmp_path / "runs")
    res = table(tmp_path / "runs", "--out", tmp_path / "table", *(["--k", "5"] if case == "k" else []))
    assert res.returncode == 2 and res.stderr.startswith("error:") and message in res.stderr, res.stderr
    assert not (tmp_path / "table.md").exists()


@pytest.mark.parametrize("args, env, message", [
    (["{out}", "zero"], {}, "SEEDS must be a comma-separated list"),
    (["{out}", "0,1", "partial"], {}, "RANKING must be full or sampled"),
    (["{out}", "0", "full", "0"], {}, "JOBS must be a positive integer"),
    (["{out}"], {"DATASET": "netflix"}, "DATASET must be ml100k or ml1m"),
    (["{full}"], {}, "already holds results"),
])
def test_reproduction_script_refuses_bad_arguments(tmp_path: Path, args: list[str], env: dict[str, str],
                                                   message: str) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "table.md").write_text("a result\n")
    res = subprocess.run(["bash", str(ROOT / "scripts" / "reproduce_recsys_kit.sh"),
                          *(a.format(out=tmp_path / "out", full=tmp_path / "full") for a in args)],
                         capture_output=True, text=True, env={**os.environ, **env}, timeout=60)
    assert res.returncode == 2 and res.stderr.startswith("error:") and message in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()

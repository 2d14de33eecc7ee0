"""Sweeps and run reports (fedrec.app.sweeps): a failing job does not stop a multirun, the sweep's tables (summary,
runs.csv, rounds.csv, sweep.metrics), the pivot of ``python -m fedrec.app.sweeps``, the headline and objective of each
task kind."""
from __future__ import annotations

import csv
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from fedrec.app.sweeps import Job, describe, headline, objective, runs_table, split_runs

ROOT = Path(__file__).resolve().parents[1]


def test_a_failing_job_does_not_stop_the_sweep_which_writes_its_tables(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "-m", "+experiment=quickstart", "task.steps=200",
         "task.steps_per_round=100", "protocol.gamma_u=-1,2", "seed=0,1", f"hydra.sweep.dir={sweep}",
         "logger.tensorboard=false", "plots=false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    with open(sweep / "summary.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == 2 and all("protocol.gamma_u=2" in r["overrides"] for r in ok)
    assert all(math.isfinite(float(r["cumulative_regret"])) for r in ok)
    failed = [r for r in rows if r["status"] != "ok"]
    assert all("gamma_u" in r["status"] and r["status"].startswith("error: ") for r in failed)
    assert proc.stderr.count("failed job") == 2 and "2 of 4 jobs finished" in proc.stderr
    table = (sweep / "summary.md").read_text().splitlines()
    assert len(table) == 3 and "seed=" not in table[2] and "| 2 |" in table[2] and " ± " in table[2]
    assert proc.stdout.count("run folder: ") == 2
    runs = pd.read_csv(sweep / "runs.csv")
    assert runs["status"].tolist() == [r["status"] for r in rows]
    assert runs["protocol.gamma_u"].tolist() == [-1, -1, 2, 2]
    assert set(pd.read_csv(sweep / "rounds.csv")["job"]) == {int(r["job"]) for r in ok}  # finished jobs' rounds only
    plot = subprocess.run([sys.executable, str(ROOT / "scripts" / "plot_tradeoff.py"), str(sweep)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert plot.returncode == 0, plot.stderr
    assert (sweep / "tradeoff.png").is_file() and not (tmp_path / "tradeoff.png").exists()  # beside the sweep


@pytest.mark.parametrize(("summary", "first"), [
    ({"cumulative_regret": 3.0, "comm_messages": 10.0}, "cumulative_regret"),
    ({"relative_ctr": 1.2, "ctr": 0.6, "comm_messages": 5.0}, "relative_ctr"),
    ({"cumulative_regret": 9.0, "normalized_reward": 1.5}, "normalized_reward"),  # real data: the paper's metric
    ({"final_test_rmse": 0.21, "best_test_rmse": 0.2, "epsilon_spent": 9.9}, "final_test_rmse"),
])
def test_headline_and_objective_of_each_task_kind(summary: dict, first: str) -> None:
    values = headline(summary)
    assert next(iter(values)) == first and objective(summary) == summary[first]
    assert set(values) <= set(summary)
    assert describe(Path("/x"), summary).startswith("run folder: /x; " + first)
    assert math.isnan(objective({"steps": 3}))


def test_job_folders_come_in_job_order(tmp_path: Path) -> None:
    """Hydra numbers a multirun's jobs 0, 1, ..., 10, ...: the sweep summary lists them by number, not as text."""
    from fedrec.app.sweeps import job_folders

    for job in ("0", "1", "2", "10", "11"):
        (tmp_path / job / ".hydra").mkdir(parents=True)
        (tmp_path / job / ".hydra" / "overrides.yaml").write_text("[]\n")
    (tmp_path / ".submitit" / "x").mkdir(parents=True)  # a launcher's own folder: no job
    assert [f.name for f in job_folders(tmp_path)] == ["0", "1", "2", "10", "11"]


# ------------------------------------------------------------------ runs.csv, rounds.csv, sweep.metrics and the pivot
#: a 2 x 2 x 2 sweep of the quick default experiment: two swept settings, two seeds
GRID = ["protocol.gamma_u=1,2", "env.num_clients=10,20", "seed=0,1"]


def jobs_by_hand(sweep: Path) -> pd.DataFrame:
    """The sweep's jobs read straight from their folders: each override's value and the summary's numbers."""
    rows = []
    for folder in sorted(p for p in sweep.iterdir() if p.name.isdigit()):
        overrides = dict(o.lstrip("+").split("=", 1) for o in yaml.safe_load((folder / ".hydra/overrides.yaml")
                                                                           .read_text()))
        summary = json.loads((folder / "summary.json").read_text())
        rows.append({"job": int(folder.name), **overrides, "regret": summary["cumulative_regret"],
                     "comm_bytes": summary["comm_bytes"], "summary_seed": summary["seed"]})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def grid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp = tmp_path_factory.mktemp("grid")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "-m", "+experiment=quickstart", "task.steps=200",
         "task.steps_per_round=100", *GRID, f"hydra.sweep.dir={tmp / 'sweep'}", "logger.tensorboard=false",
         "plots=false", "sweep.metrics=[cumulative_regret,comm_bytes,cumulative_regrt]"],
        cwd=tmp, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return tmp / "sweep", proc


def test_runs_csv_has_every_job_with_its_overrides_as_columns_then_its_summary(grid: tuple) -> None:
    sweep, _ = grid
    runs = pd.read_csv(sweep / "runs.csv")
    want = jobs_by_hand(sweep)
    assert len(runs) == 8 and list(runs["job"]) == list(want["job"]) and (runs["status"] == "ok").all()
    columns = list(runs.columns)
    overrides = columns[1:columns.index("status")]
    assert {"seed", "protocol.gamma_u", "env.num_clients", "task.steps", "experiment"} <= set(overrides)
    for key in ("seed", "protocol.gamma_u", "env.num_clients"):
        assert list(runs[key].astype(str)) == list(want[key])
    assert runs["cumulative_regret"].tolist() == want["regret"].tolist()  # the summary's numbers, unrounded
    assert runs["summary.seed"].tolist() == want["summary_seed"].tolist()  # a summary key named like an override
    assert set(runs["experiment"]) == {"quickstart"} and "summary.experiment" in runs


def test_rounds_csv_stacks_every_jobs_metrics_behind_its_overrides(grid: tuple) -> None:
    sweep, _ = grid
    rounds = pd.read_csv(sweep / "rounds.csv")
    runs = pd.read_csv(sweep / "runs.csv").set_index("job")
    assert sorted(set(rounds["job"])) == list(range(8))
    for job, part in rounds.groupby("job"):
        logged = pd.read_csv(sweep / str(job) / "metrics.csv")
        pd.testing.assert_frame_equal(part[list(logged.columns)].reset_index(drop=True), logged)
        for key in ("seed", "protocol.gamma_u", "env.num_clients"):
            assert set(part[key]) == {runs.loc[job, key]}


def test_sweep_metrics_chooses_the_summary_columns_and_names_a_missing_one(grid: tuple) -> None:
    sweep, proc = grid
    summary = pd.read_csv(sweep / "summary.csv")
    assert list(summary.columns) == ["job", "overrides", "status", "cumulative_regret", "comm_bytes"]
    table = (sweep / "summary.md").read_text().splitlines()
    assert table[0] == "| setting | jobs | cumulative_regret | comm_bytes |" and len(table) == 2 + 4
    assert "warning: sweep.metrics: " in proc.stderr and "'cumulative_regrt'" in proc.stderr
    assert "did you mean 'cumulative_regret'" in proc.stderr


def pivot_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedrec.app.sweeps", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_the_pivot_equals_a_groupby_over_seeds(grid: tuple) -> None:
    sweep, _ = grid
    args = [sweep, "--metric", "cumulative_regret", "--rows", "protocol.gamma_u", "--columns", "env.num_clients"]
    as_csv, as_md = pivot_cli(*args, "--csv"), pivot_cli(*args)
    assert as_csv.returncode == 0 and as_md.returncode == 0, as_csv.stderr + as_md.stderr
    got = pd.read_csv(io.StringIO(as_csv.stdout))
    want = jobs_by_hand(sweep).astype({"protocol.gamma_u": int, "env.num_clients": int})
    want = want.groupby(["protocol.gamma_u", "env.num_clients"])["regret"].agg(["mean", "std", "count"]).reset_index()
    assert list(got.columns) == ["protocol.gamma_u", "env.num_clients", "mean", "std", "runs"]
    np.testing.assert_allclose(got[["mean", "std"]].to_numpy(), want[["mean", "std"]].to_numpy(), rtol=1e-12)
    assert got["runs"].tolist() == want["count"].tolist() == [2, 2, 2, 2]
    lines = as_md.stdout.splitlines()
    assert lines[0] == "| protocol.gamma_u | env.num_clients=10 | env.num_clients=20 |"
    first = want.iloc[0]
    assert lines[2].startswith(f"| 1 | {first['mean']:.6g} ± {first['std']:.4g} | ")
    assert "mean ± std over seed; finished jobs per cell: 2." in as_md.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--rows", "protocol.gamma_u"], "env.num_clients differs between the jobs of one cell"),
    (["--rows", "env.num_clients", "--columns", "env.num_clients"], "each key on one side only"),
    (["--rows", "protocol.gama_u"], "--rows: runs.csv has no column 'protocol.gama_u' (did you mean"),
    (["--metric", "experiment"], "--metric: 'experiment' is no number"),
])
def test_the_pivot_refuses_to_pool_a_swept_key_or_a_bad_name(grid: tuple, args: list[str], message: str) -> None:
    sweep, _ = grid
    metric = [] if "--metric" in args else ["--metric", "cumulative_regret"]
    res = pivot_cli(sweep, *metric, *args)
    assert res.returncode == 2 and res.stderr.startswith("error: ") and message in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not res.stdout


@pytest.mark.parametrize("value", ["cumulative_regret", "[1,2]", "[]"])
def test_a_bad_sweep_metrics_stops_the_sweep_before_any_job(tmp_path: Path, value: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "-m", "+experiment=quickstart", "task.steps=200",
         "task.steps_per_round=100", f"hydra.sweep.dir={tmp_path / 'sweep'}", f"sweep.metrics={value}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2 and proc.stderr.startswith("error: sweep.metrics must be"), proc.stderr
    assert not list(tmp_path.glob("sweep/*/summary.json"))


def test_runs_table_flattens_the_summary_and_names_each_override_by_its_key() -> None:
    jobs = [Job("0", Path("0"), ["+experiment=a", "seed=0", "~attack"], {"seed": 0, "x": {"y": 1.5}, "v": [1, 2]},
                "ok"),
            Job("1", Path("1"), ["+experiment=a", "seed=1", "lr=0.1"], None, "error: lr: too large")]
    runs = runs_table(jobs)
    assert list(runs.columns) == ["job", "experiment", "seed", "attack", "lr", "status", "summary.seed", "x.y", "v"]
    assert runs.loc[0, ["job", "experiment", "seed", "attack", "status"]].tolist() == ["0", "a", "0", "null", "ok"]
    assert pd.isna(runs.loc[0, "lr"]) and runs.loc[1, "lr"] == "0.1"
    assert runs.loc[0, "x.y"] == 1.5 and json.loads(runs.loc[0, "v"]) == [1, 2]
    assert runs.loc[1, "status"] == "error: lr: too large" and pd.isna(runs.loc[1, "x.y"])
    overrides, results = split_runs(runs)
    assert list(overrides.columns) == ["experiment", "seed", "attack", "lr"]
    assert list(results.columns) == ["job", "status", "seed", "x.y", "v"]  # the summary's own names again


def test_a_sweep_table_that_cannot_be_written_is_one_output_error(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Hydra turns an error of a callback into a warning (and exit code 0): the sweep's own write failure is one
    ``error: output:`` line with exit code 2 instead."""
    from omegaconf import OmegaConf

    from fedrec.app.sweeps import SweepSummary

    job = tmp_path / "0"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text("[seed=0]\n")
    (job / "summary.json").write_text('{"cumulative_regret": 1.0}')
    (tmp_path / "summary.csv").mkdir()  # a folder where the table goes
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}, "sweep": {"metrics": None}})
    with pytest.raises(SystemExit) as info:
        SweepSummary().on_multirun_end(config)
    assert info.value.code == 2
    assert capsys.readouterr().err == f"error: output: cannot write {tmp_path / 'summary.csv'}: Is a directory\n"

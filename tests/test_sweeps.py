"""Sweeps and run reports (fedrec.sweeps): a failing job does not stop a multirun, the sweep's tables, the headline
and objective of each task kind."""
from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest

from fedrec.sweeps import describe, headline, objective

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
    from fedrec.sweeps import job_folders

    for job in ("0", "1", "2", "10", "11"):
        (tmp_path / job / ".hydra").mkdir(parents=True)
        (tmp_path / job / ".hydra" / "overrides.yaml").write_text("[]\n")
    (tmp_path / ".submitit" / "x").mkdir(parents=True)  # a launcher's own folder: no job
    assert [f.name for f in job_folders(tmp_path)] == ["0", "1", "2", "10", "11"]

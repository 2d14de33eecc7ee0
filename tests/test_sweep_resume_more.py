"""Sweeps run again into their folder, the cases beyond :mod:`test_sweep_resume`: a job refused there is a failed
job even when its folder holds another run's summary, a job that failed once and then finishes is finished, and a
sweep of jobs on two processes each continues after a kill."""
from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedrec.app.sweeps import JOB_ERROR, read_jobs
from tests.helpers import ROOT, SWEEP, summaries


def test_a_refused_job_whose_folder_holds_another_runs_summary_is_a_failed_job(
    train_py: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Job 0's folder holds a finished run of another configuration (its recorded seed edited): the rerun refuses
    the job, and the sweep reports it as failed (exit code 2, status its error line, no results in the tables)
    instead of passing the other run's summary off as this job's. Restored, the folder's run is the job's again."""
    sweep = tmp_path / "sweep"
    args = ["-m", "task.steps=200", *SWEEP[2:4], "seed=0", *SWEEP[5:], f"hydra.sweep.dir={sweep}"]
    train_py(*args)
    recorded = sweep / "0" / "config_resolved.yaml"
    original = recorded.read_text()
    recorded.write_text(original.replace("seed: 0", "seed: 3"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        train_py(*args)
    assert info.value.code == 2
    error = (f"error: output: {sweep / '0'} holds a run of another configuration, differing in seed (3 in "
             "config_resolved.yaml, 0 here); a rerun of a sweep continues only its own jobs: write this sweep to a "
             "new folder (hydra.sweep.dir=...)")
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2:] == [f"failed job 0 ({' '.join(args[1:-1])}): {error}".replace("plots=false", "plots=False")
                        .replace("tensorboard=false", "tensorboard=False"),
                        f"sweep: 0 of 1 jobs finished; {sweep / 'summary.csv'} (runs.csv and rounds.csv beside it)"]
    assert [(job.status, job.summary) for job in read_jobs(sweep)] == [(error, None)]
    with (sweep / "summary.csv").open() as f:
        row, = csv.DictReader(f)
    assert row["status"] == error and "cumulative_regret" not in row
    assert len((sweep / "rounds.csv").read_text().splitlines()) == 1  # its header only

    recorded.write_text(original)  # the job's own run again: kept as finished, its failure record gone
    train_py(*args)
    assert "sweep: 1 of 1 jobs finished" in capsys.readouterr().err
    assert not (sweep / "0" / JOB_ERROR).exists() and read_jobs(sweep)[0].status == "ok"


def _sharded_sweep(sweep: Path, *extra: str) -> list[str]:
    """Two seeds of a recommendation run on two gloo processes each (Hydra's basic launcher), into ``sweep``."""
    return [sys.executable, str(ROOT / "train.py"), "-m", "+experiment=fedgnn_synthetic", "data.users=120",
            "data.items=80", "data.ratings=3000", "data.num_clients=24", "task.rounds=40", "task.pseudo_items=5",
            "seed=0,1", "trainer.devices=2", "plots=false", "logger.tensorboard=false", *extra,
            f"hydra.sweep.dir={sweep}"]


@pytest.mark.slow  # about ten Python processes start, each importing torch (minutes on a loaded machine)
def test_a_sweep_of_two_process_jobs_killed_in_its_second_job_continues_to_an_uninterrupted_sweep(
    tmp_path: Path
) -> None:
    """SIGTERM to the launching process while job 1 runs on its two processes: both save after their round (rank 0
    writes the checkpoint) and the sweep exits 143; the same command continues job 1 from that checkpoint on two
    processes again, to the summaries and logged rounds of the sweep run whole."""
    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    whole, sweep = tmp_path / "whole", tmp_path / "sweep"
    reference = subprocess.run(_sharded_sweep(whole), cwd=tmp_path, capture_output=True, text=True, env=env,
                               timeout=900)
    assert reference.returncode == 0, reference.stderr[-3000:]
    command = _sharded_sweep(sweep)
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        rounds = sweep / "1" / "metrics.csv"
        deadline = time.monotonic() + 600
        while proc.poll() is None and time.monotonic() < deadline and not (
                rounds.is_file() and len(rounds.read_text().splitlines()) > 3):
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err[-3000:]
    assert (sweep / "1" / "checkpoints" / "last.ckpt").is_file() and not (sweep / "1" / "summary.json").exists()
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=900)
    assert again.returncode == 0 and "sweep: 2 of 2 jobs finished" in again.stderr, again.stderr[-3000:]
    assert "continuing the job from its checkpoints/last.ckpt" in again.stdout + again.stderr
    assert summaries(sweep) == summaries(whole) and len(summaries(whole)) == 2
    for job in ("0", "1"):
        assert (sweep / job / "metrics.csv").read_text() == (whole / job / "metrics.csv").read_text()

"""Sweeps that stop and continue: SIGINT or SIGTERM during a sweep lets the running job save its checkpoint and
starts no other job; the same command run again keeps the finished jobs, continues the interrupted one from its
checkpoint and runs the others, to the summaries of a sweep that was never interrupted. A job folder that holds a run
of another configuration is refused. Tested on Hydra's basic launcher (jobs in the launching process) and on joblib's
(jobs in worker processes, which a SIGTERM to the launching process reaches only through the sweep's stop file)."""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig

from fedrec.app.build import build_task
from fedrec.app.sweeps import StopOnSignal
from fedrec.errors import Interrupted
from fedrec.trainer import FederatedTrainer, RunInterrupted
from fedrec.trainer.checkpoint import load_checkpoint
from fedrec.utils.commands import python_command
from fedrec.utils.stop_request import STOP_FILE, requested_stop
from tests.helpers import SWEEP, summaries

ROOT = Path(__file__).resolve().parents[1]
#: what a finished job holds; a rerun of its sweep leaves these files as they were
RESULTS = ("summary.json", "metrics.csv", "checkpoints/last.ckpt")


def stamps(job: Path) -> dict[str, tuple[int, bytes]]:
    """The modification time and content of a job's result files."""
    return {name: ((job / name).stat().st_mtime_ns, (job / name).read_bytes()) for name in RESULTS}


def interrupt_job(monkeypatch: pytest.MonkeyPatch, job: str, after_round: int) -> None:
    """A SIGINT to this process at the end of round ``after_round`` of the sweep job in folder ``job``, once."""
    hook, armed = FederatedTrainer._hook, [True]

    def signalling(self: FederatedTrainer, name: str, task: Any, *args: Any) -> None:
        hook(self, name, task, *args)
        if armed and name == "on_round_end" and self.root.name == job and args[0] == after_round:
            armed.clear()
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(FederatedTrainer, "_hook", signalling)


def test_a_stop_file_stops_a_run_after_its_round_as_its_signal_would(
    compose_cfg: Callable[..., DictConfig], tmp_path: Path
) -> None:
    stop = tmp_path / STOP_FILE

    class Writes(FederatedTrainer):
        def _hook(self, name: str, task: Any, *args: Any) -> None:
            if name == "on_round_end" and args[0] == 2:
                stop.write_text(f"{int(signal.SIGTERM)}\n")

    with pytest.raises(RunInterrupted) as info:
        Writes(default_root_dir=tmp_path / "run", stop_file=stop, enable_progress_bar=False).fit(
            build_task(compose_cfg(*SWEEP[1:4])))
    assert (info.value.signum, info.value.rounds, info.value.total) == (signal.SIGTERM, 3, 6)
    assert load_checkpoint(info.value.checkpoint)["round"] == 3


def test_the_sweep_handler_asks_for_a_stop_once_and_a_second_signal_stops_the_launching_process(
    tmp_path: Path
) -> None:
    launching, worker = StopOnSignal(tmp_path, "python train.py -m seed=0,1"), StopOnSignal(tmp_path, None)
    worker(signal.SIGTERM, None)
    launching(signal.SIGINT, None)
    assert requested_stop(tmp_path / STOP_FILE) == signal.SIGTERM  # the first request is kept
    worker(signal.SIGTERM, None)  # a worker process never raises
    with pytest.raises(Interrupted, match=r"^SIGINT again: the sweep stopped at once.*continue it with: "
                                          r"python train.py -m seed=0,1$"):
        launching(signal.SIGINT, None)
    before = signal.getsignal(signal.SIGTERM)
    StopOnSignal.install(tmp_path, "command")
    StopOnSignal.install(tmp_path / "other")  # a job in the launching process keeps the sweep's handler
    assert isinstance(signal.getsignal(signal.SIGTERM), StopOnSignal)
    assert signal.getsignal(signal.SIGTERM).sweep == tmp_path
    StopOnSignal.uninstall()
    assert signal.getsignal(signal.SIGTERM) == before


def test_an_interrupted_sweep_run_again_continues_to_the_summaries_of_an_uninterrupted_one(
    train_py: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Hydra's basic launcher: a SIGINT in job 1 after its third round saves it, job 2 does not start, and the sweep
    ends with exit code 130 and the command that continues it; that command keeps job 0 (its files untouched),
    continues job 1 and runs job 2, and every summary is the uninterrupted sweep's."""
    whole, sweep = tmp_path / "whole", tmp_path / "sweep"
    train_py(*SWEEP, f"hydra.sweep.dir={whole}")
    capsys.readouterr()
    interrupt_job(monkeypatch, "1", after_round=2)
    with pytest.raises(SystemExit) as info:
        train_py(*SWEEP, f"hydra.sweep.dir={sweep}")
    assert info.value.code == 128 + signal.SIGINT
    err = capsys.readouterr().err.strip().splitlines()
    ckpt = sweep / "1" / "checkpoints" / "last.ckpt"
    assert err[-2] == f"interrupted: job 1: SIGINT after round 3 of 6; checkpoint {ckpt}"
    command = python_command("train.py", *SWEEP, f"hydra.sweep.dir={sweep}")
    assert err[-1] == ("interrupted: SIGINT: the sweep stopped with 1 of 3 jobs finished (each job that was running "
                       f"saved its checkpoint); continue it with: {command}")
    assert load_checkpoint(ckpt)["round"] == 3 and not (sweep / "1" / "summary.json").exists()
    assert not (sweep / "2" / "metrics.csv").exists() and not (sweep / STOP_FILE).exists()
    finished = stamps(sweep / "0")

    train_py(*shlex.split(command)[2:])
    out = capsys.readouterr().out
    assert f"{sweep / '0'}: finished before, its summary.json is kept (the job is not run again)" in out
    assert f"{sweep / '1'}: continuing the job from its checkpoints/last.ckpt" in out
    assert stamps(sweep / "0") == finished
    assert summaries(sweep) == summaries(whole) and len(summaries(whole)) == 3
    for job in ("0", "1", "2"):
        assert (sweep / job / "metrics.csv").read_text() == (whole / job / "metrics.csv").read_text()
    assert (sweep / "summary.csv").read_text() == (whole / "summary.csv").read_text()


def test_a_job_stopped_before_its_first_checkpoint_starts_over(
    train_py: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A job killed before it wrote a checkpoint left its logged rounds only: the rerun runs it again from the
    start, into the same folder, to the same results."""
    sweep = tmp_path / "sweep"
    args = [*SWEEP[:4], "seed=0", *SWEEP[5:], f"hydra.sweep.dir={sweep}"]
    train_py(*args)
    job = sweep / "0"
    expected = summaries(sweep), (job / "metrics.csv").read_text()
    (job / "summary.json").unlink()
    (job / "checkpoints" / "last.ckpt").unlink()
    capsys.readouterr()
    train_py(*args)
    assert "starting the job over (its earlier run stopped before its first checkpoint)" in capsys.readouterr().out
    assert (summaries(sweep), (job / "metrics.csv").read_text()) == expected


def test_a_sweep_continues_only_its_own_jobs(
    train_py: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Into the folder of a sweep of another command line whose job 0 is another job, a sweep is refused before
    anything is written; one that adds jobs (another seed) keeps job 0 and runs the new one; and a job folder whose
    run has another configuration than its job (here: edited) is refused by that job, naming the field."""
    sweep = tmp_path / "sweep"
    one = [*SWEEP[:4], "seed=0", *SWEEP[5:], f"hydra.sweep.dir={sweep}"]
    train_py(*one)
    before = {**stamps(sweep / "0"), ".hydra": (sweep / "0" / ".hydra" / "overrides.yaml").read_bytes()}
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        train_py(*SWEEP[:4], "seed=7", *SWEEP[5:], f"hydra.sweep.dir={sweep}")
    assert info.value.code == 2
    job = " ".join(SWEEP[1:4])
    assert capsys.readouterr().err == (
        f"error: output: {sweep / '0'} holds a run of another sweep's job ({job} seed=0 plots=False "
        f"logger.tensorboard=False; this sweep's is {job} seed=7 plots=False logger.tensorboard=False): a rerun of a "
        "sweep continues only its own jobs: write this sweep to a new folder (hydra.sweep.dir=...)\n")
    assert {**stamps(sweep / "0"), ".hydra": (sweep / "0" / ".hydra" / "overrides.yaml").read_bytes()} == before

    train_py(*SWEEP[:4], "seed=0,1", *SWEEP[5:], f"hydra.sweep.dir={sweep}")
    assert "sweep: 2 of 2 jobs finished" in capsys.readouterr().err and stamps(sweep / "0") == before_results(before)

    recorded = sweep / "0" / "config_resolved.yaml"
    recorded.write_text(recorded.read_text().replace("seed: 0", "seed: 3"))
    with pytest.raises(SystemExit) as info:  # the refused job is a failed job of the sweep
        train_py(*one)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert (f"error: output: {sweep / '0'} holds a run of another configuration, differing in seed (3 in "
            "config_resolved.yaml, 0 here); a rerun of a sweep continues only its own jobs") in err
    assert "Traceback" not in err and stamps(sweep / "0") == before_results(before)


def before_results(stamped: dict[str, Any]) -> dict[str, Any]:
    """:func:`stamps` of a job's results out of a record that also holds other files."""
    return {name: stamped[name] for name in RESULTS}


def _long_sweep(sweep: Path, *launcher: str) -> list[str]:
    """Three seeds of 300 rounds each into ``sweep``: long enough for a kill to find the second job running."""
    return [sys.executable, str(ROOT / "train.py"), "-m", "task.steps=30000", "task.steps_per_round=100",
            "env.num_clients=20", "seed=0,1,2", "plots=false", "logger.tensorboard=false", *launcher,
            f"hydra.sweep.dir={sweep}"]


@pytest.mark.slow  # five Python processes start (about 50 s of CPU time)
def test_a_joblib_sweep_killed_while_its_second_job_runs_continues_to_an_uninterrupted_sweep(tmp_path: Path) -> None:
    """joblib's launcher runs the jobs in a worker process; SIGTERM to the launching process (as a scheduler stops
    it) once job 0 has finished and job 1 has logged a few rounds: job 1 saves, job 2 does not start, exit code
    143. The command the sweep prints, the one it was started with, continues it to the summaries and logged rounds
    of the same sweep uninterrupted (run beside it on the basic launcher), without running job 0 again."""
    whole, sweep = tmp_path / "whole", tmp_path / "sweep"
    reference = subprocess.Popen(_long_sweep(whole), cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True)
    command = _long_sweep(sweep, "hydra/launcher=joblib", "hydra.launcher.n_jobs=1")
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        rounds = sweep / "1" / "metrics.csv"
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline and not (
                (sweep / "0" / "summary.json").is_file() and rounds.is_file()
                and len(rounds.read_text().splitlines()) > 3):
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)
        assert reference.wait(timeout=300) == 0, reference.stderr.read()
    finally:
        for p in (proc, reference):
            p.kill()  # a no-op for those that ended
    assert proc.returncode == 128 + signal.SIGTERM, err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and lines[-2].startswith("interrupted: job 1: SIGTERM after round "), err
    printed = lines[-1].split("; continue it with: ", 1)
    assert printed[0] == ("interrupted: SIGTERM: the sweep stopped with 1 of 3 jobs finished (each job that was "
                          "running saved its checkpoint)"), err
    python, *args = shlex.split(printed[1])  # the Python that ran the sweep, as the user can type it from tmp_path
    assert args == ["train.py", *command[2:]]
    assert Path(shutil.which(python) or python).resolve() == Path(sys.executable).resolve()
    assert (sweep / "1" / "checkpoints" / "last.ckpt").is_file() and not (sweep / "1" / "summary.json").exists()
    assert not (sweep / "2" / "metrics.csv").exists()
    finished = stamps(sweep / "0")

    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "sweep: 3 of 3 jobs finished" in again.stderr, again.stderr
    assert stamps(sweep / "0") == finished and "finished before" in again.stdout
    assert summaries(sweep) == summaries(whole) and len(summaries(whole)) == 3
    for job in ("0", "1", "2"):
        assert (sweep / job / "metrics.csv").read_text() == (whole / job / "metrics.csv").read_text()

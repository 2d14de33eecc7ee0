"""Interrupts that save: SIGINT or SIGTERM during a run finish the round, write the checkpoint and stop with a
message; the resumed run equals the uninterrupted one. A second signal stops at once."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig

from fedrec.build import build_task
from fedrec.trainer import Callback, FederatedTrainer
from fedrec.trainer import RunInterrupted

ROOT = Path(__file__).resolve().parents[1]
QUICK = ("task.steps=800", "task.steps_per_round=100", "env.num_clients=20")


class SignalAt(Callback):
    """Sends ``signals`` to this process at the end of round ``at``, as a user or a scheduler would."""

    def __init__(self, at: int, *signals: int) -> None:
        self.at, self.signals = at, signals

    @property
    def state_key(self) -> str:
        return "signal_at"

    def on_round_end(self, trainer: Any, task: Any, round_idx: int, metrics: dict[str, float]) -> None:
        if round_idx == self.at:
            for s in self.signals:
                os.kill(os.getpid(), s)


def fit(cfg: DictConfig, root: Path | None, *callbacks: Callback, ckpt: Path | None = None) -> list[dict[str, Any]]:
    trainer = FederatedTrainer(default_root_dir=root, callbacks=callbacks, enable_progress_bar=False)
    return trainer.fit(build_task(cfg), ckpt_path=ckpt)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_finishes_the_round_saves_and_the_resume_equals_the_uninterrupted_run(
    compose_cfg: Callable[..., DictConfig], tmp_path: Path, signum: int
) -> None:
    cfg = compose_cfg(*QUICK)
    whole = fit(cfg, None)
    before = signal.getsignal(signal.SIGINT)  # Python's default, or SIG_IGN under nohup
    with pytest.raises(RunInterrupted) as info:
        fit(cfg, tmp_path, SignalAt(2, signum))
    stop = info.value
    assert (stop.signum, stop.rounds, stop.total) == (signum, 3, 8)
    assert stop.checkpoint == tmp_path / "checkpoints" / "last.ckpt" and stop.checkpoint.is_file()
    assert f"{signal.Signals(signum).name} after round 3 of 8" in str(stop)
    resumed = fit(cfg, tmp_path, ckpt=stop.checkpoint)
    drop = {"wall_seconds"}
    assert [{k: v for k, v in m.items() if k not in drop} for m in resumed] == \
           [{k: v for k, v in m.items() if k not in drop} for m in whole]
    assert signal.getsignal(signal.SIGINT) is before  # the handlers are given back
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_second_signal_stops_at_once_without_a_checkpoint(
    compose_cfg: Callable[..., DictConfig], tmp_path: Path
) -> None:
    with pytest.raises(KeyboardInterrupt) as info:
        fit(compose_cfg(*QUICK), tmp_path, SignalAt(2, signal.SIGINT, signal.SIGINT))
    assert not isinstance(info.value, RunInterrupted)
    assert "again" in str(info.value)
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()


def test_without_a_run_folder_the_interrupt_says_nothing_was_saved(compose_cfg: Callable[..., DictConfig]) -> None:
    with pytest.raises(RunInterrupted, match="no checkpoint"):
        fit(compose_cfg(*QUICK), None, SignalAt(0, signal.SIGINT))


def test_train_py_on_sigterm_prints_how_to_resume_and_the_resume_finishes_the_run(tmp_path: Path) -> None:
    """A real ``python train.py`` stopped by SIGTERM once it has logged a few rounds: exit code 143, one
    ``interrupted:`` line with the resume command, no traceback; that command finishes the run with the rounds an
    uninterrupted run logs."""
    out = tmp_path / "run"
    args = ["task.steps=400000", "task.steps_per_round=100", "env.num_clients=20", "plots=false",
            "logger.tensorboard=false"]
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args, f"hydra.run.dir={out}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        metrics = out / "metrics.csv"
        if metrics.is_file() and len(metrics.read_text().splitlines()) > 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.SIGTERM, err
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith("interrupted: SIGTERM after round ") and "Traceback" not in err, err
    assert (out / "checkpoints" / "last.ckpt").is_file() and not (out / "summary.json").exists()
    command = lines[-1].split("; resume with: ", 1)[1]
    assert f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}" in command and f"hydra.run.dir={out}" in command
    resumed = subprocess.run([sys.executable, str(ROOT / "train.py"), *command.split()[2:], "trainer.max_rounds=60"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False)
    assert resumed.returncode == 0, resumed.stderr
    rows = (out / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 60  # the header, then every round once

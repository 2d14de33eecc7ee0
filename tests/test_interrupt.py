"""Interrupts that save: SIGINT or SIGTERM during a run finish the round, write the checkpoint and stop with a
message; the resumed run equals the uninterrupted one. A second signal stops at once, and one before the first round
(while ``train.py`` imports, composes, builds) stops at once too: one ``interrupted:`` line, no traceback."""
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

from fedrec.app.build import build_task
from fedrec.errors import Interrupted, interrupts_raise
from fedrec.trainer import Callback, FederatedTrainer, RunInterrupted
from fedrec.trainer.checkpoint import load_checkpoint

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
    with pytest.raises(Interrupted) as info:
        fit(compose_cfg(*QUICK), tmp_path, SignalAt(2, signal.SIGINT, signal.SIGINT))
    assert str(info.value).startswith("SIGINT again: stopped at once") and info.value.signum == signal.SIGINT
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
    proc = _started_run(tmp_path, out, args)
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


def test_interrupts_raise_turns_a_signal_into_an_exception_and_gives_the_handlers_back() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as info, interrupts_raise("before the first round"):
        os.kill(os.getpid(), signal.SIGTERM)
    assert (info.value.signum, str(info.value)) == (signal.SIGTERM, "SIGTERM before the first round")
    assert signal.getsignal(signal.SIGTERM) == before


def catches_sigterm(pid: int) -> bool:
    """Whether process ``pid`` has a handler of SIGTERM (its ``SigCgt`` mask in /proc): Python has none of its own,
    ``train.py`` installs one first thing, before its slow imports."""
    mask = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads a process's signal mask from /proc")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("when", ["imports", "run folder"])
def test_train_py_interrupted_before_the_first_round_says_so_in_one_line(tmp_path: Path, signum: int,
                                                                       when: str) -> None:
    """A signal while ``train.py`` imports (right after its handler is installed), or once Hydra has made the run
    folder (then Hydra's copies, the imports of torch, the build): exit code 128 + the signal, one ``interrupted:``
    line, no traceback, and no run folder left."""
    for attempt in range(3):  # a loaded machine may starve this poller until the short run is past its start-up
        out = tmp_path / f"run{attempt}"
        proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), "quick=true", f"hydra.run.dir={out}"],
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = ((lambda pid=proc.pid: catches_sigterm(pid)) if when == "imports"
                 else (out / ".hydra" / "config.yaml").is_file)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None and not ready():
            time.sleep(0.005)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=240)
        late = proc.returncode == 0 or " after round " in err  # the signal came after start-up: try again
        if not late:
            break
    assert proc.returncode == 128 + signum, err
    removed = "" if when == "imports" else f"; its run folder {out} was removed"
    name = signal.Signals(signum).name
    assert err == f"interrupted: {name} before the first round: nothing was trained{removed}\n"
    assert not out.exists()


def test_train_py_on_a_second_ctrl_c_stops_at_once_without_a_traceback(tmp_path: Path) -> None:
    """Two Ctrl-C in a row during a run: the second stops it during the round (or is ignored while the first one's
    stop is reported), one ``interrupted:`` line, exit code 130, and the checkpoint written before stays whole."""
    out = tmp_path / "run"
    args = ["task.steps=400000", "task.steps_per_round=100", "env.num_clients=20", "plots=false",
            "logger.tensorboard=false", "trainer.checkpoint_every=1"]
    proc = _started_run(tmp_path, out, args)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "Traceback" not in err and [line for line in err.splitlines() if line.startswith("interrupted: ")] == \
        [err.strip()], err
    assert load_checkpoint(out / "checkpoints" / "last.ckpt")["round"] >= 3  # its digest checked


def _started_run(tmp_path: Path, out: Path, args: list[str]) -> subprocess.Popen:
    """``train.py`` with ``args`` writing into ``out``, returned once it has logged three rounds (or ended)."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args, f"hydra.run.dir={out}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        metrics = out / "metrics.csv"
        if metrics.is_file() and len(metrics.read_text().splitlines()) > 3:
            break
        time.sleep(0.05)
    return proc

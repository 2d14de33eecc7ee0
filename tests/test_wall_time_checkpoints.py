"""``trainer.checkpoint_minutes``: a checkpoint after the first round that ends that many minutes (wall time) after
the last one, whatever ``checkpoint_every`` says, so that a killed long run loses little. The clock is the trainer's
``time.monotonic``, replaced here by one the test moves; a checkpoint changes nothing in a run's results."""
from __future__ import annotations

import csv
import io
import json
import math
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import DictConfig

import fedrec.trainer.trainer as trainer_module
from fedrec.app.build import build_task
from fedrec.app.cli import run
from fedrec.app.presets import expand_quick
from fedrec.app.sweeps import without_timings
from fedrec.errors import ConfigError
from fedrec.trainer import Callback, FederatedTrainer
from fedrec.trainer.checkpoint import load_checkpoint

CONF = Path(__file__).resolve().parents[1] / "conf"
TWELVE_ROUNDS = ("task.steps=1200", "task.steps_per_round=100", "env.num_clients=20")


class Clock(Callback):
    """The trainer's clock: it moves one minute at the end of every round; records the rounds saved at."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now, self.saved_at = 0.0, []
        monkeypatch.setattr(trainer_module, "time", types.SimpleNamespace(
            perf_counter=trainer_module.time.perf_counter, monotonic=lambda: self.now))

    def on_round_end(self, trainer: Any, task: Any, round_idx: int, metrics: dict[str, float]) -> None:
        self.now += 60.0

    def on_save_checkpoint(self, trainer: Any, task: Any, checkpoint: dict[str, Any]) -> None:
        self.saved_at.append(trainer.round)


class StopAt(Callback):
    """Kills the run (without a checkpoint of its own) at the end of round ``at``, as a crash would."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_round_end(self, trainer: Any, task: Any, round_idx: int, metrics: dict[str, float]) -> None:
        if round_idx == self.at:
            raise RuntimeError("killed")


def fit(cfg: DictConfig, root: Path | None, *callbacks: Callback, ckpt: Path | None = None,
        **kwargs: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The history of a run of ``cfg`` and its task's final state."""
    task = build_task(cfg)
    history = FederatedTrainer(default_root_dir=root, callbacks=callbacks, enable_progress_bar=False,
                               **kwargs).fit(task, ckpt_path=ckpt)
    return [without_timings(m) for m in history], task.state_dict()


def assert_same_state(a: Any, b: Any, where: str = "state") -> None:
    """Exact equality of nested dicts, lists, tensors and numbers (a NaN equals a NaN), but for the fields that
    measure time (``*_seconds``)."""
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=where)
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in (k for k in a if not (isinstance(k, str) and "_seconds" in k)):
            assert_same_state(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), f"{where}: {a!r} != {b!r}"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.parametrize(("every", "saved_at"), [(0, [3, 6, 9, 12, 12]), (4, [3, 4, 7, 8, 11, 12, 12])])
def test_checkpoints_follow_the_clock_which_every_checkpoint_restarts(
    compose_cfg: Callable[..., DictConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, every: int,
    saved_at: list[int],
) -> None:
    """2.5 minutes with rounds of a minute: a checkpoint after every third round, counted from the last checkpoint
    of either kind (the last one is the run's end)."""
    clock = Clock(monkeypatch)
    fit(compose_cfg(*TWELVE_ROUNDS), tmp_path, clock, checkpoint_minutes=2.5, checkpoint_every=every)
    assert clock.saved_at == saved_at


def test_a_run_killed_after_a_wall_time_checkpoint_resumes_from_it_to_the_uninterrupted_run(
    compose_cfg: Callable[..., DictConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = compose_cfg(*TWELVE_ROUNDS)
    whole = fit(cfg, None)
    clock = Clock(monkeypatch)
    with pytest.raises(RuntimeError, match="killed"):  # after round 8, its last checkpoint after round 6
        fit(cfg, tmp_path, clock, StopAt(7), checkpoint_minutes=2.5)
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    assert clock.saved_at == [3, 6] and load_checkpoint(ckpt)["round"] == 6
    resumed = fit(cfg, tmp_path / "resumed", ckpt=ckpt)
    assert resumed[0] == whole[0]
    assert_same_state(resumed[1], whole[1])


def _every_minute_a_checkpoint(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A clock that moves a minute whenever the trainer reads it; the rounds the trainer saved at."""
    ticks, saved = iter(range(10**9)), []
    monkeypatch.setattr(trainer_module, "time", types.SimpleNamespace(
        perf_counter=trainer_module.time.perf_counter, monotonic=lambda: 60.0 * next(ticks)))
    save = FederatedTrainer.save

    def counted(self: FederatedTrainer, task: Any) -> Path:
        saved.append(self.round)
        return save(self, task)

    monkeypatch.setattr(FederatedTrainer, "save", counted)
    return saved


def _metrics(out: Path) -> list[dict[str, str]]:
    """metrics.csv's rows without the columns that measure time."""
    return [without_timings(row) for row in csv.DictReader(io.StringIO((out / "metrics.csv").read_text()))]


@pytest.mark.parametrize("experiment", ["quickstart", "fedgnn_ml100k_dp", "bgtplanner_ml100k", "gossip_synthetic_k3",
                                        "fclub_synthetic", "vfl_synthetic"])
def test_a_checkpoint_after_every_round_changes_no_result(
    compose_cfg: Callable[..., DictConfig], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, experiment: str
) -> None:
    """Each kind of task (bandit, recommendation with and without privacy, a budget planner, gossip, clustering,
    vertical FL) run with a checkpoint after every round and with one at its end only: the same per-round metrics,
    summary and final state (``train.py``'s default of 5 minutes leaves a run's results as they were)."""
    argv = expand_quick(CONF, [f"+experiment={experiment}", "quick=true", "plots=false", "logger.tensorboard=false",
                               "trainer.checkpoint_every=0"])
    run(compose_cfg(*argv, "trainer.checkpoint_minutes=0"), output_dir=tmp_path / "end")
    saved = _every_minute_a_checkpoint(monkeypatch)
    run(compose_cfg(*argv, "trainer.checkpoint_minutes=1"), output_dir=tmp_path / "every")
    rounds = load_checkpoint(tmp_path / "every" / "checkpoints" / "last.ckpt")["round"]
    assert saved == [*range(1, rounds + 1), rounds]
    assert _metrics(tmp_path / "every") == _metrics(tmp_path / "end")
    summaries = [without_timings(json.loads((tmp_path / d / "summary.json").read_text())) for d in ("end", "every")]
    assert summaries[0] == summaries[1]
    states = [load_checkpoint(tmp_path / d / "checkpoints" / "last.ckpt") for d in ("end", "every")]
    assert_same_state(states[1]["task"], states[0]["task"])
    assert_same_state(states[1]["callbacks"], states[0]["callbacks"])


@pytest.mark.parametrize("value", [-1, "soon", float("nan")])
def test_a_bad_checkpoint_minutes_is_refused_naming_the_field(tmp_path: Path, value: Any) -> None:
    with pytest.raises(ConfigError, match="trainer.checkpoint_minutes"):
        FederatedTrainer(default_root_dir=tmp_path, checkpoint_minutes=value)


def test_checkpoint_minutes_needs_a_run_folder() -> None:
    with pytest.raises(ConfigError, match="trainer.checkpoint_minutes > 0 needs a default_root_dir"):
        FederatedTrainer(checkpoint_minutes=5)
    FederatedTrainer(checkpoint_minutes=0)  # the library's default: no files behind

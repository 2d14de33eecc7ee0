"""Callbacks from the config: the ``callbacks`` list builds fedrec callbacks (a user's own class included), and
EarlyStopping stops a run after the right round, also when the run is resumed from a checkpoint."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from fedrec.app.cli import run
from fedrec.app.schema import check_command_line
from fedrec.errors import ConfigError
from fedrec.trainer import EarlyStopping
from fedrec.trainer.checkpoint import load_checkpoint
from tests.helpers import CONF, ROOT, Compose, read_csv

#: a 12-round bandit run that checkpoints every 4 rounds (tests/test_cli.py's resume run)
BANDIT = ("task.steps=600", "task.steps_per_round=50", "env.num_clients=20", "env.dim=5", "env.num_arms=5",
          "protocol.gamma_u=2.0", "logger.tensorboard=false", "plots=false", "trainer.checkpoint_every=4")
#: stop once the run's message count has not grown by more than 8 for 2 rounds
STOPPING = dict(monitor="comm_messages", mode="max", patience=2, min_delta=8.0)
STOPPING_OVERRIDE = ("callbacks=[{_target_:fedrec.trainer.EarlyStopping,monitor:comm_messages,mode:max,patience:2,"
                     "min_delta:8.0}]")
SUBPROCESS_TIMEOUT = 240


class FakeTrainer:
    should_stop = False


def stopping_round(values: list[float], **kwargs: Any) -> int | None:
    """The round after which EarlyStopping(monitor="m", **kwargs) stops a run logging ``values``, if any."""
    es, trainer = EarlyStopping(monitor="m", **kwargs), FakeTrainer()
    for r, v in enumerate(values):
        es.on_round_end(trainer, None, r, {"round": r, "m": v})
        if trainer.should_stop:
            return r
    return None


# ------------------------------------------------------------------------------------------------ the rule
@pytest.mark.parametrize(("values", "kwargs", "expected"), [
    ([1.0, 0.9, 0.95, 0.94, 0.93], dict(patience=3), 4),  # best at round 1, then 3 rounds without improvement
    ([1.0, 0.9, 0.95, 0.85, 0.93, 0.94], dict(patience=2), 5),  # round 3 improves: the count starts again
    ([1.0, 0.9, 0.8, 0.7], dict(patience=1), None),  # always improving
    ([0.5, 0.6, 0.6, 0.6], dict(mode="max", patience=2), 3),  # equal is no improvement
    ([0.5, 0.4, 0.3], dict(mode="max", patience=3), None),
    ([1.0, 0.99, 0.98, 0.97], dict(patience=3, min_delta=0.05), 3),  # steps of 0.01 are too small
    ([1.0, 0.99, 0.98, 0.97], dict(patience=3, min_delta=0.0), None),
    ([1.0, math.nan, math.nan], dict(patience=2), 2),  # NaN never improves
    ([math.nan, 1.0, 1.1, 1.2], dict(patience=2), 3),  # the first finite value sets the best
])
def test_early_stopping_stops_after_the_right_round(values: list[float], kwargs: dict[str, Any],
                                                    expected: int | None) -> None:
    assert stopping_round(values, **kwargs) == expected


def test_early_stopping_state_continues_where_it_left_off() -> None:
    """A fresh EarlyStopping loaded with the state of one that saw the first rounds stops where the uninterrupted
    one does (a fresh one without that state would not stop)."""
    values = [1.0, 0.9, 0.95, 0.96, 0.97]
    assert stopping_round(values, patience=3) == 4
    first, trainer = EarlyStopping(monitor="m", patience=3), FakeTrainer()
    for r, v in enumerate(values[:3]):
        first.on_round_end(trainer, None, r, {"m": v})
    assert first.state_dict() == {"best": 0.9, "wait": 1}
    second = EarlyStopping(monitor="m", patience=3)
    second.load_state_dict(first.state_dict())
    for r, v in enumerate(values[3:], start=3):
        second.on_round_end(trainer, None, r, {"m": v})
    assert trainer.should_stop and second.wait == 3
    assert stopping_round(values[3:], patience=3) is None


def test_unknown_monitor_names_the_config_entry() -> None:
    es = EarlyStopping(monitor="val_rmse")
    es.config_key = "callbacks[2]"
    with pytest.raises(ConfigError, match=r"^callbacks\[2\]\.monitor: .*'val_rmse'.*test_rmse"):
        es.on_round_end(FakeTrainer(), None, 0, {"round": 0, "test_rmse": 0.9, "train_loss": 0.5})


@pytest.mark.parametrize(("kwargs", "field"), [
    (dict(mode="lower"), "mode"), (dict(patience=0), "patience"), (dict(patience=2.5), "patience"),
    (dict(min_delta=-0.1), "min_delta"), (dict(monitor=""), "monitor"),
])
def test_bad_arguments_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{field}: "):
        EarlyStopping(**{"monitor": "test_rmse", **kwargs})


# ------------------------------------------------------------------------------------------------ the command line
def test_command_lines_that_add_callbacks_pass_the_schema_check() -> None:
    """``callback=early_stopping`` (a preset, then its fields as ``callbacks.0.*``) and ``callbacks=[...]`` pass
    train.py's check of the command line; ``callbacks.0.*`` without any callback is refused."""
    preset = ["+experiment=fedgnn_synthetic", "callback=early_stopping", "callbacks.0.patience=5"]
    check_command_line(CONF, preset)
    check_command_line(CONF, [STOPPING_OVERRIDE])
    with pytest.raises(ConfigError, match=r"^callbacks\.0\.patience: "):
        check_command_line(CONF, ["callbacks.0.patience=5"])
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=preset)
        assert compose("config").callbacks == []
    assert [dict(cb) for cb in cfg.callbacks] == [{"_target_": "fedrec.trainer.EarlyStopping", "monitor": "test_rmse",
                                                   "mode": "min", "patience": 5, "min_delta": 0.0}]


def test_config_errors_name_the_callback_entry(compose_cfg: Compose, tmp_path: Path) -> None:
    bad = "callbacks=[{_target_:fedrec.trainer.EarlyStopping,monitor:comm_messages,mode:lower}]"
    with pytest.raises(ConfigError, match=r"^callbacks\[0\]\.mode: must be 'min' or 'max', got 'lower'"):
        run(compose_cfg(*BANDIT, bad), output_dir=tmp_path / "a")
    with pytest.raises(ConfigError, match=r"^callbacks\[1\]: collections\.OrderedDict is not a subclass"):
        run(compose_cfg(*BANDIT,
                        "callbacks=[{_target_:fedrec.trainer.ProgressBar},{_target_:collections.OrderedDict}]"),
            output_dir=tmp_path / "b")
    unknown = "callbacks=[{_target_:fedrec.trainer.EarlyStopping,monitor:val_rmse}]"
    with pytest.raises(ConfigError, match=r"^callbacks\[0\]\.monitor: the run logs no metric 'val_rmse'"):
        run(compose_cfg(*BANDIT, unknown), output_dir=tmp_path / "c")


# ------------------------------------------------------------------------------------------------ resume
def test_resumed_run_stops_at_the_same_round_as_the_uninterrupted_one(compose_cfg: Compose, tmp_path: Path) -> None:
    """A run stopped early, and the same run interrupted while EarlyStopping was counting rounds without
    improvement and resumed from its checkpoint: both stop after the same round with the same metrics."""
    full = run(compose_cfg(*BANDIT, STOPPING_OVERRIDE), output_dir=tmp_path / "full")
    logged = [float(row["comm_messages"]) for row in read_csv(tmp_path / "full" / "metrics.csv")]
    stop = stopping_round(logged, **{k: v for k, v in STOPPING.items() if k != "monitor"})
    assert stop is not None and stop < 11  # stopped early, in a 12-round run
    assert full["rounds_run"] == len(logged) == stop + 1
    waits = []  # the rounds after which the rule counts at least one round without improvement
    reference = EarlyStopping(**STOPPING)
    for r, v in enumerate(logged[:stop]):
        reference.on_round_end(FakeTrainer(), None, r, {"comm_messages": v})
        waits += [r] if reference.wait else []
    assert waits, "the run never waits before it stops: the resume would not test the saved state"

    part = tmp_path / "part"
    run(compose_cfg(*BANDIT, STOPPING_OVERRIDE, f"trainer.max_rounds={waits[0] + 1}"), output_dir=part)
    ckpt = part / "checkpoints" / "last.ckpt"
    saved = load_checkpoint(ckpt)
    assert saved["round"] == waits[0] + 1 and not saved["should_stop"]
    assert saved["callbacks"]["EarlyStopping[comm_messages]"]["wait"] >= 1

    with pytest.raises(ConfigError, match="callbacks"):  # the callbacks are part of what the run is
        run(compose_cfg(*BANDIT, f"ckpt_path={ckpt}"), output_dir=tmp_path / "without")
    resumed = run(compose_cfg(*BANDIT, STOPPING_OVERRIDE, f"ckpt_path={ckpt}"), output_dir=tmp_path / "resumed")
    drop = ("wall_seconds",)
    assert {k: v for k, v in resumed.items() if k not in drop} == {k: v for k, v in full.items() if k not in drop}
    assert read_csv(tmp_path / "resumed" / "metrics.csv") == read_csv(tmp_path / "full" / "metrics.csv")


# ------------------------------------------------------------------------------------------------ your own
USER_MODULE = '''
import json

from fedrec.trainer import Callback


class Recorder(Callback):
    """Writes the rounds it saw to TAG.json in the run folder."""

    def __init__(self, tag: str) -> None:
        self.tag, self.rounds = tag, []

    def on_round_end(self, trainer, task, round_idx, metrics):
        self.rounds.append(round_idx)

    def on_fit_end(self, trainer, task):
        (trainer.root / f"{self.tag}.json").write_text(json.dumps({"rounds": self.rounds, "key": self.config_key}))
'''


def test_a_callback_of_your_own_is_called(tmp_path: Path) -> None:
    """``train.py 'callbacks=[{_target_:my_callbacks.Recorder,tag:seen}]'`` with the module on the PYTHONPATH."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "my_callbacks.py").write_text(textwrap.dedent(USER_MODULE))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "mine"), os.environ.get("PYTHONPATH", "")])}
    env.pop("FEDREC_DATA_DIR", None)  # the default (synthetic) config needs no dataset
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "task.steps=300", "plots=false", "logger.tensorboard=false",
         "callbacks=[{_target_:my_callbacks.Recorder,tag:seen}]", f"hydra.run.dir={out}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "seen.json").read_text()) == {"rounds": [0, 1, 2], "key": "callbacks[0]"}
    assert "Recorder" in load_checkpoint(out / "checkpoints" / "last.ckpt")["callbacks"]

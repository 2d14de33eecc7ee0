"""``train.py`` refuses a bad command line before Hydra starts: exit code 2, one ``error:`` line naming the field,
no traceback, no run folder (a sample of each kind of :mod:`test_schema`'s battery)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.mark.parametrize("args, field", [
    (["protocol.preregister=flase"], "protocol.preregister"),
    (["+experiment=vfl_synthetic", "protocol.refresh_mask=ture"], "protocol.refresh_mask"),
    (["+experiment=fedgnn_ml100k", "privacy=none", "+privacy.epsilon=5"], "privacy.epsilon"),
    (["protocol=asyn"], "protocol"),
    (["protocol.foo=1"], "protocol.foo"),
    (["+experiment=fclub_synthetic", "policy=lints"], "policy"),
    (["-m", "seed=0,1", "plots=flase"], "plots"),
    (["protocol=gossip_ucb"], "protocol"),  # a multi-agent protocol in a bandit run
    (["protocol=vfucb", "env=mab_synthetic"], "env"),
    (["+experiment=gossip_synthetic_k3", "protocol=async"], "protocol"),
    (["+experiment=fedgnn_synthetic", "privacy=tree_laplace", "task.rounds=1"], "privacy"),  # refused by the build
    (["replicates=100000"], "replicates"),  # about 1.6 TiB: refused before allocating
    (["+experiment=fedgnn_synthetic", "task.optimizer=adma"], "task.optimizer"),  # a field of fixed choices
    (["+experiment=vfl_synthetic", "protocol.mode=centrl"], "protocol.mode"),
])
def test_train_py_exits_2_with_one_line_and_no_run_folder(
    train_py: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], field: str
) -> None:
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        train_py(*args, f"hydra.run.dir={out}", f"hydra.sweep.dir={out}")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {field}: "), err
    assert "Traceback" not in err[0]
    assert not out.exists()


def test_a_sweep_is_checked_for_each_option_of_its_group_sweeps(
    train_py: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``-m privacy=gaussian,none privacy.epsilon=4``: the first option declares the field, the second does not, so
    the sweep is refused before its first job (Hydra would have failed at the second job's composition)."""
    out = tmp_path / "sweep"
    with pytest.raises(SystemExit) as info:
        train_py("-m", "+experiment=fedgnn_synthetic", "privacy=gaussian,none", "privacy.epsilon=4", "task.rounds=2",
                 "plots=false", "logger.tensorboard=false", f"hydra.sweep.dir={out}")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: privacy.epsilon: privacy=none has no field 'epsilon'; nothing would read it"]
    assert not out.exists()


def test_a_sweep_job_that_sets_a_group_its_protocol_does_not_use_fails_alone(
    train_py: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``-m protocol=async,vfucb policy=lints``: the command line passes (Async takes a local policy), the VFUCB job
    is refused by its own check (VFUCB carries its own policy node) and the sweep reports it."""
    out = tmp_path / "sweep"
    with pytest.raises(SystemExit) as info:
        train_py("-m", "protocol=async,vfucb", "policy=lints", "task.steps=200", "task.steps_per_round=100",
                 "plots=false", "logger.tensorboard=false", f"hydra.sweep.dir={out}")
    assert info.value.code == 2
    assert "error: policy: VerticalLinearBandit carries its own policy node" in capsys.readouterr().err
    assert (out / "0" / "summary.json").is_file() and not (out / "1" / "summary.json").exists()


def test_a_sweep_with_one_bad_choice_is_refused_before_its_first_job(
    train_py: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``-m task.optimizer=adam,adma``: the second job's value is no optimizer, so no job runs (each job would
    otherwise learn it only when its server is built)."""
    out = tmp_path / "sweep"
    with pytest.raises(SystemExit) as info:
        train_py("-m", "+experiment=fedgnn_synthetic", "task.optimizer=adam,adma", "task.rounds=2", "plots=false",
                 "logger.tensorboard=false", f"hydra.sweep.dir={out}")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: task.optimizer: must be one of ['adam', 'sgd'], got 'adma' (did you mean 'adam'?)"]
    assert not out.exists()

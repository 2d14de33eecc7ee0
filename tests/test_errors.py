"""The argument checks of :mod:`fedrec.errors`: a refused value's message names the field and what was expected."""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import DictConfig

from fedrec.app.cli import run
from fedrec.errors import ConfigError, check_choice, did_you_mean
from fedrec.federation.topology import KINDS

CHOICES = ("gaussian", "laplace")


def test_check_choice_returns_a_valid_value_unchanged() -> None:
    value = "laplace"
    assert check_choice("privacy.mechanism", value, CHOICES) is value
    assert check_choice("topology.kind", "ring", KINDS) == "ring"  # a dict's keys are its choices


def test_check_choice_message_names_the_field_and_lists_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"^privacy\.mechanism must be one of \['gaussian', 'laplace'\], got 'x'$"):
        check_choice("privacy.mechanism", "x", CHOICES)
    with pytest.raises(ValueError, match=r"^topology\.kind must be one of \['complete', 'ring', 'path', "):
        check_choice("topology.kind", "torus", KINDS)  # a ConfigError is a ValueError


def test_check_choice_suggests_a_near_miss() -> None:
    with pytest.raises(ConfigError) as err:
        check_choice("privacy.mechanism", "gausian", CHOICES)
    assert str(err.value) == ("privacy.mechanism must be one of ['gaussian', 'laplace'], got 'gausian' "
                              "(did you mean 'gaussian'?)")


@pytest.mark.parametrize("value", ["exponential", 3, None])
def test_check_choice_suggests_nothing_for_a_far_value(value: object) -> None:
    with pytest.raises(ConfigError) as err:
        check_choice("privacy.mechanism", value, CHOICES)
    assert str(err.value) == f"privacy.mechanism must be one of ['gaussian', 'laplace'], got {value!r}"
    assert "did you mean" not in str(err.value)


def test_check_choice_refuses_an_unhashable_value_by_name() -> None:
    """A list where a name was meant (``topology.kind: [ring]``) is a ConfigError too, not a TypeError."""
    with pytest.raises(ConfigError) as err:
        check_choice("topology.kind", ["ring"], KINDS)
    assert str(err.value) == f"topology.kind must be one of {list(KINDS)}, got ['ring'] (did you mean 'ring'?)"


def test_a_misspelt_config_choice_is_refused_with_the_near_one(compose_cfg: Callable[..., DictConfig],
                                                               tmp_path: Path) -> None:
    """End to end: ``topology.kind=rign`` on the command line of a gossip run."""
    cfg = compose_cfg("+experiment=gossip_synthetic_k3", "replicates=1", "task.steps=100", "task.steps_per_round=50",
                      "logger.tensorboard=false", "plots=false", "topology.kind=rign")
    with pytest.raises(ConfigError, match=re.escape(f"topology.kind must be one of {list(KINDS)}, got 'rign' "
                                                    "(did you mean 'ring'?)")):
        run(cfg, output_dir=tmp_path)
    assert not (tmp_path / "summary.json").exists()


def test_did_you_mean_falls_back_to_names_containing_the_word_but_not_for_an_empty_one() -> None:
    names = ["async_linucb", "async_linucb_am", "sync_linucb", "fclub"]
    assert did_you_mean("fclab", names) == " (did you mean 'fclub'?)"
    assert did_you_mean("ucb", names) == " (did you mean 'async_linucb' or 'async_linucb_am' or 'sync_linucb'?)"
    assert did_you_mean("", names) == "" and did_you_mean("zzz", names) == ""

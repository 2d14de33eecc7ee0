"""A task kind registers its builder and groups (fedrec.app.build.kinds): a kind registered from this test module builds
through build_task and is checked like fedrec's own, with no table of fedrec edited."""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from omegaconf import DictConfig

from fedrec.app import build
from fedrec.errors import ConfigError
from fedrec.tasks.base import FederatedTask

Compose = Callable[..., DictConfig]


class CountingTask(FederatedTask):
    """A task of a kind fedrec does not ship: it counts over the agents of a communication graph."""

    kind = "counting"

    def __init__(self, topology: Any, upto: int = 3) -> None:
        super().__init__()
        self.topology, self.upto = topology, upto
        self.count = 0

    def run_round(self, round_idx: int) -> dict[str, float]:
        self.count += self.topology.num_agents
        return {"count": float(self.count)}

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = state["count"]

    def summary(self) -> dict[str, Any]:
        return {"count": self.count}


@pytest.fixture
def counting_kind() -> Iterator[None]:
    """The ``counting`` kind, registered for one test: it needs the ``topology`` group and reads ``planner`` if
    given."""
    @build.register_kind("counting", groups=("topology",), optional={"planner": "has no privacy-budget planner"})
    def build_counting(cfg: DictConfig) -> Any:
        return build.instantiate_group(cfg.task, "task", topology=build.instantiate_group(cfg.topology, "topology"))

    yield
    del build.KINDS["counting"]


COUNTING = ("task._target_=test_build_kinds.CountingTask", "~task.steps", "~task.steps_per_round", "+task.upto=5",
            "topology=ring", "topology.num_agents=7", "~env", "~protocol")


def test_a_kind_registered_outside_fedrec_builds(compose_cfg: Compose, counting_kind: None) -> None:
    cfg = compose_cfg(*COUNTING)
    task = build.build_task(cfg)
    assert isinstance(task, CountingTask) and task.upto == 5 and task.topology.num_agents == 7
    assert task.run_round(0) == {"count": 7.0}


def test_its_groups_are_checked_like_fedrecs_own(compose_cfg: Compose, counting_kind: None) -> None:
    with pytest.raises(ConfigError, match=r"^topology: a counting run \(task=test_build_kinds.CountingTask\) needs "
                                          r"the topology group"):
        build.build_task(compose_cfg(*(o for o in COUNTING if not o.startswith("topology")), "~topology"))
    with pytest.raises(ConfigError, match=r"^protocol: a counting run .* does not use the protocol group"):
        build.build_task(compose_cfg(*COUNTING[:-1]))
    unused = build.unused_groups(compose_cfg(*COUNTING))
    assert "planner" not in unused  # its own optional group
    assert unused["server"] == "a counting run has no server optimiser (it belongs to recommendation runs)"
    assert unused["policy"] == "a counting run takes no local policy (it belongs to bandit runs)"
    # fedrec's own kinds see it too: a bandit run leaves planner unread, and both kinds that read it are named
    assert build.unused_groups(compose_cfg())["planner"] == ("a bandit run has no privacy-budget planner (it belongs "
                                                             "to recommendation and counting runs)")


def test_a_kind_is_registered_once(counting_kind: None) -> None:
    with pytest.raises(ValueError, match="task kind 'counting' is registered already"):
        build.register_kind("counting", groups=())(lambda cfg: None)


def test_an_unregistered_kind_is_refused_naming_the_registered_ones(compose_cfg: Compose) -> None:
    with pytest.raises(ConfigError, match=r"^task: test_build_kinds.CountingTask declares no task kind fedrec builds "
                                          r"\(kind one of \['bandit', 'multi_agent', 'recommendation'\], got "
                                          r"'counting'\)$"):
        build.build_task(compose_cfg(*COUNTING))

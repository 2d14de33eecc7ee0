"""The multi-agent experiments through Hydra: resume, the privacy group's rules, bad input naming the field."""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Callable

import pytest
from omegaconf import DictConfig

from fedrec.app.build import check_privacy
from fedrec.app.cli import run
from fedrec.errors import ConfigError, DatasetNotFoundError
from fedrec.privacy import TreeLaplace
from fedrec.protocols import FedUCB, GossipUCB

QUICK = ("+experiment=gossip_synthetic_k3", "replicates=3", "task.steps=3000", "task.steps_per_round=500",
         "logger.tensorboard=false", "plots=false", "trainer.checkpoint_every=2")

Compose = Callable[..., DictConfig]


def test_fed_ucb_run_reports_regret_band_epsilon_and_gossip_messages(compose_cfg: Compose, tmp_path: Path) -> None:
    s = run(compose_cfg(*QUICK, "privacy.epsilon=2"), output_dir=tmp_path)
    trials = s["cumulative_regret_per_replicate"]
    assert len(trials) == 3 and len(set(trials)) == 3  # independent trials
    assert (s["cumulative_regret_min"], s["cumulative_regret"], s["cumulative_regret_max"]) == \
        pytest.approx((min(trials), statistics.fmean(trials), max(trials)))
    assert s["epsilon"] == 2.0 and 0 < s["epsilon_spent"] <= 2.0 + 1e-12  # ⌈log₂ 3000⌉ = ⌊log₂ 3000⌋ + 1 levels
    assert s["comm_peer_messages"] == 2 * 3000 and s["comm_upload_messages"] == 0  # one edge, two messages a round
    assert s["lambda2"] == pytest.approx(0.5)


def test_resume_matches_uninterrupted_run(compose_cfg: Compose, tmp_path: Path) -> None:
    full = run(compose_cfg(*QUICK, "privacy.epsilon=1"), output_dir=tmp_path / "full")
    part = run(compose_cfg(*QUICK, "privacy.epsilon=1", "trainer.max_rounds=3"), output_dir=tmp_path / "part")
    assert part["steps"] == 1500
    resumed = run(compose_cfg(*QUICK, "privacy.epsilon=1", f"ckpt_path={tmp_path / 'part/checkpoints/last.ckpt'}"),
                  output_dir=tmp_path / "resumed")
    strip = lambda s: {k: v for k, v in s.items() if k != "wall_seconds"}  # noqa: E731
    assert strip(resumed) == strip(full)


@pytest.mark.parametrize("protocol", ["gossip_ucb", "local_ucb", "central_ucb"])
def test_protocols_without_noise_run_only_at_infinite_epsilon(compose_cfg: Compose, tmp_path: Path,
                                                               protocol: str) -> None:
    s = run(compose_cfg(*QUICK, f"protocol={protocol}"), output_dir=tmp_path / "inf")
    assert math.isfinite(s["cumulative_regret"])
    with pytest.raises(ConfigError, match=r"privacy\.epsilon.*fed_ucb"):
        run(compose_cfg(*QUICK, f"protocol={protocol}", "privacy.epsilon=1"), output_dir=tmp_path / "one")


@pytest.mark.parametrize(("overrides", "message"), [
    (("protocol=fed_ucb", "privacy=gaussian"), "privacy: FedUCB applies only TreeLaplace, got ClientDP"),
    (("protocol=gossip_ucb", "privacy=laplace"), "privacy: GossipUCB applies no privacy mechanism, got ClientDP"),
])
def test_the_builder_refuses_a_mechanism_the_protocol_does_not_declare(
    compose_cfg: Compose, tmp_path: Path, overrides: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ConfigError, match=f"^{message}$"):
        run(compose_cfg(*QUICK, *overrides), output_dir=tmp_path)
    assert not (tmp_path / "summary.json").exists()


def test_a_bandit_protocol_refuses_the_tree_mechanism_by_class(compose_cfg: Compose, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^privacy: AsyncLinUCB applies no privacy mechanism, got TreeLaplace$"):
        run(compose_cfg("privacy=tree_laplace", "task.steps=10"), output_dir=tmp_path)


def test_privacy_mechanisms_are_classes_and_subclasses_qualify() -> None:
    class Tighter(TreeLaplace):
        """A mechanism that is a TreeLaplace."""

    check_privacy(FedUCB, Tighter)
    with pytest.raises(ConfigError, match="^privacy: GossipUCB applies no privacy mechanism, got Tighter$"):
        check_privacy(GossipUCB, Tighter)


@pytest.mark.parametrize(("override", "field"), [
    ("privacy.epsilon=0", "epsilon"), ("privacy.epsilon=-1", "epsilon"), ("env.num_arms=0", "num_arms"),
    ("env.num_agents=1", "num_agents"), ("topology=ring", "num_agents"),
    ("privacy.laplace_split=half", "laplace_split"), ("task.steps=0", "steps"),
])
def test_bad_input_names_the_field(compose_cfg: Compose, tmp_path: Path, override: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field):  # a ring needs N >= 3 agents
        run(compose_cfg(*QUICK, override, *(["env.num_agents=2"] if override == "topology=ring" else [])),
            output_dir=tmp_path)
    assert not (tmp_path / "summary.json").exists()


def test_disconnected_edge_list_is_refused(compose_cfg: Compose, tmp_path: Path) -> None:
    cfg = compose_cfg(*QUICK, "topology=edge_list", "env.num_agents=4", "topology.edges=[[0,1],[2,3]]")
    with pytest.raises(ConfigError, match="connected"):
        run(cfg, output_dir=tmp_path)


def test_diabetes_without_its_file_names_the_path(compose_cfg: Compose, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetNotFoundError, match="uci-diabetes-130"):
        run(compose_cfg("+experiment=gossip_diabetes", f"data_dir={empty}", "task.steps=100"), output_dir=tmp_path)


def test_summary_is_strict_json_with_infinite_epsilon(compose_cfg: Compose, tmp_path: Path) -> None:
    run(compose_cfg(*QUICK), output_dir=tmp_path)

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    s = json.loads((tmp_path / "summary.json").read_text(), parse_constant=refuse)
    assert s["epsilon"] == s["epsilon_spent"] == "inf"  # documented text, read back by float()
    assert float(s["epsilon"]) == math.inf

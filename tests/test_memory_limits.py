"""Recommendation and multi-agent runs too large for the memory (or the user's max_memory_gb) are refused before
allocating; a recommendation run once its data is loaded, naming model.embed_dim with the estimate and the memory
available. The estimates themselves are held against measured peaks in test_memory_estimates.py."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import DictConfig

from fedrec.app import build
from fedrec.errors import ConfigError

Compose = Callable[..., DictConfig]
SMALL = ("+experiment=fedgnn_synthetic", "data.users=60", "data.items=40", "data.ratings=600", "data.num_clients=10",
         "task.rounds=2", "task.pseudo_items=5")


@pytest.mark.parametrize(("size", "shown"), [("100000000", "100000000"), ("1e8", "100000000.0")])
def test_an_oversized_embedding_is_refused_before_allocating(compose_cfg: Compose, data_dir: Path, size: str,
                                                             shown: str) -> None:
    """model.embed_dim=1e8 on ML-100K would need terabytes: refused on the machine as it is, nothing allocated."""
    cfg = compose_cfg("+experiment=fedgnn_ml100k", f"data_dir={data_dir}", f"model.embed_dim={size}")
    with pytest.raises(ConfigError, match=r"^model\.embed_dim: the run needs about \d+\.\d GiB \(model\.embed_dim="
                                          rf"{shown}, 943 users, 1682 items, \d+ training ratings, "
                                          r"task\.pseudo_items=\d+\) and .* GiB is available; lower one of them$"):
        build.build_task(cfg)


def test_the_refusal_is_at_the_available_memory(compose_cfg: Compose, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = compose_cfg(*SMALL)
    task = build.build_task(cfg)
    data, shared = task.data, sum(p.numel() for p in task.model.shared_parameters().values())
    need = build.recommendation_memory_estimate(cfg, data.num_users, data.num_items, len(data.training),
                                                data.num_clients, shared=shared)  # with the clients' copies of ω
    monkeypatch.setattr(build.capacity, "available_memory", lambda: need - 1)
    with pytest.raises(ConfigError, match="^model.embed_dim: "):
        build.build_task(cfg)
    monkeypatch.setattr(build.capacity, "available_memory", lambda: need)  # exactly enough: built
    assert build.build_task(cfg).model.embed_dim == cfg.model.embed_dim


def test_a_multi_agent_run_larger_than_the_memory_is_refused(compose_cfg: Compose) -> None:
    """env.num_agents=10^7 would allocate a 91 TiB adjacency; replicates=10^8 the gossip statistics."""
    cfg = compose_cfg("+experiment=gossip_synthetic_k3", "env.num_agents=10000000", "replicates=1")
    with pytest.raises(ConfigError, match=r"^env\.num_agents: the run needs about \d+\.\d GiB \(replicates=1, "
                                          r"env\.num_agents=10000000, .*\) and .* GiB is available"):
        build.build_task(cfg)
    with pytest.raises(ConfigError, match=r"^replicates: the run needs about"):
        build.build_task(compose_cfg("+experiment=gossip_synthetic_k3", "replicates=100000000"))


def test_the_users_limit_applies_to_every_kind_of_run(compose_cfg: Compose) -> None:
    with pytest.raises(ConfigError, match=r"^max_memory_gb=1e-06: the run needs about .* GiB \(data\.users=60, "):
        build.build_task(compose_cfg(*SMALL, "max_memory_gb=1e-6"))  # refused before its data is generated
    with pytest.raises(ConfigError, match=r"^max_memory_gb=1e-06: the run needs about .* GiB \(replicates=1, "
                                          r"env\.num_agents=3, "):
        build.build_task(compose_cfg("+experiment=gossip_synthetic_k3", "replicates=1", "max_memory_gb=1e-6"))


def test_the_estimate_counts_graph_expansions_neighbour_slots(compose_cfg: Compose, data_dir: Path) -> None:
    """Each neighbour slot of each training rating adds to the estimate (FedGNN's item layer too); a hundred
    million slots a rating are refused naming the field."""
    estimates = [build.recommendation_memory_estimate(compose_cfg(*SMALL, f"task.expansion.neighbours={k}"), 60, 40,
                                                      500, 10) for k in (0, 7, 14)]
    assert estimates[0] < estimates[1] < estimates[2] and estimates[2] - estimates[1] < estimates[1] - estimates[0]
    huge = compose_cfg("+experiment=fedgnn_ml100k", f"data_dir={data_dir}", "task.expansion.neighbours=100000000")
    with pytest.raises(ConfigError, match="task.expansion.neighbours"):
        build.build_task(huge)

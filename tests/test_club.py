"""fedrec's per-server baselines (fedrec.protocols.LocalClustering: per-user LinUCB, CLUB, SCLUB) against the plain
reference of tests/reference/club.py (written from /work/notes' reading of spec fclub.md §2.8): the same arms and
partitions under both conventions, silence on the channel, resume, and bad inputs."""
from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedrec.envs.clustered import ClusteredLinearEnv
from fedrec.errors import ConfigError
from fedrec.protocols.club import LocalClustering
from tests.reference.club import RefBaseline, paper_beta

T = 1500
ALPHAS = {"linucb": 0.25, "club": 0.25, "sclub": 1.5}
AUTHORS_ALPHA = {"linucb": 15.0, "club": 0.25, "sclub": 1.5}  # the α inside the authors' ln(2/α) (§4.2)


@pytest.fixture(scope="module")
def env(data_dir: Path) -> ClusteredLinearEnv:
    return ClusteredLinearEnv(data_dir=data_dir, replicates=2, seed=3, chunk_size=500)


def authors_beta(method: str, dim: int):
    """0.5·sqrt(2 ln(2/α) + d ln(3 + t/d)) (the authors' code, L_arg = 1 for the per-server baselines)."""
    return lambda count, t: 0.5 * math.sqrt(2 * math.log(2 / AUTHORS_ALPHA[method]) + dim * math.log(3 + t / dim))


@pytest.mark.parametrize("conventions", ["paper", "authors"])
@pytest.mark.parametrize("method", ["linucb", "club", "sclub"])
def test_same_arms_and_partition_as_the_reference(env: ClusteredLinearEnv, method: str, conventions: str) -> None:
    batch = env.interactions(0, T)
    p = LocalClustering(env.num_clients, env.dim, env.replicates, seed=1, method=method, alpha=ALPHAS[method],
                        conventions=conventions)
    arms = torch.cat([p.run(batch.clients[:, a:b], batch.contexts[:, a:b], batch.rewards[:, a:b])
                      for a, b in ((0, 1), (1, 200), (200, 777), (777, T))], 1)
    if conventions == "paper":
        lam, bonus, beta = 1.0, "sqrt", paper_beta(0.5, 0.1, 4, env.num_servers, env.dim, 1.0)
    else:
        lam, bonus, beta = 2.0, "squared", authors_beta(method, env.dim)
    for r in range(env.replicates):
        ref = RefBaseline(method, env.servers, env.dim, lam, beta, bonus=bonus, alpha=ALPHAS[method], alpha_p=1.0)
        want = ref.run(batch.clients[r].numpy(), batch.contexts[r].numpy(), batch.rewards[r].numpy())
        assert np.array_equal(arms[r].numpy(), want), np.flatnonzero(arms[r].numpy() != want)[:5]
        assert np.array_equal(p.partition(r), ref.partition())
    assert int(p.ledger.totals()["comm_messages"].sum()) == 0  # no server talks to another


@pytest.mark.parametrize("method", ["club", "sclub"])
def test_clusters_never_span_servers(env: ClusteredLinearEnv, method: str) -> None:
    batch = env.interactions(0, 600)
    p = LocalClustering(env.num_clients, env.dim, env.replicates, method=method, alpha=ALPHAS[method])
    for a in range(0, 600, 100):
        p.run(batch.clients[:, a:a + 100], batch.contexts[:, a:a + 100], batch.rewards[:, a:a + 100])
        for r in range(env.replicates):
            label = p.partition(r)
            assert np.array_equal(env.servers[label], env.servers)  # a cluster's slot is on its users' server
            assert np.all(label <= np.arange(env.num_clients))  # slot = smallest member


@pytest.mark.parametrize("method", ["linucb", "club", "sclub"])
def test_resume_from_the_state_dict_equals_the_uninterrupted_run(env: ClusteredLinearEnv, method: str) -> None:
    batch = env.interactions(0, 900)
    full = LocalClustering(env.num_clients, env.dim, env.replicates, method=method)
    want = full.run(batch.clients, batch.contexts, batch.rewards)
    first = LocalClustering(env.num_clients, env.dim, env.replicates, method=method)
    head = first.run(batch.clients[:, :333], batch.contexts[:, :333], batch.rewards[:, :333])
    again = LocalClustering(env.num_clients, env.dim, env.replicates, method=method)
    again.load_state_dict(copy.deepcopy(first.state_dict()))
    tail = again.run(batch.clients[:, 333:], batch.contexts[:, 333:], batch.rewards[:, 333:])
    assert torch.equal(torch.cat([head, tail], 1), want)


@pytest.mark.parametrize(("kw", "field"), [
    (dict(method="dbscan"), "method"),
    (dict(num_servers=3), "num_servers"),
    (dict(num_servers=50), "num_servers"),
    (dict(alpha=0.0), "alpha"),
    (dict(alpha_p=-1.0), "alpha_p"),
    (dict(conventions="mine"), "conventions"),
    (dict(bonus="cubic"), "bonus"),
    (dict(lam=0.0), "lam"),
    (dict(failure=1.5), "failure"),
])
def test_bad_inputs_name_the_field(kw: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        LocalClustering(40, 10, **kw)

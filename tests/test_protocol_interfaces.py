"""Engine v3: protocols declare their backends and whether they honour a payload-transforming channel, the base
refuses what they do not declare (an error naming the field, never a silent fallback), kernels take named
structures whose fields are checked where they are built, and tasks depend on the family interfaces only."""
from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np
import pytest
import torch

from fedrec.bandits import LinTS
from fedrec.envs.mab import MultiAgentMAB
from fedrec.envs.synthetic import LinearEnv
from fedrec.errors import ConfigError
from fedrec.federation import Channel
from fedrec.federation.topology import ring
from fedrec.protocols import (
    AsyncLinUCB,
    AsyncLinUCBAM,
    CentralizedLinUCB,
    FederatedClustering,
    GossipUCB,
    LocalClustering,
    MultiAgentProtocol,
    SyncLinUCB,
    VerticalLinearBandit,
)
from fedrec.tasks.multi_agent import MultiAgentTask
from fedrec.utils.jit import F64, I64, build


class Doubling(Channel):
    """A channel that transforms payloads (doubles them)."""

    def deliver(self, kind, payload, sender, receiver):
        return None if payload is None else 2 * payload


def batch(num_clients=10, dim=3, steps=20, replicates=1):
    return LinearEnv(num_clients, dim, num_arms=4, replicates=replicates, seed=3).interactions(0, steps)


# ------------------------------------------------------------------------------------------- backends
@pytest.mark.parametrize("make, backend", [
    (lambda b: FederatedClustering(10, 3, num_servers=2, backend=b), "torch"),
    (lambda b: LocalClustering(10, 3, method="club", num_servers=2, backend=b), "torch"),
    (lambda b: AsyncLinUCBAM(10, 3, backend=b), "compiled"),
])
def test_a_backend_the_protocol_lacks_is_refused_by_name(make, backend):
    with pytest.raises(ConfigError, match=rf"^protocol\.backend={backend}: \w+ runs on \['\w+'\] only$"):
        make(backend)
    make("auto")  # auto picks the one it has


@pytest.mark.parametrize("cls", [AsyncLinUCB, SyncLinUCB, CentralizedLinUCB, VerticalLinearBandit])
def test_protocols_with_both_backends_accept_both(cls):
    for backend in ("compiled", "torch"):
        assert cls(10, 6, backend=backend).backend == backend


def test_declared_capabilities():
    assert FederatedClustering.backends == LocalClustering.backends == ("compiled",)
    assert AsyncLinUCBAM.backends == ("torch",)
    assert not FederatedClustering.honours_channel and not LocalClustering.honours_channel
    assert not GossipUCB.honours_channel
    assert AsyncLinUCB.honours_channel and SyncLinUCB.honours_channel and VerticalLinearBandit.honours_channel


def test_a_policy_the_kernels_lack_is_refused_under_compiled_and_played_by_torch_under_auto():
    symmetric = functools.partial(LinTS, v=0.1, sampler="symmetric")
    it = batch()
    strict = CentralizedLinUCB(10, 3, policy=symmetric, backend="compiled")
    with pytest.raises(ConfigError, match=r"^protocol\.backend=compiled: .*sampler='symmetric'.*use backend=torch$"):
        strict.run(it.clients, it.contexts, it.rewards)
    auto, torch_path = (CentralizedLinUCB(10, 3, policy=symmetric, backend=b) for b in ("auto", "torch"))
    assert not auto.use_compiled()
    assert torch.equal(auto.run(it.clients, it.contexts, it.rewards),
                       torch_path.run(it.clients, it.contexts, it.rewards))


# -------------------------------------------------------------------------------------------- channels
def test_a_transforming_channel_is_refused_where_the_kernel_bypasses_it():
    it = batch()
    for p in (FederatedClustering(10, 3, num_servers=2), LocalClustering(10, 3, method="club", num_servers=2)):
        p.channel = Doubling(1, {"server": 2, "global": 1})
        with pytest.raises(ConfigError, match=r"^channel: Doubling transforms payloads, but \w+ counts"):
            p.run(it.clients, it.contexts, it.rewards)
    g = GossipUCB(ring(4), 3, horizon=10)
    g.channel = Doubling(1, {"client": 4})
    with pytest.raises(ConfigError, match=r"^channel: Doubling .* GossipUCB counts"):
        g.play(MultiAgentMAB(4, 3), 2)


@pytest.mark.parametrize("backend", ["compiled", "torch"])
def test_a_transforming_channel_reaches_the_payloads_where_it_is_honoured(backend):
    it = batch(steps=1)  # γ_U = 1: the first step uploads its buffer
    plain, doubled = (AsyncLinUCB(10, 3, gamma_u=1.0, gamma_d=1.0, backend=backend) for _ in range(2))
    doubled.channel = Doubling(1, {"client": 10, "server": 1})
    plain.run(it.clients, it.contexts, it.rewards)
    doubled.run(it.clients, it.contexts, it.rewards)
    assert plain.server_count.item() == doubled.server_count.item() == 1  # counts are not payloads
    assert plain.server.abs().sum() > 0 and torch.equal(doubled.server, 2 * plain.server)


# ------------------------------------------------------------------------------------ kernel structures
class Pair(NamedTuple):
    values: F64[2]
    counts: I64[1]
    scale: float
    on: bool


def test_a_structure_is_built_by_name_and_checked_field_by_field():
    src = {"values": torch.zeros(2, 3, dtype=torch.float64), "counts": np.zeros(2, dtype=np.int64), "scale": 2,
           "on": True}
    built = build(Pair, src)
    assert np.shares_memory(built.values, src["values"].numpy())  # a view, not a copy
    assert isinstance(built.scale, float) and built.scale == 2.0
    with pytest.raises(TypeError, match=r"^Pair\.counts: dict has no field 'counts'$"):
        build(Pair, {k: v for k, v in src.items() if k != "counts"})
    with pytest.raises(TypeError, match=r"^Pair\.values: expected a float64 array of 2 dimension\(s\), got int64"):
        build(Pair, {**src, "values": np.zeros((2, 3), dtype=np.int64)})
    with pytest.raises(TypeError, match=r"^Pair\.values: expected a float64 array of 2 dimension\(s\), got float64 "
                                        r"array of 1"):
        build(Pair, {**src, "values": np.zeros(3)})
    with pytest.raises(TypeError, match=r"^Pair\.on: expected bool, got int 1$"):
        build(Pair, {**src, "on": 1})
    with pytest.raises(TypeError, match=r"^Pair\.scale: expected float, got str 'x'$"):
        build(Pair, src, scale="x")
    with pytest.raises(TypeError, match=r"Pair has no field\(s\) \['extra'\]"):
        build(Pair, src, extra=1)


def test_a_protocols_kernel_structures_are_views_of_its_buffers():
    p = AsyncLinUCB(10, 3, replicates=2)
    v = p.kernel_views()
    assert np.shares_memory(v["state"].server, p.server.numpy())
    assert np.shares_memory(v["rows"].G, p.policy.G.numpy())
    assert v["settings"].log_gamma_u == p.log_gamma_u and v["params"].lam == p.lam
    p.double()  # buffers replaced: the views are rebuilt
    assert np.shares_memory(p.kernel_views()["state"].server, p.server.numpy())


# ----------------------------------------------------------------------------- the multi-agent interface
class RoundRobin(MultiAgentProtocol):
    """A protocol written against the interface alone: agent i pulls arm (t + i) mod M; no communication."""

    backends = ("torch",)

    def __init__(self, topology, num_arms, horizon, replicates=1, seed=0, backend="auto"):
        super().__init__(topology, num_arms, horizon, replicates, seed, backend)
        self.register_buffer("regret", torch.zeros(replicates, topology.num_agents, dtype=torch.float64))

    def _play(self, env, steps, arms):
        means = torch.from_numpy(np.ascontiguousarray(env.global_means))
        for _ in range(steps):
            t = int(self.t) + 1
            a = (t + torch.arange(self.num_agents)) % self.num_arms
            self.regret += (means.amax(1, keepdim=True) - means[:, a])
            self.t += 1

    def cumulative_regret(self):
        return self.regret

    def epsilon_spent(self):
        return torch.zeros(self.replicates, self.num_agents, dtype=torch.float64)


def test_the_multi_agent_task_runs_any_protocol_of_the_interface():
    env = MultiAgentMAB(4, 3, replicates=2, seed=1)
    task = MultiAgentTask(env, RoundRobin(ring(4), 3, horizon=9, replicates=2), steps=9, steps_per_round=4)
    for r in range(task.num_rounds):
        task.run_round(r)
    means = env.global_means
    gap = means.max(1, keepdims=True) - means  # each agent pulls every arm 3 times in 9 rounds
    summary = task.summary()
    assert summary["steps"] == 9 and summary["lambda2"] == ring(4).lambda2
    assert summary["cumulative_regret_per_replicate"] == pytest.approx((3 * gap.sum(1)).tolist(), rel=1e-12)
    assert summary["epsilon_spent"] == 0.0

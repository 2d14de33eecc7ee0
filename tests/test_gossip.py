"""Gossip_UCB and Fed_UCB (gossip spec §6): structural identities every round, the lemmas, the dyadic noise cache,
both backends, resume, behaviour on a small heterogeneous case and bad input; our local and central UCB baselines.

Kernels compile once per signature (cached on disk): every protocol here uses the serial variant (R = 1) or the
parallel one (R > 1), with all flags as runtime arguments.
"""
from __future__ import annotations

import math

import networkx as nx
import numpy as np
import pytest
import torch
from scipy import stats

from fedrec.envs.mab import MultiAgentMAB
from fedrec.errors import ConfigError
from fedrec.federation.ledger import KINDS
from fedrec.federation.topology import Topology, complete, gossip_matrix, path, ring
from fedrec.privacy import TreeLaplace
from fedrec.privacy.tree import dyadic_cover
from fedrec.protocols.gossip import CentralUCB, FedUCB, GossipBandit, GossipUCB, LocalUCB

BACKENDS = ("compiled", "torch")
STATE = ("n", "ntil", "x0", "sums", "xbar", "theta", "noise_last", "noise_prev", "noise_node", "noise_value", "regret",
         "t")
PEER = KINDS.index("peer")

#: agent 0's local best arm (0) differs from the global best (1): μ_k = (0.4, 0.667, 0.2)
HETERO = np.array([[0.9, 0.5, 0.1], [0.1, 0.7, 0.2], [0.2, 0.8, 0.3]])


def trajectory(p: FedUCB, env: MultiAgentMAB, steps: int) -> list[dict[str, torch.Tensor]]:
    """The state before round 1 (after the time-0 pulls are known) and after every round, one round per call."""
    out = []
    for _ in range(steps):
        before = {k: getattr(p, k).clone() for k in STATE}
        before["peer_sent"] = p.ledger.per_endpoint("client", "peer").clone()
        arms = p.play(env, 1, return_arms=True)[:, 0]
        if not out:  # the first call also played time 0: rebuild that state
            before.update(n=torch.ones_like(p.n), ntil=torch.ones_like(p.n), x0=p.x0.clone(), xbar=p.x0.clone(),
                          theta=p.x0.clone())
        before["arms"] = arms
        out.append(before)
    final = {k: getattr(p, k).clone() for k in STATE}
    final["peer_sent"] = p.ledger.per_endpoint("client", "peer").clone()
    out.append(final)
    return out


def states_equal(a: torch.nn.Module, b: torch.nn.Module, atol: float = 0.0) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        if sa[k].dtype.is_floating_point:
            torch.testing.assert_close(sa[k], sb[k], atol=atol, rtol=0, msg=k)
        else:
            assert torch.equal(sa[k], sb[k]), k


# ------------------------------------------------------------------------------------------- structure per round
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("epsilon", [math.inf, 2.0])
def test_mean_preservation_and_matrix_form(backend: str, epsilon: float) -> None:
    """§6.3 mean_i ϑ = mean_i X̃ every round; eq. 9/13 ϑ(t) = W(t) ϑ(t−1) + X̃(t) − X̃(t−1) with the ledger's edge."""
    top = ring(5)
    env = MultiAgentMAB(5, 4, replicates=2, seed=1)
    p = FedUCB(top, 4, 64, replicates=2, seed=2, privacy=TreeLaplace(epsilon), backend=backend)
    traj = trajectory(p, env, 60)
    for prev, cur in zip(traj[:-1], traj[1:]):
        torch.testing.assert_close(cur["theta"].mean(1), cur["xbar"].mean(1), atol=1e-12, rtol=0)
        for r in range(2):
            sent = (cur["peer_sent"] - prev["peer_sent"])[r]
            u, v = torch.nonzero(sent).flatten().tolist()
            assert sent[u] == sent[v] == 1
            w = torch.from_numpy(gossip_matrix(5, u, v))
            expect = w @ prev["theta"][r] + cur["xbar"][r] - prev["xbar"][r]
            torch.testing.assert_close(cur["theta"][r], expect, atol=1e-12, rtol=0)


def test_bookkeeping_and_consistency_rule() -> None:
    """§6.8 Σ_k n = M + t and X̃ = exact sample mean incl. X(0) at ε = ∞; §6.9 the arm lies in A_i when A_i ≠ ∅,
    else it maximises ϑ + C (pre-pull n, ln t)."""
    N, M = 4, 3
    env = MultiAgentMAB(N, M, replicates=2, seed=5)
    p = GossipUCB(path(N), M, 120, replicates=2, seed=6)
    traj = trajectory(p, env, 120)
    rewards = [[[[env.reward(r, i, k, 0)] for k in range(M)] for i in range(N)] for r in range(2)]
    for t, (prev, cur) in enumerate(zip(traj[:-1], traj[1:]), start=1):
        a = prev["arms"]
        assert torch.equal(cur["n"].sum(-1), torch.full((2, N), M + t))
        lagging = prev["n"] < prev["ntil"] - N
        q = prev["theta"] + p.width(prev["n"], t)
        for r in range(2):
            for i in range(N):
                k = int(a[r, i])
                rewards[r][i][k].append(env.reward(r, i, k, t))
                if lagging[r, i].any():
                    assert lagging[r, i, k]
                else:
                    assert q[r, i, k] == q[r, i].max()
    exact = torch.tensor([[[np.mean(x) for x in row] for row in rep] for rep in rewards])
    torch.testing.assert_close(traj[-1]["xbar"], exact, atol=1e-12, rtol=0)


def test_lemma1_count_propagation() -> None:
    """§6.5 ñ_{i,k}(t+1) = max_j n_{j,k}(t − d_{j,i}) (n_j(s) the pre-pull count of round s, n(0) = 1, 0 before),
    ñ non-decreasing and between the own pre-pull count and the global maximum."""
    N, M, T = 6, 3, 80
    top = path(N)
    dist = dict(nx.all_pairs_shortest_path_length(top.graph))
    env = MultiAgentMAB(N, M, replicates=2, seed=7)
    traj = trajectory(GossipUCB(top, M, T, replicates=2, seed=8), env, T)
    counts = [s["n"] for s in traj]  # counts[s] = after round s = pre-pull count of round s + 1

    def pre_pull(s: int) -> torch.Tensor:
        return counts[max(s - 1, 0)] if s >= 0 else torch.zeros_like(counts[0])

    for t in range(1, T + 1):
        ntil = traj[t]["ntil"]  # ñ(t+1)
        for i in range(N):
            expect = torch.stack([pre_pull(t - dist[j][i])[:, j] for j in range(N)]).amax(0)
            assert torch.equal(ntil[:, i], expect)
        assert (ntil >= traj[t - 1]["ntil"]).all()
        assert (ntil >= pre_pull(t)).all() and (ntil <= pre_pull(t).amax(1, keepdim=True)).all()


@pytest.mark.parametrize("epsilon", [math.inf, 1.0])
def test_lemmas_2_and_3(epsilon: float) -> None:
    """§6.6 n_{i,k}(t) > ñ_{i,k}(t+1) − 3MN and §6.7 max_j n_{j,k}(t) <= 2 n_{i,k}(t) once n_{i,k}(t) >= (3M+1)N,
    on random runs (pre-pull counts)."""
    for top, M in ((complete(3), 5), (ring(6), 3)):
        N = top.num_agents
        env = MultiAgentMAB(N, M, replicates=4, seed=N)
        traj = trajectory(FedUCB(top, M, 400, replicates=4, seed=9, privacy=TreeLaplace(epsilon)), env, 400)
        seen = False
        for prev, cur in zip(traj[:-1], traj[1:]):
            n = prev["n"]
            assert (n > cur["ntil"] - 3 * M * N).all()
            big = n >= (3 * M + 1) * N
            seen |= bool(big.any())
            assert (n.amax(1, keepdim=True).expand_as(n)[big] <= 2 * n[big]).all()
        assert seen


# ------------------------------------------------------------------------------------------------ privacy noise
@pytest.mark.parametrize("noise_empty", [False, True])
def test_dyadic_cover_noise_identity(noise_empty: bool) -> None:
    """§6.10–11 the noisy numerator is X(0) + S(t) + Σ of the node noises of t's dyadic cover (non-empty nodes
    only, unless flagged), recomputed from the pull times; at most popcount(t) terms; cached noise is the node's."""
    N, M, T = 3, 3, 100
    env = MultiAgentMAB(N, M, replicates=2, seed=3)
    p = FedUCB(complete(N), M, T, replicates=2, seed=4, privacy=TreeLaplace(1.0, noise_empty_intervals=noise_empty),
               backend="compiled")
    traj = trajectory(p, env, T)
    pulls: dict[tuple[int, int, int], list[int]] = {}
    for t, (prev, cur) in enumerate(zip(traj[:-1], traj[1:]), start=1):
        for r in range(2):
            for i in range(N):
                k = int(prev["arms"][r, i])
                times = pulls.setdefault((r, i, k), [])
                times.append(t)
                nodes = [nd for nd in dyadic_cover(t)
                         if noise_empty or any(nd.start < s <= nd.end for s in times)]
                assert len(nodes) <= bin(t).count("1")
                noise = sum(float(p.node_noise(r, i, k, nd.level, nd.index)[0]) for nd in nodes)
                numerator = float(cur["xbar"][r, i, k] * cur["n"][r, i, k])
                clean = float(cur["x0"][r, i, k] + cur["sums"][r, i, k])
                assert numerator == pytest.approx(clean + noise, abs=1e-9)
                for nd in nodes:  # the cache holds the node's own noise
                    assert int(cur["noise_node"][r, i, k, nd.level]) == nd.index
                    assert float(cur["noise_value"][r, i, k, nd.level]) == float(
                        p.node_noise(r, i, k, nd.level, nd.index)[0])


def test_laplace_scale_and_accounting() -> None:
    """§6.11 node noise is Laplace with b = ⌈log₂ T⌉/ε (variance 2b²); ε spent from the basic-composition tree
    accountant; the "levels" split spends at most ε."""
    T, eps = 1000, 2.0
    p = FedUCB(complete(3), 4, T, seed=1, privacy=TreeLaplace(eps))
    b = math.ceil(math.log2(T)) / eps
    assert p.scale == pytest.approx(b)
    m = np.arange(1, 100_001)
    z = p.node_noise(m % 3, (m // 3) % 3, m % 4, m % 7, m)
    assert z.var() == pytest.approx(2 * b * b, rel=0.03)
    assert stats.kstest(z, stats.laplace(scale=b).cdf).pvalue > 1e-3
    assert p.levels == 10 and torch.allclose(p.epsilon_spent(), torch.full((1, 3), eps, dtype=torch.float64))
    assert FedUCB(complete(3), 4, 1024, privacy=TreeLaplace(eps)).epsilon_spent()[0, 0] > eps  # paper split at 2^10
    assert FedUCB(complete(3), 4, 1024, privacy=TreeLaplace(eps, "levels")).epsilon_spent()[0, 0] <= eps
    assert math.isinf(GossipUCB(complete(3), 4, T).epsilon_spent()[0, 0])


def test_width_formula() -> None:
    """§6.13 C̃ − α₁ = sqrt(2N (128 N log²T log t log n/(n²ε²) + 1/n) log t); C̃ >= C, non-increasing in ε, = C at
    n = 1; ε = ∞ gives eq. 11."""
    N, T, t = 3, 10**6, 5000
    n = torch.arange(1, 3000)
    gossip = GossipUCB(complete(N), 2, T)
    c = gossip.width(n, t)
    torch.testing.assert_close(c, gossip.alpha1 + torch.sqrt(2 * N * math.log(t) / n.double()), rtol=1e-14, atol=0)
    assert gossip.alpha1 == 64 / 3**17
    prev = None
    for eps in (0.5, 1.0, 2.0, 5.0, math.inf):
        fed = FedUCB(complete(N), 2, T, privacy=TreeLaplace(eps))
        ct = fed.width(n, t)
        nd = n.double()
        expect = torch.sqrt(2 * N * (128 * N * math.log(T) ** 2 * math.log(t) * torch.log(nd) / (nd**2 * eps**2)
                                     + 1 / nd) * math.log(t))
        torch.testing.assert_close(ct - fed.alpha1, expect, rtol=1e-12, atol=0)
        assert (ct >= c).all() and ct[0] == c[0]
        if prev is not None:
            assert (ct <= prev).all()
        prev = ct
    torch.testing.assert_close(prev, c, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------ backends and resume
def test_fed_ucb_at_infinity_is_gossip_ucb() -> None:
    """§6.12 the same seed gives the same trajectory (arms, ϑ, n, everything)."""
    env = MultiAgentMAB(10, 6, replicates=3, seed=2)
    g = GossipUCB(ring(10), 6, 500, replicates=3, seed=11)
    f = FedUCB(ring(10), 6, 500, replicates=3, seed=11, privacy=TreeLaplace(math.inf))
    assert torch.equal(g.play(env, 500, return_arms=True), f.play(env, 500, return_arms=True))
    states_equal(g, f)


@pytest.mark.parametrize("flags", [
    dict(privacy=TreeLaplace(math.inf)),
    dict(privacy=TreeLaplace(1.5)),
    dict(privacy=TreeLaplace(0.7, noise_empty_intervals=True), consistency_fresh=True),
    dict(privacy=TreeLaplace(3.0, laplace_split="levels"), privacy_log2=True),
])
@pytest.mark.parametrize("replicates", [1, 3])
def test_compiled_equals_torch(flags: dict, replicates: int) -> None:
    """Decisions and ledgers equal, states to 1e-10, over the flag matrix (serial and parallel kernels)."""
    env = MultiAgentMAB(4, 5, replicates=replicates, seed=4)
    ps = [FedUCB(path(4), 5, 300, replicates=replicates, seed=5, backend=b, **flags) for b in BACKENDS]
    arms = [torch.cat([p.play(env, s, return_arms=True) for s in (1, 130, 169)], 1) for p in ps]
    assert torch.equal(*arms)
    states_equal(*ps, atol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_resume_equals_uninterrupted(backend: str) -> None:
    """A state_dict taken mid-run and loaded into a fresh protocol continues bit for bit (also across backends)."""
    env = MultiAgentMAB(3, 4, replicates=2, seed=8)
    kw = dict(replicates=2, seed=3, privacy=TreeLaplace(1.0))
    whole = FedUCB(complete(3), 4, 256, backend=backend, **kw)
    whole.play(env, 200)
    half = FedUCB(complete(3), 4, 256, backend=backend, **kw)
    half.play(env, 77)
    for other in BACKENDS:
        resumed = FedUCB(complete(3), 4, 256, backend=other, **kw)
        resumed.load_state_dict(half.state_dict())
        resumed.play(env, 123)
        states_equal(whole, resumed, atol=0.0 if other == backend else 1e-10)


def test_kernel_structures_are_views_of_the_buffers() -> None:
    """The kernel takes the protocol's buffers, settings and ledger and the environment's reward source as named
    structures of zero-copy views, so the kernel's in-place writes are the protocol's."""
    env = MultiAgentMAB(4, 3, replicates=2, seed=1)
    p = FedUCB(ring(4), 3, 50, replicates=2, privacy=TreeLaplace(1.0, noise_empty_intervals=True))
    v = p.kernel_views()
    assert np.shares_memory(v["state"].theta, p.theta.numpy())
    assert np.shares_memory(v["state"].noise_value, p.noise_value.numpy()) and v["state"].noise_value.ndim == 3
    assert np.shares_memory(v["traffic"].client, p.ledger.traffic("client").numpy())
    assert np.shares_memory(v["graph"].edges, p.topology.edges)
    assert v["settings"].scale == p.scale > 0 and v["settings"].noise_empty_intervals
    assert np.shares_memory(env.reward_source().means, env.means)


def _rename_buffer(p: GossipBandit, name: str) -> None:
    p.register_buffer(name + "_", p._buffers.pop(name))


def _rename_attribute(obj: object, name: str) -> None:
    value = getattr(obj, name)
    object.__delattr__(obj, name)  # Topology is a frozen dataclass
    object.__setattr__(obj, name + "_", value)


#: (how the protocol or environment is broken, the error naming the structure's field) for each gossip structure
BROKEN = {
    "Graph renamed": (lambda p, env: _rename_attribute(p.topology, "edges"),
                      r"^Graph\.edges: Topology has no field 'edges'$"),
    "Graph retyped": (lambda p, env: object.__setattr__(p.topology, "indptr", p.topology.indptr.astype(np.int32)),
                      r"^Graph\.indptr: expected a int64 array of 1 dimension\(s\), got int32"),
    "GossipSettings renamed": (lambda p, env: _rename_attribute(p, "alpha1"),
                               r"^GossipSettings\.alpha1: FedUCB has no field 'alpha1'$"),
    "GossipSettings retyped": (lambda p, env: setattr(p, "consistency_fresh", 1),
                               r"^GossipSettings\.consistency_fresh: expected bool, got int 1$"),
    "GossipState renamed": (lambda p, env: _rename_buffer(p, "ntil"),
                            r"^GossipState\.ntil: FedUCB has no field 'ntil'$"),
    "GossipState retyped": (lambda p, env: setattr(p, "n", p.n.double()),
                            r"^GossipState\.n: expected a int64 array of 3 dimension\(s\), got float64"),
    "PeerTraffic retyped": (lambda p, env: setattr(p.ledger, "traffic_client", p.ledger.traffic_client.int()),
                            r"^PeerTraffic\.client: expected a int64 array of 5 dimension\(s\), got int32"),
    "RewardSource renamed": (lambda p, env: _rename_attribute(env, "noise_std"),
                             r"^RewardSource\.noise_std: MultiAgentMAB has no field 'noise_std'$"),
    "RewardSource retyped": (lambda p, env: setattr(env, "pool_ptr", env.pool_ptr.astype(np.int32)),
                             r"^RewardSource\.pool_ptr: expected a int64 array of 1 dimension\(s\), got int32"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_field_of_a_kernel_structure_fails_where_it_is_built(case: str) -> None:
    """Each structure the gossip kernel takes is built by field name and checked: a field missing under its name or
    of the wrong type stops the call with an error naming the field, before any round is played. (``Rounds`` is
    made by the call itself from its arguments, as ``Steps`` is for the star protocols.)"""
    env = MultiAgentMAB(4, 3, seed=1)
    p = FedUCB(ring(4), 3, 50, privacy=TreeLaplace(1.0), backend="compiled")
    breaks, message = BROKEN[case]
    breaks(p, env)
    with pytest.raises(TypeError, match=message):
        p.play(env, 1)
    assert int(p.t) == 0 and int(p.ledger.traffic("client").sum()) == 0


# ----------------------------------------------------------------------------------------------------- behaviour
def test_consensus_and_global_best_under_heterogeneity() -> None:
    """§6.14–15 ϑ agrees across agents and approaches the global means; every agent, including the one whose local
    best differs, ends up pulling the global best arm."""
    env = MultiAgentMAB(3, 3, replicates=4, seed=0, means=HETERO, noise_std=0.5)
    assert env.best_arm[0] == 1 and env.local_best[0, 0] == 0
    p = GossipUCB(complete(3), 3, 20_000, replicates=4, seed=1)
    p.play(env, 10_000)
    before = p.n.clone()
    p.play(env, 10_000)
    share = (p.n - before)[..., 1].double() / 10_000
    assert (share > 0.9).all()
    spread = p.theta.amax(1) - p.theta.amin(1)
    assert (spread[..., 1] < 0.05).all()
    assert (p.theta[..., 1] - env.global_means[0, 1]).abs().max() < 0.1
    assert (p.regret[:, :] / 20_000 < 0.05).all()


def test_no_starvation_with_privacy() -> None:
    """§6.19 with the un-noised X(0) every arm is pulled again (no arm stays at n = 1), even at small ε."""
    env = MultiAgentMAB(3, 3, replicates=4, seed=0, means=HETERO)
    p = FedUCB(complete(3), 3, 20_000, replicates=4, seed=2, privacy=TreeLaplace(1.0))
    p.play(env, 20_000)
    assert (p.n >= 2).all()


def test_privacy_ordering() -> None:
    """§6.17 mean regret R(ε=1) > R(ε=2) > R(ε=5) > R(ε=∞) at every checkpoint of a small heterogeneous case."""
    env = MultiAgentMAB(3, 3, replicates=8, seed=1, means=HETERO)
    ps = [FedUCB(complete(3), 3, 20_000, replicates=8, seed=2, privacy=TreeLaplace(eps))
          for eps in (1.0, 2.0, 5.0, math.inf)]
    for _ in range(4):
        regrets = []
        for p in ps:
            p.play(env, 5_000)
            regrets.append(float(p.regret.mean()))
        assert regrets == sorted(regrets, reverse=True) and len(set(regrets)) == 4


def test_ledger_counts_two_peer_messages_per_round() -> None:
    env = MultiAgentMAB(5, 7, replicates=3, seed=0)
    for backend in BACKENDS:
        p = GossipUCB(ring(5), 7, 100, replicates=3, backend=backend)
        p.play(env, 100)
        tot = p.ledger.totals()
        assert torch.equal(tot["comm_peer_messages"], torch.full((3,), 200))
        assert torch.equal(tot["comm_peer_scalars"], torch.full((3,), 200 * 7))
        assert torch.equal(tot["comm_messages"], tot["comm_peer_messages"])
        received = p.ledger.per_endpoint("client", "peer", side="received")
        assert torch.equal(received.sum(1), torch.full((3,), 200))


# ------------------------------------------------------------------------------------------------------ bad input
def test_bad_input_names_the_field() -> None:
    with pytest.raises(ConfigError, match="topology.num_agents"):
        GossipUCB(Topology("edge_list", 1, np.zeros((0, 2))), 3, 10)
    with pytest.raises(ConfigError, match="topology.edges"):
        GossipUCB(Topology("edge_list", 4, np.array([[0, 1], [2, 3]])), 3, 10)
    with pytest.raises(ConfigError, match="num_arms"):
        GossipUCB(complete(3), 0, 10)
    with pytest.raises(ConfigError, match="horizon"):
        GossipUCB(complete(3), 3, 0)
    for eps in (0.0, -1.0, float("nan")):
        with pytest.raises(ConfigError, match="epsilon"):
            FedUCB(complete(3), 3, 10, privacy=TreeLaplace(eps))
    with pytest.raises(ConfigError, match="laplace_split"):
        FedUCB(complete(3), 3, 10, privacy=TreeLaplace(laplace_split="ln"))
    with pytest.raises(ConfigError, match="env.num_arms"):
        GossipUCB(complete(3), 3, 10).play(MultiAgentMAB(3, 4), 1)
    with pytest.raises(ConfigError, match="steps"):
        GossipUCB(complete(3), 3, 10).play(MultiAgentMAB(3, 3), 11)
    with pytest.raises(ConfigError, match="env.means"):
        MultiAgentMAB(3, 3, means=np.zeros((2, 3)))
    with pytest.raises(ConfigError, match="env.num_arms"):
        MultiAgentMAB(3, 0)


# ------------------------------------------------------------------------------- baselines (ours, spec §4.1 [PROP])
@pytest.mark.parametrize("cls", [LocalUCB, CentralUCB])
@pytest.mark.parametrize("replicates", [1, 3])
def test_baselines_compiled_equals_torch(cls: type, replicates: int) -> None:
    """Both baselines: arms and ledgers equal on both backends, states to 1e-10, across resumed calls."""
    env = MultiAgentMAB(4, 5, replicates=replicates, seed=4)
    ps = [cls(path(4), 5, 300, replicates=replicates, seed=5, backend=b) for b in BACKENDS]
    arms = [torch.cat([p.play(env, s, return_arms=True) for s in (1, 130, 169)], 1) for p in ps]
    assert torch.equal(*arms)
    states_equal(*ps, atol=1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_local_ucb_stays_on_local_best(backend: str) -> None:
    """§6.15 contrast: without communication each agent settles on its LOCAL best arm (agent 0: arm 0, while the
    global best is arm 1, which Gossip_UCB finds); ϑ = X̃ throughout (§6.4), ñ never moves, nothing is sent."""
    env = MultiAgentMAB(3, 3, replicates=4, seed=0, means=HETERO, noise_std=0.5)
    p = LocalUCB(complete(3), 3, 6_000, replicates=4, seed=1, backend=backend)
    p.play(env, 3_000)
    before = p.n.clone()
    p.play(env, 3_000)
    share = (p.n - before).double() / 3_000
    local = torch.from_numpy(env.local_best)  # (R, N): agent 0 → 0, agents 1, 2 → 1
    assert (share.gather(2, local.unsqueeze(-1)) > 0.9).all() and (local[:, 0] != int(env.best_arm[0])).all()
    torch.testing.assert_close(p.theta, p.xbar, atol=1e-12, rtol=0)
    assert (p.ntil == 1).all()
    assert p.regret[:, 0].min() > 0.2 * 6_000  # agent 0 pays Δ = 0.267 on most rounds
    assert all(int(v.sum()) == 0 for v in p.ledger.totals().values())
    assert (p.epsilon_spent() == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_central_ucb_finds_global_best(backend: str) -> None:
    """Centralised UCB on the global means: all agents pull the learner's arm, which converges to the global best;
    ϑ is the pooled mean of every observation; nothing is sent."""
    env = MultiAgentMAB(3, 3, replicates=4, seed=0, means=HETERO, noise_std=0.5)
    p = CentralUCB(complete(3), 3, 6_000, replicates=4, seed=1, backend=backend)
    arms = p.play(env, 6_000, return_arms=True)
    assert (arms == arms[:, :, :1]).all()
    assert ((arms[:, 3_000:] == int(env.best_arm[0])).double().mean((1, 2)) > 0.95).all()
    pooled = (p.x0 + p.sums).sum(1) / p.n.sum(1).double()
    torch.testing.assert_close(p.theta, pooled.unsqueeze(1).expand_as(p.theta), atol=1e-12, rtol=0)
    assert (p.regret / 6_000 < 0.02).all()
    assert all(int(v.sum()) == 0 for v in p.ledger.totals().values())
    assert torch.isinf(p.epsilon_spent()).all()  # it pools raw rewards: no privacy is claimed


def test_baseline_bad_input() -> None:
    with pytest.raises(ConfigError, match="mode"):
        GossipBandit(complete(3), 3, 10, mode="federated")
    with pytest.raises(ConfigError, match="epsilon"):
        GossipBandit(complete(3), 3, 10, privacy=TreeLaplace(1.0), mode="local")


def test_gossip_ucb_regret_is_sublinear_and_shared_by_the_agents() -> None:
    """Spec §6 test 16 at ε = ∞: R(T)/T falls, R(t)/ln t flattens, the agents' regrets stay close (the
    consistency rule couples them), and every agent's R(T) stays below Theorem 1's bound (spec §3), computed from
    the instance's gaps with L and α₂ of §2.2."""
    N, M, T = 3, 5, 64_000
    env = MultiAgentMAB(N, M, replicates=4, seed=3, noise_std=0.5)
    p = GossipUCB(complete(N), M, T, replicates=4, seed=5)
    checkpoints, regret = [4_000, 16_000, 64_000], []
    for t in checkpoints:
        p.play(env, t - int(p.t))
        regret.append(p.regret.mean(1).clone())
    per_t = [r / t for r, t in zip(regret, checkpoints)]
    assert (per_t[2] < per_t[1]).all() and (per_t[1] < per_t[0]).all()
    per_log = [float((r / math.log(t)).mean()) for r, t in zip(regret, checkpoints)]
    assert per_log[2] - per_log[1] < per_log[1] - per_log[0]  # growth per ln t slows down
    spread = (p.regret.max(1).values - p.regret.min(1).values) / p.regret.mean(1)
    assert (spread < 0.5).all()
    # λ₂ of E[W] from the library's topology, against the closed form for K_N: E[W] = I − L_G/(2|E|) with
    # L_G = N·I − J and |E| = N(N − 1)/2, whose second eigenvalue is 1 − 1/(N − 1) (½ for the paper's triangle)
    lam2, alpha1 = complete(N).lambda2, 64 / N ** 17
    assert lam2 == pytest.approx(1 - 1 / (N - 1), abs=1e-12)
    L = 1 + max(t for t in range(1, 10_000) if lam2 ** (t / 6) / (1 - lam2 ** (1 / 3)) >= 1 / (N * t))
    alpha2 = (3 * M - 1) * N + 2 * math.pi ** 2 / 3 \
        + 2 * lam2 ** (1 / 12) / ((1 - lam2 ** (1 / 3)) * (1 - lam2 ** (1 / 12)))
    for r in range(4):
        gaps = env.global_means[r].max() - env.global_means[r]
        bound = sum(g * (max(2 * N * math.log(T) / (g / 2 - alpha1) ** 2, L, (3 * M + 1) * N) + alpha2)
                    for g in gaps if g > 0)
        assert (p.regret[r] < bound).all(), (p.regret[r], bound)

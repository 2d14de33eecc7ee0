"""The FCLUB reference (tests/reference/fclub.py) against the invariants of spec fclub.md §6 and an independent
pooled LinUCB: the oracle the compiled FCLUB protocols will be tested against must itself be right."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from fedrec.envs.clustered import ClusteredLinearEnv
from tests.reference.fclub import RefFCLUB, dyadic_cover

TOL = 1e-8


@pytest.fixture(scope="module")
def stream(data_dir: Path) -> tuple[ClusteredLinearEnv, np.ndarray, np.ndarray, np.ndarray]:
    env = ClusteredLinearEnv(data_dir=data_dir, seed=2, chunk_size=600)
    batch = env.interactions(0, 600)
    return env, batch.clients[0].numpy(), batch.contexts[0].numpy(), batch.rewards[0].numpy()


def check_conservation(ref: RefFCLUB) -> None:
    """§6 test 2: S^g = S + ΔS⁻ for every member; T^g + Σ ΔT = Σ T_i; S^g + Σ ΔS = the synchronised V (eq. 25)."""
    d = ref.d
    for g in ref.globals:
        for c in g.members:
            assert np.allclose(g.S, c.S + c.dSm, atol=TOL) and np.allclose(g.u, c.u + c.dum, atol=TOL)
            assert math.isclose(g.T, c.T + c.dTm)
        users = sorted(set().union(*(c.users for c in g.members)))
        assert math.isclose(g.T + sum(c.dT for c in g.members), ref.Tu[users].sum())
        if not ref.private:
            full = len(g.members) * ref.lam * np.eye(d) + ref.V[users].sum(0)
            assert np.allclose(g.S + sum(c.dS for c in g.members), full, atol=TOL)


@pytest.mark.parametrize("U", [1.0, 1.01, 1.5])
def test_conservation_holds_after_every_round(stream: tuple, U: float) -> None:
    env, users, items, rewards = stream
    ref = RefFCLUB(env.servers, env.dim, U=U, D=U)
    for t in range(300):
        ref.step(int(users[t]), items[t], rewards[t])
        check_conservation(ref)
    assert ref.phase == 8  # phases start at t = 1, 3, 7, ..., 255 (2^s − 1, §6 test 1)


def test_phase_schedule_runs_detection_at_powers_of_two_minus_one(stream: tuple) -> None:
    env, users, items, rewards = stream
    ref = RefFCLUB(env.servers, env.dim)
    starts = []
    for t in range(1, 200):
        before = ref.phase
        ref.step(int(users[t - 1]), items[t - 1], rewards[t - 1])
        if ref.phase != before:
            starts.append(t)
    assert starts == [2 ** s - 1 for s in range(1, 8)]


def test_synchronous_run_keeps_every_member_equal_to_its_global_cluster(stream: tuple) -> None:
    """§6 test 6: with U = D = 1 every local cluster holds S^g at the end of every round."""
    env, users, items, rewards = stream
    ref = RefFCLUB(env.servers, env.dim, U=1.0, D=1.0)
    for t in range(200):
        ref.step(int(users[t]), items[t], rewards[t])
        for g in ref.globals:
            for c in g.members:
                assert np.allclose(c.S, g.S, atol=TOL) and not c.dSm.any()


def test_homo_is_one_pooled_linucb(stream: tuple) -> None:
    """§6 test 9: Homo (one global cluster, U = D = 1) plays LinUCB on everyone's data with L·λI and L′ = L."""
    env, users, items, rewards = stream
    L, d, lam = env.num_servers, env.dim, 1.0
    ref = RefFCLUB(env.servers, d, U=1.0, D=1.0, pooled=True, lam=lam)
    arms = ref.run(users[:400], items[:400], rewards[:400])
    V, b, n = L * lam * np.eye(d), np.zeros(d), 0
    for t in range(400):
        beta = 0.5 * math.sqrt(2 * math.log(4 * L / 0.1) + d * math.log(1 + n / (d * L * lam))) + math.sqrt(L * lam)
        x = items[t]
        Vinv = np.linalg.inv(V)
        scores = x @ Vinv @ b + beta * np.sqrt(np.einsum("kd,de,ke->k", x, Vinv, x))
        a = int(np.flatnonzero(scores >= scores.max() - 1e-9)[0])
        assert a == arms[t], t
        V += np.outer(x[a], x[a])
        b += rewards[t, a] * x[a]
        n += 1
    assert ref.uploads.sum() > 400 and len(ref.globals) == 1


def test_delayed_communication_never_exceeds_every_round_and_local_clusters_only_split(stream: tuple) -> None:
    """§8.9: at U = D = 1.01 a trigger fires while xᵀS⁻¹x ≳ 0.01, so early on nearly every round uploads; downloads
    already lag, and a larger threshold communicates far less. §6 test 10: edges are only ever deleted."""
    env, users, items, rewards = stream
    runs = {U: RefFCLUB(env.servers, env.dim, U=U, D=U) for U in (1.0, 1.01, 2.0)}
    counts = []
    for t in range(600):
        for ref in runs.values():
            ref.step(int(users[t]), items[t], rewards[t])
        counts.append(len(runs[1.01].locals))
    total = {U: int((ref.uploads + ref.downloads).sum()) for U, ref in runs.items()}
    assert total[2.0] < 0.5 * total[1.0] and total[1.01] < total[1.0], total
    assert (runs[1.01].downloads <= runs[1.0].downloads).all()
    assert all(a <= b for a, b in zip(counts, counts[1:]))


def test_private_run_adds_the_tree_noise_to_the_shared_statistics(stream: tuple) -> None:
    """CDP: the statistics used to recommend carry 2ρI + 3ρcI + the tree noise, not the clean sums (§8.5)."""
    env, users, items, rewards = stream
    ref = RefFCLUB(env.servers, env.dim, epsilon=1.0, delta=0.1, horizon=1000)
    for t in range(100):
        ref.step(int(users[t]), items[t], rewards[t])
        check_conservation(ref)
    c = ref.globals[0].members[0]
    clean = sum(ref.V[i] for i in c.users)
    assert np.abs(c.S - clean).max() > ref.rho  # the shifts and noise are there, at the scale of ρ
    sym = c.pvt.node((0, 1))
    assert np.allclose(sym, sym.T)


def test_dyadic_cover_is_one_node_per_set_bit() -> None:
    for i in range(1, 200):
        nodes = dyadic_cover(i)
        assert len(nodes) == bin(i).count("1")
        assert sum(2 ** level for level, _ in nodes) == i  # disjoint blocks covering [1, i]
        ends = sorted(index << level for level, index in nodes)
        assert ends[-1] == i

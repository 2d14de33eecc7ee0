"""Federated LinUCB protocols against the invariants and equivalences of the Async-LinUCB spec (§8)."""
from __future__ import annotations

import math

import pytest
import torch

from fedrec.bandits import LinUCB
from fedrec.envs.synthetic import LinearEnv
from fedrec.errors import ConfigError
from fedrec.protocols import AsyncLinUCB, AsyncLinUCBAM, CentralizedLinUCB, SyncLinUCB, paper_linucb

LAM = 0.1


def _stream(N=20, d=5, K=10, T=600, seed=0, replicates=1, **kw):
    env = LinearEnv(num_clients=N, dim=d, num_arms=K, replicates=replicates, seed=seed, contexts="sphere", **kw)
    return env, env.interactions(0, T)


def _logdet(V):
    return torch.linalg.slogdet(V + LAM * torch.eye(V.shape[-1], dtype=V.dtype)).logabsdet


def test_gamma_one_preregistered_equals_centralized_linucb_with_N_T_messages():
    N, T = 20, 400
    _, it = _stream(N=N, T=T)
    fed = AsyncLinUCB(N, 5, gamma_u=1.0, gamma_d=1.0, policy=paper_linucb(lam=LAM), preregister=True)
    central = CentralizedLinUCB(N, 5, policy=paper_linucb(lam=LAM))
    arms_fed = fed.run(it.clients, it.contexts, it.rewards)
    arms_central = central.run(it.clients, it.contexts, it.rewards)
    assert torch.equal(arms_fed, arms_central)
    totals = fed.ledger.totals()
    assert totals["comm_messages"].item() == N * T  # 1 upload + (N - 1) downloads per step (Table 1)
    assert totals["comm_upload_messages"].item() == T
    # every client holds the global statistics
    assert torch.allclose(fed.policy.G, central.policy.G[0].expand_as(fed.policy.G), atol=1e-9)


def test_gamma_infinite_never_communicates_and_equals_independent_linucbs():
    N, T = 8, 300
    _, it = _stream(N=N, T=T)
    fed = AsyncLinUCB(N, 5, gamma_u=math.inf, gamma_d=math.inf, policy=paper_linucb(lam=LAM))
    arms = fed.run(it.clients, it.contexts, it.rewards)
    assert fed.ledger.totals()["comm_messages"].item() == 0
    solo = [LinUCB(dim=5, alpha=None, lam=LAM, sigma=0.1, delta=0.1) for _ in range(N)]
    for s in range(T):
        c = int(it.clients[0, s])
        assert int(solo[c].play(it.contexts[0, s], it.rewards[0, s])) == int(arms[0, s])


@pytest.mark.parametrize("arrival", ["uniform", "zipf"])
@pytest.mark.parametrize("gamma", [1.5, 3.0])
@pytest.mark.parametrize("to_uploader", [True, False])
def test_async_invariants_hold_at_every_step(arrival, gamma, to_uploader):
    N, d, T = 12, 4, 300
    _, it = _stream(N=N, d=d, T=T, arrival=arrival, seed=7)
    p = AsyncLinUCB(N, d, gamma_u=gamma, gamma_d=gamma, policy=paper_linucb(lam=LAM), check_on_register=True,
                    download_to_uploader=to_uploader)
    total = torch.zeros(d + 1, d + 1, dtype=torch.float64)
    log_g = math.log(gamma)
    for s in range(T):
        c = it.clients[:, s]
        j = int(c)
        V_all, V_i = total[:d, :d].clone(), p.policy.V[j].clone()
        registered_before = bool(p.registered[j])
        arm = p.step(c, it.contexts[:, s], it.rewards[:, s])
        x = it.contexts[0, s, int(arm)]
        z = torch.cat([x, it.rewards[0, s, int(arm)].view(1)])
        total += torch.outer(z, z)
        # 1. conservation: V_g + Σ_j ΔV_j = all data (and the same for b and Σy²)
        assert torch.allclose(p.server[0] + p.buffer.sum(0), total, atol=1e-9)
        reg = p.registered.nonzero().view(-1)
        S = p.policy.G[reg] - p.buffer[reg]  # last synchronised copy S_j = V_j - ΔV_j
        # 2. the server holds everything a client synchronised: ΔV_{-j} = V_g - S_j is PSD, and V_j, V_g ⪯ V_t
        assert torch.linalg.eigvalsh((p.server[0] - S)[:, :d, :d]).min() > -1e-9
        assert torch.linalg.eigvalsh(total[:d, :d] - p.policy.V[reg]).min() > -1e-9
        assert torch.linalg.eigvalsh(total[:d, :d] - p.server[0, :d, :d]).min() > -1e-9
        # cached log det S_j(λ) is right
        assert torch.allclose(p.synced_logdet[reg], _logdet(S[:, :d, :d]), atol=1e-8)
        # 3. threshold invariants after communication (Eq. 10 and Eq. 11)
        assert (_logdet(p.policy.V[reg]) - _logdet(S[:, :d, :d])).max() <= log_g + 1e-8
        assert (_logdet(p.server[0, :d, :d]) - _logdet(S[:, :d, :d])).max() <= log_g + 1e-8
        # 4. deterministic half of Lemma 3.1 for a client that satisfied Eq. (11) before its step
        if registered_before:
            n_reg = len(reg)
            A, B = V_all + LAM * torch.eye(d), V_i + LAM * torch.eye(d)
            bound = gamma * (1 + (n_reg - 1) * (gamma - 1))
            assert x @ A @ x <= bound * (x @ B @ x) * (1 + 1e-9)
            assert x @ torch.linalg.solve(B, x) >= x @ torch.linalg.solve(A, x) * (1 - 1e-9)  # Γ >= 1


def test_communication_obeys_the_per_client_pigeonhole_bounds():
    N, d, T, gamma = 10, 5, 3000, 3.0
    _, it = _stream(N=N, d=d, T=T, seed=3)
    p = AsyncLinUCB(N, d, gamma_u=gamma, gamma_d=gamma, policy=paper_linucb(lam=LAM))
    uploads = torch.zeros(N, dtype=torch.long)
    downloads = torch.zeros(N, dtype=torch.long)
    for s in range(T):
        up0, down0 = p.ledger.totals()["comm_upload_messages"].item(), p.synced_logdet.clone()
        p.step(it.clients[:, s], it.contexts[:, s], it.rewards[:, s])
        if p.ledger.totals()["comm_upload_messages"].item() > up0:
            uploads[int(it.clients[0, s])] += 1
        downloads += (p.synced_logdet != down0).long()
    downloads -= uploads  # an upload also moves the uploader's cached log det; count downloads only
    base = d * math.log(LAM)
    assert (uploads <= (p.policy.logdet - base) / math.log(gamma) + 1e-9).all()
    # downloads to client j are at most log(det V_g(λ)/det λI) / log γ_D
    assert (downloads.clamp_min(0) <= (p.server_logdet[0] - base) / math.log(gamma) + 1 + 1e-9).all()


def test_communication_grows_logarithmically_in_T():
    N, d, gamma = 20, 5, 3.0
    _, it = _stream(N=N, d=d, T=8000, seed=5)
    p = AsyncLinUCB(N, d, gamma_u=gamma, gamma_d=gamma, policy=paper_linucb(lam=LAM))
    counts = {}
    done = 0
    for T in (1000, 2000, 4000, 8000):
        p.run(it.clients[:, done:T], it.contexts[:, done:T], it.rewards[:, done:T])
        done = T
        counts[T] = p.ledger.totals()["comm_messages"].item()
    inc = [counts[2000] - counts[1000], counts[4000] - counts[2000], counts[8000] - counts[4000]]
    # doubling T adds a roughly constant amount (log growth), far less than the doubling of linear growth
    assert inc[2] < 2 * inc[0] and counts[8000] < 4 * counts[2000]
    bound = N * d * math.log(1 + 8000 / (d * LAM)) * 2 / math.log(gamma)
    assert counts[8000] <= bound


def test_windowed_run_equals_step_by_step():
    for proto in (
        lambda: AsyncLinUCB(30, 5, gamma_u=2.0, gamma_d=2.0, policy=paper_linucb(lam=LAM), replicates=2),
        lambda: AsyncLinUCB(30, 5, gamma_u=2.0, gamma_d=2.0, policy=paper_linucb(lam=LAM), replicates=2,
                            check_on_register=True),
        lambda: SyncLinUCB(30, 5, threshold=2.0, policy=paper_linucb(lam=LAM), replicates=2),
        lambda: AsyncLinUCBAM(30, 5, global_dim=3, policy=paper_linucb(lam=LAM), replicates=2, warmup=True),
    ):
        _, it = _stream(N=30, d=5, T=500, replicates=2, seed=11)
        a, b = proto(), proto()
        arms_run = a.run(it.clients, it.contexts, it.rewards)
        arms_step = torch.stack([b.step(it.clients[:, s], it.contexts[:, s], it.rewards[:, s]) for s in range(500)], 1)
        assert torch.equal(arms_run, arms_step)
        assert torch.equal(a.ledger.totals()["comm_messages"], b.ledger.totals()["comm_messages"])
        for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
            assert torch.allclose(x.double(), y.double(), rtol=1e-10, atol=1e-10), name


def test_replicates_are_independent_runs():
    env2, it2 = _stream(N=15, replicates=2, seed=4, T=300)
    batched = AsyncLinUCB(15, 5, gamma_u=2.0, gamma_d=2.0, policy=paper_linucb(lam=LAM), replicates=2)
    arms = batched.run(it2.clients, it2.contexts, it2.rewards)
    for r in range(2):
        single = AsyncLinUCB(15, 5, gamma_u=2.0, gamma_d=2.0, policy=paper_linucb(lam=LAM))
        sl = slice(r, r + 1)
        assert torch.equal(single.run(it2.clients[sl], it2.contexts[sl], it2.rewards[sl])[0], arms[r])
        assert single.ledger.totals()["comm_messages"].item() == batched.ledger.totals()["comm_messages"][r].item()


def test_sync_linucb_accounting_and_identical_state_after_each_round():
    N, d, T = 15, 4, 400
    _, it = _stream(N=N, d=d, T=T, seed=2, arrival="zipf")
    p = SyncLinUCB(N, d, threshold=3.0, policy=paper_linucb(lam=LAM))
    expected = 0
    for s in range(T):
        rounds = p.sync_rounds.item()
        members = p.registered.clone()
        members[int(it.clients[0, s])] = True
        p.step(it.clients[:, s], it.contexts[:, s], it.rewards[:, s])
        if p.sync_rounds.item() > rounds:
            expected += 2 * int(members.sum())
            reg = p.registered.nonzero().view(-1)
            assert torch.equal(p.policy.G[reg], p.server[0].expand(len(reg), -1, -1))
            assert (p.steps_since_sync == 0).all() and (p.buffer == 0).all()
    assert p.sync_rounds.item() > 0
    assert p.ledger.totals()["comm_messages"].item() == expected


def test_am_communicates_only_global_statistics_and_projects():
    N, d, dg = 10, 6, 4
    _, it = _stream(N=N, d=d, T=400, seed=8, global_dim=dg)
    p = AsyncLinUCBAM(N, d, global_dim=dg, gamma_u=1.5, gamma_d=1.5, policy=paper_linucb(lam=LAM))
    p.run(it.clients, it.contexts, it.rewards)
    t = p.ledger.totals()
    assert t["comm_messages"].item() > 0
    assert t["comm_scalars"].item() == t["comm_messages"].item() * (dg * dg + dg)
    assert p.server.shape[-1] == dg + 1 and p.local.G.shape[-1] == d - dg + 1


def test_am_without_local_part_reduces_to_async_linucb():
    _, it = _stream(N=10, d=5, T=400, seed=9)
    am = AsyncLinUCBAM(10, 5, global_dim=5, gamma_u=2.0, gamma_d=2.0, policy=paper_linucb(lam=LAM), noise_pad=0.0)
    plain = AsyncLinUCB(10, 5, gamma_u=2.0, gamma_d=2.0, policy=paper_linucb(lam=LAM))
    assert torch.equal(am.run(it.clients, it.contexts, it.rewards), plain.run(it.clients, it.contexts, it.rewards))
    assert torch.equal(am.ledger.totals()["comm_messages"], plain.ledger.totals()["comm_messages"])


def test_am_warmup_initialises_every_active_client():
    N, d, dg = 6, 5, 3
    _, it = _stream(N=N, d=d, T=600, seed=10, global_dim=dg)
    p = AsyncLinUCBAM(N, d, global_dim=dg, policy=paper_linucb(lam=LAM), warmup=True, gamma_u=2.0, gamma_d=2.0)
    p.run(it.clients, it.contexts, it.rewards)
    assert bool(p.am_ready.all())  # 100 steps per client is plenty for rank 5
    assert p.ledger.totals()["comm_upload_messages"].item() > 0


@pytest.mark.parametrize(
    "factory, field",
    [(lambda: AsyncLinUCB(10, 5, gamma_u=0.5), "gamma_u"), (lambda: AsyncLinUCB(10, 5, gamma_d=-1), "gamma_d"),
     (lambda: AsyncLinUCB(0, 5), "num_clients"), (lambda: AsyncLinUCB(10, 0), "dim"),
     (lambda: AsyncLinUCB(10, 5, policy=paper_linucb(lam=0.0)), "lam"),
     (lambda: SyncLinUCB(10, 5, threshold=-1), "threshold"),
     (lambda: AsyncLinUCBAM(10, 5, global_dim=6), "global_dim"), (lambda: AsyncLinUCBAM(10, 5, warmup=True), "warmup")],
)
def test_invalid_protocol_arguments_name_the_field(factory, field):
    with pytest.raises(ConfigError, match=field):
        factory()


def test_nan_rewards_are_rejected_by_protocols():
    _, it = _stream(N=5, T=3)
    rewards = it.rewards.clone()
    rewards[0, 1] = float("nan")
    with pytest.raises(ValueError, match="finite"):
        AsyncLinUCB(5, 5).run(it.clients, it.contexts, rewards)

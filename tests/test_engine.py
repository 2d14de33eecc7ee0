"""The bandit step engine (issue 8): both backends, the authors'-style reference, AM bookkeeping, resume, channels,
LinTS streams and input checks of :mod:`fedrec.protocols`.

Kernel variants: numba compiles each kernel once per signature; every flag below is a runtime argument, so this
file uses only the serial and the parallel variant of the Async, Sync and rows kernels.

A channel must be installed before a protocol's first run: the compiled path caches numpy views of the ledger's
arrays at first use (replacing the channel later is not supported; the tests never do it).
"""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import Tensor

from fedrec.bandits.linear import outer
from fedrec.errors import ConfigError
from fedrec.federation import Channel
from fedrec.federation.ledger import UNITS
from fedrec.protocols import AsyncLinUCB, AsyncLinUCBAM, CentralizedLinUCB, SyncLinUCB, paper_linucb
from fedrec.protocols.async_linucb_am import project_unit_ball
from tests.helpers import BACKENDS, LAM, assert_same_ledger, lints, stream, ucb
from tests.reference.async_linucb import RefAsyncLinUCB

#: state agreement between the backends (float buffers); integer and bool buffers must agree exactly
ATOL = 1e-10


# ------------------------------------------------------------------------------------------------- helpers


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module, exact: bool = False) -> None:
    """Every entry of the state dicts agrees: float buffers to ATOL (bit for bit if ``exact``), others exactly."""
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        x, y = sa[k], sb[k]
        if not isinstance(x, Tensor):  # extra state (LinTS: its seed)
            assert x == y, k
            continue
        assert x.dtype == y.dtype and x.shape == y.shape, k
        if exact or not x.dtype.is_floating_point:
            assert torch.equal(x, y), k
        else:
            assert torch.allclose(x, y, rtol=0, atol=ATOL), (k, (x - y).abs().max().item())


def snapshot(p) -> dict:
    return copy.deepcopy(p.state_dict())


def assert_state_equals_snapshot(p, snap: dict) -> None:
    now = p.state_dict()
    assert list(now) == list(snap)
    for k, v in snap.items():
        assert torch.equal(now[k], v) if isinstance(v, Tensor) else now[k] == v, k


class IdentityChannel(Channel):
    """Delivers payloads unchanged, but overrides ``deliver``: compiled kernels stop at every message."""

    def deliver(self, kind, payload, sender, receiver):
        return payload


class ZeroUploads(Channel):
    def deliver(self, kind, payload, sender, receiver):
        return torch.zeros_like(payload) if kind == "upload" else payload


class DoubleDownloads(Channel):
    def deliver(self, kind, payload, sender, receiver):
        return 2 * payload if kind == "download" else payload


def with_channel(p, cls):
    p.channel = cls(p.replicates, {"client": p.num_clients, "server": 1})  # before the first run
    return p


# -------------------------------------------------------------------------------- 1. compiled vs torch
# pairwise-style: every flag value appears at least once; the last rows set most flags to non-defaults at once
ASYNC_CASES = [
    dict(gamma=1.0, arrival="uniform", bound="determinant", to_uploader=True, check=False, refresh=True, R=1),
    dict(gamma=1.2, arrival="zipf", bound="count", to_uploader=False, check=True, refresh=False, R=3),
    dict(gamma=2.0, arrival="uniform", bound="count", to_uploader=True, check=True, refresh=False, R=1,
         preregister=True),
    dict(gamma=5.0, arrival="zipf", bound="determinant", to_uploader=False, check=False, refresh=True, R=3),
    dict(gamma=math.inf, arrival="uniform", bound="determinant", to_uploader=False, check=True, refresh=False, R=3),
    dict(gamma=math.inf, arrival="zipf", bound="count", to_uploader=True, check=False, refresh=True, R=1),
    dict(gamma=1.2, arrival="uniform", bound="determinant", to_uploader=True, check=False, refresh=False, R=1),
    dict(gamma=2.0, arrival="zipf", bound="determinant", to_uploader=False, check=False, refresh=False, R=3,
         preregister=True),
    dict(gamma=5.0, arrival="uniform", bound="count", to_uploader=True, check=True, refresh=True, R=3),
    dict(gamma=1.0, arrival="zipf", bound="count", to_uploader=False, check=True, refresh=False, R=3),
    dict(gamma=(1.5, 3.0), arrival="zipf", bound="determinant", to_uploader=False, check=True, refresh=False, R=3),
    # LinTS
    dict(gamma=2.0, arrival="uniform", policy="lints", to_uploader=True, check=True, refresh=True, R=3),
    dict(gamma=1.2, arrival="zipf", policy="lints", to_uploader=False, check=False, refresh=False, R=1),
]


def _case_id(c: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in c.items())


def _params(cases):
    return [pytest.param(c, id=_case_id(c)) for c in cases]


def _policy(c):
    return lints() if c.get("policy") == "lints" else ucb(c.get("bound", "determinant"))


def make_async(c, backend, N=12, d=4, seed=0):
    gu, gd = c["gamma"] if isinstance(c["gamma"], tuple) else (c["gamma"], c["gamma"])
    return AsyncLinUCB(N, d, c["R"], gamma_u=gu, gamma_d=gd, policy=_policy(c), preregister=c.get("preregister", False),
                       download_to_uploader=c["to_uploader"], check_on_register=c["check"],
                       refresh_on_download=c["refresh"], seed=seed, backend=backend)


@pytest.mark.parametrize("case", _params(ASYNC_CASES))
def test_async_backends_agree(case):
    it = stream(replicates=case["R"], arrival=case["arrival"], seed=1)
    a, b = make_async(case, "compiled"), make_async(case, "torch")
    assert a.use_compiled() and not b.use_compiled()
    arms = a.run(it.clients, it.contexts, it.rewards)
    assert torch.equal(arms, b.run(it.clients, it.contexts, it.rewards))
    assert_same_ledger(a, b)
    assert_same_state(a, b)
    if case["gamma"] != math.inf:
        assert a.ledger.totals()["comm_download_messages"].min() > 0  # the comparison covers communication


SYNC_CASES = [
    dict(threshold=0.0, arrival="uniform", bound="determinant", R=1),
    dict(threshold=1.0, arrival="zipf", bound="count", R=3),
    dict(threshold=5.0, arrival="uniform", bound="count", R=3, preregister=True),
    dict(threshold=math.inf, arrival="zipf", bound="determinant", R=1),
    dict(threshold=2.0, arrival="zipf", policy="lints", R=3),
    dict(threshold=0.5, arrival="uniform", policy="lints", R=1, preregister=True),
]


def make_sync(c, backend, N=12, d=4, seed=0):
    return SyncLinUCB(N, d, c["R"], threshold=c["threshold"], policy=_policy(c),
                      preregister=c.get("preregister", False), seed=seed, backend=backend)


@pytest.mark.parametrize("case", _params(SYNC_CASES))
def test_sync_backends_agree(case):
    it = stream(replicates=case["R"], arrival=case["arrival"], seed=2)
    a, b = make_sync(case, "compiled"), make_sync(case, "torch")
    arms = a.run(it.clients, it.contexts, it.rewards)
    assert torch.equal(arms, b.run(it.clients, it.contexts, it.rewards))
    assert_same_ledger(a, b)
    assert_same_state(a, b)
    if math.isfinite(case["threshold"]):
        assert a.sync_rounds.min() > 0


CENTRAL_CASES = [dict(R=1, policy=ucb()), dict(R=3, policy=ucb("count")), dict(R=3, policy=lints()),
                 dict(R=1, policy=paper_linucb(lam=LAM, alpha=0.3, refactor_every=7))]


@pytest.mark.parametrize("case", CENTRAL_CASES, ids=["ucb-R1", "ucb-count-R3", "lints-R3", "ucb-refactor7-R1"])
def test_centralized_backends_agree(case):
    it = stream(replicates=case["R"], seed=3)
    a = CentralizedLinUCB(12, 4, case["R"], policy=case["policy"], backend="compiled")
    b = CentralizedLinUCB(12, 4, case["R"], policy=case["policy"], backend="torch")
    assert torch.equal(a.run(it.clients, it.contexts, it.rewards), b.run(it.clients, it.contexts, it.rewards))
    assert_same_state(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_centralized_multi_agent_steps_equal_the_flattened_stream(backend):
    R, S, A, N = 2, 100, 3, 12
    it = stream(N=N, replicates=R, T=S * A, seed=4)
    multi = CentralizedLinUCB(N, 4, R, policy=ucb(), backend=backend)
    flat = CentralizedLinUCB(N, 4, R, policy=ucb(), backend=backend)
    arms = multi.run(it.clients.view(R, S, A), it.contexts.view(R, S, A, 6, 4), it.rewards.view(R, S, A, 6))
    assert arms.shape == (R, S, A)
    assert torch.equal(arms.reshape(R, S * A), flat.run(it.clients, it.contexts, it.rewards))
    assert_same_state(multi, flat, exact=True)


def test_compiled_ties_within_tolerance_go_to_the_lowest_index():
    # fixed α = 0 and θ̂ = e1/2 after one update; arm scores differ by 5e-10 (a tie) or 2e-9 (no tie)
    for backend in BACKENDS:
        p = CentralizedLinUCB(1, 2, policy=paper_linucb(lam=1.0, alpha=0.0), backend=backend)
        e1 = torch.tensor([1.0, 0.0], dtype=torch.float64)
        p.step(torch.tensor([0]), torch.stack([e1, 0 * e1]).unsqueeze(0), torch.tensor([[1.0, 0.0]]))
        ctx = torch.stack([0.5 * e1, (0.5 + 1e-9) * e1, (0.5 + 4e-9) * e1]).unsqueeze(0)
        assert int(p.step(torch.tensor([0]), ctx[:, :2], torch.zeros(1, 2))) == 0, backend
        assert int(p.step(torch.tensor([0]), ctx, torch.zeros(1, 3))) == 2, backend


# --------------------------------------------------------------------- 2. the authors'-style reference
def _against_reference(backend, gamma, refresh, T=400, N=12, d=4, seed=5):
    it = stream(N=N, d=d, T=T, seed=seed)
    p = AsyncLinUCB(N, d, gamma_u=gamma, gamma_d=gamma, policy=ucb(alpha=0.3), download_to_uploader=True,
                    check_on_register=False, refresh_on_download=refresh, backend=backend)
    ref = RefAsyncLinUCB(d, lam=LAM, alpha=0.3, gamma_u=gamma, gamma_d=gamma, refresh_on_download=refresh)
    ours = []
    for s in range(T):
        arm = int(p.step(it.clients[:, s], it.contexts[:, s], it.rewards[:, s])[0])
        c = int(it.clients[0, s])
        k = ref.play(c, it.contexts[0, s].numpy(), it.rewards[0, s].numpy())
        assert arm == k, f"step {s}"
        t = p.ledger.totals()
        assert (t["comm_upload_messages"].item(), t["comm_download_messages"].item()) == (ref.uploads, ref.downloads), s
        ours.append(arm)
    # the clients' statistics agree too (downloads not yet absorbed live in ``pending`` when refresh is off)
    for c, client in ref.clients.items():
        G = p.policy.G[c] + (0 if refresh else p.pending[c])
        count = p.policy.count[c] + (0 if refresh else p.pending_count[c])
        np.testing.assert_allclose(G[:d, :d].numpy(), client.A_local, rtol=0, atol=1e-9)
        np.testing.assert_allclose(G[:d, d].numpy(), client.b_local, rtol=0, atol=1e-9)
        assert int(count) == client.numObs
    assert ref.uploads > 0 and ref.downloads > 0
    return torch.tensor(ours)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("gamma", [1.0, 1.5, 3.0, 10.0])
def test_async_matches_the_reference_at_every_step(backend, gamma):
    _against_reference(backend, gamma, refresh=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("gamma", [1.5, 3.0])
def test_refresh_on_download_false_matches_the_authors_client(backend, gamma):
    lazy = _against_reference(backend, gamma, refresh=False)
    eager = _against_reference(backend, gamma, refresh=True)
    assert (lazy != eager).any()  # the flag changes decisions on this stream (it is not a no-op)


# ------------------------------------------------------------------------------------------- 3. AM
@pytest.mark.parametrize("arrival, to_uploader, check", [("uniform", True, False), ("zipf", False, True)])
def test_am_warmup_conserves_the_global_statistics(arrival, to_uploader, check):
    """What the AM clients assign to the global model is all in the server or in upload buffers, at every step.

    Derived from the code: an AM-ready step adds z_g z_gᵀ (z_g = [x_g; ŷ_g]) to the client's global G and upload
    buffer; a State-0 (warm-up) step changes neither; the step that ends a client's warm-up adds the
    initialisation zg (X_gᵀX_g and X_gᵀŷ_g of all its warm-up data) to both; an upload moves the buffer to the
    server, and downloads touch neither. So server + Σ_j buffer_j = Σ_ready-steps z_g z_gᵀ + Σ_inits zg, and the
    same for the counts. The V block and the counts are also checked against the raw stream, independently of ŷ.
    """
    N, d, dg, T = 8, 6, 3, 400
    it = stream(N=N, d=d, K=6, T=T, seed=6, arrival=arrival, global_dim=dg)
    p = AsyncLinUCBAM(N, d, global_dim=dg, gamma_u=1.5, gamma_d=1.5, policy=paper_linucb(lam=LAM), warmup=True,
                      download_to_uploader=to_uploader, check_on_register=check)
    gram = torch.zeros(N, dg, dg, dtype=torch.float64)  # Σ x_g x_gᵀ of each client's steps, from the stream alone
    steps = torch.zeros(N, dtype=torch.long)
    assigned = torch.zeros(dg + 1, dg + 1, dtype=torch.float64)  # from the steps' own outputs (a spy)
    initialised = []
    original = p._advance

    def spy(rows, contexts, rewards, state):
        nonlocal assigned
        ready = state["am_ready"].clone()
        before = state["G.policy"].clone()
        arms, due, new, z = original(rows, contexts, rewards, state)
        x = contexts[torch.arange(len(rows)), arms]
        assert torch.equal(z[:, :dg], x[:, :dg])  # z is the global part of the played arm
        assert not bool(due[~ready].any())  # State-0 clients never upload
        assigned = assigned + outer(z)[ready].sum(0)
        for i in (new["am_ready"] & ~ready).nonzero().view(-1).tolist():
            c = int(rows[i])
            zg = new["G.policy"][i] - before[i]
            # the initialisation carries X_gᵀX_g of all the client's warm-up data, this step's included
            own = gram[c] + torch.outer(x[i, :dg], x[i, :dg])
            assert torch.allclose(zg[:dg, :dg], own, rtol=0, atol=1e-9)
            assert torch.allclose(new["buffer"][i] - state["buffer"][i], zg, rtol=0, atol=1e-12)
            assert int(new["buffer_count"][i] - state["buffer_count"][i]) == int(steps[c]) + 1
            assigned = assigned + zg
            initialised.append(c)
        return arms, due, new, z

    p._advance = spy
    uploads_during_warmup = downloads_to_cold = False
    for s in range(T):
        c = int(it.clients[0, s])
        ups = p.ledger.totals()["comm_upload_messages"].item()
        arm = int(p.step(it.clients[:, s], it.contexts[:, s], it.rewards[:, s])[0])
        xg = it.contexts[0, s, arm, :dg]
        gram[c] += torch.outer(xg, xg)
        steps[c] += 1
        ready = p.am_ready.clone()
        total = p.server[0] + p.buffer.sum(0)
        assert torch.allclose(total, assigned, rtol=0, atol=1e-9), s
        assert torch.allclose(total[:dg, :dg], gram[ready].sum(0), rtol=0, atol=1e-9), s
        assert int(p.server_count[0] + p.buffer_count.sum()) == int(steps[ready].sum()), s
        cold = p.registered & ~ready
        if p.ledger.totals()["comm_upload_messages"].item() > ups and bool(cold.any()):
            uploads_during_warmup = True
        downloads_to_cold |= bool((p.policy.G[cold].abs().sum((1, 2)) > 0).any())
    assert sorted(initialised) == list(range(N)) and bool(p.am_ready.all())
    assert uploads_during_warmup and downloads_to_cold  # the interleavings that broke the old executor happened


def test_am_warmup_keeps_augmented_gram_matrices_symmetric():
    N, d, dg = 8, 6, 3
    it = stream(N=N, d=d, T=300, seed=6, global_dim=dg)
    p = AsyncLinUCBAM(N, d, global_dim=dg, gamma_u=1.5, gamma_d=1.5, policy=paper_linucb(lam=LAM), warmup=True)
    p.run(it.clients, it.contexts, it.rewards)
    for name, G in (("server", p.server), ("buffer", p.buffer), ("policy.G", p.policy.G), ("local.G", p.local.G)):
        assert torch.allclose(G, G.transpose(-1, -2), rtol=0, atol=1e-12), name


@pytest.mark.parametrize("warmup", [False, True])
def test_am_inverse_and_logdet_match_the_gram_matrices(warmup):
    N, d, dg = 2, 6, 3
    it = stream(N=N, d=d, T=80, seed=1, global_dim=dg)
    p = AsyncLinUCBAM(N, d, global_dim=dg, gamma_u=math.inf, gamma_d=math.inf, warmup=warmup,
                      policy=paper_linucb(lam=LAM, refactor_every=7))
    p.run(it.clients, it.contexts, it.rewards)
    assert int(p.policy.count.min()) > 7
    for bandit in (p.policy, p.local):
        bandit.refresh()
        A = bandit.V + LAM * torch.eye(bandit.dim, dtype=torch.float64)
        assert torch.allclose(bandit.inv, torch.linalg.inv(A), rtol=0, atol=1e-9)
        assert torch.allclose(bandit.logdet, torch.logdet(A), rtol=0, atol=1e-9)


def test_am_run_equals_step_by_step_exactly():
    N, d, dg, R, T = 8, 6, 3, 2, 300
    it = stream(N=N, d=d, T=T, seed=7, replicates=R, global_dim=dg)

    def make():
        return AsyncLinUCBAM(N, d, R, global_dim=dg, gamma_u=1.5, gamma_d=1.5, policy=paper_linucb(lam=LAM),
                             warmup=True, check_on_register=True)

    a, b = make(), make()
    arms = a.run(it.clients, it.contexts, it.rewards)
    stepped = torch.stack([b.step(it.clients[:, s], it.contexts[:, s], it.rewards[:, s]) for s in range(T)], 1)
    assert torch.equal(arms, stepped)
    assert_same_state(a, b, exact=True)
    assert a.ledger.totals()["comm_messages"].min() > 0


def _plain_am(Gg, Gl, inv_g, xg, xl, y, iterations=None, tol=1e-15):
    """Eq. (7) as a plain loop for one row, started (as the implementation) from the projected ridge θ̂^(g):
    y_l = y − θ_gᵀx_g; then repeat θ_l = Proj(pinv(V_l + x_l x_lᵀ)(b_l + x_l y_l)), y_g = y − θ_lᵀx_l,
    θ_g = Proj(pinv(V_g + x_g x_gᵀ)(b_g + x_g y_g)), y_l = y − θ_gᵀx_g; finally y_g from the last y_l.
    Returns (y_g, y_l, whether a projection was active)."""
    dg, dl = len(xg), len(xl)
    Vg, bg, Vl, bl = Gg[:dg, :dg], Gg[:dg, dg], Gl[:dl, :dl], Gl[:dl, dl]
    Pg = np.linalg.pinv(Vg + np.outer(xg, xg), hermitian=True)
    Pl = np.linalg.pinv(Vl + np.outer(xl, xl), hermitian=True)
    projected = False

    def proj(t):
        nonlocal projected
        n = np.linalg.norm(t)
        projected |= n > 1
        return t / max(n, 1.0)

    theta_g = proj(inv_g @ bg)
    y_l = y - theta_g @ xg
    n = 0
    while True:
        theta_l = proj(Pl @ (bl + xl * y_l))
        y_g = y - theta_l @ xl
        theta_g = proj(Pg @ (bg + xg * y_g))
        new = y - theta_g @ xg
        n += 1
        done = abs(new - y_l) <= tol if iterations is None else n == iterations
        y_l = new
        if done or n > 100_000:
            break
    y_g = y - proj(Pl @ (bl + xl * y_l)) @ xl
    return y_g, y_l, projected


def _random_am_state(m, dg, dl, seed):
    """Random global / local states: Gram matrices of n random points (n = 0 .. 12: empty, rank-deficient, full)."""
    g = torch.Generator().manual_seed(seed)
    Gg = torch.zeros(m, dg + 1, dg + 1, dtype=torch.float64)
    Gl = torch.zeros(m, dl + 1, dl + 1, dtype=torch.float64)
    for i in range(m):
        n = [0, 1, 2, 5, 12][i % 5]
        X = torch.randn(n, dg + dl, generator=g, dtype=torch.float64) / math.sqrt(dg + dl)
        yg = 3 * torch.randn(n, generator=g, dtype=torch.float64)  # large: projections become active
        yl = 3 * torch.randn(n, generator=g, dtype=torch.float64)
        zg, zl = torch.cat([X[:, :dg], yg[:, None]], 1), torch.cat([X[:, dg:], yl[:, None]], 1)
        Gg[i], Gl[i] = zg.T @ zg, zl.T @ zl
    x = torch.randn(m, dg + dl, generator=g, dtype=torch.float64)
    x = x / x.norm(dim=1, keepdim=True) * torch.rand(m, 1, generator=g, dtype=torch.float64)
    y = 2 * torch.randn(m, generator=g, dtype=torch.float64)
    return Gg, Gl, x, y


@pytest.mark.parametrize("iterations", [1, 3, None])
def test_am_alternating_minimisation_equals_a_plain_loop(iterations):
    m, d, dg = 40, 6, 3
    dl = d - dg
    p = AsyncLinUCBAM(1, d, global_dim=dg, policy=paper_linucb(lam=LAM))
    Gg, Gl, x, y = _random_am_state(m, dg, dl, seed=iterations or 0)
    if iterations is None:  # to convergence: full-rank states only (there the alternation contracts)
        keep = torch.arange(m) % 5 == 4
        Gg, Gl, x, y = Gg[keep], Gl[keep], x[keep], y[keep]
        p.am_iterations, p.am_tol = 100_000, 1e-15
    else:
        p.am_iterations, p.am_tol = iterations, 0.0
    eye = torch.eye(dg, dtype=torch.float64)
    inv_g = torch.linalg.inv(Gg[:, :dg, :dg] + LAM * eye)
    parts = {"policy": {"G": Gg, "inv": inv_g}, "local": {"G": Gl}}
    yg, yl = p._partial_rewards(parts, x[:, :dg], x[:, dg:], y)
    any_projection = False
    for i in range(len(y)):
        eg, el, projected = _plain_am(Gg[i].numpy(), Gl[i].numpy(), inv_g[i].numpy(), x[i, :dg].numpy(),
                                      x[i, dg:].numpy(), float(y[i]), iterations)
        any_projection |= projected
        tol = 1e-9 if iterations is None else 1e-11
        assert abs(float(yg[i]) - eg) <= tol and abs(float(yl[i]) - el) <= tol, (i, float(yg[i]), eg, float(yl[i]), el)
    assert any_projection  # the projections matter in these states


def test_am_projection_is_onto_the_unit_ball():
    t = torch.tensor([[3.0, 4.0], [0.3, 0.4]], dtype=torch.float64)
    assert torch.allclose(project_unit_ball(t), torch.tensor([[0.6, 0.8], [0.3, 0.4]], dtype=torch.float64))


# ---------------------------------------------------------------------------------------------- 4. resume
def make_protocol(kind, backend, policy="ucb", seed=0, R=2, N=12, d=5):
    pol = lints() if policy == "lints" else ucb()
    if kind == "async":
        return AsyncLinUCB(N, d, R, gamma_u=1.5, gamma_d=1.5, policy=pol, seed=seed, backend=backend)
    if kind == "async-authors":  # the authors' client, registration-time checks, uploader excluded
        return AsyncLinUCB(N, d, R, gamma_u=1.5, gamma_d=2.0, policy=pol, refresh_on_download=False,
                           check_on_register=True, download_to_uploader=False, seed=seed, backend=backend)
    if kind == "sync":
        return SyncLinUCB(N, d, R, threshold=1.0, policy=pol, seed=seed, backend=backend)
    if kind == "am":
        return AsyncLinUCBAM(N, d, R, global_dim=3, gamma_u=1.5, gamma_d=1.5, policy=pol, warmup=True, seed=seed,
                             backend=backend)
    if kind == "am-shared":  # x^(g) = x^(l) = x, no warm-up
        return AsyncLinUCBAM(N, d, R, gamma_u=1.5, gamma_d=1.5, policy=pol, seed=seed, backend=backend)
    assert kind == "central"
    return CentralizedLinUCB(N, d, R, policy=pol, seed=seed, backend=backend)


RESUME_CASES = [
    (kind, backend, policy)
    for kind in ("async", "async-authors", "sync", "central")
    for backend in BACKENDS
    for policy in ("ucb", "lints")
] + [("am", "torch", "ucb"), ("am-shared", "auto", "ucb")]


@pytest.mark.parametrize("kind, backend, policy", RESUME_CASES)
def test_resume_from_state_dict_is_bit_exact(kind, backend, policy):
    T, T1 = 300, 137
    global_dim = 3 if kind == "am" else None
    it = stream(N=12, d=5, T=T, seed=8, replicates=2, arrival="zipf", global_dim=global_dim)
    whole = make_protocol(kind, backend, policy, seed=3)
    arms = whole.run(it.clients, it.contexts, it.rewards)
    first = make_protocol(kind, backend, policy, seed=3)
    head = first.run(it.clients[:, :T1], it.contexts[:, :T1], it.rewards[:, :T1])
    # the fresh protocol is built with another seed: LinTS's seed must come from the checkpoint
    resumed = make_protocol(kind, backend, policy, seed=99)
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    tail = resumed.run(it.clients[:, T1:], it.contexts[:, T1:], it.rewards[:, T1:])
    assert torch.equal(torch.cat([head, tail], 1), arms)
    assert_same_state(resumed, whole, exact=True)
    if kind != "central":
        assert whole.ledger.totals()["comm_messages"].min() > 0


def test_resume_into_a_protocol_that_already_ran_compiled():
    T, T1 = 200, 90
    it = stream(N=6, d=4, T=T, seed=9)
    first = make_protocol("async", "compiled", "lints", seed=3, R=1, N=6, d=4)
    first.run(it.clients[:, :T1], it.contexts[:, :T1], it.rewards[:, :T1])
    used = make_protocol("async", "compiled", "lints", seed=7, R=1, N=6, d=4)
    used.run(it.clients[:, :10], it.contexts[:, :10], it.rewards[:, :10])
    used.load_state_dict(copy.deepcopy(first.state_dict()))
    assert used.policy.seed == 3
    rest = (it.clients[:, T1:], it.contexts[:, T1:], it.rewards[:, T1:])
    assert torch.equal(used.run(*rest), first.run(*rest))


# --------------------------------------------------------------------------------------------- 5. channels
CHANNEL_PROTOCOLS = [("async", "compiled"), ("async", "torch"), ("sync", "compiled"), ("sync", "torch"),
                     ("am-shared", "torch")]


def _channel_params():
    out = []
    for kind, backend in CHANNEL_PROTOCOLS:
        for R in (1, 2) if (kind, backend) == ("async", "compiled") else (2,):
            out.append(pytest.param(kind, backend, R, id=f"{kind}-{backend}-R{R}"))
    return out


@pytest.mark.parametrize("kind, backend, R", _channel_params())
def test_a_channel_zeroing_uploads_leaves_the_server_empty(kind, backend, R):
    T = 300
    it = stream(N=12, d=5, T=T, seed=10, replicates=R)
    p = with_channel(make_protocol(kind, backend, R=R), ZeroUploads)
    assert p.use_compiled() == (backend == "compiled")
    arms = p.run(it.clients, it.contexts, it.rewards)
    assert p.ledger.totals()["comm_upload_messages"].min() > 0
    assert bool((p.server == 0).all())
    # counts do not pass through the channel: the server still counts the observations uploaded to it
    N = p.num_clients
    assert torch.equal(p.server_count + p.buffer_count.view(R, N).sum(1), torch.full((R,), T))
    assert bool((p.server_count > 0).all())
    if backend == "compiled":  # the kernels hand every message to the channel and agree with the torch path
        q = with_channel(make_protocol(kind, "torch", R=R), ZeroUploads)
        assert torch.equal(arms, q.run(it.clients, it.contexts, it.rewards))
        assert_same_state(p, q)


@pytest.mark.parametrize("R", [1, 2])
def test_compiled_channel_delivery_with_registration_checks(R):
    """The authors' client with registration-time download checks, every message delivered by Python."""
    N, T = 12, 300
    it = stream(N=N, d=5, T=T, seed=17, replicates=R, arrival="zipf")
    ours = with_channel(make_protocol("async-authors", "compiled", R=R), IdentityChannel)
    registrations = []
    register = ours._register  # on the compiled path, called only for a newcomer's registration-time download
    ours._register = lambda rows: (registrations.append(rows.clone()), register(rows))
    ref = make_protocol("async-authors", "torch", R=R)
    assert torch.equal(ours.run(it.clients, it.contexts, it.rewards), ref.run(it.clients, it.contexts, it.rewards))
    assert_same_state(ours, ref)
    assert_same_ledger(ours, ref)
    assert len(registrations) > 0


@pytest.mark.parametrize("kind, backend", CHANNEL_PROTOCOLS)
def test_a_channel_doubling_downloads_doubles_what_clients_receive(kind, backend):
    """From the same state, one step whose upload triggers downloads: through a channel that doubles downloads,
    every client's statistics grow by twice what they grow by through an identity channel (its own data aside)."""
    R, N, d = 1, 12, 5
    it = stream(N=N, d=d, T=300, seed=11, replicates=R)
    plain = make_protocol(kind, backend, R=R, N=N, d=d)
    plain.run(it.clients[:, :100], it.contexts[:, :100], it.rewards[:, :100])
    for s in range(100, 300):
        state = copy.deepcopy(plain.state_dict())
        same = with_channel(make_protocol(kind, backend, R=R, N=N, d=d), IdentityChannel)
        double = with_channel(make_protocol(kind, backend, R=R, N=N, d=d), DoubleDownloads)
        same.load_state_dict(state)
        double.load_state_dict(state)
        step = (it.clients[:, s], it.contexts[:, s], it.rewards[:, s])
        arm = plain.step(*step)
        assert torch.equal(same.step(*step), arm) and torch.equal(double.step(*step), arm)
        assert_same_state(same, plain)  # a channel that overrides deliver (compiled: Python delivers) changes nothing
        if plain.ledger.totals()["comm_download_messages"].item() > state["channel.ledger.traffic_server"][
                0, 0, 1, 0, 0].item():
            break
    else:
        pytest.fail("no download happened")
    G0 = state["policy.G"]
    grown, doubled = same.policy.G - G0, double.policy.G - G0
    c = int(it.clients[0, s])
    received = same.ledger.per_endpoint("client", "download", side="received")[0] \
        - state["channel.ledger.traffic_client"][0, :, 1, 1, 0]
    assert int((received > 0).sum()) >= 2
    if kind == "sync":  # a sync round: every registered client holds V_g (doubled)
        members = same.registered.nonzero().view(-1)
        assert torch.equal(same.policy.G[members], same.server[0].expand(len(members), -1, -1))
        assert torch.allclose(double.policy.G[members], 2 * same.server[0], rtol=0, atol=1e-12)
        assert not torch.allclose(double.policy.G[members], same.policy.G[members])
        return
    own = torch.zeros_like(G0)
    if kind == "async":  # the active client's own observation is not a download
        x = it.contexts[0, s, int(arm[0])]
        z = torch.cat([x, it.rewards[0, s, int(arm[0])].view(1)])
        own[c] = torch.outer(z, z)
    others = torch.arange(N) != c
    for j in range(N):
        if kind == "async" or others[j]:
            assert torch.allclose(doubled[j] - own[j], 2 * (grown[j] - own[j]), rtol=0, atol=1e-10), j
    assert not torch.allclose(double.policy.G, same.policy.G)  # what the clients hold changed


@pytest.mark.parametrize("kind, backend, R", _channel_params())
def test_ledger_per_endpoint_sums_to_the_totals(kind, backend, R):
    """Σ_clients sent uploads = total uploads = the server's received uploads; Σ_clients received downloads = total
    downloads = the server's sent downloads, in every unit, counted by the kernels (transparent channel) and by
    the channel (Python delivery) alike."""
    T = 300
    it = stream(N=12, d=5, T=T, seed=12, replicates=R, arrival="zipf")
    a = make_protocol(kind, backend, R=R)
    b = with_channel(make_protocol(kind, backend, R=R), IdentityChannel)
    assert torch.equal(a.run(it.clients, it.contexts, it.rewards), b.run(it.clients, it.contexts, it.rewards))
    assert_same_ledger(a, b)
    assert_same_state(a, b)
    L, t = a.ledger, a.ledger.totals()
    for unit in UNITS:
        up, down = t[f"comm_upload_{unit}"], t[f"comm_download_{unit}"]
        assert bool((up > 0).all() and (down > 0).all())
        assert torch.equal(L.per_endpoint("client", "upload", unit, "sent").sum(1), up)
        assert torch.equal(L.per_endpoint("server", "upload", unit, "received").sum(1), up)
        assert torch.equal(L.per_endpoint("client", "download", unit, "received").sum(1), down)
        assert torch.equal(L.per_endpoint("server", "download", unit, "sent").sum(1), down)
        assert torch.equal(L.per_endpoint("client", None, unit, "sent").sum(1)
                           + L.per_endpoint("server", None, unit, "sent").sum(1), t[f"comm_{unit}"])
        for role, kind_, side in (("client", "upload", "received"), ("client", "download", "sent"),
                                  ("server", "upload", "sent"), ("server", "download", "received")):
            assert not L.per_endpoint(role, kind_, unit, side).any()
        assert t[f"comm_peer_{unit}"].sum() == 0
    assert torch.equal(t["comm_scalars"], t["comm_messages"] * a.message_scalars)
    assert torch.equal(t["comm_bytes"], t["comm_scalars"] * 8)


# -------------------------------------------------------------------------------------- 6. federated LinTS
LINTS_PROTOCOLS = [("async", "compiled"), ("async", "torch"), ("sync", "compiled"), ("central", "compiled"),
                   ("central", "torch")]


@pytest.mark.parametrize("kind, backend", LINTS_PROTOCOLS)
def test_lints_replicates_draw_independently(kind, backend):
    R, T = 3, 200
    one = stream(N=6, d=4, T=T, seed=13)
    same = [x.expand(R, *x.shape[1:]).contiguous() for x in (one.clients, one.contexts, one.rewards)]
    p = make_protocol(kind, backend, "lints", R=R, N=6, d=4)
    arms = p.run(*same)
    assert not torch.equal(arms[0], arms[1]) and not torch.equal(arms[1], arms[2])
    control = make_protocol(kind, backend, "ucb", R=R, N=6, d=4)  # deterministic: identical replicates
    c = control.run(*same)
    assert torch.equal(c[0], c[1]) and torch.equal(c[1], c[2])


@pytest.mark.parametrize("kind, backend", LINTS_PROTOCOLS)
def test_lints_draws_are_a_function_of_the_seed(kind, backend):
    it = stream(N=6, d=4, T=200, seed=14, replicates=2)
    runs = {seed: make_protocol(kind, backend, "lints", seed=seed, N=6, d=4).run(it.clients, it.contexts, it.rewards)
            for seed in (5, 6)}
    again = make_protocol(kind, backend, "lints", seed=5, N=6, d=4).run(it.clients, it.contexts, it.rewards)
    assert torch.equal(runs[5], again)
    assert not torch.equal(runs[5], runs[6])


# ------------------------------------------------------------------------------------------- 7. bad input
def _bad_inputs(N, K, d):
    def client(v):
        return lambda c, x, r: (c.index_fill(1, torch.tensor([6]), v), x, r)

    def context(v):
        def f(c, x, r):
            x = x.clone()
            x[:, 6, 2, 1] = v
            return c, x, r
        return f

    def reward(v):
        def f(c, x, r):
            r = r.clone()
            r[:, 6, 3] = v
            return c, x, r
        return f

    return {
        "negative client": ("clients", client(-1)),
        "client >= N": ("clients", client(N)),
        "float clients": ("clients", lambda c, x, r: (c.double(), x, r)),
        "bool clients": ("clients", lambda c, x, r: (c > 0, x, r)),
        "clients (R+1, S)": ("clients", lambda c, x, r: (torch.cat([c, c[:1]]), x, r)),
        "clients 1-D": ("clients", lambda c, x, r: (c[0], x, r)),
        "NaN context": ("contexts", context(math.nan)),
        "inf context": ("contexts", context(math.inf)),
        "contexts of dim d+1": ("contexts", lambda c, x, r: (c, torch.cat([x, x[..., :1]], -1), r)),
        "contexts for fewer steps": ("contexts", lambda c, x, r: (c, x[:, :-1], r)),
        "no arms": ("contexts", lambda c, x, r: (c, x[:, :, :0], r[:, :, :0])),
        "NaN reward": ("rewards", reward(math.nan)),
        "-inf reward": ("rewards", reward(-math.inf)),
        "rewards for K+1 arms": ("rewards", lambda c, x, r: (c, x, torch.cat([r, r[..., :1]], -1))),
        "rewards (R, S)": ("rewards", lambda c, x, r: (c, x, r[..., 0])),
    }


BAD_PROTOCOLS = [("async", "compiled"), ("async", "torch"), ("async-authors", "compiled"), ("sync", "compiled"),
                 ("sync", "torch"), ("am-shared", "torch"), ("central", "compiled"), ("central", "torch")]


@pytest.mark.parametrize("kind, backend", BAD_PROTOCOLS)
def test_bad_input_is_rejected_before_any_state_changes(kind, backend):
    R, N, d, K = 2, 12, 5, 6
    it = stream(N=N, d=d, K=K, T=40, seed=15, replicates=R)
    p = make_protocol(kind, backend, R=R, N=N, d=d)
    p.run(it.clients[:, :30], it.contexts[:, :30], it.rewards[:, :30])
    block = (it.clients[:, 30:], it.contexts[:, 30:], it.rewards[:, 30:])  # 10 steps; the bad one is the 7th
    snap = snapshot(p)
    for what, (name, corrupt) in _bad_inputs(N, K, d).items():
        with pytest.raises(ValueError, match=rf"\b{name}\b") as e:
            p.run(*corrupt(*block))
        assert str(e.value).startswith(name), (what, str(e.value))
        assert_state_equals_snapshot(p, snap)
    with pytest.raises(ValueError, match=r"\bclients\b"):  # the step API
        p.step(torch.full((R,), N), block[1][:, 0], block[2][:, 0])
    if kind != "central":  # several agents in one step
        with pytest.raises(ValueError, match=r"\bclients\b"):
            p.run(block[0].view(R, 5, 2), block[1].view(R, 5, 2, K, d), block[2].view(R, 5, 2, K))
    assert_state_equals_snapshot(p, snap)
    assert torch.equal(p.run(*block), make_and_run(kind, backend, it, R, N, d))  # and it still runs normally


def make_and_run(kind, backend, it, R, N, d):
    q = make_protocol(kind, backend, R=R, N=N, d=d)
    return q.run(it.clients, it.contexts, it.rewards)[:, 30:]


@pytest.mark.parametrize("cls", [AsyncLinUCB, SyncLinUCB, CentralizedLinUCB, AsyncLinUCBAM])
def test_unknown_backend_is_a_config_error(cls):
    with pytest.raises(ConfigError, match="backend"):
        cls(4, 3, backend="bogus")


def test_am_has_no_compiled_backend():
    with pytest.raises(ConfigError, match="backend"):
        AsyncLinUCBAM(4, 3, backend="compiled")
    assert not AsyncLinUCBAM(4, 3, backend="auto").use_compiled()


# ------------------------------------------------------------------------------------------ 8. threads
@pytest.mark.parametrize("threads", [1, 2])
def test_compiled_runs_leave_torch_thread_count_alone(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        it = stream(N=12, d=5, T=200, seed=16, replicates=3)
        for kind in ("async", "sync", "central"):
            p = make_protocol(kind, "compiled", R=3)
            assert p.use_compiled()
            p.run(it.clients, it.contexts, it.rewards)
            assert torch.get_num_threads() == threads, kind
        q = with_channel(make_protocol("sync", "compiled", R=3), IdentityChannel)  # kernel called many times
        q.run(it.clients, it.contexts, it.rewards)
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)

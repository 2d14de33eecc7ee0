"""fedrec's FCLUB family (fedrec.protocols.FederatedClustering) against the plain reference of
tests/reference/fclub.py, written from spec fclub.md §2 and §8: the same arms, the same messages per local
server, conservation of the statistics, resume, and the bad inputs of the issue."""
from __future__ import annotations

import copy
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedrec.envs.clustered import ClusteredLinearEnv
from fedrec.errors import ConfigError
from fedrec.privacy import TreeGaussian
from fedrec.protocols.fclub import FederatedClustering
from tests.reference.fclub import RefFCLUB

T = 1200
VARIANTS = {  # name: (protocol kwargs, reference kwargs)
    "fclub_dc": ({}, {}),
    "fclub": (dict(upload_threshold=1.0, download_threshold=1.0), dict(U=1.0, D=1.0)),
    "homo": (dict(pooled=True, upload_threshold=1.0, download_threshold=1.0), dict(pooled=True, U=1.0, D=1.0)),
    "homo_dc": (dict(pooled=True), dict(pooled=True)),
    "cdp_fclub_dc": (dict(privacy=TreeGaussian(epsilon=1.0, horizon=1000)), dict(epsilon=1.0, horizon=1000)),
    "squared_bonus": (dict(bonus="squared", lam=2.0), dict(bonus="squared", lam=2.0)),
    "fixed_beta": (dict(beta=0.3, upload_threshold=1.2, download_threshold=1.5), dict(beta=0.3, U=1.2, D=1.5)),
    # the authors' conventions (§8.3-8.4): squared bonus, λ = 2 (1 with CDP), their β recipes
    "authors_fclub_dc": (dict(conventions="authors"), dict(authors=True, bonus="squared", lam=2.0)),
    "authors_fclub": (dict(conventions="authors", upload_threshold=1.0, download_threshold=1.0),
                      dict(authors=True, bonus="squared", lam=2.0, U=1.0, D=1.0)),
    "authors_cdp_fclub_dc": (dict(conventions="authors", noise_placement="statistics",
                                  privacy=TreeGaussian(epsilon=1.0, horizon=1000)),
                             dict(authors=True, bonus="squared", lam=1.0, epsilon=1.0, horizon=1000)),
    # the noise only in the upload trigger (§8.5): the authors' conventions' placement, and given under the paper's
    "authors_cdp_fclub_dc_trigger": (dict(conventions="authors", privacy=TreeGaussian(epsilon=4.0, horizon=1000)),
                                     dict(authors=True, bonus="squared", lam=1.0, epsilon=4.0, horizon=1000,
                                          noise_placement="trigger")),
    "cdp_fclub_dc_trigger": (dict(noise_placement="trigger", privacy=TreeGaussian(epsilon=4.0, horizon=1000)),
                             dict(epsilon=4.0, horizon=1000, noise_placement="trigger")),
}


@pytest.fixture(scope="module")
def env(data_dir: Path) -> ClusteredLinearEnv:
    return ClusteredLinearEnv(data_dir=data_dir, replicates=2, seed=4, chunk_size=500)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_same_arms_and_messages_as_the_reference(env: ClusteredLinearEnv, name: str) -> None:
    ours, theirs = VARIANTS[name]
    batch = env.interactions(0, T)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "protocol.noise_placement=trigger")  # what it says is tested elsewhere
        p = FederatedClustering(env.num_clients, env.dim, env.replicates, seed=7, **ours)
    arms = torch.cat([p.run(batch.clients[:, a:b], batch.contexts[:, a:b], batch.rewards[:, a:b])
                      for a, b in ((0, 1), (1, 300), (300, 301), (301, 1023), (1023, T))], 1)  # across phases
    for r in range(env.replicates):
        ref = RefFCLUB(env.servers, env.dim, seed=7, replicate=r, **theirs)
        want = ref.run(batch.clients[r].numpy(), batch.contexts[r].numpy(), batch.rewards[r].numpy())
        assert np.array_equal(arms[r].numpy(), want), np.flatnonzero(arms[r].numpy() != want)[:5]
        sent = p.ledger.per_endpoint("server", "upload")[r].numpy()
        received = p.ledger.per_endpoint("server", "download", side="received")[r].numpy()
        assert np.array_equal(sent, ref.uploads) and np.array_equal(received, ref.downloads)
        assert np.array_equal(p.partition(r) == p.partition(r)[:, None],
                              _same_cluster(ref))  # the same global partition


def _same_cluster(ref: RefFCLUB) -> np.ndarray:
    label = np.empty(ref.n, dtype=np.int64)
    for k, g in enumerate(ref.globals):
        for c in g.members:
            label[sorted(c.users)] = k
    return label == label[:, None]


@pytest.mark.parametrize("name", ["fclub_dc", "cdp_fclub_dc"])
def test_statistics_are_conserved(env: ClusteredLinearEnv, name: str) -> None:
    """§6 test 2 on fedrec's buffers: S^g = S + ΔS⁻ for every member, and the counts add up without noise."""
    batch = env.interactions(0, 700)
    p = FederatedClustering(env.num_clients, env.dim, env.replicates, **VARIANTS[name][0])
    p.run(batch.clients, batch.contexts, batch.rewards)
    for r in range(env.replicates):
        for k in np.flatnonzero(p.nmem[r].numpy()):
            members = p.mem[r, k, : int(p.nmem[r, k])]
            for c in members:
                assert torch.allclose(p.Sg[r, k], p.S[r, c] + p.dSm[r, c], atol=1e-8)
                assert math.isclose(float(p.Tg[r, k]), float(p.Tc[r, c] + p.dTm[r, c]))
            users = np.isin(p.lc[r].numpy(), members.numpy())
            assert math.isclose(float(p.Tg[r, k] + p.dT[r, members].sum()), float(p.Tu[r, users].sum()))


def test_resume_from_the_state_dict_equals_the_uninterrupted_run(env: ClusteredLinearEnv) -> None:
    batch = env.interactions(0, 900)
    kw: dict[str, Any] = dict(privacy=TreeGaussian(epsilon=2.0, horizon=2000))
    whole = FederatedClustering(env.num_clients, env.dim, env.replicates, seed=3, **kw)
    arms = whole.run(batch.clients, batch.contexts, batch.rewards)
    first = FederatedClustering(env.num_clients, env.dim, env.replicates, seed=3, **kw)
    head = first.run(batch.clients[:, :400], batch.contexts[:, :400], batch.rewards[:, :400])
    resumed = FederatedClustering(env.num_clients, env.dim, env.replicates, seed=99, **kw)
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    tail = resumed.run(batch.clients[:, 400:], batch.contexts[:, 400:], batch.rewards[:, 400:])
    assert torch.equal(torch.cat([head, tail], 1), arms)
    assert torch.equal(resumed.ledger.traffic("server"), whole.ledger.traffic("server"))


def test_delayed_communication_is_far_below_every_round(data_dir: Path) -> None:
    """§8.9: U = D = 1.01 communicates far less than FCLUB's every round once clusters hold ~10³ observations."""
    steps = 20000
    e = ClusteredLinearEnv(data_dir=data_dir, replicates=1, seed=1, chunk_size=5000)
    batch = e.interactions(0, steps)
    totals = {}
    for name in ("fclub", "fclub_dc"):
        p = FederatedClustering(e.num_clients, e.dim, 1, **VARIANTS[name][0])
        p.run(batch.clients, batch.contexts, batch.rewards)
        totals[name] = float(p.ledger.totals()["comm_messages"][0])
    assert totals["fclub"] >= steps  # one upload per round, plus downloads
    assert totals["fclub_dc"] < 0.5 * totals["fclub"], totals


@pytest.mark.parametrize(("kw", "field"), [
    (dict(num_servers=3), "num_servers"),
    (dict(num_servers=80), "num_servers"),
    (dict(upload_threshold=0.9), "upload_threshold"),
    (dict(download_threshold=0.5), "download_threshold"),
    (dict(privacy=dict(epsilon=0.0)), "epsilon"),
    (dict(privacy=dict(epsilon=-1.0)), "epsilon"),
    (dict(privacy=dict(epsilon=1.0, delta=1.0)), "delta"),
    (dict(privacy=dict(epsilon=1.0, delta=0.0)), "delta"),
    (dict(privacy=dict(epsilon=1.0), upload_threshold=1.0), "upload_threshold"),
    (dict(bonus="cube"), "bonus"),
    (dict(lam=0.0), "lam"),
])
def test_bad_inputs_name_the_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        if "privacy" in kw:
            kw = {**kw, "privacy": TreeGaussian(**kw["privacy"])}
        FederatedClustering(40, 10, 1, **kw)


@pytest.mark.parametrize("calls", [1, 2, 3, 7, 8])
def test_privatiser_noise_is_symmetric_at_the_calibrated_scale(calls: int) -> None:
    """Algorithm 5: release ``calls`` sums popcount(calls) node noises (Z + Zᵀ)/√2 with Z i.i.d. N(0, σ²), so its
    off-diagonal entries have variance popcount·σ² and its diagonal 2·popcount·σ² (chi-square bounds, 4000 draws)."""
    from scipy import stats

    from fedrec.protocols.kernels.fclub import release

    d, sigma, n = 3, 2.5, 4000
    N, Z = np.zeros((d + 1, d + 1)), np.zeros((d + 1, d + 1))
    draws = []
    for uid in range(1, n + 1):
        release(11, uid, calls, sigma, d, N, Z)
        assert np.array_equal(N, N.T)
        draws.append(N.copy())
    draws = np.stack(draws)
    nodes = bin(calls).count("1")
    lo, hi = stats.chi2.ppf([1e-4, 1 - 1e-4], n) / n
    for (i, j), factor in (((0, 1), 1.0), ((2, 3), 1.0), ((0, 0), 2.0), ((3, 3), 2.0)):
        ratio = (draws[:, i, j] ** 2).mean() / (factor * nodes * sigma ** 2)
        assert lo < ratio < hi, (i, j, ratio)

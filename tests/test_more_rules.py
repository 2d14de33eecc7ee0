"""Gradients through every rule of fedrec.aggregation (gradcheck and hand-computed), the numpy fast path equal to
torch's bit for bit, and the newer rules and attacks (geometric median, Bulyan, centered clipping; A Little Is
Enough, min-max) against loops written out in numpy, as plain rules, as round aggregators and as attacks."""
from __future__ import annotations

from statistics import NormalDist

import numpy as np
import pytest
import scipy.stats
import torch

from fedrec.aggregation import (
    bulyan,
    centered_clipping,
    coordinate_median,
    geometric_median,
    krum,
    norm_bounded_mean,
    sorted_clients,
    trimmed_mean,
)
from fedrec.errors import ConfigError
from fedrec.recsys import ALittleIsEnough, Bulyan, CenteredClipping, GeometricMedian, MinMax
from tests.helpers import random_case, random_uploads, t, tiny_fixture, with_malicious
from tests.reference.aggregation import item_by_item

#: the data of test_attacks.py
tiny = tiny_fixture(users=60, items=40, seed=7, rounds=4, num_clients=33)

RULES = {
    "median": lambda u, w: coordinate_median(u, w),
    "trimmed_mean": lambda u, w: trimmed_mean(u, w, 0.2),
    "krum": lambda u, w: krum(u, w, 2),
    "multi_krum": lambda u, w: krum(u, w, 2, 4),
    "norm_bound": lambda u, w: norm_bounded_mean(u, w, 1.0),
    "geometric_median": lambda u, w: geometric_median(u, w),
    "bulyan": lambda u, w: bulyan(u, w, 2),
    "centered_clipping": lambda u, w: centered_clipping(u, w, 0.5, 3),
}


# ------------------------------------------------------------------------------------------ numpy references
def ref_geometric_median(u: np.ndarray, w: np.ndarray, iterations: int, tol: float, nu: float) -> np.ndarray:
    """RFA's smoothed Weiszfeld written out, from the weighted mean."""
    z = np.average(u, axis=0, weights=w)
    obj = sum(w[c] * np.linalg.norm(z - u[c]) for c in range(len(u)))
    for _ in range(iterations):
        beta = np.array([w[c] / max(nu, np.linalg.norm(z - u[c])) for c in range(len(u))])
        z = (beta[:, None] * u).sum(0) / beta.sum()
        prev, obj = obj, sum(w[c] * np.linalg.norm(z - u[c]) for c in range(len(u)))
        if abs(prev - obj) <= tol * obj:
            break
    return z


def ref_bulyan(u: np.ndarray, f: int) -> np.ndarray:
    """El Mhamdi et al.'s Bulyan written out: Krum on what is left, θ = C − 2f times, then per coordinate the mean
    of the θ − 2f picked values closest to their median."""
    left, picked = list(range(len(u))), []
    for _ in range(len(u) - 2 * f):
        k = max(len(left) - f - 2, 0)
        score = {i: sum(sorted(float(np.sum((u[i] - u[j]) ** 2)) for j in left if j != i)[:k]) for i in left}
        best = min(left, key=lambda i: (score[i], i))
        picked.append(best)
        left.remove(best)
    sel = u[picked]
    beta = len(sel) - 2 * f
    out = []
    for p in range(u.shape[1]):
        col = sorted(sel[:, p])
        med = np.median(col)
        out.append(np.mean(sorted(col, key=lambda x: abs(x - med))[:beta]))
    return np.array(out)


def ref_centered_clipping(u: np.ndarray, w: np.ndarray, tau: float, iterations: int, v: np.ndarray) -> np.ndarray:
    for _ in range(iterations):
        steps = [(x - v) * min(1.0, tau / max(np.linalg.norm(x - v), 1e-300)) for x in u]
        v = v + np.average(steps, axis=0, weights=w)
    return v


def ref_alie(known: np.ndarray, z: float) -> np.ndarray:
    return known.mean(0) - z * known.std(0)


def ref_min_max(known: np.ndarray, perturbation: str, tol: float) -> tuple[np.ndarray, np.ndarray]:
    """The min-max upload's ``(mean, p)`` and the largest γ, by a plain scan-then-bisect on the written-out test."""
    mean = known.mean(0)
    p = {"std": -known.std(0), "unit": -mean / np.linalg.norm(mean), "sign": -np.sign(mean)}[perturbation]
    if not p.any():  # one known update under "std": nothing to move along
        return mean, p, 0.0
    spread = max(np.linalg.norm(a - b) for a in known for b in known)

    def fits(g: float) -> bool:
        return max(np.linalg.norm(mean + g * p - x) for x in known) <= spread + 1e-12

    lo, hi = 0.0, 1.0
    while fits(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > tol / 10:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return mean, p, lo


# ---------------------------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("rule", RULES)
def test_gradients_flow_through_every_rule_and_pass_gradcheck(rule: str) -> None:
    torch.manual_seed(0)
    u = torch.randn(2, 11, 3, dtype=torch.float64, requires_grad=True)
    w = torch.rand(2, 11, dtype=torch.float64) + 0.1
    assert torch.autograd.gradcheck(lambda x: RULES[rule](x, w), (u,))
    RULES[rule](u, w).sum().backward()
    assert u.grad is not None and bool(u.grad.abs().sum() > 0)


def test_order_statistic_gradients_are_the_hand_computed_ones() -> None:
    u, w = t(np.array([[3.0, -1.0], [1.0, 5.0], [2.0, 0.0], [9.0, 4.0]])).requires_grad_(), t(np.ones(4))
    coordinate_median(u, w).sum().backward()  # even C: half to each of the two middle values per coordinate
    assert u.grad.tolist() == [[0.5, 0.0], [0.0, 0.0], [0.5, 0.5], [0.0, 0.5]]
    u.grad = None
    x = t(np.array([[0.0, 0.0], [0.1, 0.0], [0.0, 0.1], [10.0, 10.0], [0.05, 0.05]])).requires_grad_()
    krum(x, t(np.ones(5)), 1).sum().backward()  # one-hot on the chosen update
    chosen = int(np.argmin([sum(sorted(float(((x[i] - x[j]) ** 2).sum().detach()) for j in range(5) if j != i)[:2])
                            for i in range(5)]))
    want = np.zeros((5, 2))
    want[chosen] = 1
    assert x.grad.numpy().tolist() == want.tolist()


@pytest.mark.parametrize("rule", ["median", "trimmed_mean", "krum", "multi_krum"])
def test_the_grad_path_equals_the_numpy_path_bit_for_bit(rule: str) -> None:
    u, w = random_case(5, 13, 6)
    plain = RULES[rule](t(u), t(w))
    tracked = RULES[rule](t(u).requires_grad_(), t(w))
    assert torch.equal(plain, tracked.detach())
    x = t(u).reshape(1, 13, 6).expand(3, -1, -1)
    assert torch.equal(sorted_clients(x), torch.sort(x, dim=-2).values)


# ---------------------------------------------------------------------------------------------- new rules
@pytest.mark.parametrize("seed", range(4))
def test_new_rules_equal_their_written_out_loops(seed: int) -> None:
    u, w = random_case(seed, 12, 4)
    torch.testing.assert_close(geometric_median(t(u), t(w), 50, 1e-8, 1e-6),
                               t(ref_geometric_median(u, w, 50, 1e-8, 1e-6)), rtol=1e-10, atol=1e-12)
    for f in (0, 1, 2):
        torch.testing.assert_close(bulyan(t(u), t(w), f), t(ref_bulyan(u, f)), rtol=1e-12, atol=1e-12)
    center = np.random.default_rng(seed).normal(size=4)
    for v in (np.zeros(4), center):
        torch.testing.assert_close(centered_clipping(t(u), t(w), 0.3, 4, None if not v.any() else t(v)),
                                   t(ref_centered_clipping(u, w, 0.3, 4, v)), rtol=1e-12, atol=1e-12)


def test_bulyan_ties_and_duplicates_go_to_the_lower_index() -> None:
    rng = np.random.default_rng(3)
    u = rng.normal(size=(15, 3))
    u[[4, 9]] = u[2]  # duplicates tie
    for f in (1, 2, 3):
        torch.testing.assert_close(bulyan(t(u), t(np.ones(15)), f), t(ref_bulyan(u, f)), rtol=1e-12, atol=1e-12)


def test_new_rules_batched_equal_one_call_per_batch() -> None:
    u, w = random_case(7, 3 * 11, 5)
    ub, wb = t(u).reshape(3, 11, 5), t(w).reshape(3, 11)
    for rule in ("geometric_median", "bulyan", "centered_clipping"):
        got = RULES[rule](ub, wb)
        for b in range(3):
            torch.testing.assert_close(got[b], RULES[rule](ub[b], wb[b]), rtol=1e-12, atol=1e-14)


def test_geometric_median_bulyan_and_clipping_resist_far_away_attackers() -> None:
    rng = np.random.default_rng(0)
    honest = rng.normal(size=(16, 4)) * 0.1
    u = np.concatenate([honest, np.full((3, 4), 100.0)])
    w = np.ones(19)
    target = honest.mean(0)
    assert float(np.linalg.norm(np.average(u, axis=0, weights=w) - target)) > 10
    for rule in ("geometric_median", "bulyan", "centered_clipping"):
        assert float((RULES[rule](t(u), t(w)) - t(target)).norm()) < 0.2, rule


@pytest.mark.parametrize(("call", "field"), [
    (lambda: bulyan(torch.zeros(10, 2), torch.ones(10), 2), "aggregator.f"),  # 10 < 4·2 + 3
    (lambda: geometric_median(torch.zeros(3, 2), torch.ones(3), iterations=0), "aggregator.iterations"),
    (lambda: geometric_median(torch.zeros(3, 2), torch.ones(3), smoothing=0.0), "aggregator.smoothing"),
    (lambda: geometric_median(torch.zeros(3, 2), torch.ones(3), tolerance=-1.0), "aggregator.tolerance"),
    (lambda: centered_clipping(torch.zeros(3, 2), torch.ones(3), tau=0.0), "aggregator.tau"),
    (lambda: CenteredClipping(center="previous"), "aggregator.center"),
    (lambda: Bulyan(f=-1), "aggregator.f"),
    (lambda: ALittleIsEnough(z="x"), "attack.z"),
    (lambda: MinMax(perturbation="gauss"), "attack.perturbation"),
    (lambda: MinMax(gamma_init=0.0), "attack.gamma_init"),
    (lambda: MinMax(knowledge="some"), "attack.knowledge"),
])
def test_bad_settings_are_one_line_errors_naming_the_field(call, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as err:
        call()
    assert "\n" not in str(err.value)


def test_bulyan_too_large_for_the_run_is_refused(tiny) -> None:  # noqa: F811
    Bulyan(f=7).validate(31)
    with pytest.raises(ConfigError, match=r"aggregator\.f=8 is too large for 34 clients: Bulyan needs at least 4f"):
        Bulyan(f=8).validate(34)


# ------------------------------------------------------------------------------------- round aggregators
def bulyan_group(f: int):
    def rule(u: np.ndarray, w: np.ndarray, C: int) -> np.ndarray:
        n = len(u)
        return np.median(u, axis=0) if n < 3 else ref_bulyan(u, min(f * n // C, (n - 3) // 4))
    return rule


CASES = [
    (GeometricMedian(iterations=30, tolerance=1e-9), lambda u, w, C: ref_geometric_median(u, w, 30, 1e-9, 1e-6)),
    (Bulyan(f=2), bulyan_group(2)),
    (CenteredClipping(tau=0.4, iterations=2), lambda u, w, C: ref_centered_clipping(u, w, 0.4, 2, 0 * u[0])),
    (CenteredClipping(tau=0.4, iterations=2, center="median"),
     lambda u, w, C: ref_centered_clipping(u, w, 0.4, 2, np.median(u, axis=0))),
]


@pytest.mark.parametrize(("aggregator", "group_rule"), CASES, ids=lambda c: type(c).__name__ if not callable(c)
                         or isinstance(c, type) else "")
@pytest.mark.parametrize("seed", range(3))
def test_each_new_aggregator_equals_its_item_by_item_loop(aggregator, group_rule, seed: int) -> None:
    up = random_uploads(seed)
    shared, items, rows = aggregator(up)
    want_shared, want_items, want_rows = item_by_item(up, group_rule)
    assert items.tolist() == want_items
    torch.testing.assert_close(shared, torch.from_numpy(want_shared), rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(rows, torch.from_numpy(want_rows), rtol=1e-9, atol=1e-11)


# ---------------------------------------------------------------------------------------------- attacks
def _known(up, bad: torch.Tensor, knowledge: str) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """The honest ω updates and each item's honest rows that an attacker with ``knowledge`` sees."""
    known = bad.numpy() if knowledge == "own" else np.ones(len(bad), dtype=bool)
    row_known = known[up.row_client.numpy()]
    items = up.row_item.numpy()
    return up.shared.numpy()[known], {int(i): up.rows.numpy()[row_known & (items == i)]
                                      for i in np.unique(items[row_known])}


def _check_crafted(up, got, bad: torch.Tensor, knowledge: str, craft) -> None:
    shared, by_item = _known(up, bad, knowledge)
    b, row_bad = bad.numpy(), bad[up.row_client].numpy()
    for c in np.flatnonzero(b):
        np.testing.assert_allclose(got.shared[c].numpy(), craft(shared), rtol=1e-9, atol=1e-9)
    for r in np.flatnonzero(row_bad):
        np.testing.assert_allclose(got.rows[r].numpy(), craft(by_item[int(up.row_item[r])]), rtol=1e-9, atol=1e-9)
    assert torch.equal(got.shared[~bad], up.shared[~bad])
    assert torch.equal(got.rows[~torch.from_numpy(row_bad)], up.rows[~torch.from_numpy(row_bad)])
    assert torch.equal(got.row_item, up.row_item) and torch.equal(got.row_client, up.row_client)


@pytest.mark.parametrize("knowledge", ["own", "all"])
def test_alie_uploads_mean_minus_z_std_of_the_known_updates(tiny, knowledge: str) -> None:  # noqa: F811
    up = random_uploads(2)
    attack = ALittleIsEnough(0.1, knowledge=knowledge)
    bad = with_malicious(attack, tiny, up)
    n, f = tiny.num_clients, share_count_ref(0.1, tiny.num_clients)
    s = n // 2 + 1 - f
    assert attack.z == pytest.approx(scipy.stats.norm.ppf((n - s) / n), abs=1e-12)
    _check_crafted(up, attack(up, 0, None, None), bad, knowledge, lambda k: ref_alie(k, attack.z))
    fixed = ALittleIsEnough(0.1, z=1.5, knowledge=knowledge)
    with_malicious(fixed, tiny, up)
    _check_crafted(up, fixed(up, 0, None, None), bad, knowledge, lambda k: ref_alie(k, 1.5))


def share_count_ref(fraction: float, n: int) -> int:
    return int(np.floor(fraction * n + 1e-9))


def test_alie_refuses_a_majority_for_the_paper_z(tiny) -> None:  # noqa: F811
    with pytest.raises(ConfigError, match=r"attack\.fraction=0\.6 .*set attack\.z"):
        ALittleIsEnough(0.6).setup(tiny, 0)
    ALittleIsEnough(0.6, z=1.0).setup(tiny, 0)
    assert NormalDist().inv_cdf(0.5) == 0.0


@pytest.mark.parametrize("perturbation", ["std", "unit", "sign"])
@pytest.mark.parametrize("knowledge", ["own", "all"])
def test_min_max_uploads_mean_plus_the_largest_gamma_that_fits(tiny, perturbation: str,  # noqa: F811
                                                               knowledge: str) -> None:
    up = random_uploads(3)
    attack = MinMax(0.1, perturbation=perturbation, tolerance=1e-7, knowledge=knowledge)
    bad = with_malicious(attack, tiny, up)
    got = attack(up, 0, None, None)

    def craft(known: np.ndarray) -> np.ndarray:
        mean, p, gamma = ref_min_max(known, perturbation, 1e-7)
        return mean + gamma * p
    shared, by_item = _known(up, bad, knowledge)
    c = int(np.flatnonzero(bad.numpy())[0])
    mean, p, gamma = ref_min_max(shared, perturbation, 1e-7)
    spread = max(np.linalg.norm(a - b) for a in shared for b in shared)
    far = max(np.linalg.norm(got.shared[c].numpy() - x) for x in shared)
    assert gamma > 0 and far <= spread + 1e-9  # inside the benign spread ...
    assert max(np.linalg.norm(mean + (gamma + 1e-5) * p - x) for x in shared) > spread  # ... and at its edge
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(got.shared[c].numpy(), craft(shared), rtol=0, atol=1e-6 * (1 + np.abs(p).max()))
    row_bad = bad[up.row_client].numpy()
    for r in np.flatnonzero(row_bad):
        want = craft(by_item[int(up.row_item[r])])
        np.testing.assert_allclose(got.rows[r].numpy(), want, rtol=0, atol=1e-5)
    assert torch.equal(got.shared[~bad], up.shared[~bad])

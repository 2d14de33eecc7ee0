"""The Poisson-subsampled Gaussian accountant (DP-FedAvg's central DP) against references computed here: the RDP of
the subsampled Gaussian by numerical integration (and by its binomial closed form at integer orders), the exact
un-sampled Gaussian at q = 1, PRV below RDP, noise calibration (uniform and scheduled, against Opacus's accountant),
monotonicity, merging and state round trips."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, special

from fedrec.errors import ConfigError
from fedrec.privacy.accountant import (
    GaussianRDPAccountant,
    SampledGaussianAccountant,
    gaussian_rdp_epsilon,
    make_accountant,
    sampled_noise_multiplier,
    scheduled_noise_multiplier,
)

DELTA = 1e-5
ORDERS = list(range(2, 65))
POINTS = [(0.01, 1.1, 1000), (0.1, 2.0, 100), (0.5, 5.0, 20)]  # (sample rate q, noise multiplier σ, steps)

# Opacus warns when the best order is an end of the grid; the extremes of the property tests get there on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:Optimal order is the:UserWarning")


def _log_mixture_ratio(x: np.ndarray | float, q: float, sigma: float) -> np.ndarray | float:
    """log of μ(x)/μ0(x) = (1 − q) + q·exp((2x − 1)/(2σ²)) for μ0 = N(0, σ²), μ = (1 − q)μ0 + q·N(1, σ²)."""
    return np.logaddexp(math.log1p(-q), math.log(q) + (2.0 * x - 1.0) / (2.0 * sigma**2))


def log_a_integral(q: float, sigma: float, alpha: int) -> float:
    """log A_α, A_α = E_{x~N(0,σ²)}[(μ(x)/μ0(x))^α], by quadrature of the integrand scaled by its maximum.

    The integrand's mass lies between x = 0 (the unsampled component) and x ≈ α (the sampled one, weighted by
    exp(α(2x−1)/(2σ²))): both, and the maximum found on a fine grid, are break points for quad on a range that
    leaves 40σ on either side."""
    def log_f(x: np.ndarray | float) -> np.ndarray | float:
        return -x * x / (2 * sigma**2) - math.log(sigma * math.sqrt(2 * math.pi)) + alpha * _log_mixture_ratio(
            x, q, sigma)

    lo, hi = -40.0 * sigma, alpha + 40.0 * sigma
    grid = np.linspace(lo, hi, 200_001)
    vals = log_f(grid)
    peak, top = float(grid[np.argmax(vals)]), float(vals.max())
    total, err = integrate.quad(lambda x: math.exp(log_f(x) - top), lo, hi, points=sorted({0.0, peak, float(alpha)}),
                                limit=500, epsabs=0.0, epsrel=1e-13)
    assert err <= 1e-10 * total
    return top + math.log(total)


def log_a_binomial(q: float, sigma: float, alpha: int) -> float:
    """log A_α = log Σ_k C(α,k)(1−q)^{α−k} q^k exp((k²−k)/(2σ²)) for integer α, summed with log-sum-exp."""
    k = np.arange(alpha + 1)
    log_terms = (special.gammaln(alpha + 1) - special.gammaln(k + 1) - special.gammaln(alpha - k + 1)
                 + (alpha - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * sigma**2))
    return float(special.logsumexp(log_terms))


def epsilon_from_rdp(rdp: dict[int, float], delta: float) -> float:
    """Balle et al. 2020 (Thm. 21): ε = min_α rdp(α) + log((α−1)/α) − (log δ + log α)/(α−1)."""
    return min(r + math.log((a - 1) / a) - (math.log(delta) + math.log(a)) / (a - 1) for a, r in rdp.items())


@pytest.fixture(scope="module")
def reference() -> dict[tuple[float, float, int], float]:
    """Integer-order (2..64) reference ε at δ = 1e-5 of each point, by numerical integration."""
    return {(q, s, n): epsilon_from_rdp({a: n * log_a_integral(q, s, a) / (a - 1) for a in ORDERS}, DELTA)
            for q, s, n in POINTS}


def _eps(q: float, sigma: float, steps: int, accountant: str = "rdp", **kw: object) -> float:
    acc = SampledGaussianAccountant(DELTA, accountant, **kw)
    acc.step(sigma, steps, q)
    return acc.epsilon()


# ---- the RDP of the subsampled Gaussian against numerical integration ----------------------------------------


@pytest.mark.parametrize(("q", "sigma"), [(0.01, 1.1), (0.1, 2.0), (0.5, 5.0), (0.3, 0.7)])
def test_integral_and_binomial_forms_of_a_alpha_agree(q: float, sigma: float) -> None:
    for alpha in (2, 3, 8, 17, 40, 64):
        assert log_a_integral(q, sigma, alpha) == pytest.approx(log_a_binomial(q, sigma, alpha), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("point", POINTS)
def test_rdp_epsilon_at_integer_orders_matches_the_integral_reference(point: tuple, reference: dict) -> None:
    q, sigma, steps = point
    assert _eps(q, sigma, steps, alphas=ORDERS) == pytest.approx(reference[point], rel=1e-8)


@pytest.mark.parametrize("point", POINTS)
def test_default_orders_are_no_worse_than_the_integer_orders(point: tuple, reference: dict) -> None:
    q, sigma, steps = point
    assert 0.0 < _eps(q, sigma, steps) <= reference[point] * (1 + 1e-9)


@pytest.mark.parametrize(("sigma", "steps"), [(1.1, 10), (2.0, 100), (5.0, 20), (20.0, 1000)])
def test_full_participation_is_the_unsampled_gaussian(sigma: float, steps: int) -> None:
    exact = gaussian_rdp_epsilon(steps / (2 * sigma**2), DELTA)  # best real order, no grid
    ours = _eps(1.0, sigma, steps)
    assert exact <= ours * (1 + 1e-12) and ours <= 1.03 * exact
    assert _eps(1.0, sigma, steps, "prv") <= ours + 0.01  # q = 1 has log(1 − q) = −inf inside PRV: still fine


@pytest.mark.parametrize("point", POINTS)
def test_prv_is_below_rdp(point: tuple) -> None:
    q, sigma, steps = point
    prv, rdp = _eps(q, sigma, steps, "prv"), _eps(q, sigma, steps, "rdp")
    assert 0.0 < prv <= rdp + 0.01


def test_sampling_amplifies() -> None:
    """Sampling at q < 1 spends well under the un-sampled ε of the same noise and rounds."""
    assert _eps(0.01, 1.1, 1000) < 0.1 * _eps(1.0, 1.1, 1000)


# ---- noise calibration ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def calibrated() -> dict[tuple[str, float], float]:
    return {(acc, q): sampled_noise_multiplier(2.0, DELTA, q, 100, acc) for acc in ("rdp", "prv") for q in (0.05, 0.2)}


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
@pytest.mark.parametrize("q", [0.05, 0.2])
def test_calibrated_noise_spends_the_budget_to_the_tolerance(accountant: str, q: float, calibrated: dict) -> None:
    eps = _eps(q, calibrated[accountant, q], 100, accountant)
    assert 2.0 - 0.01 <= eps <= 2.0


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_less_sampling_needs_less_noise(accountant: str, calibrated: dict) -> None:
    assert 0.0 < calibrated[accountant, 0.05] < calibrated[accountant, 0.2]


def test_prv_needs_no_more_noise_than_rdp(calibrated: dict) -> None:
    for q in (0.05, 0.2):
        assert calibrated["prv", q] <= calibrated["rdp", q] * 1.01


@pytest.mark.parametrize(("q", "schedule"), [(1.0, [2.0] * 5 + [1.0] * 5), (0.2, [3.0, 1.5, 1.0, 1.0] * 10),
                                           (0.05, [1.0] * 60 + [0.5] * 40)])
def test_a_scheduled_calibration_spends_the_budget_round_by_round(q: float, schedule: list[float]) -> None:
    """Rounds at z · g_t, composed one by one in Opacus's own RDPAccountant, spend ε to the tolerance."""
    from opacus.accountants import RDPAccountant

    z = scheduled_noise_multiplier(2.0, DELTA, q, schedule)
    acc = RDPAccountant()
    for g in schedule:
        acc.step(noise_multiplier=z * g, sample_rate=q)
    assert 2.0 - 0.01 <= acc.get_epsilon(delta=DELTA) <= 2.0


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_a_schedule_of_ones_is_the_uniform_calibration(accountant: str, calibrated: dict) -> None:
    z = scheduled_noise_multiplier(2.0, DELTA, 0.2, [1.0] * 100, accountant)
    assert 2.0 - 0.01 <= _eps(0.2, z, 100, accountant) <= 2.0
    assert z == pytest.approx(calibrated[accountant, 0.2], rel=0.01)


def test_a_scheduled_calibration_checks_its_factors() -> None:
    with pytest.raises(ConfigError, match="^schedule must"):
        scheduled_noise_multiplier(1.0, DELTA, 0.1, [1.0, 0.0])
    with pytest.raises(ConfigError, match="^schedule: no rounds"):
        scheduled_noise_multiplier(1.0, DELTA, 0.1, [])


@pytest.mark.parametrize(("kw", "field"), [
    (dict(epsilon=0.0), "epsilon"), (dict(delta=1.0), "delta"), (dict(sample_rate=0.0), "sample_rate"),
    (dict(sample_rate=1.5), "sample_rate"), (dict(rounds=0), "rounds"), (dict(accountant="gdp"), "accountant"),
    (dict(epsilon_tolerance=0.0), "epsilon_tolerance"),
])
def test_calibration_checks_its_arguments(kw: dict, field: str) -> None:
    args = dict(epsilon=1.0, delta=DELTA, sample_rate=0.1, rounds=10) | kw
    with pytest.raises(ConfigError, match=rf"^{field} must"):
        sampled_noise_multiplier(**args)


# ---- properties ----------------------------------------------------------------------------------------------

_q = st.floats(0.001, 1.0)
_sigma = st.floats(0.6, 20.0)
_steps = st.integers(1, 500)


@settings(max_examples=25, deadline=None)
@given(q=_q, sigma=_sigma, steps=_steps, more=st.integers(1, 500))
def test_epsilon_grows_with_steps(q: float, sigma: float, steps: int, more: int) -> None:
    assert _eps(q, sigma, steps, alphas=ORDERS) <= _eps(q, sigma, steps + more, alphas=ORDERS)


@settings(max_examples=25, deadline=None)
@given(q=_q, q2=_q, sigma=_sigma, steps=_steps)
def test_epsilon_grows_with_the_sample_rate(q: float, q2: float, sigma: float, steps: int) -> None:
    lo, hi = sorted((q, q2))
    assert _eps(lo, sigma, steps, alphas=ORDERS) <= _eps(hi, sigma, steps, alphas=ORDERS)


@settings(max_examples=25, deadline=None)
@given(q=_q, sigma=_sigma, sigma2=_sigma, steps=_steps)
def test_epsilon_shrinks_with_the_noise(q: float, sigma: float, sigma2: float, steps: int) -> None:
    lo, hi = sorted((sigma, sigma2))
    assert _eps(q, hi, steps, alphas=ORDERS) <= _eps(q, lo, steps, alphas=ORDERS)


@pytest.mark.parametrize("point", POINTS)
def test_strictly_monotone_at_the_reference_points(point: tuple) -> None:
    q, sigma, steps = point
    base = _eps(q, sigma, steps)
    assert _eps(q, sigma, steps + 1) > base
    assert _eps(min(1.0, 1.5 * q), sigma, steps) > base
    assert _eps(q, 1.5 * sigma, steps) < base


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_equal_rounds_merge(accountant: str) -> None:
    merged, single = SampledGaussianAccountant(DELTA, accountant), SampledGaussianAccountant(DELTA, accountant)
    merged.step(1.3, 3, 0.1)
    for _ in range(3):
        single.step(1.3, 1, 0.1)
    assert merged.state_dict() == single.state_dict()
    assert merged.state_dict()["history"] == [(1.3, 0.1, 3)] and merged.rounds == single.rounds == 3
    assert merged.epsilon() == single.epsilon() > 0.0


def test_composition_is_order_free_and_keeps_distinct_rates_apart() -> None:
    a, b = SampledGaussianAccountant(DELTA), SampledGaussianAccountant(DELTA)
    a.step(1.3, 2, 0.1)
    a.step(1.3, 1, 0.2)
    a.step(1.3, 1, 0.1)
    b.step(1.3, 1, 0.2)
    b.step(1.3, 3, 0.1)
    assert a.state_dict()["history"] == b.state_dict()["history"] == [(1.3, 0.1, 3), (1.3, 0.2, 1)]
    assert a.epsilon() == b.epsilon() and a.rounds == 4


def test_epsilon_after_records_nothing() -> None:
    acc = SampledGaussianAccountant(DELTA)
    assert acc.epsilon() == 0.0 and acc.rounds == 0
    acc.step(1.1, 10, 0.05)
    before, state = acc.epsilon(), acc.state_dict()
    after = acc.epsilon_after(1.1, 5, 0.05)
    assert acc.state_dict() == state and acc.epsilon() == before < after
    acc.step(1.1, 5, 0.05)
    assert acc.epsilon() == after


def test_epsilon_at_another_delta() -> None:
    acc = SampledGaussianAccountant(DELTA)
    acc.step(2.0, 100, 0.1)
    assert acc.epsilon(1e-3) < acc.epsilon() == acc.epsilon(DELTA) < acc.epsilon(1e-8)
    with pytest.raises(ConfigError, match="^delta must"):
        acc.epsilon(0.0)


# ---- validation, registry, state -----------------------------------------------------------------------------


@pytest.mark.parametrize(("kw", "field"), [
    (dict(delta=0.0), "delta"), (dict(delta=1.0), "delta"), (dict(delta=math.nan), "delta"),
    (dict(accountant="gdp"), "accountant"), (dict(alphas=[1.0, 2.0]), "alphas"),
])
def test_constructor_checks_its_arguments(kw: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{field} must"):
        SampledGaussianAccountant(**(dict(delta=DELTA) | kw))


@pytest.mark.parametrize(("args", "field"), [
    ((0.0, 1, 0.1), "noise_multiplier"), ((-1.0, 1, 0.1), "noise_multiplier"),
    ((math.inf, 1, 0.1), "noise_multiplier"), ((math.nan, 1, 0.1), "noise_multiplier"),
    ((1.0, 0, 0.1), "count"), ((1.0, 1.5, 0.1), "count"), ((1.0, 1, 0.0), "sample_rate"),
    ((1.0, 1, 1.01), "sample_rate"), ((1.0, 1, math.nan), "sample_rate"),
])
def test_step_checks_its_arguments(args: tuple, field: str) -> None:
    acc = SampledGaussianAccountant(DELTA)
    for call in (acc.step, acc.epsilon_after):
        with pytest.raises(ConfigError, match=rf"^{field} must"):
            call(*args)
    assert acc.rounds == 0


def test_registered_by_name() -> None:
    acc = make_accountant("sampled_gaussian", delta=DELTA, accountant="prv")
    assert isinstance(acc, SampledGaussianAccountant) and acc.accountant == "prv" and acc.delta == DELTA


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_state_round_trip(accountant: str) -> None:
    acc = SampledGaussianAccountant(DELTA, accountant)
    acc.step(1.1, 50, 0.05)
    acc.step(2.0, 10, 1.0)
    state = acc.state_dict()
    assert state == {"kind": "sampled_gaussian", "accountant": accountant, "delta": DELTA,
                     "history": [(1.1, 0.05, 50), (2.0, 1.0, 10)]}
    fresh = SampledGaussianAccountant(DELTA, accountant)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state and fresh.rounds == 60 and fresh.epsilon() == acc.epsilon() > 0.0


def test_load_refuses_another_ledger() -> None:
    acc = SampledGaussianAccountant(DELTA)
    acc.step(1.1, 50, 0.05)
    state = acc.state_dict()
    other = GaussianRDPAccountant(DELTA)
    other.step(1.1, 50)
    target = SampledGaussianAccountant(DELTA)
    target.step(3.0, 1, 0.5)
    kept = target.state_dict()
    for bad, field in [(other.state_dict(), "kind"), (state | {"accountant": "prv"}, "accountant"),
                       (state | {"delta": 1e-6}, "delta")]:
        with pytest.raises(ConfigError, match=rf"^cannot load .*: {field} is "):
            target.load_state_dict(bad)
    with pytest.raises(ConfigError, match="^sample_rate must"):
        target.load_state_dict(state | {"history": [(1.1, 0.05, 50), (1.1, 2.0, 1)]})
    assert target.state_dict() == kept


@pytest.mark.parametrize("history", [[(1.1, 0.01, 1000)], [(0.9, 0.3, 7)], [(1.1, 0.01, 1000), (2.0, 0.1, 100)]])
def test_rdp_epsilon_is_opacus_rdp_accountants_float_for_float(history: list[tuple[float, float, int]]) -> None:
    """The ledger's cached one-round curves times the counts equal Opacus's RDPAccountant exactly."""
    from opacus.accountants import RDPAccountant

    reference = RDPAccountant()
    reference.history = list(history)
    ledger = SampledGaussianAccountant(1e-5)
    for z, q, n in history:
        ledger.step(z, n, q)
    assert ledger.epsilon() == reference.get_epsilon(delta=1e-5)

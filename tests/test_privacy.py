"""Client-level DP: noise scale, clipping, calibration, accounting against Opacus, budget enforcement, resume."""
from __future__ import annotations

import io
import math
import subprocess
import sys
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch
from scipy.optimize import brentq

from fedrec.errors import ConfigError
from fedrec.privacy import (
    ClientAccountant,
    GaussianMechanism,
    LaplaceMechanism,
    PrivacyBudgetExceeded,
    analytic_gaussian_delta,
    analytic_gaussian_noise_multiplier,
    classical_gaussian_noise_multiplier,
    opacus_accountant,
    rdp_noise_multiplier,
    uniform_epsilon_per_round,
    uniform_noise_multiplier,
)
from fedrec.utils.seeding import torch_generator

MECHANISMS = [GaussianMechanism, LaplaceMechanism]


def _updates(n: int, d: int, seed: int, dtype=torch.float64, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(n, d, generator=g, dtype=dtype)


# ---- noise is really added, at the calibrated scale ---------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gaussian_noise_has_calibrated_std_per_client(dtype):
    mech = GaussianMechanism(clip=0.1)
    assert mech.sensitivity == pytest.approx(0.2)
    n, d = 200, 1000
    # two per-round budgets in one batch: ε_t = 0.1 for the first half of the clients, 1.0 for the second
    z = torch.tensor([mech.noise_multiplier_for(0.1, 1e-7), mech.noise_multiplier_for(1.0, 1e-7)], dtype=torch.float64)
    level = torch.where(torch.arange(n) < n // 2, z[0], z[1])
    noisy, clipped = mech.privatize(_updates(n, d, 0, dtype, scale=5.0), level, torch_generator(0, "privacy", 0))
    noise = (noisy - clipped).double()
    for rows, sigma in ((slice(0, n // 2), float(z[0]) * 0.2), (slice(n // 2, n), float(z[1]) * 0.2)):
        block = noise[rows]
        assert block.std().item() == pytest.approx(sigma, rel=0.05)
        assert abs(block.mean().item()) < 0.02 * sigma
    assert torch.allclose(mech.noise_std(level), level * 0.2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_laplace_noise_has_calibrated_std_and_mean_absolute_deviation(dtype):
    mech = LaplaceMechanism(clip=0.1)
    n, d, eps = 200, 1000, 0.5
    b = mech.scale_for(eps)
    assert b == pytest.approx(2 * 0.1 / eps)
    gen = torch_generator(0, "privacy", 1)
    noisy, clipped = mech.privatize(_updates(n, d, 1, dtype, scale=5.0), mech.calibrate(eps), gen)
    noise = (noisy - clipped).double()
    assert noise.std().item() == pytest.approx(b * math.sqrt(2), rel=0.05)
    assert noise.abs().mean().item() == pytest.approx(b, rel=0.05)  # E|Lap(0, b)| = b: Laplace, not Gaussian
    assert abs(noise.mean().item()) < 0.02 * b * math.sqrt(2)
    assert torch.isfinite(noise).all()
    assert mech.noise_std(eps).item() == pytest.approx(b * math.sqrt(2))


@pytest.mark.parametrize("mech_cls", MECHANISMS)
def test_noise_is_reproducible_from_the_generator_seed(mech_cls):
    mech = mech_cls(clip=1.0)
    u = _updates(7, 33, 2, torch.float32)
    a, _ = mech.privatize(u, 0.7, torch_generator(5, "privacy", 3))
    b, _ = mech.privatize(u, 0.7, torch_generator(5, "privacy", 3))
    c, _ = mech.privatize(u, 0.7, torch_generator(5, "privacy", 4))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


@pytest.mark.parametrize("mech_cls", MECHANISMS)
@pytest.mark.parametrize("level", [0.0, -1.0, math.inf, math.nan])
def test_a_noiseless_or_invalid_level_cannot_be_used(mech_cls, level):
    mech = mech_cls(clip=1.0)
    with pytest.raises(ConfigError, match=mech.level_name):
        mech.privatize(_updates(3, 4, 0), level, torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match=mech.level_name):
        mech.privatize(_updates(3, 4, 0), torch.tensor([1.0, level, 1.0]), torch.Generator().manual_seed(0))
    with pytest.raises(ConfigError, match="epsilon"):
        mech.calibrate(math.inf if level == 0.0 else level, 1e-5)


def test_privatize_rejects_non_finite_or_wrongly_shaped_updates():
    mech = GaussianMechanism(clip=1.0)
    g = torch.Generator().manual_seed(0)
    bad = _updates(3, 4, 0)
    bad[1, 2] = math.inf
    with pytest.raises(ValueError, match="non-finite"):
        mech.privatize(bad, 1.0, g)
    with pytest.raises(ValueError, match="2-D"):
        mech.privatize(torch.ones(4), 1.0, g)
    with pytest.raises(ConfigError, match="noise_multiplier"):
        mech.privatize(_updates(3, 4, 0), torch.ones(2), g)


# ---- clipping -----------------------------------------------------------------------------------------------


# The exact clipping bound over adversarial inputs (huge, tiny, denormal, mixed-sign rows, many parts) is
# tests/test_privacy_hardening.py::test_clipping_bound_holds_exactly_on_adversarial_uploads.


def test_privatize_returns_the_clipped_update_it_noised():
    mech = GaussianMechanism(clip=0.5)
    u = _updates(10, 20, 3, scale=2.0)
    _, clipped = mech.privatize(u, 1.0, torch.Generator().manual_seed(0))
    assert torch.equal(clipped, mech.clip_rows(u))
    assert (torch.linalg.vector_norm(clipped, dim=1) <= 0.5).all()  # float64 updates, no tolerance


# ---- calibration --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.01, 0.1, 0.5, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-10])
def test_analytic_gaussian_sigma_meets_the_delta_condition_with_equality(epsilon, delta):
    clip = 0.1
    mech = GaussianMechanism(clip=clip)
    sigma, big_delta = mech.sigma_for(epsilon, delta), 2 * clip
    mpmath.mp.dps = 40  # independent high-precision evaluation of Balle & Wang's condition, in σ and Δ
    s, D, e = mpmath.mpf(sigma), mpmath.mpf(big_delta), mpmath.mpf(epsilon)
    lhs = mpmath.ncdf(D / (2 * s) - e * s / D) - mpmath.exp(e) * mpmath.ncdf(-D / (2 * s) - e * s / D)
    assert abs(float(lhs) - delta) <= 1e-9 * delta
    assert analytic_gaussian_delta(sigma / big_delta, epsilon) == pytest.approx(delta, rel=1e-9)
    # minimal: slightly less noise violates δ
    assert analytic_gaussian_delta(sigma / big_delta * (1 - 1e-6), epsilon) > delta
    if epsilon <= 1.0:
        assert sigma < classical_gaussian_noise_multiplier(epsilon, delta) * big_delta


def test_rdp_noise_multiplier_inverts_the_gaussian_rdp_curve():
    z = rdp_noise_multiplier(0.1, alpha=5.0)
    assert 5.0 / (2 * z * z) == pytest.approx(0.1)


# ---- accounting ---------------------------------------------------------------------------------------------


def _random_schedule(num_clients: int, rounds: int, seed: int, levels=(3.0, 5.0, 8.0)):
    g = torch.Generator().manual_seed(seed)
    lv = torch.tensor(levels, dtype=torch.float64)
    out = []
    for _ in range(rounds):
        pick = lv[torch.randint(len(levels), (num_clients,), generator=g)]
        part = torch.rand(num_clients, generator=g) < 0.7
        out.append((pick, part))
    return out


@pytest.mark.parametrize("name", ["rdp", "prv"])
def test_gaussian_epsilon_equals_opacus_for_the_same_heterogeneous_history(name):
    n = 6 if name == "rdp" else 3
    acc = ClientAccountant(n, "gaussian", name, epsilon_total=1e6, delta_total=1e-5)
    sched = _random_schedule(n, 15, seed=4)
    for levels, part in sched:
        acc.step(levels, part)
    spent = acc.spent()
    for c in range(n):
        ref = opacus_accountant(name)  # Opacus's own accountant, stepped round by round
        for levels, part in sched:
            if part[c]:
                ref.step(noise_multiplier=float(levels[c]), sample_rate=1.0)
        assert acc.history(c) == ref.history
        with np.errstate(divide="ignore"):  # Opacus's PRV takes log(1 - q) at q = 1
            assert spent[c].item() == pytest.approx(ref.get_epsilon(delta=1e-5), rel=1e-9)


def test_full_participation_accounting_matches_the_exact_gaussian_composition():
    # T Gaussian rounds at noise multiplier z with sample_rate 1 are one Gaussian at z/√T: exact ε is known.
    z, T, delta = 3.0, 30, 1e-5
    exact = brentq(lambda e: analytic_gaussian_delta(z / math.sqrt(T), e) - delta, 1e-9, 100)
    for name, slack in (("rdp", 1.0), ("prv", 0.05)):
        acc = ClientAccountant(1, "gaussian", name, epsilon_total=1e6, delta_total=delta)
        for _ in range(T):
            acc.step(z)
        eps = acc.spent().item()
        assert exact <= eps <= exact + slack, (name, eps, exact)


def test_identical_histories_cost_one_evaluation():
    acc = ClientAccountant(943, "gaussian", "rdp", epsilon_total=10.0, delta_total=1e-5)
    for t in range(20):
        acc.step(4.0 + t % 3)
    assert len(acc._eps_cache) <= 1 + 20  # one canonical history per round at most, not per client
    assert len(acc._keys) == 21


def test_laplace_basic_composition_sums():
    n = 5
    acc = ClientAccountant(n, "laplace", epsilon_total=100.0)
    sched = _random_schedule(n, 25, seed=5, levels=(0.1, 0.25, 0.3))
    for levels, part in sched:
        acc.step(levels, part)
    expected = [sum((Fraction(float(lv[c])) for lv, p in sched if p[c]), Fraction(0)) for c in range(n)]
    spent = acc.spent()
    for c in range(n):
        assert Fraction(spent[c].item()) >= expected[c]  # rounded up, never under-reported
        assert spent[c].item() == pytest.approx(float(expected[c]), rel=1e-15)
    assert acc.delta == 0.0


@pytest.mark.parametrize("total", [10.0, 1.0, 3.3, 0.7, 8.9])
@pytest.mark.parametrize("rounds", [3, 7, 10, 49, 100])
def test_laplace_uniform_split_runs_every_round_without_overspending(total, rounds):
    e = uniform_epsilon_per_round(total, rounds)
    assert e == pytest.approx(total / rounds, rel=1e-12)
    acc = ClientAccountant(2, "laplace", epsilon_total=total)
    for _ in range(rounds):
        assert not acc.would_exceed(e).any()
        acc.step(e)
    assert (acc.spent() <= total).all()
    assert acc.would_exceed(e).all()


def test_uniform_noise_multiplier_spends_just_under_the_total_in_exactly_the_planned_rounds():
    z = uniform_noise_multiplier(10.0, 1e-5, 100, accountant="rdp")
    acc = ClientAccountant(943, "gaussian", "rdp", epsilon_total=10.0, delta_total=1e-5)
    for _ in range(100):
        run = acc.admissible(z)
        assert run.all()
        acc.step(z, run)
    assert 10.0 - 0.01 <= acc.spent().max().item() <= 10.0
    assert acc.would_exceed(z).all()  # a 101st round is refused
    assert acc.admissible(z).sum().item() == 0
    # far less noise than calibrating each round at (ε/T, δ/T) with basic composition
    assert z < analytic_gaussian_noise_multiplier(10.0 / 100, 1e-5 / 100) / 5


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_would_exceed_agrees_with_spent_after_stepping(mechanism):
    n = 40
    g = torch.Generator().manual_seed(6)
    totals = 1.0 + 4.0 * torch.rand(n, generator=g, dtype=torch.float64)
    acc = ClientAccountant(n, mechanism, epsilon_total=totals, delta_total=1e-5)
    levels = (1.0, 2.0, 4.0) if mechanism == "gaussian" else (0.2, 0.5, 0.9)
    for proposed, part in _random_schedule(n, 12, seed=7, levels=levels):
        before = acc.spent()
        after = acc.epsilon_after(proposed, part)
        exceed = acc.would_exceed(proposed, part)
        run = acc.admissible(proposed, part)
        assert torch.equal(run, part & ~exceed)
        acc.step(proposed, run)
        spent = acc.spent()
        assert torch.equal(spent[run], after[run])
        assert torch.equal(spent[~run], before[~run])
        assert torch.equal(exceed, part & (after > totals))
        assert (spent <= totals).all()


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_randomised_run_never_overspends_including_the_last_round(mechanism):
    n, rounds = 60, 80
    g = torch.Generator().manual_seed(8)
    totals = 0.5 + 2.0 * torch.rand(n, generator=g, dtype=torch.float64)
    acc = ClientAccountant(n, mechanism, epsilon_total=totals, delta_total=1e-5)
    levels = (2.0, 3.0, 6.0, 12.0) if mechanism == "gaussian" else (0.05, 0.1, 0.2, 0.4)
    ran = torch.zeros(n, dtype=torch.long)
    for proposed, part in _random_schedule(n, rounds, seed=9, levels=levels):
        run = acc.admissible(proposed, part)
        acc.step(proposed, run)
        ran += run.long()
        assert (acc.spent() <= totals).all()
    assert (acc.spent() > 0.5 * totals).all()  # budgets were actually used up, not trivially respected
    assert (ran < rounds).all()


def test_step_refuses_a_round_that_would_exceed_and_records_nothing():
    acc = ClientAccountant(3, "laplace", epsilon_total=1.0)
    acc.step(0.6)
    before = acc.state_dict()
    with pytest.raises(PrivacyBudgetExceeded, match="client 0"):
        acc.step(0.6)
    assert acc.rounds == 1
    assert torch.equal(acc.state_dict()["history"], before["history"])
    acc.step(torch.tensor([0.1, 0.4, 1.0], dtype=torch.float64), torch.tensor([True, True, False]))
    assert acc.spent().tolist() == pytest.approx([0.7, 1.0, 0.6])


@pytest.mark.parametrize("mechanism,name", [("gaussian", "rdp"), ("gaussian", "prv"), ("laplace", "rdp")])
def test_state_dict_round_trip_gives_identical_epsilon(mechanism, name):
    n = 3 if name == "prv" else 8  # PRV costs ~0.1 s per distinct history
    levels = (3.0, 5.0) if mechanism == "gaussian" else (0.1, 0.3)
    sched = _random_schedule(n, 10, seed=10, levels=levels)
    full = ClientAccountant(n, mechanism, name, epsilon_total=50.0, delta_total=1e-6)
    half = ClientAccountant(n, mechanism, name, epsilon_total=50.0, delta_total=1e-6)
    for i, (lv, part) in enumerate(sched):
        full.step(lv, part)
        if i < 5:
            half.step(lv, part)
    buf = io.BytesIO()
    torch.save(half.state_dict(), buf)
    buf.seek(0)
    resumed = ClientAccountant(n, mechanism, name, epsilon_total=50.0, delta_total=1e-6)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    assert torch.equal(resumed.spent(), half.spent())
    for lv, part in sched[5:]:
        resumed.step(lv, part)
    assert resumed.rounds == full.rounds == 10
    assert torch.equal(resumed.spent(), full.spent())
    assert all(resumed.history(c) == full.history(c) for c in range(n))


def test_loading_a_mismatched_state_is_rejected_by_field():
    acc = ClientAccountant(4, "gaussian", "rdp", epsilon_total=10.0, delta_total=1e-5)
    acc.step(3.0)
    with pytest.raises(ConfigError, match="accountant"):
        ClientAccountant(4, "gaussian", "prv", epsilon_total=10.0, delta_total=1e-5).load_state_dict(acc.state_dict())
    with pytest.raises(ConfigError, match="num_clients"):
        ClientAccountant(5, "gaussian", "rdp", epsilon_total=10.0, delta_total=1e-5).load_state_dict(acc.state_dict())
    with pytest.raises(ConfigError, match="epsilon_total"):
        ClientAccountant(4, "gaussian", "rdp", epsilon_total=9.0, delta_total=1e-5).load_state_dict(acc.state_dict())


# ---- bad input, named -------------------------------------------------------------------------------------


@pytest.mark.parametrize("clip", [0.0, -0.1, math.nan, math.inf, "a"])
@pytest.mark.parametrize("mech_cls", MECHANISMS)
def test_bad_clip_is_rejected_by_name(mech_cls, clip):
    with pytest.raises(ConfigError, match="clip"):
        mech_cls(clip=clip)


@pytest.mark.parametrize("epsilon", [0.0, -1.0, math.nan])
def test_bad_epsilon_is_rejected_by_name(epsilon):
    with pytest.raises(ConfigError, match="epsilon"):
        GaussianMechanism.noise_multiplier_for(epsilon, 1e-5)
    with pytest.raises(ConfigError, match="epsilon"):
        LaplaceMechanism(clip=1.0).scale_for(epsilon)
    with pytest.raises(ConfigError, match="epsilon"):
        LaplaceMechanism(clip=1.0).calibrate(epsilon)
    with pytest.raises(ConfigError, match="epsilon_total"):
        ClientAccountant(3, "gaussian", epsilon_total=epsilon, delta_total=1e-5)
    with pytest.raises(ConfigError, match="epsilon_total"):
        uniform_noise_multiplier(epsilon, 1e-5, 10)
    with pytest.raises(ConfigError, match="epsilon_total"):
        uniform_epsilon_per_round(epsilon, 10)


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, 1.5, math.nan])
def test_bad_delta_is_rejected_by_name(delta):
    with pytest.raises(ConfigError, match="delta"):
        GaussianMechanism.noise_multiplier_for(1.0, delta)
    with pytest.raises(ConfigError, match="delta"):
        GaussianMechanism(clip=1.0).calibrate(1.0, delta)
    with pytest.raises(ConfigError, match="delta_total"):
        ClientAccountant(3, "gaussian", epsilon_total=1.0, delta_total=delta)
    with pytest.raises(ConfigError, match="delta_total"):
        uniform_noise_multiplier(1.0, delta, 10)


def test_other_bad_arguments_are_rejected_by_name():
    with pytest.raises(ConfigError, match="mechanism"):
        ClientAccountant(3, "exponential")
    with pytest.raises(ConfigError, match="accountant"):
        ClientAccountant(3, "gaussian", "gdp")
    with pytest.raises(ConfigError, match="num_clients"):
        ClientAccountant(0)
    with pytest.raises(ConfigError, match="sensitivity_factor"):
        GaussianMechanism(clip=1.0, sensitivity_factor=0.0)
    with pytest.raises(ConfigError, match="delta"):
        GaussianMechanism(clip=1.0).calibrate(1.0)
    acc = ClientAccountant(3, "gaussian")
    with pytest.raises(ConfigError, match="noise_multiplier"):
        acc.step(torch.tensor([1.0, 0.0, 1.0]))
    with pytest.raises(ConfigError, match="count must be a"):
        acc.step(1.0, torch.tensor([2, 0, 1]))  # a client takes part in a round once or not at all
    acc.step(torch.tensor([1.0, 0.0, 1.0]), torch.tensor([True, False, True]))  # non-participants' levels unused
    assert acc.spent()[1].item() == 0.0 and acc.spent()[0].item() > 0


def test_import_does_not_pull_lightning_or_opacus():
    code = ("import sys, fedrec.privacy; "
            "print([m for m in ('lightning', 'lightning_fabric', 'pytorch_lightning', 'opacus') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


# ---- the Mechanism / Accountant interfaces on the client-level classes -------------------------------------------


@pytest.mark.parametrize("mech_cls", MECHANISMS)
def test_add_noise_is_privatize_without_clipping(mech_cls):
    from fedrec.privacy import Mechanism

    mech = mech_cls(clip=10.0)
    assert isinstance(mech, Mechanism)
    small = _updates(5, 4, 0, scale=0.1)  # inside the clip ball: privatize leaves it unclipped
    level = torch.tensor([0.5, 1.0, 2.0, 4.0, 8.0], dtype=torch.float64)
    noisy, _ = mech.privatize(small, level, torch_generator(0, "privacy", 3))
    assert torch.equal(mech.add_noise(small, level, torch_generator(0, "privacy", 3)), noisy)
    big = _updates(2000, 50, 1, scale=100.0)
    noise = mech.add_noise(big, 1.0, torch_generator(0, "privacy", 4)) - big  # nothing is clipped
    assert noise.std().item() == pytest.approx(mech.noise_std(1.0).item(), rel=0.03)
    with pytest.raises(ValueError, match="non-finite"):
        mech.add_noise(torch.tensor([[math.nan]]), 1.0, torch_generator(0, "privacy", 5))
    with pytest.raises(ConfigError, match=mech.level_name):
        mech.add_noise(small, 0.0, torch_generator(0, "privacy", 6))


def test_client_accountant_is_a_registered_accountant_with_epsilon_at_any_delta():
    from fedrec.privacy import Accountant, make_accountant

    acc = make_accountant("client", num_clients=3, mechanism="gaussian", epsilon_total=50.0, delta_total=1e-5)
    assert isinstance(acc, ClientAccountant) and isinstance(acc, Accountant)
    acc.step(torch.tensor([2.0, 3.0, 1.0]), torch.tensor([True, True, False]))
    acc.step(2.0)
    assert torch.equal(acc.epsilon(), acc.spent())
    assert torch.equal(acc.epsilon(1e-5), acc.spent())
    other = acc.epsilon(1e-3)
    for c in range(3):
        assert other[c].item() == pytest.approx(opacus_accountant("rdp", acc.history(c)).get_epsilon(1e-3), rel=1e-12)
    assert bool((other < acc.spent()).all())  # a larger δ buys a smaller ε
    lap = make_accountant("client", num_clients=2, mechanism="laplace", epsilon_total=5.0)
    lap.step(0.5)
    assert torch.equal(lap.epsilon(0.1), lap.spent())  # pure ε-DP: δ does not matter
    with pytest.raises(ConfigError, match="delta"):
        acc.epsilon(0.0)


def test_every_accountant_steps_with_the_same_typed_signature():
    """``Accountant.step(level, count)`` is one signature: a mechanism's level and how many runs it had (per client for
    the per-client ledger: 0 or 1), so code written against the interface drives every registered ledger."""
    import inspect

    from fedrec.privacy.accountant import Accountant, ClientAccountant, GaussianRDPAccountant, LaplaceBasicAccountant

    for cls in (GaussianRDPAccountant, LaplaceBasicAccountant, ClientAccountant):
        assert list(inspect.signature(cls.step).parameters) == ["self", "level", "count"], cls
    gauss, lap = GaussianRDPAccountant(delta=1e-5), LaplaceBasicAccountant()
    gauss.step(2.0, 3)
    lap.step(0.5, 3)
    assert gauss.rho == pytest.approx(3 / (2 * 2.0 ** 2), rel=1e-15) and lap.epsilon() == 1.5
    by_mask, by_count = (ClientAccountant(3, "laplace", epsilon_total=10.0) for _ in range(2))
    by_mask.step(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([True, False, True]))
    by_count.step(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1, 0, 1]))
    assert torch.equal(by_mask.epsilon(), by_count.epsilon())
    assert by_mask.epsilon().tolist() == [1.0, 0.0, 3.0]
    assert issubclass(ClientAccountant, Accountant)

"""Privacy audits (fedrec.privacy.audit): the statistics against closed forms and scipy's binomial, soundness on
mechanisms whose ε is known (many seeds), tightness in the white-box setting, power against deliberately broken
privatisers built here, and every real privatiser held to its reported ε."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import binom

import fedrec.privacy.audit as audit_module
from fedrec.errors import ConfigError
from fedrec.privacy import ClientDP, GaussianMechanism
from fedrec.privacy.audit import (
    audit,
    audit_client_dp,
    audit_fclub,
    audit_fed_ucb,
    audit_textbook,
    audit_tree,
    cached_tree_noise,
    clopper_pearson,
    epsilon_from_rates,
    epsilon_lower_bound,
    minimum_trials,
    one_run_epsilon_lower_bound,
)
from fedrec.privacy.tree import fclub_accounted_sigma, fclub_node_sigma, laplace_node_scale
from fedrec.privacy.tree_noise import LAPLACE, cover, node_noise_many
from fedrec.recsys.privatize import privatize_uploads
from fedrec.utils.rng import KeyedRows, stream_key
from tests.helpers import exceedances_allowed

ALPHA = 0.05


# ------------------------------------------------------------------------------------------------ statistics
def test_clopper_pearson_bounds_are_the_binomial_tail_quantiles() -> None:
    k, n, level = np.array([0, 1, 7, 50, 99, 100]), 100, 0.975
    lower, upper = clopper_pearson(k, n, level)
    assert lower[0] == 0.0 and upper[-1] == 1.0
    # P[Bin(n, lower) >= k] = 1 - level, P[Bin(n, upper) <= k] = 1 - level (the exact one-sided bounds)
    np.testing.assert_allclose(binom.sf(k[1:] - 1, n, lower[1:]), 1 - level, rtol=1e-6)
    np.testing.assert_allclose(binom.cdf(k[:-1], n, upper[:-1]), 1 - level, rtol=1e-6)
    assert np.all(lower < k / n + 1e-12) and np.all(upper > k / n - 1e-12)


def test_epsilon_from_rates_is_the_dp_inequality_solved_for_epsilon() -> None:
    np.testing.assert_allclose(epsilon_from_rates(0.5, 0.05), math.log(10))
    np.testing.assert_allclose(epsilon_from_rates(0.5, 0.05, delta=0.25), math.log(5))
    assert epsilon_from_rates(0.04, 0.05) == 0.0  # below the other rate: no evidence
    assert epsilon_from_rates(0.1, 0.05, delta=0.2) == 0.0  # δ covers it


def test_a_perfect_attack_needs_the_minimum_trials_and_fewer_are_a_one_line_error() -> None:
    need = minimum_trials(0.95)
    assert need == 12  # held-out half m = 6: 2·0.025^(1/6) > 1 > 2·0.025^(1/5)
    world = torch.arange(2 * need) >= need
    assert epsilon_lower_bound({"s": world.double()}, world).epsilon_lower > 0
    with pytest.raises(ConfigError, match=r"trials=11 is too few for confidence=0.95") as e:
        epsilon_lower_bound({"s": world[1:-1].double()}, world[1:-1])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("confidence", [0.0, 1.0, 1.5, -0.1])
def test_a_confidence_outside_zero_one_is_a_one_line_error(confidence: float) -> None:
    for call in (lambda: audit_textbook("laplace", 1.0, trials=100, confidence=confidence),
                 lambda: minimum_trials(confidence),
                 lambda: epsilon_lower_bound({"s": torch.zeros(100)}, torch.arange(100) >= 50,
                                             confidence=confidence)):
        with pytest.raises(ConfigError, match="confidence") as e:
            call()
        assert "\n" not in str(e.value)


def test_a_mechanism_that_ignores_its_input_gets_no_bound_beyond_the_confidence() -> None:
    """Both inputs give the same output distribution (ε = 0): thresholds chosen on one half and the bound taken
    on the other may report ε > 0 with probability ≤ α only; choosing on the same trials would do so often."""
    seeds, positive = 100, 0
    for seed in range(seeds):
        world = torch.arange(2000) >= 1000
        noise = torch.from_numpy(KeyedRows(stream_key(seed, "null"), np.arange(2000)).draw("normal", 1)[:, 0])
        positive += epsilon_lower_bound({"s": noise}, world).epsilon_lower > 0
    assert positive <= exceedances_allowed(seeds)


# ----------------------------------------------------------------------------- mechanisms with a known ε
@pytest.mark.parametrize("mechanism,epsilon", [("laplace", 1.0), ("laplace", 4.0), ("gaussian", 1.0),
                                               ("gaussian", 4.0)])
def test_the_bound_stays_below_a_textbook_mechanisms_true_epsilon(mechanism: str, epsilon: float) -> None:
    seeds = 100
    bounds = np.array([audit_textbook(mechanism, epsilon, trials=2_000, seed=s).epsilon_lower for s in range(seeds)])
    assert (bounds > epsilon).sum() <= exceedances_allowed(seeds)
    if mechanism == "gaussian":  # the analytic Gaussian is exactly (ε, δ)-DP at δ = 1e-5: far from reachable
        assert bounds.max() <= epsilon


@pytest.mark.parametrize("mechanism", ["laplace", "gaussian"])
@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_the_white_box_bound_comes_within_a_factor_two_of_the_true_epsilon(mechanism: str, epsilon: float) -> None:
    result = audit_textbook(mechanism, epsilon, trials=100_000, seed=0)
    assert epsilon / 2 <= result.epsilon_lower <= epsilon
    assert result.trials == 100_000 and result.held_out == 50_000 and result.confidence == 0.95


@pytest.mark.slow
@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_ten_million_trials_bring_the_gaussian_bound_within_0_8_of_its_true_epsilon(epsilon: float) -> None:
    """At δ = 1e-5 the Gaussian's ε is attained by events of probability ~1e-4: 10⁷ trials per input (the
    default, drawn in blocks) reach 0.8·ε where 10⁵ reach 0.62–0.67·ε."""
    result = audit_textbook("gaussian", epsilon)
    assert result.trials == 10_000_000
    assert 0.8 * epsilon <= result.epsilon_lower <= epsilon


def test_the_textbook_audit_draws_the_same_trials_in_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trial i is owner i of the keyed stream whatever the block it is drawn in: blocks change nothing."""
    whole = audit_textbook("gaussian", 1.0, trials=5_000)
    monkeypatch.setattr(audit_module, "BLOCK_VALUES", 999)
    assert audit_textbook("gaussian", 1.0, trials=5_000) == whole


def test_the_one_run_bound_holds_on_the_laplace_mechanism_and_is_tight() -> None:
    """Steinke et al.'s one-run audit: 20,000 canaries in one run of ε = 1 Laplace noise, each included with
    probability ½; over seeds the bound exceeds 1 no more often than the confidence allows, and it is near 1."""
    seeds, bounds = 100, []
    for seed in range(seeds):
        u = KeyedRows(stream_key(seed, "one_run"), np.arange(20_000)).draw("uniform", 2)
        included = torch.from_numpy(u[:, 0] < 0.5)
        laplace = -np.sign(u[:, 1] - 0.5) * np.log(1 - 2 * np.abs(u[:, 1] - 0.5))
        bounds.append(one_run_epsilon_lower_bound(included.double() + torch.from_numpy(laplace), included, 10_000))
    bounds = np.array(bounds)
    assert (bounds > 1.0).sum() <= exceedances_allowed(seeds)
    assert bounds.mean() > 0.9


def test_the_one_run_bound_refuses_an_odd_or_too_large_guess_count() -> None:
    scores, included = torch.zeros(10), torch.zeros(10, dtype=torch.bool)
    for guesses in (3, 12):
        with pytest.raises(ConfigError, match="guesses must be even"):
            one_run_epsilon_lower_bound(scores, included, guesses)


def test_the_same_seed_gives_the_same_bound() -> None:
    a, b = audit_textbook("laplace", 1.0, trials=5_000, seed=3), audit_textbook("laplace", 1.0, trials=5_000, seed=3)
    assert a == b
    assert audit_textbook("laplace", 1.0, trials=5_000, seed=4) != a


# ------------------------------------------------------------------------------------------------ client DP
def client_dp(mechanism: str, epsilon: float, adjacency: str = "replace_one", **kw) -> ClientDP:
    factor = 2.0 if adjacency == "replace_one" else 1.0
    return ClientDP(4, mechanism=mechanism, epsilon=epsilon, adjacency=adjacency, sensitivity_factor=factor, **kw)


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
@pytest.mark.parametrize("adjacency", ["replace_one", "add_remove"])
def test_client_dp_uploads_stay_within_their_reported_epsilon(mechanism: str, adjacency: str) -> None:
    dp = client_dp(mechanism, 2.0, adjacency)
    result = audit_client_dp(dp, privatize_uploads, trials=20_000)
    assert result.epsilon_reported == pytest.approx(2.0, rel=1e-6)
    assert result.epsilon_lower <= result.epsilon_reported
    assert result.epsilon_lower >= (1.6 if mechanism == "laplace" else 0.2)  # the canary is the worst case
    assert adjacency in result.threat_model


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_a_run_of_rounds_stays_within_the_accountants_composition(mechanism: str) -> None:
    dp = client_dp(mechanism, 2.0)
    one = audit_client_dp(dp, privatize_uploads, trials=10_000, rounds=1)
    run = audit_client_dp(dp, privatize_uploads, trials=10_000, rounds=4)
    assert run.epsilon_reported == pytest.approx(2.0, rel=1e-2)  # the uniform split over 4 rounds
    assert 0 < run.epsilon_lower <= run.epsilon_reported
    assert run.epsilon_lower <= one.epsilon_lower + 0.1  # the same budget in more rounds is no easier to audit
    assert "4 rounds" in run.threat_model


def test_the_authors_conventions_exceed_their_nominal_epsilon_where_the_accountant_says_so() -> None:
    """Under the authors' conventions every tensor of an upload is clipped and noised at the round's full level:
    a canary with ω of two tensors and two item rows spends 4× the nominal ε (Laplace, basic composition); the
    audit shows more than the nominal 2, and stays within the accountant's 8."""
    dp = client_dp("laplace", 2.0, conventions="authors")
    result = audit_client_dp(dp, privatize_uploads, tensor_sizes=(4, 4), rows=2, trials=20_000)
    assert result.epsilon_nominal == pytest.approx(2.0)
    assert result.epsilon_reported == pytest.approx(8.0)
    assert 2.0 < result.epsilon_lower <= 8.0


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_bgtplanners_nominal_epsilon_ten_is_exceeded_under_the_authors_conventions(mechanism: str) -> None:
    dp = client_dp(mechanism, 10.0, conventions="authors")
    result = audit_client_dp(dp, privatize_uploads, tensor_sizes=(4, 4), rows=2, trials=1_000_000)
    assert result.epsilon_nominal == pytest.approx(10.0)
    assert 10.0 < result.epsilon_lower <= result.epsilon_reported


def test_a_replace_one_audit_exceeds_an_add_remove_sensitivity() -> None:
    """Sensitivity clip (add/remove) claimed, replace-one neighbours audited: the canary moves twice as far."""
    dp = client_dp("laplace", 1.0, "add_remove")
    result = audit_client_dp(dp, privatize_uploads, adjacency="replace_one", trials=20_000)
    assert result.epsilon_lower > 1.5 * result.epsilon_reported


# broken privatisers, built here around the real one or its mechanism (never by changing library code)
def noise_halved(dp, shared, sizes, rows, row_client, budget, clients, key):
    """The real privatiser with its noise scaled by ½ (the canaries are inside the clip ball after clipping, so
    clipping the input first leaves them as they are)."""
    clipped = dp.mechanism.clip_rows(torch.cat([shared, rows.reshape(shared.shape[0], -1)], 1))
    noisy_shared, noisy_rows = privatize_uploads(dp, shared, sizes, rows, row_client, budget, clients, key)
    noisy = torch.cat([noisy_shared, noisy_rows.reshape(shared.shape[0], -1)], 1)
    out = clipped + (noisy - clipped) / 2
    return out[:, :shared.shape[1]], out[:, shared.shape[1]:].reshape(rows.shape)


def clip_after_noise(dp, shared, sizes, rows, row_client, budget, clients, key):
    """Noise the raw upload, then clip: the noise was calibrated to a bound the input did not satisfy."""
    upload = torch.cat([shared, rows.reshape(shared.shape[0], -1)], 1)
    noisy = dp.mechanism.add_noise(upload, dp.levels(budget), KeyedRows(key, clients.numpy(), 0))
    out = dp.mechanism.clip_rows(noisy)
    return out[:, :shared.shape[1]], out[:, shared.shape[1]:].reshape(rows.shape)


def l2_clipped_laplace(dp, shared, sizes, rows, row_client, budget, clients, key):
    """Laplace noise at b = Δ/ε with the upload clipped in L2 instead of L1: the sensitivity taken from the wrong
    norm (the L1 diameter of an L2 ball of radius C in D dimensions is 2C√D, not 2C)."""
    upload = torch.cat([shared, rows.reshape(shared.shape[0], -1)], 1)
    clipped = GaussianMechanism(clip=dp.clip, sensitivity_factor=dp.mechanism.sensitivity_factor).clip_rows(upload)
    out = dp.mechanism.add_noise(clipped, dp.levels(budget), KeyedRows(key, clients.numpy(), 0))
    return out[:, :shared.shape[1]], out[:, shared.shape[1]:].reshape(rows.shape)


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_halving_the_noise_is_caught(mechanism: str) -> None:
    """(The RDP-calibrated Gaussian noise is far above what ε = 2 needs at δ = 1e-5, so halving it needs more
    trials to show.)"""
    dp = client_dp(mechanism, 2.0)
    result = audit_client_dp(dp, noise_halved, trials=100_000)
    assert result.epsilon_lower > result.epsilon_reported


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_clipping_after_the_noise_is_caught(mechanism: str) -> None:
    dp = client_dp(mechanism, 1.0)
    result = audit_client_dp(dp, clip_after_noise, trials=20_000)
    assert result.epsilon_lower > result.epsilon_reported
    assert audit_client_dp(dp, privatize_uploads, trials=20_000).epsilon_lower <= result.epsilon_reported


def test_a_sensitivity_from_the_wrong_norm_is_caught() -> None:
    """A canary spread over the D = 4 values of its upload (L2 norm 10·clip): L1 clipping shrinks it to L1 norm
    clip, L2 clipping leaves L1 norm 2·clip, twice the sensitivity the Laplace noise is calibrated for."""
    dp = client_dp("laplace", 1.0)
    canary = torch.full((4,), 5.0 * dp.clip)
    broken = audit_client_dp(dp, l2_clipped_laplace, tensor_sizes=(4,), rows=0, canary=canary, trials=20_000)
    assert broken.epsilon_lower > broken.epsilon_reported
    real = audit_client_dp(dp, privatize_uploads, tensor_sizes=(4,), rows=0, canary=canary, trials=20_000)
    assert real.epsilon_lower <= real.epsilon_reported


def test_client_dp_audits_repeat_from_their_seed() -> None:
    dp = client_dp("gaussian", 2.0)
    a = audit_client_dp(dp, privatize_uploads, trials=2_000, rounds=2, seed=5)
    assert a == audit_client_dp(dp, privatize_uploads, trials=2_000, rounds=2, seed=5)
    assert a != audit_client_dp(dp, privatize_uploads, trials=2_000, rounds=2, seed=6)


def test_bad_canaries_are_one_line_errors() -> None:
    dp = client_dp("gaussian", 2.0)
    for kw, field in (({"canary": torch.zeros(3)}, "canary"), ({"adjacency": "swap"}, "adjacency"),
                      ({"tensor_sizes": (), "rows": 0}, "empty"), ({"rounds": 0}, "rounds")):
        with pytest.raises(ConfigError, match=field) as e:
            audit_client_dp(dp, privatize_uploads, trials=100, **kw)
        assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------------------------------- trees
@pytest.mark.parametrize("split,horizon", [("paper", 6), ("levels", 8), ("levels", 16)])
def test_fed_ucbs_tree_stays_within_its_reported_epsilon(split: str, horizon: int) -> None:
    result = audit_fed_ucb(1.0, horizon, split, trials=20_000)
    assert result.epsilon_reported == pytest.approx(1.0)
    assert 0.5 < result.epsilon_lower <= result.epsilon_reported


def test_fed_ucbs_paper_split_exceeds_the_configured_epsilon_at_a_power_of_two() -> None:
    """At T = 8 the paper's ε' = ε/⌈log₂ T⌉ = ε/3 meets the 4 nodes of record 1: the accountant says 4/3, and
    the audit shows more than the configured 1 (and no more than 4/3)."""
    result = audit_fed_ucb(1.0, 8, "paper", trials=100_000)
    assert result.epsilon_nominal == 1.0 and result.epsilon_reported == pytest.approx(4 / 3)
    assert 1.0 < result.epsilon_lower <= result.epsilon_reported


def reused_level_zero_noise(scale: float):
    """A broken Fed_UCB tree: every level-0 node reuses node (0, 1)'s noise instead of drawing its own."""
    def noise(key, streams, horizon):
        out = np.zeros((len(streams), horizon, 1))
        for t in range(1, horizon + 1):
            for level, index in cover(t):
                draw = np.empty((len(streams), 1))
                node_noise_many(np.uint64(key), streams, np.full(len(streams), level),
                                np.full(len(streams), 1 if level == 0 else index), LAPLACE, scale, draw)
                out[:, t - 1] += draw
        return out
    return noise


def test_a_reused_tree_node_is_caught() -> None:
    """With node (0, 3) carrying node (0, 1)'s noise, R₁ − (R₃ − R₂) = v₁ − v₃ exactly: the auditor's statistic
    reads the differing reward v₁ off the releases."""
    T, b = 4, laplace_node_scale(1.0, 4, 1.0, "levels")
    out, inn = torch.zeros(T), torch.tensor([1.0, 0.0, 0.0, 0.0])
    difference = {"node_difference": lambda rel: rel[:, 0, 0] - rel[:, 2, 0] + rel[:, 1, 0]}
    broken = audit_tree(out, inn, reused_level_zero_noise(b), kind=LAPLACE, scale=b, statistics=difference,
                        trials=20_000)
    real = audit_tree(out, inn, cached_tree_noise(LAPLACE, b), kind=LAPLACE, scale=b, statistics=difference,
                      trials=20_000)
    assert real.epsilon_lower <= 1.0 < broken.epsilon_lower
    assert broken.statistic == "node_difference"


def test_the_compiled_cached_noise_is_the_sum_of_each_covers_node_noise() -> None:
    """The audit's batched driver of Fed_UCB's cached noise against a direct construction from the node draws."""
    b, streams, T = 2.0, np.arange(5), 7
    got = cached_tree_noise(LAPLACE, b)(np.uint64(11), streams, T)
    for t in range(1, T + 1):
        want = np.zeros((5, 1))
        for level, index in cover(t):
            draw = np.empty((5, 1))
            node_noise_many(np.uint64(11), streams, np.full(5, level), np.full(5, index), LAPLACE, b, draw)
            want += draw
        np.testing.assert_array_equal(got[:, t - 1], want)


@pytest.mark.parametrize("calibration", ["paper", "accountant"])
def test_cdp_fclubs_tree_stays_within_its_reported_epsilon_for_an_added_or_removed_observation(
        calibration: str) -> None:
    sigma = fclub_node_sigma(1.0, 0.1, 7) if calibration == "paper" else fclub_accounted_sigma(1.0, 0.1, 7, 1)
    result = audit_fclub(sigma, 0.1, 7, trials=20_000)
    assert result.epsilon_lower <= result.epsilon_reported <= 1.0
    if calibration == "accountant":
        assert result.epsilon_lower > 0.3


def test_cdp_fclubs_reported_epsilon_does_not_cover_a_replaced_observation() -> None:
    """The accountant takes Δ = ‖[x; y][x; y]ᵀ‖_F ≤ 2 (one observation added or removed); replacing it by an
    orthogonal one of the same norm moves the statistic by 2√2, and the audit proves more than the reported ε."""
    sigma = fclub_accounted_sigma(1.0, 0.1, 7, 1)
    result = audit_fclub(sigma, 0.1, 7, adjacency="replace_one", trials=50_000)
    assert result.epsilon_reported == pytest.approx(1.0, abs=1e-6)
    assert result.epsilon_lower > result.epsilon_reported


def test_a_generic_audit_reports_its_description() -> None:
    result = audit(lambda w: w.double(), {"identity": lambda y: y}, trials=1_000, mechanism="m", threat_model="t",
                   epsilon_reported=1.0)
    assert (result.mechanism, result.threat_model, result.epsilon_reported) == ("m", "t", 1.0)
    assert result.exceeds and result.to_dict()["epsilon_lower"] == result.epsilon_lower

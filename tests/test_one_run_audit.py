"""The one-run audit (Steinke, Nasr & Jagielski, NeurIPS 2023) at δ > 0 (fedrec.privacy.audit): the bound against
its δ = 0 closed form and the paper's printed values, its shape in δ, soundness on mechanisms whose ε is known,
the canary clients' uploads, and whole private FedGNN runs audited in one run: below the accountant's ε as built,
above it with a tenth of the noise."""
from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from scipy.stats import binom

from fedrec.data import synthetic_ratings
from fedrec.data.ratings import RatingData
from fedrec.errors import ConfigError
from fedrec.models import FedGNN
from fedrec.privacy import ClientDP
from fedrec.privacy.audit import clopper_pearson, one_run_epsilon_lower_bound, one_run_p_value
from fedrec.privacy.mechanisms import analytic_gaussian_noise_multiplier
from fedrec.recsys import FedSGD, Strategy
from fedrec.recsys.aggregate import Uploads
from fedrec.recsys.attack import Attack
from fedrec.recsys.canaries import CanaryClients, audit_one_run
from fedrec.tasks import FedRecTask
from fedrec.utils.rng import KeyedRows, stream_key
from tests.helpers import exceedances_allowed

ALPHA = 1.0 - 0.95  # the bound's α at its default confidence, as it computes it


def _scores(seed: int, m: int, noise: Callable[[np.ndarray], np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """m canaries, each included with probability ½, scored by its inclusion (0 or 1) plus ``noise`` of standard
    draws: one mechanism of sensitivity 1 per canary."""
    u = KeyedRows(stream_key(seed, "one_run.included"), np.arange(m)).draw("uniform", 1)[:, 0]
    included = torch.from_numpy(u < 0.5)
    return included.double() + torch.from_numpy(noise(np.arange(m))), included


# ------------------------------------------------------------------------------------------------ the bound
def test_delta_zero_is_the_closed_form_of_before() -> None:
    """δ = 0 (and the default) gives exactly the pure-DP bound as it was computed before δ: the ε whose success
    probability is the Clopper–Pearson lower bound; a δ of 1e-300 takes the bisection and lands on it too."""
    for seed, m, r in ((0, 1000, 200), (1, 1000, 1000), (2, 200, 50)):
        key = stream_key(seed, "noise")
        scores, included = _scores(seed, m, lambda ids, key=key: KeyedRows(key, ids).draw("normal", 1)[:, 0])
        order = torch.argsort(scores, stable=True)
        correct = int(included[order[m - r // 2:]].sum()) + int((~included[order[:r // 2]]).sum())
        p = float(clopper_pearson(correct, r, 0.95)[0])
        before = max(0.0, math.log(p / (1.0 - p)))
        assert before > 0.0
        assert one_run_epsilon_lower_bound(scores, included, r) == before
        assert one_run_epsilon_lower_bound(scores, included, r, delta=0.0) == before
        assert one_run_epsilon_lower_bound(scores, included, r, delta=1e-300) == pytest.approx(before, abs=1e-9)


@pytest.mark.parametrize("m, r, v, delta, printed", [
    (100, 100, 75, 0.0, 0.702),  # Steinke et al., Appendix D's worked examples
    (100, 100, 75, 1e-4, 0.699),
    (1000, 100, 75, 1e-4, 0.673),
    (100_000, 1510, 1439, 1e-5, 2.675),  # their white-box CIFAR-10 audit (printed truncated: 2.6758…)
])
def test_the_bound_reproduces_the_papers_printed_values(m: int, r: int, v: int, delta: float,
                                                        printed: float) -> None:
    """Scores that put exactly v right guesses among r (the rest of the m canaries abstained on) give the bound the
    paper prints for (m, r, v, δ) at 95 %."""
    included = torch.zeros(m, dtype=torch.bool)
    included[m - r // 2:] = True  # the r/2 top scores: included
    included[m - r // 2:m - r // 2 + (r - v)] = False  # … but r − v of them wrongly
    bound = one_run_epsilon_lower_bound(torch.arange(m, dtype=torch.float64), included, r, delta=delta)
    assert abs(bound - printed) < 1e-3


def test_the_p_value_is_the_binomial_tail_plus_the_delta_term_and_rises_with_epsilon() -> None:
    """At δ = 0 the p-value is P[Binomial(r, e^ε/(1 + e^ε)) ≥ v]; the δ term adds 2mδ times the largest mass on
    v − i … v − 1 over i; with 2mδ ≤ 1 the p-value rises with ε, and the bound sits where it crosses α."""
    m, r, v = 1000, 200, 150
    q = 1.0 / (1.0 + math.exp(-1.0))
    assert one_run_p_value(m, r, v, 1.0) == pytest.approx(binom.sf(v - 1, r, q), rel=1e-12)
    masses = [binom.pmf(np.arange(v - i, v), r, q).sum() / i for i in range(1, v + 1)]
    assert one_run_p_value(m, r, v, 1.0, 1e-4) == pytest.approx(binom.sf(v - 1, r, q) + 0.2 * max(masses), rel=1e-9)
    grid = np.linspace(0.0, 6.0, 301)
    for delta in (0.0, 1e-6, 1e-4, 5e-4):
        p = np.array([one_run_p_value(m, r, v, e, delta) for e in grid])
        assert (np.diff(p) >= -1e-15).all()  # nondecreasing up to the last bit of the sums near 1
        scores = torch.arange(m, dtype=torch.float64)
        included = torch.zeros(m, dtype=torch.bool)
        included[m - r // 2:] = True
        included[m - r // 2:m - r // 2 + (r - v)] = False
        bound = one_run_epsilon_lower_bound(scores, included, r, delta=delta)
        assert one_run_p_value(m, r, v, bound + 1e-6, delta) > ALPHA
        if delta == 0.0:  # the closed form: the Clopper–Pearson bound, where the tail is α up to rounding
            assert one_run_p_value(m, r, v, bound) == pytest.approx(ALPHA, rel=1e-9)
        else:  # the bisection keeps p(bound) ≤ α
            assert one_run_p_value(m, r, v, bound, delta) <= ALPHA


def test_the_bound_falls_as_delta_or_the_abstentions_grow() -> None:
    """More δ, or more canaries abstained on at the same δ, only weakens the bound; a δ term as large as the
    binomial tail's room (2mδ near 1) leaves little of it."""
    r, v = 200, 170
    scores = torch.arange(1000, dtype=torch.float64)

    def bound(m: int, delta: float) -> float:
        included = torch.zeros(m, dtype=torch.bool)
        included[m - r // 2:] = True
        included[m - r // 2:m - r // 2 + (r - v)] = False
        return one_run_epsilon_lower_bound(scores[:m], included, r, delta=delta)

    by_delta = [bound(1000, d) for d in (0.0, 1e-9, 1e-7, 1e-5, 1e-4, 1e-3)]
    assert all(a >= b for a, b in zip(by_delta, by_delta[1:]))
    assert by_delta[0] - by_delta[1] < 1e-3 and by_delta[0] - by_delta[-1] > 0.3
    by_m = [bound(m, 1e-4) for m in (200, 500, 1000)]
    assert by_m[0] > by_m[1] > by_m[2]


@pytest.mark.parametrize("mechanism, epsilon, guesses, tight", [
    ("laplace", 1.0, 10_000, 0.9),  # pure ε-DP, so (ε, δ)-DP at every δ; the one-run audit is nearly tight on it
    ("gaussian", 4.0, 200, 0.5),  # the analytic Gaussian at (ε, δ), exact at δ
])
def test_the_delta_bound_holds_on_mechanisms_of_known_epsilon(mechanism: str, epsilon: float, guesses: int,
                                                              tight: float) -> None:
    """20,000 canaries in one run of a sensitivity-1 mechanism of known (ε, δ = 1e-5), over 20 seeds: the bound at
    δ exceeds ε no more often than the confidence allows, is at most the δ = 0 bound, and reaches ``tight``·ε on
    average."""
    delta, seeds, m = 1e-5, 20, 20_000
    sigma = analytic_gaussian_noise_multiplier(epsilon, delta)
    bounds, pure = [], []
    for seed in range(seeds):
        key = stream_key(seed, "one_run.noise")
        if mechanism == "laplace":
            scores, included = _scores(seed, m,
                                       lambda ids, key=key: KeyedRows(key, ids).draw("laplace", 1)[:, 0] / epsilon)
        else:
            scores, included = _scores(seed, m,
                                       lambda ids, key=key: sigma * KeyedRows(key, ids).draw("normal", 1)[:, 0])
        bounds.append(one_run_epsilon_lower_bound(scores, included, guesses, delta=delta))
        pure.append(one_run_epsilon_lower_bound(scores, included, guesses))
    bounds = np.array(bounds)
    assert (bounds > epsilon).sum() <= exceedances_allowed(seeds)
    assert (bounds <= np.array(pure)).all()
    assert bounds.mean() > tight * epsilon


# ------------------------------------------------------------------------------------------------ the canaries
@pytest.fixture(scope="module")
def ratings() -> RatingData:
    """500 clients of one user each, 200 items: room for 400 canaries among 100 honest clients."""
    return synthetic_ratings(500, 200, 10_000, num_clients=500, seed=0, rounds=20)


def test_canaries_upload_their_vector_when_included_and_nothing_when_not(ratings: RatingData) -> None:
    """An included canary's upload is c_i (its ω values and one row per table value, norm as drawn), an excluded
    one's is zero ω and no rows, the honest uploads pass untouched, and no two canaries share a coordinate."""
    canary = CanaryClients(40, coordinates=3, seed=5)
    canary.setup(ratings, seed=0)
    P, I, k = 6, ratings.num_items, 4
    canary.draw_vectors(P, I, k, norm=2.0)
    assert canary.index.unique().numel() == 120
    assert torch.allclose(canary.value.norm(dim=1), torch.full((40,), 2.0, dtype=torch.float64))
    honest = torch.nonzero(~canary.malicious).flatten()[:3]
    clients = torch.cat([honest, canary.ids])
    C = clients.numel()
    up = Uploads(clients, torch.randn(C, P), torch.arange(C).repeat_interleave(2),
                 torch.randint(0, I, (2 * C,)), torch.randn(2 * C, k), None)
    out = canary(up, 0, None, None)
    flat = torch.zeros(C, P + I * k, dtype=torch.float64)
    flat[:, :P] = out.shared.double()
    for c, item, row in zip(out.row_client.tolist(), out.row_item.tolist(), out.rows.double()):
        flat[c, P + item * k:P + (item + 1) * k] += row
    assert torch.equal(out.shared[:3], up.shared[:3])
    assert torch.equal(out.rows[:6], up.rows[:6]) and torch.equal(out.row_item[:6], up.row_item[:6])
    for j in range(40):
        expected = torch.zeros(P + I * k, dtype=torch.float64)
        if bool(canary.included[j]):
            expected[canary.index[j]] = canary.value[j]
        else:
            assert int((out.row_client == 3 + j).sum()) == 0
        assert torch.allclose(flat[3 + j], expected, atol=1e-6)
    assert 0 < int(canary.included.sum()) < 40


# ------------------------------------------------------------------------------------------------ whole runs
def _builder(data: RatingData, noise_factor: float = 1.0) -> Callable[[Attack], FedRecTask]:
    """A private FedGNN run (DP-FedAvg: server-placed noise, Poisson sampling at q = ½, ε = 2 over 20 rounds) with
    the given attack; ``noise_factor`` < 1 plants a bug: the server's noise multiplier scaled after construction,
    which the accountant does not see."""
    def build(attack: Attack) -> FedRecTask:
        torch.manual_seed(0)
        dp = ClientDP(data.num_clients, "gaussian", epsilon=2.0, placement="server", adjacency="add_remove",
                      sensitivity_factor=1.0)
        task = FedRecTask(data, FedGNN(data.num_users, data.num_items, 8), FedSGD(weighting="uniform"), dp,
                          rounds=data.rounds, pseudo_items=5, seed=1, attack=attack,
                          strategy=Strategy(participation="poisson", sample_rate=0.5))
        task.privacy.server.update_multiplier *= noise_factor
        return task
    return build


def test_a_private_run_stays_below_its_reported_epsilon(ratings: RatingData) -> None:
    """400 canary clients in one DP-FedAvg run of 20 rounds: the canaries are detected (the bound is positive) and
    the bound stays below the accountant's ε (0.25 against 1.99 at seed 0; 0.06–0.37 over audit seeds 0–4)."""
    result = audit_one_run(_builder(ratings), 400, guesses=300)
    assert result.guesses == 300 and result.rounds == 20 and result.delta == 1e-5
    assert result.epsilon_reported == pytest.approx(2.0, rel=0.01)
    assert 0.0 < result.epsilon_lower < result.epsilon_reported and not result.exceeds


def test_a_tenth_of_the_noise_is_caught_in_one_run(ratings: RatingData) -> None:
    """The same run with the server's noise multiplier divided by 10 after construction (the accountant still
    reports ε ≈ 2): the one-run bound is above the reported ε (3.46, 296 of 300 guesses right, at seed 0;
    3.32–3.63 over audit seeds 0–4)."""
    result = audit_one_run(_builder(ratings, 0.1), 400, guesses=300)
    assert result.epsilon_reported == pytest.approx(2.0, rel=0.01)
    assert result.exceeds and result.epsilon_lower > result.epsilon_reported


def test_the_one_run_audit_refuses_client_placed_noise(ratings: RatingData) -> None:
    """The audit reads the server's noised sum: client-placed noise, or an odd guess count, is refused."""
    def build(attack: Attack) -> FedRecTask:
        dp = ClientDP(ratings.num_clients, "gaussian", epsilon=2.0)
        return FedRecTask(ratings, FedGNN(ratings.num_users, ratings.num_items, 8), FedSGD(), dp,
                          rounds=ratings.rounds, pseudo_items=5, attack=attack)
    with pytest.raises(ConfigError, match="server-placed DP"):
        audit_one_run(build, 10)
    with pytest.raises(ConfigError, match="guesses must be even"):
        audit_one_run(build, 10, guesses=12)

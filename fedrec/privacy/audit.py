"""Privacy audits: an empirical lower bound on ε, measured on the code that adds the noise, to hold against the ε
an accountant reports (Jagielski, Ullman & Oprea 2020; Nasr et al. 2021, 2023).

An accountant's ε is a proof about the mechanism as written down; an audit checks the mechanism as implemented. A
sensitivity computed on the wrong norm, noise drawn at the wrong shape or scale, clipping applied after the noise,
or one tree node's noise reused for another record each leave the accountant's number unchanged and break the
guarantee; an audit can expose them.

How a bound is obtained (:func:`epsilon_lower_bound`)
    The mechanism runs ``trials`` times on each of two neighbouring inputs, D ("out", world 0) and D' ("in",
    world 1), and a test statistic scores every output. If the mechanism is (ε, δ)-DP, every event E of its output
    satisfies P[E | D'] ≤ e^ε P[E | D] + δ, and the same with D and D' swapped; so
    ε ≥ log((P[E | D'] − δ) / P[E | D]). The audit takes E = {score ≥ t} or {score < t}, bounds the rate in the
    numerator from below and the one in the denominator from above by one-sided Clopper–Pearson bounds at
    1 − α/2 each (α = 1 − confidence), and reports the resulting ε. By the union bound both rate bounds hold
    together with probability ≥ 1 − α, and then the reported ε is below the mechanism's true ε (at that δ).

    The test (statistic, threshold, event and which world is the numerator) is chosen on the first half of each
    world's trials, and the bound is computed once, on the second half, for that single test. Choosing the test on
    the trials the bound is computed from would report the best of many tests, and the confidence would be false.
    The selection half ranks the K candidate tests by their bound at the Bonferroni level 1 − α/(2K), so that a
    threshold far in a tail, whose few counts are lucky by chance, does not win over a well-estimated one (ties,
    e.g. too few trials for that level, go to the bound at 1 − α/2, then to the smoothed odds); the choice only
    affects how tight the bound is, never whether it holds.

Threat model
    Every audit here is white-box with a chosen input: the auditor picks the neighbouring pair (the canary client's
    update, the differing reward or observation) to be the worst case the mechanism must withstand, and sees every
    output the mechanism releases. The statistic is the likelihood ratio of the claimed noise (optimal for a correct
    mechanism), offered beside simpler ones; the selection half picks the best.

Server-placed DP (:func:`audit_server_dp`)
    DP-FedAvg (:mod:`fedrec.privacy.central`) clips every client's whole upload, sums, and adds one Gaussian draw
    to the sum. The canary is a client whose upload is 10·clip on one value, so clipping leaves it on the edge of
    the ball; on D no client uploads anything, on D' the canary takes part in each round with probability q
    (Poisson sampling, as the accountant assumes, drawn by the audit from a stream of its own, so the client
    sampler itself is not under audit). The rounds' sums and noise are the real code's; every round's release is
    seen, and the statistic is the likelihood ratio of the sampled Gaussian mixture summed over rounds. A bound
    above the accountant's ε then means less noise than the accountant credits, or a sum that moves by more than Δ.

What an audit shows and what it cannot
    A bound above the reported ε proves (at the confidence) that the reported ε is wrong for this threat model: a
    bug, or an accountant that assumes another neighbouring relation. A bound at or below it proves nothing about
    privacy: it is a lower bound, only as strong as the pair and the statistic, and with n trials per world no
    audit can certify much more than ε ≈ log(n / log(2/α)).

Floating point
    Released values are floats, and their last bits can differ between the two inputs (the sum 1 + z rounds
    differently from z: Mironov, CCS 2012): a statistic computed to full precision can separate the inputs by
    those bits alone. The tree audit's likelihood ratio did (ε ≥ 3.8 for Fed_UCB where 1.33 is reported: the
    threat-model page lists this vulnerability). Scores are therefore rounded to :data:`SIGNIFICANT_DIGITS`
    digits before any test (a post-processing, so the bound stays valid), and an audit measures the mechanism's
    distributions, not its floating-point arithmetic.

Randomness
    Every draw is counter-based (:mod:`fedrec.utils.rng`): trial i is owner i of a stream keyed by the audit's seed and
    name (for client DP, by round as well), so an audit repeats exactly from its seed.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrec.errors import ConfigError, check_choice, check_float, check_int
from fedrec.privacy.central import ClippedSums, ServerNoise, clipped_sums
from fedrec.privacy.client_dp import ClientDP
from fedrec.privacy.tree import TreeAggregator, fclub_epsilon, laplace_node_scale
from fedrec.privacy.tree_noise import (
    LAPLACE,
    MAX_LEVELS,
    SYMMETRIC,
    NoiseSettings,
    cached_prefix_noise,
    cover_of,
    mark_record,
    prefix_noise,
)
from fedrec.utils.jit import jit
from fedrec.utils.rng import KeyedRows, normals, stream_key, substream

__all__ = [
    "AuditResult",
    "audit",
    "audit_client_dp",
    "audit_fclub",
    "audit_fed_ucb",
    "audit_server_dp",
    "audit_textbook",
    "audit_tree",
    "batched_noised",
    "cached_tree_noise",
    "clopper_pearson",
    "epsilon_from_rates",
    "epsilon_lower_bound",
    "minimum_trials",
    "check_confidence",
    "correct_guesses",
    "one_run_bound",
    "one_run_epsilon_lower_bound",
    "one_run_p_value",
    "regenerated_tree_noise",
    "server_trial_key",
]

#: the most thresholds the selection half tries per statistic (ranks spaced geometrically from both tails)
MAX_THRESHOLDS = 256
#: scores are rounded to this many decimal digits below their largest magnitude (see "Floating point" above)
SIGNIFICANT_DIGITS = 9
#: how many released values an audit that runs in blocks draws at a time (:func:`audit_textbook`,
#: :func:`audit_server_dp`), so that its memory holds little more than one score per trial
BLOCK_VALUES = 1 << 22

#: ``privatise(privacy, shared, tensor_sizes, rows, row_client, budget, clients, key) -> (shared, rows)``: the
#: signature of :func:`fedrec.recsys.privatize.privatize_uploads`, the client-DP privatiser under audit
Privatiser = Callable[[ClientDP, Tensor, list[int], Tensor, Tensor, Tensor, Tensor, int], tuple[Tensor, Tensor]]
#: ``noise(key, streams, horizon) -> (len(streams), horizon, width)`` float64: the prefix noise every stream's
#: release t = 1 … horizon carries (:func:`cached_tree_noise`, :func:`regenerated_tree_noise`)
TreeNoise = Callable[[np.uint64, np.ndarray, int], np.ndarray]


@dataclass(frozen=True)
class AuditResult:
    """What an audit found: the ε lower bound and the test that gave it.

    ``trials`` counts the mechanism's runs on each of the two inputs; half of them chose the test, the other half
    (``held_out``) gave the bound. ``rate_in``/``rate_out`` are the held-out frequencies of the chosen event on D'
    and on D.
    """

    epsilon_lower: float  #: the ε lower bound at ``confidence``
    confidence: float
    trials: int
    held_out: int
    delta: float  #: the δ the bound is stated at (the mechanism's own)
    statistic: str
    threshold: float
    event: str  #: ``">="`` or ``"<"``: the event is {score ≥ threshold} or {score < threshold}
    points_to: str  #: ``"in"`` or ``"out"``: which input the event is evidence for
    rate_in: float
    rate_out: float
    mechanism: str = ""
    threat_model: str = ""
    epsilon_reported: float | None = None  #: what the accountant reports for the same setting
    epsilon_nominal: float | None = None  #: a convention's own count where it differs (the authors' Σ ε_t)

    @property
    def exceeds(self) -> bool:
        """Whether the bound is above the reported ε: the reported ε is then wrong for this threat model."""
        return self.epsilon_reported is not None and self.epsilon_lower > self.epsilon_reported

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready values."""
        return asdict(self)


# --------------------------------------------------------------------------------------------------------------
# Statistics
# --------------------------------------------------------------------------------------------------------------


def check_confidence(confidence: float) -> float:
    """``confidence`` checked to lie in (0, 1) (the probability with which an audit's bound holds)."""
    return check_float("confidence", confidence, low=0.0, high=1.0, low_open=True, high_open=True)


def _check_delta(delta: float) -> float:
    return check_float("delta", delta, low=0.0, high=1.0, high_open=True)


def clopper_pearson(successes: Any, trials: Any, level: float) -> tuple[np.ndarray, np.ndarray]:
    """One-sided Clopper–Pearson bounds on a binomial rate from ``successes`` out of ``trials`` (arrays
    broadcast): ``lower`` with P[rate < lower] ≤ 1 − level and ``upper`` with P[rate > upper] ≤ 1 − level, each
    exact (beta quantiles), 0 and 1 at the ends."""
    from scipy.stats import beta

    lv = check_float("level", level, low=0.0, high=1.0, low_open=True, high_open=True)
    k, n = np.broadcast_arrays(np.asarray(successes, dtype=np.float64), np.asarray(trials, dtype=np.float64))
    if np.any(k < 0) or np.any(k > n):
        raise ValueError("successes must lie in [0, trials]")
    lower = np.where(k > 0, beta.ppf(1.0 - lv, np.maximum(k, 1.0), n - k + 1.0), 0.0)
    upper = np.where(k < n, beta.ppf(lv, k + 1.0, np.maximum(n - k, 1.0)), 1.0)
    return lower, upper


def epsilon_from_rates(rate_in: Any, rate_out: Any, delta: float = 0.0) -> np.ndarray:
    """The ε that (ε, δ)-DP needs for an event of rate ``rate_in`` on one input and ``rate_out`` on its neighbour:
    log((rate_in − δ) / rate_out), and 0 where that is negative or undefined (arrays broadcast)."""
    d = _check_delta(delta)
    p, q = np.broadcast_arrays(np.asarray(rate_in, dtype=np.float64), np.asarray(rate_out, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.log(np.maximum(p - d, 0.0)) - np.log(q)
    return np.where(np.isfinite(eps) & (eps > 0), eps, np.where((p - d > 0) & (q == 0), np.inf, 0.0))


def minimum_trials(confidence: float, delta: float = 0.0) -> int:
    """The fewest trials per input for which a perfect attack (the two inputs' outputs never confused) can give a
    positive bound: the held-out half m must have 2·(α/2)^(1/m) > 1 + δ."""
    alpha = 1.0 - check_confidence(confidence)
    d = _check_delta(delta)
    m = max(1, math.ceil(math.log(alpha / 2.0) / math.log((1.0 + d) / 2.0)))
    while 2.0 * (alpha / 2.0) ** (1.0 / m) <= 1.0 + d:
        m += 1
    return 2 * m


def _check_trials(trials: int, confidence: float, delta: float) -> int:
    n = check_int("trials", trials, minimum=1)
    need = minimum_trials(confidence, delta)
    if n < need:
        raise ConfigError(f"trials={n} is too few for confidence={confidence}: even a perfect attack gives no "
                          f"positive bound on its held-out half; use at least {need} trials per input")
    return n


def _thresholds(pooled: np.ndarray, limit: int) -> np.ndarray:
    """Candidate thresholds: the distinct scores at ranks spaced geometrically from both ends of ``pooled``
    (dense in the tails, where large ε show), at most ``limit``."""
    values = np.unique(pooled)  # sorted
    n = values.size
    if n <= limit:
        return values
    ranks = np.unique(np.round(np.geomspace(1, n, limit // 2)).astype(np.int64) - 1)
    return values[np.unique(np.concatenate([ranks, n - 1 - ranks]))]


def _event_counts(scores: np.ndarray, thresholds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """How many ``scores`` are ≥ each threshold, and how many are below it."""
    below = np.searchsorted(np.sort(scores), thresholds, side="left")
    return scores.size - below, below


def _bounds(k_in: np.ndarray, k_out: np.ndarray, m_in: int, m_out: int, level: float,
            delta: float) -> tuple[np.ndarray, np.ndarray]:
    """ε bounds of an event seen ``k_in`` of ``m_in`` times on D' and ``k_out`` of ``m_out`` on D: with the event
    pointing to D' (lower bound on its D' rate over upper bound on its D rate), and pointing to D."""
    low_in, up_in = clopper_pearson(k_in, m_in, level)
    low_out, up_out = clopper_pearson(k_out, m_out, level)
    return epsilon_from_rates(low_in, up_out, delta), epsilon_from_rates(low_out, up_in, delta)


def _coarsen(scores: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """``scores`` rounded to :data:`SIGNIFICANT_DIGITS` digits of the largest ``|reference|`` (the selection half's
    scores, so the rounding is a fixed function on the held-out half)."""
    top = float(np.abs(reference).max()) if reference.size else 0.0
    if top == 0.0:
        return scores
    unit = 10.0 ** (math.floor(math.log10(top)) - SIGNIFICANT_DIGITS)
    return np.round(scores / unit) * unit


def epsilon_lower_bound(scores: Mapping[str, Tensor], world: Tensor, *, delta: float = 0.0,
                        confidence: float = 0.95, max_thresholds: int = MAX_THRESHOLDS) -> AuditResult:
    """The ε lower bound of the best test on ``scores`` (module docstring): chosen on the first half of each
    world's trials, evaluated once on the second half.

    Args:
        scores: candidate statistics by name, each a ``(trials,)`` tensor with one score per run.
        world: ``(trials,)`` bool, True where the run used D' ("in"), False where it used D ("out").
        delta: the mechanism's δ (0 for pure ε-DP).
        confidence: the probability, in (0, 1), with which the bound holds.
        max_thresholds: the most thresholds tried per statistic.
    """
    conf = check_confidence(confidence)
    d = _check_delta(delta)
    w = torch.as_tensor(world, dtype=torch.bool).cpu().numpy()
    idx_in, idx_out = np.flatnonzero(w), np.flatnonzero(~w)
    n = min(idx_in.size, idx_out.size)
    _check_trials(n, conf, d)
    if not scores:
        raise ValueError("scores must name at least one statistic")
    level = 1.0 - (1.0 - conf) / 2.0  # each of the two rate bounds
    half = n // 2
    sel = {"in": idx_in[:half], "out": idx_out[:half]}
    held = {"in": idx_in[half:], "out": idx_out[half:]}
    candidates = []  # (statistic, thresholds, event, k_in, k_out) on the selection half
    coarse: dict[str, np.ndarray] = {}
    for name, s in scores.items():
        s = torch.as_tensor(s).detach().cpu().double().flatten().numpy()
        if s.size != w.size or not np.isfinite(s).all():
            raise ValueError(f"statistic {name!r} must give one finite score per trial ({w.size})")
        s = coarse[name] = _coarsen(s, np.concatenate([s[sel["in"]], s[sel["out"]]]))
        thresholds = _thresholds(np.concatenate([s[sel["in"]], s[sel["out"]]]), max_thresholds)
        above_in, below_in = _event_counts(s[sel["in"]], thresholds)
        above_out, below_out = _event_counts(s[sel["out"]], thresholds)
        candidates += [(name, thresholds, ">=", above_in, above_out), (name, thresholds, "<", below_in, below_out)]
    tests = 2 * sum(len(c[1]) for c in candidates)  # every threshold, event and direction
    select_level = 1.0 - (1.0 - conf) / (2.0 * tests)
    best: tuple[tuple[float, float, float], str, float, str, str] | None = None
    for name, thresholds, event, k_in, k_out in candidates:
        strict = _bounds(k_in, k_out, half, half, select_level, d)
        plain = _bounds(k_in, k_out, half, half, level, d)  # breaks ties, e.g. when too few trials for Bonferroni
        for i, points_to in enumerate(("in", "out")):
            odds = np.log((k_in + 0.5) / (k_out + 0.5)) * (1 if points_to == "in" else -1)
            j = int(np.lexsort((odds, plain[i], strict[i]))[-1])
            rank = (float(strict[i][j]), float(plain[i][j]), float(odds[j]))
            if best is None or rank > best[0]:
                best = (rank, name, float(thresholds[j]), event, points_to)
    assert best is not None
    _, name, threshold, event, points_to = best
    counts = {}
    for side in ("in", "out"):
        above, below = _event_counts(coarse[name][held[side]], np.array([threshold]))
        counts[side] = int((above if event == ">=" else below)[0])
    m_in, m_out = held["in"].size, held["out"].size
    eps_in, eps_out = _bounds(np.array(counts["in"]), np.array(counts["out"]), m_in, m_out, level, d)
    return AuditResult(
        epsilon_lower=float(eps_in if points_to == "in" else eps_out), confidence=conf, trials=n,
        held_out=min(m_in, m_out), delta=d, statistic=name, threshold=threshold, event=event, points_to=points_to,
        rate_in=counts["in"] / m_in, rate_out=counts["out"] / m_out)


def audit(release: Callable[[Tensor], Any], statistics: Mapping[str, Callable[[Any], Tensor]], *, trials: int,
          delta: float = 0.0, confidence: float = 0.95, **describe: Any) -> AuditResult:
    """Run a mechanism ``trials`` times on each of two neighbouring inputs and bound its ε.

    Args:
        release: ``release(world)`` runs the mechanism once per entry of ``world`` (a ``(2·trials,)`` bool
            tensor: True runs it on D', False on D), run i drawing its noise as owner i of the audit's keyed
            streams, and returns the outputs in any form the statistics read.
        statistics: candidate test statistics by name, each mapping the outputs to one score per run.
        trials: runs per input (the first half chooses the test, the second half gives the bound).
        delta, confidence: as in :func:`epsilon_lower_bound`.
        describe: :class:`AuditResult` fields that describe the setting (``mechanism``, ``threat_model``,
            ``epsilon_reported``, ``epsilon_nominal``).
    """
    n = _check_trials(trials, check_confidence(confidence), _check_delta(delta))
    world = torch.arange(2 * n) >= n
    outputs = release(world)
    result = epsilon_lower_bound({name: f(outputs) for name, f in statistics.items()}, world, delta=delta,
                                 confidence=confidence)
    return replace(result, **describe)


def one_run_epsilon_lower_bound(scores: Tensor, included: Tensor, guesses: int, *, confidence: float = 0.95,
                                delta: float = 0.0) -> float:
    """The ε lower bound of an audit in one run (Steinke, Nasr & Jagielski, NeurIPS 2023), for (ε, δ)-DP.

    m canaries are each included on its own with probability ½ (``included``, independent of everything else),
    the mechanism runs once, and every canary gets a score. The auditor guesses "included" for the ``guesses``/2
    highest scores and "excluded" for the ``guesses``/2 lowest (a number fixed in advance) and abstains on the
    rest. If the mechanism is ε-DP with respect to each canary, the number of correct guesses is dominated by
    Binomial(guesses, e^ε/(1 + e^ε)) (their main theorem at δ = 0), so the ε whose success probability is the
    one-sided Clopper–Pearson lower bound of the correct fraction, at ``confidence``, is a lower bound. At δ > 0
    the binomial tail gains the theorem's δ term (:func:`one_run_p_value`) and ε is found by bisection on it;
    δ = 0 keeps the closed form.
    """
    conf = check_confidence(confidence)
    d = _check_delta(delta)
    s = torch.as_tensor(scores).detach().cpu().double().flatten()
    inc = torch.as_tensor(included, dtype=torch.bool).cpu().flatten()
    if s.numel() != inc.numel():
        raise ValueError(f"scores and included must have one entry per canary, got {s.numel()} and {inc.numel()}")
    r = check_int("guesses", guesses, minimum=2)
    if r > s.numel() or r % 2:
        raise ConfigError(f"guesses must be even and at most the number of canaries ({s.numel()}), got {r}")
    return one_run_bound(s.numel(), r, correct_guesses(s, inc, r), d, conf)


# --------------------------------------------------------------------------------------------------------------
# Textbook mechanisms (the audit's own calibration: their true ε is known)
# --------------------------------------------------------------------------------------------------------------


def audit_textbook(mechanism: str, epsilon: float, delta: float = 1e-5, *, trials: int = 10_000_000, seed: int = 0,
                   confidence: float = 0.95) -> AuditResult:
    """Audit the textbook scalar mechanism of sensitivity 1 at (ε, δ): Gaussian with the analytic σ (Balle &
    Wang 2018, exact at δ), or Laplace with b = 1/ε (δ = 0). Neighbours 0 and 1; the output itself is the
    statistic (its likelihood ratio is monotone in it, so a threshold on it is the Neyman–Pearson test). The true
    ε is ``epsilon``, so the bound is sound iff it stays below it.

    The Gaussian's ε at δ = 1e-5 is attained only by events far in the tail, of probability ~1e-4 on D' (where
    (P[E | D'] − δ)/P[E | D] peaks), so the default runs 10⁷ trials per input (bounds of 0.83–0.89·ε at ε = 1 and
    4, seeds 0–4; 10⁵ give 0.62–0.67·ε); they are drawn in blocks of :data:`BLOCK_VALUES` (trial i is owner i of
    the stream whatever the block).
    """
    from fedrec.privacy.mechanisms import analytic_gaussian_noise_multiplier

    eps = check_float("epsilon", epsilon, low=0.0, low_open=True)
    check_choice("mechanism", mechanism, ("gaussian", "laplace"))
    if mechanism == "gaussian":
        scale, distribution, d = analytic_gaussian_noise_multiplier(eps, delta), "normal", float(delta)
    else:
        scale, distribution, d = 1.0 / eps, "laplace", 0.0
    key = stream_key(check_int("seed", seed, minimum=0), "audit.textbook", ["gaussian", "laplace"].index(mechanism))

    def release(world: Tensor) -> Tensor:
        out = torch.empty(world.numel(), dtype=torch.float64)
        for start in range(0, world.numel(), BLOCK_VALUES):
            end = min(start + BLOCK_VALUES, world.numel())
            noise = torch.from_numpy(KeyedRows(key, np.arange(start, end)).draw(distribution, 1)[:, 0])
            out[start:end] = world[start:end].double() + scale * noise
        return out

    return audit(release, {"output": lambda y: y}, trials=trials, delta=d, confidence=confidence,
                 mechanism=f"textbook {mechanism}", threat_model="one release, neighbours 0 and 1 (sensitivity 1)",
                 epsilon_reported=eps)


# --------------------------------------------------------------------------------------------------------------
# Client-level DP of federated recommendation uploads
# --------------------------------------------------------------------------------------------------------------


def _units(privacy: ClientDP, tensor_sizes: Sequence[int], rows: int, width: int) -> list[tuple[int, int]]:
    """The (start, end) slices of a flattened upload that the privatiser clips on their own: the whole upload
    (paper conventions), or each ω tensor and each item row (authors')."""
    P = sum(tensor_sizes)
    if privacy.conventions == "paper":
        return [(0, P + rows * width)]
    starts = np.cumsum([0, *tensor_sizes])
    return ([(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:]) if b > a]
            + [(P + j * width, P + (j + 1) * width) for j in range(rows)])


def _worst_case_canary(privacy: ClientDP, units: list[tuple[int, int]], dim: int) -> Tensor:
    """The canary client's update: 10·clip on the first value of every clipping unit, so each unit is clipped to
    the edge of its ball, along one axis (for L1 the extreme points; for L2 any direction is as bad)."""
    u = torch.zeros(dim, dtype=torch.float64)
    for start, _ in units:
        u[start] = 10.0 * privacy.clip
    return u


def _expected(privacy: ClientDP, update: Tensor, units: list[tuple[int, int]]) -> Tensor:
    """``update`` as a correct privatiser clips it (each unit to the clip ball): the mean of its noised upload."""
    out = update.clone()
    for start, end in units:
        out[start:end] = privacy.mechanism.clip_rows(update[start:end].unsqueeze(0))[0]
    return out


def _reported(privacy: ClientDP, budget: float, rounds: int, tensors: int) -> tuple[float, float | None]:
    """What the privatiser's own accountant reports for one client after ``rounds`` rounds at ``budget``, each
    noising ``tensors`` tensors (authors' conventions), recorded on a copy: (ε, the authors' nominal Σ ε_t)."""
    dp = copy.deepcopy(privacy)
    N = dp.accountant.num_clients
    run = torch.zeros(N, dtype=torch.bool)
    run[0] = True
    for _ in range(rounds):
        dp.record(torch.full((N,), budget, dtype=torch.float64), run, torch.full((N,), tensors))
    return float(dp.spent()[0]), None if dp.nominal is None else float(dp.nominal[0])


def audit_client_dp(privacy: ClientDP, privatise: Privatiser, *, tensor_sizes: Sequence[int] = (4, 4),
                    rows: int = 1, width: int = 4, rounds: int = 1, canary: Tensor | None = None,
                    adjacency: str | None = None, trials: int = 20_000, seed: int = 0, confidence: float = 0.95,
                    dtype: torch.dtype = torch.float32) -> AuditResult:
    """Audit client-level DP on a recommendation round's uploads with a white-box canary client.

    Every trial is a canary client whose upload (ω tensors of ``tensor_sizes`` values and ``rows`` item rows of
    ``width``) the auditor chooses: ``canary`` on D' and, on D, its negation (replace-one: another client's data
    may move the upload anywhere in the clip ball) or a zero upload (add/remove: an absent client counts as zero).
    The canary takes part in ``rounds`` rounds at the uniform split of ``privacy``'s budget over them, each round
    privatised by ``privatise`` (the round's privatiser,
    :func:`fedrec.recsys.privatize.privatize_uploads`, or a variant under test) with fresh keyed noise; the
    statistics sum over rounds. The reported ε is what ``privacy``'s accountant records for those rounds.

    Args:
        privacy: the client-DP setting (mechanism, budget, conventions, adjacency); its accountant is not touched.
        privatise: the privatiser under audit, with :func:`~fedrec.recsys.privatize.privatize_uploads`'s signature.
        tensor_sizes, rows, width: the canary's upload layout (under the authors' conventions every tensor and
            row is clipped and noised on its own, so more of them spend more ε).
        rounds: rounds the canary takes part in (their noise composes).
        canary: the canary's flattened update on D' (``sum(tensor_sizes) + rows·width`` values); default: 10·clip
            on the first value of every clipping unit (the worst case for the clipping bound).
        adjacency: the neighbouring relation audited (default: ``privacy``'s own).
        trials, seed, confidence: runs per input, the key of every draw, the bound's confidence.
        dtype: the uploads' dtype (the model's).
    """
    rounds = check_int("rounds", rounds, minimum=1)
    rows = check_int("rows", rows, minimum=0)
    width = check_int("width", width, minimum=1)
    sizes = [check_int("tensor_sizes", s, minimum=0) for s in tensor_sizes]
    P = sum(sizes)
    dim = P + rows * width
    if dim == 0:
        raise ConfigError("the canary's upload is empty: give tensor_sizes or rows")
    adjacency = privacy.mechanism.adjacency if adjacency is None else adjacency
    check_choice("adjacency", adjacency, ("replace_one", "add_remove"))
    units = _units(privacy, sizes, rows, width)
    u1 = _worst_case_canary(privacy, units, dim) if canary is None else torch.as_tensor(canary, dtype=torch.float64)
    if tuple(u1.shape) != (dim,) or not bool(torch.isfinite(u1).all()):
        raise ConfigError(f"canary must be {dim} finite values (sum(tensor_sizes) + rows·width)")
    u0 = -u1 if adjacency == "replace_one" else torch.zeros_like(u1)
    m1, m0 = _expected(privacy, u1, units), _expected(privacy, u0, units)
    moved = (m1 != m0).nonzero().flatten()
    direction = (m1 - m0)[moved]
    budget = privacy.uniform_budget(rounds)
    scale = float(privacy.mechanism.noise_scale(privacy.levels(torch.tensor([budget], dtype=torch.float64))[0]))
    key_seed = check_int("seed", seed, minimum=0)

    def release(world: Tensor) -> dict[str, Tensor]:
        m = world.numel()
        updates = torch.where(world.unsqueeze(1), u1, u0).to(dtype)
        clients = torch.arange(m)
        row_client = clients.repeat_interleave(rows)
        budgets = torch.full((m,), budget, dtype=torch.float64)
        projection = torch.zeros(m, dtype=torch.float64)
        llr = torch.zeros(m, dtype=torch.float64)
        for r in range(rounds):
            key = int(stream_key(key_seed, "audit.client_dp", r))
            shared, item_rows = privatise(privacy, updates[:, :P].contiguous(), list(sizes),
                                          updates[:, P:].reshape(m * rows, width), row_client, budgets, clients, key)
            y = torch.cat([shared.reshape(m, P), item_rows.reshape(m, rows * width)], 1).double()[:, moved]
            projection += y @ direction
            llr += ((y - m0[moved]).abs() - (y - m1[moved]).abs()).sum(1) / scale
        return {"projection": projection, "laplace_llr": llr}

    reported, nominal = _reported(privacy, budget, rounds, len(sizes) + rows)
    delta = privacy.delta if privacy.name == "gaussian" else 0.0
    what = f"canary client ({adjacency}), {rounds} round{'s' * (rounds > 1)}, {privacy.conventions} conventions"
    return audit(release, {"projection": lambda o: o["projection"], "laplace_llr": lambda o: o["laplace_llr"]},
                 trials=trials, delta=delta, confidence=confidence, mechanism=f"client DP {privacy.name}",
                 threat_model=what, epsilon_reported=reported, epsilon_nominal=nominal)


# --------------------------------------------------------------------------------------------------------------
# Server-placed client-level DP (DP-FedAvg's noised sum, with Poisson sampling)
# --------------------------------------------------------------------------------------------------------------


def server_trial_key(key: np.uint64, trial: int) -> int:
    """The key :meth:`~fedrec.privacy.central.ServerNoise.noised` gets in trial ``trial`` of a round keyed
    ``key``: owner ``trial``'s stream under it."""
    return int(substream(np.uint64(key), trial))


def batched_noised(noise: ServerNoise, clean: Tensor, expected_clients: float, key: np.uint64,
                   trials: np.ndarray) -> Tensor:
    """Many trials' ``noise.noised`` at once: row i is the flattened (ω update, item-table update) that
    ``noise.noised(sums, expected_clients, server_trial_key(key, trials[i]))`` returns for the sums whose
    flattened (ω, item table) is ``clean[i]``, bit for bit (the same draws, from owner 0 of that key, and the same
    float64 operations at ``noise.update_stddev``). Only non-adaptive noise: adaptive clipping moves the clip."""
    draws = normals(np.uint64(key), np.ascontiguousarray(trials, dtype=np.int64),
                    np.zeros(len(trials), dtype=np.int64), clean.shape[1] + 1)
    return (clean + noise.update_stddev * torch.from_numpy(draws[:, :-1])) / expected_clients


def _flat(sums: ClippedSums) -> Tensor:
    """The sums' (ω, item table) as one vector, the layout of a flattened release."""
    return torch.cat([sums.shared, sums.rows.flatten()])


def audit_server_dp(noise: ServerNoise, *, sample_rate: float, rounds: int = 1, epsilon_reported: float,
                    delta: float, tensor_sizes: Sequence[int] = (4, 4), rows: int = 1, width: int = 4,
                    num_items: int = 8, trials: int = 20_000, seed: int = 0, confidence: float = 0.95,
                    expected_clients: float = 1.0) -> AuditResult:
    """Audit server-placed client-level DP (DP-FedAvg, :mod:`fedrec.privacy.central`) with a white-box canary
    client under Poisson sampling.

    D: the other clients upload nothing. D': D plus a canary whose upload (ω of ``tensor_sizes`` values and
    ``rows`` item rows of ``width``, on items 0 … rows − 1 of ``num_items``) is 10·clip on its first value, so
    clipping leaves it on the edge of the ball (add/remove: Δ = clip). In each of ``rounds`` rounds the canary
    takes part on D' with probability ``sample_rate`` (its own keyed draw), never on D; every round's sums come
    from the real :func:`~fedrec.privacy.central.clipped_sums`, the noise from ``noise`` as
    :func:`batched_noised` replays :meth:`~fedrec.privacy.central.ServerNoise.noised` (checked against the real
    call on two trials per round; the audit refuses a ``noise`` whose ``noised`` draws otherwise), and every
    round's release is observed.

    Statistics: the likelihood ratio of the claimed sampled Gaussian (optimal for a correct mechanism),
    Σ_t log((1 − q) + q·exp((⟨y_t − m, c⟩ − ½‖c‖²)/s²)) with m the release's mean on D, c the clipped canary
    over ``expected_clients`` and s = z·Δ/``expected_clients`` the claimed std (z = ``noise.noise_multiplier``);
    and the projection Σ_t ⟨y_t − m, c⟩.

    Args:
        noise: the server noise under audit (not adaptive).
        sample_rate: q in (0, 1], each round's Poisson sampling rate.
        rounds: rounds observed (the canary sampled afresh in each).
        epsilon_reported, delta: what the accountant reports for (z, q, rounds), and its δ.
        tensor_sizes, rows, width, num_items: the canary's upload and the item table.
        trials, seed, confidence: runs per input, the key of every draw, the bound's confidence.
        expected_clients: the update's fixed denominator (1.0: the noised sum itself, as under
            ``aggregator.reduce=sum``); the bound does not depend on it.
    """
    if noise.adaptive:
        raise ConfigError("audit_server_dp audits non-adaptive server noise: adaptive clipping moves the clip")
    q = check_float("sample_rate", sample_rate, low=0.0, high=1.0, low_open=True)
    rounds = check_int("rounds", rounds, minimum=1)
    items = check_int("num_items", num_items, minimum=1)
    rows = check_int("rows", rows, minimum=0)
    if rows > items:
        raise ConfigError(f"rows={rows} must be at most num_items={items}: the canary's rows are distinct items")
    width = check_int("width", width, minimum=1)
    sizes = [check_int("tensor_sizes", s, minimum=0) for s in tensor_sizes]
    P = sum(sizes)
    if P + rows * width == 0:
        raise ConfigError("the canary's upload is empty: give tensor_sizes or rows")
    E = check_float("expected_clients", expected_clients, low=0.0, low_open=True)
    reported = check_float("epsilon_reported", epsilon_reported, low=0.0)
    key_seed = check_int("seed", seed, minimum=0)
    mech = noise.mechanism
    upload = torch.zeros(P + rows * width, dtype=torch.float32)
    upload[0] = 10.0 * mech.clip
    none = torch.zeros(0, dtype=torch.int64)
    out = clipped_sums(mech, torch.zeros(0, P), torch.zeros(0, width), none, none, items)
    inn = clipped_sums(mech, upload[:P].reshape(1, P), upload[P:].reshape(rows, width),
                       torch.zeros(rows, dtype=torch.int64), torch.arange(rows), items)
    s_out, s_in = _flat(out), _flat(inn)
    mean, canary = s_out / E, (s_in - s_out) / E
    s2 = (noise.noise_multiplier * mech.sensitivity / E) ** 2
    log_out, log_in = math.log1p(-q) if q < 1 else -math.inf, math.log(q)

    def release(world: Tensor) -> dict[str, Tensor]:
        m = world.numel()
        keys = [stream_key(key_seed, "audit.server", r) for r in range(rounds)]
        sampling = stream_key(key_seed, "audit.server.sampling")
        projection = torch.zeros(m, dtype=torch.float64)
        llr = torch.zeros(m, dtype=torch.float64)
        step = max(1, BLOCK_VALUES // s_in.numel())
        for start in range(0, m, step):
            ids = np.arange(start, min(start + step, m))
            sampled = torch.from_numpy(KeyedRows(sampling, ids).draw("uniform", rounds) < q)
            included = world[ids].unsqueeze(1) & sampled
            for r, key in enumerate(keys):
                y = batched_noised(noise, torch.where(included[:, r:r + 1], s_in, s_out), E, key, ids)
                for j in (0, ids.size - 1):  # the replay is the real call
                    shared, table = noise.noised(inn if bool(included[j, r]) else out, E,
                                                 server_trial_key(key, int(ids[j])))
                    if not torch.equal(torch.cat([shared, table.flatten()]), y[j]):
                        raise ValueError(f"{type(noise).__name__}.noised does not draw as ServerNoise.noised does")
                p = (y - mean) @ canary
                projection[ids] += p
                llr[ids] += torch.logaddexp(torch.tensor(log_out), log_in + (p - 0.5 * (canary @ canary)) / s2)
        return {"projection": projection, "mixture_llr": llr}

    what = (f"canary client (add/remove, 10·clip on one value), Poisson sampling at q={q:g} in each of {rounds} "
            f"round{'s' * (rounds > 1)}, every release seen")
    return audit(release, {"projection": lambda o: o["projection"], "mixture_llr": lambda o: o["mixture_llr"]},
                 trials=trials, delta=delta, confidence=confidence, mechanism="server-placed Gaussian (DP-FedAvg)",
                 threat_model=what, epsilon_reported=reported)


# --------------------------------------------------------------------------------------------------------------
# Tree aggregation (the binary mechanism of Fed_UCB and CDP-FCLUB)
# --------------------------------------------------------------------------------------------------------------


@jit
def _cached_noise(key: np.uint64, kind: int, scale: float, noise_empty: bool, out: np.ndarray) -> None:
    """Fed_UCB's tree noise: stream r's prefix noise after each of its records 1 … horizon into ``out[r]``
    (streams × horizon × width), every record present: :func:`~fedrec.privacy.tree_noise.mark_record`, then
    :func:`~fedrec.privacy.tree_noise.cached_prefix_noise` (each node drawn once and cached), as the kernel runs."""
    streams, horizon, width = out.shape
    levels = 1
    while horizon >> levels:
        levels += 1
    last = np.zeros((streams, levels), dtype=np.int64)
    prev = np.zeros((streams, levels), dtype=np.int64)
    node = np.zeros((streams, levels), dtype=np.int64)
    value = np.zeros((streams, levels, width))
    noise = NoiseSettings(key, kind, scale, noise_empty)
    buffer = np.empty(MAX_LEVELS, dtype=np.int64)
    for r in range(streams):
        for t in range(1, horizon + 1):
            mark_record(r, t, last, prev)
            cached_prefix_noise(r, cover_of(t, buffer), noise, last, prev, node, value, out[r, t - 1])


@jit
def _regenerated_noise(key: np.uint64, streams: np.ndarray, kind: int, scale: float, out: np.ndarray) -> None:
    """CDP-FCLUB's tree noise: the prefix noise of release t = 1 … horizon of stream ``streams[i]`` into ``out[i]``,
    regenerated from the key at every release (:func:`~fedrec.privacy.tree_noise.prefix_noise`, as
    ``kernels.fclub.release`` draws it)."""
    work = np.empty(out.shape[2])
    for i in range(streams.shape[0]):
        for t in range(1, out.shape[1] + 1):
            prefix_noise(key, streams[i], t, kind, scale, out[i, t - 1], work)


def cached_tree_noise(kind: int, scale: float, width: int = 1, noise_empty: bool = False) -> TreeNoise:
    """Fed_UCB's tree noise as an audit's :data:`TreeNoise`: nodes drawn once and cached per level, every record
    present (streams must be 0 … m − 1: the caches are indexed by stream)."""
    def noise(key: np.uint64, streams: np.ndarray, horizon: int) -> np.ndarray:
        if not np.array_equal(streams, np.arange(len(streams))):
            raise ValueError("the cached tree noise draws streams 0 … m − 1")
        out = np.zeros((len(streams), horizon, width))
        _cached_noise(np.uint64(key), kind, float(scale), bool(noise_empty), out)
        return out
    return noise


def regenerated_tree_noise(kind: int, scale: float, width: int = 1) -> TreeNoise:
    """CDP-FCLUB's tree noise as an audit's :data:`TreeNoise`: every release's prefix noise regenerated from the
    key (kind :data:`~fedrec.privacy.tree_noise.SYMMETRIC` for its Gram matrices)."""
    def noise(key: np.uint64, streams: np.ndarray, horizon: int) -> np.ndarray:
        out = np.zeros((len(streams), horizon, width))
        _regenerated_noise(np.uint64(key), np.ascontiguousarray(streams, dtype=np.int64), kind, float(scale), out)
        return out
    return noise


def _nodes(horizon: int) -> list[tuple[int, int]]:
    """The nodes (level, index) some release 1 … horizon covers: index odd, index·2^level ≤ horizon."""
    return [(level, k) for level in range(horizon.bit_length()) for k in range(1, (horizon >> level) + 1, 2)]


def _node_llr(releases: Tensor, clean_out: Tensor, clean_in: Tensor, kind: int, scale: float) -> Tensor:
    """The log-likelihood ratio (D' over D) of the tree nodes a white-box observer reads off the releases.

    Node (l, k) covers records ((k−1)·2^l, k·2^l], and release k·2^l's cover is that node plus release
    (k−1)·2^l's cover, so R_{k·2^l} − R_{(k−1)·2^l} is the node's clean sum plus its own noise alone. Laplace
    nodes: Σ (|ŷ − c₀| − |ŷ − c₁|)/b; Gaussian nodes: ⟨ŷ − c₀, c₁ − c₀⟩/σ² (for symmetric noise the same, up to a
    factor, since its density is exp(−‖·‖_F²/(4σ²)) on symmetric matrices). Nodes whose clean sums agree give 0.
    ``releases``: (m, horizon, W); ``clean_*``: (horizon, W) clean prefix sums of D and D'.
    """
    padded = torch.nn.functional.pad(releases, (0, 0, 1, 0))
    c0, c1 = (torch.nn.functional.pad(c, (0, 0, 1, 0)) for c in (clean_out, clean_in))
    total = torch.zeros(releases.shape[0], dtype=torch.float64)
    for level, k in _nodes(releases.shape[1]):
        hi, lo = k << level, (k - 1) << level
        a, b = c0[hi] - c0[lo], c1[hi] - c1[lo]
        if bool(torch.equal(a, b)):
            continue
        y = padded[:, hi] - padded[:, lo]
        if kind == LAPLACE:
            total += ((y - a).abs() - (y - b).abs()).sum(1) / scale
        else:
            total += (y - a) @ (b - a) / scale ** 2
    return total


def _tree_releases(noise: TreeNoise, key: np.uint64, streams: np.ndarray, world: Tensor, records_out: Tensor,
                   records_in: Tensor) -> Tensor:
    """Releases R_t = Σ_{τ ≤ t} v_τ + noise_t of each stream, with D' (``world`` True) or D's records."""
    clean = torch.where(world.view(-1, 1, 1), records_in.cumsum(0), records_out.cumsum(0))
    return clean + torch.from_numpy(noise(key, streams, records_out.shape[0]))


def _records(records: Any, name: str) -> Tensor:
    r = torch.as_tensor(records, dtype=torch.float64)
    r = r.unsqueeze(-1) if r.dim() == 1 else r
    if r.dim() != 2 or not bool(torch.isfinite(r).all()):
        raise ConfigError(f"{name} must be finite records of shape (horizon,) or (horizon, width)")
    return r


def audit_tree(records_out: Any, records_in: Any, noise: TreeNoise, *, kind: int, scale: float,
               statistics: Mapping[str, Callable[[Tensor], Tensor]] | None = None, trials: int = 20_000,
               seed: int = 0, delta: float = 0.0, confidence: float = 0.95, **describe: Any) -> AuditResult:
    """Audit a binary mechanism on two neighbouring record streams, every release t = 1 … horizon observed.

    Args:
        records_out, records_in: the streams D and D', ``(horizon,)`` or ``(horizon, width)``; they differ in the
            records whose privacy is audited.
        noise: the tree noise under audit (:func:`cached_tree_noise`, :func:`regenerated_tree_noise`, or a
            variant); trial i is stream i under the audit's key.
        kind, scale: the claimed node noise (:mod:`fedrec.privacy.tree_noise` kind, Laplace b or Gaussian σ),
            which the node likelihood-ratio statistic assumes.
        statistics: more candidate statistics, each mapping the ``(runs, horizon, width)`` releases to scores.
        trials, seed, delta, confidence: runs per stream, the key, the mechanism's δ, the bound's confidence.
        describe: :class:`AuditResult` fields describing the setting (``mechanism``, ``threat_model``,
            ``epsilon_reported``).
    """
    r0, r1 = _records(records_out, "records_out"), _records(records_in, "records_in")
    if r0.shape != r1.shape:
        raise ConfigError(f"records_out and records_in must have one shape, got {tuple(r0.shape)} and "
                          f"{tuple(r1.shape)}")
    key = stream_key(check_int("seed", seed, minimum=0), "audit.tree")
    c0, c1 = r0.cumsum(0), r1.cumsum(0)
    stats: dict[str, Callable[[Tensor], Tensor]] = {
        "node_llr": lambda rel: _node_llr(rel, c0, c1, kind, scale),
        "release_projection": lambda rel: ((rel - c0) * (c1 - c0)).sum((1, 2)),
        **(statistics or {}),
    }
    return audit(lambda w: _tree_releases(noise, key, np.arange(w.numel()), w, r0, r1), stats, trials=trials,
                 delta=delta, confidence=confidence, **describe)


def audit_fed_ucb(epsilon: float, horizon: int, laplace_split: str = "paper", *, position: int = 1,
                  trials: int = 20_000, seed: int = 0, confidence: float = 0.95) -> AuditResult:
    """Audit Fed_UCB's Laplace tree (Alg. 2–3): one agent's reward stream for one arm, rewards in [0, 1], the
    reward at ``position`` 0 on D and 1 on D' (replace-one; the others 0), every noisy partial sum released
    (the noisy sample means, their counts being public). Noise as the kernel draws it (node scale b = 1/ε' of
    :func:`~fedrec.privacy.tree.laplace_node_scale`, cached nodes); the reported ε is the tree accountant's."""
    T = check_int("horizon", horizon, minimum=1)
    j = check_int("position", position, minimum=1)
    if j > T:
        raise ConfigError(f"position must be <= horizon={T}, got {j}")
    b = laplace_node_scale(epsilon, T, 1.0, laplace_split)
    reported = TreeAggregator((), T, sensitivity=1.0, mechanism="laplace", scale=b).epsilon()
    out, inn = torch.zeros(T), torch.zeros(T)
    inn[j - 1] = 1.0
    return audit_tree(out, inn, cached_tree_noise(LAPLACE, b), kind=LAPLACE, scale=b, trials=trials, seed=seed,
                      confidence=confidence, mechanism=f"Fed_UCB Laplace tree (split={laplace_split})",
                      threat_model=f"one reward replaced (0 by 1) at t={j} of T={T}, every release seen",
                      epsilon_reported=reported, epsilon_nominal=float(epsilon))


def _observation(dim: int, sign: float) -> Tensor:
    """[x; y][x; y]ᵀ for the unit item x = sign·e₁ and the reward y = 1 (Frobenius norm 2, the bound FCLUB's
    accountant assumes); the two signs give orthogonal observations."""
    z = torch.zeros(dim + 1, dtype=torch.float64)
    z[0], z[dim] = sign, 1.0
    return torch.outer(z, z)


def audit_fclub(sigma: float, delta: float, uploads: int, *, phases: int = 1, dim: int = 2,
                adjacency: str = "add_remove", trials: int = 20_000, seed: int = 0, confidence: float = 0.95,
                epsilon_nominal: float | None = None) -> AuditResult:
    """Audit CDP-FCLUB-DC's Gaussian tree (Alg. 5) for one observation held at a phase start.

    Per phase the observation is in the aggregate of the privatiser's first release, so in every one of its
    releases 1 … ``uploads`` + 1, and in the one release of a candidate privatiser a kept partition discards;
    ``phases`` phases compose (fresh privatisers). Every release is observed: (d+1)×(d+1) augmented Gram
    statistics with symmetric Gaussian node noise of σ = ``sigma``, regenerated from the key as the kernel does.
    ``adjacency="add_remove"``: the observation [x; y][x; y]ᵀ (‖x‖ = 1, y = 1) is present on D' and absent on D;
    ``"replace_one"``: on D it is replaced by the orthogonal observation [−x; y][−x; y]ᵀ. The reported ε is
    :func:`~fedrec.privacy.tree.fclub_epsilon` (which takes the record's Frobenius norm, 2, as the sensitivity).
    """
    s = check_float("sigma", sigma, low=0.0, low_open=True)
    n_phases = check_int("phases", phases, minimum=1)
    d = check_int("dim", dim, minimum=1)
    H = check_int("uploads", uploads, minimum=0) + 1
    check_choice("adjacency", adjacency, ("replace_one", "add_remove"))
    W = (d + 1) ** 2
    m_in = _observation(d, 1.0).flatten()
    m_out = _observation(d, -1.0).flatten() if adjacency == "replace_one" else torch.zeros(W, dtype=torch.float64)
    streams_out, streams_in = torch.zeros(H, W, dtype=torch.float64), torch.zeros(H, W, dtype=torch.float64)
    streams_out[0], streams_in[0] = m_out, m_in
    key = stream_key(check_int("seed", seed, minimum=0), "audit.fclub")
    noise = regenerated_tree_noise(SYMMETRIC, s, W)

    def release(world: Tensor) -> Tensor:
        m = world.numel()
        total = torch.zeros(m, dtype=torch.float64)
        for p in range(n_phases):  # privatiser and candidate of phase p: streams (2p, 2p + 1) of every trial
            ids = np.arange(m) * (2 * n_phases) + 2 * p
            rel = _tree_releases(noise, key, ids, world, streams_out, streams_in)
            total += _node_llr(rel, streams_out.cumsum(0), streams_in.cumsum(0), SYMMETRIC, s)
            cand = _tree_releases(noise, key, ids + 1, world, streams_out[:1], streams_in[:1])
            total += _node_llr(cand, streams_out[:1], streams_in[:1], SYMMETRIC, s)
        return total

    reported = fclub_epsilon(s, delta, H - 1, n_phases)
    what = (f"one observation {'added/removed' if adjacency == 'add_remove' else 'replaced (orthogonal)'}, "
            f"{n_phases} phase{'s' * (n_phases > 1)} of {H} releases, every release seen")
    return audit(release, {"node_llr": lambda t: t}, trials=trials, delta=delta, confidence=confidence,
                 mechanism="CDP-FCLUB-DC Gaussian tree", threat_model=what, epsilon_reported=reported,
                 epsilon_nominal=epsilon_nominal)


# --------------------------------------------------------------------------------------------------------------
# One-run audits (Steinke, Nasr & Jagielski, NeurIPS 2023): m canaries in one private training run
# --------------------------------------------------------------------------------------------------------------

#: bisection steps of the one-run ε (the bracket, at most [0, 64], shrinks below 1e-16)
_ONE_RUN_STEPS = 70


def one_run_p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float = 0.0) -> float:
    """The p-value of ``correct`` right guesses out of ``guesses`` (the auditor abstains on the rest of the
    ``canaries``) if the mechanism is (ε, δ)-DP with respect to each canary.

    Steinke, Nasr & Jagielski's main theorem for (ε, δ)-DP, in the form their Appendix D evaluates: with m canaries,
    r guesses, v of them right and f(v) = P[Binomial(r, e^ε/(1 + e^ε)) ≥ v],
    P[W ≥ v] ≤ f(v) + 2mδ · max_{1 ≤ i ≤ v} (f(v − i) − f(v)) / i, capped at 1. f(v − i) − f(v) is the binomial mass
    on v − i … v − 1; an i above v adds no mass and only divides by more, so the maximum stops at v. δ = 0 leaves
    the binomial tail of their pure-DP statement.
    """
    from scipy.stats import binom

    m = check_int("canaries", canaries, minimum=1)
    r = check_int("guesses", guesses, minimum=0)
    v = check_int("correct", correct, minimum=0)
    if not v <= r <= m:
        raise ValueError(f"need correct <= guesses <= canaries, got {v}, {r}, {m}")
    eps = check_float("epsilon", epsilon, low=0.0)
    d = _check_delta(delta)
    q = 1.0 / (1.0 + math.exp(-eps))
    p = float(binom.sf(v - 1, r, q))
    if d > 0.0 and v > 0:
        below = np.cumsum(binom.pmf(np.arange(v - 1, -1, -1), r, q))  # mass on v − i … v − 1, i = 1 … v
        p += 2.0 * m * d * float((below / np.arange(1, v + 1)).max())
    return min(p, 1.0)


def correct_guesses(scores: Tensor, included: Tensor, guesses: int) -> int:
    """How many guesses are right: "included" for the ``guesses``/2 highest scores, "excluded" for the lowest."""
    order = torch.argsort(scores, stable=True)
    return int(included[order[scores.numel() - guesses // 2:]].sum()) + int((~included[order[:guesses // 2]]).sum())


def one_run_bound(canaries: int, guesses: int, correct: int, delta: float, confidence: float) -> float:
    """The one-run ε lower bound at α = 1 − ``confidence``: the ε at which the p-value (:func:`one_run_p_value`)
    reaches α.

    δ = 0: the closed form, e^ε/(1 + e^ε) = the one-sided Clopper–Pearson lower bound of the right fraction (the
    ε where the binomial tail is α). δ > 0: bisection, keeping p(lo) ≤ α < p(hi), and lo is returned. Any ε whose
    p-value is at most α is a valid bound: at every ε' above the true ε the theorem bounds the tail P[W ≥ v] by
    the p-value, and the exact tail's p-value P[W ≥ V] is at most α with probability at most α. So the bisection is
    sound even where the p-value is not monotone in ε (it is when 2mδ ≤ 1: f and each (f(v − i) − f(v))/i term
    then rise together with e^ε/(1 + e^ε)).
    """
    if delta == 0.0:
        lower, _ = clopper_pearson(correct, guesses, confidence)
        p = float(lower)
        return max(0.0, math.log(p / (1.0 - p))) if 0.0 < p < 1.0 else (math.inf if p >= 1.0 else 0.0)
    alpha = 1.0 - confidence

    def p_value(eps: float) -> float:
        return one_run_p_value(canaries, guesses, correct, eps, delta)

    if p_value(0.0) > alpha:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(hi) <= alpha:  # ends: beyond ε ≈ 37, e^ε/(1 + e^ε) rounds to 1 and the p-value is 1
        lo, hi = hi, 2.0 * hi
    for _ in range(_ONE_RUN_STEPS):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if p_value(mid) <= alpha else (lo, mid)
    return lo



"""What the compiled loops of the clustering-of-bandits family share (Liu et al., UAI 2022, and its baselines): the
block of steps they play (:class:`StepBlock`), the radius parameters (:class:`ClusterParams`), the confidence
radius β under both conventions, and the UCB pick on aggregated statistics.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedrec.protocols.kernels.linear import first_near_max, solve_into
from fedrec.utils.jit import F64, I64, jit

#: β recipes (``ClusterParams.beta_mode``): Lemma 1 (the paper), the authors' non-private and CDP radii
BETA_LEMMA1, BETA_AUTHORS, BETA_AUTHORS_CDP = 0, 1, 2


class StepBlock(NamedTuple):
    """A block of steps of every replicate: who arrives, what is offered, the arms (written by the kernel)."""

    users: I64[2]  #: (R, S) the arriving user of each step
    contexts: F64[4]  #: (R, S, K, d)
    rewards: F64[3]  #: (R, S, K)
    arms: I64[2]  #: (R, S) the decisions
    t0: int  #: the round before the block (step s plays round t0 + s + 1)


class ClusterParams(NamedTuple):
    """The recommendation conventions as the kernels read them (:meth:`fedrec.protocols.clustering.Radius.params`);
    fields a recipe does not use are NaN."""

    squared: bool  #: the bonus β·xᵀM⁻¹x instead of β·sqrt(xᵀM⁻¹x)
    beta_fixed: float  #: a fixed β; NaN: the recipe's
    beta_mode: int  #: :data:`BETA_LEMMA1`, :data:`BETA_AUTHORS` or :data:`BETA_AUTHORS_CDP`
    beta_scale: float  #: multiplies the recipe's β
    sigma0: float  #: σ₀
    base: float  #: the ridge of the aggregates: λ, or ρ_min = ρ with CDP (Lemma 1)
    log_mla: float  #: the recipe's log term: ln(mL/α), ln(2/α) or ln(2T/α₁)
    ratio: float  #: ρ_max/ρ_min (Lemma 1)
    rho_max: float  #: ρ_max (Lemma 1)
    kappa: float  #: κ (Lemma 1)
    larg2: float  #: L_arg² of the authors' β
    servers: int  #: L
    rho_per_nu: float  #: ρ(ν)/ν of the authors' CDP β
    kappa_per_root_nu: float  #: κ(ν)/sqrt(ν) of the authors' CDP β


@jit
def beta(p: ClusterParams, count: float, members: int, d: int, t: int) -> float:
    """The radius of a cluster with ``count`` observations in round ``t`` (``log_mla`` holds the recipe's log term):

    * Lemma 1: σ₀·sqrt(2 ln(mL/α) + d ln(ρ_max/ρ_min + T/(d L′ ρ_min))) + sqrt(L′ ρ_max) + sqrt(L′) κ, with
      ρ_min = ρ_max = λ and κ = 0 without privacy; L′ = ``members``;
    * authors: σ₀·sqrt(2 ln(2/α) + d ln(3 + t L_arg²/d)) (their code);
    * authors CDP: σ₀·sqrt(2 ln(2T/α₁) + d ln(1 + T_c/(d L λ))) + sqrt(L ρ(ν)) + sqrt(L) κ(ν) with
      ν = ln T_c + 1, ρ(ν) and κ(ν) the paper's with ln(2T/α₁) for ln(2mL/α) (their code);

    times ``beta_scale``; or the fixed β."""
    if not np.isnan(p.beta_fixed):
        return p.beta_fixed
    if p.beta_mode == BETA_AUTHORS:
        inner = 2.0 * p.log_mla + d * np.log(3.0 + t * p.larg2 / d)
        return p.beta_scale * p.sigma0 * np.sqrt(max(inner, 0.0))
    if p.beta_mode == BETA_AUTHORS_CDP:
        nu = np.log(max(count, 1.0)) + 1.0
        L = p.servers
        inner = 2.0 * p.log_mla + d * np.log(1.0 + count / (d * L * p.base))
        extra = np.sqrt(L * p.rho_per_nu * nu) + np.sqrt(L * nu) * p.kappa_per_root_nu
        return p.beta_scale * (p.sigma0 * np.sqrt(max(inner, 0.0)) + extra)
    inner = 2.0 * p.log_mla + d * np.log(p.ratio + count / (d * members * p.base))
    extra = np.sqrt(members * p.rho_max) + np.sqrt(members) * p.kappa
    return p.beta_scale * (p.sigma0 * np.sqrt(inner) + extra)


@jit
def ucb_pick(ctx: np.ndarray, Minv: np.ndarray, w: np.ndarray, radius: float, squared: bool, theta: np.ndarray,
             scores: np.ndarray) -> int:
    """The arm of x θ̂ + β·sqrt(xᵀM⁻¹x) (or β·xᵀM⁻¹x, ``squared``) with θ̂ = M⁻¹w, contexts ``ctx`` (K, d);
    the first within the tie tolerance of the best."""
    K, d = ctx.shape
    solve_into(Minv, w, theta)
    for a in range(K):
        mean = 0.0
        width = 0.0
        for p in range(d):
            mean += ctx[a, p] * theta[p]
            acc = 0.0
            for q in range(d):
                acc += Minv[p, q] * ctx[a, q]
            width += ctx[a, p] * acc
        width = max(width, 0.0)
        scores[a] = mean + radius * (width if squared else np.sqrt(width))
    return first_near_max(scores)


@jit
def confidence_shape(x: float) -> float:
    """F(x) = sqrt((1 + ln(1 + x)) / (1 + x)), the width of the deletion, split and merge tests."""
    return np.sqrt((1.0 + np.log1p(x)) / (1.0 + x))

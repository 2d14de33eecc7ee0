"""What the compiled loops of the clustering-of-bandits family share (spec fclub.md §2, §2.8, §8.3–8.4): the
parameter layout, the confidence radius β under both conventions, and the UCB pick on aggregated statistics.
"""
from __future__ import annotations

import numpy as np

from fedrec.jit import jit
from fedrec.protocols.kernels.linear import first_near_max, solve_into

# params layout (a float64 array shared by FCLUB's phase loop and the per-server baselines)
P_LOG_U, P_LOG_D, P_SIGMA0, P_LOG_MLA, P_BASE, P_RATIO, P_RHO_MAX, P_KAPPA = 0, 1, 2, 3, 4, 5, 6, 7
P_BETA_SCALE, P_BETA_FIXED, P_SQUARED, P_PRIVATE, P_RHO, P_SIGMA_NODE, P_SCALARS = 8, 9, 10, 11, 12, 13, 14
P_BETA_MODE, P_LARG2, P_SERVERS, P_RHO_PER_NU, P_KAPPA_PER_ROOT_NU = 15, 16, 17, 18, 19
NUM_PARAMS = 20

#: β recipes (``P_BETA_MODE``): Lemma 1 (the paper), the authors' non-private and CDP radii (§4.2, §8.4)
BETA_LEMMA1, BETA_AUTHORS, BETA_AUTHORS_CDP = 0, 1, 2


@jit
def beta(params: np.ndarray, count: float, members: int, d: int, t: int) -> float:
    """The radius of a cluster with ``count`` observations in round ``t`` (P_LOG_MLA holds the recipe's log term):

    * Lemma 1: σ₀·sqrt(2 ln(mL/α) + d ln(ρ_max/ρ_min + T/(d L′ ρ_min))) + sqrt(L′ ρ_max) + sqrt(L′) κ, with
      ρ_min = ρ_max = λ and κ = 0 without privacy (§2.0, §2.7); L′ = ``members``;
    * authors: σ₀·sqrt(2 ln(2/α) + d ln(3 + t L_arg²/d)) (§4.2);
    * authors CDP: σ₀·sqrt(2 ln(2T/α₁) + d ln(1 + T_c/(d L λ))) + sqrt(L ρ(ν)) + sqrt(L) κ(ν) with
      ν = ln T_c + 1, ρ(ν) and κ(ν) the paper's with ln(2T/α₁) for ln(2mL/α) (§8.4);

    times ``beta_scale``; or the fixed β."""
    if not np.isnan(params[P_BETA_FIXED]):
        return params[P_BETA_FIXED]
    mode = params[P_BETA_MODE]
    if mode == BETA_AUTHORS:
        inner = 2.0 * params[P_LOG_MLA] + d * np.log(3.0 + t * params[P_LARG2] / d)
        return params[P_BETA_SCALE] * params[P_SIGMA0] * np.sqrt(max(inner, 0.0))
    if mode == BETA_AUTHORS_CDP:
        nu = np.log(max(count, 1.0)) + 1.0
        L = params[P_SERVERS]
        inner = 2.0 * params[P_LOG_MLA] + d * np.log(1.0 + count / (d * L * params[P_BASE]))
        extra = np.sqrt(L * params[P_RHO_PER_NU] * nu) + np.sqrt(L * nu) * params[P_KAPPA_PER_ROOT_NU]
        return params[P_BETA_SCALE] * (params[P_SIGMA0] * np.sqrt(max(inner, 0.0)) + extra)
    base = params[P_BASE]
    inner = 2.0 * params[P_LOG_MLA] + d * np.log(params[P_RATIO] + count / (d * members * base))
    extra = np.sqrt(members * params[P_RHO_MAX]) + np.sqrt(members) * params[P_KAPPA]
    return params[P_BETA_SCALE] * (params[P_SIGMA0] * np.sqrt(inner) + extra)


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
    """F(x) = sqrt((1 + ln(1 + x)) / (1 + x)), the width of the deletion, split and merge tests (§2.0)."""
    return np.sqrt((1.0 + np.log1p(x)) / (1.0 + x))

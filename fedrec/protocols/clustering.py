"""What the clustering-of-bandits protocols share on the Python side (Liu et al., UAI 2022): the
``conventions`` switch and the radius parameters it resolves to, and the width F of the clustering tests.

``conventions=paper`` scores x θ̂ + β·sqrt(xᵀM⁻¹x) with Lemma 1's β and λ = 1; ``conventions=authors`` takes the
released code's conventions: the squared bonus β·xᵀM⁻¹x, λ = 2 (1 with CDP), β = 0.5·sqrt(2 ln(2/α) + d ln(3 +
t L_arg²/d)) with each method's α of the code, and for CDP-FCLUB-DC the code's β recipe × 0.005. Besides the
radius the switch only picks where CDP-FCLUB-DC's noise goes (:class:`~fedrec.protocols.FederatedClustering`'s
``noise_placement``); the clustering constants, the privatiser and its shifts stay the paper's. A value given
explicitly (``bonus``, ``lam``, ``sigma0``, ``beta_scale``) overrides the convention's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedrec.errors import check_choice, check_float, check_int
from fedrec.privacy.tree import TreeGaussian
from fedrec.protocols.kernels.clustering import BETA_AUTHORS, BETA_AUTHORS_CDP, BETA_LEMMA1, ClusterParams

CONVENTIONS = ("paper", "authors")
BONUS = ("sqrt", "squared")
#: the α inside ln(2/α) of the authors' non-private β: each method's ``alpha`` in their code
AUTHORS_ALPHA = {"fclub": 1.5, "club": 0.25, "sclub": 1.5, "linucb": 15.0}
#: α₁ of the authors' CDP β, in ln(2T/α₁)
AUTHORS_CDP_ALPHA = 1.0
#: the authors' CDP β is their recipe times this (README: "beta_scaling = 0.005")
AUTHORS_CDP_SCALE = 0.005


def confidence_shape(x: np.ndarray) -> np.ndarray:
    """F(x) = sqrt((1 + ln(1 + x)) / (1 + x)), the width of the deletion, split and merge tests."""
    return np.sqrt((1.0 + np.log1p(x)) / (1.0 + x))


@dataclass(frozen=True)
class Radius:
    """The recommendation conventions a protocol runs with, resolved from ``conventions`` and explicit values."""

    conventions: str
    bonus: str
    lam: float
    sigma0: float
    beta_scale: float
    beta: float | None  # a fixed β instead of the recipe

    @classmethod
    def resolve(cls, conventions: str, private: bool, bonus: str | None = None, lam: float | None = None,
                sigma0: float | None = None, beta_scale: float | None = None, beta: float | None = None) -> Radius:
        """The convention's values, each overridden by the one given (None: the convention's)."""
        check_choice("conventions", conventions, CONVENTIONS)
        if conventions == "paper":
            default = ("sqrt", 1.0, 0.5, 1.0)
        else:
            default = ("squared", 1.0, 1.0, AUTHORS_CDP_SCALE) if private else ("squared", 2.0, 0.5, 1.0)
        bonus = check_choice("bonus", default[0] if bonus is None else bonus, BONUS)
        return cls(
            conventions, bonus,
            check_float("lam", default[1] if lam is None else lam, low=0.0, low_open=True),
            check_float("sigma0", default[2] if sigma0 is None else sigma0, low=0.0),
            check_float("beta_scale", default[3] if beta_scale is None else beta_scale, low=0.0),
            None if beta is None else check_float("beta", beta, low=0.0),
        )

    def params(self, method: str, dim: int, num_servers: int, clusters_bound: int, alpha: float,
               synchronous: bool = False, privacy: TreeGaussian | None = None) -> dict[str, Any]:
        """The kernels' :class:`~fedrec.protocols.kernels.clustering.ClusterParams` by field name, with the radius
        fields and λ (``base``) set and those the recipe does not use NaN.

        ``alpha`` is the failure probability of Lemma 1 (checked by the caller, in (0, 1]); ``synchronous`` methods
        (FCLUB, Homo) take the authors' L_arg = L; ``privacy`` is the CDP run's mechanism (authors CDP β)."""
        d, L = dim, num_servers
        m = check_int("clusters_bound", clusters_bound)
        p: dict[str, Any] = dict.fromkeys(ClusterParams._fields, math.nan)
        p.update(squared=self.bonus == "squared", beta_fixed=math.nan if self.beta is None else self.beta,
                 sigma0=self.sigma0, beta_scale=self.beta_scale, servers=L, base=self.lam)
        if self.conventions == "paper":
            p.update(beta_mode=BETA_LEMMA1, log_mla=math.log(m * L / alpha), ratio=1.0, rho_max=self.lam,
                     kappa=0.0)  # with CDP: the caller's
        elif privacy is None:
            p.update(beta_mode=BETA_AUTHORS, log_mla=math.log(2 / AUTHORS_ALPHA[method]),
                     larg2=float(L * L if synchronous else 1))
        else:
            log_term = math.log(2 * privacy.horizon / AUTHORS_CDP_ALPHA)
            eps, dlt = privacy.epsilon, privacy.delta
            p.update(beta_mode=BETA_AUTHORS_CDP, log_mla=log_term,
                     rho_per_nu=8 * math.sqrt(2) * math.log(4 / dlt) * (4 * math.sqrt(d) + 2 * log_term) / eps,
                     kappa_per_root_nu=math.sqrt(2 * (math.sqrt(d) + 2 * log_term) / math.sqrt(2 * eps)))
        return p

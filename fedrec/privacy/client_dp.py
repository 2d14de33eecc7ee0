"""Client-level DP of a federated run: a noise mechanism, a per-client accountant, and per-round budgets.

Budget units (what a budget callback such as a planner sets per round, spec bgtplanner.md §1.4):

* Laplace: the round's ε_t. Basic composition: a client may spend Σ_t ε_t ≤ ε_total.
* Gaussian: the round's **RDP budget** ρ_t at a fixed order α (paper §IV: clients "convert the budget to the RDP
  budget, which can then be simply split into multiple training rounds"). The noise multiplier is
  ``z_t = sqrt(α / (2 ρ_t))`` (:func:`rdp_noise_multiplier`; one Gaussian round has RDP ``α / (2 z²)`` at order α), and the RDP budget of a
  client is ``ε_total − c(α, δ)`` with ``c`` Opacus's RDP → (ε, δ) conversion at order α, so spending it exactly
  gives ε_total at δ. ``rdp_alpha="auto"`` takes the order (among Opacus's default orders) at which a uniform
  split needs the least noise (α ≈ 3.5 at ε_total = 10, δ = 1e-5).

Whatever the per-round budgets are, the reported ε comes from the accountant (Opacus RDP over all orders, or
PRV), which is never larger than the fixed-order bound, and a round that would take a client past ε_total does
not run for that client.

Randomness (``rng``): ``"reproducible"`` (the default, for research) derives every privacy draw from the run's seed
with :func:`fedrec.seeding.torch_generator`, so a run and its resume repeat the same noise, and anyone who knows
the seed can recompute it. ``"secure"`` (for deployment-grade runs) makes every draw that protects clients (the
DP noise, and the pseudo items, pseudo rows and upload order of federated recommendation) with a fresh generator
seeded from the operating system's cryptographic source (:func:`fedrec.privacy.mechanisms.secure_generator`):
not reproducible, and a resumed run restores the accountant's state, not the draws.
"""
from __future__ import annotations

import math
import warnings
from typing import Any

import torch
from torch import Tensor

from fedrec.errors import ConfigError, check_float
from fedrec.privacy.accountant import ClientAccountant, uniform_epsilon_per_round
from fedrec.privacy.mechanisms import (
    GaussianMechanism,
    LaplaceMechanism,
    NoiseMechanism,
    check_sensitivity,
    rdp_noise_multiplier,
    secure_generator,
)
from fedrec.seeding import torch_generator

#: where privacy draws come from (see the module docstring)
RNGS = ("reproducible", "secure")

#: relative margin kept below a client's total by the uniform split and by every planner's schedule or levels, so
#: float rounding never makes their last round unaffordable
BUDGET_MARGIN = 1e-9


def rdp_conversion_cost(alpha: float, delta: float) -> float:
    """``c(α, δ)``: the ε of an RDP guarantee of 0 at order α, by Opacus's conversion (Balle et al. 2020), so an
    RDP guarantee ρ at α gives (ρ + c, δ)-DP."""
    from opacus.accountants.analysis.rdp import get_privacy_spent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a single order is always "the smallest alpha"
        eps, _ = get_privacy_spent(orders=[alpha], rdp=[0.0], delta=delta)
    return float(eps)


def best_rdp_order(epsilon_total: float, delta: float) -> float:
    """The order at which a uniform split of the RDP budget needs the least noise: argmin α / (ε_total − c(α, δ))
    over Opacus's default orders with a positive budget."""
    from opacus.accountants import RDPAccountant

    best, best_cost = None, math.inf
    for alpha in RDPAccountant.DEFAULT_ALPHAS:
        budget = epsilon_total - rdp_conversion_cost(alpha, delta)
        if budget > 0 and alpha / budget < best_cost:
            best, best_cost = float(alpha), alpha / budget
    if best is None:
        raise ConfigError(f"privacy.epsilon={epsilon_total} is too small for privacy.delta={delta}: no RDP order "
                          "leaves a positive budget")
    return best


def _orders_with(alpha: float | None) -> list[float] | None:
    """Opacus's default RDP orders plus ``alpha`` (None: the defaults, or no order at all for Laplace)."""
    if alpha is None:
        return None
    from opacus.accountants import RDPAccountant

    orders = [float(a) for a in RDPAccountant.DEFAULT_ALPHAS]
    return orders if alpha in orders else sorted([*orders, alpha])


class ClientDP:
    """Clip-and-noise every client's upload and account each client's privacy (see the module docstring).

    Args:
        num_clients: clients of the run.
        mechanism: ``"gaussian"`` or ``"laplace"``.
        epsilon: each client's total ε; > 0.
        delta: δ at which the Gaussian ε is reported, in (0, 1) (ignored for Laplace).
        clip: norm bound of a client's whole upload (L2 Gaussian, L1 Laplace); > 0.
        sensitivity_factor: Δ = factor · clip (2: the clip ball's diameter, see mechanisms).
        adjacency: ``"replace_one"`` (needs sensitivity_factor ≥ 2) or ``"add_remove"`` (≥ 1; only valid if the
            server cannot tell a zero upload from a missing one), see :func:`check_sensitivity`.
        accountant: ``"rdp"`` or ``"prv"`` (Gaussian).
        rdp_alpha: the RDP order of Gaussian budgets, a number > 1 or ``"auto"``.
        rng: ``"reproducible"`` or ``"secure"`` (see the module docstring).
    """

    def __init__(
        self,
        num_clients: int,
        mechanism: str = "gaussian",
        epsilon: float = 10.0,
        delta: float = 1e-5,
        clip: float = 0.1,
        sensitivity_factor: float = 2.0,
        adjacency: str = "replace_one",
        accountant: str = "rdp",
        rdp_alpha: float | str = "auto",
        rng: str = "reproducible",
    ) -> None:
        mechs: dict[str, type[NoiseMechanism]] = {"gaussian": GaussianMechanism, "laplace": LaplaceMechanism}
        if mechanism not in mechs:
            raise ConfigError(f"privacy.mechanism must be one of ['none', 'gaussian', 'laplace'], got {mechanism!r}")
        if rng not in RNGS:
            raise ConfigError(f"privacy.rng must be one of {list(RNGS)}, got {rng!r}")
        self.rng = rng
        self.epsilon_total = check_float("privacy.epsilon", epsilon, low=0.0, low_open=True)
        if mechanism == "gaussian":
            self.delta = check_float("privacy.delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
        else:
            self.delta = 0.0
        self.clip = check_float("privacy.clip", clip, low=0.0, low_open=True)  # as configured (a planner may vary it)
        factor = check_sensitivity(sensitivity_factor, adjacency, prefix="privacy.")
        self.mechanism = mechs[mechanism](clip=self.clip, sensitivity_factor=factor, adjacency=adjacency)
        if mechanism == "gaussian":
            if rdp_alpha == "auto":
                self.rdp_alpha = best_rdp_order(self.epsilon_total, self.delta)
            else:
                self.rdp_alpha = check_float("privacy.rdp_alpha", rdp_alpha, low=1.0, low_open=True)
            self.total_budget = self.epsilon_total - rdp_conversion_cost(self.rdp_alpha, self.delta)
            if self.total_budget <= 0:
                raise ConfigError(
                    f"privacy.rdp_alpha={self.rdp_alpha} with privacy.delta={self.delta} leaves no RDP budget: "
                    f"privacy.epsilon must exceed {self.epsilon_total - self.total_budget:.4g} (or use rdp_alpha=auto)")
        else:
            self.rdp_alpha = None
            self.total_budget = self.epsilon_total
        # the accountant also evaluates the budgets' own order, so a split of the RDP budget at a hand-set α
        # off Opacus's grid is never refused by rounding at the grid's neighbouring orders
        self.accountant = ClientAccountant(num_clients, mechanism, accountant, self.epsilon_total,
                                           self.delta if mechanism == "gaussian" else None,
                                           alphas=_orders_with(self.rdp_alpha))

    @property
    def name(self) -> str:
        return self.mechanism.name

    @property
    def budget_unit(self) -> str:
        return "epsilon" if self.rdp_alpha is None else f"rdp_epsilon(alpha={self.rdp_alpha:g})"

    def generator(self, seed: int, name: str, round_idx: int) -> torch.Generator:
        """The generator of privacy draw ``name`` in round ``round_idx``: counter based on ``seed``
        (``rng="reproducible"``) or freshly seeded from the OS's cryptographic source (``rng="secure"``)."""
        return torch_generator(seed, name, round_idx) if self.rng == "reproducible" else secure_generator()

    def uniform_budget(self, rounds: int) -> float:
        """The uniform split of a client's total budget over ``rounds`` rounds (the default schedule)."""
        if self.rdp_alpha is None:
            return uniform_epsilon_per_round(self.total_budget, rounds)
        return self.total_budget * (1.0 - BUDGET_MARGIN) / rounds

    def levels(self, budget: Tensor) -> Tensor:
        """The accountant's level per client for per-round budgets (Gaussian: noise multiplier; Laplace: ε_t)."""
        b = torch.as_tensor(budget, dtype=torch.float64)
        if not bool((torch.isfinite(b) & (b > 0)).all()):
            raise ConfigError(f"a round's privacy budget must be finite and > 0 for every client, got {b.min()}")
        return b if self.rdp_alpha is None else rdp_noise_multiplier(b, self.rdp_alpha)

    def affordable(self, budget: float | Tensor, participating: Tensor) -> bool:
        """Whether every ``participating`` client can take a round at ``budget`` without exceeding its total
        (the accountant decides)."""
        b = torch.as_tensor(budget, dtype=torch.float64)
        b = b.expand(participating.shape[0]) if b.dim() == 0 else b
        return not bool(self.accountant.would_exceed(self.levels(b), participating).any())

    def spent(self) -> Tensor:
        return self.accountant.spent()

    def summary(self) -> dict[str, Any]:
        spent = self.spent()
        hist = self.accountant.state_dict()["history"]
        out: dict[str, Any] = {
            "privacy": self.name,
            "epsilon_total": self.epsilon_total,
            "delta": self.delta,
            "epsilon_spent": float(spent.max()),
            "epsilon_spent_mean": float(spent.mean()),
            "accountant": self.accountant.accountant if self.rdp_alpha is not None else "basic_composition",
            "clip": self.clip,
            "sensitivity": self.mechanism.sensitivity,
            "adjacency": self.mechanism.adjacency,
            "privacy_rng": self.rng,
        }
        if self.rdp_alpha is not None:
            out["rdp_alpha"] = self.rdp_alpha
        if hist.numel():
            out[f"mean_{self.mechanism.level_name}"] = float(torch.nanmean(hist))
        return out

"""Client-level DP of a federated run: a noise mechanism, a per-client accountant, and per-round budgets.

Budget units (what a budget callback such as a planner sets per round, BGTplanner paper §IV):

* Laplace: the round's ε_t. Basic composition: a client may spend Σ_t ε_t ≤ ε_total.
* Gaussian: the round's **RDP budget** ρ_t at a fixed order α (paper §IV: clients "convert the budget to the RDP
  budget, which can then be simply split into multiple training rounds"). The noise multiplier is
  ``z_t = sqrt(α / (2 ρ_t))`` (:func:`rdp_noise_multiplier`; one Gaussian round has RDP ``α / (2 z²)`` at order α), and
  the RDP budget of a client is ``ε_total − c(α, δ)`` with ``c`` Opacus's RDP → (ε, δ) conversion at order α, so
  spending it exactly gives ε_total at δ. ``rdp_alpha="auto"`` takes the order (among Opacus's default orders) at which
  a uniform split needs the least noise (α ≈ 3.5 at ε_total = 10, δ = 1e-5).

Conventions (``conventions``; a recommendation round's uploads are clipped and noised by
:func:`fedrec.recsys.privatize.privatize_uploads`):

* ``"paper"`` (the default): the above. Each client's whole upload (ω and its real item rows) is clipped once and
  noised at the round's level, and the accountant's ε never exceeds ε_total.
* ``"authors"``: the authors' code. Every tensor of an upload (each ω parameter tensor, each real item row) is
  clipped to ``clip`` and noised separately at the round's full level: σ = sqrt(Δ²·α/(2ε_t)) with α =
  ``rdp_alpha`` (default 2), or b = Δ/ε_t. ε_total is a linear budget on Σ_t ε_t (treated as an RDP budget at α
  under Gaussian, with no conversion), and a client takes part while it has any budget left, so its last round
  may overspend it. The authors' nominal ε (Σ_t ε_t) is reported beside the true ε that the accountant computes
  for the same noise: a client's k noised tensors in a round are one mechanism on their concatenation, with
  sensitivity √k·Δ (Gaussian, noise multiplier z/√k) or k·Δ (Laplace, ε = k·ε_t).

Whatever the per-round budgets are, the reported ε comes from the accountant (Opacus RDP over all orders, or
PRV), which is never larger than the fixed-order bound, and a round that would take a client past ε_total does
not run for that client.

Placement (``placement``): ``"client"`` (the above: each client noises its own upload, local DP of the upload) or
``"server"``: each client clips its upload and the server adds one Gaussian draw to the sum of the round's clipped
uploads (DP-FedAvg; a trusted aggregator or secure aggregation assumed, :mod:`fedrec.privacy.central`). Every client
then has the same history, a Poisson-subsampled Gaussian round at the strategy's sampling rate q per round, and one
noise multiplier calibrated for the whole run (``noise_multiplier`` fixes it instead); per-round budgets (a planner)
do not apply. Server placement needs Gaussian noise, the paper conventions and add/remove adjacency (the sampled
analysis's).

Randomness (``rng``): every draw that protects clients (the DP noise, and the pseudo items, pseudo rows and upload
order of federated recommendation) comes from counter-based streams keyed by (key, client, counter)
(:class:`fedrec.utils.rng.KeyedRows`), so a client draws the same numbers in whichever process computes it. The key of
a draw in a round (:meth:`ClientDP.draw_key`) is, under ``"reproducible"`` (the default, for research), derived
from the run's seed, the draw's name and the round, so a run and its resume repeat the same noise, and anyone who
knows the seed can recompute it; under ``"secure"`` (for deployment-grade runs) it is 64 fresh bits from the
operating system's cryptographic source (``secrets``): not reproducible, and a resumed run restores the
accountant's state, not the draws. The streams are splitmix64 hashes, statistically sound but not a cryptographic
generator (neither is the Mersenne Twister torch's generators use).
"""
from __future__ import annotations

import math
import secrets
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from fedrec.errors import ConfigError, check_choice, check_float
from fedrec.privacy.accountant import (
    ClientAccountant,
    SampledGaussianAccountant,
    check_epsilon_setting,
    sampled_noise_multiplier,
    scheduled_noise_multiplier,
    uniform_epsilon_per_round,
)
from fedrec.privacy.central import ServerNoise, check_schedule
from fedrec.privacy.mechanisms import (
    GaussianMechanism,
    LaplaceMechanism,
    NoiseMechanism,
    check_sensitivity,
    rdp_noise_multiplier,
)
from fedrec.utils.rng import stream_key

#: where privacy draws come from (see the module docstring)
RNGS = ("reproducible", "secure")

#: accounting and noising conventions (see the module docstring)
CONVENTIONS = ("paper", "authors")
#: the authors' RDP order (the α of their released code; the paper gives none)
AUTHORS_RDP_ALPHA = 2.0

#: where the noise is added (see the module docstring)
PLACEMENTS = ("client", "server")
#: δ when none is set: 1e-5, or 1/(10·N) for runs of more than 10,000 clients, so that δ stays well below 1/N
DEFAULT_DELTA = 1e-5

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
    """A run's client-level DP: the mechanism that clips and noises uploads, each client's accountant and the
    per-round budgets (see the module docstring).

    Args:
        num_clients: clients of the run.
        mechanism: ``"gaussian"`` or ``"laplace"``.
        epsilon: each client's total ε; > 0.
        delta: δ at which the Gaussian ε is reported, in (0, 1) (ignored for Laplace); None:
            ``min(1e-5, 1/(10·num_clients))``.
        clip: norm bound of a client's whole upload (L2 Gaussian, L1 Laplace); > 0.
        sensitivity_factor: Δ = factor · clip (2: the clip ball's diameter, see mechanisms).
        adjacency: ``"replace_one"`` (needs sensitivity_factor ≥ 2) or ``"add_remove"`` (≥ 1; only valid if the
            server cannot tell a zero upload from a missing one), see :func:`check_sensitivity`.
        accountant: ``"rdp"`` or ``"prv"`` (Gaussian).
        rdp_alpha: the RDP order of Gaussian budgets, a number > 1 or ``"auto"`` (paper: the order a uniform
            split needs least noise at; authors: 2).
        rng: ``"reproducible"`` or ``"secure"`` (see the module docstring).
        conventions: ``"paper"`` or ``"authors"`` (see the module docstring).
        placement: ``"client"`` or ``"server"`` (see the module docstring).
        noise_multiplier: server placement: the rounds' z; None calibrates it to spend ``epsilon`` over the run.
        noise_schedule: server placement: one factor per round, round t's z being ``noise_multiplier · g_t`` (its
            calibration spends ``epsilon`` over the scheduled rounds); None: the same z every round.
        adaptive_clip, target_quantile, clip_lr, count_stddev: server placement's adaptive clipping
            (:class:`~fedrec.privacy.central.ServerNoise`).
    """

    def __init__(
        self,
        num_clients: int,
        mechanism: str = "gaussian",
        epsilon: float = 10.0,
        delta: float | None = None,
        clip: float = 0.1,
        sensitivity_factor: float = 2.0,
        adjacency: str = "replace_one",
        accountant: str = "rdp",
        rdp_alpha: float | str = "auto",
        rng: str = "reproducible",
        conventions: str = "paper",
        placement: str = "client",
        noise_multiplier: float | None = None,
        adaptive_clip: bool = False,
        target_quantile: float = 0.5,
        clip_lr: float = 0.2,
        count_stddev: float | None = None,
        noise_schedule: Sequence[float] | None = None,
    ) -> None:
        mechs: dict[str, type[NoiseMechanism]] = {"gaussian": GaussianMechanism, "laplace": LaplaceMechanism}
        if mechanism not in mechs:  # "none" (no client-level DP) is read by fedrec.app.build, which makes no ClientDP
            check_choice("privacy.mechanism", mechanism, ("none", *mechs))
            raise ConfigError("privacy.mechanism=none builds no ClientDP: the run trains without client-level DP")
        check_choice("privacy.rng", rng, RNGS)
        check_choice("privacy.conventions", conventions, CONVENTIONS)
        self.placement = check_choice("privacy.placement", placement, PLACEMENTS)
        self.rng, self.conventions = rng, conventions
        authors = conventions == "authors"
        self.epsilon_total = check_epsilon_setting(epsilon)
        if mechanism == "gaussian":
            if delta is None:
                delta = min(DEFAULT_DELTA, 0.1 / num_clients)
            self.delta = check_float("privacy.delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
        else:
            self.delta = 0.0
        self.clip = check_float("privacy.clip", clip, low=0.0, low_open=True)  # as configured (a planner may vary it)
        factor = check_sensitivity(sensitivity_factor, adjacency, prefix="privacy.")
        self.mechanism = mechs[mechanism](clip=self.clip, sensitivity_factor=factor, adjacency=adjacency)
        if mechanism == "gaussian":
            if rdp_alpha == "auto":
                self.rdp_alpha = AUTHORS_RDP_ALPHA if authors else best_rdp_order(self.epsilon_total, self.delta)
            else:
                self.rdp_alpha = check_float("privacy.rdp_alpha", rdp_alpha, low=1.0, low_open=True)
            self.total_budget = self.epsilon_total - (0.0 if authors else rdp_conversion_cost(self.rdp_alpha,
                                                                                             self.delta))
            if self.total_budget <= 0:
                raise ConfigError(
                    f"privacy.rdp_alpha={self.rdp_alpha} with privacy.delta={self.delta} leaves no RDP budget: "
                    f"privacy.epsilon must exceed {self.epsilon_total - self.total_budget:.4g} (or use rdp_alpha=auto)")
        else:
            self.rdp_alpha = None
            self.total_budget = self.epsilon_total
        # the accountant also evaluates the budgets' own order, so a split of the RDP budget at a hand-set α
        # off Opacus's grid is never refused by rounding at the grid's neighbouring orders
        # authors: the accountant only measures (no cap); the authors' linear ledger decides who takes part
        self.accountant = ClientAccountant(num_clients, mechanism, accountant,
                                           math.inf if authors else self.epsilon_total,
                                           self.delta if mechanism == "gaussian" else None,
                                           alphas=_orders_with(self.rdp_alpha))
        self.nominal = torch.zeros(num_clients, dtype=torch.float64) if authors else None  # Σ_t ε_t per client
        self.num_clients = num_clients
        self.server: ServerNoise | None = None  # server placement: set by setup_server once the rounds are known
        self.sample_rate = 1.0
        schedule = None if noise_schedule is None else check_schedule(noise_schedule)
        self._server_settings = {"noise_multiplier": noise_multiplier, "adaptive": adaptive_clip,
                                 "target_quantile": target_quantile, "clip_lr": clip_lr, "count_stddev": count_stddev,
                                 "schedule": schedule}
        if self.placement == "server":
            if mechanism != "gaussian" or authors or adjacency != "add_remove":
                raise ConfigError("privacy.placement=server adds one Gaussian draw to the clipped sum and accounts "
                                  "Poisson-subsampled rounds under add/remove adjacency: it needs "
                                  "privacy.mechanism=gaussian, privacy.conventions=paper and "
                                  f"privacy.adjacency=add_remove (got {mechanism}, {conventions}, {adjacency})")
            self.server_accountant = SampledGaussianAccountant(self.delta, accountant)
        elif noise_multiplier is not None or adaptive_clip or schedule is not None:
            raise ConfigError("privacy.noise_multiplier, privacy.noise_schedule and privacy.adaptive_clip set the "
                              "server's noise: they need privacy.placement=server")

    def setup_server(self, rounds: int, sample_rate: float, expected_clients: float) -> None:
        """Server placement: the rounds' noise multiplier (``noise_multiplier``, or the smallest whose ``rounds``
        rounds at ``sample_rate`` spend ``epsilon`` at δ) and the server's noise, for rounds of
        ``expected_clients`` clients on average."""
        settings = dict(self._server_settings)
        z, schedule = settings.pop("noise_multiplier"), settings["schedule"]
        if schedule is not None and len(schedule) != rounds:
            raise ConfigError(f"privacy.noise_schedule has {len(schedule)} entries and the run {rounds} rounds "
                              "(task.rounds): give one per round")
        if z is None and schedule is None:
            z = sampled_noise_multiplier(self.epsilon_total * (1.0 - BUDGET_MARGIN), self.delta, sample_rate, rounds,
                                         self.accountant.accountant)
        elif z is None:
            z = scheduled_noise_multiplier(self.epsilon_total * (1.0 - BUDGET_MARGIN), self.delta, sample_rate,
                                           schedule, self.accountant.accountant)
        self.sample_rate = float(sample_rate)
        self.server = ServerNoise(self.mechanism, z, expected_clients=expected_clients, **settings)

    def record_server_round(self) -> None:
        """Account one server-placed round for every client (each was in it with probability q)."""
        self.server_accountant.step(self.server.noise_multiplier, 1, self.sample_rate)

    def server_round_affordable(self) -> bool:
        """Whether one more server-placed round keeps every client within ε_total."""
        eps = self.server_accountant.epsilon_after(self.server.noise_multiplier, 1, self.sample_rate)
        return eps <= self.epsilon_total

    @property
    def name(self) -> str:
        return self.mechanism.name

    @property
    def budget_unit(self) -> str:
        return "epsilon" if self.rdp_alpha is None else f"rdp_epsilon(alpha={self.rdp_alpha:g})"

    def draw_key(self, seed: int, name: str, round_idx: int) -> int:
        """The 64-bit key of draw ``name`` in round ``round_idx``: derived from ``seed`` (``rng="reproducible"``)
        or fresh from the OS's cryptographic source (``rng="secure"``)."""
        return int(stream_key(seed, name, round_idx)) if self.rng == "reproducible" else secrets.randbits(64)

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

    def admissible(self, budget: Tensor, holding: Tensor) -> Tensor:
        """The clients of ``holding`` that take a round at per-client ``budget``: those it does not take past
        their total (the accountant decides), or under the authors' conventions those with budget left."""
        if self.nominal is not None:
            return holding & (self.nominal < self.epsilon_total)
        return self.accountant.admissible(self.levels(budget), holding)

    def affordable(self, budget: float | Tensor, participating: Tensor) -> bool:
        """Whether every ``participating`` client can take a round at ``budget`` without exceeding its total
        (the accountant decides; under the authors' conventions: whether each has budget left)."""
        b = torch.as_tensor(budget, dtype=torch.float64)
        b = b.expand(participating.shape[0]) if b.dim() == 0 else b
        return bool(self.admissible(b, participating)[participating].all())

    def record(self, budget: Tensor, run: Tensor, tensors: Tensor | None = None) -> None:
        """Account a round at per-client ``budget`` for the clients in ``run``; ``tensors`` (authors'
        conventions): how many tensors each client noised, which the true ε composes."""
        levels = self.levels(budget)
        if self.nominal is None:
            self.accountant.step(levels, run)
            return
        if tensors is None:
            raise ValueError("the authors' conventions account each client's noised tensors: pass tensors")
        k = torch.as_tensor(tensors, dtype=torch.float64).clamp(min=1.0)
        self.nominal = torch.where(run, self.nominal + budget.double(), self.nominal)
        self.accountant.step(levels / k.sqrt() if self.rdp_alpha is not None else levels * k, run)

    def spent(self) -> Tensor:
        """Each client's ε spent so far (the accountant's, whatever the conventions or placement)."""
        if self.placement == "server":
            return torch.full((self.num_clients,), self.server_accountant.epsilon(), dtype=torch.float64)
        return self.accountant.spent()

    def round_metrics(self) -> dict[str, float]:
        """What a round reports: the largest ε spent; under the authors' conventions their nominal Σ_t ε_t
        instead (every client's true ε is a distinct history then, ~2 s to evaluate: the summary reports it)."""
        if self.nominal is not None:
            return {"epsilon_nominal": float(self.nominal.max())}
        if self.server is not None and self.server.adaptive:
            return {"epsilon_spent": float(self.spent().max()), "clip": self.mechanism.clip}
        return {"epsilon_spent": float(self.spent().max())}

    def state_dict(self) -> dict[str, Any]:
        """The accountant's state, plus the authors' nominal ledger under their conventions."""
        if self.placement == "server":
            return {"placement": "server", "accountant": self.server_accountant.state_dict(),
                    "server": self.server.state_dict()}
        out = self.accountant.state_dict()
        if self.nominal is not None:
            out["nominal_spent"] = self.nominal.clone()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("placement", "client") != self.placement:
            raise ConfigError(f"cannot resume: the checkpoint's privacy.placement is {state.get('placement', 'client')}"
                              f", this run's {self.placement}")
        if self.placement == "server":
            self.server_accountant.load_state_dict(state["accountant"])
            self.server.load_state_dict(state["server"])
            return
        if ("nominal_spent" in state) != (self.nominal is not None):
            raise ConfigError("cannot resume: the checkpoint's privacy.conventions differ from this run's")
        self.accountant.load_state_dict(state)
        if self.nominal is not None:
            self.nominal = torch.as_tensor(state["nominal_spent"], dtype=torch.float64).clone()

    def summary(self) -> dict[str, Any]:
        spent = self.spent()
        if self.placement == "server":
            return {"privacy": self.name, "placement": "server", "epsilon_total": self.epsilon_total,
                    "delta": self.delta, "epsilon_spent": float(spent.max()), "epsilon_spent_mean": float(spent.mean()),
                    "accountant": self.server_accountant.accountant, "clip": self.mechanism.clip,
                    "sensitivity": self.mechanism.sensitivity, "adjacency": self.mechanism.adjacency,
                    "noise_multiplier": self.server.base_multiplier, "sample_rate": self.sample_rate,
                    "adaptive_clip": self.server.adaptive, "privacy_rng": self.rng,
                    **({} if self.server.schedule is None else {"noise_schedule": list(self.server.schedule)})}
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
            "privacy_conventions": self.conventions,
        }
        if self.rdp_alpha is not None:
            out["rdp_alpha"] = self.rdp_alpha
        if self.nominal is not None:  # the authors' count, and what it would mean as an RDP budget at α
            out["epsilon_nominal"] = float(self.nominal.max())
            if self.rdp_alpha is not None:
                out["epsilon_nominal_rdp_converted"] = out["epsilon_nominal"] + rdp_conversion_cost(self.rdp_alpha,
                                                                                                    self.delta)
        if hist.numel():
            out[f"mean_{self.mechanism.level_name}"] = float(torch.nanmean(hist))
        out["placement"] = "client"
        return out

"""Client-level DP noise: clip each client's whole upload, then add calibrated Gaussian or Laplace noise.

:class:`Mechanism` is the interface every noise mechanism implements (calibrate a level from a budget, add noise
at a level to a statistic); :class:`NoiseMechanism` adds client-level clipping on top of it.

Uploads are batched over clients: a ``(num_clients, D)`` tensor holds one flattened update per row. Every client
privatises its own row (local perturbation of the upload), so the mechanism's input is any vector of the clip
ball, and two neighbouring inputs (the client's data replaced by any other data) can be any two points of it.

Neighbouring relation and sensitivity
    Replace-one at the client level: the sensitivity of a clipped upload is the diameter of the clip ball,
    ``Δ = 2·clip`` (L2 ball for Gaussian, L1 ball for Laplace). This is the Δ = 2C of the authors' code
    (spec §1.4). ``sensitivity_factor`` makes it explicit; ``sensitivity_factor=1`` is the add/remove convention
    in which an absent client's upload is the zero vector (Opacus's convention for DP-SGD), which is only valid
    if the server cannot tell a zero upload from a missing one.

The per-round *level* is the one number the accountant records for a client and round:

* Gaussian: the noise multiplier ``z = σ / Δ`` (Opacus's convention, so an Opacus accountant with
  ``sample_rate = 1`` accounts it exactly). Noise is ``N(0, (zΔ)²)`` i.i.d. per coordinate.
* Laplace: the round's ``ε_t``. Noise is ``Laplace(0, b)`` i.i.d. with ``b = Δ / ε_t`` (std ``b·√2``).

Levels must be finite and > 0, so a noiseless mechanism cannot be built by accident; ``privacy=none`` is a
different code path that does not use this module.

Randomness comes only from the explicit ``torch.Generator`` passed to :meth:`NoiseMechanism.privatize`; derive
it with ``fedrec.seeding.torch_generator(seed, "privacy", round_idx)`` so a resumed run draws the same noise.
"""
from __future__ import annotations

import abc
import math
from collections.abc import Sequence

import torch
from scipy.optimize import brentq
from scipy.special import log_ndtr
from torch import Tensor

from fedrec.errors import ConfigError, check_float

__all__ = [
    "GaussianMechanism",
    "LaplaceMechanism",
    "Mechanism",
    "NoiseMechanism",
    "analytic_gaussian_delta",
    "analytic_gaussian_noise_multiplier",
    "classical_gaussian_noise_multiplier",
    "rdp_noise_multiplier",
]


# --------------------------------------------------------------------------------------------------------------
# Gaussian calibration
# --------------------------------------------------------------------------------------------------------------


def _check_epsilon(epsilon: float, name: str = "epsilon") -> float:
    return check_float(name, epsilon, low=0.0, low_open=True)


def _check_delta(delta: float, name: str = "delta") -> float:
    return check_float(name, delta, low=0.0, high=1.0, low_open=True, high_open=True)


def _log_analytic_delta(noise_multiplier: float, epsilon: float) -> float:
    """log of :func:`analytic_gaussian_delta`, computed without cancellation (``-inf`` if it underflows)."""
    z = noise_multiplier
    a = 1.0 / (2.0 * z) - epsilon * z
    b = -1.0 / (2.0 * z) - epsilon * z
    la, lb = float(log_ndtr(a)), float(log_ndtr(b))
    x = epsilon + lb - la  # < 0 exactly; Φ(a) − e^ε Φ(b) = Φ(a) · (1 − e^x)
    if x >= 0.0:
        return -math.inf
    return la + math.log(-math.expm1(x))


def analytic_gaussian_delta(noise_multiplier: float, epsilon: float) -> float:
    """The exact δ(ε) of the Gaussian mechanism with ``σ = noise_multiplier · Δ`` (Balle & Wang 2018, Thm. 8).

    ``δ = Φ(Δ/(2σ) − εσ/Δ) − e^ε Φ(−Δ/(2σ) − εσ/Δ)``; only ``σ/Δ`` enters, so Δ is not an argument.
    """
    z = check_float("noise_multiplier", noise_multiplier, low=0.0, low_open=True)
    return math.exp(_log_analytic_delta(z, _check_epsilon(epsilon)))


def analytic_gaussian_noise_multiplier(epsilon: float, delta: float) -> float:
    """The smallest ``z = σ/Δ`` whose Gaussian mechanism is (ε, δ)-DP, by the analytic Gaussian mechanism.

    Solves ``analytic_gaussian_delta(z, ε) = δ`` with :func:`scipy.optimize.brentq` in log space (δ(z) is
    decreasing in z). Tight for every ε > 0, unlike the classical bound, which needs ε < 1 and is looser.
    """
    eps = _check_epsilon(epsilon)
    log_target = math.log(_check_delta(delta))

    def g(z: float) -> float:
        return _log_analytic_delta(z, eps) - log_target

    hi = classical_gaussian_noise_multiplier(min(eps, 1.0), delta)
    while g(hi) > 0.0:
        hi *= 2.0
    lo = hi
    while g(lo) < 0.0:
        lo /= 2.0
    if lo == hi:
        return hi
    return float(brentq(g, lo, hi, xtol=1e-300, rtol=4 * 2.220446049250313e-16, maxiter=1000))


def classical_gaussian_noise_multiplier(epsilon: float, delta: float) -> float:
    """Dwork & Roth's ``σ/Δ = sqrt(2 ln(1.25/δ)) / ε`` (valid for ε < 1); kept only as a reference point."""
    return math.sqrt(2.0 * math.log(1.25 / _check_delta(delta))) / _check_epsilon(epsilon)


def rdp_noise_multiplier(rdp_epsilon: float | Tensor, alpha: float) -> float | Tensor:
    """``z = σ/Δ`` whose Gaussian mechanism has Rényi DP ``rdp_epsilon`` at order ``alpha``: ``sqrt(α / (2ρ))``
    (a number, or a float64 tensor of per-client budgets).

    This is the spec's per-round RDP budget (§1.4: the paper splits an RDP budget over rounds). The authors'
    code uses this with α = 2 but treats ε_total itself as the RDP budget; the accountant here converts the
    composed history to (ε, δ) instead, so any calibration is accounted correctly.
    """
    a = check_float("alpha", alpha, low=1.0, low_open=True)
    if isinstance(rdp_epsilon, Tensor):
        rho = rdp_epsilon.double()
        if not bool((torch.isfinite(rho) & (rho > 0)).all()):
            raise ConfigError(f"rdp_epsilon must be finite and > 0 for every client, got {float(rho.min())}")
        return torch.sqrt(a / (2.0 * rho))
    rho = check_float("rdp_epsilon", rdp_epsilon, low=0.0, low_open=True)
    return math.sqrt(a / (2.0 * rho))


# --------------------------------------------------------------------------------------------------------------
# Mechanisms
# --------------------------------------------------------------------------------------------------------------


class Mechanism(abc.ABC):
    """What every DP noise mechanism offers: a noise *level* calibrated from a budget, and noise at a level added
    to a statistic. The level is the one number an accountant records (noise multiplier, or ε for Laplace)."""

    #: the mechanism's name, as accountants know it (``"gaussian"`` / ``"laplace"``, e.g. ``ClientAccountant(mechanism=...)``)
    name: str
    #: name of the level, used in error messages
    level_name: str

    @abc.abstractmethod
    def calibrate(self, epsilon: float, delta: float | None = None) -> float:
        """The level that makes one release (ε, δ)-DP."""

    @abc.abstractmethod
    def noise_std(self, level: Tensor | float) -> Tensor:
        """The per-coordinate standard deviation of the noise at ``level``, float64."""

    @abc.abstractmethod
    def add_noise(self, statistic: Tensor, level: Tensor | float, generator: torch.Generator) -> Tensor:
        """``statistic`` (rows first) plus noise at ``level`` (a number or one per row), drawn from ``generator``.
        The caller guarantees the statistic's sensitivity; nothing is clipped."""


class NoiseMechanism(Mechanism):
    """Clip every row of a client-batched upload to norm ``clip`` and add i.i.d. noise at a per-client level.

    Args:
        clip: the norm bound C of one client's whole (flattened) upload; > 0.
        sensitivity_factor: Δ = ``sensitivity_factor · clip``. Default 2: replace-one client-level neighbours,
            i.e. the diameter of the clip ball (see the module docstring). Must be > 0.
    """

    #: order of the clipping norm (2 for Gaussian, 1 for Laplace)
    norm_ord: float

    def __init__(self, clip: float, sensitivity_factor: float = 2.0) -> None:
        self.clip = check_float("clip", clip, low=0.0, low_open=True)
        self.sensitivity_factor = check_float("sensitivity_factor", sensitivity_factor, low=0.0, low_open=True)

    @property
    def sensitivity(self) -> float:
        """Δ = sensitivity_factor · clip, in the mechanism's norm."""
        return self.sensitivity_factor * self.clip

    def __repr__(self) -> str:
        return f"{type(self).__name__}(clip={self.clip}, sensitivity_factor={self.sensitivity_factor})"

    # ---- levels ----------------------------------------------------------------------------------------------

    def check_level(self, level: Tensor | float, num_clients: int) -> Tensor:
        """``level`` as a float64 ``(num_clients,)`` tensor; raises ConfigError unless every entry is finite > 0."""
        lv = torch.as_tensor(level, dtype=torch.float64).detach().cpu()
        if lv.dim() == 0:
            lv = lv.expand(num_clients)
        if lv.shape != (num_clients,):
            raise ConfigError(
                f"{self.level_name} must be a number or a ({num_clients},) tensor, got shape {tuple(lv.shape)}"
            )
        bad = ~(torch.isfinite(lv) & (lv > 0))
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise ConfigError(f"{self.level_name} must be finite and > 0 for every client, got {float(lv[i])} "
                              f"for client {i}")
        return lv

    @abc.abstractmethod
    def noise_scale(self, level: Tensor | float) -> Tensor:
        """The noise distribution's scale parameter per client: σ (Gaussian) or b (Laplace), float64."""

    @abc.abstractmethod
    def _unit_noise(self, shape: tuple[int, ...], like: Tensor, generator: torch.Generator) -> Tensor:
        """Standard noise (scale 1) of ``shape`` with ``like``'s dtype and device."""

    # ---- clipping and noise ----------------------------------------------------------------------------------

    def clip_rows(self, updates: Tensor) -> Tensor:
        """``row · min(1, clip / ‖row‖)`` for every row (rows within the bound are returned bit for bit)."""
        return self._clip_parts([updates], [None], updates.shape[0])[0]

    def client_norms(self, parts: Sequence[Tensor], owners: Sequence[Tensor | None], num_clients: int) -> Tensor:
        """The norm of each client's whole upload, made of the rows of ``parts`` (row ``j`` of part ``p`` belongs
        to client ``owners[p][j]``; ``None`` means row ``j`` belongs to client ``j``)."""
        row_norms = [torch.linalg.vector_norm(p.double().reshape(p.shape[0], -1), ord=self.norm_ord, dim=1)
                     for p in parts]
        if len(parts) == 1 and owners[0] is None:  # one row per client: exactly torch's norm, no round trip
            return row_norms[0]
        total = torch.zeros(num_clients, dtype=torch.float64, device=parts[0].device)
        for norms, owner in zip(row_norms, owners):
            contrib = norms.pow(self.norm_ord)
            total = total + contrib if owner is None else total.index_add(0, owner, contrib)
        return total.pow(1.0 / self.norm_ord)

    def _clip_parts(self, parts: Sequence[Tensor], owners: Sequence[Tensor | None], num_clients: int) -> list[Tensor]:
        norms = self.client_norms(parts, owners, num_clients)
        factor = torch.where(norms > self.clip, self.clip / norms, torch.ones_like(norms))
        out = []
        for part, owner in zip(parts, owners):
            f = (factor if owner is None else factor[owner]).to(part.dtype).view(-1, *([1] * (part.dim() - 1)))
            out.append(part * f)
        return out

    def privatize(self, updates: Tensor, level: Tensor | float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Clip each client's row and add noise at that client's level; returns ``(noisy, clipped)``.

        Args:
            updates: ``(num_clients, D)`` floating tensor, one flattened upload per client; must be finite.
            level: noise multiplier (Gaussian) or ε_t (Laplace): a number or a ``(num_clients,)`` tensor.
            generator: the only source of randomness (on ``updates``' device).
        """
        if updates.dim() != 2:
            raise ValueError(f"updates must be a 2-D floating tensor (num_clients, D), got {tuple(updates.shape)}")
        noisy, clipped = self.privatize_parts([updates], [None], updates.shape[0], level, generator)
        return noisy[0], clipped[0]

    def privatize_parts(
        self,
        parts: Sequence[Tensor],
        owners: Sequence[Tensor | None],
        num_clients: int,
        level: Tensor | float,
        generator: torch.Generator,
    ) -> tuple[list[Tensor], list[Tensor]]:
        """Clip and noise uploads whose rows are spread over several tensors; returns ``(noisy, clipped)`` lists.

        A client's upload is every row of ``parts`` it owns (``owners[p]`` maps the rows of ``parts[p]`` to
        clients; ``None``: row ``j`` is client ``j``'s). The whole upload is clipped to ``clip`` in the
        mechanism's norm and every coordinate gets noise at its owner's level, drawn from ``generator`` part by
        part, so the result depends only on the generator's seed.
        """
        if len(parts) != len(owners) or not parts:
            raise ValueError("parts and owners must be non-empty sequences of the same length")
        for part in parts:
            if part.dim() < 1 or not part.is_floating_point():
                raise ValueError(f"each part must be a floating tensor with a row dimension, got "
                                 f"{tuple(part.shape)} {part.dtype}")
            if not bool(torch.isfinite(part).all()):
                raise ValueError("updates contain non-finite values; clipping cannot bound them")
        scale = self.noise_scale(self.check_level(level, num_clients))
        clipped = self._clip_parts(parts, owners, num_clients)
        noisy = [self._noised(part, scale if owner is None else scale[owner.cpu()], generator)
                 for part, owner in zip(clipped, owners)]
        return noisy, clipped

    def add_noise(self, statistic: Tensor, level: Tensor | float, generator: torch.Generator) -> Tensor:
        """``statistic`` (one row per client, bounded by the caller) plus noise at each row's level, unclipped."""
        if statistic.dim() < 1 or not statistic.is_floating_point():
            raise ValueError(f"statistic must be a floating tensor with a row dimension, got "
                             f"{tuple(statistic.shape)} {statistic.dtype}")
        if not bool(torch.isfinite(statistic).all()):
            raise ValueError("statistic contains non-finite values")
        return self._noised(statistic, self.noise_scale(self.check_level(level, statistic.shape[0])), generator)

    def _noised(self, part: Tensor, scale: Tensor, generator: torch.Generator) -> Tensor:
        """``part`` plus unit noise times each row's ``scale``."""
        s = scale.to(device=part.device, dtype=part.dtype)
        noise = self._unit_noise(tuple(part.shape), part, generator)
        return part + noise * s.view(-1, *([1] * (part.dim() - 1)))


class GaussianMechanism(NoiseMechanism):
    """L2 clipping and ``N(0, σ²)`` noise with ``σ = noise_multiplier · Δ``; level = noise multiplier."""

    norm_ord = 2.0
    level_name = "noise_multiplier"
    name = "gaussian"

    @staticmethod
    def noise_multiplier_for(epsilon: float, delta: float) -> float:
        """Per-round calibration: the analytic-Gaussian ``σ/Δ`` for (ε, δ) (see
        :func:`analytic_gaussian_noise_multiplier`)."""
        return analytic_gaussian_noise_multiplier(epsilon, delta)

    def calibrate(self, epsilon: float, delta: float | None = None) -> float:
        if delta is None:
            raise ConfigError("delta must be given for the Gaussian mechanism (a number in (0, 1))")
        return self.noise_multiplier_for(epsilon, delta)

    def sigma_for(self, epsilon: float, delta: float) -> float:
        """σ itself (in the units of the update) for a per-round (ε, δ)."""
        return self.noise_multiplier_for(epsilon, delta) * self.sensitivity

    def noise_scale(self, level: Tensor | float) -> Tensor:
        lv = torch.as_tensor(level, dtype=torch.float64)
        return lv * self.sensitivity

    def noise_std(self, level: Tensor | float) -> Tensor:
        return self.noise_scale(level)

    def _unit_noise(self, shape: tuple[int, ...], like: Tensor, generator: torch.Generator) -> Tensor:
        return torch.randn(shape, generator=generator, dtype=like.dtype, device=like.device)


class LaplaceMechanism(NoiseMechanism):
    """L1 clipping and ``Laplace(0, b)`` noise with ``b = Δ / ε_t``; level = the round's ε_t (pure DP, δ = 0)."""

    norm_ord = 1.0
    level_name = "epsilon"
    name = "laplace"

    def scale_for(self, epsilon: float) -> float:
        """The Laplace scale ``b = Δ / ε`` for a per-round ε."""
        return self.sensitivity / _check_epsilon(epsilon)

    def calibrate(self, epsilon: float, delta: float | None = None) -> float:
        """The level is ε itself (``delta`` is ignored: the Laplace mechanism is pure ε-DP)."""
        return _check_epsilon(epsilon)

    def noise_scale(self, level: Tensor | float) -> Tensor:
        lv = torch.as_tensor(level, dtype=torch.float64)
        return self.sensitivity / lv

    def noise_std(self, level: Tensor | float) -> Tensor:
        return self.noise_scale(level) * math.sqrt(2.0)

    def _unit_noise(self, shape: tuple[int, ...], like: Tensor, generator: torch.Generator) -> Tensor:
        # Laplace(0, 1) = Exp(1) − Exp(1); exponential_ never returns inf, unlike the inverse CDF at u = ±1/2.
        e1 = torch.empty(shape, dtype=like.dtype, device=like.device).exponential_(generator=generator)
        e2 = torch.empty(shape, dtype=like.dtype, device=like.device).exponential_(generator=generator)
        return e1 - e2

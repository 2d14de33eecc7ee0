"""Client-level DP noise: clip each client's whole upload, then add calibrated Gaussian or Laplace noise.

:class:`Mechanism` is the interface every noise mechanism implements (calibrate a level from a budget, add noise
at a level to a statistic); :class:`NoiseMechanism` adds client-level clipping on top of it.

Uploads are batched over clients: a ``(num_clients, D)`` tensor holds one flattened update per row. Every client
privatises its own row (local perturbation of the upload), so the mechanism's input is any vector of the clip
ball, and two neighbouring inputs (the client's data replaced by any other data) can be any two points of it.

Neighbouring relation and sensitivity
    ``adjacency="replace_one"`` (the default): two neighbouring inputs differ in one client's data, so the
    sensitivity of a clipped upload is the diameter of the clip ball, ``Δ = 2·clip`` (L2 ball for Gaussian, L1
    ball for Laplace). This is the Δ = 2C of the BGTplanner authors' code, and ``sensitivity_factor`` below 2 is
    refused under it. ``adjacency="add_remove"`` is the convention in which an absent client's upload is the zero
    vector (Opacus's for DP-SGD), so ``sensitivity_factor=1`` suffices; it is only valid if the server cannot tell
    a zero upload from a missing one, which is why it must be chosen explicitly (:func:`check_sensitivity`).

Clipping arithmetic (the bound the noise is calibrated for)
    After clipping (:meth:`NoiseMechanism.privatize_parts`, :meth:`NoiseMechanism.clip_rows`), every client's
    upload ``x`` (all the values it owns, in the upload's dtype) satisfies ``‖x‖ ≤ clip`` **in exact real
    arithmetic** on those values: each value is a float, hence an exact rational number, and ``Σ x_i² ≤ clip²``
    (L2) or ``Σ |x_i| ≤ clip`` (L1) holds exactly, with ``clip`` the float it is. An upload whose exact norm is
    ≤ clip is returned bit for bit. A clipped upload also satisfies the bound when its norm is evaluated in float64
    by summing its values' squares (L2) or absolute values (L1) in any order and taking the square root, as
    ``torch.linalg.vector_norm`` of the values converted to float64 does, unless that evaluation over- or
    underflows.

    How: norms are evaluated in float64, where values of 32 bits or fewer have exact squares; float64 values are
    first divided by a power of two per client (exact), so huge, tiny and denormal values neither overflow nor
    underflow. An evaluated power sum within the certified rounding margin ``(n + 4)·2⁻⁵¹`` (relative; n = number
    of values) of ``clip^ord`` is decided exactly, in rational arithmetic. Clipping aims at norm
    ``clip·(1 − 2·margin/ord − eps)`` (eps of the upload's dtype), re-evaluates the rounded result and shrinks it
    further until its evaluated power sum is below ``clip^ord`` by the margin, which certifies both bounds.

The per-round *level* is the one number the accountant records for a client and round:

* Gaussian: the noise multiplier ``z = σ / Δ`` (Opacus's convention, so an Opacus accountant with
  ``sample_rate = 1`` accounts it exactly). Noise is ``N(0, (zΔ)²)`` i.i.d. per coordinate.
* Laplace: the round's ``ε_t``. Noise is ``Laplace(0, b)`` i.i.d. with ``b = Δ / ε_t`` (std ``b·√2``).

Levels must be finite and > 0, so a noiseless mechanism cannot be built by accident; ``privacy=none`` is a
different code path that does not use this module.

Randomness comes only from the explicit source passed to :meth:`NoiseMechanism.privatize`: a ``torch.Generator``
(for research runs derive it with ``fedrec.utils.seeding.torch_generator(seed, "privacy", round_idx)`` so a resumed run
draws the same noise; for deployment-grade runs use :func:`secure_generator`), or, part by part, a
:class:`fedrec.utils.rng.KeyedRows` whose draws are keyed by client (what ClientDP passes, see its ``rng``).
"""
from __future__ import annotations

import abc
import math
import secrets
from collections.abc import Sequence

import torch
from scipy.optimize import brentq
from scipy.special import log_ndtr
from torch import Tensor

from fedrec.errors import ConfigError, check_choice, check_float
from fedrec.utils.rng import KeyedRows

__all__ = [
    "ADJACENCIES",
    "GaussianMechanism",
    "LaplaceMechanism",
    "Mechanism",
    "NoiseMechanism",
    "analytic_gaussian_delta",
    "analytic_gaussian_noise_multiplier",
    "check_sensitivity",
    "classical_gaussian_noise_multiplier",
    "rdp_noise_multiplier",
    "secure_generator",
]

#: neighbouring relations a clipped upload's sensitivity can be stated for (see the module docstring)
ADJACENCIES = ("replace_one", "add_remove")
#: the smallest Δ / clip each neighbouring relation allows: the clip ball's diameter, or its radius
MIN_SENSITIVITY_FACTOR = {"replace_one": 2.0, "add_remove": 1.0}
#: the certified rounding margin of a float64 norm evaluation is (n + 4) times this, relative (module docstring)
ROUNDING_MARGIN_UNIT = 2.0**-51
#: mantissa · 2^e with a mantissa in [0.5, 1) is a normal float64 for e at least this
MIN_NORMAL_EXPONENT = -1021


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

    This is the per-round RDP budget of BGTplanner (its §IV: the paper splits an RDP budget over rounds). The authors'
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
# Sensitivity, clipping helpers and secure randomness
# --------------------------------------------------------------------------------------------------------------


def check_sensitivity(sensitivity_factor: float, adjacency: str, prefix: str = "") -> float:
    """``sensitivity_factor`` as a float if the neighbouring relation ``adjacency`` allows it; else ConfigError
    naming ``{prefix}sensitivity_factor`` or ``{prefix}adjacency``.

    Under replace-one adjacency a client's clipped upload may move anywhere in the clip ball, so Δ is its diameter
    (factor ≥ 2); under add/remove an absent client counts as a zero upload, so Δ is its radius (factor ≥ 1).
    """
    check_choice(f"{prefix}adjacency", adjacency, ADJACENCIES)
    factor = check_float(f"{prefix}sensitivity_factor", sensitivity_factor, low=0.0, low_open=True)
    if factor >= MIN_SENSITIVITY_FACTOR[adjacency]:
        return factor
    if adjacency == "replace_one":
        raise ConfigError(
            f"{prefix}sensitivity_factor={factor} is below 2, which {prefix}adjacency=replace_one does not allow: "
            "replacing one client's data can move its clipped upload anywhere in the clip ball, so the sensitivity "
            "is the ball's diameter, 2·clip. A factor of 1 is the add/remove convention (an absent client counts as "
            "a zero upload), valid only if the server cannot tell a zero upload from a missing one: set "
            f"{prefix}adjacency=add_remove to choose it")
    raise ConfigError(
        f"{prefix}sensitivity_factor={factor} is below 1, which no neighbouring relation allows: even under "
        f"{prefix}adjacency=add_remove, adding or removing one client moves the uploads by up to clip")


def secure_generator(device: str | torch.device = "cpu") -> torch.Generator:
    """A fresh ``torch.Generator`` seeded with 64 bits from the operating system's cryptographic source
    (``secrets.randbits``, i.e. ``os.urandom``): its draws cannot be derived from the run's seed or logs, and two
    runs draw different numbers (unless both get the same 64-bit seed, probability 2⁻⁶⁴). The draws themselves come
    from torch's generator (Mersenne Twister on CPU, Philox on CUDA) started from that seed; a resumed run cannot
    repeat them."""
    g = torch.Generator(device=device)
    g.manual_seed(secrets.randbits(64))
    return g


def _flat_rows(part: Tensor) -> Tensor:
    """``part`` as ``(rows, values per row)``."""
    return part.reshape(part.shape[0], math.prod(part.shape[1:]))


def _owner_ids(parts: Sequence[Tensor], owners: Sequence[Tensor | None]) -> list[Tensor]:
    """``owners`` with ``None`` (row ``j`` is client ``j``'s) spelled out."""
    return [torch.arange(p.shape[0], device=p.device) if o is None else o for p, o in zip(parts, owners)]


def _squares_exact_in_float64(parts: Sequence[Tensor]) -> bool:
    """Whether every value has 32 bits or fewer: its square is then an exact float64 far inside float64's range."""
    return all(torch.finfo(p.dtype).bits <= 32 for p in parts)


def _client_scales(parts: Sequence[Tensor], owners: Sequence[Tensor], num_clients: int) -> Tensor:
    """Per client, the power of two ``2^e`` with ``max |value| / 2^e`` in [1, 2) (1 for an all-zero upload), float64.

    Dividing by it is exact and puts every client's power sum in [1, 2^ord·n], so float64 norms of huge, tiny or
    denormal float64 values neither overflow nor underflow. Values of 32 bits or fewer need no scaling (their
    squares are exact float64 numbers far inside its range), so their scale is 1.
    """
    amax = torch.zeros(num_clients, dtype=torch.float64, device=parts[0].device)
    if _squares_exact_in_float64(parts):
        return amax + 1.0
    for part, owner in zip(parts, owners):
        if part.numel():
            amax = amax.scatter_reduce(0, owner, _flat_rows(part).abs().amax(1).double(), reduce="amax")
    _, exponent = torch.frexp(amax)
    ones = torch.ones_like(amax)
    return torch.where(amax > 0, torch.ldexp(ones, exponent - 1), ones)


def _client_sizes(parts: Sequence[Tensor], owners: Sequence[Tensor], num_clients: int) -> Tensor:
    """Per client, the number of values in its upload (float64)."""
    n = torch.zeros(num_clients, dtype=torch.float64, device=parts[0].device)
    for part, owner in zip(parts, owners):
        width = _flat_rows(part).shape[1]
        n = n.index_add(0, owner, torch.full(owner.shape, float(width), dtype=torch.float64, device=n.device))
    return n


def _rescaled(part: Tensor, owner: Tensor, over: Tensor, gain: Tensor, shift: Tensor) -> Tensor:
    """Rows of clients in ``over`` multiplied by their factor ``gain · 2^shift`` (below 1) and rounded to the part's
    dtype; other rows as they are, bit for bit. No value grows in magnitude.

    A factor in float64's normal range is applied in one rounding. A smaller one (huge uploads, a tiny clip) is
    applied as ``gain``'s mantissa, then as its power of two in two halves, each exact until the result itself
    underflows.
    """
    mantissa, exponent = torch.frexp(gain)
    power = exponent + shift
    rows = _flat_rows(part)
    x = rows.double()
    if bool((power[over] >= MIN_NORMAL_EXPONENT).all()):
        scaled = x * torch.ldexp(mantissa, power)[owner].unsqueeze(1)
    else:
        half = torch.div(power, 2, rounding_mode="floor")
        ones = torch.ones_like(gain)
        first, second = torch.ldexp(ones, half), torch.ldexp(ones, power - half)
        scaled = x * mantissa[owner].unsqueeze(1) * first[owner].unsqueeze(1) * second[owner].unsqueeze(1)
    return torch.where(over[owner].unsqueeze(1), scaled.to(part.dtype), rows).reshape(part.shape)


# --------------------------------------------------------------------------------------------------------------
# Mechanisms
# --------------------------------------------------------------------------------------------------------------


class Mechanism(abc.ABC):
    """What every DP noise mechanism offers: a noise *level* calibrated from a budget, and noise at a level added
    to a statistic. The level is the one number an accountant records (noise multiplier, or ε for Laplace)."""

    #: the mechanism's name, as accountants know it (``"gaussian"`` / ``"laplace"``, e.g.
    #: ``ClientAccountant(mechanism=...)``)
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
        sensitivity_factor: Δ = ``sensitivity_factor · clip``. Default 2: the diameter of the clip ball.
        adjacency: ``"replace_one"`` (default; needs ``sensitivity_factor ≥ 2``) or ``"add_remove"`` (needs ≥ 1),
            see the module docstring.
    """

    #: order of the clipping norm (2 for Gaussian, 1 for Laplace)
    norm_ord: float
    #: the unit noise's :class:`~fedrec.utils.rng.KeyedRows` distribution
    distribution: str

    def __init__(self, clip: float, sensitivity_factor: float = 2.0, adjacency: str = "replace_one") -> None:
        self.clip = check_float("clip", clip, low=0.0, low_open=True)
        self.sensitivity_factor = check_sensitivity(sensitivity_factor, adjacency)
        self.adjacency = adjacency

    @property
    def sensitivity(self) -> float:
        """Δ = sensitivity_factor · clip, in the mechanism's norm."""
        return self.sensitivity_factor * self.clip

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(clip={self.clip}, sensitivity_factor={self.sensitivity_factor}, "
                f"adjacency={self.adjacency!r})")

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
        """``row · min(1, clip / ‖row‖)`` for every row, with the exact bound of the module docstring (rows
        within the bound are returned bit for bit)."""
        return self.clip_parts([updates], [None], updates.shape[0])[0]

    def client_norms(self, parts: Sequence[Tensor], owners: Sequence[Tensor | None], num_clients: int) -> Tensor:
        """The norm of each client's whole upload, made of the rows of ``parts`` (row ``j`` of part ``p`` belongs
        to client ``owners[p][j]``; ``None`` means row ``j`` belongs to client ``j``), evaluated in float64 as
        clipping evaluates it: within ``(n + 4)·2⁻⁵³`` relative of the exact norm (n values), and never overflowing
        or underflowing before the final multiplication by the client's power-of-two scale."""
        ids = _owner_ids(parts, owners)
        scale = _client_scales(parts, ids, num_clients)
        return scale * self._power_sums(parts, ids, scale, num_clients).pow(1.0 / self.norm_ord)

    def _power_sums(self, parts: Sequence[Tensor], owners: Sequence[Tensor], scale: Tensor,
                    num_clients: int) -> Tensor:
        """``Σ |value / scale|^ord`` over each client's upload, in float64 (each row's norm to the power ord, summed
        per client). The division is exact but for float64 values over 2¹⁰²² times smaller than their client's
        largest, whose share of the sum is below 2⁻²⁰⁰⁰ (inside the rounding margin's constant term)."""
        total = torch.zeros(num_clients, dtype=torch.float64, device=scale.device)
        unscaled = _squares_exact_in_float64(parts)  # every scale is 1
        for part, owner in zip(parts, owners):
            if part.numel():
                x = _flat_rows(part) if unscaled else _flat_rows(part).double() / scale[owner].unsqueeze(1)
                row = torch.linalg.vector_norm(x, ord=self.norm_ord, dim=1, dtype=torch.float64)
                total = total.index_add(0, owner, row.pow(self.norm_ord))
        return total

    def _power_sums_and_targets(self, parts: Sequence[Tensor], owners: Sequence[Tensor],
                                num_clients: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(scale, sums, target, margin)`` per client: ``sums`` is the evaluated power sum of the scaled upload,
        ``target = (clip / scale)^ord`` the exact bound on it, and ``margin`` the certified rounding margin:
        ``sums ≤ target·(1 − margin)`` proves the exact norm ≤ clip (and any float64 evaluation of it ≤ clip),
        ``sums > target·(1 + margin)`` proves it > clip; in between the evaluation cannot decide."""
        scale = _client_scales(parts, owners, num_clients)
        sums = self._power_sums(parts, owners, scale, num_clients)
        margin = (_client_sizes(parts, owners, num_clients) + 4.0) * ROUNDING_MARGIN_UNIT
        # tensor / tensor: torch evaluates number / tensor as number · (1 / tensor), which overflows for tiny scales
        target = (torch.full_like(scale, self.clip) / scale).pow(self.norm_ord)
        return scale, sums, target, margin

    def _exactly_inside(self, parts: Sequence[Tensor], owners: Sequence[Tensor], client: int) -> bool:
        """Whether ``client``'s upload has norm ≤ clip in exact rational arithmetic (for undecided uploads): every
        value and the clip are dyadic rationals ``n / 2^k``, so both sides are integers over one power of two."""
        p = int(self.norm_ord)
        ratios = [abs(v).as_integer_ratio() for part, owner in zip(parts, owners)
                  for v in _flat_rows(part)[owner == client].double().flatten().tolist()]
        num, den = self.clip.as_integer_ratio()
        common = max([d**p for _, d in ratios] + [den**p])
        return sum(n**p * (common // d**p) for n, d in ratios) <= num**p * (common // den**p)

    def _outside(self, parts: Sequence[Tensor], owners: Sequence[Tensor], sums: Tensor, target: Tensor,
                 margin: Tensor) -> Tensor:
        """``(num_clients,)`` bool: whose upload's exact norm exceeds clip, given its
        :meth:`_power_sums_and_targets`."""
        outside = sums > target * (1.0 + margin)
        for c in ((sums > target * (1.0 - margin)) & ~outside).nonzero().flatten().tolist():
            outside[c] = not self._exactly_inside(parts, owners, c)
        return outside

    def clip_parts(self, parts: Sequence[Tensor], owners: Sequence[Tensor | None], num_clients: int) -> list[Tensor]:
        """Scale every client whose upload is outside the ball so that its norm is certified ≤ clip; the others'
        rows are returned bit for bit (see "Clipping arithmetic" in the module docstring).

        The first attempt aims at norm ``clip · (1 − 2·margin/ord − eps)``, with ``margin`` the certified rounding
        margin of the power sum and eps that of the upload's dtype (the rounding of the scaled values to it), which
        certifies every upload of normal numbers at once; a client still not certified (denormal results may round
        up) is shrunk by ``eps·2^k`` relative at its k-th retry (at most by half), so the loop ends: a zero upload
        is inside.
        """
        ids = _owner_ids(parts, owners)
        scale, sums, target, margin = self._power_sums_and_targets(parts, ids, num_clients)
        over = self._outside(parts, ids, sums, target, margin)
        if not bool(over.any()):
            return list(parts)
        eps = max(torch.finfo(p.dtype).eps for p in parts)
        # factor clip / norm = (clip mantissa / scaled norm) · 2^(clip exponent − scale exponent), kept in two pieces
        clip_mantissa, clip_exponent = math.frexp(self.clip)
        shift = clip_exponent - (torch.frexp(scale)[1] - 1)
        gain = clip_mantissa / sums.pow(1.0 / self.norm_ord) * (1.0 - 2.0 * margin / self.norm_ord - eps)
        step = eps
        while True:
            out = [_rescaled(part, owner, over, gain, shift) for part, owner in zip(parts, ids)]
            _, out_sums, out_target, out_margin = self._power_sums_and_targets(out, ids, num_clients)
            pending = over & (out_sums > out_target * (1.0 - out_margin))
            if not bool(pending.any()):
                return out
            gain = torch.where(pending, gain * (1.0 - step), gain)
            step = min(2.0 * step, 0.5)

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
        generator: torch.Generator | Sequence[KeyedRows],
    ) -> tuple[list[Tensor], list[Tensor]]:
        """Clip and noise uploads whose rows are spread over several tensors; returns ``(noisy, clipped)`` lists.

        A client's upload is every row of ``parts`` it owns (``owners[p]`` maps the rows of ``parts[p]`` to
        clients; ``None``: row ``j`` is client ``j``'s). The whole upload is clipped to ``clip`` in the
        mechanism's norm and every coordinate gets noise at its owner's level, drawn from ``generator`` part by
        part, so the result depends only on the generator's seed; or, given one :class:`~fedrec.utils.rng.KeyedRows`
        per part, from each row's keyed stream, so it depends only on the keys, owners and counters.
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
        clipped = self.clip_parts(parts, owners, num_clients)
        sources = [generator] * len(parts) if isinstance(generator, torch.Generator) else list(generator)
        if len(sources) != len(parts):
            raise ValueError(f"one keyed noise source per part: got {len(sources)} for {len(parts)} parts")
        noisy = [self._noised(part, scale if owner is None else scale[owner.cpu()], source)
                 for part, owner, source in zip(clipped, owners, sources)]
        return noisy, clipped

    def add_noise(self, statistic: Tensor, level: Tensor | float, generator: torch.Generator | KeyedRows) -> Tensor:
        """``statistic`` (one row per client, bounded by the caller) plus noise at each row's level, unclipped,
        drawn from ``generator`` or from each row's keyed stream."""
        if statistic.dim() < 1 or not statistic.is_floating_point():
            raise ValueError(f"statistic must be a floating tensor with a row dimension, got "
                             f"{tuple(statistic.shape)} {statistic.dtype}")
        if not bool(torch.isfinite(statistic).all()):
            raise ValueError("statistic contains non-finite values")
        return self._noised(statistic, self.noise_scale(self.check_level(level, statistic.shape[0])), generator)

    def _noised(self, part: Tensor, scale: Tensor, generator: torch.Generator | KeyedRows) -> Tensor:
        """``part`` plus unit noise times each row's ``scale``."""
        s = scale.to(device=part.device, dtype=part.dtype)
        if isinstance(generator, KeyedRows):
            if generator.owner.shape[0] != part.shape[0]:
                raise ValueError(f"the keyed noise source has {generator.owner.shape[0]} rows, the part "
                                 f"{part.shape[0]}")
            width = math.prod(part.shape[1:])
            noise = generator.tensor(self.distribution, width, part.device).view(part.shape).to(part)
        else:
            noise = self._unit_noise(tuple(part.shape), part, generator)
        return part + noise * s.view(-1, *([1] * (part.dim() - 1)))


class GaussianMechanism(NoiseMechanism):
    """L2 clipping and ``N(0, σ²)`` noise with ``σ = noise_multiplier · Δ``; level = noise multiplier."""

    norm_ord = 2.0
    distribution = "normal"
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
    distribution = "laplace"
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

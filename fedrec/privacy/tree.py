"""Tree-based (binary-mechanism) aggregation: private prefix sums of many independent streams of statistics.

Each row (e.g. replicate × client × arm) holds a stream of records v_1, v_2, … of at most ``horizon`` = T records.
The dyadic nodes are the blocks (start, end] = ((k−1)·2^l, k·2^l] with k odd (level l, index k), and the prefix sum
after t records is released as

    Σ_{τ≤t} v_τ + Σ_{node ∈ cover(t)} z_node,    cover(t) = one node per set bit l of t (popcount(t) nodes),

the binary mechanism of Chan, Shi & Song (2011) as FCLUB's Algorithm 5 (Liu et al., UAI 2022) and Fed_UCB's
Algorithms 2–3 (Zhu et al., SIGMETRICS 2021) use it. A record lies in at most ⌊log₂ T⌋ + 1 nodes (one per level, see
:func:`nodes_touched`), so it is protected by the composition of that many node mechanisms:

``"gaussian"``
    i.i.d. N(0, σ²) per entry. With ``symmetric=True`` (a Gram statistic, FCLUB Alg. 5 l.3) a node's noise is
    (Ñ + Ñᵀ)/√2 with Ñ i.i.d. N(0, σ²): off-diagonal variance σ², diagonal 2σ². That release is a Gaussian
    mechanism with per-entry σ on the upper triangle with the diagonal divided by √2, whose L2 sensitivity is
    ‖ΔM‖_F/√2, so the node's noise multiplier is z = √2·σ/Δ (z = σ/Δ without symmetry). Nodes compose in RDP
    (:class:`~fedrec.privacy.accountant.GaussianRDPAccountant`).
``"laplace"``
    i.i.d. Laplace(0, b) per entry with b = Δ₁/ε' (Fed_UCB Alg. 3); nodes compose by basic composition.

``sensitivity`` Δ bounds how much one record can change (L2/Frobenius norm for Gaussian, L1 for Laplace); the
caller guarantees it. Memory is O(log T) per row (not a dictionary of nodes): the clean running sum and, per level, the
noise of the level's latest cover node with its index. The noise itself is :mod:`fedrec.privacy.tree_noise`
(compiled, shared with Fed_UCB and CDP-FCLUB): node (l, k) of row r is a pure function of (key, r, l, k), so the
same seed gives the same noise however rows are batched into calls, a resumed run draws the same numbers, and rows
are independent. :func:`mark_records` and :func:`cached_noise` are its torch form, which this module's
:class:`TreeAggregator` and Fed_UCB's torch path run and which is tested equal to the compiled one.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from fedrec.errors import ConfigError, check_choice, check_float, check_int
from fedrec.privacy.accountant import (
    Accountant,
    GaussianRDPAccountant,
    LaplaceBasicAccountant,
    check_epsilon_setting,
    gaussian_rdp_rho,
    uniform_epsilon_per_round,
)
from fedrec.privacy.tree_noise import GAUSSIAN, LAPLACE, MAX_LEVELS, SYMMETRIC, cover, node_noise_many
from fedrec.utils.rng import stream_key

__all__ = [
    "Node",
    "TreeAggregator",
    "TreeLaplace",
    "TreeGaussian",
    "augmented_gram",
    "cached_noise",
    "cover_nodes",
    "dyadic_cover",
    "fclub_accounted_sigma",
    "fclub_epsilon",
    "fclub_node_sigma",
    "fclub_phases",
    "gaussian_node_sigma",
    "laplace_node_scale",
    "mark_records",
    "nodes_touched",
    "split_augmented",
]

MECHANISMS = ("gaussian", "laplace")
LAPLACE_SPLITS = ("paper", "levels")


# --------------------------------------------------------------------------------------------------------------
# Dyadic nodes
# --------------------------------------------------------------------------------------------------------------


class Node(NamedTuple):
    """A dyadic node: the records (start, end] = ((index − 1)·2^level, index·2^level]."""

    level: int
    index: int

    @property
    def start(self) -> int:
        return (self.index - 1) << self.level

    @property
    def end(self) -> int:
        return self.index << self.level


def dyadic_cover(t: int) -> list[Node]:
    """The disjoint nodes covering records 1..t, lowest level first: one per set bit l of t, ending at t with the
    bits below l cleared (FCLUB Alg. 5 ``dyadic_cover``; Fed_UCB Alg. 2). popcount(t) nodes, from the compiled walk
    :func:`fedrec.privacy.tree_noise.cover` (t < 2^63)."""
    t = check_int("t", t, minimum=0)
    if t.bit_length() > MAX_LEVELS:
        raise ConfigError(f"t must be below 2^{MAX_LEVELS}, got {t}")
    return [Node(int(level), int(index)) for level, index in cover(t)]


def cover_nodes(t: Tensor, levels: int) -> tuple[Tensor, Tensor]:
    """The dyadic covers of records 1..t for every t of ``t`` (m,), the torch twin of
    :func:`fedrec.privacy.tree_noise.cover_of`: the (m, ``levels``) node indices t >> l of every level l and
    whether node (l, t >> l) is in t's cover (bit l of t set)."""
    index = t.unsqueeze(-1) >> torch.arange(levels, device=t.device)
    return index, (index & 1).bool()


def nodes_touched(t: int, horizon: int) -> list[Node]:
    """The nodes record ``t`` contributes to in a stream of ``horizon`` records: at level l the block of index
    k = ⌈t/2^l⌉, which some prefix's cover uses iff k is odd and k·2^l ≤ horizon. At most ⌊log₂ horizon⌋ + 1."""
    T = check_int("horizon", horizon, minimum=1)
    t = check_int("t", t, minimum=1)
    if t > T:
        raise ConfigError(f"t must be <= horizon={T}, got {t}")
    out = []
    for level in range(T.bit_length()):
        k = ((t - 1) >> level) + 1
        if k & 1 and k << level <= T:
            out.append(Node(level, k))
    return out


# --------------------------------------------------------------------------------------------------------------
# Calibration
# --------------------------------------------------------------------------------------------------------------


def _levels(horizon: int) -> int:
    """⌊log₂ T⌋ + 1: the most nodes one record touches."""
    return check_int("horizon", horizon, minimum=1).bit_length()


def _noise_multiplier(sigma: float, sensitivity: float, symmetric: bool) -> float:
    """z of one Gaussian node: σ/Δ, times √2 for symmetric noise (module docstring)."""
    return sigma * (math.sqrt(2.0) if symmetric else 1.0) / sensitivity


def _gaussian_accountant(noise_multiplier: float, horizon: int, delta: float | None) -> GaussianRDPAccountant:
    acc = GaussianRDPAccountant(delta)
    acc.step(noise_multiplier, _levels(horizon))
    return acc


def gaussian_node_sigma(epsilon: float, delta: float, horizon: int, sensitivity: float,
                        symmetric: bool = False) -> float:
    """The smallest per-node σ for which the ⌊log₂ T⌋ + 1 nodes a record touches compose (RDP) to at most
    (ε, δ): z = sqrt(levels / (2ρ)) with ρ from :func:`~fedrec.privacy.accountant.gaussian_rdp_rho`."""
    eps = check_float("epsilon", epsilon, low=0.0, low_open=True)
    d = check_float("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    delta_l2 = check_float("sensitivity", sensitivity, low=0.0, low_open=True)
    z = math.sqrt(_levels(horizon) / (2.0 * gaussian_rdp_rho(eps, d)))
    sigma = z * delta_l2 / (math.sqrt(2.0) if symmetric else 1.0)
    while _gaussian_accountant(_noise_multiplier(sigma, delta_l2, symmetric), horizon, d).epsilon() > eps:
        sigma = math.nextafter(sigma, math.inf)
    return sigma


def laplace_node_scale(epsilon: float, horizon: int, sensitivity: float, split: str = "paper") -> float:
    """The Laplace scale b = Δ₁/ε' of every node (Fed_UCB Alg. 3).

    ``split="paper"``: ε' = ε / max(1, ⌈log₂ T⌉) (the paper writes ⌈log T⌉ without a base; we read base 2, the
    base of the dyadic tree, guarded for T = 1). ``"levels"``:
    ε' = ε / (⌊log₂ T⌋ + 1), the nodes a record really touches, so the accountant's ε never exceeds ``epsilon``
    (the two differ only when T is a power of two, where the paper's split spends ε·(k+1)/k for T = 2^k).
    """
    eps = check_float("epsilon", epsilon, low=0.0, low_open=True)
    delta_l1 = check_float("sensitivity", sensitivity, low=0.0, low_open=True)
    check_choice("laplace_split", split, LAPLACE_SPLITS)
    T = check_int("horizon", horizon, minimum=1)
    count = max(1, (T - 1).bit_length()) if split == "paper" else _levels(T)  # (T − 1).bit_length() = ⌈log₂ T⌉
    scale = delta_l1 / uniform_epsilon_per_round(eps, count)
    while Fraction(delta_l1 / scale) * count > Fraction(eps):  # float rounding of Δ/ε'
        scale = math.nextafter(scale, math.inf)
    return scale


@dataclass(frozen=True)
class TreeLaplace:
    """Laplace noise on the dyadic nodes of every stream, ε-DP per stream over a horizon (Fed_UCB's Algorithms
    2–3): the ``privacy=tree_laplace`` config group.

    Args:
        epsilon: the total ε of a stream, > 0; ``inf`` adds no noise.
        laplace_split: how ε is split over the nodes (:func:`laplace_node_scale`): ``"paper"`` ε' = ε/⌈log₂ T⌉
            (the paper's split, base 2) or ``"levels"`` ε' = ε/(⌊log₂ T⌋ + 1).
        noise_empty_intervals: also noise the dyadic nodes without a record of the stream (Alg. 3 literally;
            default: the paper's prose, which noises only nodes holding a record, so which records are
            present is treated as public).
    """

    epsilon: float = math.inf
    laplace_split: str = "paper"
    noise_empty_intervals: bool = False

    def __post_init__(self) -> None:
        eps = check_epsilon_setting(self.epsilon, allow_inf=True)
        object.__setattr__(self, "epsilon", eps)
        check_choice("privacy.laplace_split", self.laplace_split, LAPLACE_SPLITS)
        if not isinstance(self.noise_empty_intervals, bool):
            raise ConfigError(f"privacy.noise_empty_intervals must be true or false, got "
                              f"{self.noise_empty_intervals!r}")

    @property
    def adds_noise(self) -> bool:
        """Whether the mechanism noises anything (ε < ∞)."""
        return not math.isinf(self.epsilon)

    @staticmethod
    def levels(horizon: int) -> int:
        """⌊log₂ T⌋ + 1: the most nodes one record touches over ``horizon`` records."""
        return _levels(horizon)

    def node_scale(self, horizon: int, sensitivity: float = 1.0) -> float:
        """The Laplace scale b = Δ₁/ε' of every node for ``horizon`` records of L1 ``sensitivity``
        (:func:`laplace_node_scale`); 0 when ε = ∞ (no noise)."""
        if not self.adds_noise:
            return 0.0
        return laplace_node_scale(self.epsilon, horizon, sensitivity, self.laplace_split)

    def accountant(self, horizon: int, sensitivity: float = 1.0) -> LaplaceBasicAccountant | None:
        """What one record undergoes over ``horizon`` records: :meth:`levels` Laplace node mechanisms at
        ε' = Δ₁/b each, by basic composition; None when ε = ∞ (nothing is noised)."""
        if not self.adds_noise:
            return None
        acc = LaplaceBasicAccountant()
        acc.step(sensitivity / self.node_scale(horizon, sensitivity), self.levels(horizon))
        return acc


def fclub_node_sigma(epsilon: float, delta: float, uploads: int) -> float:
    """FCLUB's per-node σ_N = 8·sqrt(ν)·ln(2/δ)/ε, i.e. σ_N² = 64ν ln(2/δ)²/ε² with ν = ⌈log₂(t_c + 1)⌉ + 1 for
    t_c = ``uploads`` (the paper's Sec. 3 text, with ln(2/δ) squared, where Alg. 5 line 3 drops the square; it
    assumes Δ = 2). Pass it as ``scale`` of a
    ``symmetric`` Gaussian :class:`TreeAggregator` with horizon t_c + 1 to get the paper's noise and an
    accounted ε."""
    eps = check_float("epsilon", epsilon, low=0.0, low_open=True)
    d = check_float("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    nu = check_int("uploads", uploads, minimum=0).bit_length() + 1
    return 8.0 * math.sqrt(nu) * math.log(2.0 / d) / eps


def fclub_phases(rounds: int) -> int:
    """The phases of FCLUB that start within ``rounds`` rounds: phase s starts at round 2^s − 1 (Alg. 1)."""
    return (check_int("rounds", rounds, minimum=0) + 1).bit_length() - 1


def _fclub_nodes(uploads: int, phases: int) -> int:
    """The most tree nodes one record lies in after ``phases`` phases: per phase, ⌊log₂(uploads + 1)⌋ + 1 nodes of
    the privatiser, plus the first release of a candidate privatiser that a kept partition discards."""
    return phases * (_levels(uploads + 1) + 1)


def fclub_epsilon(sigma: float, delta: float, uploads: int, phases: int) -> float:
    """The ε (at δ) one record has spent after ``phases`` phases of CDP-FCLUB-DC with node noise ``sigma``, from
    the RDP accountant.

    Each phase's privatiser serves at most ``uploads`` + 1 releases, so a record lies in at most
    ⌊log₂(uploads + 1)⌋ + 1 of its nodes; a phase start also releases once through a candidate privatiser that a
    kept partition discards (one more node). Nodes are symmetric Gaussian on stream elements of Frobenius norm
    ≤ ‖[x; y]‖² ≤ 2. Phases compose (a record re-enters every later phase's first release), which the paper's
    per-privatiser (ε, δ) leaves out."""
    if check_int("phases", phases, minimum=0) == 0:
        return 0.0
    acc = GaussianRDPAccountant(delta)
    acc.step(_noise_multiplier(sigma, 2.0, True), _fclub_nodes(uploads, phases))
    return acc.epsilon()


def fclub_accounted_sigma(epsilon: float, delta: float, uploads: int, rounds: int) -> float:
    """The smallest node σ for which a whole run of ``rounds`` rounds spends at most (ε, δ) by
    :func:`fclub_epsilon` (phases composed), instead of the paper's per-privatiser :func:`fclub_node_sigma`."""
    eps = check_float("epsilon", epsilon, low=0.0, low_open=True)
    d = check_float("delta", delta, low=0.0, high=1.0, low_open=True, high_open=True)
    phases = max(fclub_phases(rounds), 1)
    nodes = _fclub_nodes(uploads, phases)
    sigma = math.sqrt(nodes / (2.0 * gaussian_rdp_rho(eps, d))) * 2.0 / math.sqrt(2.0)  # z = √2σ/Δ, Δ = 2
    while fclub_epsilon(sigma, d, uploads, phases) > eps:
        sigma = math.nextafter(sigma, math.inf)
    return sigma


#: how CDP-FCLUB-DC's node noise is calibrated (:class:`TreeGaussian`)
CALIBRATIONS = ("paper", "accountant")


def _check_calibration(calibration: str) -> None:
    """Refuse a calibration other than :data:`CALIBRATIONS`, naming ``privacy.calibration``."""
    check_choice("privacy.calibration", calibration, CALIBRATIONS)


@dataclass(frozen=True)
class TreeGaussian:
    """CDP-FCLUB-DC's privacy mechanism (``privacy=tree_gaussian``): every local cluster's releases pass a binary
    mechanism with symmetric Gaussian nodes (Alg. 5 of Liu et al.), one privatiser per local cluster.

    Args:
        epsilon: the privatiser's ε > 0; ``inf`` runs the private code path with zero noise (FCLUB-DC decision for
            decision).
        delta: δ in (0, 1).
        horizon: t_c, the uploads a privatiser serves: fixes the tree depth ν.
        calibration: the node σ: ``paper`` (σ² = 64ν ln(2/δ)²/ε² per privatiser, Sec. 3; :func:`fclub_node_sigma`)
            or ``accountant`` (the smallest σ whose run of ``horizon`` rounds, phases composed, spends at most
            (ε, δ); :func:`fclub_accounted_sigma`). The paper's σ spends far less than ε at small ε and more than ε
            at large ε (≳ 16 at T = 10⁵) once phases compose.
    """

    epsilon: float = 1.0
    delta: float = 0.1
    horizon: int = 100_000
    calibration: str = "paper"

    def __post_init__(self) -> None:
        check = {"epsilon": check_epsilon_setting(self.epsilon, allow_inf=True),
                 "delta": check_float("privacy.delta", self.delta, low=0.0, high=1.0, low_open=True, high_open=True),
                 "horizon": check_int("privacy.horizon", self.horizon)}
        _check_calibration(self.calibration)
        for field, value in check.items():
            object.__setattr__(self, field, value)

    @property
    def nu(self) -> int:
        """ν = ⌈log₂(t_c + 1)⌉ + 1, the depth of a privatiser's tree."""
        return self.horizon.bit_length() + 1

    def node_sigma(self, calibration: str) -> float:
        """The node σ under ``calibration`` (``paper`` or ``accountant``, see the class); 0 at ε = ∞."""
        _check_calibration(calibration)
        if math.isinf(self.epsilon):
            return 0.0
        if calibration == "paper":
            return fclub_node_sigma(self.epsilon, self.delta, self.horizon)
        return fclub_accounted_sigma(self.epsilon, self.delta, self.horizon, self.horizon)

    @functools.cached_property
    def sigma(self) -> float:
        """The node σ of this mechanism's calibration."""
        return self.node_sigma(self.calibration)

    def epsilon_spent(self, phases: int) -> float:
        """The ε (at δ) one record has spent after ``phases`` phases (:func:`fclub_epsilon`); ∞ at ε = ∞."""
        return math.inf if math.isinf(self.epsilon) else fclub_epsilon(self.sigma, self.delta, self.horizon, phases)


def augmented_gram(x: Tensor, y: Tensor) -> Tensor:
    """[x; y][x; y]ᵀ, the (d+1)×(d+1) stream element of FCLUB's privatiser (Alg. 5), batched."""
    z = torch.cat([x, y.unsqueeze(-1).to(x.dtype)], dim=-1)
    return z.unsqueeze(-1) * z.unsqueeze(-2)


def split_augmented(m: Tensor) -> tuple[Tensor, Tensor]:
    """(V, b) = (top-left d×d block, first d entries of column d) of an augmented (d+1)×(d+1) statistic, as
    FCLUB's H and h (Alg. 5; column d: the authors' code takes column d − 1, an off-by-one not copied here)."""
    d = m.shape[-1] - 1
    return m[..., :d, :d], m[..., :d, d]


# --------------------------------------------------------------------------------------------------------------
# The cached tree noise, torch form (the compiled form is fedrec.privacy.tree_noise)
# --------------------------------------------------------------------------------------------------------------


def mark_records(rows: Tensor, t: Tensor, last: Tensor, prev: Tensor) -> None:
    """:func:`fedrec.privacy.tree_noise.mark_record` of the distinct streams ``rows`` (m,) at times ``t`` (m,), in
    place on the per-level node indices ``last``, ``prev`` (streams × levels)."""
    lst, prv = last[rows], prev[rows]
    for level in range(last.shape[1]):
        c = ((t - 1) >> level) + 1  # the level-l node holding record t
        moved = lst[:, level] != c  # unmoved: an earlier record lies in this node (and the ones above)
        prv[:, level] = torch.where(moved, lst[:, level], prv[:, level])
        lst[:, level] = c
    last[rows], prev[rows] = lst, prv


def cached_noise(key: int | np.uint64, rows: Tensor, t: Tensor, kind: int, scale: float, noise_empty: bool,
                 last: Tensor, prev: Tensor, node: Tensor, value: Tensor) -> Tensor:
    """:func:`fedrec.privacy.tree_noise.cached_prefix_noise` of the distinct streams ``rows`` (m,) at times ``t``
    (m,): the (m, W) float64 noise of their prefixes, each node drawn once (by the compiled node draw) into the
    caches ``node`` (streams × levels) and ``value`` (streams × levels × W), updated in place; levels summed lowest
    first, as the compiled form does, so both give the same bits. ``t`` must lie below 2^levels and ``scale`` be > 0
    (the compiled form, inside parallel loops, cannot report either)."""
    levels, width = value.shape[1], value.shape[2]
    check_float("scale", scale, low=0.0, low_open=True)
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >> levels):
        raise ConfigError(f"t must lie in [0, {1 << levels}) for a cache of {levels} levels, got {t.tolist()}")
    lst, prv, nd, val = last[rows], prev[rows], node[rows], value[rows]
    total = torch.zeros(len(rows), width, dtype=torch.float64, device=value.device)
    indices, in_cover = cover_nodes(t, levels)
    for level in range(levels):
        index, noised = indices[:, level], in_cover[:, level]
        if not noise_empty:
            noised = noised & ((lst[:, level] == index) | (prv[:, level] == index))
        fresh = noised & (nd[:, level] != index)
        if bool(fresh.any()):
            draws = np.empty((int(fresh.sum()), width))
            node_noise_many(np.uint64(key), rows[fresh].cpu().numpy(), np.full(len(draws), level, dtype=np.int64),
                            index[fresh].cpu().numpy(), kind, scale, draws)
            val[fresh, level] = torch.from_numpy(draws).to(value.device)
            nd[fresh, level] = index[fresh]
        total = total + torch.where(noised.unsqueeze(1), val[:, level], 0.0)
    node[rows], value[rows] = nd, val
    return total


# --------------------------------------------------------------------------------------------------------------
# The aggregator
# --------------------------------------------------------------------------------------------------------------


class TreeAggregator(nn.Module):
    """Private prefix sums of ``num_rows`` independent streams by tree-based aggregation (module docstring).

    Args:
        shape: shape of one record (``()`` for scalars; ``(d+1, d+1)`` for FCLUB's augmented Gram matrix).
        horizon: the most records any row may receive (T); adding more raises.
        sensitivity: Δ, how much one record can change (L2/Frobenius for Gaussian, L1 for Laplace); > 0.
        mechanism: ``"gaussian"`` or ``"laplace"``.
        scale: the node noise scale (σ of Ñ for Gaussian, b for Laplace); > 0. Give this or ``epsilon``.
        epsilon, delta: a budget to calibrate ``scale`` from (:func:`gaussian_node_sigma` /
            :func:`laplace_node_scale`); Gaussian needs ``delta`` in (0, 1), which is also the default δ of
            :meth:`epsilon`.
        num_rows: number of independent streams.
        seed, name, indices: key of the noise, derived as ``fedrec.utils.rng.stream_key(seed, name, *indices)``
            (e.g. ``indices=(replicate, phase)`` for a fresh privatiser per phase); row r is stream r under it.
        symmetric: Gaussian only: symmetric matrix noise (Ñ + Ñᵀ)/√2 on a square ``shape`` (n, n); the records
            must then be symmetric.
        laplace_split: how ``epsilon`` is split over the nodes for Laplace (see :func:`laplace_node_scale`).
        noise_empty_nodes: ``False`` leaves nodes without any present record noise-free (Fed_UCB's prose;
            its Algorithm 3 noises every node). Which records are present (e.g. which arm was pulled) is then treated
            as public; only the values are protected. Records flagged absent in :meth:`add` must be zero.
        dtype: floating dtype of the sums.
    """

    def __init__(
        self,
        shape: Sequence[int] | int,
        horizon: int,
        *,
        sensitivity: float,
        mechanism: str = "gaussian",
        scale: float | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        num_rows: int = 1,
        seed: int = 0,
        name: str = "tree",
        indices: Sequence[int] = (),
        symmetric: bool = False,
        laplace_split: str = "paper",
        noise_empty_nodes: bool = True,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.shape = (check_int("shape", shape, minimum=1),) if isinstance(shape, int) else tuple(
            check_int("shape", s, minimum=1) for s in shape)
        self.horizon = check_int("horizon", horizon, minimum=1)
        self.sensitivity = check_float("sensitivity", sensitivity, low=0.0, low_open=True)
        self.mechanism = check_choice("mechanism", mechanism, MECHANISMS)
        self.num_rows = check_int("num_rows", num_rows, minimum=1)
        self.symmetric = bool(symmetric)
        if self.symmetric and (mechanism != "gaussian" or len(self.shape) != 2 or self.shape[0] != self.shape[1]):
            raise ConfigError(f"symmetric noise needs mechanism='gaussian' and a square shape (n, n), got "
                              f"mechanism={mechanism!r}, shape={self.shape}")
        if not dtype.is_floating_point:
            raise ConfigError(f"dtype must be a floating dtype, got {dtype}")
        self.delta = None if delta is None else check_float("delta", delta, low=0.0, high=1.0,
                                                            low_open=True, high_open=True)
        if (scale is None) == (epsilon is None):
            raise ConfigError("give exactly one of scale (the node noise) or epsilon (a budget to calibrate it "
                              "from); a private tree always adds noise")
        if scale is not None:
            self.scale = check_float("scale", scale, low=0.0, low_open=True)
        elif mechanism == "gaussian":
            if self.delta is None:
                raise ConfigError("delta must be given with epsilon for the Gaussian mechanism (a number in (0, 1))")
            self.scale = gaussian_node_sigma(epsilon, self.delta, self.horizon, self.sensitivity, self.symmetric)
        else:
            self.scale = laplace_node_scale(epsilon, self.horizon, self.sensitivity, laplace_split)
        self.noise_empty_nodes = bool(noise_empty_nodes)
        self.key = int(stream_key(check_int("seed", seed, minimum=0), name,
                                  *(check_int("indices", i, minimum=0) for i in indices)))
        #: the node noise kind of :mod:`fedrec.privacy.tree_noise`
        self.kind = LAPLACE if mechanism == "laplace" else SYMMETRIC if self.symmetric else GAUSSIAN
        levels = self.levels
        # per row: records so far, their clean sum, and the cached tree noise (tree_noise.cached_prefix_noise):
        # per level the nodes of the latest two present records and the latest drawn node with its noise
        self.register_buffer("count", torch.zeros(self.num_rows, dtype=torch.long))
        self.register_buffer("total", torch.zeros(self.num_rows, *self.shape, dtype=dtype))
        for buffer in ("node_last", "node_prev", "node_index"):
            self.register_buffer(buffer, torch.zeros(self.num_rows, levels, dtype=torch.long))
        self.register_buffer("node_value", torch.zeros(self.num_rows, levels, math.prod(self.shape),
                                                       dtype=torch.float64))

    # ---- privacy ---------------------------------------------------------------------------------------------

    @property
    def levels(self) -> int:
        """⌊log₂ T⌋ + 1: the most nodes one record touches, and the number of levels kept per row."""
        return _levels(self.horizon)

    @property
    def noise_multiplier(self) -> float:
        """Gaussian: each node's z = σ/Δ, times √2 for symmetric noise (module docstring)."""
        if self.mechanism != "gaussian":
            raise ConfigError("noise_multiplier is defined for the Gaussian mechanism; see node_epsilon")
        return _noise_multiplier(self.scale, self.sensitivity, self.symmetric)

    @property
    def node_epsilon(self) -> float:
        """Laplace: each node's ε' = Δ₁/b."""
        if self.mechanism != "laplace":
            raise ConfigError("node_epsilon is defined for the Laplace mechanism; see noise_multiplier")
        return self.sensitivity / self.scale

    def accountant(self) -> Accountant:
        """A fresh accountant holding what one record of a full stream undergoes: ⌊log₂ T⌋ + 1 node mechanisms
        (RDP for Gaussian, basic composition for Laplace). Compose further trees into it with ``step``."""
        if self.mechanism == "gaussian":
            return _gaussian_accountant(self.noise_multiplier, self.horizon, self.delta)
        acc = LaplaceBasicAccountant()
        acc.step(self.node_epsilon, self.levels)
        return acc

    def epsilon(self, delta: float | None = None) -> float:
        """The ε of every row over the whole horizon at ``delta`` (default: the configured δ; Laplace: pure ε)."""
        return float(self.accountant().epsilon(delta))

    # ---- streams ---------------------------------------------------------------------------------------------

    @staticmethod
    def cover(t: int) -> list[Node]:
        """:func:`dyadic_cover`: the popcount(t) nodes whose noise the prefix after t records carries."""
        return dyadic_cover(t)

    def nodes_touched(self, t: int) -> list[Node]:
        """:func:`nodes_touched` for this horizon: the nodes record ``t`` contributes to."""
        return nodes_touched(t, self.horizon)

    def node_noise(self, rows: Tensor | Sequence[int] | None, node: Node) -> Tensor:
        """The noise of ``node`` in the given rows (``None``: all), regenerated from the key. In a prefix it counts
        only if the node is in the cover (and, with ``noise_empty_nodes=False``, holds a present record)."""
        idx = self._rows(rows).cpu().numpy()
        level = check_int("node.level", node.level, minimum=0)
        index = check_int("node.index", node.index, minimum=1)
        out = np.empty((len(idx), math.prod(self.shape)))
        node_noise_many(np.uint64(self.key), idx, np.full(len(idx), level), np.full(len(idx), index), self.kind,
                        self.scale, out)
        return torch.from_numpy(out).view(len(idx), *self.shape).to(device=self.total.device, dtype=self.total.dtype)

    def add(self, rows: Tensor | Sequence[int] | None, values: Tensor, present: Tensor | None = None) -> Tensor:
        """Append one record to the stream of each of ``rows`` and return their private prefix sums.

        Args:
            rows: distinct row indices (``None``: every row, in order).
            values: ``(len(rows), *shape)`` finite records (symmetric in the last two dimensions if ``symmetric``).
            present: optional ``(len(rows),)`` bool: False marks a record that holds no datum (its value must be
                zero); with ``noise_empty_nodes=False`` a node without present records gets no noise.
        """
        idx = self._rows(rows)
        n = idx.numel()
        v = torch.as_tensor(values, dtype=self.total.dtype, device=self.total.device)
        if tuple(v.shape) != (n, *self.shape):
            raise ValueError(f"values must have shape {(n, *self.shape)} (rows, *shape), got {tuple(v.shape)}")
        if not bool(torch.isfinite(v).all()):
            raise ValueError("values contain NaN or infinite entries")
        if self.symmetric:
            if not torch.allclose(v, v.mT, rtol=1e-12, atol=0.0):
                raise ValueError("values must be symmetric matrices: symmetric noise leaves the antisymmetric part "
                                 "unprotected")
            v = (v + v.mT) / 2
        pres = torch.ones(n, dtype=torch.bool) if present is None else torch.as_tensor(present).cpu()
        if pres.dtype != torch.bool or tuple(pres.shape) != (n,):
            raise ValueError(f"present must be a ({n},) bool tensor, got {tuple(pres.shape)} {pres.dtype}")
        pres = pres.to(self.count.device)
        if bool((v[~pres] != 0).any()):
            raise ValueError("values of records marked not present must be zero")
        c = self.count[idx] + 1
        if bool((c > self.horizon).any()):
            r = int(idx[c > self.horizon][0])
            raise ValueError(f"row {r} already holds horizon={self.horizon} records; a longer stream is not covered "
                             "by the privacy guarantee")
        mark_records(idx[pres], c[pres], self.node_last, self.node_prev)
        self.total[idx] += v
        self.count[idx] = c
        return self._prefix(idx)

    def prefix(self, rows: Tensor | Sequence[int] | None = None) -> Tensor:
        """The private prefix sums of ``rows`` (``None``: all): clean sum plus the noise of the popcount(t)
        cover nodes of each row's record count t (zero for a row without records)."""
        return self._prefix(self._rows(rows))

    # ---- internals -------------------------------------------------------------------------------------------

    def _prefix(self, idx: Tensor) -> Tensor:
        """Clean sums plus cached tree noise of rows ``idx``, drawing (and caching) the cover nodes not yet drawn."""
        noise = cached_noise(self.key, idx, self.count[idx], self.kind, self.scale, self.noise_empty_nodes,
                             self.node_last, self.node_prev, self.node_index, self.node_value)
        return self.total[idx] + noise.view(len(idx), *self.shape).to(self.total.dtype)

    def _rows(self, rows: Tensor | Sequence[int] | None) -> Tensor:
        if rows is None:
            return torch.arange(self.num_rows, device=self.count.device)
        idx = torch.as_tensor(rows)
        if idx.dim() != 1 or idx.dtype.is_floating_point or idx.dtype == torch.bool:
            raise ValueError(f"rows must be a 1-D integer tensor or sequence, got shape {tuple(idx.shape)} "
                             f"{idx.dtype}")
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.num_rows):
            raise ValueError(f"rows must lie in [0, {self.num_rows}), got {idx.tolist()}")
        if torch.unique(idx).numel() != idx.numel():
            raise ValueError(f"rows must be distinct, got {idx.tolist()}")
        return idx.long().to(self.count.device)

    def _config(self) -> dict[str, Any]:
        return {"mechanism": self.mechanism, "shape": list(self.shape), "horizon": self.horizon,
                "num_rows": self.num_rows, "scale": self.scale, "sensitivity": self.sensitivity,
                "symmetric": self.symmetric, "key": self.key, "noise_empty_nodes": self.noise_empty_nodes}

    def get_extra_state(self) -> dict[str, Any]:
        return self._config()

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Refuse a checkpoint of a differently configured tree (its noise or guarantee would differ)."""
        mine = self._config()
        for field, value in mine.items():
            if state.get(field) != value:
                raise ConfigError(f"cannot load tree state: {field} is {state.get(field)!r} in the checkpoint but "
                                  f"{value!r} here")

    def extra_repr(self) -> str:
        return (f"shape={self.shape}, horizon={self.horizon}, mechanism={self.mechanism!r}, scale={self.scale:.6g}, "
                f"sensitivity={self.sensitivity}, num_rows={self.num_rows}, symmetric={self.symmetric}")

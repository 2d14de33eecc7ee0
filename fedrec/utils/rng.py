"""Counter-based random numbers: a draw is a pure function of a key and counters, never of generator state.

A resumed run therefore redraws exactly what the uninterrupted run would have, from counters it stores anyway,
and streams (clients, rows, tree nodes) are independent without one generator object each. Bits come from
splitmix64's output function :func:`mix64`. There is one recipe, compiled, that every kernel and every torch path
calls:

* a stream is a 64-bit state: :func:`substream` (key, owner) ↦ mix(key ⊕ mix(owner + φ)) with φ the golden ratio
  constant, and a stream of a stream is ``substream(substream(key, a), b)``;
* draw c ≥ 0 of a stream is :func:`uniform` (53 bits, in (0, 1)), :func:`normal` (Box–Muller on the uniforms of
  pair p = ⌊c/2⌋: the cosine for even c, the sine for odd c) or :func:`laplace` (inverse CDF of Laplace(0, 1));
  :func:`fill` writes consecutive draws, computing each Box–Muller pair once.

:class:`KeyedRows` draws blocks of rows (FedGNN's client-DP noise), :func:`normals` LinTS's samples, and
:mod:`fedrec.privacy.tree_noise` the binary mechanism's node noise, all through these functions. On a GPU,
:meth:`KeyedRows.tensor` computes the same recipe on the device in torch's 64-bit integer arithmetic (the uniforms bit
for bit; normals and Laplace draws to the last bits of the device's log, cos and sin), so that a round's noise is
neither drawn on the host nor copied over.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from fedrec.errors import check_choice
from fedrec.utils.jit import jit, keeping_torch_threads, parallel_variant, prange
from fedrec.utils.seeding import numpy_generator

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S11, _S27, _S30, _S31 = np.uint64(11), np.uint64(27), np.uint64(30), np.uint64(31)
_TWO_M53 = 2.0 ** -53

#: what a draw follows: :class:`KeyedRows` ``distribution`` names and the compiled functions' ``kind`` codes
UNIFORM, NORMAL, LAPLACE = 0, 1, 2
DISTRIBUTIONS = {"uniform": UNIFORM, "normal": NORMAL, "laplace": LAPLACE}


def mix64(z: np.uint64 | np.ndarray) -> np.uint64 | np.ndarray:
    """splitmix64's output function, a bijection of uint64 (numpy's and numba's uint64 arithmetic wrap)."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


_mix = jit(mix64)


def stream_key(seed: int, name: str, *indices: int) -> np.uint64:
    """The 64-bit key of the counter-based stream ``name`` (at ``indices``) of a run seeded ``seed``."""
    return np.uint64(numpy_generator(seed, name, *indices).bit_generator.random_raw())


# ---- the recipe ----------------------------------------------------------------------------------------------


@jit
def substream(key: np.uint64, owner: np.int64) -> np.uint64:
    """The state of owner ``owner``'s stream under ``key`` (owner >= 0): mix(key ⊕ mix(owner + φ)), a bijection of
    the key for a fixed owner. Its result is itself a key: ``substream(substream(key, a), b)`` nests streams.
    Called from Python it returns a Python int: wrap it in ``np.uint64`` before passing it on (numba refuses ints
    above 2^63 - 1 where it compiled for int64; keys and states are read as uint64 whatever their integer type)."""
    return _mix(np.uint64(key) ^ _mix(np.uint64(owner) + _GOLDEN))


@jit
def uniform(state: np.uint64, c: np.int64) -> float:
    """Uniform draw ``c`` (>= 0) of the stream whose state is ``state``: 53 random bits, in (0, 1) (never 0 or 1)."""
    bits = _mix(np.uint64(state) + np.uint64(c + 1) * _GOLDEN)
    return (np.float64(bits >> _S11) + 0.5) * _TWO_M53


@jit
def _box_muller(state: np.uint64, pair: np.int64) -> tuple[float, float]:
    """(radius, angle) of Box–Muller pair ``pair``: from the uniforms 2·pair and 2·pair + 1."""
    radius = np.sqrt(-2.0 * np.log(uniform(state, 2 * pair)))
    return radius, 2.0 * np.pi * uniform(state, 2 * pair + 1)


@jit
def normal(state: np.uint64, c: np.int64) -> float:
    """Standard normal draw ``c``: radius · cos(angle) of Box–Muller pair c // 2 for even c, · sin(angle) for odd
    c (the two halves of a pair are independent)."""
    radius, angle = _box_muller(state, c // 2)
    return radius * (np.cos(angle) if c % 2 == 0 else np.sin(angle))


@jit
def laplace(state: np.uint64, c: np.int64) -> float:
    """Laplace(0, 1) draw ``c`` by the inverse CDF −sign(u − ½)·log(1 − 2|u − ½|) of uniform ``c`` (|u − ½| < ½:
    the log stays finite)."""
    u = uniform(state, c) - 0.5
    return -np.sign(u) * np.log(1.0 - 2.0 * np.abs(u))


@jit
def fill(state: np.uint64, start: np.int64, kind: int, out: np.ndarray) -> None:
    """``out`` (1-D) gets draws ``start``, ``start`` + 1, … of the stream: :func:`uniform`, :func:`normal` or
    :func:`laplace` (``kind``), equal to those functions draw by draw; a Box–Muller pair is computed once."""
    radius, angle = 0.0, 0.0
    for j in range(out.shape[0]):
        c = start + j
        if kind == UNIFORM:
            out[j] = uniform(state, c)
        elif kind == NORMAL:
            if j == 0 or c % 2 == 0:  # a new pair
                radius, angle = _box_muller(state, c // 2)
            out[j] = radius * (np.cos(angle) if c % 2 == 0 else np.sin(angle))
        else:
            out[j] = laplace(state, c)


# ---- LinTS's normals -----------------------------------------------------------------------------------------


@jit
def fill_normals(seed: int, row: int, draw: int, out: np.ndarray) -> None:
    """Write the standard normals of draw ``draw`` of state row ``row`` into ``out`` (1-D): normals 0, 1, … of the
    stream ``substream(substream(seed, row), draw)`` (the run seed is the key)."""
    fill(substream(substream(np.uint64(seed), row), draw), 0, NORMAL, out)


@jit
def normals(seed: int, rows: np.ndarray, draws: np.ndarray, dim: int) -> np.ndarray:
    """Draws ``draws[m]`` of rows ``rows[m]``: an (m, dim) array of standard normals."""
    out = np.empty((rows.shape[0], dim))
    for m in range(rows.shape[0]):
        fill_normals(seed, rows[m], draws[m], out[m])
    return out


# ---- blocks of rows keyed by (key, owner, counter): the same numbers whichever process or batch computes an owner's


def _keyed_fill_rows(key: np.uint64, owner: np.ndarray, start: np.ndarray, kind: int, out: np.ndarray) -> None:
    """Row ``i`` of ``out`` gets draws ``start[i]``, ``start[i] + 1``, ... of owner ``owner[i]``'s stream."""
    for i in prange(out.shape[0]):
        fill(substream(key, owner[i]), start[i], kind, out[i])


#: serial, and over all cores for blocks of at least :data:`PARALLEL_DRAWS` numbers (each row is its own stream, so
#: both write the same numbers; the parallel one is compiled only when a block that large is drawn)
_keyed_fill, _keyed_fill_parallel = jit(_keyed_fill_rows), jit(parallel_variant(_keyed_fill_rows), parallel=True)
PARALLEL_DRAWS = 1 << 20


@jit
def keyed_sample_excluding(key: np.uint64, owner: np.ndarray, indptr: np.ndarray, excluded: np.ndarray, n: int,
                           count: int) -> tuple[np.ndarray, np.ndarray]:
    """Per owner ``owner[i]``, ``count`` distinct values drawn uniformly from ``range(n)`` minus the distinct values
    ``excluded[indptr[i]:indptr[i+1]]``, by rejection from its stream (counter c proposes ``⌊u_c·n⌋``); an owner
    with fewer than ``count`` such values gets all of them. Returns ``(values (m, count), valid (m, count))``."""
    m = owner.shape[0]
    values = np.zeros((m, count), dtype=np.int64)
    valid = np.zeros((m, count), dtype=np.bool_)
    taken = np.zeros(n, dtype=np.bool_)
    for i in range(m):
        lo, hi = indptr[i], indptr[i + 1]
        for e in range(lo, hi):
            taken[excluded[e]] = True
        free = n - (hi - lo)
        if free <= count:  # too few values to choose from: all of them, in increasing order
            k = 0
            for v in range(n):
                if not taken[v]:
                    values[i, k] = v
                    valid[i, k] = True
                    k += 1
        else:
            state = substream(key, owner[i])
            k, c = 0, 0
            while k < count:
                v = min(np.int64(uniform(state, c) * n), n - 1)
                c += 1
                if not taken[v]:
                    taken[v] = True
                    values[i, k] = v
                    valid[i, k] = True
                    k += 1
        for e in range(lo, hi):
            taken[excluded[e]] = False
        for k in range(count):
            if valid[i, k]:
                taken[values[i, k]] = False
    return values, valid


@jit
def keyed_group_shuffle(key: np.uint64, owner: np.ndarray, indptr: np.ndarray, order: np.ndarray) -> None:
    """Shuffle each group ``order[indptr[g]:indptr[g+1]]`` in place, uniformly and independently, by Fisher–Yates
    on owner ``owner[g]``'s stream (position i swaps with ⌊u_i·(i+1)⌋): the same permutation of a group's members
    whichever other groups are shuffled with it."""
    for g in range(owner.shape[0]):
        state = substream(key, owner[g])
        lo = indptr[g]
        for i in range(indptr[g + 1] - lo - 1, 0, -1):
            j = min(np.int64(uniform(state, i) * (i + 1)), i)
            order[lo + i], order[lo + j] = order[lo + j], order[lo + i]


def rank_within(group: np.ndarray) -> np.ndarray:
    """Each element's position among the elements of its group, in order (``[0, 0, 1, 0, 1, 2]`` for groups
    ``[a, b, b, c, c, c]``, in any arrangement): the counters of rows that draw from their group's stream."""
    group = np.asarray(group)
    perm = np.argsort(group, kind="stable")
    ordered = group[perm]
    rank = np.empty(len(group), dtype=np.int64)
    rank[perm] = np.arange(len(group)) - np.searchsorted(ordered, ordered)  # minus the group's first index
    return rank


class KeyedRows:
    """Counter-based draws for a block of rows: row ``i`` reads draws ``start[i]``, ``start[i] + 1``, ... of the
    stream of owner ``owner[i]`` (e.g. a client) under ``key`` (e.g. of a run seed, a draw's name and a round).

    A row's numbers depend on the key, its owner and its counters alone, so an owner's draws are the same whichever
    process, batch or set of other owners computes them (a sharded run draws what a one-process run draws).
    """

    def __init__(self, key: int | np.uint64, owner: np.ndarray | Sequence[int],
                 start: np.ndarray | Sequence[int] | int = 0):
        self.key = np.uint64(key)
        self.owner = np.ascontiguousarray(owner, dtype=np.int64).reshape(-1)
        start_arr = np.asarray(start, dtype=np.int64)
        self.start = np.ascontiguousarray(np.broadcast_to(start_arr, self.owner.shape))

    def draw(self, distribution: str, width: int) -> np.ndarray:
        """``(rows, width)`` float64 draws of ``distribution`` (``"uniform"`` in (0, 1), ``"normal"`` standard,
        ``"laplace"`` with scale 1)."""
        check_choice("distribution", distribution, DISTRIBUTIONS)
        out = np.empty((self.owner.shape[0], int(width)))
        if out.size >= PARALLEL_DRAWS and out.shape[0] > 1:
            with keeping_torch_threads():  # also outside a trainer's block, as while a run is built
                _keyed_fill_parallel(self.key, self.owner, self.start, DISTRIBUTIONS[distribution], out)
        else:
            _keyed_fill(self.key, self.owner, self.start, DISTRIBUTIONS[distribution], out)
        return out

    def tensor(self, distribution: str, width: int, device: Any = "cpu") -> Any:
        """:meth:`draw` as a float64 torch tensor on ``device``: on the CPU the compiled draws themselves, elsewhere
        the same recipe computed on the device (:func:`torch_draws`): only the owners and counters are copied over."""
        import torch

        device = torch.device(device)
        if device.type == "cpu":
            return torch.from_numpy(self.draw(distribution, width))
        check_choice("distribution", distribution, DISTRIBUTIONS)
        return torch_draws(self.key, torch.tensor(self.owner, device=device), torch.tensor(self.start, device=device),
                           DISTRIBUTIONS[distribution], int(width))


# ---- the recipe in torch's int64 arithmetic, for draws on a device --------------------------------------------


def _signed(value: np.uint64) -> int:
    """A uint64 constant as the int64 of the same bits (torch's integer tensors are signed)."""
    return int(value) - (1 << 64) if int(value) >= 1 << 63 else int(value)


def _shift_right(z: Any, s: int) -> Any:
    """``z >> s`` of the uint64 whose bits the int64 tensor ``z`` holds (torch shifts int64 arithmetically)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def _mix_torch(z: Any) -> Any:
    """:func:`mix64` of int64 tensors (multiplication wraps as uint64's does: the same bits)."""
    z = (z ^ _shift_right(z, 30)) * _signed(_M1)
    z = (z ^ _shift_right(z, 27)) * _signed(_M2)
    return z ^ _shift_right(z, 31)


def _uniform_torch(state: Any, c: Any) -> Any:
    """:func:`uniform` of int64 tensors ``state`` and ``c`` (broadcast)."""
    bits = _mix_torch(state + (c + 1) * _signed(_GOLDEN))
    return (_shift_right(bits, 11).double() + 0.5) * _TWO_M53


#: the most draws :func:`torch_draws` computes at once (its int64 temporaries stay a few hundred MB)
TORCH_DRAW_BLOCK = 1 << 22


def torch_draws(key: np.uint64, owner: Any, start: Any, kind: int, width: int) -> Any:
    """``(rows, width)`` float64 draws on ``owner``'s device: row ``i`` draws ``start[i]``, ``start[i] + 1``, ... of
    owner ``owner[i]``'s stream under ``key``, of :func:`uniform`, :func:`normal` or :func:`laplace` (``kind``), each
    draw computed by its own counters, as those functions do (a Box–Muller pair's two uniforms for each normal)."""
    import torch

    rows, device = owner.shape[0], owner.device
    out = torch.empty((rows, width), dtype=torch.float64, device=device)
    if rows == 0 or width == 0:
        return out
    owner_key = _mix_torch(owner.long() + _signed(_GOLDEN))
    state = _mix_torch(owner_key ^ _signed(np.uint64(key)))
    step = max(TORCH_DRAW_BLOCK // width, 1)
    offsets = torch.arange(width, device=device)
    for a in range(0, rows, step):
        st = state[a:a + step, None]
        c = start[a:a + step, None].long() + offsets
        if kind == UNIFORM:
            out[a:a + step] = _uniform_torch(st, c)
        elif kind == NORMAL:
            pair = torch.div(c, 2, rounding_mode="floor")
            radius = torch.sqrt(-2.0 * torch.log(_uniform_torch(st, 2 * pair)))
            angle = 2.0 * np.pi * _uniform_torch(st, 2 * pair + 1)
            out[a:a + step] = radius * torch.where(c % 2 == 0, torch.cos(angle), torch.sin(angle))
        else:
            u = _uniform_torch(st, c) - 0.5
            out[a:a + step] = -torch.sign(u) * torch.log(1.0 - 2.0 * torch.abs(u))
    return out

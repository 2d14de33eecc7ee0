"""Counter-based random numbers: a draw is a pure function of a key and counters, never of generator state.

A resumed run therefore redraws exactly what the uninterrupted run would have, from counters it stores anyway,
and streams (rows, tree nodes) are independent without one generator object each. Bits come from splitmix64's
output function :func:`mix64`. :func:`normals` serves LinTS (normals by Box–Muller; the torch path calls the same
compiled function as the kernels, so both backends draw identical bits), :func:`keyed_uniforms` the tree
aggregation's node noise.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedrec.jit import jit
from fedrec.seeding import numpy_generator

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
GOLDEN = np.uint64(0x9E3779B97F4A7C15)
S11, _S27, _S30, _S31 = np.uint64(11), np.uint64(27), np.uint64(30), np.uint64(31)
TWO_M53 = 2.0 ** -53


def mix64(z: np.uint64 | np.ndarray) -> np.uint64 | np.ndarray:
    """splitmix64's output function, a bijection of uint64 (numpy's and numba's uint64 arithmetic wrap)."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


#: :func:`mix64` compiled, for the kernels
mix64_jit = jit(mix64)
_mix = mix64_jit


def stream_key(seed: int, name: str, *indices: int) -> np.uint64:
    """The 64-bit key of the counter-based stream ``name`` (at ``indices``) of a run seeded ``seed``."""
    return np.uint64(numpy_generator(seed, name, *indices).bit_generator.random_raw())


def keyed_uniforms(key: int, fields: Sequence[np.ndarray], n: int) -> np.ndarray:
    """``(len(fields[0]), n)`` uniforms in (0, 1): per row, ``n`` outputs from a state hashed from ``key`` and that
    row's fields (each step h ↦ mix(h ⊕ mix(field)) is a bijection of h for a fixed field)."""
    h = np.full(len(fields[0]), key, dtype=np.uint64)
    for field in fields:
        h = mix64(h ^ mix64(np.asarray(field, dtype=np.int64).astype(np.uint64)))
    out = np.empty((len(h), n))
    _fill_units(h, out)
    return out


@jit
def fill_normals(seed: int, row: int, draw: int, out: np.ndarray) -> None:
    """Write the standard normals of draw ``draw`` of state row ``row`` into ``out`` (1-D)."""
    key = _mix(_mix(_mix(np.uint64(seed) + GOLDEN) ^ np.uint64(row)) ^ np.uint64(draw))
    n = out.shape[0]
    for i in range((n + 1) // 2):
        a = _mix(key ^ np.uint64(2 * i + 1))
        b = _mix(key ^ np.uint64(2 * i + 2))
        u1 = (np.float64(a >> S11) + 1.0) * TWO_M53  # (0, 1]: log stays finite
        u2 = np.float64(b >> S11) * TWO_M53
        radius = np.sqrt(-2.0 * np.log(u1))
        out[2 * i] = radius * np.cos(2.0 * np.pi * u2)
        if 2 * i + 1 < n:
            out[2 * i + 1] = radius * np.sin(2.0 * np.pi * u2)


@jit
def normals(seed: int, rows: np.ndarray, draws: np.ndarray, dim: int) -> np.ndarray:
    """Draws ``draws[m]`` of rows ``rows[m]``: an (m, dim) array of standard normals."""
    out = np.empty((rows.shape[0], dim))
    for m in range(rows.shape[0]):
        fill_normals(seed, rows[m], draws[m], out[m])
    return out


# ---- draws keyed by (key, owner, counter): the same numbers whichever process or batch computes an owner's rows

#: what a keyed block draws: :class:`KeyedRows` ``distribution`` names and the kernel's codes
DISTRIBUTIONS = {"uniform": 0, "normal": 1, "laplace": 2}


@jit
def _owner_state(key: np.uint64, owner: np.int64) -> np.uint64:
    """The hash state of owner ``owner``'s stream under ``key``."""
    return _mix(key ^ _mix(np.uint64(owner) + GOLDEN))


@jit
def _keyed_unit(state: np.uint64, counter: np.int64) -> float:
    """Uniform in (0, 1) number ``counter`` of the stream whose state is ``state`` (53 bits, never 0 or 1)."""
    bits = _mix(state + np.uint64(counter + 1) * GOLDEN)
    return (np.float64(bits >> S11) + 0.5) * TWO_M53


@jit
def _fill_units(states: np.ndarray, out: np.ndarray) -> None:
    """Row ``i`` of ``out`` gets uniforms 0, 1, ... of the stream whose state is ``states[i]``."""
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = _keyed_unit(states[i], j)


@jit
def _keyed_fill(key: np.uint64, owner: np.ndarray, start: np.ndarray, kind: int, out: np.ndarray) -> None:
    """Row ``i`` of ``out`` gets draws ``start[i]``, ``start[i] + 1``, ... of owner ``owner[i]``'s stream: uniform
    (kind 0), standard normal (1: draws 2p and 2p+1 are Box–Muller's cosine and sine of uniforms 2p and 2p+1) or
    Laplace(0, 1) by its inverse CDF (2)."""
    radius, angle = 0.0, 0.0
    for i in range(out.shape[0]):
        state = _owner_state(key, owner[i])
        for j in range(out.shape[1]):
            c = start[i] + j
            if kind == 0:
                out[i, j] = _keyed_unit(state, c)
            elif kind == 1:
                if j == 0 or c % 2 == 0:  # a new pair
                    pair = c - c % 2
                    radius = np.sqrt(-2.0 * np.log(_keyed_unit(state, pair)))
                    angle = 2.0 * np.pi * _keyed_unit(state, pair + 1)
                out[i, j] = radius * (np.cos(angle) if c % 2 == 0 else np.sin(angle))
            else:
                u = _keyed_unit(state, c) - 0.5  # in (-1/2, 1/2): the log stays finite
                out[i, j] = -np.sign(u) * np.log(1.0 - 2.0 * np.abs(u))


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
            state = _owner_state(key, owner[i])
            k, c = 0, 0
            while k < count:
                v = min(np.int64(_keyed_unit(state, c) * n), n - 1)
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
        state = _owner_state(key, owner[g])
        lo = indptr[g]
        for i in range(indptr[g + 1] - lo - 1, 0, -1):
            j = min(np.int64(_keyed_unit(state, i) * (i + 1)), i)
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

    def __init__(self, key: int | np.uint64, owner: np.ndarray | Sequence[int], start: np.ndarray | Sequence[int] | int = 0):
        self.key = np.uint64(key)
        self.owner = np.ascontiguousarray(owner, dtype=np.int64).reshape(-1)
        start_arr = np.asarray(start, dtype=np.int64)
        self.start = np.ascontiguousarray(np.broadcast_to(start_arr, self.owner.shape))

    def draw(self, distribution: str, width: int) -> np.ndarray:
        """``(rows, width)`` float64 draws of ``distribution`` (``"uniform"`` in (0, 1), ``"normal"`` standard,
        ``"laplace"`` with scale 1)."""
        if distribution not in DISTRIBUTIONS:
            raise ValueError(f"distribution must be one of {list(DISTRIBUTIONS)}, got {distribution!r}")
        out = np.empty((self.owner.shape[0], int(width)))
        _keyed_fill(self.key, self.owner, self.start, DISTRIBUTIONS[distribution], out)
        return out

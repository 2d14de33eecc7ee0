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
    bits = mix64(h[:, None] + np.arange(1, n + 1, dtype=np.uint64)[None, :] * GOLDEN)
    return ((bits >> S11).astype(np.float64) + 0.5) * TWO_M53  # 53 bits, never 0 or 1


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

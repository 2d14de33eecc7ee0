"""Counter-based standard normal draws: draw n of state row r under seed s is a pure function of (s, r, n).

LinTS uses it so that every row (client × replicate) has its own stream, a resumed run redraws exactly the same
numbers from the stored counters, and both backends get bit-identical samples (the torch path calls the same
compiled function). Bits come from the splitmix64 finaliser, normals from the Box–Muller transform.
"""
from __future__ import annotations

import numpy as np

from fedrec.jit import jit

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_S11, _S27, _S30, _S31 = np.uint64(11), np.uint64(27), np.uint64(30), np.uint64(31)
_TWO_M53 = 2.0 ** -53


@jit
def _mix(z: np.uint64) -> np.uint64:
    """splitmix64's output function: a bijective 64-bit mixer."""
    z = (z ^ (z >> _S30)) * _M1
    z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


@jit
def fill_normals(seed: int, row: int, draw: int, out: np.ndarray) -> None:
    """Write the standard normals of draw ``draw`` of state row ``row`` into ``out`` (1-D)."""
    key = _mix(_mix(_mix(np.uint64(seed) + _GOLDEN) ^ np.uint64(row)) ^ np.uint64(draw))
    n = out.shape[0]
    for i in range((n + 1) // 2):
        a = _mix(key ^ np.uint64(2 * i + 1))
        b = _mix(key ^ np.uint64(2 * i + 2))
        u1 = (np.float64(a >> _S11) + 1.0) * _TWO_M53  # (0, 1]: log stays finite
        u2 = np.float64(b >> _S11) * _TWO_M53
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

"""The binary mechanism's noise, compiled: the one implementation behind Fed_UCB's noisy partial sums (Laplace),
CDP-FCLUB's privatiser (symmetric Gaussian matrices) and :class:`~fedrec.privacy.tree.TreeAggregator`.

A stream ``row`` under ``key`` releases prefix sums; the prefix after t records carries the noise of the dyadic
cover of 1..t, one node (l, t >> l) per set bit l of t (:func:`cover`), node (l, k) holding the records
((k − 1)·2^l, k·2^l]. Every node draws from a stream of its own,

    substream(substream(key, row), node_code(l, k)),    node_code(l, k) = k·2^6 + l    (:mod:`fedrec.rng`),

so its noise is a pure function of (key, row, l, k): regenerated whenever needed (:func:`prefix_noise`, FCLUB's
privatiser) or drawn once and cached with its index per level (:func:`cached_prefix_noise`, Fed_UCB's O(log T)
memory per stream), with the same values. A node's noise of width W (``kind``):

``LAPLACE``
    W i.i.d. Laplace(0, b): b · draws 0 … W−1 of the node's stream (:func:`fedrec.rng.laplace`).
``GAUSSIAN``
    W i.i.d. N(0, σ²): σ · normals 0 … W−1 (:func:`fedrec.rng.normal`).
``SYMMETRIC``
    a flattened n × n matrix (W = n²) σ(Z + Zᵀ)/√2, Z the normals 0 … W−1 in row-major order (FCLUB Alg. 5 l.3):
    off-diagonal variance σ², diagonal 2σ².
"""
from __future__ import annotations

import numpy as np

from fedrec.jit import jit
from fedrec.rng import LAPLACE as _LAPLACE_DRAW
from fedrec.rng import NORMAL, fill, substream

#: node noise kinds (module docstring)
LAPLACE, GAUSSIAN, SYMMETRIC = 0, 1, 2
#: bits of a node code that hold its level (levels < 64)
LEVEL_BITS = 6


@jit
def cover(t: int) -> np.ndarray:
    """The dyadic cover of records 1..t: a (popcount(t), 2) array of nodes (level, index), one per set bit l of t
    with index t >> l, lowest level first (:func:`fedrec.privacy.tree.dyadic_cover` in Python)."""
    out = np.empty((64, 2), dtype=np.int64)
    count = 0
    level = 0
    while t >> level:
        if (t >> level) & 1:
            out[count, 0] = level
            out[count, 1] = t >> level
            count += 1
        level += 1
    return out[:count]


@jit
def node_code(level: int, index: int) -> int:
    """The owner number of node (level, index) in its row's stream: index·2^6 + level."""
    return (index << LEVEL_BITS) | level


@jit
def node_noise(key: np.uint64, row: int, level: int, index: int, kind: int, scale: float, out: np.ndarray) -> None:
    """Write the noise of node (``level``, ``index``) of stream ``row`` into ``out`` (1-D, width W; module
    docstring), ``scale`` the Laplace b or the Gaussian σ."""
    state = substream(substream(key, row), node_code(level, index))
    fill(state, 0, _LAPLACE_DRAW if kind == LAPLACE else NORMAL, out)
    if kind != SYMMETRIC:
        for j in range(out.shape[0]):
            out[j] *= scale
        return
    n = int(np.sqrt(out.shape[0]) + 0.5)
    for i in range(n):  # each entry pair (i, j), (j, i) is read before either is written
        for j in range(i, n):
            v = scale * (out[i * n + j] + out[j * n + i]) / np.sqrt(2.0)
            out[i * n + j] = v
            out[j * n + i] = v


@jit
def prefix_noise(key: np.uint64, row: int, t: int, kind: int, scale: float, out: np.ndarray,
                 work: np.ndarray) -> None:
    """Write into ``out`` the noise of the prefix after ``t`` records of stream ``row``: the sum over the cover of
    1..t of the node noises, regenerated from the key, lowest level first (``work``: scratch of ``out``'s size)."""
    out[:] = 0.0
    nodes = cover(t)
    for n in range(nodes.shape[0]):
        node_noise(key, row, nodes[n, 0], nodes[n, 1], kind, scale, work)
        for j in range(out.shape[0]):
            out[j] += work[j]


@jit
def mark_record(row: int, t: int, last: np.ndarray, prev: np.ndarray) -> None:
    """Mark a present record at time ``t`` (after every earlier mark) of stream ``row`` in the per-level node indices
    ``last``, ``prev`` (streams × levels): ``last[row, l]`` is the level-l node of the latest present record,
    ``prev[row, l]`` the one before it (0: none)."""
    for level in range(last.shape[1]):
        c = ((t - 1) >> level) + 1  # the level-l node holding record t
        if last[row, level] == c:
            break  # an earlier record lies in this node, hence in every node above it, all already marked
        prev[row, level] = last[row, level]
        last[row, level] = c


@jit
def cached_prefix_noise(key: np.uint64, row: int, t: int, kind: int, scale: float, noise_empty: bool,
                        last: np.ndarray, prev: np.ndarray, node: np.ndarray, value: np.ndarray,
                        out: np.ndarray) -> None:
    """:func:`prefix_noise` of stream ``row`` with each node drawn once: the caches hold one row per stream, the
    level-l node's noise in ``value[row, l]`` (streams × levels × W) with its index in ``node[row, l]`` (streams ×
    levels). With ``noise_empty`` False, a cover node gets noise only if it holds a record marked by
    :func:`mark_record` (Fed_UCB's prose; its Algorithm 3 noises every node). ``t`` must lie at or after the last mark
    and below 2^levels (unchecked: this runs inside the kernels' parallel loops)."""
    for j in range(out.shape[0]):
        out[j] = 0.0
    level = 0
    while t >> level:  # the cover of t, as in cover() but without allocating: node (l, t >> l) for odd t >> l
        if (t >> level) & 1:
            m = t >> level
            if noise_empty or last[row, level] == m or prev[row, level] == m:
                if node[row, level] != m:
                    node_noise(key, row, level, m, kind, scale, value[row, level])
                    node[row, level] = m
                for j in range(out.shape[0]):
                    out[j] += value[row, level, j]
        level += 1


@jit
def node_noise_many(key: np.uint64, rows: np.ndarray, levels: np.ndarray, indices: np.ndarray, kind: int,
                    scale: float, out: np.ndarray) -> None:
    """:func:`node_noise` of node (``levels[m]``, ``indices[m]``) of stream ``rows[m]`` into ``out[m]``, for every
    m (the torch form and the tests draw through this)."""
    for m in range(rows.shape[0]):
        node_noise(key, rows[m], levels[m], indices[m], kind, scale, out[m])


__all__ = ["GAUSSIAN", "LAPLACE", "LEVEL_BITS", "SYMMETRIC", "cached_prefix_noise", "cover",
           "mark_record", "node_code", "node_noise", "node_noise_many", "prefix_noise"]

"""The binary mechanism's noise, compiled: the one implementation behind Fed_UCB's noisy partial sums (Laplace),
CDP-FCLUB's privatiser (symmetric Gaussian matrices) and :class:`~fedrec.privacy.tree.TreeAggregator`.

A stream ``row`` under ``key`` releases prefix sums; the prefix after t records carries the noise of the dyadic
cover of 1..t, one node (l, t >> l) per set bit l of t, node (l, k) holding the records ((k − 1)·2^l, k·2^l]. That
cover is walked in one place, :func:`cover_of` (its torch twin is :func:`fedrec.privacy.tree.cover_nodes`).
Every node draws from a stream of its own,

    substream(substream(key, row), node_code(l, k)),    node_code(l, k) = k·2^6 + l    (:mod:`fedrec.utils.rng`),

drawn in one place, :func:`draw_node`, so its noise is a pure function of (key, row, l, k): regenerated whenever
needed (:func:`prefix_noise`, FCLUB's privatiser) or drawn once and cached with its index per level
(:func:`cached_prefix_noise`, Fed_UCB's O(log T) memory per stream), with the same values. A node's noise of width W
(``kind``):

``LAPLACE``
    W i.i.d. Laplace(0, b): b · draws 0 … W−1 of the node's stream (:func:`fedrec.utils.rng.laplace`).
``GAUSSIAN``
    W i.i.d. N(0, σ²): σ · normals 0 … W−1 (:func:`fedrec.utils.rng.normal`).
``SYMMETRIC``
    a flattened n × n matrix (W = n²) σ(Z + Zᵀ)/√2, Z the normals 0 … W−1 in row-major order (FCLUB Alg. 5 l.3):
    off-diagonal variance σ², diagonal 2σ².
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedrec.utils.jit import jit
from fedrec.utils.rng import NORMAL, fill, laplace, substream

#: node noise kinds (module docstring)
LAPLACE, GAUSSIAN, SYMMETRIC = 0, 1, 2
#: bits of a node code that hold its level (levels < 64)
LEVEL_BITS = 6


#: the longest cover: one node per bit of a non-negative int64
MAX_LEVELS = 63


class NoiseSettings(NamedTuple):
    """How a family of streams noises its cover nodes (scalars only, so a kernel passes it to a helper called per
    record at no cost)."""

    key: np.uint64  #: the family's key: stream ``row`` draws from substream(key, row)
    kind: int  #: ``LAPLACE``, ``GAUSSIAN`` or ``SYMMETRIC`` (module docstring)
    scale: float  #: the Laplace b or the Gaussian σ
    noise_empty: bool  #: noise also the nodes holding no marked record (Fed_UCB's Algorithm 3; its prose: False)


class Cover(NamedTuple):
    """The dyadic cover of records 1..t: the nodes (l, t >> l) for the ``count`` levels l in ``levels``, lowest
    first (:func:`cover_of`; a buffer of at least :data:`MAX_LEVELS` levels). A caller serving many streams at one t
    walks it once."""

    t: int
    levels: np.ndarray
    count: int


@jit(inline=True)
def cover_of(t: int, levels: np.ndarray) -> Cover:
    """The walk of the dyadic cover of records 1..t (0 <= t < 2^63), the one every user of the tree takes: one node
    (l, t >> l) per set bit l of t, lowest level first, written into the buffer ``levels``; popcount(t) nodes."""
    count = 0
    level = 0
    while t >> level:
        if (t >> level) & 1:
            levels[count] = level
            count += 1
        level += 1
    return Cover(t, levels, count)


@jit
def cover(t: int) -> np.ndarray:
    """The dyadic cover of records 1..t as a (popcount(t), 2) array of nodes (level, index), lowest level first
    (:func:`cover_of`)."""
    nodes = cover_of(t, np.empty(MAX_LEVELS, dtype=np.int64))
    out = np.empty((nodes.count, 2), dtype=np.int64)
    for c in range(nodes.count):
        out[c, 0] = nodes.levels[c]
        out[c, 1] = t >> nodes.levels[c]
    return out


@jit
def node_code(level: int, index: int) -> int:
    """The owner number of node (level, index) in its row's stream: index·2^6 + level."""
    return (index << LEVEL_BITS) | level


@jit(inline=True)
def draw_node(noise: NoiseSettings, row: int, level: int, index: int, out: np.ndarray, a: int, b: int) -> None:
    """The one node draw: write the noise of node (``level``, ``index``) of stream ``row`` under ``noise.key`` into
    ``out[a, b]`` (``out``: 3-D, width W; module docstring). It writes in place rather than into a view of ``out``,
    and is compiled into each caller: Fed_UCB draws a node or two per pull."""
    state = substream(substream(noise.key, row), node_code(level, index))
    width, scale = out.shape[2], noise.scale
    if noise.kind == LAPLACE:
        for j in range(width):
            out[a, b, j] = laplace(state, j) * scale
        return
    fill(state, 0, NORMAL, out[a, b])
    if noise.kind == GAUSSIAN:
        for j in range(width):
            out[a, b, j] *= scale
        return
    n = int(np.sqrt(width) + 0.5)
    for i in range(n):  # each entry pair (i, j), (j, i) is read before either is written
        for j in range(i, n):
            v = scale * (out[a, b, i * n + j] + out[a, b, j * n + i]) / np.sqrt(2.0)
            out[a, b, i * n + j] = v
            out[a, b, j * n + i] = v


@jit
def node_noise(key: np.uint64, row: int, level: int, index: int, kind: int, scale: float, out: np.ndarray) -> None:
    """:func:`draw_node` of node (``level``, ``index``) of stream ``row`` under ``key`` into ``out`` (1-D, width W),
    ``scale`` the Laplace b or the Gaussian σ."""
    draw_node(NoiseSettings(key, kind, scale, True), row, level, index, out.reshape((1, 1, out.shape[0])), 0, 0)


@jit
def prefix_noise(key: np.uint64, row: int, t: int, kind: int, scale: float, out: np.ndarray,
                 work: np.ndarray) -> None:
    """Write into ``out`` the noise of the prefix after ``t`` records of stream ``row``: the sum over the cover of
    1..t of the node noises, regenerated from the key, lowest level first (``work``: scratch of ``out``'s size)."""
    out[:] = 0.0
    nodes = cover_of(t, np.empty(MAX_LEVELS, dtype=np.int64))
    for c in range(nodes.count):
        node_noise(key, row, nodes.levels[c], t >> nodes.levels[c], kind, scale, work)
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


@jit(inline=True)
def _noised(noise_empty: bool, last: int, prev: int, index: int) -> bool:
    """Whether a cover node of index ``index`` on its level carries noise: always with ``noise_empty``, else only if
    it is one of the two latest marked nodes ``last``, ``prev`` of that level (:func:`mark_record`). It takes the
    caches' entries, not the caches: an array passed into an inlined helper on a data-dependent branch keeps numba's
    reference counting in every caller's loop."""
    return noise_empty or last == index or prev == index


@jit(inline=True)
def cached_prefix_noise(row: int, cover: Cover, noise: NoiseSettings, last: np.ndarray, prev: np.ndarray,
                        node: np.ndarray, value: np.ndarray, out: np.ndarray) -> None:
    """:func:`prefix_noise` of stream ``row`` after ``cover.t`` records, each node drawn once: the caches hold one
    row per stream, the level-l node's noise in ``value[row, l]`` (streams × levels × W) with its index in
    ``node[row, l]`` (streams × levels). Unless ``noise.noise_empty``, a cover node gets noise only if it holds a
    marked record (Fed_UCB's prose; its Algorithm 3 noises every node). The missing nodes are drawn first, then each
    entry is summed lowest level first in a register (the caches and ``out`` may alias, so summing into ``out``
    would store every term). t must lie at or after the last mark and below 2^levels (unchecked: this runs inside
    the kernels' parallel loops)."""
    for c in range(cover.count):
        level = cover.levels[c]
        m = cover.t >> level
        if node[row, level] != m and _noised(noise.noise_empty, last[row, level], prev[row, level], m):
            draw_node(noise, row, level, m, value, row, level)
            node[row, level] = m
    for j in range(out.shape[0]):
        total = 0.0
        for c in range(cover.count):
            level = cover.levels[c]
            if _noised(noise.noise_empty, last[row, level], prev[row, level], cover.t >> level):
                total += value[row, level, j]
        out[j] = total


@jit
def node_noise_many(key: np.uint64, rows: np.ndarray, levels: np.ndarray, indices: np.ndarray, kind: int,
                    scale: float, out: np.ndarray) -> None:
    """:func:`node_noise` of node (``levels[m]``, ``indices[m]``) of stream ``rows[m]`` into ``out[m]``, for every
    m (the torch form and the tests draw through this)."""
    for m in range(rows.shape[0]):
        node_noise(key, rows[m], levels[m], indices[m], kind, scale, out[m])


__all__ = ["GAUSSIAN", "LAPLACE", "LEVEL_BITS", "MAX_LEVELS", "SYMMETRIC", "Cover", "NoiseSettings",
           "cached_prefix_noise", "cover", "cover_of", "draw_node", "mark_record", "node_code", "node_noise",
           "node_noise_many", "prefix_noise"]

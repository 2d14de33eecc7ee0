"""Communication graphs of decentralised protocols and their randomized-gossip matrices (Zhu et al. 2021).

A :class:`Topology` is a simple, undirected, connected graph on agents 0..N−1, stored in the flat int64 arrays
compiled kernels loop over (edge list, CSR neighbours, degrees) next to its networkx graph. Gossip activates one
uniformly random edge (u, v) per round with W(t) = I − ½(e_u − e_v)(e_u − e_v)ᵀ (Zhu et al. eq. 9/13); the
analysis uses λ₂ of the expected matrix E[W] = I − L_G/(2|E|) (the paper's §3.1).
"""
from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import networkx as nx
import numpy as np

from fedrec.errors import ConfigError, check_choice, check_float, check_int
from fedrec.utils.seeding import numpy_generator


@dataclass(frozen=True, eq=False)
class Topology:
    """A connected simple graph on agents 0..N−1; validated on construction.

    Args:
        kind: which factory built it (``"ring"``, ``"edge_list"``, …), for logs.
        num_agents: N >= 2.
        edges: (E, 2) agent pairs, in any orientation; stored as int64 with u < v, sorted lexicographically.
            Row e of the stored ``edges`` is edge index e of :func:`edge_stream`.
        params: the factory's parameters (e.g. grid rows/cols, the Erdős–Rényi draw used), for logs.

    Derived: ``indptr``/``indices`` (CSR: the neighbours of i are ``indices[indptr[i]:indptr[i+1]]``, ascending),
    ``degrees`` (N,) and ``graph`` (networkx).
    """

    kind: str
    num_agents: int
    edges: np.ndarray = field(repr=False)
    params: Mapping[str, object] = field(default_factory=dict)
    indptr: np.ndarray = field(init=False, repr=False)
    indices: np.ndarray = field(init=False, repr=False)
    degrees: np.ndarray = field(init=False, repr=False)
    graph: nx.Graph = field(init=False, repr=False)

    def __post_init__(self) -> None:
        n = check_int("topology.num_agents", self.num_agents, minimum=2)
        e = np.asarray(self.edges, dtype=np.int64)
        if e.size == 0:
            e = e.reshape(0, 2)
        if e.ndim != 2 or e.shape[1] != 2:
            raise ConfigError(f"topology.edges must be an (E, 2) array of agent pairs, got shape {e.shape}")
        bad = np.flatnonzero((e < 0).any(axis=1) | (e >= n).any(axis=1))
        if bad.size:
            raise ConfigError(f"topology.edges[{bad[0]}] must hold agent ids in [0, {n - 1}], got {e[bad[0]].tolist()}")
        loops = np.flatnonzero(e[:, 0] == e[:, 1])
        if loops.size:
            raise ConfigError(f"topology.edges[{loops[0]}] must join two different agents, got the self loop "
                              f"{e[loops[0]].tolist()}")
        e = np.sort(e, axis=1)
        order = np.lexsort((e[:, 1], e[:, 0]))
        e = e[order]
        repeats = np.flatnonzero((e[1:] == e[:-1]).all(axis=1))
        if repeats.size:
            k = max(order[repeats[0]], order[repeats[0] + 1])
            raise ConfigError(f"topology.edges[{k}] must not repeat an edge (undirected: (u, v) = (v, u)), got "
                              f"{e[repeats[0]].tolist()} again")
        graph = _graph(n, e)
        if not nx.is_connected(graph):
            parts = nx.number_connected_components(graph)
            raise ConfigError(f"topology.edges must form a connected graph on all {n} agents, got {parts} components")
        src = np.concatenate([e[:, 0], e[:, 1]])
        dst = np.concatenate([e[:, 1], e[:, 0]])
        order = np.lexsort((dst, src))
        degrees = np.bincount(src, minlength=n).astype(np.int64)
        set_ = object.__setattr__
        set_(self, "num_agents", n)
        set_(self, "edges", e)
        set_(self, "params", dict(self.params))
        set_(self, "indptr", np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64))
        set_(self, "indices", dst[order])
        set_(self, "degrees", degrees)
        set_(self, "graph", graph)

    @property
    def num_edges(self) -> int:
        """|E|."""
        return len(self.edges)

    def expected_gossip_matrix(self) -> np.ndarray:
        """E[W] = (1/|E|) Σ_(i,j)∈E W_ij = I − L_G/(2|E|) for one uniformly random edge per round (N, N)."""
        n, (u, v) = self.num_agents, self.edges.T
        laplacian = np.diag(self.degrees.astype(np.float64))
        laplacian[u, v] = laplacian[v, u] = -1.0
        return np.eye(n) - laplacian / (2 * self.num_edges)

    @cached_property
    def lambda2(self) -> float:
        """λ₂: second largest eigenvalue of E[W]; < 1 since the graph is connected (enters L, p₀, α₂ only)."""
        return float(np.linalg.eigvalsh(self.expected_gossip_matrix())[-2])


def _graph(num_agents: int, edges: np.ndarray) -> nx.Graph:
    graph = nx.Graph()
    graph.add_nodes_from(range(num_agents))
    graph.add_edges_from(edges.tolist())
    return graph


def gossip_matrix(num_agents: int, u: int, v: int) -> np.ndarray:
    """W(t) = I − ½(e_u − e_v)(e_u − e_v)ᵀ (eq. 9): agents u and v take their mean, the others keep their value."""
    n = check_int("num_agents", num_agents, minimum=2)
    if not (0 <= u < n and 0 <= v < n) or u == v:
        raise ConfigError(f"edge must join two different agents in [0, {n - 1}], got ({u}, {v})")
    w = np.eye(n)
    w[u, u] = w[v, v] = w[u, v] = w[v, u] = 0.5
    return w


def edge_stream(topology: Topology, num_steps: int, seed: int, *indices: int) -> np.ndarray:
    """The gossip edge of each of ``num_steps`` rounds, uniform over E (Zhu et al.), as row indices of ``edges``.

    Returns int64 (num_steps,); ``topology.edges[stream]`` gives the endpoints. Counter based like every stream
    of :mod:`fedrec.utils.seeding`: ``indices`` (e.g. replicate, chunk) select an independent stream, so a chunked or
    resumed run redraws the same edges.
    """
    steps = check_int("num_steps", num_steps, minimum=0)
    rng = numpy_generator(seed, "topology.edge_stream", *indices)
    return rng.integers(0, topology.num_edges, size=steps, dtype=np.int64)


def complete(num_agents: int) -> Topology:
    """K_N: every pair of agents is an edge (K3 = the paper's triangle, λ₂ = 0.5)."""
    n = check_int("topology.num_agents", num_agents, minimum=2)
    return Topology("complete", n, np.column_stack(np.triu_indices(n, 1)))


def ring(num_agents: int) -> Topology:
    """C_N: agent i is joined to i ± 1 mod N; needs N >= 3 (a 2-ring would repeat its edge)."""
    n = check_int("topology.num_agents", num_agents, minimum=3)
    i = np.arange(n)
    return Topology("ring", n, np.column_stack([i, (i + 1) % n]))


def path(num_agents: int) -> Topology:
    """P_N: agent i is joined to i + 1, for i < N − 1."""
    n = check_int("topology.num_agents", num_agents, minimum=2)
    i = np.arange(n - 1)
    return Topology("path", n, np.column_stack([i, i + 1]))


def grid(num_agents: int, rows: int | None = None) -> Topology:
    """rows × cols 2-D lattice (no wrap-around), agent r·cols + c at row r, column c; N = rows · cols.

    ``rows=None`` takes the most nearly square factorisation, rows = the largest divisor of N that is <= √N
    (10 → 2 × 5, 12 → 3 × 4); a prime N then gives the 1 × N path.
    """
    n = check_int("topology.num_agents", num_agents, minimum=2)
    if rows is None:
        rows = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    rows = check_int("topology.rows", rows, minimum=1)
    if n % rows:
        raise ConfigError(f"topology.rows must divide topology.num_agents={n}, got {rows}")
    cols = n // rows
    ids = np.arange(n).reshape(rows, cols)
    right = np.column_stack([ids[:, :-1].ravel(), ids[:, 1:].ravel()])
    down = np.column_stack([ids[:-1, :].ravel(), ids[1:, :].ravel()])
    return Topology("grid", n, np.concatenate([right, down]), {"rows": rows, "cols": cols})


def erdos_renyi(num_agents: int, p: float, seed: int, max_draws: int = 100) -> Topology:
    """G(N, p): each pair is an edge independently with probability p, seeded (a topology of our own, not the paper's).

    A disconnected draw is redrawn from the next derived stream (draw index 1, 2, …); after ``max_draws``
    disconnected draws this raises ConfigError (p is then too small: connectivity needs p ≳ ln N / N). The
    draw used is kept in ``params["draw"]``, so the same (N, p, seed) always gives the same graph.
    """
    n = check_int("topology.num_agents", num_agents, minimum=2)
    p = check_float("topology.p", p, low=0.0, high=1.0, low_open=True)
    seed = check_int("topology.seed", seed, minimum=0)
    max_draws = check_int("topology.max_draws", max_draws, minimum=1)
    pairs = np.column_stack(np.triu_indices(n, 1))
    for draw in range(max_draws):
        edges = pairs[numpy_generator(seed, "topology.erdos_renyi", draw).random(len(pairs)) < p]
        if nx.is_connected(_graph(n, edges)):
            return Topology("erdos_renyi", n, edges, {"p": p, "seed": seed, "draw": draw})
    raise ConfigError(f"topology.p={p} must make G({n}, p) connected, but all topology.max_draws={max_draws} draws "
                      f"(seed {seed}) were disconnected; use p well above ln N / N = {math.log(n) / n:.3g}")


def edge_list(num_agents: int, edges: Iterable[Iterable[int]]) -> Topology:
    """A user-given graph: pairs of agent ids in [0, N), no self loops, no duplicates, connected."""
    n = check_int("topology.num_agents", num_agents, minimum=2)
    rows = []
    for k, pair in enumerate(edges):
        pair = list(pair) if isinstance(pair, Iterable) and not isinstance(pair, str) else [pair]
        if len(pair) != 2:
            raise ConfigError(f"topology.edges[{k}] must be a pair of agent ids, got {pair!r}")
        rows.append([check_int(f"topology.edges[{k}]", x, minimum=0) for x in pair])
    return Topology("edge_list", n, np.array(rows, dtype=np.int64).reshape(-1, 2))


KINDS: dict[str, Callable[..., Topology]] = {
    "complete": complete, "ring": ring, "path": path, "grid": grid, "erdos_renyi": erdos_renyi,
    "edge_list": edge_list,
}


def make_topology(kind: str, num_agents: int, **params: object) -> Topology:
    """Hydra entry point (``conf/topology/*.yaml``): the topology ``kind`` on ``num_agents`` agents.

    Args:
        kind: the graph family, one of ``complete``, ``ring``, ``path``, ``grid``, ``erdos_renyi``, ``edge_list``.
        num_agents: N, the number of agents (the environment's).
        **params: the family's own parameters (``rows`` of a grid, ``p`` and ``seed`` of Erdős–Rényi, ``edges`` of
            an edge list).
    """
    factory = KINDS[check_choice("topology.kind", kind, KINDS)]
    try:
        inspect.signature(factory).bind(num_agents, **params)
    except TypeError:
        allowed = [name for name in inspect.signature(factory).parameters if name != "num_agents"]
        raise ConfigError(f"topology parameters of kind={kind!r} must be among {allowed} (required ones set), "
                          f"got {sorted(params)}") from None
    return factory(num_agents, **params)

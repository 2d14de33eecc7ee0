"""Communication topologies and randomized-gossip matrices against the gossip spec (§1.4, §1.5, §6 tests 1–2)."""
from __future__ import annotations

import math
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from fedrec.errors import ConfigError
from fedrec.federation.topology import (
    KINDS,
    Topology,
    complete,
    edge_list,
    edge_stream,
    erdos_renyi,
    gossip_matrix,
    grid,
    make_topology,
    path,
    ring,
)

CONF = Path(__file__).resolve().parents[1] / "conf" / "topology"


def star(n: int) -> Topology:
    return edge_list(n, [(0, i) for i in range(1, n)])


def explicit_expected_w(topo: Topology) -> np.ndarray:
    """E[W] summed term by term from unit vectors over the networkx graph's edges (independent of the module)."""
    n, eye = topo.num_agents, np.eye(topo.num_agents)
    terms = [np.eye(n) - 0.5 * np.outer(eye[u] - eye[v], eye[u] - eye[v]) for u, v in topo.graph.edges()]
    return np.mean(terms, axis=0)


SAMPLES = {
    "complete5": lambda: complete(5), "ring7": lambda: ring(7), "path6": lambda: path(6), "grid3x4": lambda: grid(12),
    "star8": lambda: star(8), "er15": lambda: erdos_renyi(15, 0.3, seed=3), "path2": lambda: path(2),
}


# ---- §1.5: λ₂ of the candidate graphs, to the precision printed -------------------------------------------------

@pytest.mark.parametrize("build, printed, decimals", [
    (lambda: complete(3), 0.5, None),     # triangle K3 (= ring C3): "0.5 exactly", Fig 2(a),(c)
    (lambda: ring(3), 0.5, None),
    (lambda: path(3), 0.75, 2),
    (lambda: complete(10), 0.8889, 4),
    (lambda: star(10), 0.9444, 4),
    (lambda: ring(10), 0.9809, 4),
    (lambda: grid(10, rows=2), 0.9853, 4),
    (lambda: path(10), 0.9946, 4),
], ids=["K3", "C3", "P3", "K10", "S10", "C10", "grid2x5", "P10"])
def test_lambda2_matches_spec_table(build, printed, decimals):
    lam = build().lambda2
    if decimals is None:
        assert lam == pytest.approx(printed, abs=1e-12)
    else:
        assert round(lam, decimals) == printed


# ---- §6 test 1: the per-round gossip matrix ----------------------------------------------------------------------

@pytest.mark.parametrize("n, u, v", [(2, 0, 1), (3, 2, 0), (10, 4, 7)])
def test_gossip_matrix_is_symmetric_doubly_stochastic_idempotent_pairwise_average(n, u, v):
    w = gossip_matrix(n, u, v)
    np.testing.assert_array_equal(w, w.T)
    np.testing.assert_allclose(w.sum(axis=0), 1.0)
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    np.testing.assert_allclose(w @ w, w, atol=1e-15)
    assert set(np.unique(w)) <= {0.0, 0.5, 1.0}
    x = np.random.default_rng(0).normal(size=n)
    y = w @ x
    assert y[u] == y[v] == pytest.approx((x[u] + x[v]) / 2)
    others = np.setdiff1d(np.arange(n), [u, v])
    np.testing.assert_array_equal(y[others], x[others])
    np.testing.assert_allclose(w, gossip_matrix(n, v, u))


@pytest.mark.parametrize("n, u, v", [(3, 1, 1), (3, 0, 3), (3, -1, 0)])
def test_gossip_matrix_rejects_bad_edges(n, u, v):
    with pytest.raises(ConfigError, match="edge must join two different agents"):
        gossip_matrix(n, u, v)


# ---- §6 test 2: the expected gossip matrix and λ₂ ----------------------------------------------------------------

@pytest.mark.parametrize("name", SAMPLES)
def test_expected_w_is_the_mean_of_w_over_edges(name):
    topo = SAMPLES[name]()
    ew = topo.expected_gossip_matrix()
    mean_w = np.mean([gossip_matrix(topo.num_agents, u, v) for u, v in topo.edges], axis=0)
    np.testing.assert_allclose(ew, mean_w, atol=1e-15)
    np.testing.assert_allclose(ew, explicit_expected_w(topo), atol=1e-15)
    np.testing.assert_array_equal(ew, ew.T)
    np.testing.assert_allclose(ew.sum(axis=1), 1.0)
    vals, vecs = np.linalg.eigh(ew)
    assert vals[0] >= -1e-12  # PSD
    assert vals[-1] == pytest.approx(1.0)
    np.testing.assert_allclose(np.abs(vecs[:, -1]), 1 / math.sqrt(topo.num_agents))  # eigenvector 1
    assert topo.lambda2 < 1.0


@pytest.mark.parametrize("name", SAMPLES)
def test_lambda2_equals_eigvalsh_of_explicit_matrix(name):
    topo = SAMPLES[name]()
    assert topo.lambda2 == pytest.approx(np.linalg.eigvalsh(explicit_expected_w(topo))[-2], abs=1e-12)


@pytest.mark.parametrize("n", [3, 4, 7, 10, 25])
def test_lambda2_closed_forms(n):
    # E[W] = I − L/(2|E|), so λ₂ = 1 − μ₂(L)/(2|E|) with μ₂ the smallest nonzero Laplacian eigenvalue.
    assert complete(n).lambda2 == pytest.approx(1 - n / (n * (n - 1)), abs=1e-12)  # μ₂(K_N) = N
    assert ring(n).lambda2 == pytest.approx(1 - (2 - 2 * math.cos(2 * math.pi / n)) / (2 * n), abs=1e-12)
    assert path(n).lambda2 == pytest.approx(1 - (2 - 2 * math.cos(math.pi / n)) / (2 * (n - 1)), abs=1e-12)
    assert star(n).lambda2 == pytest.approx(1 - 1 / (2 * (n - 1)), abs=1e-12)  # μ₂(S_N) = 1


@pytest.mark.parametrize("rows, cols", [(2, 5), (3, 4), (4, 4), (5, 2)])
def test_grid_lambda2_closed_form(rows, cols):
    # The lattice is P_rows □ P_cols: Laplacian eigenvalues are sums of the two paths' 2 − 2cos(πk/n).
    mu2 = min(2 - 2 * math.cos(math.pi / m) for m in (rows, cols) if m > 1)
    num_edges = rows * (cols - 1) + cols * (rows - 1)
    topo = grid(rows * cols, rows=rows)
    assert topo.num_edges == num_edges
    assert topo.lambda2 == pytest.approx(1 - mu2 / (2 * num_edges), abs=1e-12)


def test_ring_full_spectrum_matches_laplacian_eigenvalues():
    n = 10
    expected = np.sort(1 - (2 - 2 * np.cos(2 * np.pi * np.arange(n) / n)) / (2 * n))
    np.testing.assert_allclose(np.linalg.eigvalsh(ring(n).expected_gossip_matrix()), expected, atol=1e-12)


# ---- kernel-facing arrays ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", SAMPLES)
def test_edges_csr_degrees_and_graph_agree(name):
    topo = SAMPLES[name]()
    n, e = topo.num_agents, topo.edges
    assert e.dtype == np.int64 and e.shape == (topo.num_edges, 2)
    assert (e[:, 0] < e[:, 1]).all()
    assert [tuple(r) for r in e] == sorted({tuple(r) for r in e})  # sorted, no duplicates
    assert topo.indptr.dtype == topo.indices.dtype == topo.degrees.dtype == np.int64
    assert topo.indptr.shape == (n + 1,) and topo.indptr[0] == 0 and topo.indptr[-1] == 2 * topo.num_edges
    np.testing.assert_array_equal(np.diff(topo.indptr), topo.degrees)
    assert sorted(topo.graph.nodes) == list(range(n)) and topo.graph.number_of_edges() == topo.num_edges
    for i in range(n):
        neighbours = topo.indices[topo.indptr[i]:topo.indptr[i + 1]]
        assert neighbours.tolist() == sorted(topo.graph.neighbors(i))
        assert topo.degrees[i] == topo.graph.degree(i)


@pytest.mark.parametrize("n", [2, 3, 6])
def test_edge_counts_per_kind(n):
    assert complete(n).num_edges == n * (n - 1) // 2
    assert path(n).num_edges == n - 1
    if n >= 3:
        assert ring(n).num_edges == n
        assert (ring(n).degrees == 2).all()


def test_grid_factorisation_and_row_major_numbering():
    assert grid(10).params == {"rows": 2, "cols": 5}
    assert grid(12).params == {"rows": 3, "cols": 4}
    assert grid(16).params == {"rows": 4, "cols": 4}
    np.testing.assert_array_equal(grid(7).edges, path(7).edges)  # prime N: the 1 × N path
    g = grid(10, rows=2)  # agent r*5 + c at (r, c)
    assert {(0, 1), (0, 5), (4, 9), (8, 9)} <= {tuple(r) for r in g.edges}
    assert (3, 4) in {tuple(r) for r in g.edges} and (4, 5) not in {tuple(r) for r in g.edges}  # no wrap
    assert nx.is_isomorphic(g.graph, nx.grid_2d_graph(2, 5))
    assert grid(10, rows=5).lambda2 == pytest.approx(g.lambda2)
    with pytest.raises(ConfigError, match="topology.rows must divide topology.num_agents=10"):
        grid(10, rows=3)


# ---- Erdős–Rényi -------------------------------------------------------------------------------------------------

def test_erdos_renyi_is_seeded_and_connected():
    a, b = erdos_renyi(20, 0.25, seed=7), erdos_renyi(20, 0.25, seed=7)
    np.testing.assert_array_equal(a.edges, b.edges)
    assert a.params["p"] == 0.25 and a.params["seed"] == 7
    assert not np.array_equal(a.edges, erdos_renyi(20, 0.25, seed=8).edges)
    np.testing.assert_array_equal(erdos_renyi(6, 1.0, seed=0).edges, complete(6).edges)
    draws = [erdos_renyi(10, 0.2, seed=s) for s in range(40)]
    assert all(nx.is_connected(t.graph) for t in draws)
    assert any(t.params["draw"] > 0 for t in draws)  # some first draws were disconnected and redrawn


def test_erdos_renyi_edge_density():
    n, p = 20, 0.5
    counts = [erdos_renyi(n, p, seed=s).num_edges for s in range(200)]
    assert np.mean(counts) == pytest.approx(p * n * (n - 1) / 2, abs=3.0)  # 4σ of the mean ≈ 2


def test_erdos_renyi_refuses_when_every_draw_is_disconnected():
    with pytest.raises(ConfigError, match=r"topology.p=0.01 must make G\(10, p\) connected.*max_draws=3"):
        erdos_renyi(10, 0.01, seed=0, max_draws=3)


@pytest.mark.parametrize("p", [0.0, -0.2, 1.5, float("nan"), "x"])
def test_erdos_renyi_rejects_p_outside_unit_interval(p):
    with pytest.raises(ConfigError, match="topology.p must"):
        erdos_renyi(10, p, seed=0)


# ---- user edge lists ---------------------------------------------------------------------------------------------

def test_edge_list_normalises_orientation_and_order():
    topo = edge_list(4, [(3, 1), [2, 0], (1, 0)])
    assert topo.edges.tolist() == [[0, 1], [0, 2], [1, 3]]
    assert topo.kind == "edge_list"


@pytest.mark.parametrize("edges, message", [
    ([(0, 1), (1, 4)], r"topology.edges\[1\] must hold agent ids in \[0, 3\]"),
    ([(0, 1), (-1, 2)], r"topology.edges\[1\] must be an integer >= 0"),
    ([(0, 1), (1, 2), (2, 2), (2, 3)], r"topology.edges\[2\] must join two different agents"),
    ([(0, 1), (1, 2), (2, 3), (2, 1)], r"topology.edges\[3\] must not repeat an edge"),
    ([(0, 1), (1, 2), (0, 1), (2, 3)], r"topology.edges\[2\] must not repeat an edge"),
    ([(0, 1), (2, 3)], "topology.edges must form a connected graph on all 4 agents, got 2 components"),
    ([(0, 1), (1, 2)], "connected graph on all 4 agents"),  # agent 3 isolated
    ([], "connected graph"),
    ([(0, 1, 2)], r"topology.edges\[0\] must be a pair"),
    ([(0, 1), 5], r"topology.edges\[1\] must be a pair"),
    (["01"], r"topology.edges\[0\] must be a pair"),
    ([(0, "a")], r"topology.edges\[0\] must be an integer"),
    ([(0, 1.5)], r"topology.edges\[0\] must be an integer"),
])
def test_edge_list_rejects_bad_input(edges, message):
    with pytest.raises(ConfigError, match=message):
        edge_list(4, edges)


# ---- make_topology and the Hydra configs -------------------------------------------------------------------------

def test_make_topology_dispatches_every_kind():
    params = {"erdos_renyi": {"p": 0.5, "seed": 1}, "edge_list": {"edges": [(0, i) for i in range(1, 6)]}}
    for kind in KINDS:
        topo = make_topology(kind, 6, **params.get(kind, {}))
        assert topo.kind == kind and topo.num_agents == 6


@pytest.mark.parametrize("kind", list(KINDS))
def test_fewer_than_two_agents_rejected(kind):
    params = {"erdos_renyi": {"p": 0.5, "seed": 1}, "edge_list": {"edges": []}}.get(kind, {})
    with pytest.raises(ConfigError, match="topology.num_agents must be an integer >= "):
        make_topology(kind, 1, **params)


def test_ring_needs_three_agents():
    with pytest.raises(ConfigError, match="topology.num_agents must be an integer >= 3"):
        ring(2)


def test_make_topology_rejects_unknown_kind_and_parameters():
    with pytest.raises(ConfigError, match=r"topology.kind must be one of \['complete', 'ring'"):
        make_topology("torus", 10)
    with pytest.raises(ConfigError, match=r"kind='ring' must be among \[\]"):
        make_topology("ring", 10, p=0.5)
    with pytest.raises(ConfigError, match=r"kind='erdos_renyi' must be among \['p', 'seed', 'max_draws'\]"):
        make_topology("erdos_renyi", 10, p=0.5)  # seed is required


@pytest.mark.parametrize("kind, agents, lam2", [
    ("complete", 3, 0.5), ("ring", 10, 0.9809), ("path", 10, 0.9946), ("grid", 10, 0.9853),
    ("erdos_renyi", 10, None), ("edge_list", 10, 0.9444),
])
def test_conf_files_instantiate(kind, agents, lam2):
    cfg = OmegaConf.create({"seed": 0, "env": {"num_agents": agents},
                            "topology": OmegaConf.load(CONF / f"{kind}.yaml")})
    assert cfg.topology._target_ == "fedrec.federation.topology.make_topology"
    topo = instantiate(cfg.topology)
    assert isinstance(topo, Topology) and topo.kind == kind
    if lam2 is not None:
        assert round(topo.lambda2, 4) == lam2


# ---- the random edge stream --------------------------------------------------------------------------------------

def test_edge_stream_is_seeded_counter_based_and_uniform():
    topo = ring(10)
    s = edge_stream(topo, 200_000, 0, 3)
    assert s.dtype == np.int64 and s.shape == (200_000,) and s.min() >= 0 and s.max() < topo.num_edges
    np.testing.assert_array_equal(s, edge_stream(topo, 200_000, 0, 3))
    assert not np.array_equal(s[:100], edge_stream(topo, 100, 0, 4))
    assert not np.array_equal(s[:100], edge_stream(topo, 100, 1, 3))
    np.testing.assert_array_equal(edge_stream(topo, 100, 0, 3), s[:100])  # a prefix of the same stream
    freq = np.bincount(s, minlength=topo.num_edges) / len(s)
    np.testing.assert_allclose(freq, 1 / topo.num_edges, atol=0.004)  # σ ≈ 0.0007
    assert edge_stream(topo, 0, 0).shape == (0,)


def test_gossip_along_the_stream_preserves_the_mean_and_reaches_consensus():
    topo = grid(12)
    x = np.random.default_rng(1).normal(size=topo.num_agents)
    mean = x.mean()
    for u, v in topo.edges[edge_stream(topo, 3000, 5)]:
        x[u] = x[v] = (x[u] + x[v]) / 2
    assert x.mean() == pytest.approx(mean, abs=1e-12)
    assert np.ptp(x) < 1e-6

"""The one binary mechanism (fedrec.privacy.tree_noise, compiled, and its torch form in fedrec.privacy.tree) against
direct constructions: the cover from the set bits of t, every node drawn from its own nested stream, regenerated
prefixes as sums of those nodes, the per-level cache drawing each node once, the variance of each node kind, the
tree's ε from its accountant, the torch form equal to the compiled one, and bad arguments."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fedrec.errors import ConfigError
from fedrec.privacy import Node, TreeAggregator, cached_noise, dyadic_cover, mark_records
from fedrec.privacy.tree_noise import (
    GAUSSIAN,
    LAPLACE,
    MAX_LEVELS,
    SYMMETRIC,
    NoiseSettings,
    cached_prefix_noise,
    cover,
    cover_of,
    mark_record,
    node_noise,
    node_noise_many,
    prefix_noise,
)
from fedrec.utils.rng import laplace, normal, substream

KEY = np.uint64(0x5EED_0F_7EE5)
KINDS = [(LAPLACE, 1), (LAPLACE, 3), (GAUSSIAN, 5), (SYMMETRIC, 9), (SYMMETRIC, 16)]


def direct_cover(t: int) -> list[tuple[int, int]]:
    """The dyadic nodes covering 1..t, lowest level first: node (l, t >> l) for every set bit l of t."""
    return [(level, t >> level) for level in range(64) if (t >> level) & 1]


def cached(key: np.uint64, row: int, t: int, kind: int, scale: float, noise_empty: bool, last: np.ndarray,
           prev: np.ndarray, node: np.ndarray, value: np.ndarray, out: np.ndarray) -> None:
    """The compiled cached prefix noise of stream ``row`` after ``t`` records, its cover walked here."""
    cover_t = cover_of(t, np.empty(MAX_LEVELS, dtype=np.int64))
    cached_prefix_noise(row, cover_t, NoiseSettings(key, kind, scale, noise_empty), last, prev, node, value, out)


def direct_node(key: np.uint64, row: int, level: int, index: int, kind: int, scale: float, width: int) -> np.ndarray:
    """A node's noise built entry by entry from the scalar draws of the stream substream(substream(key, row),
    index·64 + level)."""
    state = np.uint64(substream(np.uint64(substream(key, row)), index * 64 + level))
    if kind == LAPLACE:
        return np.array([scale * laplace(state, c) for c in range(width)])
    z = np.array([normal(state, c) for c in range(width)])
    if kind == GAUSSIAN:
        return scale * z
    n = math.isqrt(width)
    z = z.reshape(n, n)
    return np.array([[scale * (z[i, j] + z[j, i]) / math.sqrt(2.0) for j in range(n)] for i in range(n)]).ravel()


# ---- cover and node draws --------------------------------------------------------------------------------------


@settings(deadline=None)  # the first example compiles cover()
@given(st.integers(0, 2 ** 62))
def test_cover_is_the_set_bits_of_t_and_agrees_with_dyadic_cover(t: int) -> None:
    nodes = [tuple(n) for n in cover(t).tolist()]
    assert nodes == direct_cover(t) == [tuple(n) for n in dyadic_cover(t)]
    assert sum(2 ** level for level, _ in nodes) == t  # disjoint blocks of 2^l records ending at t
    assert all(Node(level, index).end <= t for level, index in nodes)


def test_small_covers_partition_one_to_t() -> None:
    for t in range(0, 300):
        records = sorted(r for level, index in cover(t).tolist()
                         for r in range(Node(level, index).start + 1, Node(level, index).end + 1))
        assert records == list(range(1, t + 1))


@pytest.mark.parametrize("kind,width", KINDS)
def test_a_node_is_drawn_from_its_own_nested_stream(kind: int, width: int) -> None:
    for row, level, index, scale in ((0, 0, 1, 1.0), (17, 3, 5, 2.5), (2 ** 40, 20, 3, 0.3)):
        out = np.empty(width)
        node_noise(KEY, row, level, index, kind, scale, out)
        assert out.tolist() == direct_node(KEY, row, level, index, kind, scale, width).tolist()
    many = np.empty((3, width))
    node_noise_many(KEY, np.array([4, 4, 9]), np.array([0, 2, 0]), np.array([3, 1, 3]), kind, 1.5, many)
    for m, (row, level, index) in enumerate(((4, 0, 3), (4, 2, 1), (9, 0, 3))):
        assert many[m].tolist() == direct_node(KEY, row, level, index, kind, 1.5, width).tolist()
    assert len({tuple(x) for x in many}) == 3  # other row or other node: other noise


def test_symmetric_nodes_are_symmetric() -> None:
    out = np.empty(16)
    node_noise(KEY, 3, 1, 1, SYMMETRIC, 1.0, out)
    m = out.reshape(4, 4)
    assert np.array_equal(m, m.T) and len(set(m[np.triu_indices(4)].tolist())) == 10


@settings(max_examples=40, deadline=None)
@given(t=st.integers(0, 5000), row=st.integers(0, 10 ** 6), which=st.sampled_from(KINDS))
def test_prefix_noise_is_the_sum_of_its_cover_nodes_drawn_directly(t: int, row: int, which: tuple[int, int]) -> None:
    kind, width = which
    out, work = np.empty(width), np.empty(width)
    prefix_noise(KEY, row, t, kind, 0.7, out, work)
    want = np.zeros(width)
    for level, index in direct_cover(t):  # lowest level first, as the mechanism adds them
        want = want + direct_node(KEY, row, level, index, kind, 0.7, width)
    assert out.tolist() == want.tolist()


# ---- the per-level cache ----------------------------------------------------------------------------------------


def run_cache(present: list[bool], kind: int, width: int, noise_empty: bool, row: int = 5, levels: int = 7):
    """Play stream ``row`` whose record t is present or not through the compiled cache (one row per stream),
    querying the prefix after every record; return the prefixes, every (level, index) the cache drew (in order)
    and the row's final cache."""
    last, prev, node = (np.zeros((row + 1, levels), dtype=np.int64) for _ in range(3))
    value, out = np.zeros((row + 1, levels, width)), np.empty(width)
    prefixes, drawn = [], []
    for t, p in enumerate(present, start=1):
        if p:
            mark_record(row, t, last, prev)
        before = node[row].copy()
        cached(KEY, row, t, kind, 1.3, noise_empty, last, prev, node, value, out)
        drawn += [(level, int(node[row, level])) for level in range(levels) if node[row, level] != before[level]]
        prefixes.append(out.copy())
    assert not (node[:row].any() or value[:row].any())  # other streams' rows stay untouched
    return prefixes, drawn, (last[row], prev[row], node[row], value[row])


@settings(max_examples=40, deadline=None)
@given(present=st.lists(st.booleans(), min_size=1, max_size=100), noise_empty=st.booleans(),
       which=st.sampled_from(KINDS))
def test_the_cache_draws_each_node_once_and_equals_the_regenerated_noise(present: list[bool], noise_empty: bool,
                                                                          which: tuple[int, int]) -> None:
    """Cache identity: each node enters the cache at most once, the cached value is the node's own noise, and each
    prefix is the sum over its cover of the nodes that hold a present record (all of them with noise_empty)."""
    kind, width = which
    prefixes, drawn, (_, _, node, value) = run_cache(present, kind, width, noise_empty)
    assert len(drawn) == len(set(drawn))
    for level in range(len(node)):
        if node[level]:
            assert value[level].tolist() == direct_node(KEY, 5, level, int(node[level]), kind, 1.3, width).tolist()
    times = [t for t, p in enumerate(present, start=1) if p]
    for t, got in enumerate(prefixes, start=1):
        want = np.zeros(width)
        for level, index in direct_cover(t):
            block = Node(level, index)
            if noise_empty or any(block.start < s <= block.end for s in times):
                want = want + direct_node(KEY, 5, level, index, kind, 1.3, width)
        assert got.tolist() == want.tolist()
    if noise_empty:  # then the cache is the regenerated prefix
        out, work = np.empty(width), np.empty(width)
        prefix_noise(KEY, 5, len(present), kind, 1.3, out, work)
        assert prefixes[-1].tolist() == out.tolist()


@settings(max_examples=30, deadline=None)
@given(schedule=st.lists(st.lists(st.booleans(), min_size=4, max_size=4), min_size=1, max_size=60),
       noise_empty=st.booleans(), which=st.sampled_from([(LAPLACE, 1), (GAUSSIAN, 3), (SYMMETRIC, 4)]))
def test_torch_form_equals_compiled_form(schedule: list[list[bool]], noise_empty: bool,
                                         which: tuple[int, int]) -> None:
    """TreeAggregator (the torch form, all rows batched) against the compiled cache run row by row: the same
    prefix noise to the bit and the same cache."""
    kind, width = which
    shape, mechanism = {LAPLACE: ((), "laplace"), GAUSSIAN: ((3,), "gaussian"), SYMMETRIC: ((2, 2), "gaussian")}[kind]
    tree = TreeAggregator(shape, 64, sensitivity=1.0, mechanism=mechanism, scale=1.3, num_rows=4, seed=9,
                          symmetric=kind == SYMMETRIC, noise_empty_nodes=noise_empty)
    levels = tree.levels
    last, prev, node = (np.zeros((4, levels), dtype=np.int64) for _ in range(3))
    value, out = np.zeros((4, levels, width)), np.empty(width)
    for present in schedule:
        got = tree.add(None, torch.zeros(4, *shape), present=torch.tensor(present))
        for row in range(4):
            if present[row]:
                mark_record(row, int(tree.count[row]), last, prev)
            cached(np.uint64(tree.key), row, int(tree.count[row]), kind, 1.3, noise_empty, last, prev, node, value,
                   out)
            assert got[row].flatten().tolist() == out.tolist()
    assert tree.node_last.tolist() == last.tolist() and tree.node_prev.tolist() == prev.tolist()
    assert tree.node_index.tolist() == node.tolist() and tree.node_value.tolist() == value.tolist()


def test_torch_mark_and_cache_functions_equal_the_compiled_ones_on_shared_times() -> None:
    """mark_records / cached_noise on some streams at one time (Fed_UCB's torch path) equal the compiled functions
    stream by stream, caches included."""
    gen = np.random.default_rng(3)
    streams, levels = 12, 5
    last, prev, node = (torch.zeros(streams, levels, dtype=torch.long) for _ in range(3))
    value = torch.zeros(streams, levels, 1, dtype=torch.float64)
    c_last, c_prev, c_node = (np.zeros((streams, levels), dtype=np.int64) for _ in range(3))
    c_value, out = np.zeros((streams, levels, 1)), np.empty(1)
    for t in range(1, 31):
        rows = torch.from_numpy(np.flatnonzero(gen.random(streams) < 0.4))
        times = torch.full((len(rows),), t)
        mark_records(rows, times, last, prev)
        noise = cached_noise(KEY, rows, times, LAPLACE, 2.0, False, last, prev, node, value)
        for m, row in enumerate(rows.tolist()):
            mark_record(row, t, c_last, c_prev)
            cached(KEY, row, t, LAPLACE, 2.0, False, c_last, c_prev, c_node, c_value, out)
            assert float(noise[m, 0]) == float(out[0])
    assert last.tolist() == c_last.tolist() and prev.tolist() == c_prev.tolist() and node.tolist() == c_node.tolist()
    assert value.tolist() == c_value.tolist() and bool(value.any())


# ---- variance per node ------------------------------------------------------------------------------------------


def _second_moments(kind: int, width: int, scale: float, n: int) -> np.ndarray:
    """n node noises (width entries each) over n different (key, row, node) streams: (n, width)."""
    gen = np.random.default_rng(kind * 100 + width)
    out = np.empty((n, width))
    for key in range(4):  # four keys, n/4 rows and random nodes each
        part = slice(key * n // 4, (key + 1) * n // 4)
        m = part.stop - part.start
        node_noise_many(np.uint64(0x9E37 * (key + 1)), np.arange(m), gen.integers(0, 20, m),
                        gen.integers(1, 10 ** 6, m), kind, scale, out[part])
    return out


def test_laplace_nodes_have_variance_2b2() -> None:
    """Mean of X² over n = 40,000 i.i.d. Laplace(0, b) entries: E = 2b², sd = sqrt(20/n)·b² (E X⁴ = 24b⁴); two-sided
    at z = 4.42 (confidence 1 − 1e-5), and a KS test at 1e-4."""
    b, n = 1.7, 40_000
    x = _second_moments(LAPLACE, 1, b, n).ravel()
    assert abs((x ** 2).mean() - 2 * b * b) < 4.42 * math.sqrt(20 / n) * b * b
    assert stats.kstest(x, stats.laplace(scale=b).cdf).pvalue > 1e-4


def test_gaussian_nodes_have_variance_sigma2() -> None:
    """Σ X²/σ² over n = 40,000 i.i.d. N(0, σ²) entries is χ²_n: inside its 1e-5 / 1 − 1e-5 quantiles."""
    sigma, n = 0.8, 40_000
    x = _second_moments(GAUSSIAN, 4, sigma, n // 4).ravel()
    lo, hi = stats.chi2.ppf([1e-5, 1 - 1e-5], n)
    assert lo < (x ** 2).sum() / sigma ** 2 < hi
    assert stats.kstest(x / sigma, "norm").pvalue > 1e-4


def test_symmetric_nodes_have_off_diagonal_variance_sigma2_and_diagonal_2sigma2() -> None:
    """Per entry of a 3 × 3 symmetric node over n = 12,000 nodes, Σ X²/v is χ²_n (v = σ² off the diagonal, 2σ² on
    it): inside the 1e-5 / 1 − 1e-5 quantiles (Bonferroni over the 6 distinct entries: confidence > 1 − 1.2e-4)."""
    sigma, n = 1.9, 12_000
    x = _second_moments(SYMMETRIC, 9, sigma, n).reshape(n, 3, 3)
    lo, hi = stats.chi2.ppf([1e-5, 1 - 1e-5], n)
    for i, j in zip(*np.triu_indices(3)):
        v = (2.0 if i == j else 1.0) * sigma ** 2
        assert lo < (x[:, i, j] ** 2).sum() / v < hi, (i, j)
    assert abs(np.corrcoef(x[:, 0, 1], x[:, 1, 2])[0, 1]) < 4.42 / math.sqrt(n)  # distinct entries uncorrelated


# ---- ε from the accountant ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("horizon", [1, 7, 8, 1000, 2 ** 17])
def test_laplace_tree_epsilon_is_levels_times_node_epsilon(horizon: int) -> None:
    levels = horizon.bit_length()  # ⌊log₂ T⌋ + 1 nodes per record
    tree = TreeAggregator((), horizon, sensitivity=0.5, mechanism="laplace", scale=2.0)
    assert tree.epsilon() == pytest.approx(levels * 0.5 / 2.0, rel=1e-12)


def _exact_gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact ε at δ of a μ-GDP mechanism (Dong, Roth & Su 2022, Cor. 2.13), by bisection."""
    def excess(eps: float) -> float:
        return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta
    lo, hi = 0.0, 1.0
    while excess(hi) > 0:
        hi *= 2
    for _ in range(200):
        lo, hi = (lo, (lo + hi) / 2) if excess((lo + hi) / 2) <= 0 else ((lo + hi) / 2, hi)
    return hi


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("horizon,sigma,delta", [(100, 5.0, 1e-5), (2 ** 17, 30.0, 1e-6), (1, 0.8, 0.1)])
def test_gaussian_tree_epsilon_is_the_rdp_of_its_nodes(symmetric: bool, horizon: int, sigma: float,
                                                       delta: float) -> None:
    """The accountant's RDP is levels · Δ_eff²/(2σ²) (Δ_eff = Δ/√2 for symmetric nodes), its ε lies at or above the
    exact ε of the composed Gaussian (levels nodes of z = σ/Δ_eff are √levels/z-GDP) and at or below the classical
    ρ + 2·sqrt(ρ log(1/δ))."""
    shape, sens = ((3, 3), 2.0) if symmetric else ((3,), 2.0)
    tree = TreeAggregator(shape, horizon, sensitivity=sens, scale=sigma, symmetric=symmetric, delta=delta)
    levels = horizon.bit_length()
    z = sigma / (sens / math.sqrt(2) if symmetric else sens)
    rho = levels / (2 * z * z)
    assert tree.accountant().rho == pytest.approx(rho, rel=1e-12)
    eps = tree.epsilon()
    assert _exact_gaussian_epsilon(math.sqrt(levels) / z, delta) * (1 - 1e-9) <= eps
    assert eps <= rho + 2 * math.sqrt(rho * math.log(1 / delta))


# ---- bad arguments ----------------------------------------------------------------------------------------------


def test_bad_arguments_are_one_line_errors() -> None:
    last, prev, node = (torch.zeros(1, 3, dtype=torch.long) for _ in range(3))
    value = torch.zeros(1, 3, 1, dtype=torch.float64)
    tree = TreeAggregator((), 3, sensitivity=1.0, mechanism="laplace", scale=1.0)
    for _ in range(3):
        tree.add([0], torch.zeros(1))
    calls = [  # (call, error, message): levels or horizon exceeded, non-positive scale, a non-square symmetric node
        (lambda: cached_noise(KEY, torch.tensor([0]), torch.tensor([8]), LAPLACE, 1.0, True, last, prev, node, value),
         ConfigError, r"t must lie in \[0, 8\) for a cache of 3 levels"),
        (lambda: cached_noise(KEY, torch.tensor([0]), torch.tensor([1]), LAPLACE, 0.0, True, last, prev, node, value),
         ConfigError, "scale"),
        (lambda: cached_noise(KEY, torch.tensor([0]), torch.tensor([1]), LAPLACE, -1.0, True, last, prev, node,
                              value), ConfigError, "scale"),
        (lambda: TreeAggregator((), 8, sensitivity=1.0, mechanism="laplace", scale=0.0), ConfigError, "scale"),
        (lambda: TreeAggregator((), 8, sensitivity=1.0, mechanism="laplace", scale=-2.0), ConfigError, "scale"),
        (lambda: tree.add([0], torch.zeros(1)), ValueError, "horizon=3"),
        (lambda: TreeAggregator((2, 3), 8, sensitivity=1.0, scale=1.0, symmetric=True), ConfigError, "square shape"),
    ]
    for call, error, message in calls:
        with pytest.raises(error, match=message) as caught:
            call()
        assert "\n" not in str(caught.value)

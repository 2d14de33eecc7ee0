"""Tree-based aggregation (binary mechanism): dyadic covers, noise scale, exact prefix noise, accounting, resume."""
from __future__ import annotations

import io
import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from fedrec.errors import ConfigError
from fedrec.privacy import (
    Accountant,
    GaussianRDPAccountant,
    LaplaceBasicAccountant,
    Node,
    TreeAggregator,
    TreeLaplace,
    augmented_gram,
    dyadic_cover,
    fclub_node_sigma,
    gaussian_node_sigma,
    gaussian_rdp_epsilon,
    gaussian_rdp_rho,
    laplace_node_scale,
    make_accountant,
    nodes_touched,
    register_accountant,
    split_augmented,
)


def _intervals(t: int) -> list[tuple[int, int]]:
    """Reference dyadic decomposition of records 1..t (spec gossip.md §2.5): clear the lowest set bit repeatedly."""
    out, tp = [], t
    while tp:
        q = tp & (tp - 1)
        out.append((q, tp))
        tp = q
    return out


def _node(q: int, e: int) -> Node:
    level = int(math.log2(e - q))
    assert (e - q) == 2 ** level
    return Node(level, e // 2 ** level)


def _conversion(rho: float, delta: float, alphas: np.ndarray) -> float:
    """Balle et al. 2020 RDP → (ε, δ) of the curve α ↦ ρα, minimised over a grid of orders."""
    eps = rho * alphas + np.log((alphas - 1) / alphas) - (np.log(delta) + np.log(alphas)) / (alphas - 1)
    return max(float(eps.min()), 0.0)


ALPHAS = 1.0 + np.geomspace(1e-6, 1e7, 400_000)


# ---- dyadic covers --------------------------------------------------------------------------------------------


@given(st.integers(1, 2 ** 40))
def test_cover_is_a_disjoint_dyadic_partition_with_popcount_nodes(t):
    nodes = dyadic_cover(t)
    assert len(nodes) == t.bit_count()
    assert [(n.start, n.end) for n in nodes] == _intervals(t)  # lowest level first, like the reference
    spans = sorted((n.start, n.end) for n in nodes)
    assert spans[0][0] == 0 and spans[-1][1] == t
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # disjoint and contiguous
    for n in nodes:
        assert n.end - n.start == 2 ** n.level and n.start % 2 ** (n.level + 1) == 0 and n.index % 2 == 1


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 400))
def test_each_record_touches_the_nodes_the_covers_predict(horizon):
    used = {iv for t in range(1, horizon + 1) for iv in _intervals(t)}
    most = 0
    for tau in range(1, horizon + 1):
        expected = sorted(_node(q, e) for q, e in used if q < tau <= e)
        got = nodes_touched(tau, horizon)
        assert sorted(got) == expected
        assert len({n.level for n in got}) == len(got)  # at most one node per level
        most = max(most, len(got))
    assert most == math.floor(math.log2(horizon)) + 1 == len(nodes_touched(1, horizon))


# ---- noise at the calibrated scale ----------------------------------------------------------------------------


def test_gaussian_noise_has_the_calibrated_std_and_grows_with_the_cover():
    tree = TreeAggregator((4,), 64, sensitivity=1.0, epsilon=2.0, delta=1e-5, num_rows=6000, seed=3)
    sigma = tree.scale
    assert sigma == gaussian_node_sigma(2.0, 1e-5, 64, 1.0)
    noise = tree.add(None, torch.zeros(6000, 4)).flatten().numpy()  # t = 1: one node
    assert noise.std() == pytest.approx(sigma, rel=0.03)
    assert abs(noise.mean()) < 0.03 * sigma
    assert stats.kstest(noise / sigma, "norm").pvalue > 1e-3
    for _ in range(6):
        out = tree.add(None, torch.zeros(6000, 4))
    assert out.std().item() == pytest.approx(sigma * math.sqrt(3), rel=0.03)  # t = 7 = 0b111: three nodes
    assert bool((out != 0).all())  # a private release never comes out clean


def test_laplace_noise_has_std_b_sqrt2():
    tree = TreeAggregator((2,), 1000, sensitivity=1.0, mechanism="laplace", epsilon=1.0, num_rows=10000, seed=5)
    b = tree.scale
    assert b == pytest.approx(math.ceil(math.log2(1000)) / 1.0)  # b = Δ/ε', ε' = ε/⌈log₂ T⌉ (Fed_UCB Alg. 3)
    noise = tree.add(None, torch.zeros(10000, 2)).flatten().numpy()
    assert noise.std() == pytest.approx(b * math.sqrt(2), rel=0.03)
    assert stats.kstest(noise, "laplace", args=(0.0, b)).pvalue > 1e-3


def test_symmetric_noise_is_symmetric_with_off_diagonal_var_sigma2_and_diagonal_2sigma2():
    sigma = 1.5
    tree = TreeAggregator((5, 5), 16, sensitivity=2.0, scale=sigma, symmetric=True, num_rows=8000, seed=7)
    noise = tree.add(None, torch.zeros(8000, 5, 5))
    assert torch.equal(noise, noise.mT)
    iu = torch.triu_indices(5, 5, offset=1)
    off = noise[:, iu[0], iu[1]]
    diag = noise.diagonal(dim1=1, dim2=2)
    assert off.var().item() == pytest.approx(sigma ** 2, rel=0.04)
    assert diag.var().item() == pytest.approx(2 * sigma ** 2, rel=0.04)
    corr = np.corrcoef(off[:, 0].numpy(), off[:, 1].numpy())[0, 1]
    assert abs(corr) < 0.05


def test_a_private_tree_cannot_be_built_without_noise():
    with pytest.raises(ConfigError, match="scale"):
        TreeAggregator((3,), 10, sensitivity=1.0)
    with pytest.raises(ConfigError, match="scale"):
        TreeAggregator((3,), 10, sensitivity=1.0, scale=0.0)
    with pytest.raises(ConfigError, match="scale"):
        TreeAggregator((3,), 10, sensitivity=1.0, scale=1.0, epsilon=1.0, delta=1e-5)


# ---- a prefix is the clean sum plus exactly the noise of its cover nodes -----------------------------------------


CONFIGS = [
    {"shape": (3,), "mechanism": "gaussian", "scale": 0.7},
    {"shape": (3, 3), "mechanism": "gaussian", "scale": 0.7, "symmetric": True},
    {"shape": (), "mechanism": "laplace", "scale": 2.0},
]


@settings(max_examples=30, deadline=None)
@given(config=st.sampled_from(CONFIGS), schedule=st.lists(st.sets(st.integers(0, 3), min_size=1), max_size=20),
       seed=st.integers(0, 2 ** 31))
def test_prefix_is_clean_sum_plus_the_noise_of_the_cover_nodes(config, schedule, seed):
    tree = TreeAggregator(horizon=32, sensitivity=1.0, num_rows=4, seed=seed, **config)
    shape = tree.shape
    gen = torch.Generator().manual_seed(seed)
    clean = torch.zeros(4, *shape, dtype=torch.float64)
    counts = [0] * 4
    for rows in schedule:
        rows = sorted(rows)
        values = torch.rand(len(rows), *shape, generator=gen, dtype=torch.float64)
        if tree.symmetric:
            values = values + values.mT
        out = tree.add(rows, values)
        for i, r in enumerate(rows):
            counts[r] += 1
            clean[r] += values[i]
        assert torch.allclose(out, tree.prefix(rows))
    for r in range(4):
        expected = clean[r].clone()
        for q, e in _intervals(counts[r]):  # popcount(t) nodes
            expected += tree.node_noise([r], _node(q, e))[0]
        assert torch.allclose(tree.prefix([r])[0], expected, rtol=1e-12, atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(present=st.lists(st.booleans(), min_size=1, max_size=24))
def test_empty_nodes_carry_no_noise_when_asked(present):
    """Fed_UCB's prose (spec gossip.md §2.6 [AMBIG-7]): noise only intervals holding a present record."""
    tree = TreeAggregator((), 24, sensitivity=1.0, mechanism="laplace", scale=1.0, noise_empty_nodes=False, seed=1)
    for p in present:
        out = tree.add([0], torch.tensor([1.0 if p else 0.0]), present=torch.tensor([p]))
    t = len(present)
    expected = float(sum(present))
    for q, e in _intervals(t):
        if any(present[q:e]):
            expected += float(tree.node_noise([0], _node(q, e))[0])
    assert float(out[0]) == pytest.approx(expected, abs=1e-12)


def test_batching_of_rows_does_not_change_the_noise():
    """Noise is keyed on (seed, row, level, node): how rows are grouped into calls is irrelevant."""
    a = TreeAggregator((2,), 16, sensitivity=1.0, scale=1.0, num_rows=3, seed=11)
    b = TreeAggregator((2,), 16, sensitivity=1.0, scale=1.0, num_rows=3, seed=11)
    x = torch.arange(30, dtype=torch.float64).view(5, 3, 2)
    for step in range(5):
        a.add(None, x[step])
        for r in (2, 0, 1):
            b.add([r], x[step, r:r + 1])
    assert torch.equal(a.prefix(), b.prefix())


def test_rows_and_nodes_get_independent_noise():
    tree = TreeAggregator((400,), 64, sensitivity=1.0, scale=1.0, num_rows=6, seed=2)
    draws = torch.stack([tree.node_noise(None, Node(level, index))
                         for level in range(4) for index in (1, 3, 5)]).view(-1, 400)  # (rows × nodes, 400)
    assert torch.unique(draws[:, 0]).numel() == draws.shape[0]  # no two (row, node) keys collide
    corr = np.corrcoef(draws.numpy())
    assert np.abs(corr[~np.eye(len(corr), dtype=bool)]).max() < 0.25


# ---- seeds and resume ----------------------------------------------------------------------------------------


def _run(tree: TreeAggregator, steps: range) -> list[torch.Tensor]:
    out = []
    for s in steps:
        rows = [r for r in range(4) if (s * (r + 1)) % 3 != 1]
        values = torch.full((len(rows), 2, 2), float(s))
        out.append(tree.add(rows, values))
    return out


def _tree(seed: int = 0, **kw) -> TreeAggregator:
    return TreeAggregator((2, 2), 40, sensitivity=2.0, epsilon=1.0, delta=0.1, symmetric=True, num_rows=4,
                          seed=seed, **kw)


def test_same_seed_same_noise_other_seed_or_indices_other_noise():
    ref = _run(_tree(0), range(10))
    assert all(torch.equal(x, y) for x, y in zip(ref, _run(_tree(0), range(10))))
    assert not torch.allclose(ref[-1], _run(_tree(1), range(10))[-1])
    assert not torch.allclose(ref[-1], _run(_tree(0, indices=(0, 1)), range(10))[-1])


def test_state_dict_round_trip_mid_stream_continues_identically():
    full = _tree(4)
    expected = _run(full, range(25))
    first = _tree(4)
    _run(first, range(13))
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    resumed = _tree(4)
    resumed.load_state_dict(torch.load(buf))
    assert all(torch.equal(x, y) for x, y in zip(expected[13:], _run(resumed, range(13, 25))))
    with pytest.raises(ConfigError, match="key"):
        _tree(5).load_state_dict(first.state_dict())


# ---- accounting ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("horizon", [1, 5, 8, 100, 1000, 1024])
def test_laplace_epsilon_is_levels_times_node_epsilon(horizon):
    levels = math.floor(math.log2(horizon)) + 1
    paper = TreeAggregator((), horizon, sensitivity=1.0, mechanism="laplace", epsilon=2.0)
    eps_node = 2.0 / max(1, math.ceil(math.log2(horizon)))
    assert paper.node_epsilon == pytest.approx(eps_node, rel=1e-12)
    assert paper.epsilon() == pytest.approx(levels * eps_node, rel=1e-12)  # > 2.0 exactly when T = 2^k > 1
    safe = TreeAggregator((), horizon, sensitivity=0.5, mechanism="laplace", epsilon=2.0, laplace_split="levels")
    assert safe.scale == pytest.approx(0.5 / (2.0 / levels), rel=1e-12)
    assert safe.epsilon() <= 2.0 and safe.epsilon() == pytest.approx(2.0, rel=1e-12)


@pytest.mark.parametrize("horizon", [1, 5, 8, 100, 1000, 1024])
@pytest.mark.parametrize("split", ["paper", "levels"])
def test_tree_laplace_scale_levels_and_accountant_are_the_closed_forms(horizon, split):
    """b = Δ·c/ε with c = max(1, ⌈log₂ T⌉) (paper) or ⌊log₂ T⌋ + 1 (levels); ε spent = (⌊log₂ T⌋ + 1)·ε/c."""
    levels = math.floor(math.log2(horizon)) + 1
    c = max(1, math.ceil(math.log2(horizon))) if split == "paper" else levels
    mechanism = TreeLaplace(2.0, split)
    assert mechanism.adds_noise and mechanism.levels(horizon) == levels
    for sensitivity in (1.0, 0.5):
        assert mechanism.node_scale(horizon, sensitivity) == pytest.approx(sensitivity * c / 2.0, rel=1e-12)
        acc = mechanism.accountant(horizon, sensitivity)
        assert isinstance(acc, LaplaceBasicAccountant)
        assert acc.epsilon() == pytest.approx(levels * 2.0 / c, rel=1e-12)
    if split == "levels":
        assert mechanism.accountant(horizon).epsilon() <= 2.0


def test_tree_laplace_at_infinite_epsilon_adds_no_noise():
    mechanism = TreeLaplace()
    assert mechanism.epsilon == math.inf and not mechanism.adds_noise
    assert mechanism.node_scale(1000) == 0.0 and mechanism.accountant(1000) is None


@pytest.mark.parametrize("kwargs,field", [
    ({"epsilon": 0.0}, "privacy.epsilon"),
    ({"epsilon": -1.0}, "privacy.epsilon"),
    ({"epsilon": math.nan}, "privacy.epsilon"),
    ({"epsilon": "one"}, "privacy.epsilon"),
    ({"laplace_split": "half"}, "privacy.laplace_split"),
    ({"noise_empty_intervals": "yes"}, "privacy.noise_empty_intervals"),
])
def test_tree_laplace_refuses_bad_fields_in_one_line_naming_them(kwargs, field):
    with pytest.raises(ConfigError, match=rf"^{field} must") as info:
        TreeLaplace(**kwargs)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("horizon,sigma,sens,delta", [(100, 5.0, 2.0, 0.1), (2 ** 17, 30.0, 1.0, 1e-5),
                                                       (1, 0.8, 1.0, 1e-6)])
def test_gaussian_epsilon_is_rdp_of_the_touched_nodes_converted(symmetric, horizon, sigma, sens, delta):
    shape = (3, 3) if symmetric else (3,)
    tree = TreeAggregator(shape, horizon, sensitivity=sens, scale=sigma, symmetric=symmetric, delta=delta)
    levels = math.floor(math.log2(horizon)) + 1
    sens_eff = sens / math.sqrt(2) if symmetric else sens  # symmetric noise: Frobenius sensitivity / √2
    rho = levels * sens_eff ** 2 / (2 * sigma ** 2)  # RDP of one Gaussian node: α Δ²/(2σ²)
    eps = tree.epsilon()
    assert eps == pytest.approx(_conversion(rho, delta, ALPHAS), rel=1e-5, abs=1e-12)
    assert eps <= rho + 2 * math.sqrt(rho * math.log(1 / delta))  # the classical conversion is looser
    from opacus.accountants import RDPAccountant

    opacus = RDPAccountant()
    opacus.history = [(sigma / sens_eff, 1.0, levels)]
    assert eps <= max(opacus.get_epsilon(delta), 0.0) + 1e-9


def test_symmetric_noise_multiplier_is_the_mahalanobis_sensitivity():
    """Symmetric noise has variance σ² off the diagonal and 2σ² on it; a change D of the statistic moves the
    release by Mahalanobis length ‖D‖_F/(√2σ) = 1/z."""
    sigma, sens = 1.3, 2.0
    tree = TreeAggregator((4, 4), 10, sensitivity=sens, scale=sigma, symmetric=True, delta=1e-5)
    d = torch.randn(4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    d = d + d.T
    d = d * sens / torch.linalg.matrix_norm(d)
    iu = torch.triu_indices(4, 4)
    var = torch.where(iu[0] == iu[1], 2.0, 1.0).double() * sigma ** 2
    mahalanobis = float(torch.sqrt((d[iu[0], iu[1]] ** 2 / var).sum()))
    assert tree.noise_multiplier == pytest.approx(1 / mahalanobis, rel=1e-12)


@settings(max_examples=25, deadline=None)
@given(eps=st.floats(0.05, 20.0), delta=st.floats(1e-9, 0.5), horizon=st.integers(1, 10 ** 6),
       symmetric=st.booleans())
def test_calibrated_sigma_spends_the_budget(eps, delta, horizon, symmetric):
    shape = (2, 2) if symmetric else (2,)
    tree = TreeAggregator(shape, horizon, sensitivity=1.5, epsilon=eps, delta=delta, symmetric=symmetric)
    assert tree.epsilon() <= eps
    assert tree.epsilon() == pytest.approx(eps, rel=1e-9)
    assert gaussian_rdp_epsilon(gaussian_rdp_rho(eps, delta), delta) <= eps


def test_tree_accountant_composes_further_trees():
    tree = TreeAggregator((2,), 1000, sensitivity=1.0, scale=3.0, delta=1e-5)
    acc = tree.accountant()
    assert isinstance(acc, GaussianRDPAccountant)
    once = acc.epsilon()
    acc.step(tree.noise_multiplier, tree.levels)  # a second privatiser of the same stream (e.g. a new phase)
    assert acc.rho == pytest.approx(2 * 10 / (2 * 3.0 ** 2))
    assert acc.epsilon() > once
    assert isinstance(TreeAggregator((), 8, sensitivity=1.0, mechanism="laplace", scale=1.0).accountant(),
                      LaplaceBasicAccountant)


def test_fclub_node_sigma_matches_the_paper():
    # σ_N² = 64 ν ln(2/δ)²/ε², ν = ⌈log₂(t_c + 1)⌉ + 1 (spec fclub.md §2.0); spec §7: σ_N ≈ 34 (ν = 2) … 102 (ν = 18)
    assert fclub_node_sigma(1.0, 0.1, 1) == pytest.approx(math.sqrt(64 * 2 * math.log(20) ** 2))
    assert fclub_node_sigma(1.0, 0.1, 2 ** 17 - 1) == pytest.approx(math.sqrt(64 * 18 * math.log(20) ** 2))
    assert fclub_node_sigma(2.0, 0.1, 1) == pytest.approx(fclub_node_sigma(1.0, 0.1, 1) / 2)  # σ_N ∝ 1/ε


def test_augmented_gram_splits_into_gram_and_moment():
    x = torch.tensor([[0.6, 0.8, 0.0]], dtype=torch.float64)
    y = torch.tensor([0.5], dtype=torch.float64)
    v, b = split_augmented(augmented_gram(x, y))
    assert torch.equal(v, x[:, :, None] * x[:, None, :])
    assert torch.equal(b, y[:, None] * x)  # column d, not d − 1


# ---- accountants and their registry -------------------------------------------------------------------------


def test_registry_builds_registered_accountants_and_rejects_unknown_names():
    assert isinstance(make_accountant("gaussian_rdp", delta=1e-5), GaussianRDPAccountant)
    assert isinstance(make_accountant("laplace_basic"), LaplaceBasicAccountant)
    with pytest.raises(ConfigError, match="accountant"):
        make_accountant("moments")

    @register_accountant("test_constant")
    class Constant(Accountant):
        def step(self, *args, **kwargs):
            pass

        def epsilon(self, delta=None):
            return 1.0

        def state_dict(self):
            return {}

        def load_state_dict(self, state):
            pass

    assert make_accountant("test_constant").epsilon() == 1.0
    with pytest.raises(ConfigError, match="already registered"):
        register_accountant("gaussian_rdp")(Constant)
    with pytest.raises(TypeError):
        register_accountant("not_an_accountant")(dict)


def test_accountants_round_trip_their_state():
    g = GaussianRDPAccountant(delta=1e-6)
    g.step(2.0, 3)
    g.step(0.9)
    h = GaussianRDPAccountant(delta=1e-6)
    h.load_state_dict(g.state_dict())
    assert h.epsilon() == g.epsilon() and h.rho == g.rho
    with pytest.raises(ConfigError, match="delta"):
        GaussianRDPAccountant(delta=1e-5).load_state_dict(g.state_dict())
    lap = LaplaceBasicAccountant()
    lap.step(0.1, 10)
    lap.step(0.3)
    again = LaplaceBasicAccountant()
    again.load_state_dict(lap.state_dict())
    assert again.epsilon() == lap.epsilon() == pytest.approx(1.3)
    assert lap.epsilon() >= 1.3  # rounded up from the exact rational sum


# ---- bad input -----------------------------------------------------------------------------------------------


def _gauss(**kw):
    args = {"shape": (2,), "horizon": 8, "sensitivity": 1.0, "epsilon": 1.0, "delta": 1e-5}
    args.update(kw)
    return TreeAggregator(**args)


@pytest.mark.parametrize("kwargs,match", [
    ({"epsilon": 0.0}, "epsilon"),
    ({"epsilon": -1.0}, "epsilon"),
    ({"delta": 0.0}, "delta"),
    ({"delta": 1.0}, "delta"),
    ({"delta": None}, "delta"),
    ({"horizon": 0}, "horizon"),
    ({"sensitivity": 0.0}, "sensitivity"),
    ({"mechanism": "gauss"}, "mechanism"),
    ({"num_rows": 0}, "num_rows"),
    ({"shape": (2, 0)}, "shape"),
    ({"symmetric": True}, "symmetric"),
    ({"mechanism": "laplace", "shape": (2, 2), "symmetric": True}, "symmetric"),
    ({"mechanism": "laplace", "laplace_split": "half"}, "laplace_split"),
    ({"seed": -1}, "seed"),
    ({"dtype": torch.int64}, "dtype"),
])
def test_bad_configuration_names_the_argument(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        _gauss(**kwargs)


def test_bad_records_name_the_argument():
    tree = _gauss(num_rows=3)
    with pytest.raises(ValueError, match="values"):
        tree.add([0, 1], torch.zeros(2, 3))
    with pytest.raises(ValueError, match="values"):
        tree.add([0], torch.tensor([[0.0, math.nan]]))
    with pytest.raises(ValueError, match="rows"):
        tree.add([3], torch.zeros(1, 2))
    with pytest.raises(ValueError, match="rows"):
        tree.add([1, 1], torch.zeros(2, 2))
    with pytest.raises(ValueError, match="rows"):
        tree.add([[0]], torch.zeros(1, 2))
    with pytest.raises(ValueError, match="present"):
        tree.add([0], torch.zeros(1, 2), present=torch.tensor([1]))
    with pytest.raises(ValueError, match="present"):
        tree.add([0], torch.ones(1, 2), present=torch.tensor([False]))
    assert int(tree.count.sum()) == 0  # nothing was recorded by a refused call
    for _ in range(8):
        tree.add([0], torch.zeros(1, 2))
    with pytest.raises(ValueError, match="horizon"):
        tree.add([0], torch.zeros(1, 2))
    sym = TreeAggregator((2, 2), 4, sensitivity=1.0, scale=1.0, symmetric=True)
    with pytest.raises(ValueError, match="symmetric"):
        sym.add([0], torch.tensor([[[0.0, 1.0], [0.0, 0.0]]]))
    with pytest.raises(ConfigError, match="horizon"):
        nodes_touched(9, 8)
    with pytest.raises(ConfigError, match="noise_multiplier"):
        GaussianRDPAccountant().step(0.0)
    with pytest.raises(ConfigError, match="delta"):
        GaussianRDPAccountant().epsilon()
    with pytest.raises(ConfigError, match="rho"):
        gaussian_rdp_epsilon(-1.0, 1e-5)
    with pytest.raises(ConfigError, match="epsilon"):
        laplace_node_scale(0.0, 8, 1.0)

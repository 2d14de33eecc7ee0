"""fedrec.aggregation on its own: every rule against a direct numpy (or scipy) formula on random inputs, and every
server optimiser against a loop written from Reddi et al.'s Algorithm 2; robustness and bad values."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrec.aggregation import (
    FedAdagrad,
    FedAdam,
    FedAvgM,
    FedYogi,
    coordinate_median,
    krum,
    norm_bounded_mean,
    trimmed_mean,
    weighted_mean,
)
from fedrec.errors import ConfigError
from tests.helpers import random_case, t
from tests.reference.aggregation import algorithm_2, ref_krum, ref_norm_bounded


# ------------------------------------------------------------------------------------------------------- rules
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), clients=st.integers(1, 12), dim=st.integers(1, 6))
def test_weighted_mean_median_and_trimmed_mean_equal_numpy_and_scipy(seed: int, clients: int, dim: int) -> None:
    u, w = random_case(seed, clients, dim)
    torch.testing.assert_close(weighted_mean(t(u), t(w)), t(np.average(u, axis=0, weights=w)), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(coordinate_median(t(u), t(w)), t(np.median(u, axis=0)), rtol=1e-12, atol=1e-12)
    for beta in (0.0, 0.1, 0.25, 0.4, 0.49):
        want = scipy.stats.trim_mean(u, beta, axis=0)  # cuts int(beta * C) values from each end
        torch.testing.assert_close(trimmed_mean(t(u), t(w), beta), t(want), rtol=1e-12, atol=1e-12)


def test_the_median_of_an_even_number_of_clients_is_the_mean_of_the_two_middle_values() -> None:
    u = t([[1.0, 10.0], [4.0, -2.0], [2.0, 7.0], [100.0, 0.0]])
    assert coordinate_median(u, torch.ones(4)).tolist() == [3.0, 3.5]
    # unweighted, as Yin et al.: the weights do not move it
    assert coordinate_median(u, t([100.0, 1.0, 1.0, 1.0])).tolist() == [3.0, 3.5]
    assert coordinate_median(u[:3], torch.ones(3)).tolist() == [2.0, 7.0]


def test_trimmed_mean_cuts_floor_beta_c_per_side() -> None:
    u = t([[v] for v in (-50.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 500.0)])
    w = torch.ones(10)
    assert trimmed_mean(u, w, 0.0).item() == pytest.approx(705 / 10)
    assert trimmed_mean(u, w, 0.1).item() == 255 / 8  # one per side: the two outliers go
    assert trimmed_mean(u, w, 0.19).item() == 255 / 8  # ⌊1.9⌋ = 1
    assert trimmed_mean(u, w, 0.2).item() == 126 / 6  # two per side
    assert trimmed_mean(u, w, 0.3).item() == 60 / 4  # 0.3 · 10 is 3.0000000000000004 in floats: three
    assert trimmed_mean(u, w, 0.49).item() == 12.0  # four per side: 8 and 16 stay
    many = t(np.arange(100.0).reshape(100, 1))
    assert trimmed_mean(many, torch.ones(100), 0.29).item() == np.mean(np.arange(29.0, 71.0))  # 0.29 · 100 → 29


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), f=st.integers(0, 4), extra=st.integers(0, 5), dim=st.integers(1, 6),
       m=st.integers(1, 13))
def test_krum_and_multi_krum_equal_the_written_out_rule(seed: int, f: int, extra: int, dim: int, m: int) -> None:
    clients = 2 * f + 3 + extra  # extra = 0: f at its limit, C = 2f + 3
    u, w = random_case(seed, clients, dim)
    m = min(m, clients)
    torch.testing.assert_close(krum(t(u), t(w), f), t(ref_krum(u, w, f, 1)), rtol=0, atol=0)
    torch.testing.assert_close(krum(t(u), t(w), f, m), t(ref_krum(u, w, f, m)), rtol=1e-12, atol=1e-12)


def test_krum_ties_go_to_the_lower_index_and_duplicates_tie() -> None:
    u = t([[0.0, 0.0], [5.0, 5.0], [0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # clients 0 and 2 are equal
    w = torch.ones(5)
    # f = 1: 2 nearest others. 0 and 2: 0 + 1 = 1; 3: 1 + 1 = 2 (to 0 and 2); the tie 0/2 goes to 0
    assert krum(u, w, 1).tolist() == [0.0, 0.0]
    assert krum(u.flip(0), w, 1).tolist() == [0.0, 0.0]
    scores_order = krum(u, t([1.0, 1.0, 3.0, 1.0, 1.0]), 1, 2)  # the two best are 0 and 2 (equal): their mean
    assert scores_order.tolist() == [0.0, 0.0]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), clients=st.integers(1, 10), dim=st.integers(1, 6), log_bound=st.floats(-2, 1))
def test_norm_bounded_mean_equals_the_written_out_rule(seed: int, clients: int, dim: int, log_bound: float) -> None:
    u, w = random_case(seed, clients, dim)
    u[0] = 0.0  # a zero update stays zero
    bound = 10.0 ** log_bound
    torch.testing.assert_close(norm_bounded_mean(t(u), t(w), bound), t(ref_norm_bounded(u, w, bound)), rtol=1e-12,
                               atol=1e-12)


def test_batched_rules_equal_one_call_per_batch() -> None:
    rng = np.random.default_rng(5)
    u, w = rng.normal(size=(4, 7, 3)), rng.uniform(0.5, 2.0, (4, 7))
    rules = [weighted_mean, coordinate_median, lambda a, b: trimmed_mean(a, b, 0.2), lambda a, b: krum(a, b, 2),
             lambda a, b: krum(a, b, 1, 3), lambda a, b: norm_bounded_mean(a, b, 0.5)]
    for rule in rules:
        batched = rule(t(u), t(w))
        for b in range(4):
            torch.testing.assert_close(batched[b], rule(t(u[b]), t(w[b])), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_median_and_krum_recover_the_honest_mean_against_far_away_attackers(seed: int) -> None:
    rng = np.random.default_rng(seed)
    honest_mean = rng.normal(size=6)
    C, f = 25, 7
    honest = honest_mean + 0.01 * rng.normal(size=(C - f, 6))
    attackers = 1e6 * rng.normal(size=(f, 6))  # far away, in all directions
    u = t(np.vstack([attackers, honest]))[torch.from_numpy(rng.permutation(C))]
    w = torch.ones(C, dtype=torch.float64)
    plain = weighted_mean(u, w)
    assert float((plain - t(honest_mean)).abs().max()) > 1e3  # the mean is dragged away
    for got in (coordinate_median(u, w), trimmed_mean(u, w, 0.3), krum(u, w, f)):
        assert float((got - t(honest_mean)).abs().max()) < 0.05
    # Multi-Krum with m = C − f keeps exactly the honest updates: their mean
    torch.testing.assert_close(krum(u, w, f, C - f), t(honest.mean(0)), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("call", "field"), [
    (lambda u, w: trimmed_mean(u, w, 0.5), "aggregator.beta"),
    (lambda u, w: trimmed_mean(u, w, -0.1), "aggregator.beta"),
    (lambda u, w: krum(u, w, 4), "aggregator.f"),  # 10 clients < 2·4 + 3
    (lambda u, w: krum(u, w, -1), "aggregator.f"),
    (lambda u, w: krum(u, w, 1, 11), "aggregator.m"),
    (lambda u, w: krum(u, w, 1, 0), "aggregator.m"),
    (lambda u, w: norm_bounded_mean(u, w, 0.0), "aggregator.bound"),
])
def test_bad_rule_settings_are_one_line_errors_naming_the_field(call, field: str) -> None:
    u, w = torch.randn(10, 3), torch.ones(10)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as info:
        call(u, w)
    assert "\n" not in str(info.value)
    assert krum(u, w, 3).shape == (3,)  # f = 3 is the limit for 10 clients


# ------------------------------------------------------------------------------------------- server optimisers
def make(kind: str, lr: float, b1: float, b2: float, tau: float, bias_correction: bool = False):
    if kind == "fedavgm":
        return FedAvgM(lr=lr, beta1=b1)
    if kind == "fedadagrad":
        return FedAdagrad(lr=lr, beta1=b1, tau=tau)
    cls = FedAdam if kind == "fedadam" else FedYogi
    return cls(lr=lr, beta1=b1, beta2=b2, tau=tau, bias_correction=bias_correction)


KINDS = ["fedavgm", "fedadagrad", "fedadam", "fedyogi"]


@pytest.mark.parametrize(("kind", "bias_correction"), [*((k, False) for k in KINDS), ("fedadam", True),
                                                       ("fedyogi", True)])
def test_each_optimiser_equals_algorithm_2_over_several_rounds(kind: str, bias_correction: bool) -> None:
    rng = np.random.default_rng(1)
    x0 = rng.normal(size=9)
    deltas = [rng.normal(size=9) * 10.0 ** rng.uniform(-4, 0) for _ in range(12)]
    deltas[3][:4] = 0.0  # a coordinate with Δ = 0 (Yogi's sign(v − Δ²) and Adagrad's sum see it)
    lr, b1, b2, tau = 0.3, 0.8, 0.95, 1e-3
    want = algorithm_2(kind, x0, deltas, lr, b1, b2, tau, bias_correction)
    opt = make(kind, lr, b1, b2, tau, bias_correction)
    x = t(x0)
    for d, w in zip(deltas, want):
        x = opt.step(x, t(d))
        torch.testing.assert_close(x, t(w), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind", KINDS)
def test_table_rows_step_only_when_listed_and_their_moments_wait(kind: str) -> None:
    """Rows of a table step with their own moments and step counts; a row not listed in a round keeps its value
    and moments: each row follows Algorithm 2 over the rounds it was listed in (bias-corrected rates too)."""
    rng = np.random.default_rng(2)
    R, P, rounds = 6, 3, 10
    table0 = rng.normal(size=(R, P))
    listed = [np.sort(rng.choice(R, size=int(rng.integers(1, R)), replace=False)) for _ in range(rounds)]
    deltas = [rng.normal(size=(len(rows), P)) * 0.01 for rows in listed]
    bias = kind in ("fedadam", "fedyogi")
    opt = make(kind, 0.2, 0.9, 0.99, 1e-2, bias)
    table = t(table0)
    for rows, d in zip(listed, deltas):
        before = table.clone()
        table = opt.step(table, t(d), rows=torch.from_numpy(rows))
        untouched = np.setdiff1d(np.arange(R), rows)
        assert torch.equal(table[untouched], before[untouched])
    for r in range(R):
        mine = [d[list(rows).index(r)] for rows, d in zip(listed, deltas) if r in rows]
        want = algorithm_2(kind, table0[r], mine, 0.2, 0.9, 0.99, 1e-2, bias)
        torch.testing.assert_close(table[r], t(want[-1] if want else table0[r]), rtol=1e-12, atol=1e-14)
        assert int(opt.state["steps"][r]) == len(mine)


def test_fedavgm_without_momentum_and_lr_one_is_the_mean_model() -> None:
    x, delta = torch.randn(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    assert torch.equal(FedAvgM(lr=1.0, beta1=0.0).step(x, delta), x + delta)


def test_optimiser_state_round_trips() -> None:
    a = FedAdam(lr=0.1)
    x = torch.randn(4, dtype=torch.float64)
    deltas = [torch.randn(4, dtype=torch.float64) for _ in range(5)]
    for d in deltas[:2]:
        x = a.step(x, d)
    b = FedAdam(lr=0.1)
    b.load_state_dict(a.state_dict())
    ya, yb = x, x
    for d in deltas[2:]:
        ya, yb = a.step(ya, d), b.step(yb, d)
    assert torch.equal(ya, yb)


@pytest.mark.parametrize(("build", "field"), [
    (lambda: FedAdam(tau=-1e-3), "server.tau"),
    (lambda: FedYogi(tau=0.0), "server.tau"),
    (lambda: FedAdagrad(tau=-1.0), "server.tau"),
    (lambda: FedAdam(beta1=1.0), "server.beta1"),
    (lambda: FedYogi(beta2=-0.1), "server.beta2"),
    (lambda: FedAvgM(lr=0.0), "server.lr"),
    (lambda: FedAvgM(beta1=1.5), "server.beta1"),
    (lambda: FedAdam(bias_correction="yes"), "server.bias_correction"),
])
def test_bad_optimiser_settings_are_one_line_errors_naming_the_field(build, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as info:
        build()
    assert "\n" not in str(info.value)

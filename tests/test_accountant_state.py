"""Accountant states name their kind: a ledger restores its own kind's state exactly and refuses another's."""
from __future__ import annotations

import io
import itertools
from collections.abc import Callable

import pytest
import torch

from fedrec.errors import ConfigError
from fedrec.privacy.accountant import _REGISTRY, Accountant, make_accountant

#: a fresh ledger and one that has recorded a few rounds, for every kind fedrec registers
FACTORIES: dict[str, Callable[[], Accountant]] = {
    "gaussian_rdp": lambda: make_accountant("gaussian_rdp", delta=1e-5),
    "laplace_basic": lambda: make_accountant("laplace_basic"),
    "sampled_gaussian": lambda: make_accountant("sampled_gaussian", delta=1e-5),
    "client": lambda: make_accountant("client", num_clients=3, epsilon_total=50.0, delta_total=1e-5),
}


def _stepped(kind: str) -> Accountant:
    acc = FACTORIES[kind]()
    if kind == "client":
        acc.step(torch.tensor([1.5, 2.0, 1.5], dtype=torch.float64), torch.tensor([True, False, True]))
        acc.step(3.0)
    elif kind == "sampled_gaussian":
        acc.step(1.1, 20, 0.1)
        acc.step(2.0, 3)
    else:
        acc.step(1.5, 4)
        acc.step(0.75)
    return acc


def test_every_kind_fedrec_registers_is_covered() -> None:
    fedrec_kinds = {name for name, cls in _REGISTRY.items() if cls.__module__.startswith("fedrec.")}
    assert fedrec_kinds == set(FACTORIES)
    assert all(_REGISTRY[name].kind == name for name in fedrec_kinds)


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_state_names_its_kind_and_round_trips_exactly(kind: str) -> None:
    acc = _stepped(kind)
    state = acc.state_dict()
    assert state["kind"] == kind
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    fresh = FACTORIES[kind]()
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    got, want = fresh.epsilon(), acc.epsilon()
    assert torch.equal(torch.as_tensor(got), torch.as_tensor(want)) and float(torch.as_tensor(want).max()) > 0.0
    again = fresh.state_dict()
    assert again.keys() == state.keys()
    for key, value in state.items():
        if isinstance(value, torch.Tensor):  # NaN marks a client that sat a round out
            torch.testing.assert_close(again[key], value, rtol=0, atol=0, equal_nan=True)
        else:
            assert value == again[key], key


@pytest.mark.parametrize(("saved", "loader"), [p for p in itertools.permutations(sorted(FACTORIES), 2)])
def test_another_kinds_state_is_refused_naming_both(saved: str, loader: str) -> None:
    target = _stepped(loader)
    before = target.epsilon()
    with pytest.raises(ConfigError, match=rf"^cannot load {loader} accountant state: kind is '{saved}' in the "
                                          rf"checkpoint but '{loader}' here"):
        target.load_state_dict(_stepped(saved).state_dict())
    assert torch.equal(torch.as_tensor(target.epsilon()), torch.as_tensor(before))  # nothing was replayed


def test_gaussian_state_into_laplace_ledger_is_refused() -> None:
    """The case that motivated naming kinds: both histories are [(level, count), ...], so without the kind a
    Laplace ledger would read noise multipliers as per-round ε."""
    gaussian = make_accountant("gaussian_rdp", delta=None)
    gaussian.step(1.5, 4)
    laplace = make_accountant("laplace_basic")
    with pytest.raises(ConfigError, match="kind is 'gaussian_rdp' in the checkpoint but 'laplace_basic' here"):
        laplace.load_state_dict(gaussian.state_dict())
    assert laplace.epsilon() == 0.0


@pytest.mark.parametrize("kind", sorted(FACTORIES))
def test_a_state_saved_without_its_kind_is_read_as_the_loaders_own(kind: str) -> None:
    acc = _stepped(kind)
    state = {k: v for k, v in acc.state_dict().items() if k != "kind"}
    fresh = FACTORIES[kind]()
    fresh.load_state_dict(state)
    assert torch.equal(torch.as_tensor(fresh.epsilon()), torch.as_tensor(acc.epsilon()))


def test_one_class_registers_as_one_kind() -> None:
    from fedrec.privacy.accountant import register_accountant

    with pytest.raises(ConfigError, match="already registered as 'laplace_basic'"):
        register_accountant("test_second_name")(_REGISTRY["laplace_basic"])
    assert "test_second_name" not in _REGISTRY

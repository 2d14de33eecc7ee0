"""CDP-FCLUB-DC's privacy configured one way: the mechanism object fedrec.privacy.TreeGaussian (its validation, its
ν, node σ and spent ε against closed forms and the calibration helpers), the privacy group that
``protocol=cdp_fclub_dc`` selects and ``privacy=...`` overrides, and the builder passing it only to protocols that
declare it."""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import DictConfig

from fedrec.app.build import build_task, group_class
from fedrec.errors import ConfigError
from fedrec.privacy import ClientDP, TreeGaussian
from fedrec.privacy.tree import fclub_accounted_sigma, fclub_epsilon, fclub_phases
from fedrec.protocols import FederatedClustering, LocalClustering, StepProtocol

CONF = Path(__file__).resolve().parents[1] / "conf"


@pytest.mark.parametrize(("kw", "field"), [
    (dict(epsilon=0.0), "epsilon"), (dict(epsilon=-1.0), "epsilon"), (dict(epsilon=math.nan), "epsilon"),
    (dict(epsilon="x"), "epsilon"), (dict(delta=0.0), "delta"), (dict(delta=1.0), "delta"),
    (dict(delta=-0.5), "delta"), (dict(horizon=0), "horizon"), (dict(horizon=2.5), "horizon"),
    (dict(calibration="exact"), "calibration"),
])
def test_bad_values_raise_one_line_errors_naming_the_privacy_field(kw: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^privacy\.{field} must ") as info:
        TreeGaussian(**kw)
    assert "\n" not in str(info.value)


def test_an_unknown_calibration_is_refused_where_a_sigma_is_asked_for() -> None:
    with pytest.raises(ConfigError, match=r"^privacy\.calibration must be one of \['paper', 'accountant'\], got 'x'$"):
        TreeGaussian().node_sigma("x")


def test_nu_is_the_tree_depth_of_the_upload_bound() -> None:
    """ν = ⌈log₂(t_c + 1)⌉ + 1 (spec fclub.md §2.0), by the closed form in floats and at the powers of two."""
    for t_c in [*range(1, 3000), 2 ** 20 - 1, 2 ** 20, 100_000]:
        assert TreeGaussian(horizon=t_c).nu == math.ceil(math.log2(t_c + 1)) + 1, t_c
    assert TreeGaussian(horizon=1).nu == 2 and TreeGaussian(horizon=1024).nu == 12


@pytest.mark.parametrize(("epsilon", "delta", "horizon"), [(1.0, 0.1, 100_000), (0.25, 0.01, 1000), (8.0, 0.5, 7)])
def test_the_paper_sigma_is_its_closed_form(epsilon: float, delta: float, horizon: int) -> None:
    """σ_N² = 64ν ln(2/δ)²/ε² (spec §2.0, Sec. 3)."""
    mech = TreeGaussian(epsilon, delta, horizon)
    nu = math.ceil(math.log2(horizon + 1)) + 1
    assert mech.sigma == mech.node_sigma("paper") == pytest.approx(math.sqrt(64 * nu * math.log(2 / delta) ** 2)
                                                                   / epsilon, rel=1e-12)


@pytest.mark.parametrize(("epsilon", "horizon"), [(1.0, 10_000), (4.0, 1000)])
def test_the_accountant_sigma_spends_the_whole_budget_over_the_run(epsilon: float, horizon: int) -> None:
    """The accountant's σ is the smallest whose run of ``horizon`` rounds spends at most ε (phases composed)."""
    mech = TreeGaussian(epsilon, 0.1, horizon, calibration="accountant")
    phases = fclub_phases(horizon)
    assert mech.sigma == fclub_accounted_sigma(epsilon, 0.1, horizon, horizon)
    assert mech.epsilon_spent(phases) <= epsilon < fclub_epsilon(math.nextafter(mech.sigma, 0.0), 0.1, horizon,
                                                                  phases)
    assert mech.sigma < mech.node_sigma("paper")  # the paper's σ spends less than ε ≤ 4 once phases compose


def test_the_spent_epsilon_grows_with_the_phases_from_zero() -> None:
    mech = TreeGaussian(2.0, 0.1, 5000)
    spent = [mech.epsilon_spent(s) for s in range(6)]
    assert spent[0] == 0.0 and all(a <= b for a, b in zip(spent, spent[1:])) and 0 < spent[2] < spent[5]
    assert spent[3] == fclub_epsilon(mech.sigma, 0.1, 5000, 3)


def test_infinite_epsilon_is_the_private_path_without_noise() -> None:
    mech = TreeGaussian(epsilon=math.inf)
    assert mech.sigma == 0.0 and mech.epsilon_spent(3) == math.inf
    p = FederatedClustering(10, 3, num_servers=2, privacy=mech)
    assert p.private and p.rho == 0.0 and "epsilon_spent" not in p.metrics()


def test_the_protocol_rescales_rho_with_the_accountant_sigma() -> None:
    """ρ bounds ‖H‖ ∝ σ: the accountant's calibration multiplies ρ by σ_accountant / σ_paper."""
    paper = FederatedClustering(10, 3, num_servers=2, privacy=TreeGaussian(1.0, 0.1, 1000))
    accountant = FederatedClustering(10, 3, num_servers=2, privacy=TreeGaussian(1.0, 0.1, 1000, "accountant"))
    assert paper.sigma_node == TreeGaussian(1.0, 0.1, 1000).node_sigma("paper")
    assert accountant.sigma_node == fclub_accounted_sigma(1.0, 0.1, 1000, 1000)
    assert accountant.rho / paper.rho == pytest.approx(accountant.sigma_node / paper.sigma_node, rel=1e-12)


def test_a_protocol_refuses_another_privacy_object() -> None:
    with pytest.raises(ConfigError, match=r"^privacy must be a fedrec.privacy.TreeGaussian or None, got dict$"):
        FederatedClustering(10, 3, num_servers=2, privacy={"epsilon": 1.0})


# --------------------------------------------------------------------------------------------- configuration
def test_cdp_fclub_dc_selects_the_tree_gaussian_group(compose_cfg: Callable[..., DictConfig]) -> None:
    cfg = compose_cfg("+experiment=fclub_synthetic", "protocol=cdp_fclub_dc", "task.steps=300",
                      "task.steps_per_round=100", "privacy.epsilon=4")
    assert group_class(cfg.privacy, "privacy") is TreeGaussian and "epsilon" not in cfg.protocol
    task = build_task(cfg)
    assert task.protocol.privacy == TreeGaussian(epsilon=4.0, delta=0.1, horizon=300, calibration="paper")


@pytest.mark.parametrize("order", [("protocol=cdp_fclub_dc", "privacy=none"),
                                   ("privacy=none", "protocol=cdp_fclub_dc")])
def test_privacy_none_on_the_command_line_wins(compose_cfg: Callable[..., DictConfig], order: tuple[str, str]) -> None:
    cfg = compose_cfg("+experiment=fclub_synthetic", "task.steps=300", "task.steps_per_round=100", *order)
    assert dict(cfg.privacy) == {"mechanism": "none"}
    protocol = build_task(cfg).protocol
    assert isinstance(protocol, FederatedClustering) and protocol.privacy is None and not protocol.private


def test_the_other_fclub_protocols_select_no_privacy(compose_cfg: Callable[..., DictConfig]) -> None:
    for name in ("fclub_dc", "fclub", "homo", "homo_dc", "club", "sclub", "linucb_per_user"):
        assert compose_cfg(f"protocol={name}").get("privacy") is None, name


def test_the_builder_refuses_client_dp_on_every_bandit_protocol(compose_cfg: Callable[..., DictConfig]) -> None:
    """Every protocol config whose class plays step-wise bandit runs (found by composing each, here rather than at
    collection, which every test worker does)."""
    refused = []
    for path in sorted((CONF / "protocol").glob("*.yaml")):
        cfg = compose_cfg(f"protocol={path.stem}", "privacy=gaussian")
        cls = group_class(cfg.protocol, "protocol")
        if not issubclass(cls, StepProtocol):
            continue
        with pytest.raises(ConfigError) as info:
            build_task(cfg)
        applies = "only TreeGaussian" if cls is FederatedClustering else "no privacy mechanism"
        assert str(info.value) == f"privacy: {cls.__name__} applies {applies}, got ClientDP", path.stem
        refused.append(path.stem)
    assert {"async", "fclub", "club", "sync"} <= set(refused), refused


def test_the_builder_refuses_a_mechanism_the_protocol_does_not_declare(compose_cfg: Callable[..., DictConfig]) -> None:
    assert LocalClustering.privacy_mechanisms == () and FederatedClustering.privacy_mechanisms == (TreeGaussian,)
    assert not issubclass(ClientDP, FederatedClustering.privacy_mechanisms)
    for protocol in ("club", "sclub", "async"):
        cfg = compose_cfg(f"protocol={protocol}", "privacy=tree_gaussian")
        with pytest.raises(ConfigError) as info:
            build_task(cfg)
        name = group_class(cfg.protocol, "protocol").__name__
        assert str(info.value) == f"privacy: {name} applies no privacy mechanism, got TreeGaussian"

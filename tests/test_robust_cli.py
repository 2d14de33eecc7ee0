"""Every new option of the aggregator, server and attack groups composes and runs a few rounds through the CLI, and
bad values are one-line errors naming the field."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedrec.app.cli import run
from fedrec.errors import ConfigError

QUICK = ("task.rounds=2", "plots=false", "logger.tensorboard=false")

#: every option of the three groups, in five runs
RUNS = [
    ("aggregator=median", "server=fedavg", "attack=sign_flip"),
    ("aggregator=trimmed_mean", "server=fedavgm", "attack=scale"),
    ("aggregator=krum", "aggregator.f=47", "server=fedadagrad", "attack=noise"),
    ("aggregator=multi_krum", "aggregator.f=47", "server=fedadam", "attack=item_promotion", "privacy=gaussian"),
    ("aggregator=norm_bound", "server=fedyogi", "attack=none", "strategy.local_steps=2", "task.prox_mu=0.1"),
]


@pytest.mark.parametrize("overrides", RUNS, ids=lambda o: o[0].split("=")[1])
def test_every_new_option_runs(compose_cfg, data_dir: Path, tmp_path: Path, overrides: tuple[str, ...]) -> None:
    cfg = compose_cfg("+experiment=fedgnn_ml100k", f"data_dir={data_dir}", *QUICK, *overrides)
    summary = run(cfg, output_dir=tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert summary["rounds_run"] == 2 and summary["final_test_rmse"] > 0
    assert summary["server_optimizer"] == cfg.server._target_.rsplit(".", 1)[1]
    attack = cfg.attack.get("_target_")
    if attack is None:
        assert "attack" not in summary and "final_test_benign_rmse" not in summary
    else:
        assert summary["attack"] == attack.rsplit(".", 1)[1] and summary["malicious_clients"] == 47
        assert summary["final_test_benign_rmse"] > 0
        assert ("final_test_target_exposure" in summary) == (summary["attack"] == "ItemPromotion")


@pytest.mark.parametrize(("overrides", "field"), [
    (("aggregator=trimmed_mean", "aggregator.beta=0.5"), "aggregator.beta"),
    (("aggregator=krum", "aggregator.f=471"), "aggregator.f"),  # 943 clients < 2·471 + 3
    (("aggregator=multi_krum", "aggregator.m=944"), "aggregator.m"),
    (("aggregator=norm_bound", "aggregator.bound=0"), "aggregator.bound"),
    (("server=fedadam", "server.tau=-1e-3"), "server.tau"),
    (("server=fedyogi", "server.beta2=1"), "server.beta2"),
    (("server=fedavgm", "server.lr=0"), "server.lr"),
    (("task.prox_mu=-0.1",), "task.prox_mu"),
    (("attack=item_promotion", "attack.fraction=1.0"), "attack.fraction"),
    (("attack=sign_flip", "attack.fraction=-0.1"), "attack.fraction"),
    (("attack=item_promotion", "attack.target_item=1682"), "attack.target_item"),
])
def test_bad_values_are_one_line_errors_naming_the_field(compose_cfg, data_dir: Path, tmp_path: Path,
                                                         overrides: tuple[str, ...], field: str) -> None:
    cfg = compose_cfg("+experiment=fedgnn_ml100k", f"data_dir={data_dir}", *QUICK, *overrides)
    with pytest.raises(ConfigError) as info:
        run(cfg, output_dir=tmp_path)
    assert re.search(re.escape(field), str(info.value)) and "\n" not in str(info.value), str(info.value)
    assert not (tmp_path / "summary.json").exists()

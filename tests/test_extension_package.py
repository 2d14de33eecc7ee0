"""The example research package (``examples/extension``: a model of ordinary layers, a rule, an attack, their option
files and an experiment) runs from a folder outside the source tree, as a user's own package would: its option
files join the schema the command line is checked against (``hydra.searchpath`` or ``--config-dir``), ``quick=true``
finds its experiment's recipe, a sweep runs, and a typo in its command line or in its own option file is one error
line naming the field."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SEARCHPATH = "hydra.searchpath=[pkg://myrec.conf]"


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A copy of the example package in a folder of its own (neither the repository nor its conf/)."""
    home = tmp_path / "home"
    shutil.copytree(ROOT / "examples" / "extension", home)
    return home


def train(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python .../train.py ARGS`` run in ``home``, with the package importable from there."""
    env = {**os.environ, "PYTHONPATH": str(home)}
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=home, env=env, capture_output=True,
                          text=True, timeout=600)


def test_a_typo_in_its_command_line_names_the_field(package: Path) -> None:
    done = train(package, "--config-dir", "myrec/conf", "+experiment=myrec_synthetic", "quick=true", "model.hiden=4")
    assert done.returncode == 2
    assert done.stderr.strip() == ("error: model.hiden: model=mlp_scorer has no field 'hiden' (did you mean "
                                   "'hidden'?); nothing would read it")
    assert not (package / "outputs").exists()


def test_a_typo_in_its_own_option_file_names_the_field(package: Path) -> None:
    option = package / "myrec" / "conf" / "model" / "mlp_scorer.yaml"
    option.write_text(option.read_text().replace("hidden:", "hiden:"))
    done = train(package, SEARCHPATH, "+experiment=myrec_synthetic", "quick=true")
    assert done.returncode == 2
    assert done.stderr.startswith("error: model: ") and "'hiden'" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_quick_sweep_over_its_rule_and_fedrecs_runs_from_its_own_folder(package: Path) -> None:
    done = train(package, "-m", SEARCHPATH, "+experiment=myrec_synthetic", "quick=true",
                 "aggregator=median_norm,fedsgd", "model.hidden=4", "hydra.sweep.dir=sweep")
    assert done.returncode == 0, done.stderr
    jobs = [json.loads((package / "sweep" / str(j) / "summary.json").read_text()) for j in (0, 1)]
    assert [job["aggregator"] for job in jobs] == ["MedianNormClip", "FedSGD"]
    for job in jobs:
        assert job["model"] == "MLPScorer" and job["rounds_run"] == 3  # the recipe's task.rounds=3
        assert job["malicious_clients"] == 3  # fraction 0.1 of the recipe's 30 clients
        assert 0 < job["final_test_rmse"] < 1


def test_its_rule_against_a_plain_loop() -> None:
    sys.path.insert(0, str(ROOT / "examples" / "extension"))
    try:
        from myrec.rules import MedianNormClip
    finally:
        sys.path.remove(str(ROOT / "examples" / "extension"))
    g = torch.Generator().manual_seed(0)
    updates = torch.randn(4, 5, 3, generator=g, dtype=torch.float64) * torch.tensor([1.0, 1, 9, 1, 0.1]).view(5, 1)
    weights = torch.rand(4, 5, generator=g, dtype=torch.float64)
    got = MedianNormClip(multiple=1.5).rule(updates, weights, 5)
    for b in range(4):
        norms = sorted(float(u.norm()) for u in updates[b])
        bound = 1.5 * norms[2]  # the median of five norms
        total = sum(float(w) * u * min(1.0, bound / float(u.norm())) for u, w in zip(updates[b], weights[b]))
        torch.testing.assert_close(got[b], total / float(weights[b].sum()))


def test_other_config_folders_are_checked_too() -> None:
    from fedrec.app.schema import check_command_line
    from fedrec.errors import ConfigError

    conf = ROOT / "conf"
    with pytest.raises(ConfigError, match="^task.roundz: task=fedrec has no field 'roundz'"):
        check_command_line(conf, ["--config-path", str(conf), "+experiment=fedgnn_synthetic", "task.roundz=3"])
    with pytest.raises(ConfigError, match="^--config-dir: .*nowhere is not a folder"):
        check_command_line(conf, ["--config-dir", str(ROOT / "nowhere"), "+experiment=fedgnn_synthetic"])

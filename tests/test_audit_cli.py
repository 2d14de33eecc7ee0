"""``python -m fedrec.app.audit_cli``: a run's configuration audited through its own privatiser, one headline line and
``audit.json`` in the output folder; bad values and configurations it cannot audit are one ``error:`` line."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import hydra_state_restored

import fedrec.app.audit_cli

ROOT = Path(__file__).resolve().parents[1]
#: a small synthetic FedGNN run with client DP (the experiment's default data is ML-1M's size, its 400 pseudo items
#: more than these 100 items)
BASE = ("+experiment=fedgnn_synthetic", "data.users=300", "data.items=100", "data.ratings=5000", "data.num_clients=30",
        "task.pseudo_items=50", "task.rounds=4", "audit.trials=4000")
SMALL = (*BASE, "privacy=gaussian", "privacy.epsilon=2")
KEYS = {"epsilon_lower", "epsilon_reported", "confidence", "trials", "threat_model"}


@pytest.fixture
def audit_cli(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """``audit_cli(*args)`` runs ``python -m fedrec.app.audit_cli *args`` in this process (Hydra parses
    ``sys.argv``)."""
    def call(*args: str) -> Any:
        monkeypatch.setattr(sys, "argv", ["fedrec.app.audit_cli", *args])
        return fedrec.app.audit_cli.cli()

    with hydra_state_restored():
        yield call


def test_the_audit_prints_a_headline_and_writes_audit_json(audit_cli, tmp_path: Path, capsys) -> None:
    out = tmp_path / "audit"
    audit_cli(*SMALL, "audit.rounds=2", f"hydra.run.dir={out}")
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedgnn_synthetic: ε ≥ ")
    record = json.loads((out / "audit.json").read_text())
    assert KEYS <= set(record)
    assert record["trials"] == 4000 and record["confidence"] == 0.95
    assert "replace_one" in record["threat_model"] and "2 rounds" in record["threat_model"]
    assert 0.0 <= record["epsilon_lower"] <= record["epsilon_reported"] <= 2.0
    assert f"reported ε = {record['epsilon_reported']:.4g}" in lines[0] and lines[0].endswith("consistent")


def test_the_audit_takes_the_runs_rounds_and_the_authors_nominal_epsilon(audit_cli, tmp_path: Path,
                                                                         capsys) -> None:
    """Without audit.rounds the canary takes part in every round of the run; under the authors' conventions the
    headline gives their nominal ε beside the accountant's."""
    out = tmp_path / "authors"
    audit_cli(*SMALL, "privacy=laplace", "privacy.conventions=authors", f"hydra.run.dir={out}")
    record = json.loads((out / "audit.json").read_text())
    assert "4 rounds" in record["threat_model"] and "authors conventions" in record["threat_model"]
    assert record["epsilon_nominal"] == pytest.approx(2.0)
    assert record["epsilon_reported"] > record["epsilon_nominal"]  # each ω tensor and row is noised alone
    assert "nominal ε = 2 (accountant: " in capsys.readouterr().out


def test_a_server_placed_run_is_audited_with_a_sampled_canary(audit_cli, tmp_path: Path) -> None:
    """privacy.placement=server: the server's clipped sum and one noise draw, the canary sampled at the strategy's
    rate, against the subsampled accountant's ε for the audited rounds (below the run's total)."""
    out = tmp_path / "server"
    audit_cli(*SMALL, "privacy.placement=server", "strategy.participation=poisson", "strategy.sample_rate=0.5",
              "audit.rounds=2", f"hydra.run.dir={out}")
    record = json.loads((out / "audit.json").read_text())
    assert "server-placed" in record["threat_model"] and "q=0.5" in record["threat_model"]
    assert "2 rounds" in record["threat_model"]
    assert 0.0 < record["epsilon_reported"] < 2.0 and not record["exceeds"]


@pytest.mark.parametrize("override,message", [
    ("audit.confidence=1.5", "audit.confidence"),
    ("audit.confidence=0", "audit.confidence"),
    ("audit.trials=5", "trials=5 is too few for confidence=0.95"),
    ("audit.trials=1e12", "audit.trials: the run needs about"),
    ("audit.rows=-1", "audit.rows"),
    ("privacy=none", "privacy: python -m fedrec.app.audit_cli audits the client-level DP"),
])
def test_bad_values_are_one_error_line(audit_cli, tmp_path: Path, capsys, override: str, message: str) -> None:
    args = BASE if override.startswith("privacy=") else SMALL
    with pytest.raises(SystemExit) as e:
        audit_cli(*args, override, f"hydra.run.dir={tmp_path / 'bad'}")
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not (tmp_path / "bad" / "audit.json").exists()


def test_a_noise_schedule_is_refused_naming_it(audit_cli, tmp_path: Path, capsys) -> None:
    """The server-placement audit draws every round at one noise multiplier: a scheduled run (its config read
    through Hydra's list) is one error line."""
    with pytest.raises(SystemExit) as e:
        audit_cli(*SMALL, "privacy.placement=server", "strategy.participation=poisson", "strategy.sample_rate=0.5",
                  "privacy.noise_schedule=[2,1,1,1]", f"hydra.run.dir={tmp_path / 'bad'}")
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "without privacy.noise_schedule" in err[0]


def test_a_bandit_run_is_refused_with_a_pointer_to_the_script(audit_cli, tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        audit_cli("+experiment=gossip_synthetic_k3", "privacy.epsilon=1", f"hydra.run.dir={tmp_path}")
    assert "scripts/audit_privacy.py" in capsys.readouterr().err


def test_python_dash_m_fedrec_audit_runs(tmp_path: Path) -> None:
    out = tmp_path / "sub"
    proc = subprocess.run([sys.executable, "-m", "fedrec.app.audit_cli", *SMALL, "audit.rounds=1",
                           f"hydra.run.dir={out}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr
    assert "ε ≥" in proc.stdout and (out / "audit.json").is_file()


@pytest.mark.slow
def test_the_audit_script_writes_one_row_per_audit(tmp_path: Path) -> None:
    out = tmp_path / "table"
    proc = subprocess.run([sys.executable, "scripts/audit_privacy.py", "--scale", "0.01", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env=os.environ.copy())
    assert proc.returncode == 0, proc.stderr
    with open(out.with_suffix(".csv"), newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 18 and {r["trials per input"] for r in rows} == {"1,000", "10,000"}
    for r in rows:  # sound: no bound above the ε the accountant reports (the exact ε for the textbook mechanisms)
        reported = r["stated ε"].split()[0] if r["accountant ε"] == "exact" else r["accountant ε"]
        assert float(r["ε lower bound (95%)"]) <= float(reported), r
        assert r["verdict"] != "**exceeds the accountant's ε**", r
    assert out.with_suffix(".md").read_text(encoding="utf-8").count("\n| ") == 18

"""The fedgnn_* experiment configs end to end through the CLI: run directory, summary fields, DP resume, errors."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedrec.app.cli import run
from fedrec.errors import ConfigError, DatasetNotFoundError
from tests.helpers import ALL_EXPERIMENTS, FEDREC_PREFIXES, PNG_MAGIC, quick_command_line, read_csv, write_ml1m

FEDREC_EXPERIMENTS = [e for e in ALL_EXPERIMENTS if e.startswith(FEDREC_PREFIXES)]
QUICK = ("task.rounds=3", "logger.tensorboard=false")
SUMMARY = {"final_test_rmse", "final_test_mae", "final_test_f1", "best_test_rmse", "best_test_rmse_round",
           "best_test_f1", "epsilon_spent", "delta", "rounds_run", "comm_messages", "comm_upload_scalars",
           "wall_seconds", "privacy"}
#: an implicit-feedback run's: ranking metrics instead of the rating ones
IMPLICIT_SUMMARY = {"final_test_hr@10", "final_test_ndcg@10", "final_test_mrr", "best_test_ndcg@10",
                    "best_test_ndcg@10_round", "epsilon_spent", "delta", "rounds_run", "comm_messages",
                    "comm_upload_scalars", "wall_seconds", "privacy"}


@pytest.fixture(scope="module")
def ml1m_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ML-1M is not shipped: a small file in its format, with enough users for 605 clients."""
    return write_ml1m(tmp_path_factory.mktemp("ml1m_data"), users=700, items=120)


@pytest.mark.parametrize("experiment", FEDREC_EXPERIMENTS)
def test_fedrec_experiment_runs_end_to_end(compose_cfg, data_dir: Path, ml1m_dir: Path, tmp_path: Path,
                                           experiment: str) -> None:
    """Each experiment's documented short recipe (quick=true) runs: 3 rounds, 8 for a planner (its initial stage
    (2+1)·2 = 6 rounds, then 2 planned ones); the synthetic world shrunk to 70 clients from ML-1M's size."""
    where = ml1m_dir if "_ml1m" in experiment else data_dir
    extra = experiment.startswith("bgtplanner_")
    small = experiment.endswith("_synthetic")
    cfg = compose_cfg(*quick_command_line(experiment, where))
    implicit = cfg.data._target_ == "fedrec.data.load_implicit"  # the experiment's data, whatever its name
    metric, best = ("test_ndcg@10", max) if implicit else ("test_rmse", min)
    assert cfg.task.rounds == (8 if extra else 3)
    out = tmp_path / "run"
    summary = run(cfg, output_dir=out)
    fields = IMPLICIT_SUMMARY if implicit else SUMMARY
    assert fields <= set(summary), fields - set(summary)
    assert json.loads((out / "summary.json").read_text()) == summary
    rounds = 3
    if extra:  # a planner may end the run when no level is affordable any more
        rounds = summary["rounds_run"]
        assert rounds == 8 or (summary["planner_stopped_for_budget"] and rounds >= 6)
    assert summary["rounds_run"] == rounds and summary["experiment"] == experiment
    rows = read_csv(out / "metrics.csv")
    assert len(rows) == rounds and float(rows[-1][metric]) == summary[f"final_{metric}"]
    assert best(float(r[metric]) for r in rows) == summary[f"best_{metric}"]
    if not implicit:
        assert max(float(r["test_f1"]) for r in rows) == summary["best_test_f1"]
    assert (out / f"{metric.replace('@', '')}.png").read_bytes()[:8] == PNG_MAGIC
    if experiment.endswith("_dp") or extra:
        assert summary["privacy"] == "gaussian" and summary["delta"] == 1e-5
        assert 0 < summary["epsilon_spent"] <= summary["epsilon_total"] == 10.0
    else:
        assert summary["privacy"] == "none" and summary["epsilon_spent"] is None
    if extra:
        assert summary["planner"] == "bgtplanner" and summary["planner_rounds"] == rounds
        assert sum(summary["planner_action_counts"]) == rounds
    if experiment.endswith("_ml1m"):
        assert summary["clients"] == 605
    if experiment.endswith("_ml1m_implicit"):
        assert summary["clients"] == 700  # one per user
    if small:
        assert summary["clients"] == 70


def test_dp_run_resumed_through_the_cli_matches(compose_cfg, data_dir: Path, tmp_path: Path) -> None:
    ov = ("+experiment=fedgnn_ml100k_dp", f"data_dir={data_dir}", "task.rounds=4", "plots=false",
          "logger.tensorboard=false", "privacy=laplace", "privacy.epsilon=2")
    full = run(compose_cfg(*ov), output_dir=tmp_path / "full")
    run(compose_cfg(*ov, "trainer.max_rounds=2"), output_dir=tmp_path / "part")
    resumed = run(compose_cfg(*ov, f"ckpt_path={tmp_path / 'part' / 'checkpoints' / 'last.ckpt'}"),
                  output_dir=tmp_path / "resumed")
    strip = lambda s: {k: v for k, v in s.items() if k != "wall_seconds"}
    assert strip(resumed) == strip(full)
    assert resumed["privacy"] == "laplace" and resumed["epsilon_spent"] <= 2.0
    assert read_csv(tmp_path / "resumed" / "metrics.csv") == read_csv(tmp_path / "full" / "metrics.csv")


@pytest.mark.parametrize("planner", ["uniform", "adpml", "adap", "bgtplanner"])
@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_every_planner_and_mechanism_runs(compose_cfg, data_dir: Path, tmp_path: Path, planner: str,
                                          mechanism: str) -> None:
    """The quick recipe under every planner: its planner.* entries apply to BGTplanner and are left out for the
    others, which have no such fields."""
    cfg = compose_cfg(*quick_command_line("bgtplanner_ml100k", data_dir, "plots=false", f"planner={planner}",
                                          f"privacy={mechanism}"))
    summary = run(cfg, output_dir=tmp_path)
    assert summary["planner"] == planner and summary["privacy"] == mechanism
    assert 0 < summary["epsilon_spent"] <= 10.0 and summary["delta"] == (1e-5 if mechanism == "gaussian" else 0.0)
    assert summary["rounds_run"] == summary["planner_rounds"]
    assert summary["rounds_run"] == 8 or (summary["planner_stopped_for_budget"] and summary["rounds_run"] >= 6)
    assert summary["planner_seconds_per_round"] > 0


@pytest.mark.parametrize(("override", "field"), [
    ("privacy.epsilon=0", "privacy.epsilon"),
    ("privacy.epsilon=-2", "privacy.epsilon"),
    ("privacy.delta=0", "privacy.delta"),
    ("privacy.delta=1.5", "privacy.delta"),
    ("privacy.clip=0", "privacy.clip"),
    ("privacy.rdp_alpha=2", "privacy.rdp_alpha"),
    ("task.rounds=0", "rounds"),
    ("task.pseudo_items=-1", "task.pseudo_items"),
    ("task.lr=0", "task.lr"),
    ("model.embed_dim=0", "model.embed_dim"),
    ("aggregator=fedavg", None),  # a valid choice: must not raise (checked below)
    ("planner=bgtplanner", "data.val_fraction"),  # the planner's reward needs a validation split
])
def test_bad_fedrec_values_are_named(compose_cfg, data_dir: Path, tmp_path: Path, override: str, field) -> None:
    cfg = compose_cfg("+experiment=fedgnn_ml100k_dp", f"data_dir={data_dir}", "task.rounds=1", "plots=false",
                      "logger.tensorboard=false", override)
    if field is None:
        assert run(cfg, output_dir=tmp_path)["aggregator"] == "FedAvg"
        return
    with pytest.raises(ConfigError) as info:
        run(cfg, output_dir=tmp_path)
    assert re.search(re.escape(field), str(info.value)), str(info.value)
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize(("override", "field"), [
    ("planner.num_actions=1", "planner.num_actions"),
    ("planner.initial_rounds=0", "planner.initial_rounds"),
    ("planner.min_rounds=101", "planner.min_rounds"),
    ("privacy.epsilon=0", "privacy.epsilon"),
    ("planner.rate=1.5", "planner.rate"),
])
def test_bad_planner_values_are_named(compose_cfg, data_dir: Path, tmp_path: Path, override: str, field: str) -> None:
    planner = "adpml" if "rate" in override else "bgtplanner"
    cfg = compose_cfg("+experiment=bgtplanner_ml100k", f"data_dir={data_dir}", "plots=false", f"planner={planner}",
                      "logger.tensorboard=false", override)
    with pytest.raises(ConfigError, match=re.escape(field)):
        run(cfg, output_dir=tmp_path)
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize(("experiment", "path"), [("fedgnn_ml100k", "ml-100k/u.data"),
                                                  ("fedgnn_filmtrust", "filmtrust/ratings.txt"),
                                                  ("fedgnn_ml1m", "ml-1m/ratings.dat")])
def test_missing_rating_file_names_the_path(compose_cfg, tmp_path: Path, experiment: str, path: str) -> None:
    cfg = compose_cfg(f"+experiment={experiment}", f"data_dir={tmp_path / 'empty'}", *QUICK)
    with pytest.raises(DatasetNotFoundError, match=re.escape(str(tmp_path / "empty" / path))):
        run(cfg, output_dir=tmp_path / "run")

"""quick=true: each experiment's short recipe expanded into ordinary overrides (fedrec.app.presets)."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from fedrec.app.presets import expand_quick
from fedrec.errors import ConfigError

CONF = Path(__file__).resolve().parents[1] / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))


def recipe(experiment: str) -> list[str]:
    """The recipe as the experiment file states it (read directly, not through the expansion)."""
    path = CONF / ("config.yaml" if experiment == "quickstart" else f"experiment/{experiment}.yaml")
    return list(OmegaConf.load(path).quick_recipe)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_states_a_recipe_that_is_appended(experiment: str) -> None:
    argv = [f"+experiment={experiment}", "quick=true"]
    assert recipe(experiment), f"{experiment} has no quick_recipe"
    assert expand_quick(CONF, argv) == [*argv, *recipe(experiment)]


def test_without_quick_the_command_line_is_unchanged() -> None:
    for argv in (["+experiment=fclub_synthetic"], ["+experiment=fclub_synthetic", "quick=false"], []):
        assert expand_quick(CONF, argv) == argv


def test_a_field_the_command_line_sets_keeps_its_value() -> None:
    argv = ["+experiment=async_linucb_synthetic", "task.steps=50", "quick=true"]
    expanded = expand_quick(CONF, argv)
    assert expanded == [*argv, "task.steps_per_round=100", "replicates=1", "env.num_clients=20"]


def test_entries_for_fields_the_run_does_not_have_are_left_out() -> None:
    """BGTplanner's recipe shortens its planner; under planner=uniform only the rounds remain."""
    argv = ["+experiment=bgtplanner_ml100k", "planner=uniform", "quick=true"]
    assert expand_quick(CONF, argv) == [*argv, "task.rounds=8"]
    argv = ["+experiment=bgtplanner_ml100k", "quick=true"]
    assert expand_quick(CONF, argv)[2:] == ["task.rounds=8", "planner.num_actions=2", "planner.initial_rounds=2",
                                            "planner.min_rounds=6"]


def test_the_default_experiment_has_a_recipe() -> None:
    assert expand_quick(CONF, ["quick=true"]) == ["quick=true", *recipe("quickstart")]


def test_a_sweep_over_experiments_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"quick=true: \+experiment=fclub_synthetic,gossip_diabetes sweeps"):
        expand_quick(CONF, ["-m", "+experiment=fclub_synthetic,gossip_diabetes", "quick=true"])


def test_a_bad_switch_is_refused_by_the_schema() -> None:
    with pytest.raises(ConfigError, match="quick: must be true or false, got 'yes please'"):
        expand_quick(CONF, ["quick=yes please"])


def test_train_py_records_the_recipe_as_overrides(train_py, tmp_path: Path) -> None:
    """The run is an ordinary run of the expanded command line: Hydra records the recipe among its overrides."""
    out = tmp_path / "run"
    train_py("quick=true", "plots=false", "logger.tensorboard=false", f"hydra.run.dir={out}")
    recorded = OmegaConf.load(out / ".hydra" / "overrides.yaml")
    assert list(recorded)[-3:] == recipe("quickstart")
    assert OmegaConf.load(out / "config_resolved.yaml").task.steps == 200


def test_a_sweep_over_a_group_takes_the_entries_all_its_options_have() -> None:
    """planner=uniform has no planner.min_rounds: the command line of a sweep over planners takes only the rounds,
    whichever option comes first (each bgtplanner job takes the rest, see the next test)."""
    for planners in ("planner=uniform,bgtplanner", "planner=bgtplanner,uniform"):
        argv = ["-m", "+experiment=bgtplanner_ml100k", planners, "quick=true"]
        assert expand_quick(CONF, argv) == [*argv, "task.rounds=8"]


def test_a_quick_sweep_over_planners_runs_each_job_with_its_planners_recipe(train_py, tmp_path: Path) -> None:
    """The README's BGTplanner sweep with quick=true: the bgtplanner job takes planner.min_rounds=6 and the rest of
    the recipe for its own planner, which uniform does not have (it used to keep T_min = 70 > 8 rounds and fail)."""
    out = tmp_path / "sweep"
    train_py("-m", "+experiment=bgtplanner_ml100k", "planner=uniform,bgtplanner", "quick=true", "plots=false",
             "logger.tensorboard=false", f"hydra.sweep.dir={out}")
    with open(out / "summary.csv", newline="") as f:
        jobs = {dict(o.split("=", 1) for o in row["overrides"].split())["planner"]: row for row in csv.DictReader(f)}
    assert {planner: row["status"] for planner, row in jobs.items()} == {"uniform": "ok", "bgtplanner": "ok"}
    configs = {planner: OmegaConf.load(out / row["job"] / "config_resolved.yaml") for planner, row in jobs.items()}
    assert configs["bgtplanner"].task.rounds == configs["uniform"].task.rounds == 8
    planner = configs["bgtplanner"].planner
    assert (planner.num_actions, planner.initial_rounds, planner.min_rounds) == (2, 2, 6)
    assert "min_rounds" not in configs["uniform"].planner

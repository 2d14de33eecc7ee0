"""What a newcomer meets first: ``quick=true`` with Hydra's inspection flags, quick runs that differ and say what
their numbers mean, and refusals whose way out works."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from fedrec.app.presets import expand_quick, quick_notes
from fedrec.errors import ConfigError
from fedrec.trainer.checkpoint import check_same_run

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"


def test_quick_with_cfg_job_prints_the_jobs_config_with_the_recipe(
    train_py: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``train.py quick=true --cfg job`` prints the composed job config as Hydra does (the recipe applied), and
    runs nothing."""
    monkeypatch.chdir(tmp_path)
    assert expand_quick(CONF, ["quick=true", "--cfg", "job"]) == [
        "quick=true", "task.steps=200", "task.steps_per_round=100", "env.num_clients=50", "--cfg", "job"]
    train_py("quick=true", "--cfg", "job")
    printed = OmegaConf.create(capsys.readouterr().out)
    assert (printed.task.steps, printed.env.num_clients, printed.quick) == (200, 50, True)
    assert "hydra" not in printed and not any(tmp_path.iterdir())


def test_the_default_quick_run_is_not_async_linucb_synthetics() -> None:
    runs = [expand_quick(CONF, argv)[len(argv):] for argv in (["quick=true"],
                                                              ["+experiment=async_linucb_synthetic", "quick=true"])]
    assert runs == [["task.steps=200", "task.steps_per_round=100", "env.num_clients=50"],
                    ["task.steps=200", "task.steps_per_round=100", "replicates=1", "env.num_clients=20"]]


@pytest.mark.parametrize(("quick", "ari", "noted"), [(True, 0.0, True), (True, 0.5, False), (False, 0.0, False),
                                                     (True, None, False)])
def test_a_quick_run_says_that_its_ari_of_0_is_the_recipes(quick: bool, ari: float | None, noted: bool) -> None:
    summary = {"cumulative_regret": 45.7} if ari is None else {"ari": ari}
    notes = quick_notes(OmegaConf.create({"quick": quick}), summary)
    assert notes == (["quick=true: ari = 0 because the recipe ends before the clusters form (a run of seconds); the "
                      "full run (without quick=true) measures the clustering"] if noted else [])


def _identity(seed: int, data: str, lr: float) -> dict[str, Any]:
    config = {"seed": seed, "data_files": {"ml-100k/u.data": data}, "task": {"lr": lr}}
    return {"task_class": "T", "config": config, "config_hash": str(config), "sizes": {}, "fedrec_version": "1"}


@pytest.mark.parametrize(("current", "hint"), [
    (_identity(0, "b", 0.1), "Resume it with the run's own data_files (resume_allow_changes cannot take it), or "
                             "start a new run"),
    (_identity(1, "b", 0.1), "Resume it with the run's own seed and data_files (resume_allow_changes cannot take "
                             "them), or start a new run"),
    (_identity(1, "b", 0.2), "Resume it with its run's settings, or name the fields meant to change in "
                             "resume_allow_changes (not seed or data_files, which cannot change)"),
    (_identity(0, "a", 0.2), "Resume it with its run's settings, or name the fields meant to change in "
                             "resume_allow_changes"),
])
def test_a_refused_resume_names_a_way_out_that_works(current: dict[str, Any], hint: str) -> None:
    """``resume_allow_changes`` refuses the seed and the data files, so a refusal over them does not suggest it."""
    with pytest.raises(ConfigError) as info:
        check_same_run("last.ckpt", _identity(0, "a", 0.1), current)
    assert str(info.value).startswith("ckpt_path: last.ckpt is a checkpoint of another run, differing in ")
    assert str(info.value).endswith(f". {hint}")


def test_a_failed_run_leaves_no_empty_outputs_folder(
    train_py: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that fails in its first round, into Hydra's default ``outputs/NAME/DATE/``: the run folder goes, and so
    do the ``outputs/NAME/`` and ``outputs/`` it made; a folder that was there before stays."""
    monkeypatch.chdir(tmp_path)
    small = ("+experiment=fedgnn_synthetic", "task.rounds=2", "data.users=100", "data.items=50", "data.ratings=1000",
             "data.num_clients=10", "task.pseudo_items=5", "plots=false", "logger.tensorboard=false",
             "aggregator=fedavg", "task.prox_mu=1e12")
    for before in ([], ["outputs"]):
        for folder in before:
            (tmp_path / folder).mkdir()
        with pytest.raises(SystemExit) as info:
            train_py(*small)
        assert info.value.code == 2 and "error: task.prox_mu: round 0:" in capsys.readouterr().err
        assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_resuming_a_finished_run_into_another_folder_is_refused(
    train_py: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """It would run no round and only copy the finished run's results into a new folder: one ``error:`` line naming
    where they are and how to run on, exit code 2, no folder made."""
    short = ("task.steps=200", "task.steps_per_round=100", "env.num_clients=20", "plots=false",
             "logger.tensorboard=false")
    train_py(*short, f"hydra.run.dir={tmp_path / 'done'}")
    ckpt = tmp_path / "done" / "checkpoints" / "last.ckpt"
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        train_py(*short, f"ckpt_path={ckpt}", f"hydra.run.dir={tmp_path / 'copy'}")
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: ckpt_path: {ckpt} holds a finished run (2 rounds, of 2), so the resume would run no round and only "
        f"copy its results into {tmp_path / 'copy'}; they are in {tmp_path / 'done'}. To run it on, lengthen it (e.g. "
        "task.rounds or task.steps, named in resume_allow_changes)"]
    assert not (tmp_path / "copy").exists()


def test_a_slurm_sweep_without_srun_is_one_error_line(
    train_py: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """submitit would raise its ``Could not detect "srun"`` with a traceback, after Hydra made the sweep folder."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun on it (the tests' machine may be a SLURM node)
    with pytest.raises(SystemExit) as info:
        train_py("-m", "hydra/launcher=slurm", "seed=0,1", f"hydra.sweep.dir={tmp_path / 'sweep'}")
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: hydra/launcher: the SLURM launcher submits with srun, and this machine has none (not a node of a SLURM "
        "cluster); submit the sweep from the cluster's login node, or run it here with hydra/launcher=joblib"]
    assert not (tmp_path / "sweep").exists()

"""Sweeps on Hydra's joblib and submitit launchers (the ``cluster`` extra): a 2-job sweep run by joblib in two worker
processes, and by submitit's local executor as subprocesses (the code path of ``hydra/launcher=slurm``), gives the
same job results and the same sweep summary as a serial sweep; the ready SLURM config composes and renders a valid
batch script without a cluster. The launchers are part of the test environment (scripts/setup.sh installs the
extra), so a missing one fails here instead of being skipped."""
from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import DictConfig

from fedrec.app.sweeps import job_folders, without_timings

ROOT = Path(__file__).resolve().parents[1]
#: the fastest sweep there is (a run is mostly start-up): two seeds of the quick default experiment, 200 steps
SWEEP = ["+experiment=quickstart", "task.steps=200", "task.steps_per_round=100", "seed=0,1",
         "logger.tensorboard=false", "plots=false"]
LAUNCHERS = {
    "basic": [],
    "joblib": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
    "submitit_local": ["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5"],
}
PLUGINS = ("hydra_plugins.hydra_joblib_launcher", "hydra_plugins.hydra_submitit_launcher")


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, Path]]:
    """The sweep run by each launcher: (exit code, stderr, sweep folder). The three are started together, as they
    are independent (on a loaded machine that shortens the wait); their output goes to files, not pipes."""
    root = tmp_path_factory.mktemp("launchers")
    started = {}
    try:
        for name, launcher in LAUNCHERS.items():
            cmd = [sys.executable, str(ROOT / "train.py"), "-m", *SWEEP, *launcher, f"hydra.sweep.dir={root / name}"]
            with open(root / f"{name}.out", "w") as out, open(root / f"{name}.err", "w") as err:
                started[name] = subprocess.Popen(cmd, cwd=root, stdout=out, stderr=err)
        for proc in started.values():
            proc.wait(timeout=300)
    finally:
        for proc in started.values():
            proc.kill()  # a no-op for those that ended
    return {name: (proc.returncode, (root / f"{name}.err").read_text(), root / name)
            for name, proc in started.items()}


def job_results(sweep: Path) -> dict[str, tuple[list[str], dict[str, Any]]]:
    """Each job folder of a sweep: its overrides and its summary.json without timings."""
    return {job.name: (yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()),
                       without_timings(json.loads((job / "summary.json").read_text())))
            for job in job_folders(sweep)}


@pytest.mark.parametrize("plugin", PLUGINS)
def test_the_cluster_extra_is_installed(plugin: str) -> None:
    try:
        importlib.import_module(plugin)
    except ImportError as e:  # pragma: no cover - the failure this test exists for
        pytest.fail(f"{plugin} is missing: install the cluster extra (pip install -e '.[cluster]'): {e}")


@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_a_two_job_sweep_equals_the_serial_sweep(sweeps: dict[str, tuple[int, str, Path]], launcher: str) -> None:
    code, stderr, serial = sweeps["basic"]
    assert code == 0, stderr
    code, stderr, sweep = sweeps[launcher]
    assert code == 0, stderr
    assert "Traceback" not in stderr and "sweep: 2 of 2 jobs finished" in stderr
    expected = job_results(serial)
    assert sorted(expected) == ["0", "1"]
    assert [[o for o in overrides if o.startswith("seed=")] for overrides, _ in expected.values()] == [["seed=0"],
                                                                                                     ["seed=1"]]
    assert job_results(sweep) == expected
    for job in expected:  # the per-round metrics as well
        assert (sweep / job / "metrics.csv").read_text() == (serial / job / "metrics.csv").read_text()
    # the sweep summary, written by the callback in the launching process from the jobs' folders
    for table in ("summary.csv", "summary.md"):
        assert (sweep / table).read_text() == (serial / table).read_text(), table


def test_the_slurm_config_composes_and_renders_a_batch_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              compose_cfg: Callable[..., DictConfig]) -> None:
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf
    from submitit import AutoExecutor

    cfg = compose_cfg("hydra/launcher=slurm", "hydra.launcher.partition=cpu", f"hydra.sweep.dir={tmp_path}",
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.timeout_min, launcher.cpus_per_task, launcher.array_parallelism) == (60, 1, 32)
    # submitit checks every parameter's name and renders sbatch's options; it only needs an `srun` to exist
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text("#!/bin/sh\nexit 1\n")
    (fake / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    params = OmegaConf.to_container(launcher, resolve=False)
    for key in ("_target_", "submitit_folder", "max_num_timeout", "name"):
        params.pop(key)
    shared = set(OmegaConf.structured(BaseQueueConf).keys())  # the launcher passes the others as slurm_NAME
    executor = AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    executor.update_parameters(**{k if k in shared else f"slurm_{k}": v for k, v in params.items()})
    script = executor._executor._make_submission_file_text("python -m train", "uid")
    for line in ("#SBATCH --partition=cpu", "#SBATCH --cpus-per-task=1", "#SBATCH --time=60", "#SBATCH --mem=4GB",
                 "export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK"):
        assert line in script, line

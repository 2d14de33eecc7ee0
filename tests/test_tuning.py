"""Searches with Hydra's Optuna sweeper (the ``tune`` extra): the command-line check accepts its ranges, each trial
runs with its own value, and the number the sweeper optimises is the validation metric at the selected round,
never a test figure."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from fedrec.app.sweeps import objective

ROOT = Path(__file__).resolve().parent.parent


def test_the_objective_is_the_selected_validation_metric_when_there_is_one() -> None:
    summary = {"final_test_rmse": 0.3, "selected_on": "val_rmse", "selected_val_rmse": 0.25,
               "selected_test_rmse": 0.31}
    assert objective(summary) == 0.25
    assert objective({"final_test_rmse": 0.3}) == 0.3  # no validation split: the run's main result
    assert math.isnan(objective({"steps": 3}))


def test_an_optuna_search_runs_its_trials_and_optimises_validation(tmp_path: Path, data_dir: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep = tmp_path / "search"
    done = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "-m", "+experiment=fedgnn_synthetic", "quick=true",
         f"data_dir={data_dir}", "data.val_fraction=0.2", "plots=false", "logger.tensorboard=false",
         "hydra/sweeper=optuna", "hydra.sweeper.n_trials=3", "hydra.sweeper.n_jobs=1",
         "hydra.sweeper.sampler.seed=0", "task.lr=interval(0.001,0.1)", f"hydra.sweep.dir={sweep}"],
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summaries = [json.loads((sweep / str(j) / "summary.json").read_text()) for j in range(3)]
    lrs = [OmegaConf.load(sweep / str(j) / "config_resolved.yaml").task.lr for j in range(3)]
    assert len(set(lrs)) == 3 and all(0.001 <= lr <= 0.1 for lr in lrs)  # three trials, three settings
    assert all(s["selected_on"] == "val_rmse" for s in summaries)
    reported = re.search(r"Best value: ([0-9.e-]+)", done.stdout + done.stderr)
    assert reported and float(reported.group(1)) == min(s["selected_val_rmse"] for s in summaries)
    assert float(reported.group(1)) != min(s["final_test_rmse"] for s in summaries)

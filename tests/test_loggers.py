"""Loggers from the config: today's CSV and TensorBoard files unchanged, the resolved config logged as
hyper-parameters (TensorBoard's HParams view, MLflow's params), MLflow from ``logger=mlflow`` and the jobs of a
multirun named by what they sweep."""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Callable

import pytest

from fedrec.app.cli import PublicMetricsLogger, run, sweep_job_name, takes_metrics
from fedrec.errors import ConfigError
from tests.helpers import Compose, read_csv

#: a 4-round bandit run
BANDIT = ("task.steps=400", "env.num_clients=20", "env.dim=5", "env.num_arms=5", "plots=false")
HAS_MLFLOW = all(importlib.util.find_spec(m) for m in ("mlflow", "pytorch_lightning", "sqlalchemy", "alembic"))


def hparams_of(tb_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """The hyper-parameters and the metric tags of the HParams view in the TensorBoard events under ``tb_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(tb_dir))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"])
    params = {k: getattr(v, v.WhichOneof("kind")) for k, v in start.session_start_info.hparams.items()}
    return params, [m.name.tag for m in experiment.experiment.metric_infos]


def scalars(tb_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tb_dir))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


# ------------------------------------------------------------------------------------------------ today's loggers
def test_default_run_writes_todays_files_and_the_config_to_tensorboard(compose_cfg: Compose, tmp_path: Path) -> None:
    """The default loggers write metrics.csv and tb/ as before (no other file), and the HParams view shows the
    resolved config with dotted keys and the run's headline as summary/* (beside, not on, the per-round curves)."""
    out = tmp_path / "run"
    summary = run(compose_cfg(*BANDIT), output_dir=out)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert [f for f in files if "tfevents" not in f] == ["checkpoints/last.ckpt", "config_resolved.yaml",
                                                          "metrics.csv", "summary.json"]
    assert [Path(f).parent for f in files if "tfevents" in f] == [Path("tb")]
    params, metric_tags = hparams_of(out / "tb")
    assert params["task.steps"] == 400 and params["env.dim"] == 5 and params["seed"] == 0
    assert params["protocol._target_"] == "fedrec.protocols.AsyncLinUCB" and params["logger.csv"] == 1
    assert sorted(metric_tags) == ["summary/comm_messages", "summary/cumulative_regret", "summary/rounds_run"]
    assert scalars(out / "tb", "summary/cumulative_regret")[0][1] == pytest.approx(summary["cumulative_regret"])
    assert scalars(out / "tb", "summary/rounds_run")[0][1] == 4
    rounds = read_csv(out / "metrics.csv")
    assert [step for step, _ in scalars(out / "tb", "cumulative_regret")] == list(range(len(rounds))) == [0, 1, 2, 3]


def test_a_named_run_logs_to_its_own_tensorboard_folder(compose_cfg: Compose, tmp_path: Path) -> None:
    run(compose_cfg(*BANDIT, "logger.run_name=baseline", "logger.csv=false"), output_dir=tmp_path)
    assert [p.parent.name for p in (tmp_path / "tb").rglob("events.out.tfevents.*")] == ["baseline"]
    assert not (tmp_path / "metrics.csv").exists()
    assert hparams_of(tmp_path / "tb" / "baseline")[0]["logger.run_name"] == "baseline"


class Recording:
    """A logger that keeps what it is given; ``log_hyperparams`` takes metrics as TensorBoard's does."""

    def __init__(self) -> None:
        self.hparams: list[tuple[dict[str, Any], dict[str, float] | None]] = []

    def log_hyperparams(self, params: dict[str, Any], metrics: dict[str, float] | None = None) -> None:
        self.hparams.append((params, metrics))


def test_hidden_private_metrics_stay_out_of_the_hyperparameter_metrics() -> None:
    inner = Recording()
    public = PublicMetricsLogger(inner, is_private=lambda name: name.startswith(("test_", "final_test_")))
    public.log_hyperparams({"seed": 0}, metrics={"summary/final_test_rmse": 0.9, "summary/comm_messages": 12.0})
    public.log_hyperparams({"seed": 0})
    assert inner.hparams == [({"seed": 0}, {"summary/comm_messages": 12.0}), ({"seed": 0}, None)]
    assert takes_metrics(public) and takes_metrics(inner)

    class ParamsOnly:  # MLflow's and W&B's loggers take the params alone, at the start
        def log_hyperparams(self, params: dict[str, Any]) -> None: ...

    assert not takes_metrics(ParamsOnly()) and not takes_metrics(PublicMetricsLogger(ParamsOnly(), bool))


def test_an_extra_logger_must_be_a_logger(compose_cfg: Compose, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^logger\.extra\[0\]: ProgressBar is not a Lightning logger"):
        run(compose_cfg(*BANDIT, "logger.extra=[{_target_:fedrec.trainer.ProgressBar}]"), output_dir=tmp_path)


# ------------------------------------------------------------------------------------------------ sweep job names
@pytest.mark.parametrize(("job", "sweep", "name"), [
    (["+experiment=x", "seed=1", "task.lr=0.1", "quick=true"], ["+experiment=x", "seed=0,1", "task.lr=0.1,0.2",
                                                                "quick=true"], "seed=1,task.lr=0.1"),
    (["privacy=gaussian", "seed=2"], ["seed=range(0,3)", "privacy=gaussian,laplace"], "seed=2,privacy=gaussian"),
    (["+experiment=x", "seed=1"], ["+experiment=x", "seed=1"], ""),  # nothing swept
])
def test_a_sweep_job_is_named_by_what_the_sweep_varies(job: list[str], sweep: list[str], name: str) -> None:
    assert sweep_job_name(job, sweep) == name


# ------------------------------------------------------------------------------------------------ MLflow, W&B
@pytest.mark.skipif(not HAS_MLFLOW, reason="needs the mlflow extra (pip install -e '.[mlflow]')")
def test_multirun_logs_to_mlflow_under_the_job_names(train_py: Callable[..., Any], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``-m seed=0,1 logger=mlflow``: each job records its metrics and its config's params in an MLflow store in its
    folder, as a finished run named ``seed=N``, and its TensorBoard events in tb/seed=N/ (job folders keep their
    numbers)."""
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.chdir(tmp_path)  # nothing may land in the working directory
    sweep = tmp_path / "sweep"
    train_py("-m", "seed=0,1", "logger=mlflow", *BANDIT, f"hydra.sweep.dir={sweep}")
    for seed in (0, 1):
        job = sweep / str(seed)
        assert [p.parent.relative_to(job) for p in job.glob("tb/**/events.out.tfevents.*")] == [Path(f"tb/seed={seed}")]
        client = MlflowClient(f"sqlite:///{job / 'mlflow.db'}")
        (found,) = client.search_runs([client.get_experiment_by_name("quickstart").experiment_id])
        assert found.info.run_name == f"seed={seed}" and found.info.status == "FINISHED"
        params = found.data.params
        assert (params["seed"] == str(seed) and params["task.steps"] == "400"
                and params["logger.run_name"] == f"seed={seed}")
        history = client.get_metric_history(found.info.run_id, "cumulative_regret")
        logged = read_csv(job / "metrics.csv")
        assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == \
            [(int(row["step"]), float(row["cumulative_regret"])) for row in logged]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep"]


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_a_missing_logger_package_is_one_error_line(train_py: Callable[..., Any], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        train_py("logger=wandb", *BANDIT, f"hydra.run.dir={tmp_path / 'run'}")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: logger.extra[0]: ") and "pip install -e '.[mlflow]' or '.[wandb]'" in err[-1]

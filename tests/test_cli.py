"""The Hydra CLI: every experiment config runs end to end, run directories, resume, train.py, bad input.

Most runs are in-process, through Hydra's compose API and :func:`fedrec.app.cli.run`, or through ``train.main()``
itself with a patched ``sys.argv`` (Hydra's real command-line path, without paying the ~3 s ``import lightning_fabric``
of a new interpreter). One real ``python train.py -m ...`` subprocess covers the script entry point and a
multirun sweep; it starts with the module's first test so that it overlaps with the in-process tests.
"""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from hydra.errors import MissingConfigException
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from fedrec.app.cli import run
from fedrec.errors import ConfigError, DatasetNotFoundError
from fedrec.utils.io import strict_json
from tests.helpers import (
    ALL_EXPERIMENTS,
    FEDREC_PREFIXES,
    PNG_MAGIC,
    ROOT,
    Compose,
    event_tags,
    quick_command_line,
    read_csv,
)

#: experiments on data that is not in the data directory (tested on files the tests write: test_criteo.py)
NEEDS_FILE = ("vfl_criteo",)
EXPERIMENTS = [e for e in ALL_EXPERIMENTS if not e.startswith(FEDREC_PREFIXES) and e not in NEEDS_FILE]
SUMMARY_KEYS = {"steps", "cumulative_regret", "comm_messages", "comm_scalars", "comm_bytes", "wall_seconds", "seed"}
RUN_FILES = ("config_resolved.yaml", "metrics.csv", "summary.json", "regret.png", "regret_vs_comm.png")
SUBPROCESS_TIMEOUT = 240
CHEAP = ("plots=false", "logger.tensorboard=false")  # the multirun checks the sweep, not the run outputs


# ------------------------------------------------------------------------------------------------ helpers
def is_replay(cfg: DictConfig) -> bool:
    """Whether the experiment replays a log (fedrec.envs.replay): CTR metrics instead of regret."""
    return bool(getattr(get_class(cfg.env._target_), "replay", False))


def check_run_dir(out: Path, cfg: DictConfig, summary: dict[str, Any], steps: int, rounds: int) -> None:
    metric, plots = "cumulative_regret", ("regret.png", "regret_vs_comm.png")
    if is_replay(cfg):
        metric, plots = "relative_ctr", ("relative_ctr.png",)
    for name in (*RUN_FILES[:3], *plots):
        assert (out / name).is_file(), f"{name} missing from {sorted(p.name for p in out.iterdir())}"
    assert OmegaConf.to_container(OmegaConf.load(out / "config_resolved.yaml")) == OmegaConf.to_container(
        cfg, resolve=True
    )
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == strict_json(summary)  # the returned summary, infinite values written as text
    assert SUMMARY_KEYS - {"cumulative_regret"} | {metric} <= set(on_disk), SUMMARY_KEYS - set(on_disk)
    assert on_disk["steps"] == steps
    assert on_disk["seed"] == cfg.seed
    assert on_disk["rounds_run"] == rounds
    assert on_disk["wall_seconds"] > 0
    for k in (metric, "comm_messages", "comm_scalars", "comm_bytes"):
        assert math.isfinite(on_disk[k]), k
    rows = read_csv(out / "metrics.csv")
    assert len(rows) == rounds
    assert [int(r["step"]) for r in rows] == list(range(rounds))
    assert float(rows[-1]["steps"]) == steps
    assert float(rows[-1][metric]) == on_disk[metric]
    assert float(rows[-1]["comm_messages"]) == on_disk["comm_messages"]
    for png in plots:
        assert (out / png).read_bytes()[:8] == PNG_MAGIC


# ------------------------------------------------------------------------------------------------ train.py
MULTIRUN_TEST = "test_train_py_multirun_over_seeds"


@pytest.fixture(scope="module", autouse=True)
def multirun_job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Start the one ``train.py`` subprocess right away if its test is selected; its test collects it."""
    selected = {getattr(item, "originalname", item.name) for item in request.session.items}
    job: dict[str, Any] = {}
    if MULTIRUN_TEST in selected:
        base = tmp_path_factory.mktemp("train_py_multirun")
        job["cwd"] = base / "cwd"
        job["cwd"].mkdir()
        job["sweep"] = base / "sweep"
        env = dict(os.environ)
        env.pop("FEDREC_DATA_DIR", None)  # the default (synthetic) config needs no dataset
        args = ["-m", "seed=0,1", "task.steps=200", f"hydra.sweep.dir={job['sweep']}", *CHEAP]
        job["proc"] = subprocess.Popen(
            [sys.executable, str(ROOT / "train.py"), *args],
            cwd=job["cwd"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
    yield job
    if "proc" in job:
        if job["proc"].poll() is None:
            job["proc"].kill()
        job["proc"].communicate()


# ------------------------------------------------------------------------------------------------ experiments
@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_runs_end_to_end(compose_cfg: Compose, data_dir: Path, tmp_path: Path, experiment: str) -> None:
    """Each experiment's documented short recipe (quick=true) runs and writes a whole run folder."""
    cfg = compose_cfg(*quick_command_line(experiment, data_dir))
    assert cfg.quick is True and cfg.task.steps == 200 and cfg.replicates == 1
    out = tmp_path / "run"
    summary = run(cfg, output_dir=out)
    check_run_dir(out, cfg, summary, steps=200, rounds=2)
    assert summary["experiment"] == cfg.name
    assert not (out / "tb").exists()  # logger.tensorboard=false
    assert (out / "checkpoints" / "last.ckpt").is_file()


# ------------------------------------------------------------------------------------------------ resume
RESUME_OVERRIDES = (
    "task.steps=600", "task.steps_per_round=50", "env.num_clients=20", "env.dim=5", "env.num_arms=5",
    "protocol.gamma_u=2.0", "logger.tensorboard=false", "plots=false", "trainer.checkpoint_every=4",
)


@pytest.mark.parametrize("into", ["new_dir", "same_dir"])
def test_cli_resume_matches_uninterrupted_run(compose_cfg: Compose, tmp_path: Path, into: str) -> None:
    full = run(compose_cfg(*RESUME_OVERRIDES), output_dir=tmp_path / "full")
    assert full["rounds_run"] == 12 and full["comm_messages"] > 0

    part_dir = tmp_path / "part"
    part = run(compose_cfg(*RESUME_OVERRIDES, "trainer.max_rounds=5"), output_dir=part_dir)
    assert part["rounds_run"] == 5 and part["steps"] == 250
    assert len(read_csv(part_dir / "metrics.csv")) == 5

    out = part_dir if into == "same_dir" else tmp_path / "resumed"
    ckpt = part_dir / "checkpoints" / "last.ckpt"
    resumed = run(compose_cfg(*RESUME_OVERRIDES, f"ckpt_path={ckpt}"), output_dir=out)

    strip = lambda s: {k: v for k, v in s.items() if k != "wall_seconds"}  # noqa: E731
    assert strip(resumed) == strip(full)
    assert strip(json.loads((out / "summary.json").read_text())) == strip(
        json.loads((tmp_path / "full" / "summary.json").read_text())
    )
    assert read_csv(out / "metrics.csv") == read_csv(tmp_path / "full" / "metrics.csv")


def test_cli_missing_checkpoint_names_ckpt_path(compose_cfg: Compose, tmp_path: Path) -> None:
    cfg = compose_cfg(*RESUME_OVERRIDES, f"ckpt_path={tmp_path / 'nope.ckpt'}")
    with pytest.raises(ConfigError, match="ckpt_path"):
        run(cfg, output_dir=tmp_path / "run")


# ------------------------------------------------------------------------------------------------ bad input
BAD_VALUES = [
    ("env.dim=0", "env", "dim"),
    ("env.num_arms=0", "env", "num_arms"),
    ("protocol.gamma_u=0.5", "protocol", "gamma_u"),
    ("policy.lam=0", "policy", "lam"),
    ("task.steps=0", "task", "steps"),
]


@pytest.mark.parametrize(("override", "group", "field"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_bad_value_raises_config_error_naming_the_field(
    compose_cfg: Compose, tmp_path: Path, override: str, group: str, field: str
) -> None:
    cfg = compose_cfg("logger.tensorboard=false", "env.num_clients=20", override)
    with pytest.raises(ConfigError) as info:
        run(cfg, output_dir=tmp_path)
    msg = str(info.value)
    assert re.search(rf"\b{group}\b.*\b{field}\b", msg), msg
    value = override.split("=", 1)[1]
    assert value in msg, msg
    assert not (tmp_path / "summary.json").exists()


MISFITS = [  # (overrides, the field the one-line error names): top-level fields and groups of the other task kind
    (("seed=-1",), "seed"),
    (("seed=abc",), "seed"),
    (("seed=1.5",), "seed"),
    (("num_threads=-2",), "num_threads"),
    (("data=ml100k",), "data"),
    (("privacy=gaussian",), "privacy"),
    (("+experiment=fedgnn_ml100k", "protocol=async", "task.rounds=1"), "protocol"),  # the group the task cannot use
    (("+experiment=fedgnn_ml100k", "env=synthetic", "task.rounds=1"), "env"),
]


@pytest.mark.parametrize(("overrides", "field"), MISFITS, ids=[" ".join(o) for o, _ in MISFITS])
def test_train_py_refuses_misfit_fields_with_one_error_line(
    train_py: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture, overrides: tuple[str, ...],
    field: str,
) -> None:
    with pytest.raises(SystemExit) as info:
        steps = () if "task.rounds=1" in overrides else ("task.steps=100",)
        train_py(*overrides, f"hydra.run.dir={tmp_path / 'run'}", "logger.tensorboard=false", *steps)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {field}: "), err
    assert not (tmp_path / "run" / "summary.json").exists()


REMOVED_GROUPS = [  # (train.py arguments, the group the one-line error names): a group set to null or removed
    (("+experiment=fedgnn_ml100k", "privacy=null"), "privacy"),
    (("-m", "+experiment=fedgnn_ml100k", "privacy=none,null"), "privacy"),
    (("+experiment=fedgnn_ml100k", "data=null"), "data"),
    (("env=null",), "env"),
    (("~env",), "env"),
    (("~protocol",), "protocol"),
    (("+experiment=fedgnn_ml100k", "~model"), "model"),
]


@pytest.mark.parametrize(("args", "group"), REMOVED_GROUPS, ids=[" ".join(a) for a, _ in REMOVED_GROUPS])
def test_train_py_subprocess_refuses_a_null_or_removed_group(tmp_path: Path, args: tuple[str, ...],
                                                             group: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args, f"hydra.run.dir={tmp_path / 'run'}",
         f"hydra.sweep.dir={tmp_path / 'sweep'}", *CHEAP],
        cwd=tmp_path, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {group}: "), err
    if "=null" in " ".join(args):
        assert f"'~{group}'" in err[0]  # how to remove a group
    assert not (tmp_path / "run" / "summary.json").exists() and not (tmp_path / "sweep").exists()


def test_recommendation_run_without_privacy_group_is_non_private(
    train_py: Callable[..., Any], data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    summaries = {}
    for privacy in ("~privacy", "privacy=none"):
        out = tmp_path / privacy
        train_py("+experiment=fedgnn_ml100k", privacy, "task.rounds=2", f"data_dir={data_dir}",
                 f"hydra.run.dir='{out}'", *CHEAP)
        summaries[privacy] = {k: v for k, v in json.loads((out / "summary.json").read_text()).items()
                              if k != "wall_seconds"}
        assert capsys.readouterr().out.strip().startswith(f"run folder: {out}; final_test_rmse = ")
    assert summaries["~privacy"] == summaries["privacy=none"]
    assert summaries["~privacy"]["privacy"] == "none" and summaries["~privacy"]["epsilon_spent"] is None


def test_unknown_experiment_is_a_hydra_error_naming_it(compose_cfg: Compose) -> None:
    with pytest.raises(MissingConfigException, match="no_such_experiment_xyz"):
        compose_cfg("+experiment=no_such_experiment_xyz")


@pytest.mark.parametrize(
    ("experiment", "folder"), [("async_linucb_lastfm", "hetrec2011-lastfm-2k"), ("async_linucb_movielens", "ml-100k")]
)
def test_missing_dataset_names_expected_path(
    compose_cfg: Compose, tmp_path: Path, experiment: str, folder: str
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    cfg = compose_cfg(f"+experiment={experiment}", f"data_dir={empty}", "logger.tensorboard=false")
    with pytest.raises(DatasetNotFoundError) as info:
        run(cfg, output_dir=tmp_path / "run")
    assert str(empty / folder) + os.sep in str(info.value)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["env.dim=0"], "env: dim must be"),
        (["+experiment=async_linucb_lastfm", "data_dir={empty}"], "{empty}/hetrec2011-lastfm-2k/"),
        (["ckpt_path={empty}/last.ckpt"], "ckpt_path"),
    ],
    ids=["config_error", "dataset_not_found", "missing_checkpoint"],
)
def test_train_py_reports_error_and_exits_2(
    train_py: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], needle: str
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        train_py(f"hydra.run.dir={run_dir}", "logger.tensorboard=false", *(a.format(empty=empty) for a in args))
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: "), err
    assert needle.format(empty=empty) in err, err
    assert "Traceback" not in err
    assert not (run_dir / "summary.json").exists()


def test_train_py_run_dir_chooses_output_folder(
    train_py: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``python train.py hydra.run.dir=<dir> task.steps=200``: the default config, written where asked."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    out = tmp_path / "chosen" / "run dir"  # nested, and with a space (quoted for Hydra's override grammar)
    train_py(f"hydra.run.dir='{out}'", "task.steps=200")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["experiment"] == "quickstart" and summary["steps"] == 200 and summary["seed"] == 0
    for name in RUN_FILES:
        assert (out / name).is_file(), name
    assert len(read_csv(out / "metrics.csv")) == summary["rounds_run"] == 2
    assert OmegaConf.load(out / "config_resolved.yaml").task.steps == 200
    assert {"cumulative_regret", "comm_messages"} <= event_tags(out / "tb")  # TensorBoard is on by default
    assert (out / "checkpoints" / "last.ckpt").is_file()
    assert list(cwd.iterdir()) == []  # nothing went to ./outputs


def test_train_py_multirun_over_seeds(multirun_job: dict[str, Any]) -> None:
    """A real ``python train.py -m seed=0,1 task.steps=200 hydra.sweep.dir=<dir>`` subprocess."""
    proc, sweep, cwd = multirun_job["proc"], multirun_job["sweep"], multirun_job["cwd"]
    _, stderr = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 0, stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1"]
    assert all((job / "metrics.csv").is_file() and (job / "config_resolved.yaml").is_file() for job in jobs)
    summaries = [json.loads((job / "summary.json").read_text()) for job in jobs]
    assert [s["seed"] for s in summaries] == [0, 1]
    assert [OmegaConf.load(job / "config_resolved.yaml").seed for job in jobs] == [0, 1]
    assert all(s["steps"] == 200 for s in summaries)
    assert summaries[0]["cumulative_regret"] != summaries[1]["cumulative_regret"]
    assert read_csv(jobs[0] / "metrics.csv") != read_csv(jobs[1] / "metrics.csv")
    assert list(cwd.iterdir()) == []  # nothing went to ./multirun

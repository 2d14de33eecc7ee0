"""Run folders and checkpoints that can be trusted: a checkpoint knows its run and its content, a resume of another
run is refused, and a crash or a failing write neither loses results nor leaves files behind."""
from __future__ import annotations

import errno
import json
import os
import signal
import struct
import subprocess
import sys
import time
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

from fedrec.app.cli import run
from fedrec.app.run_folder import OutputError
from fedrec.errors import ConfigError
from fedrec.trainer.checkpoint import load_checkpoint, save_checkpoint
from fedrec.utils.io import atomic_write
from tests.helpers import ROOT, Compose, read_csv

#: a 12-round bandit run that checkpoints every 4 rounds
BANDIT = ("task.steps=600", "task.steps_per_round=50", "env.num_clients=20", "env.dim=5", "env.num_arms=5",
          "protocol.gamma_u=2.0", "logger.tensorboard=false", "plots=false", "trainer.checkpoint_every=4")
QUIET = ("logger.tensorboard=false", "plots=false")
#: BGTplanner on ML-100K in 8 rounds (initial stage (2+1)·2 = 6 rounds, then 2 planned ones)
FEDREC_RUN = ("+experiment=bgtplanner_ml100k", "task.rounds=8", *QUIET)
PLANNER = (*FEDREC_RUN, "++planner.num_actions=2", "++planner.initial_rounds=2", "++planner.min_rounds=6")
SUBPROCESS_TIMEOUT = 240


def ckpt_of(out: Path) -> Path:
    return out / "checkpoints" / "last.ckpt"


def without_timings(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k not in ("wall_seconds", "planner_seconds_per_round")}


def tensorboard_points(tb_dir: Path) -> list[tuple[str, int]]:
    """Every (tag, step) of the TensorBoard events under ``tb_dir``, read as tests/test_cli.py's event_tags does."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    files = sorted(tb_dir.glob("**/events.out.tfevents.*"))
    return [(v.tag, ev.step) for f in files for ev in EventFileLoader(str(f)).Load() for v in ev.summary.value]


def temporaries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob(".*.tmp"))


def flip_byte(src: Path, dst: Path, offset: int) -> None:
    """Copy ``src`` to ``dst`` with one bit of byte ``offset`` flipped."""
    data = bytearray(src.read_bytes())
    data[offset] ^= 0x01
    dst.write_bytes(bytes(data))


def stored_bytes(path: Path, pick: Callable[[list[zipfile.ZipInfo]], zipfile.ZipInfo]) -> tuple[int, int]:
    """(file offset, size) of the data of the (uncompressed) zip member ``pick`` chooses in checkpoint ``path``."""
    with zipfile.ZipFile(path) as z:
        info = pick(z.infolist())
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = struct.unpack("<HH", f.read(4))
    return info.header_offset + 30 + name_len + extra_len, info.file_size


@pytest.fixture(scope="module")
def bandit_part(tmp_path_factory: pytest.TempPathFactory, compose_cfg: Compose) -> Path:
    """A seed-0 bandit run stopped after 5 of its 12 rounds (its checkpoint is at round 5)."""
    out = tmp_path_factory.mktemp("bandit") / "part"
    run(compose_cfg(*BANDIT, "trainer.max_rounds=5"), output_dir=out)
    return out


@pytest.fixture(scope="module")
def planner_runs(tmp_path_factory: pytest.TempPathFactory, data_dir: Path, compose_cfg: Compose) -> dict[str, Any]:
    """A BGTplanner run of 8 rounds, the same run stopped after 4 rounds, and that one resumed to the end."""
    base = tmp_path_factory.mktemp("planner")
    ov = (*PLANNER, f"data_dir={data_dir}")
    full = run(compose_cfg(*ov), output_dir=base / "full")
    run(compose_cfg(*ov, "trainer.max_rounds=4"), output_dir=base / "part")
    resumed = run(compose_cfg(*ov, f"ckpt_path={ckpt_of(base / 'part')}"), output_dir=base / "resumed")
    return {"full": full, "resumed": resumed, "part": base / "part", "overrides": ov}


# ------------------------------------------------------------------------------------------------ identity
@pytest.mark.parametrize("case", ["seed", "task_kind", "planner", "dataset"])
def test_resume_of_another_run_is_refused_naming_the_fields(
    case: str, bandit_part: Path, planner_runs: dict[str, Any], data_dir: Path, tmp_path: Path, compose_cfg: Compose
) -> None:
    """Today a different seed or planner resumes silently and another task kind or dataset crashes (KeyError, size
    mismatch); each is now one ``ckpt_path:`` line naming the differing fields, and nothing is written."""
    ov, wanted = {
        "seed": ((*BANDIT, "seed=1"), ["seed (0 in the checkpoint, 1 here)"]),
        "task_kind": (("+experiment=fedgnn_ml100k", f"data_dir={data_dir}", "task.rounds=2", *QUIET),
                      ["task_class (fedrec.tasks.bandit.BanditTask in the checkpoint, fedrec.tasks.recommendation."
                       "FedRecTask here)",
                       "task (fedrec.tasks.BanditTask in the checkpoint, fedrec.tasks.FedRecTask here)",
                       "data (none in the checkpoint, fedrec.data.load_ratings here)"]),
        "planner": ((*FEDREC_RUN, f"data_dir={data_dir}", "~planner"),
                    ["planner (fedrec.planners.BGTPlanner in the checkpoint, none here)"]),
        "dataset": ((*planner_runs["overrides"], "data=filmtrust"),
                    ["data.name (ml-100k in the checkpoint, filmtrust here)", "sizes.data.num_users (943 in the "
                     "checkpoint"]),
    }[case]
    ckpt = ckpt_of(planner_runs["part"] if case in ("planner", "dataset") else bandit_part)
    out = tmp_path / "resumed"
    with pytest.raises(ConfigError) as info:
        run(compose_cfg(*ov, f"ckpt_path={ckpt}"), output_dir=out)
    msg = str(info.value)
    assert msg.startswith(f"ckpt_path: {ckpt} is a checkpoint of another run") and "\n" not in msg, msg
    for field in wanted:
        assert field in msg, msg
    assert "resume_allow_changes" in msg
    assert not [p.name for p in out.iterdir()]  # refused before anything was written


def test_train_py_refuses_another_seed_with_one_error_line(
    train_py: Callable[..., Any], bandit_part: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        train_py(*BANDIT, "seed=1", f"ckpt_path={ckpt_of(bandit_part)}", f"hydra.run.dir={run_dir}")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [err.strip()] and err.startswith("error: ckpt_path: "), err
    assert "seed (0 in the checkpoint, 1 here)" in err
    assert not (run_dir / "summary.json").exists() and not (run_dir / "config_resolved.yaml").exists()


def test_train_py_subprocess_refuses_other_sizes(bandit_part: Path, tmp_path: Path) -> None:
    """A real ``python train.py`` resuming a 5-arm checkpoint with 6 arms: exit code 2 and one ``error:`` line."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *BANDIT, "env.num_arms=6", f"ckpt_path={ckpt_of(bandit_part)}",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "env.num_arms (5 in the checkpoint, 6 here)" in errors[0]
    assert "sizes.env.num_arms (5 in the checkpoint, 6 here)" in errors[0]


def test_harmless_and_allowed_changes_resume(
    train_py: Callable[..., Any], bandit_part: Path, tmp_path: Path, compose_cfg: Compose
) -> None:
    """trainer.* may change freely (more rounds); task.steps only when named in resume_allow_changes."""
    more = run(compose_cfg(*BANDIT, "trainer.max_rounds=8", "trainer.log_every=2",
                           f"ckpt_path={ckpt_of(bandit_part)}"), output_dir=tmp_path / "more")
    assert more["rounds_run"] == 8 and more["steps"] == 400

    longer = (*BANDIT, "task.steps=800", f"ckpt_path={ckpt_of(bandit_part)}")
    with pytest.raises(ConfigError, match=r"task\.steps \(600 in the checkpoint, 800 here\)"):
        run(compose_cfg(*longer), output_dir=tmp_path / "refused")
    train_py(*longer, "resume_allow_changes=[task.steps]", f"hydra.run.dir={tmp_path / 'allowed'}")
    summary = json.loads((tmp_path / "allowed" / "summary.json").read_text())
    assert summary["steps"] == 800 and summary["rounds_run"] == 16
    assert load_checkpoint(ckpt_of(tmp_path / "allowed"))["identity"]["config"]["task"]["steps"] == 800


# ------------------------------------------------------------------------------------------------ content
def test_flipped_byte_is_refused(planner_runs: dict[str, Any], tmp_path: Path, compose_cfg: Compose) -> None:
    """A bit flip in a tensor, or in a number of the pickled part, loads fine with torch but fails the digest."""
    good = ckpt_of(planner_runs["part"])
    ckpt = load_checkpoint(good)
    tensor, size = stored_bytes(good, lambda infos: max((i for i in infos if "/data/" in i.filename),
                                                        key=lambda i: i.file_size))
    pickled, pickled_size = stored_bytes(good, lambda infos: next(i for i in infos if i.filename.endswith(".pkl")))
    wall = good.read_bytes()[pickled:pickled + pickled_size].index(struct.pack(">d", ckpt["wall_seconds"]))
    for name, offset in (("tensor", tensor + size // 2), ("number", pickled + wall + 7)):
        bad = tmp_path / f"{name}.ckpt"
        flip_byte(good, bad, offset)
        torch.load(bad, weights_only=True)  # still a readable file: only the digest tells
        with pytest.raises(ConfigError, match="is corrupt") as info:
            load_checkpoint(bad)
        assert str(bad) in str(info.value)
    with pytest.raises(ConfigError, match="is corrupt"):
        run(compose_cfg(*planner_runs["overrides"], f"ckpt_path={tmp_path / 'number.ckpt'}"),
            output_dir=tmp_path / "resumed")


def _python_types(obj: Any) -> set[type]:
    """The types of every leaf of a nested checkpoint."""
    if isinstance(obj, dict):
        return {t for k, v in obj.items() for t in _python_types(k) | _python_types(v)}
    if isinstance(obj, (list, tuple)):
        return {t for v in obj for t in _python_types(v)}
    return {type(obj)}


@pytest.mark.parametrize("kind", ["bandit", "recommendation", "planner"])
def test_checkpoints_load_weights_only(kind: str, bandit_part: Path, planner_runs: dict[str, Any], data_dir: Path,
                                       tmp_path: Path, compose_cfg: Compose) -> None:
    """Every kind of checkpoint loads with ``torch.load(weights_only=True)`` (the planner's numpy scalars are saved
    as Python floats), and the planner run resumed from one matches the uninterrupted run."""
    if kind == "recommendation":
        run(compose_cfg("+experiment=fedgnn_ml100k_dp", f"data_dir={data_dir}", "task.rounds=2", *QUIET),
            output_dir=tmp_path)
    path = ckpt_of({"bandit": bandit_part, "recommendation": tmp_path, "planner": planner_runs["part"]}[kind])
    raw = torch.load(path, map_location="cpu", weights_only=True)
    assert not {t for t in _python_types(raw) if t.__module__ == np.__name__}
    assert raw["version"] == 2 and len(raw["digest"]) == 64
    assert load_checkpoint(path)["identity"]["task_class"].endswith(("BanditTask", "FedRecTask"))
    if kind == "planner":
        assert raw["callbacks"]["budget_planner"]["z"] and all(
            type(x) is float for row in raw["callbacks"]["budget_planner"]["z"] for x in row)
        assert without_timings(planner_runs["resumed"]) == without_timings(planner_runs["full"])


# ------------------------------------------------------------------------------------------------ crashes
CHILD_WRITER = """
import sys, torch
from fedrec.trainer.checkpoint import save_checkpoint
state = {"w": torch.arange(16_000_000, dtype=torch.float32)}  # 64 MB per write
while True:
    save_checkpoint(sys.argv[1], state)
"""


def _kill_mid_write(path: Path, deadline: float) -> bool:
    """Start a child that writes ``path`` in a loop and SIGKILL it once a temporary is being written; whether one
    was left behind (the kill may fall between two writes)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD_WRITER, str(path)], cwd=ROOT)
    try:
        while not path.exists() and time.monotonic() < deadline:  # one complete write first
            assert child.poll() is None, "the writer died"
            time.sleep(0.01)
        while not any(p.stat().st_size for p in path.parent.glob(".*.tmp") if p.exists()):
            assert time.monotonic() < deadline, "never saw the writer's temporary"
            time.sleep(0.001)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    return bool(temporaries(path.parent))


def test_writer_killed_mid_checkpoint_leaves_no_temporary(tmp_path: Path) -> None:
    """A real process killed by SIGKILL while writing a checkpoint leaves a temporary; the next load (a resume) and
    the next write remove it, and the last complete checkpoint is intact."""
    path = tmp_path / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 180
    while not _kill_mid_write(path, deadline):
        assert time.monotonic() < deadline, "never killed the writer mid-write"
    assert load_checkpoint(path)["w"].shape == (16_000_000,)
    assert temporaries(path.parent) == []

    _kill_mid_write(path, time.monotonic() + 120)
    save_checkpoint(path, {"w": torch.zeros(2)})
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.ckpt"]


def test_final_checkpoint_failure_keeps_the_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   compose_cfg: Compose) -> None:
    """A full disk at the final checkpoint: summary.json and the plots are already written, no temporary is left,
    and the failure is an ``output:`` error."""
    def full_disk(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    out = tmp_path / "run"
    with pytest.raises(OutputError) as info:
        run(compose_cfg(*BANDIT, "plots=true", "trainer.checkpoint_every=0"), output_dir=out)
    assert str(info.value) == f"output: cannot write {ckpt_of(out)}: No space left on device"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_run"] == 12 and summary["steps"] == 600
    assert (out / "regret.png").is_file() and len(read_csv(out / "metrics.csv")) == 12
    assert list((out / "checkpoints").iterdir()) == []


def test_train_py_reports_write_failures_as_output_errors(
    train_py: Callable[..., Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
    compose_cfg: Compose,
) -> None:
    """A run folder that is a file, and a read-only checkpoint folder, are ``error: output: ...`` with exit code 2."""
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    with pytest.raises(SystemExit) as info:
        train_py(*BANDIT, f"hydra.run.dir={a_file}")
    assert info.value.code == 2
    assert capsys.readouterr().err == f"error: output: the run folder {a_file} is a file\n"
    with pytest.raises(OutputError, match="is a file"):
        run(compose_cfg(*BANDIT), output_dir=a_file)

    def read_only(*args: Any, **kwargs: Any) -> None:
        raise PermissionError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(torch, "save", read_only)
    run_dir = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        train_py(*BANDIT, "trainer.checkpoint_every=0", f"hydra.run.dir={run_dir}")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: output: cannot write {ckpt_of(run_dir)}: Read-only file system"), err
    assert "Traceback" not in err
    assert (run_dir / "summary.json").is_file()


def test_file_modes_follow_the_umask(tmp_path: Path, compose_cfg: Compose) -> None:
    """Atomic writes used to create 0600 files whatever the umask."""
    old = os.umask(0o022)
    try:
        out = tmp_path / "run"
        run(compose_cfg(*BANDIT, "plots=true", "logger.tensorboard=true"), output_dir=out)
        for name in ("summary.json", "metrics.csv", "config_resolved.yaml", "checkpoints/last.ckpt", "regret.png",
                     "regret_vs_comm.png"):
            assert (out / name).stat().st_mode & 0o777 == 0o644, name
        os.umask(0o027)
        assert atomic_write(tmp_path / "x.json", lambda f: f.write(b"{}")).stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)


# ------------------------------------------------------------------------------------------------ run folders
def test_run_into_a_folder_holding_a_run_is_refused(
    train_py: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture, compose_cfg: Compose
) -> None:
    """A second run into a run folder used to overwrite its results and add its TensorBoard points to the first
    run's; it is refused, before Hydra or fedrec write anything there."""
    out = tmp_path / "run"
    train_py(*BANDIT, "logger.tensorboard=true", f"hydra.run.dir={out}")
    before = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    with pytest.raises(SystemExit) as info:
        train_py(*BANDIT, "seed=1", f"hydra.run.dir={out}")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: output: {out} already holds a run (summary.json, metrics.csv, "
                          "checkpoints/last.ckpt, tb/); refusing to mix two runs"), err
    assert f"ckpt_path={ckpt_of(out)}" in err
    with pytest.raises(OutputError, match="already holds a run"):
        run(compose_cfg(*BANDIT, "seed=1"), output_dir=out)
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before


def test_same_folder_resume_logs_each_tensorboard_step_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            compose_cfg: Compose) -> None:
    """A run that dies after round 6 with its checkpoint at round 4, resumed in its own folder: TensorBoard holds
    each round once (the resume used to add rounds 0-5 a second time), with the uninterrupted run's values."""
    tb_on = (*BANDIT, "logger.tensorboard=true")
    run(compose_cfg(*tb_on), output_dir=tmp_path / "full")
    real_save, saves = torch.save, []

    def dies_at_second_save(*args: Any, **kwargs: Any) -> None:
        saves.append(1)
        if len(saves) == 2:
            raise OSError(errno.EIO, "Input/output error")
        real_save(*args, **kwargs)

    out = tmp_path / "run"
    monkeypatch.setattr(torch, "save", dies_at_second_save)
    with pytest.raises(OutputError):
        run(compose_cfg(*tb_on, "trainer.max_rounds=6"), output_dir=out)
    monkeypatch.setattr(torch, "save", real_save)
    assert load_checkpoint(ckpt_of(out))["round"] == 4
    assert {s for t, s in tensorboard_points(out / "tb") if t == "cumulative_regret"} == set(range(6))

    run(compose_cfg(*tb_on, f"ckpt_path={ckpt_of(out)}"), output_dir=out)
    points = tensorboard_points(out / "tb")
    assert [p for p, n in Counter(points).items() if n > 1] == []
    assert sorted(points) == sorted(tensorboard_points(tmp_path / "full" / "tb"))
    assert read_csv(out / "metrics.csv") == read_csv(tmp_path / "full" / "metrics.csv")

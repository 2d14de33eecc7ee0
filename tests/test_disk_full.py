"""A full disk (a patched writer: ``os.fsync`` fails with ENOSPC for chosen files) ends a run through ``train.py`` as
one ``error: output:`` line with exit code 2, no traceback, and no partial or temporary file left behind."""
from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

FULL = "No space left on device"


def fill_disk_for(monkeypatch: pytest.MonkeyPatch, full: Callable[[str], bool]) -> None:
    """Make ``os.fsync`` fail with ENOSPC for every file whose path ``full`` selects (the atomic writers fsync
    before renaming, where a full disk shows on a real one)."""
    real = os.fsync

    def fsync(fd: int) -> None:
        if full(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.ENOSPC, FULL)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)


def run_failing(train_py, capsys: pytest.CaptureFixture[str], out: Path) -> str:
    """Run the default experiment for 300 steps into ``out`` and return its stderr, asserting exit code 2."""
    with pytest.raises(SystemExit) as exit_info:
        train_py("task.steps=300", "plots=false", "logger.tensorboard=false", "trainer.checkpoint_every=1",
                 f"hydra.run.dir={out}")
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def leftovers(out: Path) -> list[str]:
    """Temporary files of the atomic writers left anywhere under ``out``."""
    return sorted(str(p.relative_to(out)) for p in out.rglob("*.tmp")) if out.exists() else []


def test_disk_full_at_a_checkpoint_is_one_output_error_and_leaves_no_partial_file(
    train_py, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    fill_disk_for(monkeypatch, lambda path: path.endswith(".tmp") and "last.ckpt" in path)
    err = run_failing(train_py, capsys, out)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith("error: output: cannot write ") and "last.ckpt" in errors[0] and FULL in errors[0]
    assert leftovers(out) == []
    assert not (out / "checkpoints" / "last.ckpt").exists()  # never a half-written checkpoint


def test_disk_full_before_any_result_leaves_no_run_folder(
    train_py, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The first file a run writes is its resolved config: failing there leaves nothing that looks like a run."""
    out = tmp_path / "run"
    fill_disk_for(monkeypatch, lambda path: path.endswith(".tmp"))
    err = run_failing(train_py, capsys, out)
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: output: cannot write {out / 'config_resolved.yaml'}: {FULL}"]
    assert not out.exists()

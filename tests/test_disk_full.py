"""A full disk (a patched writer: ``os.fsync`` fails with ENOSPC for chosen files), or a file-size limit that a real
``train.py`` runs under (EFBIG), ends a run as one ``error: output:`` line with exit code 2, no traceback, and no
partial or temporary file left behind."""
from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
    """The first file a run writes is Hydra's copy of its config (written atomically too): failing there leaves
    nothing that looks like a run."""
    out = tmp_path / "run"
    fill_disk_for(monkeypatch, lambda path: path.endswith(".tmp"))
    err = run_failing(train_py, capsys, out)
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: output: cannot write {out / '.hydra' / 'config.yaml'}: {FULL}"]
    assert not out.exists()


def test_disk_full_at_the_resolved_config_leaves_no_run_folder(
    train_py, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The first file the run itself writes, after Hydra's copies: failing there leaves no run folder either."""
    out = tmp_path / "run"
    fill_disk_for(monkeypatch, lambda path: path.endswith(".tmp") and "config_resolved.yaml" in path)
    err = run_failing(train_py, capsys, out)
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: output: cannot write {out / 'config_resolved.yaml'}: {FULL}"]
    assert not out.exists()


# ------------------------------------------------------------------ real write errors: a file-size limit (EFBIG)
#: the quick FedGNN recipe with 3,000 items: its checkpoint (about 380 kB) is by far the largest file of the run, the
#: plots about 45 kB, the numba cache files of its kernels (written on a cold cache) below 90 kB
BIG_CHECKPOINT = ("+experiment=fedgnn_synthetic", "quick=true", "data.items=3000")


def run_under_file_size_limit(limit: int, out: Path) -> subprocess.CompletedProcess[str]:
    """``python train.py`` of :data:`BIG_CHECKPOINT` into ``out``, no file of the process larger than ``limit``
    bytes."""
    def limit_file_size() -> None:
        # a write past RLIMIT_FSIZE raises SIGXFSZ, whose default kills the process (as a crash, with no message of
        # its own); ignored, the write fails with EFBIG ("File too large") as on a file system's size limit
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, str(ROOT / "train.py"), *BIG_CHECKPOINT, f"hydra.run.dir={out}"],
                          cwd=out.parent, preexec_fn=limit_file_size, capture_output=True, text=True, timeout=600)


def one_output_error(proc: subprocess.CompletedProcess[str]) -> str:
    """The one ``error: output:`` line of a run that ended with exit code 2 and no traceback."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Exception in thread" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: output: cannot write "), proc.stderr[-3000:]
    assert errors[0].endswith(": File too large"), errors[0]
    return errors[0]


def test_a_file_too_large_for_hydras_config_copy_is_one_output_error(tmp_path: Path) -> None:
    """The first file a run writes is Hydra's copy of its config: written atomically by fedrec, its failure is one
    line, not Hydra's traceback beside a half-written file, and the run folder is removed."""
    out = tmp_path / "run"
    error = one_output_error(run_under_file_size_limit(1000, out))
    assert error.startswith(f"error: output: cannot write {out / '.hydra' / 'config.yaml'}:"), error
    assert not out.exists()


def test_a_checkpoint_too_large_is_one_output_error_and_the_results_stay(tmp_path: Path) -> None:
    out = tmp_path / "run"
    error = one_output_error(run_under_file_size_limit(200_000, out))
    assert error.startswith(f"error: output: cannot write {out / 'checkpoints' / 'last.ckpt'}:"), error
    assert json.loads((out / "summary.json").read_text())["rounds_run"] == 3  # written before the checkpoint
    assert leftovers(out) == [] and not (out / "checkpoints" / "last.ckpt").exists()

"""Run folders: one run at a time (an exclusive lock), a run that fails before computing anything leaves no folder
behind, and a failed write of a log is an ``error: output:`` line, not a traceback."""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedrec.app.run_folder import (
    LOCK,
    TENSORBOARD_WRITER,
    OutputError,
    claimed,
    discard_failed_run,
    output_errors,
    prepare_output_dir,
)

ROOT = Path(__file__).resolve().parents[1]


def test_a_second_claim_of_a_folder_is_refused_while_the_first_holds_it(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with claimed(out):
        holder = subprocess.run(  # another process, as a second train.py into the same folder would be
            [sys.executable, "-c", f"from pathlib import Path; from fedrec.app.run_folder import claimed\n"
                                   f"with claimed(Path({str(out)!r})): pass"],
            capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)
        assert holder.returncode != 0
        assert f"output: another run (pid {os.getpid()}) is writing into {out}" in holder.stderr
    with claimed(out):  # released when the first run ends
        pass


def test_a_run_that_finished_while_waiting_is_found_under_the_lock(tmp_path: Path) -> None:
    out = tmp_path / "run"
    prepare_output_dir(out)  # both runs found the folder empty
    (out / "summary.json").write_text("{}")  # the first one finished meanwhile
    with pytest.raises(OutputError, match="already holds a run"):
        with claimed(out):
            pass


def test_only_a_folder_this_process_created_and_holding_only_setup_files_is_discarded(tmp_path: Path) -> None:
    made, kept, mine_with_results = tmp_path / "made", tmp_path / "existing", tmp_path / "results"
    kept.mkdir()
    for out in (made, kept, mine_with_results):
        prepare_output_dir(out)
        (out / ".hydra").mkdir()
        (out / "train.log").write_text("")
        (out / LOCK).write_text("")
    (mine_with_results / "metrics.csv").write_text("round\n")
    assert discard_failed_run(made) and not made.exists()
    assert not discard_failed_run(kept) and kept.is_dir()
    assert not discard_failed_run(mine_with_results) and (mine_with_results / "metrics.csv").is_file()


def test_train_py_failing_at_build_time_leaves_no_run_folder(
    train_py: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as info:  # a value only the builder can refuse
        train_py("env.num_clients=0", f"hydra.run.dir={out}")
    assert info.value.code == 2
    assert capsys.readouterr().err.startswith("error: env")
    assert not out.exists()


def test_a_log_file_that_cannot_be_written_is_an_output_error() -> None:
    """A record that Hydra's job log cannot take ends the run as ``error: output:`` naming the file, instead of
    logging's traceback and a run that goes on without its log."""
    handler = logging.FileHandler("/dev/full")  # every write fails: no space left on device
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with pytest.raises(OutputError) as info, output_errors():
            logging.getLogger("fedrec").warning("a record")
    finally:
        root.removeHandler(handler)
        with contextlib.suppress(OSError):
            handler.close()
    assert str(info.value) == "output: cannot write /dev/full: No space left on device"
    assert "handleError" not in vars(handler)  # logging's own handling again


def test_a_failed_write_of_tensorboards_writer_thread_prints_no_thread_traceback(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """TensorBoard raises its writer thread's error again at the run's next write or flush of events: the thread's
    own report (a traceback) is left out while the run writes; other threads' errors are reported as before."""
    reported: list[str] = []

    def hook(args: Any) -> None:
        reported.append(type(args.thread).__name__)

    class Failing(threading.Thread):
        def run(self) -> None:
            raise OSError(errno.EFBIG, "File too large")

    class EventWriter(Failing):
        pass

    EventWriter.__module__ = TENSORBOARD_WRITER
    monkeypatch.setattr(threading, "excepthook", hook)
    with output_errors():
        for thread in (EventWriter(), Failing()):
            thread.start()
            thread.join()
    assert reported == ["Failing"]
    assert threading.excepthook is hook  # given back once the run's writes succeeded

"""A run's output folder: the check that a run may write there (:func:`prepare_output_dir`), and the Hydra callback
that makes it before Hydra writes its own files (:class:`OutputDirCheck`).

Kept apart from :mod:`fedrec.cli` and free of torch: the callback is built in every ``train.py`` process, including
the parent of a joblib or submitit sweep, which runs no job itself (importing torch there cost 2.6 s of the sweep).
"""
from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback as HydraCallback
from omegaconf import DictConfig

from fedrec.errors import ConfigError
from fedrec.io import WriteError

#: files of a run folder (relative paths) that show a run already wrote there
RUN_OUTPUTS = ("summary.json", "metrics.csv", "checkpoints/last.ckpt")
TB_EVENTS = "tb/**/events.out.tfevents.*"


class OutputError(ConfigError):
    """The run folder cannot take this run's files (not writable, full, a file, or holding another run). A
    :class:`ConfigError`, so that ``train.py`` reports it as ``error: output: ...`` with exit code 2."""


def resumes_in_place(out: Path, ckpt_path: Any) -> bool:
    """Whether ``ckpt_path`` lies inside run folder ``out``: the resume continues that folder's run."""
    return ckpt_path is not None and out.resolve() in Path(str(ckpt_path)).resolve().parents


def prepare_output_dir(out: Path, ckpt_path: Any = None) -> None:
    """Create run folder ``out`` and check that this run may write there: a writable folder that holds no other
    run's results (a resume from a checkpoint inside it continues that run). Raises :class:`OutputError`."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"output: the run folder {out} is a file")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise OutputError(f"output: cannot write the run folder {out}: {e.strerror or e}") from e
    found = [name for name in RUN_OUTPUTS if (out / name).exists()] + (["tb/"] if any(out.glob(TB_EVENTS)) else [])
    if found and not resumes_in_place(out, ckpt_path):
        hint = f" or continue that run (ckpt_path={out / RUN_OUTPUTS[2]})" if RUN_OUTPUTS[2] in found else ""
        raise OutputError(f"output: {out} already holds a run ({', '.join(found)}); refusing to mix two runs in "
                          f"one folder: write this run to a new folder (hydra.run.dir=...){hint}")


@contextmanager
def output_errors() -> Iterator[None]:
    """Report a failed write of the run's files as an :class:`OutputError` (``error: output: ...``)."""
    try:
        yield
    except WriteError as e:
        raise OutputError(f"output: {e}") from e


class OutputDirCheck(HydraCallback):
    """Hydra callback (``hydra.callbacks`` in conf/config.yaml): checks the run or sweep folder before Hydra writes
    its own files there, so a bad ``hydra.run.dir`` is ``error: output: ...`` with exit code 2, not a traceback."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Check ``hydra.run.dir`` (it may hold this run's checkpoint, for a resume in place); a process launched
        as a secondary rank of a multi-process run writes nothing there, so it checks nothing."""
        from fedrec.trainer.distributed import launched_as_secondary  # a run's process imports torch anyway

        if launched_as_secondary():
            return
        _exit_on_output_error(lambda: prepare_output_dir(Path(config.hydra.run.dir), config.get("ckpt_path")))

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Check that ``hydra.sweep.dir`` can be created and written (each job's folder is checked by its run)."""
        _exit_on_output_error(lambda: prepare_output_dir(Path(config.hydra.sweep.dir)))


def _exit_on_output_error(check: Callable[[], None]) -> None:
    """Run ``check``; on an :class:`OutputError` print it as ``error: ...`` and exit with code 2."""
    try:
        check()
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from e

"""A run's output folder: the check that a run may write there (:func:`prepare_output_dir`), and the Hydra callback
that makes it before Hydra writes its own files (:class:`OutputDirCheck`).

Kept apart from :mod:`fedrec.app.cli` and free of torch: the callback is built in every ``train.py`` process, including
the parent of a joblib or submitit sweep, which runs no job itself (importing torch there cost 2.6 s of the sweep).
"""
from __future__ import annotations

import fcntl
import functools
import logging
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback as HydraCallback
from omegaconf import DictConfig, OmegaConf

from fedrec.errors import ConfigError
from fedrec.utils.io import WriteError, atomic_write

#: files of a run folder (relative paths) that show a run already wrote there
RUN_OUTPUTS = ("summary.json", "metrics.csv", "checkpoints/last.ckpt")
TB_EVENTS = "tb/**/events.out.tfevents.*"
#: the file a running run holds an exclusive lock on (removed when the run ends)
LOCK = ".fedrec.lock"
#: what a run that failed before computing anything leaves in a folder it created: Hydra's record, the job log, the
#: lock and the resolved config; such a folder is removed (see :func:`discard_failed_run`)
SETUP_FILES = (".hydra", LOCK, "config_resolved.yaml")
#: folders this process created for a run (only those are ever removed), each with the outermost folder made with it
#: (``outputs/NAME/`` of a first run of ``outputs/NAME/DATE/``), which is removed with it when left empty
_CREATED: dict[Path, Path] = {}
#: the module of TensorBoard's writer thread: a write it fails is raised again by the run's next write or flush of
#: TensorBoard events (every logged round, and the run's end), which reports it as ``error: output: ...``
TENSORBOARD_WRITER = "tensorboard.summary.writer.event_file_writer"


class OutputError(ConfigError):
    """The run folder cannot take this run's files (not writable, full, a file, or holding another run). A
    :class:`ConfigError`, so that ``train.py`` reports it as ``error: output: ...`` with exit code 2."""


def resumes_in_place(out: Path, ckpt_path: Any) -> bool:
    """Whether ``ckpt_path`` lies inside run folder ``out``: the resume continues that folder's run."""
    return ckpt_path is not None and out.resolve() in Path(str(ckpt_path)).resolve().parents


def prepare_output_dir(out: Path, ckpt_path: Any = None) -> None:
    """Create run folder ``out`` and check that this run may write there: a writable folder that holds no other
    run's results (a resume from a checkpoint inside it continues that run). Raises :class:`OutputError`."""
    _create(out)
    _check_holds_no_other_run(out, ckpt_path)


def _create(out: Path) -> None:
    """Create run folder ``out`` (remembered in :data:`_CREATED` if it did not exist) and check it is writable."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"output: the run folder {out} is a file")
    try:
        if not out.exists():
            outermost = out.resolve()
            while not outermost.parent.exists():
                outermost = outermost.parent
            out.mkdir(parents=True)
            _CREATED[out.resolve()] = outermost
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        raise OutputError(f"output: cannot write the run folder {out}: {e.strerror or e}") from e


def run_outputs(out: Path) -> list[str]:
    """The files (:data:`RUN_OUTPUTS`, and ``tb/`` for TensorBoard events) that show a run wrote into ``out``."""
    return [name for name in RUN_OUTPUTS if (out / name).exists()] + (["tb/"] if any(out.glob(TB_EVENTS)) else [])


def _check_holds_no_other_run(out: Path, ckpt_path: Any) -> None:
    found = run_outputs(out)
    if found and not resumes_in_place(out, ckpt_path):
        hint = f" or continue that run (ckpt_path={out / RUN_OUTPUTS[2]})" if RUN_OUTPUTS[2] in found else ""
        raise OutputError(f"output: {out} already holds a run ({', '.join(found)}); refusing to mix two runs in "
                          f"one folder: write this run to a new folder (hydra.run.dir=...){hint}")


@contextmanager
def claimed(out: Path, ckpt_path: Any = None) -> Iterator[None]:
    """:func:`prepare_output_dir` under an exclusive lock on run folder ``out``, held while inside: a second run into
    it (started at the same time, so that both found it empty) is refused instead of interleaving its files with
    this one's, and a run that finished there meanwhile is found by the check made under the lock."""
    _create(out)
    try:
        fd = os.open(out / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise OutputError(f"output: cannot write the run folder {out}: {e.strerror or e}") from e
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            raise OutputError(f"output: another run (pid {owner}) is writing into {out}; refusing to mix two runs "
                              "in one folder: write this run to a new folder (hydra.run.dir=...)") from None
        try:
            _check_holds_no_other_run(out, ckpt_path)
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            yield
        finally:  # a run that opened the file meanwhile finds this run's results under its own lock
            (out / LOCK).unlink(missing_ok=True)
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def discard_failed_runs() -> list[Path]:
    """:func:`discard_failed_run` on every folder this process created; the folders removed."""
    return [out for out in sorted(_CREATED) if discard_failed_run(out)]


def discard_failed_run(out: Path) -> bool:
    """Remove run folder ``out`` if this process created it and the run failed before writing any result (only
    :data:`SETUP_FILES` and Hydra's job log in it), so that a failed run leaves nothing that looks like a run;
    whether it was removed. The empty folders made with it (``outputs/NAME/``) go too."""
    out = out.resolve()
    if out not in _CREATED or not out.is_dir():
        return False
    if any(p.name not in SETUP_FILES and p.suffix != ".log" for p in out.iterdir()):
        return False
    shutil.rmtree(out, ignore_errors=True)
    outermost = _CREATED.pop(out)
    for parent in out.parents:
        if parent != outermost and outermost not in parent.parents:
            break
        try:
            parent.rmdir()  # only while empty: another run may have made its folder there meanwhile
        except OSError:
            break
    return True


@contextmanager
def output_errors() -> Iterator[None]:
    """Report a failed write of the run's files as an :class:`OutputError` (``error: output: ...``), those of the log
    files (Hydra's job log) included; a failed write of TensorBoard's writer thread prints no thread traceback
    (the run's next write or flush of its events raises it, :data:`TENSORBOARD_WRITER`)."""
    previous_hook = threading.excepthook
    threading.excepthook = functools.partial(_thread_failed, previous_hook)
    log_files = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    for handler in log_files:  # logging would print the error with a traceback and go on without the record
        handler.handleError = functools.partial(_log_write_failed, handler)  # type: ignore[method-assign]
    try:
        yield
    except WriteError as e:
        raise OutputError(f"output: {e}") from e
    finally:
        for handler in log_files:
            del handler.handleError
    threading.excepthook = previous_hook  # not after a failure: the writer thread may fail as the process ends


def _thread_failed(previous: Callable[[Any], object], args: Any) -> None:
    """``threading.excepthook`` while a run writes: a failed write (OSError) of TensorBoard's writer thread is left to
    the run's next write or flush of TensorBoard events, which raises it; anything else goes to ``previous``."""
    if not (issubclass(args.exc_type, OSError) and type(args.thread).__module__ == TENSORBOARD_WRITER):
        previous(args)


def _log_write_failed(handler: logging.FileHandler, record: logging.LogRecord) -> None:
    """``handleError`` of a log file while a run writes: a failed write is a :class:`WriteError` naming the file (an
    ``error: output:`` line), not logging's traceback; other errors are logging's to report."""
    error = sys.exc_info()[1]
    if isinstance(error, OSError):
        raise WriteError(f"cannot write {handler.baseFilename}: {error.strerror or error}") from error
    logging.FileHandler.handleError(handler, record)


def _save_hydra_config(cfg: Any, filename: str, output_dir: Path) -> None:
    """Hydra's copy of a job's config (``.hydra/config.yaml``, ``hydra.yaml``, ``overrides.yaml``) written atomically,
    in place of Hydra's own writer: a failed write is ``error: output: ...`` with exit code 2 and the run folder
    removed if this process made it, not Hydra's traceback beside a half-written file."""
    from hydra.core.hydra_config import HydraConfig

    try:
        atomic_write(Path(output_dir) / filename, lambda f: f.write(OmegaConf.to_yaml(cfg).encode("utf-8")))
    except WriteError as e:
        print(f"error: output: {e}", file=sys.stderr)
        discard_failed_run(Path(HydraConfig.get().runtime.output_dir))
        raise SystemExit(2) from e


def _write_hydra_configs_atomically() -> None:
    """Have Hydra write its copies of a job's config with :func:`_save_hydra_config` (jobs this process runs)."""
    from fedrec.app.hydra_private import replace_config_writer

    replace_config_writer(_save_hydra_config)


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
        _write_hydra_configs_atomically()

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Check that ``hydra.sweep.dir`` can be created and written, and that the job folders it holds from an
        earlier run of the sweep are this sweep's jobs (each job's folder is checked again by its run)."""
        _exit_on_output_error(lambda: prepare_output_dir(Path(config.hydra.sweep.dir)))
        _exit_on_output_error(lambda: _check_same_jobs(config))
        _write_hydra_configs_atomically()


def _check_same_jobs(config: DictConfig) -> None:
    """Refuse a sweep whose folder holds, in a job folder that holds a run, another command line's job of that
    number (its ``.hydra/overrides.yaml``), before Hydra writes over that folder's copies: a rerun continues only its
    own jobs (and may add jobs, e.g. seeds). Only the jobs of Hydra's basic sweeper are known beforehand; other
    sweepers' are checked by their runs alone (``fedrec.app.cli.continue_sweep_job``)."""
    sweeper = config.hydra.sweeper
    if not str(sweeper.get("_target_", "")).endswith(".BasicSweeper"):
        return
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from fedrec.app.hydra_private import sweep_jobs

    line = [f"{k}={v}" for k, v in (sweeper.get("params") or {}).items()] + list(config.hydra.overrides.task)
    jobs = sweep_jobs(OverridesParser.create().parse_overrides(line), sweeper.max_batch_size)
    sweep = Path(config.hydra.sweep.dir)
    for recorded in sorted(sweep.glob("*/.hydra/overrides.yaml")):
        folder = recorded.parent.parent
        if not folder.name.isdigit() or not run_outputs(folder):
            continue
        theirs, number = [str(o) for o in OmegaConf.load(recorded)], int(folder.name)
        if number < len(jobs) and theirs != jobs[number]:  # a job folder beyond this sweep's jobs is left alone
            raise OutputError(f"output: {folder} holds a run of another sweep's job ({' '.join(theirs)}; this "
                              f"sweep's is {' '.join(jobs[number])}): a rerun of a sweep continues only its own jobs: "
                              "write this sweep to a new folder (hydra.sweep.dir=...)")


def _exit_on_output_error(check: Callable[[], None]) -> None:
    """Run ``check``; on an :class:`OutputError` print it as ``error: ...`` and exit with code 2."""
    try:
        check()
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from e

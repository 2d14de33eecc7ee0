"""Entry point: ``python train.py +experiment=NAME [overrides]`` (``-m`` for Hydra multirun sweeps)."""
from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from fedrec.errors import STOP_SIGNALS, Interrupted, interrupts_raise  # cheap: neither torch nor Hydra

if TYPE_CHECKING:
    from omegaconf import DictConfig

CONF = Path(__file__).resolve().parent / "conf"


def experiment(cfg: DictConfig) -> float:
    """Run the composed config; a bad value or a missing dataset (not downloaded) is one ``error:`` line, and an
    interrupt (SIGINT, SIGTERM) after the round's checkpoint one ``interrupted:`` line saying how to resume. In a
    sweep, an interrupted job asks the sweep to stop (:class:`~fedrec.app.sweeps.StopOnSignal`) and a job of a sweep
    asked to stop does not start: the sweep's end says how to continue it."""
    import logging
    import math

    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from fedrec.app.cli import resume_command, run
    from fedrec.app.presets import job_recipe, quick_notes
    from fedrec.app.run_folder import discard_failed_run
    from fedrec.app.sweeps import StopOnSignal, describe, objective, record_job_error
    from fedrec.errors import ConfigError, DatasetNotFoundError
    from fedrec.trainer import RunInterrupted
    from fedrec.trainer.distributed import launched_as_secondary
    from fedrec.utils.stop_request import STOP_FILE, request_stop, requested_stop

    hydra = HydraConfig.get()
    stop_file = Path(hydra.sweep.dir) / STOP_FILE if hydra.mode == RunMode.MULTIRUN else None
    if stop_file is not None:
        StopOnSignal.install(stop_file.parent)  # in a worker process of the sweep's launcher
        if requested_stop(stop_file) is not None:
            logging.getLogger("fedrec").info("the sweep is stopping: job %s does not start", hydra.job.num)
            return math.nan
        record_job_error(Path(hydra.runtime.output_dir), None)
    try:
        job_recipe(cfg)  # quick=true in a sweep: what this job's options take of the recipe
        summary = run(cfg)
    except (RunInterrupted, Interrupted) as e:
        if stop_file is not None:  # the other jobs save or do not start; the sweep's end says how to continue it
            print(f"interrupted: job {hydra.job.num}: {e}", file=sys.stderr)
            logging.getLogger("fedrec").warning("interrupted: %s", e)
            request_stop(stop_file, e.signum)
            return math.nan
        if not isinstance(e, RunInterrupted):
            raise
        ignore_interrupts()
        resume = f"; resume with: {resume_command(e.checkpoint)}" if e.checkpoint is not None else ""
        print(f"interrupted: {e}{resume}", file=sys.stderr)
        sys.exit(128 + e.signum)
    except (ConfigError, DatasetNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        if stop_file is not None:  # the other jobs go on; the sweep summary lists this one
            logging.getLogger("fedrec").error("error: %s", e)
            record_job_error(Path(hydra.runtime.output_dir), f"error: {e}")
            return math.nan
        discard_failed_run(Path(hydra.runtime.output_dir))  # nothing that looks like a run is left
        sys.exit(2)
    if not launched_as_secondary():  # rank 0 of a multi-process run reports it
        print(describe(Path(hydra.runtime.output_dir), summary))
        for note in quick_notes(cfg, summary):
            print(f"note: {note}")
    return objective(summary)


def ignore_interrupts() -> None:
    """The program reports why it stops: a further Ctrl-C or SIGTERM would only cut that report short."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def stopped(e: Interrupted) -> NoReturn:
    """End on an interrupt outside the rounds (before the first, or a second one while the first one's round is
    saved): one ``interrupted:`` line, the run folder removed if this process made it and it holds no result yet,
    exit code 128 + the signal's number (130 for SIGINT, 143 for SIGTERM)."""
    ignore_interrupts()
    run_folder = sys.modules.get("fedrec.app.run_folder")  # not imported yet: no run folder was made
    removed = run_folder.discard_failed_runs() if run_folder is not None else []
    print(f"interrupted: {e}" + "".join(f"; its run folder {out} was removed" for out in removed), file=sys.stderr)
    sys.exit(128 + e.signum)


def main() -> float | None:
    """``python train.py [overrides]``: expand ``quick=true`` into the experiment's short recipe, check the command
    line against the config files' schema (one ``error:`` line, exit code 2, nothing written), then let Hydra run
    the experiment. A Ctrl-C or SIGTERM before the first round is one ``interrupted:`` line (:func:`stopped`): the
    handlers are installed first, before the slow imports (Hydra, torch), which are all made in here."""
    with interrupts_raise("before the first round: nothing was trained"):
        try:
            import hydra

            import fedrec.app.resolvers  # noqa: F401  (${by_conventions:...} in the configs)
            from fedrec.app.presets import expand_quick
            from fedrec.app.schema import check_command_line
            from fedrec.errors import run_script
            from fedrec.trainer.distributed import launched_as_secondary

            def checked() -> None:
                sys.argv[1:] = expand_quick(CONF, sys.argv[1:])  # quick=true: the experiment's short recipe
                check_command_line(CONF, sys.argv[1:])
                if launched_as_secondary() and not any(a.startswith("hydra.output_subdir=") for a in sys.argv):
                    sys.argv.append("hydra.output_subdir=null")  # rank 0 alone writes the run folder's .hydra

            run_script(checked)
            return hydra.main(version_base="1.3", config_path="conf", config_name="config")(experiment)()
        except Interrupted as e:
            stopped(e)


if __name__ == "__main__":
    main()

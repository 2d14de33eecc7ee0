"""Entry point: ``python train.py +experiment=NAME [overrides]`` (``-m`` for Hydra multirun sweeps)."""
from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

import fedrec.resolvers  # noqa: F401  (${by_conventions:...} in the configs)

CONF = Path(__file__).resolve().parent / "conf"


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def experiment(cfg: DictConfig) -> float:
    """Run the composed config; a bad value or a missing dataset (not downloaded) is one ``error:`` line, and an
    interrupt (SIGINT, SIGTERM) after the round's checkpoint one ``interrupted:`` line saying how to resume."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from fedrec.cli import resume_command, run
    from fedrec.errors import ConfigError, DatasetNotFoundError
    from fedrec.run_folder import discard_failed_run
    from fedrec.sweeps import describe, objective
    from fedrec.trainer import RunInterrupted
    from fedrec.trainer.distributed import launched_as_secondary

    try:
        summary = run(cfg)
    except RunInterrupted as e:  # the sweep stops too
        resume = f"; resume with: {resume_command(e.checkpoint)}" if e.checkpoint is not None else ""
        print(f"interrupted: {e}{resume}", file=sys.stderr)
        sys.exit(128 + e.signum)
    except (ConfigError, DatasetNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        if HydraConfig.get().mode == RunMode.MULTIRUN:  # the other jobs go on; the sweep summary lists this one
            logging.getLogger("fedrec").error("error: %s", e)
            return math.nan
        discard_failed_run(Path(HydraConfig.get().runtime.output_dir))  # nothing that looks like a run is left
        sys.exit(2)
    if not launched_as_secondary():  # rank 0 of a multi-process run reports it
        print(describe(Path(HydraConfig.get().runtime.output_dir), summary))
    return objective(summary)


def main() -> float | None:
    """``python train.py [overrides]``: expand ``quick=true`` into the experiment's short recipe, check the command
    line against the config files' schema (one ``error:`` line, exit code 2, nothing written), then let Hydra run
    the experiment."""
    from fedrec.errors import run_script
    from fedrec.presets import expand_quick
    from fedrec.schema import check_command_line

    def checked() -> None:
        sys.argv[1:] = expand_quick(CONF, sys.argv[1:])  # quick=true: the experiment's short recipe
        check_command_line(CONF, sys.argv[1:])

    run_script(checked)
    return experiment()


if __name__ == "__main__":
    main()

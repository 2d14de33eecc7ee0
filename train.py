"""Entry point: ``python train.py +experiment=NAME [overrides]`` (``-m`` for Hydra multirun sweeps)."""
from __future__ import annotations

import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import hydra
from omegaconf import DictConfig

import fedrec.resolvers  # noqa: F401  (${by_conventions:...} in the configs)

CONF = Path(__file__).resolve().parent / "conf"


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def experiment(cfg: DictConfig) -> float:
    """Run the composed config; a bad value or a missing dataset (not downloaded) is one ``error:`` line."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from fedrec.cli import run
    from fedrec.errors import ConfigError, DatasetNotFoundError
    from fedrec.sweeps import describe, objective
    from fedrec.trainer.distributed import launched_as_secondary

    try:
        summary = run(cfg)
    except (ConfigError, DatasetNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        if HydraConfig.get().mode == RunMode.MULTIRUN:  # the other jobs go on; the sweep summary lists this one
            logging.getLogger("fedrec").error("error: %s", e)
            return math.nan
        sys.exit(2)
    if not launched_as_secondary():  # rank 0 of a multi-process run reports it
        print(describe(Path(HydraConfig.get().runtime.output_dir), summary))
    return objective(summary)


def null_group_error(args: Sequence[str]) -> str | None:
    """The error for the first override that sets a config group to null (``privacy=null``, also inside a sweep),
    which Hydra cannot compose (it would stop with a traceback); None if there is none."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    for arg in args:
        if arg.startswith("-") or "=" not in arg:  # Hydra's own flags (-m, -cn NAME, --cfg job, ...)
            continue
        try:
            override = parser.parse_override(arg)
        except OverrideParseException:
            continue  # Hydra reports it
        group, value = override.key_or_group, override.value()
        values = value.list if isinstance(value, ChoiceSweep) else [value]
        if override.is_delete() or not (CONF / group).is_dir() or None not in values:
            continue
        choices = ", ".join(sorted(p.stem for p in (CONF / group).glob("*.yaml")))
        return (f"{group}: null is not a config of the {group} group (one of: {choices}); to run without the "
                f"group, remove it with '~{group}'")
    return None


def main() -> float | None:
    """``python train.py [overrides]``: refuse a config group set to null, then let Hydra run the experiment."""
    error = null_group_error(sys.argv[1:])
    if error is not None:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    return experiment()


if __name__ == "__main__":
    main()

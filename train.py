"""Entry point: ``python train.py +experiment=NAME [overrides]`` (``-m`` for Hydra multirun sweeps)."""
from __future__ import annotations

import logging
import math
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from fedrec.cli import run
    from fedrec.errors import ConfigError, DatasetNotFoundError
    from fedrec.sweeps import describe, objective

    try:
        summary = run(cfg)
    except (ConfigError, DatasetNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        if HydraConfig.get().mode == RunMode.MULTIRUN:  # the other jobs go on; the sweep summary lists this one
            logging.getLogger("fedrec").error("error: %s", e)
            return math.nan
        sys.exit(2)
    print(describe(Path(HydraConfig.get().runtime.output_dir), summary))
    return objective(summary)


if __name__ == "__main__":
    main()

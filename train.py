"""Entry point: ``python train.py +experiment=NAME [overrides]`` (``-m`` for Hydra multirun sweeps)."""
from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float:
    from fedrec.cli import run
    from fedrec.errors import ConfigError, DatasetNotFoundError

    try:
        summary = run(cfg)
    except (ConfigError, DatasetNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    return float(summary.get("cumulative_regret", 0.0))


if __name__ == "__main__":
    main()

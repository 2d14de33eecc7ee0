"""The pieces of Hydra's private API (``hydra._internal`` and underscored names) fedrec relies on, in one place, so
that a Hydra release that changes them fails here, in ``tests/test_hydra_private.py``, and not somewhere inside a
command line.

Hydra has no public form of them: the parser of ``train.py``'s own command line (to read the overrides before
``hydra.main`` does), the start of a Hydra with ``hydra.main``'s config search path (to check a command line, and to
expand ``quick=true``, before the run starts), the basic sweeper's expansion of a sweep into its jobs (to tell a
sweep folder's jobs from another sweep's), and the function that writes a job's ``.hydra/*.yaml`` (replaced so that
those files are written atomically). The pinned ``hydra-core`` range in ``pyproject.toml`` is what they are tested
against.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any


def args_parser() -> argparse.ArgumentParser:
    """The parser ``hydra.main`` reads a command line with (``overrides``, ``--config-path``, ``--cfg``, ...)."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


def config_search_path(primary: str) -> Any:
    """``hydra.main``'s config search path for the primary config folder ``primary`` (a path or ``pkg://``)."""
    from hydra._internal.utils import create_config_search_path

    return create_config_search_path(primary)


def start_hydra(search_path: Any) -> None:
    """Initialise the global Hydra on ``search_path`` as ``hydra.main`` does (task name ``app``)."""
    from hydra._internal.hydra import Hydra

    Hydra.create_main_hydra2(task_name="app", config_search_path=search_path)


def sweep_jobs(overrides: Sequence[Any], max_batch_size: int | None) -> list[list[str]]:
    """The jobs the basic sweeper runs for the parsed ``overrides`` (one list of ``key=value`` per job, in its
    order)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return [job for batch in BasicSweeper.split_arguments(list(overrides), max_batch_size) for job in batch]


def replace_config_writer(write: Callable[[Any, str, Any], None]) -> None:
    """Make Hydra write a job's config files (``config.yaml``, ``hydra.yaml``, ``overrides.yaml`` under ``.hydra/``)
    with ``write(cfg, filename, output_dir)`` instead of its own writer, in this process."""
    import hydra.core.utils

    hydra.core.utils._save_config = write

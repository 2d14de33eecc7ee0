"""torch's intra-op thread count for a block of code, and the check of a ``num_threads`` setting (used by the
trainer, the command line and the budget planners, so a leaf of its own)."""
from __future__ import annotations

import numbers
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from fedrec.errors import ConfigError


def check_num_threads(value: object) -> int | None:
    """``num_threads`` as an int >= 1, or None; anything else is a ConfigError naming ``num_threads``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ConfigError(f"num_threads must be an integer >= 1 or None (leave torch's thread count alone), "
                          f"got {value!r}")
    return int(value)


def start_numba_threads(keep: int) -> None:
    """Start numba's thread pool now if numba is loaded, then give torch ``keep`` threads again. numba's OpenMP layer
    sets the process's OpenMP thread count (torch's too) to its own when its pool starts, at the first parallel
    kernel: inside a block that would silently change torch's count, and a run's numbers with it, mid-run."""
    numba = sys.modules.get("numba")
    if numba is not None:
        numba.get_num_threads()  # starts the pool
        if torch.get_num_threads() != keep:
            torch.set_num_threads(keep)


@contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """Run the block with torch's intra-op thread count set to ``num_threads`` (None: unchanged) and restore the
    count it had before, also when the block raises; numba's thread pool is started first
    (:func:`start_numba_threads`), so that the count holds through the block. The count is process-wide: trainers
    fitting in several Python threads at once should all use the same ``num_threads``. A bad count is a ConfigError
    naming ``num_threads``."""
    num_threads = check_num_threads(num_threads)
    before = torch.get_num_threads()
    start_numba_threads(keep=before)
    if num_threads is None:
        yield
        return
    if before != num_threads:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)

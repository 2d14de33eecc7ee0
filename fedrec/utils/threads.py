"""torch's intra-op thread count for a block of code, and the check of a ``num_threads`` setting (used by the
trainer, the command line and the budget planners, so a leaf of its own)."""
from __future__ import annotations

import numbers
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


@contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """Run the block with torch's intra-op thread count set to ``num_threads`` (None: unchanged) and restore the
    count it had before, also when the block raises. The count is process-wide: trainers fitting in several Python
    threads at once should all use the same ``num_threads``. A bad count is a ConfigError naming ``num_threads``."""
    num_threads = check_num_threads(num_threads)
    if num_threads is None:
        yield
        return
    before = torch.get_num_threads()
    if before != num_threads:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)

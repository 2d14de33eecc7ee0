"""Contiguous blocks of near-equal size: the parties' column blocks of vertical federation and the user-feature
groups of the Criteo log (a leaf helper, so environments and federation need not import each other)."""
from __future__ import annotations


def near_equal_sizes(total: int, parts: int) -> tuple[int, ...]:
    """``parts`` contiguous block sizes summing to ``total``, as equal as possible, the larger ones first."""
    base, extra = divmod(total, parts)
    return tuple(base + (j < extra) for j in range(parts))

"""KeyedRows: a block of rows drawn over all cores holds the numbers each row's stream gives on its own."""
from __future__ import annotations

import numpy as np
import pytest

from fedrec.utils import rng


@pytest.mark.parametrize("distribution", ["uniform", "normal", "laplace"])
def test_a_large_block_drawn_in_parallel_equals_each_rows_stream(monkeypatch: pytest.MonkeyPatch,
                                                                  distribution: str) -> None:
    owner, start = np.array([7, 0, 3, 7, 12]), np.array([0, 5, 1, 3, 2])
    serial = rng.KeyedRows(99, owner, start).draw(distribution, 9)
    monkeypatch.setattr(rng, "PARALLEL_DRAWS", 8)  # the parallel fill for a block this small
    parallel = rng.KeyedRows(99, owner, start).draw(distribution, 9)
    assert np.array_equal(parallel, serial)
    draw = {"uniform": rng.uniform, "normal": rng.normal, "laplace": rng.laplace}[distribution]
    for i, (o, s) in enumerate(zip(owner, start)):  # draw by draw, from the recipe's scalar functions
        state = np.uint64(rng.substream(np.uint64(99), o))
        assert parallel[i].tolist() == [draw(state, s + c) for c in range(9)]

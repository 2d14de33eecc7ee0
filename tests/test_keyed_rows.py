"""KeyedRows: a block of rows drawn over all cores holds the numbers each row's stream gives on its own, and the
torch transcription a GPU draws with gives the compiled recipe's numbers."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


@settings(max_examples=60, deadline=None)
@given(key=st.integers(0, 2**64 - 1), owners=st.lists(st.integers(0, 2**62), max_size=6),
       start=st.integers(0, 2**40), width=st.integers(0, 11), block=st.sampled_from([1, 7, 1 << 22]),
       distribution=st.sampled_from(["uniform", "normal", "laplace"]))
def test_the_torch_transcription_draws_the_compiled_recipes_numbers(key: int, owners: list[int], start: int,
                                                                   width: int, block: int, distribution: str) -> None:
    """What a GPU round draws on the device (:func:`rng.torch_draws`, run here on the CPU) against the compiled
    draws: the uniforms bit for bit (integer arithmetic and an exact conversion), normals and Laplace draws to the
    last bits of log, cos and sin (torch's vectorised functions and libm's may round differently); in blocks of
    ``block`` draws, keys and owners past 2^63 (signed int64 holding uint64 bits) and counters far from 0."""
    import torch

    owner = np.array(owners, dtype=np.int64)
    starts = start + np.arange(len(owner)) * 3  # odd and even starts: a Box-Muller pair split between two rows
    keyed = rng.KeyedRows(np.uint64(key), owner, starts)
    want = keyed.draw(distribution, width)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(rng, "TORCH_DRAW_BLOCK", block)
        got = rng.torch_draws(keyed.key, torch.tensor(owner), torch.tensor(starts), rng.DISTRIBUTIONS[distribution],
                              width).numpy()
    assert got.shape == want.shape
    if distribution == "uniform":
        assert np.array_equal(got, want)
    else:
        np.testing.assert_array_max_ulp(got, want, maxulp=4)
        assert np.all(np.sign(got) == np.sign(want))


def test_keyed_rows_as_a_cpu_tensor_are_the_compiled_draws() -> None:
    keyed = rng.KeyedRows(5, [3, 1, 4], [0, 1, 2])
    assert np.array_equal(keyed.tensor("normal", 6).numpy(), keyed.draw("normal", 6))

"""The one dyadic-cover walk (fedrec.privacy.tree_noise.cover_of, compiled) and its torch twin
(fedrec.privacy.tree.cover_nodes) against a direct per-node construction written here: for t = Σ_l b_l 2^l, the
cover of records 1..t is one node (l, t >> l) per set bit b_l, lowest level first."""
from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrec.privacy.tree import cover_nodes, dyadic_cover
from fedrec.privacy.tree_noise import MAX_LEVELS, cover, cover_of


def direct_cover(t: int) -> list[tuple[int, int]]:
    """Node by node: divide t by 2 until nothing is left, keeping (level, the quotient so far) at each odd step."""
    nodes, level, rest = [], 0, t
    while rest:
        if rest % 2 == 1:
            nodes.append((level, rest))
        rest //= 2
        level += 1
    return nodes


def compiled_cover(t: int) -> list[tuple[int, int]]:
    walked = cover_of(t, np.full(MAX_LEVELS, -1, dtype=np.int64))
    assert walked.t == t and (walked.levels[walked.count:] == -1).all()  # nothing written past the cover
    return [(int(level), t >> int(level)) for level in walked.levels[:walked.count]]


def torch_cover(t: torch.Tensor) -> list[list[tuple[int, int]]]:
    index, in_cover = cover_nodes(t, MAX_LEVELS)
    return [[(level, int(index[m, level])) for level in range(MAX_LEVELS) if in_cover[m, level]]
            for m in range(len(t))]


@settings(deadline=None)  # the first example compiles the walk
@given(st.integers(0, 2 ** 63 - 1))
def test_the_compiled_walk_and_its_torch_twin_are_the_direct_cover(t: int) -> None:
    want = direct_cover(t)
    assert compiled_cover(t) == want
    assert [tuple(node) for node in cover(t).tolist()] == want
    assert torch_cover(torch.tensor([t]))[0] == want
    assert [tuple(node) for node in dyadic_cover(t)] == want
    assert len(want) == bin(t).count("1")


@settings(deadline=None)
@given(st.lists(st.integers(0, 2 ** 40), min_size=1, max_size=30))
def test_the_torch_twin_walks_a_batch_of_times_at_once(times: list[int]) -> None:
    assert torch_cover(torch.tensor(times)) == [direct_cover(t) for t in times]


def test_every_small_cover_partitions_one_to_t_into_its_nodes() -> None:
    for t in range(1025):
        blocks = [range(((index - 1) << level) + 1, (index << level) + 1) for level, index in compiled_cover(t)]
        assert sorted(r for block in blocks for r in block) == list(range(1, t + 1))

"""The per-replicate wrapper written once (:func:`fedrec.utils.jit.over_replicates`): its serial and parallel kernels
run a body once for every replicate, keep the body's writes through named structures (which numba's parallel loops lose
when made in their own body), compile the body once for an int64 index, load from numba's cache in the next
process, and refuse a body whose parameters would shadow the loop's names."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from fedrec.utils.jit import F64, I64, jit, over_replicates


class Acc(NamedTuple):
    """A toy kernel structure: per replicate a row of values and a counter."""

    values: F64[2]
    calls: I64[1]


@jit
def _scale_replicate(r, acc, factor):
    """Replicate ``r``'s row times ``factor`` plus r, counted."""
    for j in range(acc.values.shape[1]):
        acc.values[r, j] = acc.values[r, j] * factor + r
    acc.calls[r] += 1


SCALE = over_replicates(_scale_replicate)


@pytest.mark.parametrize("variant", [0, 1], ids=["serial", "parallel"])
def test_every_replicate_runs_once_as_a_plain_loop_would(variant: int) -> None:
    R = 7
    rng = np.random.default_rng(3)
    values = rng.random((R, 5))
    acc = Acc(values.copy(), np.zeros(R, dtype=np.int64))
    SCALE[variant](R, acc, 2.5)
    expected = values.copy()
    for r in range(R):
        expected[r] = values[r] * 2.5 + r
    np.testing.assert_array_equal(acc.values, expected)
    assert acc.calls.tolist() == [1] * R
    SCALE[variant](3, acc, 1.0)  # the first ``replicates`` only
    assert acc.calls.tolist() == [2] * 3 + [1] * (R - 3)
    # the body compiled for the int64 index only (nothing compiled in this process when the loop came from the cache)
    assert {t[0].name for t in _scale_replicate.signatures} <= {"int64"}


def test_the_kernels_are_named_after_the_body_and_cached_apart() -> None:
    serial, parallel = SCALE
    assert serial.py_func.__name__ == "_scale_replicate_over_replicates"
    assert parallel.py_func.__name__ == "_scale_replicate_over_replicates_parallel"
    named = over_replicates(_scale_replicate, name="_scale_run")
    assert [k.py_func.__name__ for k in named] == ["_scale_run", "_scale_run_parallel"]


def test_a_body_parameter_that_shadows_the_loop_is_refused() -> None:
    def body(r, replicates):
        pass

    with pytest.raises(ValueError, match=r"parameter\(s\) \['replicates'\] would shadow"):
        over_replicates(body)


#: a script whose two kernels report numba's cache hits and misses
CACHED = """
import numpy as np
from fedrec.utils.jit import jit, over_replicates


@jit
def _fill(r, out):
    out[r] = r


kernels = over_replicates(_fill)
out = np.zeros(4)
for kernel in kernels:
    kernel(4, out)
assert out.tolist() == [0.0, 1.0, 2.0, 3.0]
print(sum(len(k.stats.cache_hits) for k in kernels), sum(len(k.stats.cache_misses) for k in kernels))
"""


def test_the_kernels_load_from_numbas_cache_in_the_next_process(tmp_path: Path) -> None:
    script = tmp_path / "fill.py"
    script.write_text(CACHED)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(Path(__file__).parents[1])}
    runs = [subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, check=True)
            for _ in range(2)]
    assert [run.stdout.split() for run in runs] == [["0", "2"], ["2", "0"]]

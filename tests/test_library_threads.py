"""FederatedTrainer(num_threads=...): fit runs with that many torch intra-op threads (default 1, as the CLI) and gives
the caller its own count back afterwards, also when fit raises; None leaves torch's setting alone. Timings are in
scripts/bench_library.py (no timing assertions here)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedrec.data import load_ratings
from fedrec.errors import ConfigError
from fedrec.models import FedGNN
from fedrec.privacy import ClientDP
from fedrec.recsys import FedSGD
from fedrec.tasks import FedRecTask
from fedrec.tasks.base import FederatedTask
from fedrec.trainer import Callback, FederatedTrainer, torch_threads
from tests.helpers import write_ml1m

CALLER = 3  # the caller's own thread count in these tests: neither the default (1) nor a configured count (2)


@pytest.fixture
def caller_threads() -> Iterator[int]:
    """torch set to :data:`CALLER` threads for the test, and the session's count (conftest: 1) restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(CALLER)
    try:
        yield CALLER
    finally:
        torch.set_num_threads(before)


class CountingTask(FederatedTask):
    """A few rounds of a small matrix product; records torch's thread count inside every round."""

    def __init__(self, rounds: int = 3, fail_at: int | None = None) -> None:
        self.num_rounds = rounds
        self.fail_at = fail_at
        self.threads: list[int] = []
        self.trainer: Any = None

    def setup(self, trainer: Any) -> None:
        self.trainer = trainer  # as FedRecTask does: the trainer's settings must not enter the task's identity

    def run_round(self, round_idx: int) -> dict[str, float]:
        self.threads.append(torch.get_num_threads())
        if round_idx == self.fail_at:
            raise ValueError("round failed")
        x = torch.randn(16, 8)
        return {"value": float((x @ x.T).trace())}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def summary(self) -> dict[str, Any]:
        return {}


class RecordThreads(Callback):
    """Records torch's thread count at every hook of the trainer."""

    def __init__(self, raise_at_round: int | None = None, exc: type[BaseException] = RuntimeError) -> None:
        self.seen: dict[str, list[int]] = {}
        self.raise_at_round, self.exc = raise_at_round, exc

    def _record(self, hook: str) -> None:
        self.seen.setdefault(hook, []).append(torch.get_num_threads())

    def on_fit_start(self, trainer, task) -> None:
        self._record("on_fit_start")

    def on_round_start(self, trainer, task, round_idx) -> None:
        self._record("on_round_start")

    def on_round_end(self, trainer, task, round_idx, metrics) -> None:
        self._record("on_round_end")
        if round_idx == self.raise_at_round:
            raise self.exc("stopped by the callback")

    def on_fit_end(self, trainer, task) -> None:
        self._record("on_fit_end")

    def counts(self) -> set[int]:
        return {n for values in self.seen.values() for n in values}


def fit(tmp_path: Path, task: FederatedTask, callback: Callback | None = None, **kwargs: Any) -> FederatedTrainer:
    trainer = FederatedTrainer(default_root_dir=tmp_path, callbacks=[callback] if callback else [], loggers=[],
                               enable_progress_bar=False, **kwargs)
    trainer.fit(task)
    return trainer


def test_default_is_one_thread_during_fit_and_the_callers_count_after(tmp_path: Path, caller_threads: int) -> None:
    task, cb = CountingTask(), RecordThreads()
    assert FederatedTrainer().num_threads == 1
    fit(tmp_path, task, cb)
    assert task.threads == [1, 1, 1]
    assert cb.counts() == {1} and set(cb.seen) == {"on_fit_start", "on_round_start", "on_round_end", "on_fit_end"}
    assert torch.get_num_threads() == caller_threads


@pytest.mark.parametrize("threads", [1, 2, np.int64(2)])
def test_fit_runs_with_the_configured_count(tmp_path: Path, caller_threads: int, threads: int) -> None:
    task, cb = CountingTask(), RecordThreads()
    fit(tmp_path, task, cb, num_threads=threads)
    assert set(task.threads) == {int(threads)} and cb.counts() == {int(threads)}
    assert torch.get_num_threads() == caller_threads


def test_none_leaves_torchs_setting_alone(tmp_path: Path, caller_threads: int) -> None:
    task, cb = CountingTask(), RecordThreads()
    fit(tmp_path, task, cb, num_threads=None)
    assert set(task.threads) == {caller_threads} and cb.counts() == {caller_threads}
    assert torch.get_num_threads() == caller_threads


@pytest.mark.parametrize("where", ["task", "callback", "interrupt"])
def test_the_callers_count_comes_back_when_fit_raises(tmp_path: Path, caller_threads: int, where: str) -> None:
    if where == "task":
        task, cb, exc = CountingTask(fail_at=1), RecordThreads(), ValueError
    else:
        exc = KeyboardInterrupt if where == "interrupt" else RuntimeError
        task, cb = CountingTask(), RecordThreads(raise_at_round=1, exc=exc)
    with pytest.raises(exc):
        fit(tmp_path, task, cb, num_threads=2)
    assert set(task.threads) == {2}
    assert torch.get_num_threads() == caller_threads


def test_a_count_changed_during_fit_is_put_back(tmp_path: Path, caller_threads: int) -> None:
    """Code inside a round that changes torch's count (e.g. a compiled kernel's thread layer) does not leak out."""

    class Changes(Callback):
        def on_round_end(self, trainer, task, round_idx, metrics) -> None:
            torch.set_num_threads(2)

    fit(tmp_path, CountingTask(), Changes())
    assert torch.get_num_threads() == caller_threads


def test_the_count_applies_to_a_resumed_fit_and_may_differ_from_the_checkpoints(tmp_path: Path,
                                                                                caller_threads: int) -> None:
    """The thread count is how a run executes, not what it computes: a resume may change it."""
    fit(tmp_path / "first", CountingTask(rounds=2))  # default: 1 thread
    task, cb = CountingTask(rounds=4), RecordThreads()
    trainer = FederatedTrainer(default_root_dir=tmp_path / "resumed", callbacks=[cb], loggers=[],
                               enable_progress_bar=False, num_threads=2)
    trainer.fit(task, ckpt_path=tmp_path / "first" / "checkpoints" / "last.ckpt")
    assert task.threads == [2, 2] and cb.counts() == {2}
    assert torch.get_num_threads() == caller_threads


def test_torch_threads_context_sets_and_restores(caller_threads: int) -> None:
    """The context manager the trainer uses (and the CLI can use around building a run)."""
    with torch_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == caller_threads
    with torch_threads(None):
        assert torch.get_num_threads() == caller_threads
    with pytest.raises(KeyError), torch_threads(1):
        assert torch.get_num_threads() == 1
        raise KeyError("inside")
    assert torch.get_num_threads() == caller_threads
    with pytest.raises(ConfigError, match="num_threads"), torch_threads(0):
        pass
    assert torch.get_num_threads() == caller_threads


@pytest.mark.parametrize("bad", [0, -1, 1.5, 2.0, "x", "2", True, [1]])
def test_bad_thread_counts_are_config_errors_naming_num_threads(bad: Any, caller_threads: int) -> None:
    with pytest.raises(ConfigError, match="num_threads"):
        FederatedTrainer(num_threads=bad)
    assert torch.get_num_threads() == caller_threads


def test_readme_example_runs_single_threaded_without_the_user_asking(tmp_path: Path, caller_threads: int) -> None:
    """The README's FedRec example (library path, here on a small MovieLens-format dataset): FederatedTrainer() trains
    on one thread, and gives the same results as a run where the caller set one thread itself."""
    folder = write_ml1m(tmp_path / "ml1m", users=30, items=40, seed=1)

    def run(**trainer_kwargs: Any) -> tuple[dict[str, Any], set[int]]:
        data = load_ratings("ml-1m", folder, seed=0, rounds=4, num_clients=8)
        dp = ClientDP(data.num_clients, "gaussian", epsilon=10.0, delta=1e-5, clip=0.1)
        torch.manual_seed(0)
        task = FedRecTask(data, FedGNN(data.num_users, data.num_items, embed_dim=8), FedSGD(), dp, rounds=4)
        cb = RecordThreads()
        fit(tmp_path / f"run{len(list(tmp_path.iterdir()))}", task, cb, **trainer_kwargs)
        return task.summary(), cb.counts()

    summary, counts = run()
    assert counts == {1} and torch.get_num_threads() == caller_threads
    torch.set_num_threads(1)
    expected, _ = run(num_threads=None)
    torch.set_num_threads(caller_threads)
    assert summary == expected


FIRST_PARALLEL_KERNEL = """
import sys, torch
from fedrec.trainer import FederatedTrainer
from fedrec.utils.rng import PARALLEL_DRAWS, KeyedRows
from tests.test_library_threads import CountingTask

class DrawingTask(CountingTask):  # round 1 draws a block large enough for numba's parallel kernel
    def run_round(self, round_idx):
        if round_idx == 1:
            KeyedRows(7, range(4)).draw("normal", PARALLEL_DRAWS // 4)
        return super().run_round(round_idx)

torch.ones(8).sum()  # torch's thread pool in use, as by a run's set-up
task = DrawingTask(rounds=4)
FederatedTrainer(default_root_dir=sys.argv[1], loggers=[], enable_progress_bar=False).fit(task)
import numba
print(numba.threading_layer())
print(task.threads)
"""


def test_the_first_parallel_numba_kernel_of_a_process_leaves_the_count_alone(tmp_path: Path) -> None:
    """numba's OpenMP pool sets the process's thread count to its own when it starts (at the first parallel kernel):
    a fresh process's first fit keeps its one thread through that round and the rounds after, as a resumed run in a
    new process must to give the same numbers. The OpenMP layer is forced (the one that resets the count; numba
    would pick TBB where it is installed)."""
    import os
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", FIRST_PARALLEL_KERNEL, str(tmp_path)], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], timeout=300,
                         env={**os.environ, "NUMBA_NUM_THREADS": "2", "NUMBA_THREADING_LAYER": "omp"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines()[-2:] == ["omp", "[1, 1, 1, 1]"]


DRAW_IN_A_BUILD = """
import sys, torch
from fedrec.utils.threads import torch_threads

torch.ones(8).sum()
with torch_threads(1):  # as the command line: the count is set before the run is built, numba not yet loaded
    assert "numba" not in sys.modules
    from fedrec.utils.rng import PARALLEL_DRAWS, KeyedRows
    KeyedRows(7, range(4)).draw("normal", PARALLEL_DRAWS // 4)  # the process's first parallel kernel
    import numba
    print(numba.threading_layer())
    print(torch.get_num_threads())
"""


def test_a_parallel_draw_while_a_run_is_built_leaves_the_count_alone() -> None:
    """The command line sets the count before it builds the run, numba is loaded during the build, and a build may
    draw a block large enough for the parallel kernel (numba's pool starting there): the draw keeps torch's count."""
    import os
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", DRAW_IN_A_BUILD], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], timeout=300,
                         env={**os.environ, "NUMBA_NUM_THREADS": "2", "NUMBA_THREADING_LAYER": "omp"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.splitlines()[-2:] == ["omp", "1"]

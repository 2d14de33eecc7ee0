"""Client–server bandit runs sharded by replicates across processes equal the one-process run (issue 41, item 5).

Each process plays a contiguous share of the replicates (their environment streams and LinTS draws are keyed by the
run's replicate), the per-replicate results are summed over the processes, and a checkpoint holds the state dict one
process would hold. The reference is the one-process run itself: decision for decision, metric for metric, and the
protocol's whole state, exactly. Ranks are threads with a threaded all-reduce (fast, every protocol and layout), and
one run goes through ``train.py trainer.devices=2`` with Lightning Fabric's gloo DDP.
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from fedrec.app.sweeps import without_timings
from fedrec.bandits import LinTS
from fedrec.envs.synthetic import LinearEnv
from fedrec.errors import ConfigError
from fedrec.federation.collective import Collective
from fedrec.protocols import AsyncLinUCB, AsyncLinUCBAM, CentralizedLinUCB, StepProtocol, SyncLinUCB
from fedrec.protocols.fed_linucb import FedLinUCB
from fedrec.tasks import BanditTask
from fedrec.tasks import bandit as bandit_task
from fedrec.trainer.distributed import check_shardable
from tests.helpers import LAM, ROOT, StubTrainer, ThreadCollective, ThreadHub, on_ranks, ucb

N, DIM, ARMS, STEPS, PER_ROUND = 400, 4, 5, 600, 100
ROUNDS = STEPS // PER_ROUND

#: (protocol class, its settings): the three protocols, both layouts, LinTS (streams keyed by replicate), the torch path
CASES: dict[str, tuple[type[StepProtocol], dict[str, Any]]] = {
    "async-dense": (AsyncLinUCB, {"gamma_u": 2.0, "gamma_d": 2.0}),
    "async-sparse": (AsyncLinUCB, {"gamma_u": 2.0, "gamma_d": 2.0, "layout": "sparse"}),
    "async-sparse-lints": (AsyncLinUCB, {"layout": "sparse", "policy": functools.partial(LinTS, v=0.3, lam=LAM)}),
    "async-sparse-torch": (AsyncLinUCB, {"layout": "sparse", "backend": "torch"}),
    "sync-sparse": (SyncLinUCB, {"threshold": 1.0, "layout": "sparse"}),
    "sync-dense": (SyncLinUCB, {"threshold": 1.0}),
    "fed_linucb": (FedLinUCB, {"period": 25}),
}


class RecordingTask(BanditTask):
    """A bandit task that keeps every decision of its protocol (of this process's replicates), round by round."""

    def setup(self, trainer: Any) -> None:
        super().setup(trainer)
        self.arms: list[torch.Tensor] = []
        run = self.protocol.run

        def recorded(clients: torch.Tensor, contexts: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
            arms = run(clients, contexts, rewards)
            self.arms.append(arms.clone())
            return arms

        self.protocol.run = recorded


def make_task(case: str, replicates: int = 3) -> RecordingTask:
    """A small run of ``case``: zipf arrivals, so that the shares of the sparse layout allocate different slots."""
    cls, kw = CASES[case]
    env = LinearEnv(num_clients=N, dim=DIM, num_arms=ARMS, replicates=replicates, seed=6, contexts="ball",
                    arrival="zipf")
    kw = {"policy": ucb(), **kw}
    protocol = cls(N, DIM, replicates=replicates, seed=6, **kw)
    return RecordingTask(env, protocol, STEPS, PER_ROUND)


def play(tasks: list[RecordingTask], rounds: range, state: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """``tasks`` as the ranks of one run (threads; one task: one process), from checkpoint ``state`` when given, for
    ``rounds``: each rank's metrics, decisions (R_rank, steps) and task state dict."""
    hub = ThreadHub(len(tasks))

    def work(rank: int) -> dict[str, Any]:
        task = tasks[rank]
        if state is not None:
            task.load_state_dict(state)
        task.setup(StubTrainer(ThreadCollective(rank, hub) if len(tasks) > 1 else Collective()))
        history = [task.run_round(r) for r in rounds]
        return {"history": history, "arms": torch.cat(task.arms, 1), "state": task.state_dict(),
                "summary": task.summary()}

    return on_ranks(hub, work)


def assert_same_state(a: Any, b: Any, where: str = "state") -> None:
    """Two (nested) state dicts hold the same keys in the same order and equal tensors, exactly."""
    if isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same_state(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), where
    else:
        assert a == b, where


def assert_equal_runs(single: dict[str, Any], ranks: list[dict[str, Any]]) -> None:
    """Every rank reports the one-process metrics and summary, rank 0 gathers its state (the others hold their
    share of the protocol's alone), and the ranks' decisions, in rank order, are its decisions."""
    assert torch.equal(torch.cat([r["arms"] for r in ranks]), single["arms"])
    assert_same_state(ranks[0]["state"], single["state"])
    for rank in ranks:
        assert rank["history"] == single["history"]
        assert rank["summary"] == single["summary"]
    for rank in ranks[1:]:
        assert rank["state"]["protocol"] is None
        assert_same_state({**rank["state"], "protocol": None}, {**single["state"], "protocol": None})


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_ranks_equal_one_process_decision_for_decision(case: str) -> None:
    single = play([make_task(case)], range(ROUNDS))[0]
    ranks = play([make_task(case) for _ in range(2)], range(ROUNDS))
    assert [r["arms"].shape[0] for r in ranks] == [1, 2]  # replicates 0 | 1, 2
    assert_equal_runs(single, ranks)
    assert single["summary"]["comm_messages"] > 0  # the clients communicated


def test_the_sparse_shares_use_different_slots() -> None:
    """What re-lays the slots of a saved state: the shares of the sparse layout use different numbers of slots
    (replicate 0 fewer than replicates 1, 2 after two rounds, more at the end), and the saved state is the one-process
    run's all the same (the tests above and below)."""
    tasks = [make_task("async-sparse") for _ in range(2)]
    play(tasks, range(2))
    assert tasks[0].protocol.slots_used < tasks[1].protocol.slots_used
    play(tasks, range(2, ROUNDS))
    assert tasks[0].protocol.slots_used > tasks[1].protocol.slots_used


def test_the_state_gathers_in_pieces_of_any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of 5 scalars split rows, shares and entries: rank 0 assembles the one-process state all the same."""
    monkeypatch.setattr(bandit_task, "GATHER_SCALARS", 5)
    single = play([make_task("async-sparse")], range(2))[0]
    assert_equal_runs(single, play([make_task("async-sparse") for _ in range(2)], range(2)))


def test_three_ranks_of_one_replicate_each_equal_one_process() -> None:
    single = play([make_task("async-sparse-lints")], range(ROUNDS))[0]
    assert_equal_runs(single, play([make_task("async-sparse-lints") for _ in range(3)], range(ROUNDS)))


@pytest.mark.parametrize("case", ["async-sparse", "sync-sparse", "fed_linucb"])
def test_an_interrupted_sharded_run_resumes_exactly(case: str) -> None:
    """Two rounds on two ranks, their checkpoint's state resumed on two ranks, equals the uninterrupted run; the
    state is the one-process run's, so that one process resumes it too, and three ranks resume one process's."""
    whole = play([make_task(case)], range(ROUNDS))[0]
    part = play([make_task(case) for _ in range(2)], range(2))
    resumed = play([make_task(case) for _ in range(2)], range(2, ROUNDS), part[0]["state"])
    for rank in resumed:
        assert rank["history"] == whole["history"][2:]
        assert rank["summary"] == whole["summary"]
    assert_same_state(resumed[0]["state"], whole["state"])
    later = torch.cat([r["arms"] for r in resumed])
    assert torch.equal(later, whole["arms"][:, 2 * PER_ROUND:])
    in_one = play([make_task(case)], range(2, ROUNDS), part[0]["state"])[0]
    assert_same_state(in_one["state"], whole["state"])
    first = play([make_task(case)], range(2))[0]
    in_three = play([make_task(case) for _ in range(3)], range(2, ROUNDS), first["state"])
    assert torch.equal(torch.cat([r["arms"] for r in in_three]), later)
    assert_same_state(in_three[0]["state"], whole["state"])


def test_a_replicates_decisions_do_not_depend_on_the_replicates_beside_it() -> None:
    """Replicate r's run does not depend on the replicates beside it: replicate 2 of a three-replicate run is the
    share [2, 3) of it, the same decisions as a part built before any step or after some."""
    full = make_task("async-sparse-lints")
    part = full.protocol.replicates_part(2, 3)
    batch = full.env.interactions(0, STEPS)
    arms = full.protocol.run(batch.clients, batch.contexts, batch.rewards)
    mine = full.env.interactions(0, STEPS, range(2, 3))
    assert torch.equal(part.run(mine.clients, mine.contexts, mine.rewards), arms[2:])
    assert part.first_replicate == 2 and part.replicates == 1


# ------------------------------------------------------------------------------------------------ refusals
def _task_of(protocol: StepProtocol, replicates: int) -> BanditTask:
    env = LinearEnv(num_clients=protocol.num_clients, dim=DIM, num_arms=ARMS, replicates=replicates, seed=0)
    return BanditTask(env, protocol, 100)


def test_fewer_replicates_than_processes_is_refused_naming_both_fields() -> None:
    task = _task_of(AsyncLinUCB(20, DIM, replicates=2), 2)
    check_shardable(task, 2)
    with pytest.raises(ConfigError, match=r"^3 processes \(trainer\.num_nodes × trainer\.devices\): .*needs as many "
                                          r"replicates at least \(got replicates=2\)"):
        check_shardable(task, 3)
    with pytest.raises(ConfigError, match=r"^4 processes .*\(got replicates=2\)"):
        check_shardable(task, 2, num_nodes=2)


@pytest.mark.parametrize("protocol", [CentralizedLinUCB(20, DIM, replicates=2), AsyncLinUCBAM(20, DIM, replicates=2)],
                         ids=lambda p: type(p).__name__)
def test_other_bandit_protocols_still_run_in_one_process(protocol: StepProtocol) -> None:
    task = _task_of(protocol, 2)
    assert not task.supports_sharding
    with pytest.raises(ConfigError, match=r"trainer\.devices=2: BanditTask runs in one process .*bandit runs of "
                                          r"protocol=async\|sync\|fed_linucb their replicates"):
        check_shardable(task, 2)


# ------------------------------------------------------------------------------------------------ train.py, 2 processes
#: a sparse Async-LinUCB run of three replicates, checkpointed every two rounds
RUN = ["env.num_clients=2000", "env.arrival=zipf", "replicates=3", "protocol.layout=sparse", "task.steps=1200",
       "task.steps_per_round=200", "plots=false", "trainer.checkpoint_every=2"]


def _train(out: Path, *extra: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("LOCAL_RANK", None)
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *RUN, f"hydra.run.dir={out}", *extra],
                          cwd=out.parent, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {"summary": without_timings(json.loads((out / "summary.json").read_text())),
            "metrics": (out / "metrics.csv").read_text(), "stdout": proc.stdout,
            "ckpt": torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)}


def _assert_same_files(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert b["summary"] == a["summary"]
    assert b["metrics"] == a["metrics"]
    assert_same_state(b["ckpt"]["task"], a["ckpt"]["task"])
    assert [without_timings(m) for m in b["ckpt"]["history"]] == [without_timings(m) for m in a["ckpt"]["history"]]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _train(tmp_path_factory.mktemp("one") / "run")


def test_two_gloo_processes_equal_one(one_process: dict[str, Any], tmp_path: Path) -> None:
    two = _train(tmp_path / "two", "trainer.devices=2")
    _assert_same_files(one_process, two)
    assert two["stdout"].count("run folder:") == 1  # rank 0 alone reports
    assert one_process["summary"]["replicates"] == 3


@pytest.mark.slow
def test_a_two_process_run_resumes_exactly(one_process: dict[str, Any], tmp_path: Path) -> None:
    """Two rounds on two processes, two more on two from their checkpoint, the rest in one: the uninterrupted
    one-process run. Marked slow: three runs of two Python start-ups each."""
    part = tmp_path / "part"
    ckpt = f"ckpt_path={part / 'checkpoints' / 'last.ckpt'}"
    _train(part, "trainer.max_rounds=2", "trainer.devices=2")
    _train(part, ckpt, "trainer.max_rounds=4", "trainer.devices=2")
    _assert_same_files(one_process, _train(part, ckpt))


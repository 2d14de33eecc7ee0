"""FederatedTrainer: exact resume, callback hooks and state, stopping, atomic checkpoints, logging cadence."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from fedrec.envs.synthetic import LinearEnv
from fedrec.errors import ConfigError
from fedrec.protocols import AsyncLinUCB, AsyncLinUCBAM, SyncLinUCB
from fedrec.tasks import BanditTask
from fedrec.trainer import Callback, FederatedTrainer
from fedrec.trainer.checkpoint import load_checkpoint

N, D, K = 20, 5, 5
STEPS, STEPS_PER_ROUND = 600, 50
ROUNDS = STEPS // STEPS_PER_ROUND  # 12


def make_task(protocol: str = "async", replicates: int = 1, seed: int = 7) -> BanditTask:
    """A small, fast task; thresholds low enough that every protocol communicates within 600 steps."""
    global_dim = 3 if protocol == "am" else None
    env = LinearEnv(num_clients=N, dim=D, num_arms=K, replicates=replicates, seed=seed, global_dim=global_dim)
    if protocol == "async":
        proto = AsyncLinUCB(N, D, replicates, gamma_u=2.0, gamma_d=2.0)
    elif protocol == "am":
        proto = AsyncLinUCBAM(N, D, replicates, global_dim=3, warmup=True, gamma_u=2.0, gamma_d=2.0)
    elif protocol == "sync":
        proto = SyncLinUCB(N, D, replicates, threshold=1.0)
    else:  # pragma: no cover - test helper misuse
        raise ValueError(protocol)
    return BanditTask(env, proto, steps=STEPS, steps_per_round=STEPS_PER_ROUND)


def make_trainer(root: Path, **kwargs: Any) -> FederatedTrainer:
    kwargs.setdefault("loggers", [])
    kwargs.setdefault("enable_progress_bar", False)
    return FederatedTrainer(default_root_dir=root, **kwargs)


def assert_identical(a: Any, b: Any, where: str = "state") -> None:
    """Recursive bit-for-bit equality of nested dicts / lists / tensors / scalars."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        if not torch.equal(a, b):
            delta = (a.double() - b.double()).abs().max().item() if a.is_floating_point() else "n/a"
            raise AssertionError(f"{where} differs (max |difference| = {delta})")
    elif isinstance(a, dict):
        assert isinstance(b, dict), where
        assert list(a) == list(b), f"{where}: keys {list(a)} vs {list(b)}"
        for k in a:
            assert_identical(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


class Interrupt(Callback):
    """Simulates Ctrl-C at the end of round ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_round_end(self, trainer, task, round_idx, metrics) -> None:
        if round_idx == self.at:
            raise KeyboardInterrupt


class Counter(Callback):
    """A stateful callback: counts the rounds it saw and sums the regret it was shown."""

    def __init__(self) -> None:
        self.rounds_seen = 0
        self.regret_sum = 0.0
        self.loaded: dict[str, Any] | None = None
        self.round_at_fit_start: int | None = None
        self.state_at_fit_start: tuple[int, float] | None = None

    def on_fit_start(self, trainer, task) -> None:
        self.round_at_fit_start = trainer.round
        self.state_at_fit_start = (self.rounds_seen, self.regret_sum)

    def on_round_end(self, trainer, task, round_idx, metrics) -> None:
        self.rounds_seen += 1
        self.regret_sum += metrics["cumulative_regret"]

    def state_dict(self) -> dict[str, Any]:
        return {"rounds_seen": self.rounds_seen, "regret_sum": self.regret_sum}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded = dict(state)
        self.rounds_seen = state["rounds_seen"]
        self.regret_sum = state["regret_sum"]


class FakeLogger:
    """Implements the part of the Lightning logger API the trainer uses."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, dict[str, float]]] = []
        self.saves = 0
        self.finalized: list[str] = []

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))

    def save(self) -> None:
        self.saves += 1

    def finalize(self, status: str) -> None:
        self.finalized.append(status)


def interrupted_then_resumed(
    tmp_path: Path, protocol: str, replicates: int, every: int, interrupt_at: int, **trainer_kwargs: Any
) -> tuple[FederatedTrainer, BanditTask, dict[str, Any]]:
    """Run until a KeyboardInterrupt at the end of round ``interrupt_at`` (checkpoints every ``every`` rounds),
    then resume from ``last.ckpt`` in a new trainer with a new task. Returns (trainer, task, checkpoint used)."""
    crashed = make_trainer(tmp_path / "crashed", checkpoint_every=every, callbacks=[Interrupt(interrupt_at)])
    with pytest.raises(KeyboardInterrupt):
        crashed.fit(make_task(protocol, replicates))
    ckpt_path = tmp_path / "crashed" / "checkpoints" / "last.ckpt"
    ckpt = load_checkpoint(ckpt_path)
    assert ckpt["round"] == (interrupt_at // every) * every  # the latest periodic checkpoint, not the crash point
    trainer = make_trainer(tmp_path / "resumed", checkpoint_every=every, **trainer_kwargs)
    task = make_task(protocol, replicates)
    trainer.fit(task, ckpt_path=ckpt_path)
    return trainer, task, ckpt


# ------------------------------------------------------------------------------------------------ exact resume
RESUME_CASES = [("async", 1), ("async", 2), ("am", 1), ("sync", 2)]


@pytest.fixture(scope="module")
def resume_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, int], dict[str, Any]]:
    """Per case, computed on first use: an uninterrupted run, and a run that checkpoints every 4 rounds, crashes
    at the end of round index 5 (rounds 4 and 5 are lost) and is resumed in a new trainer with a new task."""
    cache: dict[tuple[str, int], dict[str, Any]] = {}

    def get(protocol: str, replicates: int) -> dict[str, Any]:
        key = (protocol, replicates)
        if key not in cache:
            tmp = tmp_path_factory.mktemp(f"resume_{protocol}_{replicates}")
            full_task = make_task(protocol, replicates)
            full = make_trainer(tmp / "full")
            full.fit(full_task)
            trainer, task, ckpt = interrupted_then_resumed(tmp, protocol, replicates, every=4, interrupt_at=5)
            cache[key] = dict(full=full, full_task=full_task, trainer=trainer, task=task, ckpt=ckpt)
        return cache[key]

    return get


@pytest.mark.parametrize(("protocol", "replicates"), RESUME_CASES, ids=lambda v: str(v))
def test_resume_after_interrupt_is_bit_exact(resume_runs, protocol: str, replicates: int) -> None:
    r = resume_runs(protocol, replicates)
    full_history = r["full"].history
    assert len(full_history) == ROUNDS
    assert full_history[-1]["comm_messages"] > 0  # the protocol state that must survive the resume is non-trivial
    assert r["ckpt"]["history"] == full_history[:4]
    assert r["trainer"].round == ROUNDS
    assert r["trainer"].history == full_history  # every metric of every round, bit for bit
    assert r["task"].summary() == r["full_task"].summary()
    assert r["trainer"].wall_seconds >= r["ckpt"]["wall_seconds"] > 0


@pytest.mark.parametrize(("protocol", "replicates"), RESUME_CASES, ids=lambda v: str(v))
def test_resume_continues_with_bit_identical_protocol_state(resume_runs, protocol: str, replicates: int) -> None:
    """Not only the logged metrics: every statistic of the resumed run equals the uninterrupted run's, so the
    metrics cannot drift apart later (e.g. through an argmax tie flipped by a last-bit difference)."""
    r = resume_runs(protocol, replicates)
    assert_identical(r["task"].state_dict(), r["full_task"].state_dict(), "task")


def test_resume_after_max_rounds_matches_uninterrupted(tmp_path: Path) -> None:
    full_task = make_task()
    full_history = make_trainer(tmp_path / "full").fit(full_task)

    first = make_trainer(tmp_path / "part", max_rounds=5)
    assert len(first.fit(make_task())) == 5
    resumed_task = make_task()
    ckpt_path = tmp_path / "part" / "checkpoints" / "last.ckpt"
    history = make_trainer(tmp_path / "rest").fit(resumed_task, ckpt_path=ckpt_path)
    assert history == full_history
    assert resumed_task.summary() == full_task.summary()


def test_resume_from_finished_run_runs_nothing_more(tmp_path: Path) -> None:
    task = make_task()
    history = make_trainer(tmp_path / "a").fit(task)
    again = make_trainer(tmp_path / "b", callbacks=[Recorder()])
    task2 = make_task()
    assert again.fit(task2, ckpt_path=tmp_path / "a" / "checkpoints" / "last.ckpt") == history
    assert task2.summary() == task.summary()
    assert [e for e in again.callbacks[0].events if e[0] in ("round_start", "round_end")] == []


# ------------------------------------------------------------------------------------------------ callbacks
class Recorder(Callback):
    """Records every hook call."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def on_fit_start(self, trainer, task) -> None:
        self.events.append(("fit_start", trainer.round))

    def on_round_start(self, trainer, task, round_idx) -> None:
        self.events.append(("round_start", round_idx))

    def on_round_end(self, trainer, task, round_idx, metrics) -> None:
        assert metrics == trainer.history[-1]
        self.events.append(("round_end", round_idx, metrics["round"], metrics["steps"], task.t))

    def on_save_checkpoint(self, trainer, task, checkpoint) -> None:
        self.events.append(("save", checkpoint["round"]))
        checkpoint["recorder_note"] = f"saved at {checkpoint['round']}"

    def on_fit_end(self, trainer, task) -> None:
        self.events.append(("fit_end", trainer.round))


def expected_events(first_round: int, every: int, total: int = ROUNDS) -> list[tuple]:
    out: list[tuple] = [("fit_start", first_round)]
    for r in range(first_round, total):
        steps = min((r + 1) * STEPS_PER_ROUND, STEPS)
        out += [("round_start", r), ("round_end", r, r, float(steps), steps)]
        if every and (r + 1) % every == 0:
            out.append(("save", r + 1))
    out += [("fit_end", total), ("save", total)]
    return out


def test_hooks_called_in_order_with_round_indices(tmp_path: Path) -> None:
    rec = Recorder()
    make_trainer(tmp_path, checkpoint_every=5, callbacks=[rec]).fit(make_task())
    assert rec.events == expected_events(0, every=5)
    # on_save_checkpoint can add to the checkpoint before it is written
    assert load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["recorder_note"] == f"saved at {ROUNDS}"


def test_hooks_on_resume_start_at_the_checkpointed_round(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        make_trainer(tmp_path / "a", checkpoint_every=3, callbacks=[Interrupt(7)]).fit(make_task())
    rec = Recorder()
    make_trainer(tmp_path / "b", checkpoint_every=3, callbacks=[rec]).fit(
        make_task(), ckpt_path=tmp_path / "a" / "checkpoints" / "last.ckpt"
    )
    assert rec.events == expected_events(6, every=3)


def test_callback_state_is_checkpointed_and_restored(tmp_path: Path) -> None:
    reference = Counter()
    make_trainer(tmp_path / "full", callbacks=[reference]).fit(make_task())
    assert reference.rounds_seen == ROUNDS

    counter = Counter()
    crashed = make_trainer(tmp_path / "crashed", checkpoint_every=5, callbacks=[counter, Interrupt(6)])
    with pytest.raises(KeyboardInterrupt):
        crashed.fit(make_task())
    ckpt_path = tmp_path / "crashed" / "checkpoints" / "last.ckpt"
    saved = load_checkpoint(ckpt_path)["callbacks"]
    assert saved["Counter"]["rounds_seen"] == 5
    assert saved["Interrupt"] == {}

    fresh = Counter()
    make_trainer(tmp_path / "resumed", callbacks=[fresh]).fit(make_task(), ckpt_path=ckpt_path)
    assert fresh.loaded == saved["Counter"]
    # state was loaded before on_fit_start, and the trainer had been restored to round 5 too
    assert fresh.round_at_fit_start == 5
    assert fresh.state_at_fit_start == (5, saved["Counter"]["regret_sum"])
    assert fresh.rounds_seen == ROUNDS
    assert fresh.regret_sum == reference.regret_sum


def test_duplicate_callback_state_keys_rejected(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="state key"):
        make_trainer(tmp_path, callbacks=[Counter(), Counter()])

    class Named(Counter):
        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

        @property
        def state_key(self) -> str:
            return self.key

    a, b = Named("a"), Named("b")
    make_trainer(tmp_path, max_rounds=2, callbacks=[a, b]).fit(make_task())
    saved = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["callbacks"]
    assert saved["a"]["rounds_seen"] == saved["b"]["rounds_seen"] == 2


class StopAt(Callback):
    def __init__(self, at: int) -> None:
        self.at = at

    def on_round_end(self, trainer, task, round_idx, metrics) -> None:
        if round_idx == self.at:
            trainer.should_stop = True


def test_should_stop_ends_after_that_round_and_is_checkpointed(tmp_path: Path) -> None:
    rec, logger = Recorder(), FakeLogger()
    trainer = make_trainer(tmp_path, callbacks=[StopAt(3), rec], loggers=[logger], log_every=5)
    task = make_task()
    history = trainer.fit(task)
    assert len(history) == 4 and trainer.round == 4 and task.t == 4 * STEPS_PER_ROUND
    assert rec.events[-2:] == [("fit_end", 4), ("save", 4)]
    assert [step for step, _ in logger.rows] == [3]  # the stopping round is logged although 4 % 5 != 0
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert ckpt["should_stop"] is True
    assert ckpt["round"] == 4
    assert ckpt["history"] == history

    # a stopped run stays stopped when resumed
    task2 = make_task()
    again = make_trainer(tmp_path / "again")
    assert again.fit(task2, ckpt_path=tmp_path / "checkpoints" / "last.ckpt") == history
    assert again.round == 4 and task2.t == 4 * STEPS_PER_ROUND


# ------------------------------------------------------------------------------------------------ checkpoints
def test_checkpoints_leave_no_temporary_files(tmp_path: Path) -> None:
    make_trainer(tmp_path, checkpoint_every=1).fit(make_task())
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last.ckpt"]
    assert load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["round"] == ROUNDS


def test_failed_checkpoint_write_keeps_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_save = torch.save

    def broken_save(obj, f, *args, **kwargs):
        f.write(b"partial garbage")
        raise OSError("disk full")

    class BreakDiskAt(Callback):
        def on_round_end(self, trainer, task, round_idx, metrics) -> None:
            if round_idx == 3:
                monkeypatch.setattr(torch, "save", broken_save)

    with pytest.raises(OSError, match="disk full"):
        make_trainer(tmp_path, checkpoint_every=2, callbacks=[BreakDiskAt()]).fit(make_task())
    monkeypatch.setattr(torch, "save", real_save)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last.ckpt"]
    assert load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["round"] == 2


def test_missing_or_corrupt_checkpoint_is_a_config_error(tmp_path: Path) -> None:
    make_trainer(tmp_path / "ok", max_rounds=2).fit(make_task())
    good = (tmp_path / "ok" / "checkpoints" / "last.ckpt").read_bytes()
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good[: len(good) // 2])
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint at all")
    foreign = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, foreign)  # a readable torch file, but not ours
    for bad in (tmp_path / "missing.ckpt", tmp_path, truncated, garbage, foreign):
        with pytest.raises(ConfigError, match="ckpt_path") as info:
            make_trainer(tmp_path / "run").fit(make_task(), ckpt_path=bad)
        assert str(bad) in str(info.value)


# ------------------------------------------------------------------------------------------------ limits, logging
def test_max_rounds_limits_rounds(tmp_path: Path) -> None:
    task = make_task()
    trainer = make_trainer(tmp_path / "a", max_rounds=3)
    assert len(trainer.fit(task)) == 3
    assert trainer.round == 3 and task.t == 3 * STEPS_PER_ROUND
    assert load_checkpoint(tmp_path / "a" / "checkpoints" / "last.ckpt")["round"] == 3

    task = make_task()
    assert len(make_trainer(tmp_path / "b", max_rounds=100).fit(task)) == ROUNDS  # capped by the task
    assert task.t == STEPS

    with pytest.raises(ConfigError, match="max_rounds"):
        make_trainer(tmp_path / "c", max_rounds=0)


@pytest.mark.parametrize(("log_every", "logged"), [(1, list(range(ROUNDS))), (5, [4, 9, 11]), (12, [11]), (50, [11])])
def test_log_every_controls_logged_rows(tmp_path: Path, log_every: int, logged: list[int]) -> None:
    logger = FakeLogger()
    history = make_trainer(tmp_path, loggers=[logger], log_every=log_every).fit(make_task())
    assert [step for step, _ in logger.rows] == logged
    for step, metrics in logger.rows:
        assert metrics == {k: v for k, v in history[step].items() if k != "round"}
    assert logger.saves == len(logged)
    assert logger.finalized == ["success"]


def test_log_every_with_max_rounds_logs_the_last_round(tmp_path: Path) -> None:
    logger = FakeLogger()
    make_trainer(tmp_path, loggers=[logger], log_every=4, max_rounds=6).fit(make_task())
    assert [step for step, _ in logger.rows] == [3, 5]


def test_invalid_trainer_arguments_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="log_every"):
        make_trainer(tmp_path, log_every=0)
    with pytest.raises(ConfigError, match="checkpoint_every"):
        make_trainer(tmp_path, checkpoint_every=-1)


@pytest.mark.parametrize(("log_every", "every", "interrupt_at"), [(1, 4, 5), (2, 3, 4), (4, 5, 6)])
def test_resumed_logger_rows_match_uninterrupted(tmp_path: Path, log_every: int, every: int, interrupt_at: int) -> None:
    """A resumed run's loggers receive exactly the rows an uninterrupted run's loggers receive."""
    ref = FakeLogger()
    make_trainer(tmp_path / "full", loggers=[ref], log_every=log_every).fit(make_task())
    logger = FakeLogger()
    interrupted_then_resumed(
        tmp_path, "async", 1, every=every, interrupt_at=interrupt_at, loggers=[logger], log_every=log_every
    )
    assert [s for s, _ in logger.rows] == [s for s, _ in ref.rows]
    assert logger.rows == ref.rows
    assert logger.finalized == ["success"]


class CancelAt(Callback):
    def __init__(self, at: int) -> None:
        self.at = at

    def on_round_start(self, trainer, task, round_idx) -> None:
        if round_idx == self.at:
            trainer.should_stop = True


def test_should_stop_set_before_a_round_cancels_that_round(tmp_path: Path) -> None:
    trainer = make_trainer(tmp_path, callbacks=[CancelAt(3)])
    task = make_task()
    history = trainer.fit(task)
    assert len(history) == 3 and trainer.round == 3 and task.t == 3 * STEPS_PER_ROUND
    assert load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["should_stop"] is True


def test_a_cancelled_round_still_logs_the_last_round_run(tmp_path: Path) -> None:
    """Review finding: with log_every > 1, a stop before round 3 must log round 2, as a resume would."""
    logger = FakeLogger()
    make_trainer(tmp_path, callbacks=[CancelAt(3)], loggers=[logger], log_every=5).fit(make_task())
    assert [step for step, _ in logger.rows] == [2]


def test_without_a_root_directory_fit_writes_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library default leaves no files behind (the CLI passes its run folder); periodic checkpoints and
    save() need a directory and say so."""
    monkeypatch.chdir(tmp_path)
    trainer = FederatedTrainer(enable_progress_bar=False)
    trainer.fit(make_task())
    assert trainer.checkpoint_path is None and list(tmp_path.iterdir()) == []
    with pytest.raises(ConfigError, match="default_root_dir"):
        trainer.save(make_task())
    with pytest.raises(ConfigError, match="trainer.checkpoint_every"):
        FederatedTrainer(checkpoint_every=5)


def test_the_trainer_and_tasks_have_what_the_hooks_protocols_promise(tmp_path: Path) -> None:
    """The hooks are typed by RunningTrainer and RunningTask: the trainer and a task passed to a hook have every
    member those protocols declare, with the declared kinds of value."""
    from fedrec.trainer.callbacks import RunningTask, RunningTrainer

    trainer, task = make_trainer(tmp_path), make_task()
    trainer.fit(task)
    declared = {name for name in vars(RunningTrainer) if not name.startswith("_")} | set(
        RunningTrainer.__annotations__)
    assert declared == {"should_stop", "round", "history", "wall_seconds", "loggers", "is_global_zero"}
    for name in declared:
        assert hasattr(trainer, name), name
    assert isinstance(trainer.history, list) and isinstance(trainer.is_global_zero, bool)
    assert (trainer.round, trainer.should_stop) == (ROUNDS, False)
    assert set(RunningTask.__annotations__) == {"num_rounds"} and task.num_rounds == ROUNDS
    assert isinstance(task.summary(), dict)

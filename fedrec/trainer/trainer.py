"""FederatedTrainer: owns the round loop, hooks, logging, checkpointing, resume and stopping."""
from __future__ import annotations

import re
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from fedrec.errors import STOP_SIGNALS, ConfigError, check_float, check_int
from fedrec.federation.collective import Collective
from fedrec.tasks.base import FederatedTask
from fedrec.trainer.callbacks import Callback, ProgressBar, progress_enabled
from fedrec.trainer.checkpoint import check_same_run, load_checkpoint, run_identity, save_checkpoint
from fedrec.trainer.distributed import check_distribution, check_shardable, launch
from fedrec.trainer.interrupt import RunInterrupted, deferred_signals
from fedrec.utils.io import writing
from fedrec.utils.stop_request import requested_stop
from fedrec.utils.threads import check_num_threads, torch_threads


def logs_of(logger: Any) -> str:
    """A logger's files as a failed write names them: its class, and its folder (``log_dir``) when it has one."""
    folder = getattr(logger, "log_dir", None)
    return f"the logs of {type(logger).__name__}" + (f" in {folder}" if folder else "")


class FederatedTrainer:
    """Runs a :class:`FederatedTask` round by round (one loop for step-wise bandits and round-wise FL).

    Args:
        default_root_dir: run directory (checkpoints go to ``<dir>/checkpoints``); None (the default) writes no
            checkpoint, so a library call leaves no files behind (the CLI passes the run folder).
        max_rounds: stop after this many rounds (default: the task's ``num_rounds``).
        callbacks: :class:`Callback` objects, called in order.
        loggers: Lightning loggers (``lightning_fabric.loggers``) receiving every logged round.
        log_every: log metrics every this many rounds (the last round is always logged).
        checkpoint_every: write ``last.ckpt`` every this many rounds (0: only at the end); needs a
            ``default_root_dir``.
        checkpoint_minutes: also write it after the first round that ends this many minutes (wall time) after the
            last checkpoint or the start of :meth:`fit` (0, the default: only by rounds), so that a killed long run
            loses little; needs a ``default_root_dir``. A checkpoint changes nothing in the run's results.
        stop_file: a file whose appearance stops the run after its round as a signal would (checkpoint, then
            :class:`~fedrec.trainer.interrupt.RunInterrupted`); it holds the signal's number. An interrupted sweep
            stops its jobs in other processes this way (:mod:`fedrec.utils.stop_request`).
        enable_progress_bar: None shows a bar only on an interactive terminal outside CI.
        run_config: the settings that change the run's results (e.g. the resolved config without logging and
            output options); checkpoints record it, and a resume under different settings is refused.
        allow_changes: dotted names of ``run_config`` fields (or identity fields such as ``fedrec_version``) a
            resume may change; a name allows the fields under it too.
        num_threads: torch's intra-op thread count while :meth:`fit` runs (default 1); the caller's count is
            restored when ``fit`` returns or raises. None leaves torch's setting alone (e.g. after your own
            ``torch.set_num_threads``). One thread is the default because a round is thousands of small batched
            matrix operations: each is too small to gain much from more threads, and on a busy machine every
            parallel one waits until all of torch's OpenMP workers (one per core by default) get a core back from
            the other processes: on a busy 2-core machine the README's 100-round FedGNN example took 146 s on
            torch's default 2 threads against 31 s on one, as ``train.py`` runs it (``num_threads`` in
            conf/config.yaml; ``scripts/bench_library.py``).
        accelerator: ``"cpu"`` (the default), ``"cuda"`` or ``"auto"`` (CUDA when present).
        devices: processes of the run (default 1). Several shard the work of a task that supports it
            (``supports_sharding``: a recommendation run's clients, a client-server bandit run's replicates) across
            processes launched by Lightning Fabric's DDP strategy (gloo on CPU, NCCL on GPUs): from here on the
            script runs in every process, each computes its share, sums are all-reduced, and only rank 0 logs and
            writes checkpoints (:mod:`fedrec.trainer.distributed`).
        strategy: ``"auto"`` (DDP with several processes) or ``"ddp"`` (needs several).
        num_nodes: machines the run spans (default 1), ``devices`` processes on each; with several, each node's
            first process is started by an external launcher (torchrun, SLURM's ``srun``, or ``MASTER_ADDR``,
            ``MASTER_PORT`` and ``NODE_RANK`` set by hand), and a run that cannot tell how to reach the other nodes
            is refused before it waits for them.
    """

    def __init__(
        self,
        default_root_dir: str | Path | None = None,
        max_rounds: int | None = None,
        callbacks: Sequence[Callback] = (),
        loggers: Iterable[Any] = (),
        log_every: int = 1,
        checkpoint_every: int = 0,
        checkpoint_minutes: float = 0,
        stop_file: str | Path | None = None,
        enable_progress_bar: bool | None = None,
        run_config: Mapping[str, Any] | None = None,
        allow_changes: Sequence[str] = (),
        num_threads: int | None = 1,
        accelerator: str = "cpu",
        devices: int = 1,
        strategy: str = "auto",
        num_nodes: int = 1,
    ) -> None:
        distribution = check_distribution(accelerator, devices, strategy, num_nodes)
        self._processes = distribution[1], distribution[3]  # (devices, num_nodes), as errors name them
        self.collective: Collective = launch(*distribution)
        self.root = None if default_root_dir is None else Path(default_root_dir)
        # kept private: a task that holds its trainer would otherwise report it among its sizes (checkpoint.task_sizes)
        self._num_threads = check_num_threads(num_threads)
        self.max_rounds = None if max_rounds is None else check_int("trainer.max_rounds", max_rounds)
        self.log_every = check_int("trainer.log_every", log_every)
        self.checkpoint_every = check_int("trainer.checkpoint_every", checkpoint_every, minimum=0)
        self.checkpoint_minutes = check_float("trainer.checkpoint_minutes", checkpoint_minutes, low=0)
        for name in ("checkpoint_every", "checkpoint_minutes"):
            if getattr(self, name) and self.root is None:
                raise ConfigError(f"trainer.{name} > 0 needs a default_root_dir to write checkpoints to")
        self.stop_file = None if stop_file is None else Path(stop_file)
        if enable_progress_bar is not None and not isinstance(enable_progress_bar, bool):
            raise ConfigError(f"trainer.enable_progress_bar must be true, false or null (on an interactive terminal "
                              f"outside CI), got {enable_progress_bar!r}")
        show_bar = (progress_enabled() if enable_progress_bar is None else enable_progress_bar) and self.is_global_zero
        self.callbacks: list[Callback] = list(callbacks) + ([ProgressBar()] if show_bar else [])
        keys = [cb.state_key for cb in self.callbacks]
        if len(set(keys)) != len(keys):
            raise ConfigError(f"callbacks: state keys must be unique, got {keys}")
        if isinstance(allow_changes, str):
            raise ConfigError(f"allow_changes must be a list of field names, got {allow_changes!r}")
        self.run_config = run_config
        self.allow_changes = tuple(allow_changes)
        self.loggers = list(loggers) if self.is_global_zero else []  # rank 0 alone logs
        self.round = 0
        self.history: list[dict[str, float]] = []
        self.should_stop = False
        self.wall_seconds = 0.0

    @property
    def num_threads(self) -> int | None:
        """torch's intra-op thread count while :meth:`fit` runs (None: torch's setting is left alone)."""
        return self._num_threads

    @property
    def is_global_zero(self) -> bool:
        """Whether this process writes the run's files (always, in a one-process run)."""
        return self.collective.is_global_zero

    @property
    def checkpoint_path(self) -> Path | None:
        """Where :meth:`save` writes (None without a ``default_root_dir``)."""
        return None if self.root is None else self.root / "checkpoints" / "last.ckpt"

    # ---------------------------------------------------------------------------------------------- loop
    def fit(self, task: FederatedTask, ckpt_path: str | Path | None = None) -> list[dict[str, float]]:
        """Run the task to completion (or until stopped), resuming from ``ckpt_path`` if given.

        Returns the per-round metric history (the resumed part included). Runs with torch's intra-op thread count
        set to ``num_threads`` (see the class's arguments). A SIGINT or SIGTERM lets the round finish, writes the
        checkpoint (with a ``default_root_dir``) and raises :class:`~fedrec.trainer.interrupt.RunInterrupted`.
        """
        with torch_threads(self._num_threads), deferred_signals() as interrupted:
            return self._fit(task, ckpt_path, interrupted)

    def _fit(self, task: FederatedTask, ckpt_path: str | Path | None,
             interrupted: Callable[[], int | None]) -> list[dict[str, float]]:
        check_shardable(task, *self._processes)
        if ckpt_path is not None:
            self.restore(task, ckpt_path)
        total = self.total_rounds(task)
        for metrics in self.history:  # a restored history is authoritative: loggers get its logged rounds again
            r = int(metrics["round"]) + 1
            if r % self.log_every == 0 or r == total or (r == self.round and self.should_stop):
                self._log(metrics)
        task.setup(self)
        self._hook("on_fit_start", task)
        started = time.perf_counter()
        elapsed_before = self.wall_seconds
        saved_at = time.monotonic()  # of the last checkpoint: checkpoint_minutes counts from there
        while self.round < total and not self.should_stop:
            r = self.round
            self._hook("on_round_start", task, r)
            if self.should_stop:  # a callback found the round cannot run (e.g. no privacy budget left)
                if self.history and not (r % self.log_every == 0 or r == total):
                    self._log(self.history[-1])  # the run's last round is always logged (as a resume replays it)
                break
            metrics = {"round": r, **task.run_round(r)}
            self.round = r + 1
            self.wall_seconds = elapsed_before + time.perf_counter() - started
            self.history.append(metrics)
            self._hook("on_round_end", task, r, metrics)
            if self.round % self.log_every == 0 or self.round == total or self.should_stop:
                self._log(metrics)
            saved = None
            due = bool(self.checkpoint_every) and self.round % self.checkpoint_every == 0
            if not due and self.checkpoint_minutes:  # rank 0's clock: every process saves after the same round
                due = self.collective.broadcast(time.monotonic() - saved_at >= 60 * self.checkpoint_minutes)
            if due:
                saved = self.save(task)
                saved_at = time.monotonic()
            signum = interrupted()
            if signum is None:
                signum = requested_stop(self.stop_file)
            signum = self._agreed_stop(signum)
            if signum is not None and self.round < total and not self.should_stop:
                if saved is None and self.root is not None:
                    saved = self.save(task)
                raise RunInterrupted(signum, self.round, total, saved)
        self._hook("on_fit_end", task)
        if self.root is not None:
            self.save(task)
        for lg in self.loggers:
            with writing(logs_of(lg)):
                lg.finalize("success")
        return self.history

    # ---------------------------------------------------------------------------------------- internals
    def _hook(self, name: str, task: FederatedTask, *args: Any) -> None:
        for cb in self.callbacks:
            getattr(cb, name)(self, task, *args)

    def _agreed_stop(self, signum: int | None) -> int | None:
        """The stop signal any process of the run took this round (the lowest number if several), on every process:
        a signal may reach one process alone (``kill`` of a sweep's launching process, rank 0 of its job), and all
        must save and stop after the same round. One process: ``signum`` itself."""
        if self.collective.world_size == 1:
            return signum
        taken = torch.zeros(max(STOP_SIGNALS) + 1, dtype=torch.float64)
        if signum is not None:
            taken[signum] = 1.0
        self.collective.all_reduce([taken])
        found = torch.nonzero(taken).flatten().tolist()
        return int(found[0]) if found else None

    def _log(self, metrics: dict[str, float]) -> None:
        for lg in self.loggers:
            with writing(logs_of(lg)), warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Experiment logs directory")
                lg.log_metrics({k: v for k, v in metrics.items() if k != "round"}, step=int(metrics["round"]))
                lg.save()

    def save(self, task: FederatedTask) -> Path:
        """Write the full run state to ``checkpoints/last.ckpt`` atomically (needs a ``default_root_dir``); in a
        run of several processes every process gives the task's state (a task sharded by replicates gathers it)
        and rank 0 writes it, the others return its path."""
        if self.checkpoint_path is None:
            raise ConfigError("FederatedTrainer.save needs a default_root_dir to write the checkpoint to")
        state = task.state_dict()
        if not self.is_global_zero:
            return self.checkpoint_path
        ckpt: dict[str, Any] = {
            "identity": run_identity(self.run_config, task),
            "round": self.round,
            "task": state,
            "callbacks": {cb.state_key: cb.state_dict() for cb in self.callbacks},
            "history": list(self.history),
            "wall_seconds": self.wall_seconds,
            "should_stop": self.should_stop,
        }
        for cb in self.callbacks:
            cb.on_save_checkpoint(self, task, ckpt)
        return save_checkpoint(self.checkpoint_path, ckpt)

    def total_rounds(self, task: FederatedTask) -> int:
        """The rounds :meth:`fit` runs ``task`` to: its own, or ``max_rounds`` if fewer."""
        return task.num_rounds if self.max_rounds is None else min(self.max_rounds, task.num_rounds)

    def finished(self, task: FederatedTask) -> bool:
        """Whether the run (restored from a checkpoint) has no round left to run on ``task``."""
        return self.round >= self.total_rounds(task) or self.should_stop

    def restore(self, task: FederatedTask, ckpt_path: str | Path) -> None:
        """Load the run state of checkpoint ``ckpt_path`` into ``task``, the callbacks and this trainer; a checkpoint
        of another run (see :func:`~fedrec.trainer.checkpoint.check_same_run`) is refused before anything loads."""
        ckpt = load_checkpoint(ckpt_path)
        check_same_run(ckpt_path, ckpt.get("identity", {}), run_identity(self.run_config, task), self.allow_changes)
        try:
            task.load_state_dict(ckpt["task"])
            states = ckpt["callbacks"]
            for cb in self.callbacks:
                if cb.state_key in states:
                    cb.load_state_dict(states[cb.state_key])
        except (KeyError, RuntimeError) as e:  # e.g. an allowed change that the saved state does not fit
            reason = re.sub(r"\s+", " ", f"{type(e).__name__}: {e}")[:300]
            raise ConfigError(f"ckpt_path: the state in {ckpt_path} does not fit this run ({reason})") from e
        self.round = int(ckpt["round"])
        self.history = list(ckpt["history"])
        self.wall_seconds = float(ckpt["wall_seconds"])
        self.should_stop = bool(ckpt["should_stop"])

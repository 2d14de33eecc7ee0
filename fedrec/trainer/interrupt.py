"""Interrupts that save: a SIGINT (Ctrl-C) or SIGTERM (a scheduler's stop) while :meth:`FederatedTrainer.fit` runs
lets the current round finish, then the trainer writes its checkpoint and raises :class:`RunInterrupted`; a second
signal stops at once (:class:`~fedrec.errors.Interrupted`), as a plain Ctrl-C would."""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from fedrec.errors import STOP_SIGNALS, Interrupted


class RunInterrupted(KeyboardInterrupt):
    """The run stopped on a signal after ``rounds`` rounds, its state in ``checkpoint`` (None: the trainer has no
    run folder). A KeyboardInterrupt, so code that stops on Ctrl-C still stops."""

    def __init__(self, signum: int, rounds: int, total: int, checkpoint: Path | None) -> None:
        self.signum, self.rounds, self.total, self.checkpoint = signum, rounds, total, checkpoint
        saved = f"checkpoint {checkpoint}" if checkpoint is not None else "no checkpoint (no run folder)"
        super().__init__(f"{signal.Signals(signum).name} after round {rounds} of {total}; {saved}")


@contextmanager
def deferred_signals() -> Iterator[Callable[[], int | None]]:
    """While inside, the first SIGINT or SIGTERM is recorded instead of acted on; yields a function that returns the
    recorded signal (None if there was none). Only the main thread can take signals: elsewhere nothing is deferred."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    received: list[int] = []

    def record(signum: int, frame: object) -> None:
        if received:  # the second signal: stop now (a checkpoint being written is an atomic write's temporary)
            raise Interrupted(signum, f"{signal.Signals(signum).name} again: stopped at once, without saving this "
                                      "round (a checkpoint written before is kept)")
        received.append(signum)

    previous = {s: signal.signal(s, record) for s in STOP_SIGNALS}
    try:
        yield lambda: received[0] if received else None
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)

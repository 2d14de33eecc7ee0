"""A request to stop runs as a signal would, left as a file: a sweep that is interrupted writes one into its folder,
and each of its jobs, in whichever process its launcher runs it, saves after its round and stops (a job not started
yet does not start). The file holds the signal's number. Free of torch: a sweep's launching process writes it."""
from __future__ import annotations

import signal
from pathlib import Path

from fedrec.utils.io import atomic_write

#: a sweep's stop request, in its folder (``hydra.sweep.dir``)
STOP_FILE = ".fedrec.stop"


def request_stop(path: Path, signum: int) -> None:
    """Ask the runs that watch ``path`` to stop as signal ``signum`` would; a request already there is kept."""
    if not path.exists():
        atomic_write(path, lambda f: f.write(str(int(signum))), mode="w")


def requested_stop(path: Path | None) -> int | None:
    """The signal the stop request at ``path`` asks for (SIGTERM if its content is not a number), None without one."""
    if path is None:
        return None
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else int(signal.SIGTERM)

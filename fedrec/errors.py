"""User-facing errors and argument checks that name the offending field."""
from __future__ import annotations

import math
import signal
import sys
import threading
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = [
    "ConfigError", "DatasetNotFoundError", "Interrupted", "TrainingDiverged", "check_choice", "check_file",
    "check_float", "check_int", "did_you_mean", "interrupts_raise", "run_script",
]

#: the signals that stop a run: Ctrl-C, and a scheduler's stop
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class ConfigError(ValueError):
    """A configuration value or input file is invalid; the message names the field and what was expected."""


class TrainingDiverged(ConfigError, FloatingPointError):
    """A round's updates are not finite or too large under the run's settings (e.g. its learning rate); the message
    names the settings to change. A :class:`ConfigError`, so that ``train.py`` reports it as one ``error:`` line,
    and a FloatingPointError, as numerical failures are."""


class DatasetNotFoundError(FileNotFoundError):
    """A dataset file is missing; the message names the expected path and how to obtain it."""


class Interrupted(KeyboardInterrupt):
    """Signal ``signum`` (SIGINT or SIGTERM) stopped the program where it was, e.g. before a run's first round or
    during the save that a first signal asked for; a KeyboardInterrupt, so code that stops on Ctrl-C stops."""

    def __init__(self, signum: int, message: str) -> None:
        self.signum = signum
        super().__init__(message)


@contextmanager
def interrupts_raise(when: str) -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise :class:`Interrupted` (``SIGINT {when}``) where the program is, so that
    its clean-up runs and a script can report the stop in one line (SIGTERM's default ends the process at once). The
    previous handlers are restored after, unless the block replaced them (e.g. ignores signals while the script
    reports its stop and exits). Only the main thread takes signals: elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Interrupted(signum, f"{signal.Signals(signum).name} {when}")

    previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            if signal.getsignal(s) is stop:
                signal.signal(s, handler)


def check_choice(name: str, value: object, choices: Collection[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise ConfigError naming ``name``, the choices, a near one.
    The accepted path is one membership test (``Channel.send`` checks every message); only a non-string can be
    unhashable, and no non-string is a choice."""
    if isinstance(value, str) and value in choices:
        return value
    options = list(choices)
    raise ConfigError(f"{name} must be one of {options}, got {value!r}{did_you_mean(str(value), options)}")


def did_you_mean(word: str, choices: Iterable[object]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` (or up to three that contain ``word``), or nothing."""
    import difflib  # only on the error path: keeps fedrec.errors cheap to import

    names = sorted(c for c in choices if isinstance(c, str))
    match = difflib.get_close_matches(word, names, n=1, cutoff=0.6) or [c for c in names if word and word in c][:3]
    return f" (did you mean {' or '.join(repr(m) for m in match)}?)" if match else ""


def check_int(name: str, value: object, minimum: int = 1) -> int:
    """Return ``value`` as an int, or raise ConfigError naming ``name`` if it is not an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) and not (
        isinstance(value, float) and value.is_integer()
    ):
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    if int(value) < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_float(
    name: str,
    value: object,
    *,
    low: float = -math.inf,
    high: float = math.inf,
    low_open: bool = False,
    high_open: bool = False,
    allow_inf: bool = False,
) -> float:
    """Return ``value`` as a float inside the given interval, or raise ConfigError naming ``name``."""
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
    if math.isnan(v) or (math.isinf(v) and not allow_inf):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    too_low = v <= low if low_open else v < low
    too_high = v >= high if high_open else v > high
    if too_low or too_high:
        lo = "(" if low_open else "["
        hi = ")" if high_open else "]"
        raise ConfigError(f"{name} must lie in {lo}{low}, {high}{hi}, got {value!r}")
    return v


def check_file(path: Path, how_to_get: str) -> Path:
    """Return ``path`` if it is an existing file, else raise DatasetNotFoundError saying how to get it."""
    if not path.is_file():
        raise DatasetNotFoundError(
            f"dataset file not found: {path}\n{how_to_get}\n"
            "Set FEDREC_DATA_DIR (or data_dir=...) to the folder that holds the datasets."
        )
    return path


def run_script(main: Callable[[], object]) -> None:
    """Run a script's ``main``: a :class:`ConfigError` or :class:`DatasetNotFoundError` ends it as ``train.py`` ends,
    with ``error: ...`` on stderr and exit code 2, not a traceback."""
    try:
        main()
    except (ConfigError, DatasetNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None

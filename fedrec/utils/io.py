"""Atomic file writes: a reader (or a crash) never sees a half-written checkpoint or result, and a writer killed
mid-write leaves nothing behind for long."""
from __future__ import annotations

import glob
import json
import math
import os
import re
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

#: what follows ``.NAME.`` in a temporary of NAME: ``PID.RANDOM.tmp``, or ``tempfile``'s 8 characters of releases
#: that did not name the writer
_TEMPORARY = re.compile(r"(?:(?P<pid>\d+)\.[0-9a-f]{8}|[a-z0-9_]{8})\.tmp")


class WriteError(OSError):
    """A file of the run could not be written (read-only or full disk, a file where a folder should be, ...)."""


@contextmanager
def writing(what: str) -> Iterator[None]:
    """Re-raise an ``OSError`` of the block as a :class:`WriteError` that names ``what`` was being written."""
    try:
        yield
    except WriteError:
        raise
    except OSError as e:
        raise WriteError(f"cannot write {what}: {e.strerror or e}") from e


def _writer_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (elsewhere than on POSIX, assume it does: never delete a live file)."""
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale_temporaries(path: str | os.PathLike) -> None:
    """Delete the temporaries beside ``path`` that writers killed mid-write left (their process is gone)."""
    path = Path(path)
    prefix = f".{path.name}."
    for tmp in path.parent.glob(f"{glob.escape(prefix)}*.tmp"):
        found = _TEMPORARY.fullmatch(tmp.name[len(prefix):])
        if found and not (found["pid"] and _writer_alive(int(found["pid"]))):
            tmp.unlink(missing_ok=True)


def atomic_write(path: str | os.PathLike, write: Callable[[Any], None], mode: str = "wb") -> Path:
    """Call ``write(fileobj)`` on a temporary file beside ``path``, fsync it and rename it over ``path``.

    The file gets the permissions ``open`` would give it (``0o666`` less the umask). Stale temporaries of ``path``
    are removed first; a failed write raises :class:`WriteError`.
    """
    path = Path(path)
    with writing(str(path)):
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, mode) as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return path


def strict_json(obj: Any) -> Any:
    """``obj`` as strict JSON can hold it: JSON has no infinite or undefined numbers, so an infinite float becomes
    the text ``"inf"`` or ``"-inf"`` (``float()`` reads it back) and NaN (an undefined value, e.g. a 0/0 ratio)
    becomes null, as missing."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None if math.isnan(obj) else str(obj)
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented strict JSON (:func:`strict_json`) to ``path`` atomically."""
    return atomic_write(path, lambda f: json.dump(strict_json(obj), f, indent=2, sort_keys=True, allow_nan=False),
                        mode="w")


def atomic_torch_save(path: str | os.PathLike, obj: Any) -> Path:
    """``torch.save`` to ``path`` atomically. torch reports a write that fails (a full disk) as the RuntimeError of
    closing the half-written archive, the OSError its context: that OSError is raised, as a :class:`WriteError`."""
    import torch

    def save(f: Any) -> None:
        try:
            torch.save(obj, f)
        except RuntimeError as e:
            if isinstance(e.__context__, OSError):
                raise e.__context__ from None
            raise

    return atomic_write(path, save)

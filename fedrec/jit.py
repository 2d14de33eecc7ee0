"""numba compilation for fedrec's kernels: :func:`jit` is ``numba.njit(cache=True)`` when numba imports.

:data:`HAVE_NUMBA` is false when it does not: :func:`jit` then returns the plain Python function and the
protocols run on their torch path.
"""
from __future__ import annotations

import hashlib
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

try:
    import numba

    HAVE_NUMBA = True
    prange = numba.prange
except ImportError:  # pragma: no cover - numba is a dependency; this keeps the torch path usable without it
    HAVE_NUMBA = False
    prange = range


def parallel_variant(fn: F) -> F:
    """A copy of ``fn`` under another name, so that its parallel compilation is cached apart from the serial one
    (numba keys its cache files by the function's qualified name)."""
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_parallel", fn.__defaults__, fn.__closure__)
    copy.__qualname__ = fn.__qualname__ + "_parallel"
    copy.__doc__ = fn.__doc__
    return copy  # type: ignore[return-value]


def jit(fn: F | None = None, *, parallel: bool = False) -> Any:
    """``numba.njit(cache=True)`` (with ``parallel`` for ``prange`` loops); the identity without numba."""
    def wrap(f: F) -> F:
        if not HAVE_NUMBA:
            return f
        return numba.njit(cache=True, parallel=parallel, error_model="numpy")(f)
    return wrap(fn) if fn is not None else wrap


def drop_stale_caches(sources: Iterable[Path]) -> None:
    """Remove numba's cached compilations next to ``sources`` when any of those files changed.

    numba checks only the file of the function it compiles, but a kernel inlines helpers from other files: after
    an edit to a helper it would load a stale kernel. A digest of all the sources, kept beside the caches, catches
    that. Errors (read-only installs, a concurrent process) leave the caches as they are.
    """
    sources = sorted(Path(p) for p in sources)
    digest = hashlib.sha1(b"".join(p.read_bytes() for p in sources)).hexdigest()
    dirs = sorted({p.parent / "__pycache__" for p in sources})
    stamp = dirs[0] / "fedrec-kernels.sha1"
    try:
        if stamp.is_file() and stamp.read_text() == digest:
            return
        for folder in dirs:
            for f in folder.glob("*.nb[ic]") if folder.is_dir() else ():
                f.unlink(missing_ok=True)
        stamp.parent.mkdir(exist_ok=True)
        stamp.write_text(digest)
    except OSError:
        pass

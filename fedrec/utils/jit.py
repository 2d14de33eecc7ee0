"""numba compilation for fedrec's kernels: :func:`jit` is ``numba.njit(cache=True)`` when numba imports.

:data:`HAVE_NUMBA` is false when it does not: :func:`jit` then returns the plain Python function and the
protocols run on their torch path.

Kernels take a few named structures instead of long positional argument lists: a structure is a ``NamedTuple``
whose fields are annotated with their kernel type (``F64[3]``: a 3-d float64 array; ``float``, ``int``, ``bool``,
``np.uint64`` scalars), and :func:`build` fills it by field name from a module's buffers or a mapping, checking
every field's type, so that a missing, misnamed or mistyped field fails where the structure is built, never inside
a kernel. numba compiles a ``NamedTuple`` of arrays into plain struct accesses.
"""
from __future__ import annotations

import hashlib
import inspect
import numbers
import sys
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ForwardRef, NamedTuple, TypeVar

import numpy as np

F = TypeVar("F", bound=Callable[..., Any])
S = TypeVar("S", bound=tuple)

try:
    import numba

    HAVE_NUMBA = True
    prange = numba.prange
except ImportError:  # pragma: no cover - numba is a dependency; this keeps the torch path usable without it
    HAVE_NUMBA = False
    prange = range


def renamed(fn: F, suffix: str, **names: Any) -> F:
    """A copy of ``fn`` named ``fn.__name__ + suffix`` whose globals add ``names``: numba keys its cache files by the
    qualified name and freezes globals at compile time, so each copy compiles and caches apart."""
    copy = types.FunctionType(fn.__code__, {**fn.__globals__, **names}, fn.__name__ + suffix, fn.__defaults__,
                              fn.__closure__)
    copy.__qualname__ = fn.__qualname__ + suffix
    copy.__doc__ = fn.__doc__
    return copy  # type: ignore[return-value]


def parallel_variant(fn: F) -> F:
    """A copy of ``fn`` whose parallel compilation is cached apart from the serial one (:func:`renamed`)."""
    return renamed(fn, "_parallel")


def jit(fn: F | None = None, *, parallel: bool = False, inline: bool = False) -> Any:
    """``numba.njit(cache=True)`` (with ``parallel`` for ``prange`` loops); the identity without numba.

    ``inline``: numba copies the function's body into each compiled caller instead of compiling it on its own, which
    saves compile time for a helper that takes whole structures and has one call site in each loop (a function
    compiled on its own is optimised again in every caller it is linked into).
    """
    def wrap(f: F) -> F:
        if not HAVE_NUMBA:
            return f
        return numba.njit(cache=True, parallel=parallel, error_model="numpy",
                          inline="always" if inline else "never")(f)
    return wrap(fn) if fn is not None else wrap


@contextmanager
def keeping_torch_threads() -> Iterator[None]:
    """Around a parallel kernel: give torch back the thread count it had (if torch is loaded). numba's OpenMP layer
    sets the process's OpenMP count, torch's too, to its own when its pool starts at the first parallel kernel, which
    would silently change a run's thread count, and its numbers, where that happens outside a trainer's block
    (:func:`fedrec.utils.threads.torch_threads` starts the pool on entering one)."""
    torch = sys.modules.get("torch")
    keep = torch.get_num_threads() if torch is not None else None
    try:
        yield
    finally:
        if keep is not None and torch.get_num_threads() != keep:
            torch.set_num_threads(keep)


def over_replicates(body: Callable[..., None], name: str | None = None
                    ) -> tuple[Callable[..., None], Callable[..., None]]:
    """The kernels that run ``body(r, *structures)`` for every replicate ``r`` (replicates are independent):
    (serial, parallel over replicates), both called as ``kernel(replicates, *structures)``.

    The loop is written out with ``body``'s own parameters, because numba's parallel loops can neither pass on a
    tuple of structures (``*args``) nor keep writes made through a ``NamedTuple`` directly in their body (numba
    issue 7135). The index is passed as an int64: a parallel loop's index is unsigned, and ``body`` would be
    compiled once more for it. ``name`` (default ``body``'s name + ``_over_replicates``) keys numba's cache, which
    keeps the loop beside ``body``'s source file.
    """
    fn = getattr(body, "py_func", body)
    params = list(inspect.signature(fn).parameters)[1:]
    reserved = {"replicates", "r", "body", "np", "prange"} & set(params)
    if reserved:
        raise ValueError(f"{fn.__qualname__}: parameter(s) {sorted(reserved)} would shadow the loop's own names")
    name = name or f"{fn.__name__}_over_replicates"
    args = ", ".join(params)
    source = (f"def {name}(replicates, {args}):\n"
              f"    for r in prange(replicates):\n"
              f"        body(np.int64(r), {args})\n")
    # the body's module name: numba caches only functions whose globals name a module it can import again
    namespace: dict[str, Any] = {"__name__": fn.__module__, "body": body, "np": np, "prange": prange}
    exec(compile(source, fn.__code__.co_filename, "exec"), namespace)  # noqa: S102 - the fixed loop above
    loop = namespace[name]
    loop.__doc__ = f"``{fn.__qualname__}`` of every replicate (:func:`fedrec.utils.jit.over_replicates`)."
    return jit(loop), jit(parallel_variant(loop), parallel=True)


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


#: what a run prints once when numba compiles a kernel its cache does not hold (first use after an install or an edit)
COMPILE_NOTICE = "fedrec: compiling numba kernels on first use (about a minute; cached afterwards)"


@contextmanager
def compile_notice() -> Iterator[None]:
    """While inside, the first compilation of a function that numba caches on disk prints :data:`COMPILE_NOTICE` to
    stderr, so that a first run's silent minute of compiling is explained. numba compiles only what its cache lacks
    (a cold cache; a warm one loads every kernel and prints nothing), and announces each compilation as a
    ``numba:compile`` event: watching those costs nothing until one happens. Functions numba does not cache (its own
    helpers) compile in every process, and are not announced."""
    if not HAVE_NUMBA:
        yield
        return
    from numba.core import caching, event

    class Notice(event.Listener):
        printed = False

        def on_start(self, ev: event.Event) -> None:
            if not self.printed and isinstance(getattr(ev.data["dispatcher"], "_cache", None), caching.Cache):
                self.printed = True
                print(COMPILE_NOTICE, file=sys.stderr, flush=True)

        def on_end(self, ev: event.Event) -> None:
            pass

    with event.install_listener("numba:compile", Notice()):
        yield


# ---- named kernel structures


class ArrayType(NamedTuple):
    """A kernel field's array type: its dtype and number of dimensions (written ``F64[3]``, ``I64[1]``, ...)."""

    dtype: type
    ndim: int

    def convert(self, field: str, value: Any) -> np.ndarray:
        """``value`` (an array or a CPU tensor) as a zero-copy numpy view of this type."""
        array = value.numpy() if hasattr(value, "numpy") and not isinstance(value, np.ndarray) else value
        if not isinstance(array, np.ndarray) or array.dtype != self.dtype or array.ndim != self.ndim:
            got = f"{array.dtype} array of {array.ndim} dimension(s)" if isinstance(array, np.ndarray) \
                else type(value).__name__
            raise TypeError(f"{field}: expected a {np.dtype(self.dtype)} array of {self.ndim} dimension(s), got {got}")
        return array


class _ArrayTypes:
    """``F64[n]`` and the like: the :class:`ArrayType` of an n-dimensional array of one dtype."""

    def __init__(self, dtype: type) -> None:
        self.dtype = dtype

    def __getitem__(self, ndim: int) -> ArrayType:
        return ArrayType(self.dtype, ndim)


F64, I64, BOOL = _ArrayTypes(np.float64), _ArrayTypes(np.int64), _ArrayTypes(np.bool_)


def _scalar(field: str, kind: type, value: Any) -> Any:
    """``value`` as the kernel scalar ``kind`` (bool, int, float or np.uint64), refusing lossy conversions."""
    if kind is bool and isinstance(value, (bool, np.bool_)):
        return bool(value)
    if kind in (int, np.uint64) and isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return kind(value)
    if kind is float and isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    raise TypeError(f"{field}: expected {kind.__name__}, got {type(value).__name__} {value!r}")


def field_types(struct: type) -> dict[str, Any]:
    """The declared kernel type of each field of ``struct``, in order (annotations postponed as strings are evaluated
    in the structure's module, as ``typing.get_type_hints`` would)."""
    cached = struct.__dict__.get("_field_types")
    if cached is None:
        namespace = vars(sys.modules[struct.__module__])
        cached = {}
        for name, kind in struct.__annotations__.items():
            text = kind.__forward_arg__ if isinstance(kind, ForwardRef) else kind
            cached[name] = eval(text, namespace) if isinstance(text, str) else text  # noqa: S307 - own annotations
        struct._field_types = cached
    return cached


def build(struct: type[S], source: Mapping[str, Any] | object, **extra: Any) -> S:
    """``struct`` filled by field name from ``extra`` or else ``source`` (a mapping, or an object such as an
    ``nn.Module`` whose attributes and buffers carry the fields' names), each field checked against its declared
    type."""
    values = {}
    for name, kind in field_types(struct).items():
        where = f"{struct.__name__}.{name}"
        try:
            value = extra[name] if name in extra else \
                source[name] if isinstance(source, Mapping) else getattr(source, name)
        except (KeyError, AttributeError):
            raise TypeError(f"{where}: {type(source).__name__} has no field {name!r}") from None
        values[name] = kind.convert(where, value) if isinstance(kind, ArrayType) else _scalar(where, kind, value)
    unknown = set(extra) - set(values)
    if unknown:
        raise TypeError(f"{struct.__name__} has no field(s) {sorted(unknown)}")
    return struct(**values)

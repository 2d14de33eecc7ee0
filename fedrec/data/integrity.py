"""Dataset files checked against the ``SHA256SUMS`` beside them before they are read, and the digests of the files a
run read (its checkpoint records them, so a resume on changed data is refused).

A data directory may hold a ``SHA256SUMS`` (``sha256sum`` format, paths relative to it) at its root or in a
dataset's folder; ``python -m fedrec.data download`` writes one into every folder it installs. A listed file whose
digest differs (damaged, truncated, edited) is refused naming the file. An unlisted file of a published dataset is
checked by its line count against the published one (a file cut at a line boundary parses, and would otherwise be
read as a smaller dataset); listing a file in a ``SHA256SUMS`` is how a deliberately different file is used.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fedrec.errors import ConfigError, check_file

SUMS = "SHA256SUMS"
#: how many folders above a file are searched for a SHA256SUMS that lists it (the dataset's, the data directory's)
_LEVELS = 2
#: digests computed in this process, by (path, size, modification time): a sweep hashes each file once
_DIGESTS: dict[tuple[str, int, int], str] = {}
#: while :func:`recording`: the digest of each file read, by ``folder/name``
_recorded: dict[str, str] | None = None


def sha256_of(path: Path) -> str:
    """The SHA-256 of the file at ``path`` (hex), cached while the file is unchanged."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]


def listed_digest(path: Path) -> tuple[Path, str] | None:
    """The nearest ``SHA256SUMS`` above ``path`` that lists it, and the digest it lists; None if none does."""
    path = Path(os.path.abspath(path))
    for folder in list(path.parents)[:_LEVELS]:
        sums = folder / SUMS
        if not sums.is_file():
            continue
        relative = path.relative_to(folder).as_posix()
        for line in sums.read_text(errors="replace").splitlines():
            digest, _, name = line.strip().partition("  ")
            if name.removeprefix("./").removeprefix("*") == relative:
                return sums, digest.lower()
    return None


def line_count(path: Path) -> int:
    """The lines of the file at ``path`` (a last line without a newline counts)."""
    lines, last = 0, b"\n"
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def checked_file(path: Path, how_to_get: str, lines: int | None = None) -> Path:
    """``path`` if it exists (else DatasetNotFoundError saying ``how_to_get``) and matches the SHA256SUMS that lists
    it, or, unlisted, has the published ``lines`` (else ConfigError naming the file); recorded while
    :func:`recording`."""
    check_file(path, how_to_get)
    digest = sha256_of(path)
    listed = listed_digest(path)
    if listed is not None and listed[1] != digest:
        raise ConfigError(f"{path}: its SHA-256 {digest[:16]}... differs from the {listed[1][:16]}... that {listed[0]} "
                          "lists: the file is damaged, truncated or changed; install the dataset again")
    if listed is None and lines is not None and (found := line_count(path)) != lines:
        raise ConfigError(f"{path}: {found} lines, but the published file has {lines}: it is truncated or another "
                          f"version; install the dataset again (or list the file in a {SUMS} beside it to use it "
                          "as it is)")
    if _recorded is not None:
        _recorded[f"{path.parent.name}/{path.name}"] = digest
    return path


@contextmanager
def recording() -> Iterator[dict[str, str]]:
    """Collect, while inside, the digest of every dataset file :func:`checked_file` passes (by ``folder/name``, so
    that moving the data directory changes nothing)."""
    global _recorded
    outer, _recorded = _recorded, {}
    try:
        yield _recorded
    finally:
        _recorded = outer


def write_sums(folder: Path) -> Path:
    """Write ``folder/SHA256SUMS`` listing every file under ``folder``."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.name != SUMS)
    lines = [f"{sha256_of(p)}  ./{p.relative_to(folder).as_posix()}\n" for p in files]
    (folder / SUMS).write_text("".join(lines))
    return folder / SUMS

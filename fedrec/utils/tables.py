"""Delimited data files: read fast with pandas' C parser, and on failure name the file and the bad line."""
from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from fedrec.errors import ConfigError

_INTEGER = re.compile(r"\s*[+-]?\d+\s*")


def read_table(
    path: Path, names: Sequence[str], *, sep: str, header: bool = False,
    numbers: Sequence[str] = (), text: Sequence[str] = (),
) -> pd.DataFrame:
    """Read ``path``: columns ``names``, integers except the finite ``numbers`` and free ``text`` columns.

    A separator longer than one character (MovieLens-1M's ``::``) is read as a tab. A malformed line or an
    empty file raises a :class:`ConfigError` naming the file and the 1-based line number.
    """
    dtypes = {c: str if c in text else np.float64 if c in numbers else np.int64 for c in names}
    source: Path | io.StringIO = path
    if len(sep) > 1:  # the C parser takes one-character separators only
        source = io.StringIO(path.read_text(encoding="latin-1").replace(sep, "\t"))
    try:
        frame = pd.read_csv(
            source, sep=sep if len(sep) == 1 else "\t", header=0 if header else None, names=list(names),
            index_col=False, dtype=dtypes, quoting=csv.QUOTE_NONE, skip_blank_lines=False,
            keep_default_na=False, na_filter=False, encoding="latin-1",
        )
    except (ValueError, OverflowError) as exc:  # pandas' EmptyDataError and ParserError are ValueErrors
        raise _first_bad_line(path, names, sep, header, numbers, text, exc) from None
    bad = [c for c in numbers if not np.isfinite(frame[c].to_numpy()).all()]
    if frame.empty or bad:
        raise _first_bad_line(path, names, sep, header, numbers, text, ValueError("no rows"))
    return frame


def _first_bad_line(
    path: Path, names: Sequence[str], sep: str, header: bool, numbers: Sequence[str], text: Sequence[str],
    exc: Exception,
) -> ConfigError:
    """The error for the first line of ``path`` that does not fit (scanned only after pandas failed)."""
    expected = sep.join(names)
    number = 0
    with path.open(encoding="latin-1") as f:
        for number, line in enumerate(f, start=1):
            if header and number == 1:
                continue
            fields = line.rstrip("\r\n").split(sep)
            if len(fields) != len(names):
                return ConfigError(
                    f"{path}, line {number}: expected {len(names)} fields {expected!r} separated by {sep!r}, "
                    f"found {len(fields)}: {line.rstrip()!r}"
                )
            for name, value in zip(names, fields):
                if name in text:
                    continue
                if name in numbers:
                    try:
                        finite = math.isfinite(float(value))
                    except ValueError:
                        return ConfigError(f"{path}, line {number}: field {name!r} must be a number, got {value!r}")
                    if not finite:
                        return ConfigError(
                            f"{path}, line {number}: field {name!r} must be a finite number, got {value!r}"
                        )
                elif not _INTEGER.fullmatch(value):
                    return ConfigError(f"{path}, line {number}: field {name!r} must be an integer, got {value!r}")
    if number <= int(header):
        return ConfigError(f"{path}, line {number + 1}: the file is empty; expected lines {expected!r}")
    return ConfigError(f"{path}: cannot be parsed ({exc})")

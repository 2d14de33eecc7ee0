"""The Criteo display-advertising log as a replay stream (Cao et al. §5.1, App. D.3).

Input: the Kaggle "Criteo Display Advertising Challenge" ``train.txt``, tab-separated, no header, 40 fields per
line: the click label, 13 integer columns I1..I13 and 26 categorical columns C1..C26 (8 hex digits); any field
but the label may be empty. The paper follows Malekzadeh et al. 2020 without giving the details; where it is
silent this loader takes the choices of their P2B code (``create_datasets.ipynb``, ``bandipy/datasets.py``):

1. Missing values: integer columns missing in more than 40 % of the rows read are dropped, the rest forward-
   then back-filled, and ``I2 += 3`` (I2 is the only column with negatives; the shift is undone by step 2).
2. User features u: the kept integer columns, min-max scaled to [0, 1] over the rows read. The paper does not
   give d_u; P2B keeps I2–I9, I11, I13 on the full log (d_u = 10). Here d_u is whatever survives the 40 % rule
   on the rows actually read, so a short prefix of the log may keep other columns.
3. Items: the 26 categorical values of a row are feature-hashed into 3 counts the way category_encoders'
   ``HashingEncoder(n_components=3, hash_method="md5")`` does (MD5 of the value's text, as a big-endian
   integer, modulo 3 picks the count to increment; an empty field is hashed as the text ``"nan"``, which is what
   that encoder does with pandas' missing value). The counts (c0, c1, c2) are paired into one label with
   Cantor's function, as the ``pairing`` package P2B uses: label = π(π(c0, c1), π(π(c0, c1), c2)). The
   ``num_arms`` most frequent labels are the items (ties to the smaller label) and rows of other labels are
   dropped. An item's features g are its 3 counts, min-max scaled per component over the kept items.
4. Events: every kept row in file order is one event of its own user (U = number of kept rows), reward = the
   click label. Unlike P2B, which keeps only clicked rows, non-clicks are kept: replay needs them (our choice).
5. Parties: the d_u user columns are split into ``num_user_groups`` contiguous, near-equal groups (larger
   first), one per passive party; the platform holds the item block (see :mod:`fedrec.envs.replay`).

Departures and unspecified points: the number of rows used is not given (default: the first 10^6 lines,
``max_rows``); P2B hashes pandas category codes, this loader hashes the raw hex strings (codes depend on the
rows read, the strings do not); P2B's ``drop_invariant=True`` would drop a constant hash component, here all 3
are always kept (a constant component scales to 0); the per-feature scaling factors of the paper's step 7 are
not given, so none are applied.
"""
from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from fedrec.data.integrity import checked_file
from fedrec.envs.replay import ReplayEnv, ReplayLog, md5_bucket
from fedrec.errors import ConfigError, check_int
from fedrec.utils.blocks import near_equal_sizes

LABEL = "Label"
INTEGER_COLUMNS = tuple(f"I{i}" for i in range(1, 14))
CATEGORICAL_COLUMNS = tuple(f"C{i}" for i in range(1, 27))
COLUMNS = (LABEL, *INTEGER_COLUMNS, *CATEGORICAL_COLUMNS)
#: integer columns missing in more than this fraction of the rows read are dropped (P2B)
MAX_MISSING = 0.4
#: feature-hashing components of the categorical columns (d_i)
HASH_COMPONENTS = 3
#: the text an empty categorical field is hashed as (str of pandas' NaN, as HashingEncoder sees it)
MISSING_TOKEN = "nan"

_INTEGER = re.compile(r"\s*[+-]?\d+\s*")
_BLOCK_BYTES = 1 << 25  # ~32 MB of text per parsed block (~130k Criteo lines)


class CriteoReplayEnv(ReplayEnv):
    """Criteo's click log replayed in file order (see the module docstring for the preprocessing).

    Args:
        data_dir, replicates, seed, num_arms, combine, chunk_size, max_events: see :class:`ReplayEnv`;
            ``num_arms`` is also the number of items kept (the most frequent item labels).
        file: the log, relative to ``data_dir`` or absolute.
        max_rows: read only the first lines of the log (None reads it all: 45M lines, 11 GB).
        num_user_groups: passive parties sharing the user features, as contiguous near-equal column groups.
    """

    name = "criteo_replay"

    def __init__(
        self, data_dir: str | Path, replicates: int = 1, seed: int = 0, num_arms: int = 40,
        combine: str = "outer_sum", chunk_size: int = 1000, max_events: int | None = None, *,
        file: str = "criteo/train.txt", max_rows: int | None = 1_000_000, num_user_groups: int = 4,
    ) -> None:
        self.file = str(file)
        self.max_rows = None if max_rows is None else check_int("max_rows", max_rows)
        self.num_user_groups = check_int("num_user_groups", num_user_groups)
        self._num_arms = check_int("num_arms", num_arms, minimum=2)
        super().__init__(data_dir, replicates, seed, num_arms, combine, chunk_size, max_events)

    def _load(self, data_dir: Path) -> ReplayLog:
        path = Path(self.file) if Path(self.file).is_absolute() else data_dir / self.file
        how = ('Get the Kaggle "Criteo Display Advertising Challenge" dataset (e.g. the dac.tar.gz archive from '
               f"Criteo AI Lab) and unpack its train.txt into {data_dir / 'criteo'}/ (or set file= to its path)")
        clicks, integers, components = read_criteo(checked_file(path, how), self.max_rows)
        kept = fill_missing(integers)
        if kept.shape[1] == 0:
            raise ConfigError(f"{path}: every integer column is missing in more than {MAX_MISSING:.0%} of the "
                              f"first {len(kept)} rows, so there are no user features")
        users = scale_users(kept)
        labels = item_labels(components)
        kept_labels = select_items(labels, self._num_arms, where=f"{path} (first {len(labels)} rows)")
        rows, items = keep_events(labels, kept_labels)
        first = rows[np.unique(items, return_index=True)[1]]  # a row of each item, in item order
        return ReplayLog(
            user_features=users[rows],
            item_features=scale_items(components[first]),
            groups=split_groups(users.shape[1], self.num_user_groups),
            users=np.arange(len(rows)),
            items=items,
            clicks=clicks[rows].astype(np.float64),
        )


# ---------------------------------------------------------------------------------------------- reading ----

def read_criteo(path: Path, max_rows: int | None = None) -> tuple[np.ndarray, pd.DataFrame, np.ndarray]:
    """Read (and check) the first ``max_rows`` lines: click labels (N,), integer columns (NaN = missing) and the
    hashed categorical counts (N, 3) of step 3."""
    labels, integers, components = [], [], []
    for start, block in _blocks(path, max_rows):
        if b"\r" in block:  # Windows line ends: the C parser splits on "\n" only
            block = block.replace(b"\r\n", b"\n")
        fields = _field_counts(block)
        bad = np.flatnonzero(fields != len(COLUMNS))
        if len(bad):
            raise _line_error(path, start, block, int(bad[0]))
        try:
            frame = _parse_block(block, integers_as_text=False)
        except ValueError:  # an integer field that is not a number: find it on the text
            frame = None
        first_bad = _first_invalid_row(frame if frame is not None else _parse_block(block, integers_as_text=True))
        if first_bad is not None:
            raise _line_error(path, start, block, first_bad)
        if frame is None:  # unexpected: the text passed every check
            raise ConfigError(f"{path}, lines {start + 1}-{start + len(fields)}: cannot be parsed")
        labels.append((frame[LABEL] == "1").to_numpy().astype(np.int8))
        integers.append(frame[list(INTEGER_COLUMNS)])
        components.append(hash_components(frame[list(CATEGORICAL_COLUMNS)]))
    if not labels:
        raise ConfigError(f"{path}, line 1: the file is empty; expected lines of {len(COLUMNS)} tab-separated "
                          "fields (label, I1..I13, C1..C26)")
    return (np.concatenate(labels), pd.concat(integers, ignore_index=True), np.concatenate(components))


def _blocks(path: Path, max_rows: int | None) -> Iterator[tuple[int, bytes]]:
    """Yield line-aligned blocks of the file's first ``max_rows`` lines, each with the number of lines before it
    (the rest of the file is never read)."""
    lines = 0
    rest = b""
    with path.open("rb") as f:
        while max_rows is None or lines < max_rows:
            data = f.read(_BLOCK_BYTES)
            if not data:
                if rest:  # a last line without its newline
                    yield lines, rest + b"\n"
                return
            data = rest + data
            cut = data.rfind(b"\n") + 1
            block, rest = data[:cut], data[cut:]
            if not block:
                continue
            ends = np.flatnonzero(np.frombuffer(block, np.uint8) == ord("\n"))
            if max_rows is not None and lines + len(ends) > max_rows:
                ends = ends[:max_rows - lines]
                block = block[:ends[-1] + 1]
            yield lines, block
            lines += len(ends)


def _field_counts(block: bytes) -> np.ndarray:
    """Number of tab-separated fields of each (newline-terminated) line of ``block``."""
    raw = np.frombuffer(block, np.uint8)
    ends = np.flatnonzero(raw == ord("\n"))
    tabs_before = np.searchsorted(np.flatnonzero(raw == ord("\t")), ends)
    return np.diff(tabs_before, prepend=0) + 1


def _parse_block(block: bytes, integers_as_text: bool) -> pd.DataFrame:
    """A block's 40 columns: text, except the integer columns as float64 (NaN = empty) unless ``integers_as_text``
    (which cannot fail, so the bad field of a block whose numbers do not parse can be found)."""
    dtype: dict[str, type] = {c: object for c in COLUMNS}
    if not integers_as_text:
        dtype.update({c: np.float64 for c in INTEGER_COLUMNS})
    return pd.read_csv(
        io.BytesIO(block), sep="\t", header=None, names=list(COLUMNS), dtype=dtype, index_col=False,
        quoting=csv.QUOTE_NONE, lineterminator="\n", skip_blank_lines=False, keep_default_na=False,
        na_values={} if integers_as_text else {c: [""] for c in INTEGER_COLUMNS}, na_filter=not integers_as_text,
        encoding="latin-1", engine="c",
    )


def _first_invalid_row(frame: pd.DataFrame) -> int | None:
    """The first row of a parsed block with a label other than 0/1 or a non-integer integer field, or None."""
    bad = ~frame[LABEL].isin(["0", "1"]).to_numpy()
    for name in INTEGER_COLUMNS:
        column = frame[name]
        if column.dtype == object:
            bad |= (column != "").to_numpy() & ~column.str.fullmatch(_INTEGER.pattern).to_numpy(dtype=bool)
        else:  # parsed as numbers: "1.5", "1e-3" or "inf" are not integers
            x = column.to_numpy()
            bad |= ~np.isnan(x) & (~np.isfinite(x) | (np.floor(x) != x))
    return int(np.flatnonzero(bad)[0]) if bad.any() else None


def _line_error(path: Path, start: int, block: bytes, row: int) -> ConfigError:
    """The one-line error for row ``row`` of a block whose first line is line ``start + 1`` of the file."""
    number = start + row + 1
    line = block.split(b"\n", row + 1)[row].decode("latin-1")
    fields = line.split("\t")
    where = f"{path}, line {number}"
    if len(fields) != len(COLUMNS):
        hint = " (Criteo's test.txt has no label column; use train.txt)" if len(fields) == len(COLUMNS) - 1 else ""
        return ConfigError(f"{where}: expected {len(COLUMNS)} tab-separated fields (label, I1..I13, C1..C26), "
                           f"found {len(fields)}{hint}: {line[:80]!r}")
    if fields[0] not in ("0", "1"):
        return ConfigError(f"{where}: field {LABEL!r} must be 0 or 1, got {fields[0]!r}")
    for name, value in zip(INTEGER_COLUMNS, fields[1:]):
        if value and not _INTEGER.fullmatch(value):
            return ConfigError(f"{where}: field {name!r} must be an integer or empty, got {value!r}")
    return ConfigError(f"{where}: cannot be parsed: {line[:80]!r}")


# ---------------------------------------------------------------------------------------- preprocessing ----

def fill_missing(integers: pd.DataFrame) -> pd.DataFrame:
    """Step 1 (missing values): drop columns missing in > 40 % of rows, forward- then back-fill, I2 += 3."""
    kept = [c for c in integers.columns if integers[c].isna().mean() <= MAX_MISSING]
    filled = integers[kept].ffill().bfill()
    if "I2" in filled.columns:
        filled["I2"] += 3
    return filled


def scale_users(integers: pd.DataFrame) -> np.ndarray:
    """Step 2 (user features): min-max scale each kept integer column to [0, 1] (a constant column gives 0)."""
    return _min_max(integers.to_numpy(np.float64))


def hash_components(categorical: pd.DataFrame) -> np.ndarray:
    """Step 3a (feature hashing): per row, count the categorical values whose MD5 falls in each of 3 buckets."""
    counts = np.zeros((len(categorical), HASH_COMPONENTS), dtype=np.int64)
    for name in categorical.columns:
        codes, uniques = pd.factorize(categorical[name], sort=False)  # hash each distinct value once
        values = np.asarray(uniques, dtype=object).tolist()  # plain str: iterating a pandas array is slow
        buckets = np.array([md5_bucket(v or MISSING_TOKEN, HASH_COMPONENTS) for v in values], dtype=np.int64)
        bucket = buckets[codes]
        for k in range(HASH_COMPONENTS):
            counts[:, k] += bucket == k
    return counts


def cantor_pair(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Step 3b (pairing): Cantor's pairing π(a, b) = (a + b)(a + b + 1)/2 + b, element-wise on int64."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    return (a + b) * (a + b + 1) // 2 + b


def item_labels(components: np.ndarray) -> np.ndarray:
    """Step 3b (pairing): one label per row from its 3 counts, π(p1, π(p1, c2)) with p1 = π(c0, c1)."""
    p1 = cantor_pair(components[:, 0], components[:, 1])
    return cantor_pair(p1, cantor_pair(p1, components[:, 2]))


def select_items(labels: np.ndarray, num_items: int, where: str = "the log") -> np.ndarray:
    """Step 3c (items): the ``num_items`` most frequent labels, most frequent first, ties to the smaller."""
    values, counts = np.unique(labels, return_counts=True)
    if len(values) < num_items:
        raise ConfigError(f"num_arms={num_items} needs at least {num_items} distinct item labels, found "
                          f"{len(values)} in {where}")
    return values[np.lexsort((values, -counts))[:num_items]]


def keep_events(labels: np.ndarray, kept_labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Step 4 (events): the rows whose label is kept, in file order, and their item (the label's rank)."""
    rows = np.flatnonzero(np.isin(labels, kept_labels))
    order = np.argsort(kept_labels, kind="stable")
    items = order[np.searchsorted(kept_labels, labels[rows], sorter=order)]
    return rows, items.astype(np.int64)


def scale_items(components: np.ndarray) -> np.ndarray:
    """Step 3d (item features): min-max scale each hash component over the kept items (constant gives 0)."""
    return _min_max(components.astype(np.float64))


def split_groups(d_u: int, num_groups: int) -> list[int]:
    """Step 5 (parties): sizes of ``num_groups`` contiguous near-equal groups of d_u columns, larger first."""
    if not 1 <= num_groups <= d_u:
        raise ConfigError(f"num_user_groups must lie in [1, {d_u}] (the user features kept), got {num_groups}")
    return list(near_equal_sizes(d_u, num_groups))


def _min_max(x: np.ndarray) -> np.ndarray:
    """Columns of ``x`` mapped to [0, 1] by their min and max; constant columns map to 0."""
    if len(x) == 0:
        return x
    low, span = x.min(axis=0), np.ptp(x, axis=0)
    return (x - low) / np.where(span > 0, span, 1.0)

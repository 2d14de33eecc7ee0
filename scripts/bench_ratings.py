"""Load speed of fedrec's rating loader beside a straightforward pandas reader, on ML-100K and FilmTrust, and the
time of the synthetic rating generator at MovieLens sizes.

For each dataset, in one run:
  read   ``fedrec.data.read_ratings`` (parse, validate ids and the rating scale, drop duplicated pairs keeping
         the last line, re-index, normalise by the largest rating) vs ``reference_read``: ``pd.read_csv`` and the
         same drop / re-index / divide in plain pandas and numpy, with no checks. Both outputs are compared first.
  load   ``fedrec.data.load_ratings`` (``read`` plus the test/val/initial/stream splits and arrival rounds,
         10% validation), the call the removed ``test_ml100k_loads_fast`` timed against 1 s.
For each size of ``--synthetic``:
  generate  ``fedrec.data.synthetic_ratings`` at that size with the default exponents, the call
         ``tests/test_synthetic_ratings.py`` checks for sizes and exponents (it used to time it too).

Each dataset or size prints ONE JSON line: median seconds over ``--repeats`` (``--synthetic-repeats``) timings
after one warm-up, the ratio fedrec / reference for ``read`` (above 1 = fedrec slower), and ``load_1min`` (how
busy the machine was). Targets are reported, never asserted.

    FEDREC_DATA_DIR=/path/to/data .venv/bin/python -m scripts.bench_ratings
"""
from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from fedrec.data import load_ratings, read_ratings, synthetic_ratings

#: Where each dataset's file is and how it is laid out, for the reference reader.
FILES = {
    "ml-100k": ("ml-100k/u.data", "\t", ["user", "item", "rating", "timestamp"]),
    "filmtrust": ("filmtrust/ratings.txt", " ", ["user", "item", "rating"]),
}
#: Reported next to the ``load`` time: the bound the removed wall-clock test asserted on ML-100K.
LOAD_TARGET_S = 1.0
#: Synthetic sizes (users, items, ratings, clients) and the bounds the removed wall-clock asserts held them to.
SYNTHETIC = {
    "ml-1m-size": ((6040, 3706, 1_000_209, 605), 30.0),
    "ml-10m-size": ((69_878, 10_677, 10_000_054, 6988), 120.0),
}


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("FEDREC_DATA_DIR", "data")))
    p.add_argument("--datasets", default="ml-100k,filmtrust")
    p.add_argument("--repeats", type=int, default=15, help="timings per measure (the median is reported)")
    p.add_argument("--synthetic", default="ml-1m-size", help=f"sizes to generate, of {', '.join(SYNTHETIC)} ('' none)")
    p.add_argument("--synthetic-repeats", type=int, default=3, help="timings per generated size")
    return p.parse_args()


def reference_read(path: Path, sep: str, names: list[str]) -> pd.DataFrame:
    """What a plain pandas loader does: read, keep the last line of each (user, item), re-index, divide by the max."""
    raw = pd.read_csv(path, sep=sep, header=None, names=names)
    raw = raw.drop_duplicates(subset=["user", "item"], keep="last")
    rating = raw["rating"].to_numpy(np.float64)
    return pd.DataFrame({
        "user": np.unique(raw["user"].to_numpy(), return_inverse=True)[1],
        "item": np.unique(raw["item"].to_numpy(), return_inverse=True)[1],
        "rating": rating / rating.max(),
    })


def median_seconds(call: Callable[[], object], repeats: int) -> float:
    """Median wall time of ``call`` over ``repeats`` runs after one untimed warm-up."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def bench(name: str, data_dir: Path, repeats: int) -> dict[str, object]:
    """Time fedrec and the reference on dataset ``name`` after checking that they return the same ratings."""
    file, sep, names = FILES[name]
    path = data_dir / file
    ours, ref = read_ratings(name, data_dir), reference_read(path, sep, names)
    for column in ("user", "item", "rating"):
        if not np.array_equal(ours[column].to_numpy(), ref[column].to_numpy()):
            raise SystemExit(f"{name}: fedrec and the reference disagree on column {column!r}")
    read_s = median_seconds(lambda: read_ratings(name, data_dir), repeats)
    ref_s = median_seconds(lambda: reference_read(path, sep, names), repeats)
    load_s = median_seconds(lambda: load_ratings(name, data_dir, val_fraction=0.1), repeats)
    return {
        "dataset": name, "lines": sum(1 for _ in path.open("rb")), "ratings": len(ours),
        "read_s": round(read_s, 4), "reference_s": round(ref_s, 4), "ratio": round(read_s / ref_s, 2),
        "load_s": round(load_s, 4), "load_target_s": LOAD_TARGET_S, "repeats": repeats,
        "load_1min": round(os.getloadavg()[0], 2),
    }


def bench_synthetic(name: str, repeats: int) -> dict[str, object]:
    """Time the generator at size ``name`` of :data:`SYNTHETIC`."""
    (users, items, ratings, clients), target = SYNTHETIC[name]
    generate_s = median_seconds(lambda: synthetic_ratings(users, items, ratings, num_clients=clients), repeats)
    return {
        "synthetic": name, "users": users, "items": items, "ratings": ratings, "clients": clients,
        "generate_s": round(generate_s, 2), "generate_target_s": target, "repeats": repeats,
        "load_1min": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    """Run every requested dataset and synthetic size and print one JSON line each."""
    args = parse_args()
    with warnings.catch_warnings():  # FilmTrust's duplicate-line warning is expected; silence its repeats
        warnings.filterwarnings("ignore", message=r".*duplicated \(user, item\) line", category=UserWarning)
        for name in filter(None, args.datasets.split(",")):
            print(json.dumps(bench(name, args.data_dir, args.repeats)), flush=True)
    for name in filter(None, args.synthetic.split(",")):
        print(json.dumps(bench_synthetic(name, args.synthetic_repeats)), flush=True)


if __name__ == "__main__":
    main()

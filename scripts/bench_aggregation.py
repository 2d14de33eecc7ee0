"""The aggregation's share of a federated FedGNN round on MovieLens-100K, for each aggregation rule.

For every rule (FedSGD's weighted mean, the coordinate median, the trimmed mean, Krum, Multi-Krum, norm bounding, the
geometric median, Bulyan, centered clipping)
a FedGNN run of ``--rounds`` rounds times each round (``FedRecTask.run_round``: local updates, upload assembly, the
aggregation, the server step, evaluation) and, inside it, the aggregator's call alone; one JSON line per rule with
the medians over the rounds after the first and the share. Without DP and with Gaussian DP (``--privacy``). A
report, not a test: nothing is asserted.

    FEDREC_DATA_DIR=/path/to/data .venv/bin/python -m scripts.bench_aggregation --rounds 6
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import torch

from fedrec.data import load_ratings
from fedrec.models import FedGNN
from fedrec.privacy import ClientDP
from fedrec.recsys import (
    Aggregator,
    Bulyan,
    CenteredClipping,
    CoordinateMedian,
    FedSGD,
    GeometricMedian,
    Krum,
    MultiKrum,
    NormBound,
    TrimmedMean,
    Uploads,
)
from fedrec.tasks import FedRecTask

#: the rules, with the settings of the robust-aggregation grid (scripts/reproduce_robust.sh; the last three: their
#: option files', Bulyan's f as Krum's)
RULES = {"fedsgd": lambda: FedSGD(), "median": lambda: CoordinateMedian(), "trimmed_mean": lambda: TrimmedMean(0.2),
         "krum": lambda: Krum(188), "multi_krum": lambda: MultiKrum(188), "norm_bound": lambda: NormBound(0.1),
         "geometric_median": lambda: GeometricMedian(), "bulyan": lambda: Bulyan(188),
         "centered_clipping": lambda: CenteredClipping()}


class Timed:
    """An aggregator whose calls are timed (the rest of its interface passes through)."""

    def __init__(self, inner: Aggregator) -> None:
        self.inner, self.seconds = inner, 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __call__(self, up: Uploads) -> Any:
        start = time.perf_counter()
        out = self.inner(up)
        self.seconds += time.perf_counter() - start
        return out


def bench(rule: str, privacy: str, rounds: int, data_dir: str) -> dict[str, Any]:
    data = load_ratings("ml-100k", data_dir, seed=0, rounds=rounds)
    torch.manual_seed(0)
    model = FedGNN(data.num_users, data.num_items, 8)
    dp = None if privacy == "none" else ClientDP(data.num_clients, "gaussian", epsilon=10.0, delta=1e-5)
    aggregator = Timed(RULES[rule]())
    task = FedRecTask(data, model, aggregator, dp, rounds=rounds, seed=0)  # type: ignore[arg-type]
    round_s, agg_s = [], []
    for r in range(rounds):
        aggregator.seconds = 0.0
        start = time.perf_counter()
        task.run_round(r)
        round_s.append(time.perf_counter() - start)
        agg_s.append(aggregator.seconds)
    rs, ag = statistics.median(round_s[1:]), statistics.median(agg_s[1:])
    return {"rule": rule, "privacy": privacy, "round_s": round(rs, 4), "aggregation_s": round(ag, 4),
            "share": round(ag / rs, 4), "rounds_timed": rounds - 1}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=os.environ.get("FEDREC_DATA_DIR", "data"))
    p.add_argument("--rules", default=",".join(RULES))
    p.add_argument("--privacy", default="none,gaussian")
    p.add_argument("--rounds", type=int, default=6, help="rounds per run (the first is not timed)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    for privacy in args.privacy.split(","):
        for rule in args.rules.split(","):
            print(json.dumps(bench(rule, privacy, args.rounds, args.data_dir)), flush=True)


if __name__ == "__main__":
    main()

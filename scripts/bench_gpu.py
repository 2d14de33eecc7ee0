"""Speed of a federated recommendation round on the CPU and on CUDA, where the round's time goes, and how often the
host waits for the device.

Sizes (``--sizes``):
  tiny     synthetic: 300 users in 30 clients, 100 items, 6,000 ratings (a check that the script runs)
  ml100k   MovieLens-100K from $FEDREC_DATA_DIR (943 users, one per client; 1,682 items)
  ml10m    synthetic ratings of MovieLens-10M's size: 69,878 users in 6,988 clients, 10,677 items, 10,000,054 ratings
  netflix  synthetic ratings of Netflix's size: 480,189 users in 48,019 clients, 17,770 items, 100,480,507 ratings

The round is ``fedgnn_synthetic``'s: FedGNN (d = 8), FedSGD, 400 pseudo items per client, non-private
(``--privacy gaussian``: client DP at ε = 10). Per (size, device) one JSON line: the median seconds of
``--rounds`` plain rounds after one warm-up round; each step's share of one more round, timed with the device
synchronised at each step's end; and the host synchronisations of a round, counted by
:class:`fedrec.trainer.host_sync.HostSyncCounter` on the device's tensors (the same count on any machine) and, on
CUDA, by the driver (``torch.cuda.set_sync_debug_mode``). ``--profile DIR`` also writes torch.profiler's table of a
round per (size, device).

    FEDREC_DATA_DIR=/path/to/data .venv/bin/python -m scripts.bench_gpu --devices cpu,cuda --sizes ml100k,ml10m
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch

import fedrec.tasks.recommendation as round_module
from fedrec.models import FedGNN
from fedrec.privacy import ClientDP
from fedrec.recsys import FedSGD
from fedrec.tasks import FedRecTask
from fedrec.trainer import FederatedTrainer
from fedrec.trainer.host_sync import HostSyncCounter

SIZES = {  # users, items, ratings, clients
    "tiny": (300, 100, 6_000, 30),
    "ml10m": (69_878, 10_677, 10_000_054, 6_988),
    "netflix": (480_189, 17_770, 100_480_507, 48_019),
}
#: the parts of a round timed as steps: functions the round calls by their names in fedrec.tasks.recommendation, and
#: methods of the task and of its strategy (one process, client placement: none of them calls another)
STEP_FUNCTIONS = ("local_updates", "assemble_uploads")
STEP_METHODS = {"task": ("_prepare", "_admit", "evaluate"),
                "strategy": ("privatize", "aggregate", "combine", "step", "record")}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=os.environ.get("FEDREC_DATA_DIR", "data"))
    p.add_argument("--sizes", default="ml100k,ml10m")
    p.add_argument("--devices", default="cpu,cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds (after one warm-up)")
    p.add_argument("--privacy", choices=["none", "gaussian"], default="none")
    p.add_argument("--threads", type=int, default=torch.get_num_threads(), help="CPU threads")
    p.add_argument("--profile", type=Path, default=None, help="write torch.profiler's table of a round here")
    p.add_argument("--out", type=Path, default=None, help="append the JSON lines to this file")
    return p.parse_args()


def load(size: str, data_dir: str, rounds: int) -> Any:
    if size == "ml100k":
        from fedrec.data import load_ratings

        return load_ratings("ml-100k", data_dir, seed=0, rounds=rounds)
    from fedrec.data.synthetic import synthetic_ratings

    users, items, ratings, clients = SIZES[size]
    return synthetic_ratings(users=users, items=items, ratings=ratings, num_clients=clients, rounds=rounds, seed=0)


def build(data: Any, device: str, privacy: str) -> FedRecTask:
    torch.manual_seed(0)
    dp = None if privacy == "none" else ClientDP(data.num_clients, privacy, epsilon=10.0, clip=0.5)
    task = FedRecTask(data, FedGNN(data.num_users, data.num_items, 8), FedSGD(), dp, rounds=data.rounds,
                      pseudo_items=400, seed=0)
    task.setup(FederatedTrainer(accelerator=device, num_threads=None))
    return task


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class _Timed:
    """A callable that adds its time (the device synchronised before and after) to ``seconds[name]`` and passes
    every attribute through to the object it wraps."""

    def __init__(self, inner: Any, name: str, seconds: Counter, device: str) -> None:
        self._inner, self._name, self._seconds, self._device = inner, name, seconds, device

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        synchronize(self._device)
        t0 = time.perf_counter()
        out = self._inner(*args, **kwargs)
        synchronize(self._device)
        self._seconds[self._name] += time.perf_counter() - t0
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def step_shares(task: FedRecTask, round_idx: int, device: str) -> tuple[float, dict[str, float]]:
    """One instrumented round: its seconds and each step's share of them (the rest: the round's own glue)."""
    seconds: Counter = Counter()
    saved_functions = {n: getattr(round_module, n) for n in STEP_FUNCTIONS}
    owners = {"task": task, "strategy": task.strategy}
    for n, f in saved_functions.items():
        setattr(round_module, n, _Timed(f, n, seconds, device))
    for owner, names in STEP_METHODS.items():  # instance attributes, which shadow the class's methods
        for n in names:
            setattr(owners[owner], n, _Timed(getattr(owners[owner], n), n, seconds, device))
    try:
        synchronize(device)
        t0 = time.perf_counter()
        task.run_round(round_idx)
        synchronize(device)
        total = time.perf_counter() - t0
    finally:
        for n, f in saved_functions.items():
            setattr(round_module, n, f)
        for owner, names in STEP_METHODS.items():
            for n in names:
                del owners[owner].__dict__[n]
    shares = {n: round(s / total, 3) for n, s in seconds.most_common()}
    shares["other"] = round(1 - sum(seconds.values()) / total, 3)
    return total, shares


def driver_syncs(task: FedRecTask, round_idx: int) -> int:
    """The synchronisations CUDA itself reports over one round (each a warning in sync-debug mode)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            task.run_round(round_idx)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def bench(task: FedRecTask, size: str, device: str, args: argparse.Namespace) -> dict[str, Any]:
    r = 0
    task.run_round(r)  # warm-up
    times = []
    for _ in range(args.rounds):
        r += 1
        synchronize(device)
        t0 = time.perf_counter()
        task.run_round(r)
        synchronize(device)
        times.append(time.perf_counter() - t0)
    r += 1
    instrumented, shares = step_shares(task, r, device)
    r += 1
    with HostSyncCounter(device) as counter:
        task.run_round(r)
    record: dict[str, Any] = {
        "size": size, "device": device, "threads": torch.get_num_threads(), "privacy": args.privacy,
        "clients": task.data.num_clients, "users": task.data.num_users, "items": task.data.num_items,
        "seconds_per_round": round(statistics.median(times), 4), "rounds_timed": len(times),
        "instrumented_round_s": round(instrumented, 4), "step_shares": shares,
        "host_syncs_per_round": counter.count, "host_syncs_by_op": dict(counter.by_op.most_common()),
    }
    if device == "cuda":
        r += 1
        record["cuda_reported_syncs_per_round"] = driver_syncs(task, r)
        record["cuda_max_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if args.profile is not None:
        r += 1
        profile_round(task, r, device, args.profile / f"profile_{size}_{device}.txt")
    return record


def profile_round(task: FedRecTask, round_idx: int, device: str, path: Path) -> None:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        task.run_round(round_idx)
        synchronize(device)
    sort = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=60) + "\n"
                    + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40,
                                                max_name_column_width=60))


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    # rounds played per device: a warm-up, the timed ones, the instrumented one, the counted one, CUDA's own count
    # and the profiled one; the data's stream is spread over at least 10 rounds
    rounds = 1 + args.rounds + 1 + 1 + 1 + (1 if args.profile else 0)
    for size in args.sizes.split(","):
        t0 = time.perf_counter()
        data = load(size, args.data_dir, max(rounds, 10))
        data_s = time.perf_counter() - t0
        for device in args.devices.split(","):
            record = bench(build(data, device, args.privacy), size, device, args)
            record["data_s"] = round(data_s, 1)
            line = json.dumps(record)
            print(line, flush=True)
            if args.out is not None:
                with open(args.out, "a") as f:
                    f.write(line + "\n")


if __name__ == "__main__":
    main()

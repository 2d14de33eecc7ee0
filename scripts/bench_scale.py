"""Scale benchmarks (beyond one process), side by side in one run: one JSON line per case.

Cases (``--cases``, comma-separated):

* ``sweep``: one multirun of ``train.py`` (``--sweep``; default four seeds of FedGNN on MovieLens-100K, its 100
  rounds each) run serially by Hydra's basic launcher and in parallel by the joblib launcher of the ``cluster`` extra
  (``hydra/launcher=joblib hydra.launcher.n_jobs=N``), each timed from the start of ``train.py`` to its sweep
  summary. Both sweeps must give the same results (every job's summary.json without its timings) before the ratio
  is reported. Target: joblib at most 0.6x the serial time with 2 jobs at once (each joblib worker pays torch's and
  Lightning Fabric's imports and warm-up, about 7 s, once: the jobs must be long enough for that to matter little). The
  line also gives the machine's load and its measured room for parallel work (``parallel_capacity``: 2.0 on two idle
  cores), since a loaded machine leaves less to gain.

* ``shard``: one FedGNN run on synthetic ratings (``--shard``; default MovieLens-1M's size, 6,040 users in 605
  clients, 3,706 items, 1,000,209 ratings, a few rounds) in one process and sharded over ``--devices`` processes
  (``trainer.devices=N``, Lightning Fabric's gloo DDP), each timed per round by the trainer (``wall_seconds`` /
  rounds: start-up and data generation excluded) with the peak resident memory of all its processes together
  (sampled every 0.1 s). Both runs must give the same metrics (1e-6) before the ratio is reported. Target: the
  sharded run at least 1.5x faster per round with 2 processes. ``--shard-only`` runs one setting alone (e.g. at
  MovieLens-10M's size, ``--shard "data.users=69878 data.items=10677 data.ratings=10000054 data.num_clients=6988"``).

* ``clients``: one client-server bandit run per protocol (``--protocols``: async, sync, central), layout and number
  of clients (``--clients``, default 10^4, 10^5, 10^6), d = K = 25, ``--steps`` steps (default 10^5) of one replicate,
  each in a process of its own: its peak resident memory (``getrusage`` maxrss: everything the process touched,
  Python and torch included) and its steps/s (process CPU time of building the environment and the protocol and
  playing the steps, the kernels compiled beforehand), the clients
  that arrived and the state rows held. ``--layouts`` (default sparse; dense only where it fits, ``--dense-max``)
  also runs the dense layout, whose decisions must equal the sparse one's. ``--plot`` draws the log-log figure.

* ``bandit_shard``: one Async-LinUCB run of ``train.py`` (``--bandit-shard``; default 10^6 clients, sparse layout,
  d = K = 25, 10^5 steps per replicate) of ``--devices`` replicates, in one process (numba's threads share out its
  replicates, as a one-process run does; and with one thread, ``NUMBA_NUM_THREADS=1``) and with one replicate per
  process over ``--devices`` processes (``trainer.devices=N``: the replicates sharded), each timed per round and
  measured as the ``shard`` case. Every run must give the same summary, to the last digit, before the ratios are
  reported.

* ``grouping``: rounds of one recommendation task on synthetic ratings without a stream (``--grouping``, sizes of
  ``synthetic_ratings``; default MovieLens-1M's; ``--grouping-model`` mf or fedgnn), which keeps its round's grouping
  of the training ratings by client (``fedrec.recsys.data.round_data``) while no ratings arrive, against the same
  task made to group afresh every round (its kept grouping forgotten before each), ``--grouping-rounds`` rounds each
  after a warm-up, alternating which goes first, in this process. With ``--grouping-stream`` ratings arrive in every
  round, and the kept task merges them into its last round's sort order (``entry_order``) instead. Every round's
  metrics must be equal before the ratio of the median seconds per round is reported.

* ``rows``: a round's grouping itself (``fedrec.recsys.data.round_data`` given the ratings' order, its compiled
  one-pass kernel, in one block on one thread and in ``--grouping-threads`` blocks on as many threads), on the
  training ratings of the last round of ``--grouping``'s sizes, against a plain numpy formulation (gathers by the
  order, then ``np.unique`` with inverse for the clients, the users and the (client, item) rows),
  ``--grouping-rounds`` calls each, in turn. All must give the same arrays before the ratios of the median seconds
  are reported.

A new case is a function of the parsed arguments returning the dict to print, registered in ``CASES``.

    FEDREC_DATA_DIR=/path/to/data .venv/bin/python -m scripts.bench_scale --cases sweep
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedrec.app.sweeps import job_folders, without_timings

ROOT = Path(__file__).resolve().parents[1]

SWEEP = "+experiment=fedgnn_ml100k seed=0,1,2,3"
SHARD = "task.rounds=5"
GROUPING = "users=6040 items=3706 ratings=1000209 num_clients=605"
BANDIT_SHARD = "env.num_clients=1000000 protocol.layout=sparse task.steps=100000 task.steps_per_round=10000"


def run_sweep(overrides: list[str], launcher: list[str], folder: Path) -> tuple[float, float]:
    """Run ``train.py -m`` with these overrides and launcher into ``folder``; its wall-clock seconds and the CPU
    seconds of all its processes (joblib's workers included: they end, and are waited for, before train.py)."""
    cmd = [sys.executable, str(ROOT / "train.py"), "-m", *overrides, "logger.tensorboard=false", "plots=false",
           *launcher, f"hydra.sweep.dir={folder}"]
    before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    proc = subprocess.run(cmd, cwd=folder.parent, capture_output=True, text=True)
    seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"the sweep {shlex.join(cmd[2:])} failed (exit code {proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    return seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def sweep_results(folder: Path) -> dict[str, dict[str, Any]]:
    """Every job's summary.json without its timings, by job folder."""
    return {str(job.relative_to(folder)): without_timings(json.loads((job / "summary.json").read_text()))
            for job in job_folders(folder)}


def parallel_capacity(n: int, seconds: float = 2.0) -> float:
    """How many times more CPU work ``n`` processes get done at once than one process alone, on this machine now
    (up to ``n`` on idle cores; near 1 when other work leaves one core free): a fixed Python loop timed in one
    process, then in ``n`` at the same time."""
    def wall(processes: int, loops: int) -> float:
        start = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", f"for _ in range({loops}): pass"]) for _ in range(processes)]
        for proc in procs:
            proc.wait()
        return time.perf_counter() - start

    loops = int(10_000_000 * seconds / max(wall(1, 10_000_000), 1e-3))
    return n * wall(1, loops) / wall(n, loops)


def case_sweep(args: argparse.Namespace) -> dict[str, Any]:
    """The same sweep serially and with the joblib launcher, one after the other (``--repeats`` times, alternating
    which goes first); the fastest of each is compared."""
    overrides = shlex.split(args.sweep)
    launchers = {"serial": [], "joblib": ["hydra/launcher=joblib", f"hydra.launcher.n_jobs={args.n_jobs}"]}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in launchers}
    load_before, capacity = os.getloadavg(), [parallel_capacity(args.n_jobs)]
    with tempfile.TemporaryDirectory(prefix="bench_scale_") as tmp:
        results = {}
        for repeat in range(args.repeats):
            for name in (list(launchers) if repeat % 2 == 0 else list(launchers)[::-1]):
                folder = Path(tmp) / f"{name}_{repeat}"
                times[name].append(run_sweep(overrides, launchers[name], folder))
                results[name] = sweep_results(folder)
    capacity.append(parallel_capacity(args.n_jobs))
    if not results["serial"] or results["joblib"] != results["serial"]:
        raise SystemExit("the joblib sweep's results differ from the serial sweep's (or there are none)")
    (serial, serial_cpu), (parallel, parallel_cpu) = min(times["serial"]), min(times["joblib"])
    return {"case": "sweep", "sweep": args.sweep, "jobs": len(results["serial"]), "n_jobs": args.n_jobs,
            "cores": len(os.sched_getaffinity(0)), "serial_s": round(serial, 2), "joblib_s": round(parallel, 2),
            "ratio": round(parallel / serial, 3), "target": 0.6, "met": parallel / serial <= 0.6,
            "same_results": True, "all_serial_s": [round(t, 2) for t, _ in times["serial"]],
            "all_joblib_s": [round(t, 2) for t, _ in times["joblib"]],
            # CPU seconds of each sweep's processes: the joblib sweep's extra work is its workers' start-up
            "serial_cpu_s": round(serial_cpu, 2), "joblib_cpu_s": round(parallel_cpu, 2),
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in os.getloadavg()],
            # the machine's room for parallel work before and after the sweeps (n_jobs on idle cores): the ratio
            # cannot beat about 1/capacity, whatever the launcher does
            "parallel_capacity": [round(c, 2) for c in capacity]}


def run_measured(cmd: list[str], cwd: Path, env: dict[str, str] | None = None
                 ) -> tuple[float, subprocess.CompletedProcess]:
    """Run ``cmd`` (with ``env`` added to the environment); the peak of the summed resident memory (MiB) of it and its
    descendants, and its result."""
    import psutil

    peak = 0.0
    with subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, **(env or {})}) as proc:
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                tree = [root, *root.children(recursive=True)]
                peak = max(peak, sum(p.memory_info().rss for p in tree) / 2 ** 20)
            except psutil.Error:  # a process ended while being read
                pass
            time.sleep(0.1)
        out, err = proc.communicate()
    return peak, subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def train_run(overrides: list[str], devices: int, folder: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One ``train.py`` run of ``overrides`` on ``devices`` processes: seconds per round, peak memory, its summary."""
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides, "plots=false", "logger.tensorboard=false",
           f"trainer.devices={devices}", f"hydra.run.dir={folder}"]
    peak, proc = run_measured(cmd, folder.parent, env)
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd[2:])} failed (exit code {proc.returncode}):\n{proc.stderr[-3000:]}")
    summary = json.loads((folder / "summary.json").read_text())
    return {"per_round_s": summary["wall_seconds"] / summary["rounds_run"], "peak_mib": peak, "summary": summary}


def alternated(settings: list[Any], repeats: int, run: Callable[[Any, Path], dict[str, Any]]) -> dict[Any, list]:
    """Each setting's runs, ``repeats`` of each, alternating which goes first (in a temporary folder each)."""
    runs: dict[Any, list[dict[str, Any]]] = {s: [] for s in settings}
    with tempfile.TemporaryDirectory(prefix="bench_shard_") as tmp:
        for repeat in range(repeats):
            for i, setting in enumerate(settings if repeat % 2 == 0 else settings[::-1]):
                runs[setting].append(run(setting, Path(tmp) / f"s{i}_{repeat}"))
    return runs


def case_shard(args: argparse.Namespace) -> dict[str, Any]:
    """The same run in one process and sharded over ``--devices`` (alternating which goes first over
    ``--repeats``); the fastest of each is compared, and their results must agree."""
    overrides = ["+experiment=fedgnn_synthetic", *shlex.split(args.shard)]
    settings = [args.devices] if args.shard_only else [1, args.devices]
    runs = alternated(settings, args.repeats, lambda devices, folder: train_run(overrides, devices, folder))
    best = {d: min(r, key=lambda x: x["per_round_s"]) for d, r in runs.items()}
    out: dict[str, Any] = {"case": "shard", "overrides": args.shard, "cores": len(os.sched_getaffinity(0)),
                           "final_test_rmse": {d: b["summary"].get("final_test_rmse") for d, b in best.items()}}
    for d, b in best.items():
        out[f"devices{d}_per_round_s"] = round(b["per_round_s"], 3)
        out[f"devices{d}_peak_mib"] = round(b["peak_mib"])
        out[f"devices{d}_all_per_round_s"] = [round(x["per_round_s"], 3) for x in runs[d]]
    if not args.shard_only:
        one, many = best[1]["summary"], best[args.devices]["summary"]
        same = all(abs(one[k] - many[k]) <= 1e-6 * max(1.0, abs(one[k])) for k in one
                   if k.startswith(("final_", "best_")) and isinstance(one[k], float))
        if not same:
            raise SystemExit(f"the sharded run's metrics differ from the one-process run's: {one} vs {many}")
        speedup = best[1]["per_round_s"] / best[args.devices]["per_round_s"]
        out.update({"speedup": round(speedup, 3), "target": 1.5, "met": speedup >= 1.5, "same_metrics": True,
                    "load_after": [round(x, 2) for x in os.getloadavg()]})
    return out


def case_grouping(args: argparse.Namespace) -> dict[str, Any]:
    """A task keeping its round's grouping against one grouping every round afresh, alternating round by round."""
    import statistics

    import torch

    from fedrec.data.synthetic import synthetic_ratings
    from fedrec.models import FedGNN, MatrixFactorization
    from fedrec.recsys import FedSGD
    from fedrec.tasks import FedRecTask

    torch.set_num_threads(1)  # as a run (num_threads=1): FedGNN's rounds are bit for bit the same only on one thread
    sizes = {k: int(v) for k, v in (kv.split("=", 1) for kv in shlex.split(args.grouping))}
    data = synthetic_ratings(**sizes, rounds=args.grouping_rounds + 1, stream=args.grouping_stream, seed=0)
    model = {"mf": MatrixFactorization, "fedgnn": FedGNN}[args.grouping_model]

    def task() -> FedRecTask:
        torch.manual_seed(0)
        return FedRecTask(data, model(data.num_users, data.num_items, 8), FedSGD(), rounds=data.rounds, seed=0)

    tasks = {"kept": task(), "fresh": task()}
    seconds: dict[str, list[float]] = {"kept": [], "fresh": []}
    for r in range(args.grouping_rounds + 1):  # round 0 groups in both: the warm-up
        metrics = {}
        for name in ("kept", "fresh") if r % 2 else ("fresh", "kept"):
            if name == "fresh":
                tasks[name]._prepared = {}
            started = time.perf_counter()
            metrics[name] = tasks[name].run_round(r)
            if r:
                seconds[name].append(time.perf_counter() - started)
        if metrics["kept"] != metrics["fresh"]:
            raise SystemExit(f"round {r}: the kept grouping's metrics differ: {metrics}")
    kept, fresh = (statistics.median(seconds[n]) for n in ("kept", "fresh"))
    return {"case": "grouping", "sizes": args.grouping, "model": args.grouping_model, "stream": args.grouping_stream,
            "training_ratings": len(data.training), "threads": 1,
            "kept_per_round_s": round(kept, 3), "fresh_per_round_s": round(fresh, 3),
            **{f"{n}_all_s": [round(x, 3) for x in seconds[n]] for n in ("kept", "fresh")},
            "speedup": round(fresh / kept, 3), "same_metrics": True}


def numpy_grouping(user: Any, item: Any, rating: Any, client_of_user: Any, num_items: int, order: Any
                   ) -> dict[str, Any]:
    """The rows case's reference: ``round_data``'s arrays (no negatives) by numpy's gathers and ``np.unique``."""
    import numpy as np

    u, i, c = user[order], item[order], client_of_user[user][order]
    clients, entry_client = np.unique(c, return_inverse=True)
    users, entry_user = np.unique(u, return_inverse=True)
    rows, entry_row = np.unique(entry_client * num_items + i, return_inverse=True)
    return {"clients": clients, "users": users, "user_client": np.searchsorted(clients, client_of_user[users]),
            "entry_user": entry_user, "entry_row": entry_row, "entry_rating": rating.astype(np.float32)[order],
            "row_client": rows // num_items, "row_item": rows % num_items}


def case_rows(args: argparse.Namespace) -> dict[str, Any]:
    """``round_data`` given the order (one thread, and ``--grouping-threads``) against :func:`numpy_grouping`, in
    turn call by call."""
    import statistics

    import numpy as np
    import torch

    from fedrec.data.synthetic import synthetic_ratings
    from fedrec.recsys.data import entry_order, round_data

    threads = args.grouping_threads
    sizes = {k: int(v) for k, v in (kv.split("=", 1) for kv in shlex.split(args.grouping))}
    data = synthetic_ratings(**sizes, rounds=args.grouping_rounds + 1, stream=args.grouping_stream, seed=0)
    tr = data.training_until(data.rounds - 1)
    user, item = np.asarray(tr.user, dtype=np.int64), np.asarray(tr.item, dtype=np.int64)
    rating, client_of_user = np.asarray(tr.rating), np.asarray(data.client_of_user, dtype=np.int64)
    order = entry_order(user, item, client_of_user, data.num_items)

    def ours(blocks: int) -> Any:
        torch.set_num_threads(blocks)  # numba's pool runs the blocks; torch's count is the run's
        return round_data(user, item, rating, client_of_user, data.num_items, order=order, blocks=blocks)

    def plain() -> dict[str, Any]:
        torch.set_num_threads(1)
        return numpy_grouping(user, item, rating, client_of_user, data.num_items, order)

    calls = {"ours": lambda: ours(1), "ours_threads": lambda: ours(threads), "numpy": plain}
    want = plain()
    for name in ("ours", "ours_threads"):  # also the warm-up (the kernels compile, or load from numba's cache)
        got = calls[name]()
        for field, value in want.items():
            if not np.array_equal(getattr(got, field).numpy(), value):
                raise SystemExit(f"round_data's {field} ({name}) differs from numpy's")
    seconds: dict[str, list[float]] = {n: [] for n in calls}
    names = list(calls)
    for r in range(args.grouping_rounds):
        for name in names[r % 3:] + names[:r % 3]:
            started = time.perf_counter()
            calls[name]()
            seconds[name].append(time.perf_counter() - started)
    median = {n: statistics.median(seconds[n]) for n in calls}
    return {"case": "rows", "sizes": args.grouping, "stream": args.grouping_stream, "training_ratings": len(user),
            "rows": int(got.row_item.numel()), "threads": threads,
            **{f"{n}_s": round(median[n], 3) for n in calls},
            **{f"{n}_all_s": [round(x, 3) for x in seconds[n]] for n in calls},
            "speedup": round(median["numpy"] / median["ours"], 3),
            "speedup_threads": round(median["numpy"] / median["ours_threads"], 3), "same_arrays": True}


def case_bandit_shard(args: argparse.Namespace) -> dict[str, Any]:
    """The Async-LinUCB run of ``--devices`` replicates in one process (numba's threads, and one thread) and over
    ``--devices`` processes; the fastest of each is compared, and their summaries must be the same."""
    overrides = [*shlex.split(args.bandit_shard), f"replicates={args.devices}"]
    settings = {"one_process": (1, {}), "one_process_one_thread": (1, {"NUMBA_NUM_THREADS": "1"}),
                f"{args.devices}_processes": (args.devices, {})}
    runs = alternated(list(settings), args.repeats,
                      lambda name, folder: train_run(overrides, settings[name][0], folder, settings[name][1]))
    best = {name: min(r, key=lambda x: x["per_round_s"]) for name, r in runs.items()}
    summaries = {name: without_timings(b["summary"]) for name, b in best.items()}
    if any(s != summaries["one_process"] for s in summaries.values()):
        raise SystemExit(f"the runs' summaries differ: {summaries}")
    out: dict[str, Any] = {"case": "bandit_shard", "overrides": shlex.join(overrides),
                           "cores": len(os.sched_getaffinity(0)),
                           "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30, 1),
                           "same_summary": True, "cumulative_regret": summaries["one_process"]["cumulative_regret"]}
    for name, b in best.items():  # the rounds' wall time (start-up and the environment's set-up excluded)
        out[f"{name}_s"] = round(b["summary"]["wall_seconds"], 2)
        out[f"{name}_peak_mib"] = round(b["peak_mib"])
        out[f"{name}_all_s"] = [round(x["summary"]["wall_seconds"], 2) for x in runs[name]]
    many = out[f"{args.devices}_processes_s"]
    out.update({"speedup_vs_one_process": round(out["one_process_s"] / many, 3),
                "speedup_vs_one_thread": round(out["one_process_one_thread_s"] / many, 3),
                "load_after": [round(x, 2) for x in os.getloadavg()]})
    return out


def clients_run(protocol: str, layout: str, clients: int, steps: int, block: int) -> dict[str, Any]:
    """One run in this process (``--clients-child``): peak memory, steps/s, arrivals and a digest of the decisions."""
    import hashlib

    import numpy as np

    from fedrec.envs.synthetic import LinearEnv
    from fedrec.protocols import AsyncLinUCB, CentralizedLinUCB, SyncLinUCB

    def build(n: int) -> tuple[LinearEnv, Any]:
        env = LinearEnv(num_clients=n, dim=25, num_arms=25, seed=0)
        if protocol == "central":
            return env, CentralizedLinUCB(n, 25, backend="compiled")
        cls = AsyncLinUCB if protocol == "async" else SyncLinUCB
        return env, cls(n, 25, backend="compiled", layout=layout)

    env, p = build(50)  # compile (or load the cached kernels) before timing
    it = env.interactions(0, 20)
    p.run(it.clients, it.contexts, it.rewards)
    del env, p
    began = time.process_time()  # CPU time: other work on the shared machine does not count
    env, p = build(clients)  # timed: the dense layout allocates its state here, the sparse one while it runs
    setup = seconds = time.process_time() - began
    digest, regret = hashlib.sha256(), 0.0
    for start in range(0, steps, block):
        it = env.interactions(start, min(start + block, steps))
        began = time.process_time()
        arms = p.run(it.clients, it.contexts, it.rewards)
        seconds += time.process_time() - began
        digest.update(arms.numpy().tobytes())
        exp = it.expected.numpy()
        regret += float((exp.max(-1) - np.take_along_axis(exp, arms.numpy()[..., None], -1)[..., 0]).sum())
    rows = p.policy.G.shape[0]
    arrived = int(p.allocated.sum()) if protocol != "central" and layout == "sparse" else None
    return {"protocol": protocol, "layout": layout if protocol != "central" else "one row per replicate",
            "clients": clients, "steps": steps, "steps_per_s": round(steps / seconds, 1),
            "setup_s": round(setup, 2),
            "peak_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024), "arrived": arrived,
            "state_rows": rows, "regret": round(regret, 3), "decisions_sha256": digest.hexdigest()[:16],
            "messages": int(p.ledger.totals()["comm_messages"].sum()) if protocol != "central" else 0}


def case_clients(args: argparse.Namespace) -> dict[str, Any]:
    """Every protocol × layout × clients in a process of its own (its peak memory is its own); the dense and the
    sparse layout's decisions must agree where both ran."""
    runs = []
    for protocol in args.protocols.split(","):
        layouts = ["sparse"] if protocol == "central" else args.layouts.split(",")
        for clients in (int(float(c)) for c in args.clients.split(",")):
            for layout in layouts:
                if layout == "dense" and clients > args.dense_max:
                    continue
                cmd = [sys.executable, "-m", "scripts.bench_scale", "--clients-child",
                       f"{protocol},{layout},{clients},{args.steps},{args.block}"]
                proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
                if proc.returncode != 0:
                    raise SystemExit(f"{shlex.join(cmd[2:])} failed (exit code {proc.returncode}):\n"
                                     f"{proc.stderr[-3000:]}")
                runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    for a in runs:
        for b in runs:
            same = (a["protocol"], a["clients"]) == (b["protocol"], b["clients"])
            if same and a["decisions_sha256"] != b["decisions_sha256"]:
                raise SystemExit(f"{a['protocol']} at {a['clients']} clients: the layouts' decisions differ")
    if args.plot:
        plot_clients(runs, Path(args.plot))
    return {"case": "clients", "cores": len(os.sched_getaffinity(0)), "load_after": [round(x, 2) for x in
            os.getloadavg()], "runs": runs}


def plot_clients(runs: list[dict[str, Any]], path: Path) -> None:
    """Peak memory and steps/s against clients, log-log, one line per protocol (colour and marker) and layout (line
    style), so that a protocol's sparse and dense lines, and lines that coincide, can still be told apart."""
    from fedrec.app.plots import legend_below, save_figure, set_title, subplots

    fig, axes = subplots(1, 2, figsize=(10, 4.6))
    lines: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in runs:
        lines.setdefault((r["protocol"], r["layout"]), []).append(r)
    protocols = list(dict.fromkeys(protocol for protocol, _ in lines))
    for (protocol, layout), rs in lines.items():
        rs = sorted(rs, key=lambda r: r["clients"])
        n = protocols.index(protocol)
        style = dict(color=f"C{n}", marker="osD^v"[n % 5], markerfacecolor="none" if layout == "dense" else None,
                     linestyle="--" if layout == "dense" else "-", label=f"{protocol} ({layout})")
        axes[0].plot([r["clients"] for r in rs], [r["peak_mib"] for r in rs], **style)
        axes[1].plot([r["clients"] for r in rs], [r["steps_per_s"] for r in rs], **style)
    for ax, what in zip(axes, ("peak resident memory (MiB)", "steps/s")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("clients (env.num_clients)")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    legend_below(fig, axes[0], ncols=3)
    set_title(fig, f"Client-server LinUCB protocols, d = K = 25, {runs[0]['steps']:,} steps, one replicate")
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path)


CASES: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {"sweep": case_sweep, "shard": case_shard,
                                                                     "bandit_shard": case_bandit_shard,
                                                                     "clients": case_clients, "grouping": case_grouping,
                                                                     "rows": case_rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="sweep", help=f"comma-separated, of: {', '.join(CASES)}")
    parser.add_argument("--sweep", default=SWEEP, help="the sweep's overrides (default: %(default)s)")
    parser.add_argument("--n-jobs", type=int, default=2, help="jobs the joblib launcher runs at once")
    parser.add_argument("--shard", default=SHARD, help="overrides of the shard case's run (default: %(default)s)")
    parser.add_argument("--devices", type=int, default=2,
                        help="processes of the shard cases' sharded runs (and the bandit_shard case's replicates)")
    parser.add_argument("--bandit-shard", default=BANDIT_SHARD,
                        help="overrides of the bandit_shard case's run (default: %(default)s)")
    parser.add_argument("--shard-only", action="store_true", help="the shard case runs the sharded setting alone")
    parser.add_argument("--repeats", type=int, default=1, help="times each sweep is run (the fastest is reported)")
    parser.add_argument("--protocols", default="async,sync,central", help="the clients case's protocols")
    parser.add_argument("--clients", default="1e4,1e5,1e6", help="the clients case's numbers of clients")
    parser.add_argument("--layouts", default="sparse", help="the clients case's layouts (sparse, dense)")
    parser.add_argument("--dense-max", type=int, default=10**5, help="the largest number of clients run dense")
    parser.add_argument("--steps", type=int, default=10**5, help="steps of each clients run")
    parser.add_argument("--block", type=int, default=1000, help="steps per protocol call in the clients case")
    parser.add_argument("--plot", default=None, help="the clients case's figure (a .png path)")
    parser.add_argument("--grouping", default=GROUPING, help="the grouping case's sizes (default: %(default)s)")
    parser.add_argument("--grouping-model", choices=["mf", "fedgnn"], default="mf", help="the grouping case's model")
    parser.add_argument("--grouping-stream", action="store_true", help="the grouping case's ratings arrive by round")
    parser.add_argument("--grouping-rounds", type=int, default=4, help="timed rounds of each grouping setting")
    parser.add_argument("--grouping-threads", type=int, default=os.cpu_count() or 1,
                        help="the rows case's threads for its parallel grouping (default: the machine's cores)")
    parser.add_argument("--clients-child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.clients_child:
        protocol, layout, clients, steps, block = args.clients_child.split(",")
        print(json.dumps(clients_run(protocol, layout, int(clients), int(steps), int(block))), flush=True)
        return
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases:
        parser.error(f"--cases: unknown case {', '.join(unknown) or '(none given)'}; one of {', '.join(CASES)}")
    if args.n_jobs < 1 or args.repeats < 1 or args.devices < 1:
        parser.error("--n-jobs, --repeats and --devices must be >= 1")
    for case in cases:
        print(json.dumps(CASES[case](args)), flush=True)


if __name__ == "__main__":
    main()

"""Throughput of fedrec's Gossip_UCB / Fed_UCB against the per-agent Python reference (tests/reference/gossip.py), which
draws every random number through the same keyed helpers, so the benchmark is also an equivalence check.

Cases:
  a  Fig. 2(a) setting: N = 3, M = 5, triangle K3, ε ∈ {1, ∞}, one trial. The reference plays --ref-steps rounds;
     ours plays the same prefix (decisions and regret compared) and a longer run of --long-steps rounds.
  b  the same for Fig. 2(b): N = 10, M = 10, ring C10.
  c  ours batched over --c-replicates trials for --c-steps rounds, serial kernel vs the parallel (prange) variant,
     per setting and ε ∈ {1, ∞}; then the time extrapolated to the whole Fig. 2(a)+(b): 4 ε levels (ε = 2, 5 cost
     what ε = 1 costs) × 100 trials × T = 10^6, at the measured rate of the parallel variant.

Every case prints ONE JSON line; ratios are per trial-step (reference time / ours). Targets (≥ 100× per
trial-step; Fig. 2(a)+(b) under 10 minutes) are reported, never asserted. Single timings. With --threads 1 (the
default) torch and numba run one thread and the timer is the process CPU clock, so a busy machine does not skew
the comparison; ``load_1min`` tells how busy it was. Kernels are compiled (or loaded from numba's cache) on a
throwaway short run before any timer starts. Every protocol is built with horizon = the longest run of its case,
so the reference and our prefix share T (it enters ε' and C̃).

    .venv/bin/python -m scripts.bench_gossip                      # all cases (several minutes)
    .venv/bin/python -m scripts.bench_gossip --cases ab --ref-steps 2000
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numba
import numpy as np
import torch

import fedrec.protocols.gossip as gossip_module
from fedrec.envs.mab import MultiAgentMAB
from fedrec.federation.topology import Topology, complete, ring
from fedrec.privacy import TreeLaplace
from fedrec.protocols.gossip import FedUCB
from tests.reference.gossip import RefGossipUCB

#: (case, N, M, topology factory) of Fig. 2(a) and Fig. 2(b)
SETTINGS = (("a_fig2a_k3", 3, 5, complete), ("b_fig2b_ring10", 10, 10, ring))
EPSILONS = (1.0, math.inf)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default="abc", help="which cases to run, e.g. 'ab'")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch and numba threads (1: process CPU clock)")
    p.add_argument("--ref-steps", type=int, default=20_000, help="rounds of the reference (and ours on that prefix)")
    p.add_argument("--long-steps", type=int, default=200_000, help="rounds of our longer single-trial run")
    p.add_argument("--c-replicates", type=int, default=100)
    p.add_argument("--c-steps", type=int, default=100_000)
    p.add_argument("--full-steps", type=int, default=1_000_000, help="T of the figures (the horizon of case c)")
    p.add_argument("--full-epsilons", type=int, default=4, help="ε levels of each figure (3 finite + ∞)")
    p.add_argument("--wall", action="store_true", help="time with the wall clock instead of the process CPU clock")
    p.add_argument("--out", type=str, default=None, help="also write the JSON lines to this file")
    return p.parse_args()


args = parse_args()
torch.set_num_threads(args.threads)
numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
use_wall = args.wall or args.threads > 1
clock = time.perf_counter if use_wall else time.process_time
lines: list[str] = []


def emit(record: dict[str, Any]) -> None:
    record.update({"threads": args.threads, "clock": "wall" if use_wall else "process_cpu",
                   "load_1min": round(os.getloadavg()[0], 2)})
    line = json.dumps(record)
    print(line, flush=True)
    lines.append(line)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = clock()
    out = fn()
    return clock() - t0, out


def eps_name(eps: float) -> str | float:
    return "inf" if math.isinf(eps) else eps


@contextmanager
def serial_kernel() -> Iterator[None]:
    """Make :class:`GossipBandit` run its serial kernel even for several replicates (it picks the prange variant
    for R > 1 by indexing ``GOSSIP_RUN``)."""
    saved = gossip_module.GOSSIP_RUN
    gossip_module.GOSSIP_RUN = (saved[0], saved[0])
    try:
        yield
    finally:
        gossip_module.GOSSIP_RUN = saved


def warm() -> None:
    """Compile (or load) both kernel variants and the reference's scalar draw helpers outside every timer."""
    for replicates in (1, 2):
        env = MultiAgentMAB(3, 2, replicates, seed=args.seed)
        for eps in EPSILONS:
            FedUCB(complete(3), 2, 64, replicates, args.seed, TreeLaplace(eps)).play(env, 64)
            with serial_kernel():
                FedUCB(complete(3), 2, 64, replicates, args.seed, TreeLaplace(eps)).play(env, 64)
    RefGossipUCB(complete(3), 2, 64, 1.0, args.seed).play(MultiAgentMAB(3, 2, seed=args.seed), 64)


def compare(case: str, N: int, M: int, topology: Topology, eps: float) -> None:
    """Cases a/b: one trial, the reference and ours on the same prefix, and ours on a longer run."""
    T, T_long = args.ref_steps, max(args.ref_steps, args.long_steps)
    env = MultiAgentMAB(N, M, seed=args.seed)
    ref = RefGossipUCB(topology, M, horizon=T_long, epsilon=eps, seed=args.seed)
    ref_time, ref_arms = timed(lambda: np.array(ref.play(env, T)))
    ours = FedUCB(topology, M, T_long, 1, args.seed, TreeLaplace(eps))
    ours_time, arms = timed(lambda: ours.play(env, T, return_arms=True))
    arms = arms[0].numpy()
    mismatch = np.flatnonzero((arms != ref_arms).any(axis=1))
    regret_diff = float(np.abs(ours.regret[0].numpy() - np.array(ref.regret)).max())
    record = {
        "case": case, "graph": topology.kind, "N": N, "M": M, "lambda2": round(topology.lambda2, 4),
        "epsilon": eps_name(eps), "steps": T,
        "ours_trial_steps_per_s": round(T / ours_time, 1), "reference_trial_steps_per_s": round(T / ref_time, 1),
        "ratio": round(ref_time / ours_time, 1), "target": 100, "meets_target": ref_time / ours_time >= 100,
        "decisions_identical": mismatch.size == 0, "first_mismatch_t": int(mismatch[0]) + 1 if mismatch.size else None,
        "regret_equal": regret_diff <= 1e-9, "regret_max_abs_diff": regret_diff,
        "regret_mean_over_agents": round(float(np.mean(ref.regret)), 4),
    }
    if T_long > T:
        long_run = FedUCB(topology, M, T_long, 1, args.seed, TreeLaplace(eps))
        long_time, _ = timed(lambda: long_run.play(env, T_long))
        record.update({"long_steps": T_long, "long_ours_trial_steps_per_s": round(T_long / long_time, 1),
                       "long_ratio_vs_reference": round((T_long / long_time) / (T / ref_time), 1)})
    emit(record)


def batched(case: str, N: int, M: int, topology: Topology, eps: float) -> float:
    """Case c: --c-replicates trials in one protocol, serial kernel vs the prange variant; the latter's rate."""
    R, T = args.c_replicates, args.c_steps
    env = MultiAgentMAB(N, M, R, seed=args.seed)
    with serial_kernel():
        serial = FedUCB(topology, M, args.full_steps, R, args.seed, TreeLaplace(eps))
        serial_time, _ = timed(lambda: serial.play(env, T))
    parallel = FedUCB(topology, M, args.full_steps, R, args.seed, TreeLaplace(eps))
    parallel_time, _ = timed(lambda: parallel.play(env, T))
    rate = R * T / parallel_time
    emit({"case": f"c_batched_{case[2:]}", "N": N, "M": M, "epsilon": eps_name(eps), "replicates": R, "steps": T,
          "horizon": args.full_steps, "serial_trial_steps_per_s": round(R * T / serial_time, 1),
          "parallel_trial_steps_per_s": round(rate, 1), "parallel_over_serial": round(serial_time / parallel_time, 2),
          "regret_identical": bool(torch.equal(serial.regret, parallel.regret))})
    return rate


warm()
for case, N, M, make in SETTINGS:
    if case[0] in args.cases:
        for eps in EPSILONS:
            compare(case, N, M, make(N), eps)

if "c" in args.cases:
    total = 0.0
    parts = {}
    for case, N, M, make in SETTINGS:
        rates = {eps: batched(case, N, M, make(N), eps) for eps in EPSILONS}
        trials = 100 * args.full_steps  # the paper's 100 trials per ε level
        seconds = trials * ((args.full_epsilons - 1) / rates[1.0] + 1 / rates[math.inf])
        parts[case[2:]] = round(seconds, 1)
        total += seconds
    emit({"case": "c_extrapolated_fig2ab", "epsilon_levels": args.full_epsilons, "trials": 100,
          "T": args.full_steps, "seconds_by_figure": parts, "seconds": round(total, 1),
          "minutes": round(total / 60, 2), "target_minutes": 10, "meets_target": total < 600,
          "basis": f"parallel variant rate on {args.threads} thread(s); cores on this machine: {os.cpu_count()}"})

if args.out:
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines) + "\n")

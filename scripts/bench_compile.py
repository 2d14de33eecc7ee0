"""The CPU time numba spends compiling the bandit kernels of a few ``train.py`` runs: one JSON line per measurement.

A run's compile time is the CPU time of ``train.py`` with an empty numba cache minus that of the same run again with
the cache the first one filled (start-up, data and steps cancel out). CPU time rather than wall time, since the
number hardly depends on what else the machine runs; kernels compile single-threaded (``NUMBA_NUM_THREADS=1``).
Cases (``--cases``): Sync-LinUCB and Async-LinUCB with two replicates (their parallel kernels and everything they
call), FCLUB-DC with two replicates, Fed_UCB at ε = 1 (Gossip_UCB's kernel with its tree noise) with two.

``--reference PATH`` measures another checkout the same way (e.g. ``git worktree add ../old <commit>``), interleaved
with this one, and ends with each case's ratio this / reference over the mean of the repeats. Each checkout's
``train.py`` imports that checkout's fedrec (its own folder comes first on ``sys.path``).

    .venv/bin/python -m scripts.bench_compile [--cases sync,async,fclub_dc,fed_ucb] [--repeats 2] [--reference ../old]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: case: the train.py overrides of its run
CASES = {
    "sync": ["+experiment=sync_linucb_synthetic", "task.steps=2000", "task.steps_per_round=500", "replicates=2"],
    "async": ["+experiment=async_linucb_synthetic", "task.steps=2000", "task.steps_per_round=500", "replicates=2"],
    "fclub_dc": ["+experiment=fclub_synthetic", "task.steps=10000", "replicates=2"],
    "fed_ucb": ["+experiment=gossip_synthetic_k3", "task.steps=2000", "task.steps_per_round=1000", "replicates=2"],
}


def cpu_seconds(tree: Path, overrides: list[str], env: dict[str, str]) -> float:
    """The CPU seconds (user + system) of one ``train.py`` run of checkout ``tree``."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "train.py", *overrides, "plots=false", "logger.tensorboard=false",
               f"hydra.run.dir={out}/run"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: train.py {shlex.join(cmd[2:])} failed (exit code {proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def compile_seconds(tree: Path, overrides: list[str]) -> float:
    """Cold-cache minus warm-cache CPU seconds of one run of ``tree``, in a numba cache of its own."""
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
        cold = cpu_seconds(tree, overrides, env)
        warm = cpu_seconds(tree, overrides, env)
    return cold - warm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--reference", type=Path, help="another checkout to measure the same way (a git worktree)")
    args = p.parse_args()
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise SystemExit(f"--cases: unknown case(s) {unknown}; expected some of {list(CASES)}")
    trees = {"this": ROOT}
    if args.reference is not None:
        if not (args.reference / "train.py").is_file():
            raise SystemExit(f"--reference: {args.reference} is not a fedrec checkout (no train.py)")
        trees["reference"] = args.reference.resolve()
    seconds: dict[tuple[str, str], list[float]] = {}
    for repeat in range(args.repeats):
        for case in cases:
            for tree, path in trees.items():
                s = compile_seconds(path, CASES[case])
                seconds.setdefault((case, tree), []).append(s)
                print(json.dumps({"repeat": repeat, "case": case, "tree": tree, "compile_cpu_s": round(s, 2)}),
                      flush=True)
    if args.reference is not None:
        for case in cases:
            this, ref = (statistics.mean(seconds[case, tree]) for tree in trees)
            print(json.dumps({"case": case, "this_mean_s": round(this, 2), "reference_mean_s": round(ref, 2),
                              "ratio": round(this / ref, 3)}))


if __name__ == "__main__":
    main()

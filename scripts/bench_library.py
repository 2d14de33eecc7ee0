"""The README's FedGNN Python example (library path) against the same run from ``train.py`` (CLI path).

Each case runs in a fresh Python process (thread settings cannot leak from one case to the next); the cases are
interleaved, repeated ``--repeats`` times and summarised by their medians. Cases:

* ``cli``: ``train.py +experiment=fedgnn_ml100k_dp`` (``num_threads: 1`` from conf/config.yaml);
* ``lib_torch_default``: the example with ``FederatedTrainer(num_threads=None)``: torch's default thread count (one per
  core), which is how the library ran before the trainer took a ``num_threads`` (default 1);
* ``lib``: the example as written (``FederatedTrainer()``, so one thread while ``fit`` runs).

``--diagnose`` adds: the user-side trick (``torch.set_num_threads(1)`` first), ``OMP_NUM_THREADS=1``, torch's
default threads with ``OMP_WAIT_POLICY=PASSIVE`` (idle OpenMP workers sleep instead of spinning) and one inter-op
thread with the default intra-op threads.

Both paths do the same work: ML-100K, ``--rounds`` rounds (the data stream spread over as many), FedGNN with
``embed_dim=8``, FedSGD, Adam (lr 0.05, weight decay 1e-4, persistent), 50 pseudo items, client-level Gaussian DP
(epsilon 10, delta 1e-5, clip 0.1), seed 0. The CLI writes no plots, TensorBoard or CSV logs and checkpoints only at
the end, as the example does; the example seeds torch before building the model as the CLI does, so that both runs
give the same best test RMSE (printed as a check). Times: the whole process (imports, data, training; wall clock),
its CPU time (user + system) and the training loop alone (``trainer.wall_seconds``; the library's includes the
first accounting call's import of Opacus, about 1 s, which the CLI's imports have already done).

    FEDREC_DATA_DIR=/path/to/data .venv/bin/python -m scripts.bench_library            # 20 rounds
    FEDREC_DATA_DIR=/path/to/data .venv/bin/python -m scripts.bench_library --rounds 100 --diagnose
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the README example; {prelude} and {trainer_args} vary by case, {data_dir} and {rounds} are filled in
LIBRARY = """
import time
started = time.perf_counter()
{prelude}
import torch
from fedrec.data import load_ratings
from fedrec.recsys import FedSGD
from fedrec.models import FedGNN
from fedrec.privacy import ClientDP
from fedrec.tasks import FedRecTask
from fedrec.trainer import Callback, FederatedTrainer

imported = time.perf_counter()
data = load_ratings("ml-100k", {data_dir!r}, seed=0, rounds={rounds})
dp = ClientDP(data.num_clients, "gaussian", epsilon=10.0, delta=1e-5, clip=0.1)
torch.manual_seed(0)  # as the CLI does before building the model (same initial model, same results)
task = FedRecTask(data, FedGNN(data.num_users, data.num_items, embed_dim=8), FedSGD(), dp, rounds={rounds})
built = time.perf_counter()
threads_before = torch.get_num_threads()
trainer = FederatedTrainer({trainer_args})
trainer.fit(task)
print(task.summary()["best_test_rmse"], dp.spent().max())
import json
print("BENCH " + json.dumps({{
    "import_s": imported - started, "setup_s": built - imported, "loop_s": trainer.wall_seconds,
    "threads_before_fit": threads_before, "threads_after_fit": torch.get_num_threads(),
    "interop_threads": torch.get_num_interop_threads(),
    "best_test_rmse": task.summary()["best_test_rmse"], "epsilon_spent": float(dp.spent().max()),
}}))
"""


def library_case(threads: str, prelude: str = "", trainer_args: str = "", env: dict[str, str] | None = None) -> dict:
    return {"kind": "library", "threads": threads, "prelude": prelude, "trainer_args": trainer_args,
            "env": env or {}}


def cli_case(threads: str, *overrides: str) -> dict:
    return {"kind": "cli", "threads": threads, "overrides": list(overrides), "env": {}}


CASES = {
    "cli": cli_case("1 (num_threads: 1)"),
    "lib_torch_default": library_case("torch default (one per core)", trainer_args="num_threads=None"),
    "lib": library_case("1 (FederatedTrainer default)"),
}
DIAGNOSE = {
    "lib_user_set_num_threads_1": library_case("1 (torch.set_num_threads(1))", "import torch; torch.set_num_threads(1)",
                                               "num_threads=None"),
    "lib_OMP_NUM_THREADS_1": library_case("1 (OMP_NUM_THREADS=1)", trainer_args="num_threads=None",
                                          env={"OMP_NUM_THREADS": "1"}),
    "lib_OMP_WAIT_POLICY_PASSIVE": library_case("torch default, OMP_WAIT_POLICY=PASSIVE",
                                                trainer_args="num_threads=None", env={"OMP_WAIT_POLICY": "PASSIVE"}),
    "lib_interop_1": library_case("torch default, 1 inter-op thread",
                                  "import torch; torch.set_num_interop_threads(1)", "num_threads=None"),
}


def run_case(case: dict, rounds: int, data_dir: str, workdir: Path) -> dict:
    """Run one case in a fresh process; its wall and CPU seconds and what it reports."""
    env = {**os.environ, **case["env"], "FEDREC_DATA_DIR": data_dir}
    if case["kind"] == "cli":
        out = workdir / "run"
        cmd = [sys.executable, str(ROOT / "train.py"), "+experiment=fedgnn_ml100k_dp", f"task.rounds={rounds}",
               f"data_dir={data_dir}", f"hydra.run.dir={out}", "trainer.enable_progress_bar=false",
               "trainer.checkpoint_every=0", "plots=false", "logger.tensorboard=false", "logger.csv=false",
               *case["overrides"]]
    else:
        code = LIBRARY.format(prelude=case["prelude"], trainer_args=case["trainer_args"], data_dir=data_dir,
                              rounds=rounds)
        cmd = [sys.executable, "-c", code]
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"case failed ({proc.returncode}): {' '.join(cmd[:3])}...\n{proc.stderr[-3000:]}")
    result = {"wall_s": wall, "cpu_s": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)}
    if case["kind"] == "cli":
        summary = json.loads((workdir / "run" / "summary.json").read_text())
        result.update(loop_s=summary["wall_seconds"], best_test_rmse=summary["best_test_rmse"],
                      epsilon_spent=summary["epsilon_spent"])
    else:
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH "))
        result.update(json.loads(line.removeprefix("BENCH ")))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds of the run (the README example: 100)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each case (medians are reported)")
    parser.add_argument("--diagnose", action="store_true", help="also time the diagnostic cases")
    parser.add_argument("--data-dir", default=os.environ.get("FEDREC_DATA_DIR", str(ROOT / "data")))
    args = parser.parse_args()
    import torch

    cases = {**CASES, **(DIAGNOSE if args.diagnose else {})}
    print(f"{args.rounds} rounds, {args.repeats} repeats; {os.cpu_count()} cores, torch {torch.__version__} "
          f"(default intra-op threads {torch.get_num_threads()}); load average before "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    results: dict[str, list[dict]] = {name: [] for name in cases}
    names = list(cases)
    for rep in range(args.repeats):
        for name in names[rep % len(names):] + names[:rep % len(names)]:  # rotate the order over the repeats
            with tempfile.TemporaryDirectory(prefix="bench_library_") as tmp:
                r = run_case(cases[name], args.rounds, args.data_dir, Path(tmp))
            results[name].append(r)
            print(f"  repeat {rep + 1} {name:40s} wall {r['wall_s']:6.1f} s  cpu {r['cpu_s']:6.1f} s  "
                  f"loop {r['loop_s']:6.1f} s  best test RMSE {r['best_test_rmse']:.6f}", flush=True)
    print(f"load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in results[name])

    print(f"{'case (median of ' + str(args.repeats) + ')':40s} {'process':>9s} {'cpu':>8s} {'loop':>8s} "
          f"{'process/CLI':>12s} {'loop/CLI':>9s}  threads in fit")
    for name in cases:
        wall, loop = med(name, "wall_s"), med(name, "loop_s")
        print(f"{name:40s} {wall:8.1f}s {med(name, 'cpu_s'):7.1f}s {loop:7.1f}s {wall / med('cli', 'wall_s'):11.2f}× "
              f"{loop / med('cli', 'loop_s'):8.2f}×  {cases[name]['threads']}")
    lib = results["lib"][0]
    print(f"\nlibrary (as written) / CLI: {med('lib', 'wall_s') / med('cli', 'wall_s'):.2f}× (whole process), "
          f"{med('lib', 'loop_s') / med('cli', 'loop_s'):.2f}× (training loop); target ≤ 1.5×")
    print(f"torch threads in the caller after fit: {lib['threads_after_fit']} (before: {lib['threads_before_fit']}); "
          f"library setup: import {statistics.median(r['import_s'] for r in results['lib']):.1f} s, data + task "
          f"{statistics.median(r['setup_s'] for r in results['lib']):.1f} s")
    same = {round(r["best_test_rmse"], 6) for r in results["cli"] + results["lib"]}
    print(f"same work: best test RMSE of CLI and library {'agree' if len(same) == 1 else 'DIFFER'} "
          f"({', '.join(f'{x:.6f}' for x in sorted(same))})")


if __name__ == "__main__":
    main()

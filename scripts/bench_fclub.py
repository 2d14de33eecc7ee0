"""Time fedrec's FCLUB-DC / CDP-FCLUB-DC against the plain per-object reference (tests/reference/fclub.py) on the
same stream, side by side in one run, and print the ratio; also 10 seeds batched against 10 sequential runs.

    .venv/bin/python -m scripts.bench_fclub [--steps 20000] [--seeds 10]

Both sides play the same arms (checked), so the ratio compares equal work. One thread; wall clock, median of 3.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from fedrec.envs.clustered import ClusteredLinearEnv
from fedrec.privacy import TreeGaussian
from fedrec.protocols.fclub import FederatedClustering
from tests.reference.fclub import RefFCLUB

#: name: (the TreeGaussian privacy arguments or None, the reference arguments); both take the run's horizon
CASES = {"fclub_dc": (None, {}), "cdp_fclub_dc": (dict(epsilon=1.0), dict(epsilon=1.0))}


def timed(fn, repeats: int = 3) -> tuple[float, object]:
    """Median wall time of ``fn()`` over ``repeats`` calls, and its last result."""
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20000)
    p.add_argument("--seeds", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(1)
    data = os.environ.get("FEDREC_DATA_DIR", "data")
    env = ClusteredLinearEnv(data_dir=data, replicates=args.seeds, seed=0, chunk_size=args.steps)
    batch = env.interactions(0, args.steps)
    one = slice(0, 1)
    for name, (privacy, theirs) in CASES.items():
        ours = None if privacy is None else TreeGaussian(**privacy, horizon=args.steps)

        def fedrec_run(rows: slice = one, ours: TreeGaussian | None = ours) -> torch.Tensor:
            proto = FederatedClustering(env.num_clients, env.dim, rows.stop - rows.start, privacy=ours)
            return proto.run(batch.clients[rows], batch.contexts[rows], batch.rewards[rows])

        def reference_run(theirs: dict = theirs):
            ref = RefFCLUB(env.servers, env.dim, **theirs, horizon=args.steps)
            return ref.run(batch.clients[0].numpy(), batch.contexts[0].numpy(), batch.rewards[0].numpy())

        fedrec_run()  # compile
        t_ours, arms = timed(fedrec_run)
        t_ref, ref_arms = timed(reference_run, repeats=1)
        assert (arms[0].numpy() == ref_arms).all(), "fedrec and the reference disagree"
        t_batch, _ = timed(lambda: fedrec_run(slice(0, args.seeds)))
        t_seq, _ = timed(lambda: [fedrec_run(slice(r, r + 1)) for r in range(args.seeds)], repeats=1)
        print(f"{name}: T = {args.steps}: reference {t_ref / args.steps * 1e6:.1f} us/round, fedrec "
              f"{t_ours / args.steps * 1e6:.1f} us/round, ratio {t_ref / t_ours:.1f}x; {args.seeds} seeds batched "
              f"{t_batch:.2f} s vs sequential {t_seq:.2f} s ({t_seq / t_batch:.1f}x)")


if __name__ == "__main__":
    main()

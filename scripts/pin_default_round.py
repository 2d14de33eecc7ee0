"""The pins of ``tests/test_strategy.py``'s default-round test: (model sha1, metrics sha1, last test RMSE) of four
rounds of each case, computed by the round of commit 9329ae9 (before strategies) on this machine's CPU kernels.

Float results differ between CPUs (torch's and MKL's kernels per instruction set), so the test keeps one set of pins
per machine type it has run on. On a new one, record them from a checkout of 9329ae9 and add them as a new entry:

    git worktree add --detach /tmp/pre-strategy 9329ae9
    .venv/bin/python scripts/pin_default_round.py /tmp/pre-strategy
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

#: the metrics of every round that the pins hash
PINNED_METRICS = ("train_loss", "test_rmse", "clients", "epsilon_spent", "comm_upload_scalars")


def fingerprint(task: Any, rounds: int) -> tuple[str, str, float]:
    """``task`` run for ``rounds`` rounds: (sha1 of its model's state, sha1 of the :data:`PINNED_METRICS` of every
    round, the last round's test RMSE), the test's pins (``task``: a FedRecTask of this tree or of 9329ae9)."""
    metrics = []
    for r in range(rounds):
        m = task.run_round(r)
        metrics.append({k: m[k] for k in sorted(m) if k in PINNED_METRICS})
    digest = hashlib.sha1()
    for name, v in sorted(task.model.state_dict().items()):
        digest.update(name.encode())
        digest.update(v.detach().cpu().numpy().tobytes())
    return digest.hexdigest(), hashlib.sha1(json.dumps(metrics).encode()).hexdigest(), metrics[-1]["test_rmse"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("checkout", type=Path, help="a checkout of commit 9329ae9")
    root = p.parse_args().checkout.resolve()
    os.chdir(root)
    sys.path.insert(0, str(root))
    import torch

    import fedrec
    from fedrec.aggregation import FedAdam
    from fedrec.data import load_ratings
    from fedrec.models import FedGNN, MatrixFactorization
    from fedrec.privacy import ClientDP
    from fedrec.recsys import FedAvg, FedSGD
    from fedrec.tasks import FedRecTask
    from tests.test_fedrec import write_ml1m  # 9329ae9's writer of the synthetic ML-1M file

    if not Path(fedrec.__file__).resolve().is_relative_to(root):
        sys.exit(f"fedrec was imported from {fedrec.__file__}, not from the checkout {root}")
    torch.set_num_threads(1)  # as the test suite's conftest
    with tempfile.TemporaryDirectory() as folder:
        data = load_ratings("ml-1m", write_ml1m(Path(folder), users=30, items=40, seed=1), seed=0, rounds=4,
                            num_clients=8)
    cases = {  # as the test's CASES, with 9329ae9's API (local steps on the aggregator)
        "fedsgd": (FedGNN, None, FedSGD, None),
        "fedsgd-gaussian": (FedGNN, "gaussian", FedSGD, None),
        "fedavg-laplace-fedadam": (MatrixFactorization, "laplace", lambda: FedAvg(local_steps=2),
                                   lambda: FedAdam(lr=0.05)),
        "fedavg-gaussian": (FedGNN, "gaussian", FedAvg, None),
    }
    print(f"# {torch.backends.cpu.get_cpu_capability()} kernels")
    for case, (model_cls, mechanism, aggregator, server) in cases.items():
        dp = None if mechanism is None else ClientDP(data.num_clients, mechanism, epsilon=4.0, delta=1e-5)
        torch.manual_seed(0)
        task = FedRecTask(data, model_cls(data.num_users, data.num_items, 4), aggregator(), dp, rounds=4,
                          pseudo_items=5, seed=3, server=None if server is None else server())
        model_sha1, metrics_sha1, last_rmse = fingerprint(task, 4)
        print(f'"{case}": ("{model_sha1}", "{metrics_sha1}", {last_rmse!r}),')


if __name__ == "__main__":
    main()

"""Speed of a federated FedGNN round on MovieLens-100K: batched clients against a per-client loop, and full runs.

Cases (one run, one JSON line each):
  round  the clients' computation of one round (943 clients: every gradient of ω, user rows and item rows),
         batched (``fedrec.recsys.local.local_updates``, one backward pass) vs the per-client reference
         loop (``tests/reference/fedrec_round.py``: PyG ``GATConv`` per user, autograd per client). Both see the same
         model and data; the largest gradient difference is printed. Also the whole batched round
         (``FedRecTask.run_round``: pseudo items, DP, aggregation, server step, evaluation).
  run    wall time of full T-round runs through ``FederatedTrainer`` (non-private FedSGD, and Gaussian DP).
  planner  BGTplanner's own time per round (building X^t, its top singular values, the GP, the accountant's checks,
         LP, dual, sampling: the time inside its hooks) against the time of a training round, both from the same
         Gaussian-DP run with a 10% validation split; --planner-runs such runs, the median share reported, with
         each run's split of the planner's time by part.

Targets (reported, not asserted): batched ≥ 20× the loop; a 100-round ML-100K run < 120 s on 2 cores; the
planner < 5% of a training round.

    FEDREC_DATA_DIR=/path/to/data .venv/bin/python -m scripts.bench_fedgnn
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from fedrec.data import load_ratings
from fedrec.models import FedGNN
from fedrec.privacy import ClientDP
from fedrec.recsys import FedSGD
from fedrec.recsys.data import round_data
from fedrec.recsys.local import local_updates
from fedrec.tasks import FedRecTask
from fedrec.trainer import FederatedTrainer
from tests.reference.fedrec_round import reference_client_gradients


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=os.environ.get("FEDREC_DATA_DIR", "data"))
    p.add_argument("--cases", default="round,run,planner")
    p.add_argument("--round", type=int, default=50, help="which round's training data the round case uses")
    p.add_argument("--rounds", type=int, default=100, help="T of the full runs")
    p.add_argument("--repeats", type=int, default=5, help="batched timings (the median is reported)")
    p.add_argument("--planner-runs", type=int, default=3, help="runs of the planner case (the median is reported)")
    p.add_argument("--planner-data", choices=["ml100k", "ml1m-size"], default="ml100k",
                   help="the planner case's data: MovieLens-100K, or synthetic ratings of MovieLens-1M's size "
                        "(6,040 users in 605 clients, 3,706 items, 1,000,209 ratings; no download)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="append the JSON lines to this file")
    return p.parse_args()


def emit(record: dict, out: Path | None) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if out is not None:
        with open(out, "a") as f:
            f.write(line + "\n")


def case_round(args: argparse.Namespace) -> dict:
    data = load_ratings("ml-100k", args.data_dir, seed=args.seed, rounds=args.rounds)
    tr = data.training_until(args.round)
    d = round_data(tr.user, tr.item, tr.rating, data.client_of_user, data.num_items)
    torch.manual_seed(args.seed)
    model = FedGNN(data.num_users, data.num_items, 8)
    local_updates(model, d)  # warm-up
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        ours = local_updates(model, d)
        times.append(time.perf_counter() - t0)
    ours_s = sorted(times)[len(times) // 2]
    t0 = time.perf_counter()
    ref = reference_client_gradients(model, d)
    ref_s = time.perf_counter() - t0
    diff = 0.0
    for c, r in enumerate(ref):
        diff = max(diff, float((ours.rows[d.row_client == c] - r["rows"]).abs().max()),
                   float((ours.users[d.user_client == c] - r["users"]).abs().max()),
                   *(float((ours.shared[n][c] - r[n]).abs().max()) for n in ours.shared))
    task = FedRecTask(data, model, FedSGD(), None, rounds=args.rounds, seed=args.seed)
    task.run_round(args.round - 1)  # warm-up (and a plausible optimiser state)
    t0 = time.perf_counter()
    task.run_round(args.round)
    full_round_s = time.perf_counter() - t0
    return {"case": "round", "clients": d.num_clients, "ratings": int(d.entry_user.numel()),
            "ours_s": ours_s, "reference_loop_s": ref_s, "ratio": ref_s / ours_s, "max_abs_grad_diff": diff,
            "ours_full_round_s": full_round_s, "target_ratio": 20}


def case_run(args: argparse.Namespace, privacy: str) -> dict:
    t0 = time.perf_counter()
    data = load_ratings("ml-100k", args.data_dir, seed=args.seed, rounds=args.rounds)
    torch.manual_seed(args.seed)
    model = FedGNN(data.num_users, data.num_items, 8)
    dp = ClientDP(data.num_clients, "gaussian", epsilon=10.0, delta=1e-5) if privacy == "gaussian" else None
    task = FedRecTask(data, model, FedSGD(), dp, rounds=args.rounds, seed=args.seed)
    FederatedTrainer(enable_progress_bar=False).fit(task)
    s = task.summary()
    return {"case": "run", "privacy": privacy, "rounds": args.rounds, "wall_s": time.perf_counter() - t0,
            "best_test_rmse": s["best_test_rmse"], "final_test_rmse": s["final_test_rmse"],
            "epsilon_spent": s["epsilon_spent"], "target_wall_s": 120}


def planner_run(args: argparse.Namespace) -> dict:
    """One Gaussian-DP run with BGTplanner (``--planner-data``): its time per round and the training round's, side by
    side."""
    from fedrec.data import synthetic_ratings
    from fedrec.planners.bgtplanner import BGTPlanner

    if args.planner_data == "ml100k":
        data = load_ratings("ml-100k", args.data_dir, seed=args.seed, rounds=args.rounds, val_fraction=0.1)
    else:
        data = synthetic_ratings(num_clients=605, seed=args.seed, rounds=args.rounds, val_fraction=0.1)
    torch.manual_seed(args.seed)
    model = FedGNN(data.num_users, data.num_items, 8)
    dp = ClientDP(data.num_clients, "gaussian", epsilon=10.0, delta=1e-5)
    task = FedRecTask(data, model, FedSGD(), dp, rounds=args.rounds, seed=args.seed)
    planner = BGTPlanner(seed=args.seed)
    trainer = FederatedTrainer(callbacks=[planner], enable_progress_bar=False)
    trainer.fit(task)
    rounds = trainer.round
    planner_s = planner.overhead_seconds / rounds
    round_s = (trainer.wall_seconds - planner.overhead_seconds) / rounds
    parts = {k: 1e3 * v / rounds for k, v in planner.part_seconds.items()}
    parts["rest"] = 1e3 * planner_s - sum(parts.values())  # dual, sampling, LP, bookkeeping
    return {"rounds": rounds, "planner_ms_per_round": 1e3 * planner_s, "training_round_ms": 1e3 * round_s,
            "planner_share": planner_s / round_s, "planner_parts_ms_per_round": parts,
            "actions": list(planner.actions)}


def case_planner(args: argparse.Namespace) -> dict:
    runs = [planner_run(args) for _ in range(args.planner_runs)]
    mid = sorted(runs, key=lambda r: r["planner_share"])[len(runs) // 2]
    return {"case": "planner", "data": args.planner_data, "runs_count": len(runs), "rounds": mid["rounds"],
            "planner_ms_per_round": mid["planner_ms_per_round"], "training_round_ms": mid["training_round_ms"],
            "planner_share": mid["planner_share"], "target_share": 0.05,
            "same_actions_every_run": all(r["actions"] == runs[0]["actions"] for r in runs),
            "runs": [{k: v for k, v in r.items() if k != "actions"} for r in runs]}


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    cases = args.cases.split(",")
    meta = {"threads": args.threads, "torch": torch.__version__, "load_1min": os.getloadavg()[0]}
    if "round" in cases:
        emit({**case_round(args), **meta}, args.out)
    if "run" in cases:
        for privacy in ("none", "gaussian"):
            emit({**case_run(args, privacy), **meta}, args.out)
    if "planner" in cases:
        emit({**case_planner(args), **meta}, args.out)


if __name__ == "__main__":
    main()

"""A custom trainer callback: early stopping on a metric (FedGNN on MovieLens-100K, non-private FedSGD).

``EarlyStopping`` subclasses ``fedrec.trainer.Callback``. Its ``on_round_end`` hook receives every round's
metrics; it stops the run by setting ``trainer.should_stop = True`` when the monitored metric has not improved by
``min_delta`` for ``patience`` rounds, or as soon as it reaches ``target``. Its ``state_dict`` goes into the
trainer's checkpoints, so a resumed run remembers the best value and the rounds waited.

Needs ML-100K in ``$FEDREC_DATA_DIR`` (``python -m fedrec.data download ml-100k``). Ratings are normalised
(r / 5), so the RMSE is on that scale.

    python examples/early_stopping_callback.py --rounds 40 --target 0.25

The last line reads ``stopped_round=… rounds_run=… max_rounds=… best_val_rmse=… final_test_rmse=…``
(``stopped_round=-1``: the callback never fired).
"""
from __future__ import annotations

import argparse
import math
import os
from typing import Any

import torch

from fedrec.data import load_ratings
from fedrec.errors import run_script
from fedrec.models import FedGNN
from fedrec.recsys import FedSGD
from fedrec.tasks import FedRecTask
from fedrec.trainer import Callback, FederatedTrainer


class EarlyStopping(Callback):
    """Stop when ``monitor`` stalls for ``patience`` rounds or reaches ``target``.

    Args:
        monitor: a metric the task returns each round (e.g. ``val_rmse``).
        mode: ``"min"`` if smaller is better, ``"max"`` if larger is.
        patience: rounds without an improvement of at least ``min_delta`` before stopping.
        min_delta: the smallest change that counts as an improvement.
        target: stop as soon as the metric is at least this good (None: no target).
    """

    def __init__(self, monitor: str, mode: str = "min", patience: int = 3, min_delta: float = 0.0,
                 target: float | None = None) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        self.monitor, self.mode, self.patience, self.min_delta, self.target = monitor, mode, patience, min_delta, target
        self.best = math.inf if mode == "min" else -math.inf
        self.waited = 0
        self.stopped_round: int | None = None
        self.reason = ""

    def better(self, value: float, than: float) -> bool:
        return value < than if self.mode == "min" else value > than

    def on_round_end(self, trainer: Any, task: Any, round_idx: int, metrics: dict[str, float]) -> None:
        value = metrics[self.monitor]
        sign = -1.0 if self.mode == "min" else 1.0  # an improvement moves the value by +min_delta in mode "max"
        if self.better(value, self.best + sign * self.min_delta):
            self.best, self.waited = value, 0
        else:
            self.waited += 1
        if self.target is not None and not self.better(self.target, value):
            self.reason = f"{self.monitor} = {value:.4f} reached the target {self.target}"
        elif self.waited >= self.patience:
            self.reason = f"{self.monitor} did not improve by {self.min_delta} for {self.patience} rounds"
        else:
            return
        self.stopped_round = round_idx
        trainer.should_stop = True  # the trainer finishes this round's logging, then ends the run

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "waited": self.waited, "stopped_round": self.stopped_round, "reason": self.reason}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.waited = state["best"], state["waited"]
        self.stopped_round, self.reason = state["stopped_round"], state["reason"]


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="the most rounds to run")
    parser.add_argument("--patience", type=int, default=3)
    parser.add_argument("--min-delta", type=float, default=1e-3)
    parser.add_argument("--target", type=float, default=0.25, help="stop once val_rmse is at most this")
    parser.add_argument("--data-dir", default=os.environ.get("FEDREC_DATA_DIR") or "data")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    # 10% of the training ratings held out for validation: the metric to monitor, kept apart from the test split
    data = load_ratings("ml-100k", args.data_dir, seed=args.seed, rounds=args.rounds, val_fraction=0.1)
    torch.manual_seed(args.seed)  # the model's initial weights come from torch's global generator
    model = FedGNN(data.num_users, data.num_items, embed_dim=8)
    task = FedRecTask(data, model, FedSGD(), rounds=args.rounds, seed=args.seed)
    stopper = EarlyStopping("val_rmse", mode="min", patience=args.patience, min_delta=args.min_delta,
                            target=args.target)
    trainer = FederatedTrainer(callbacks=[stopper], enable_progress_bar=False)
    history = trainer.fit(task)

    if stopper.stopped_round is not None:
        print(f"stopped after round {stopper.stopped_round} of {args.rounds}: {stopper.reason}")
    summary = task.summary()
    result = {
        "stopped_round": -1 if stopper.stopped_round is None else stopper.stopped_round,
        "rounds_run": len(history),
        "max_rounds": args.rounds,
        "best_val_rmse": summary["best_val_rmse"],
        "final_test_rmse": summary["final_test_rmse"],
    }
    print(" ".join(f"{k}={v:.10g}" for k, v in result.items()))
    return result


if __name__ == "__main__":
    run_script(main)  # a missing dataset or bad value: one error message, exit code 2

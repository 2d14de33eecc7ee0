"""Model selection on validation (issue: "best" figures chosen on the test set): the selected round is the best
validation round of a scripted history, its test metrics are that round's, a run's selected_* keys equal what its
metrics.csv shows, and MovieLens-100K's canonical u1 split has the published counts."""
from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from omegaconf import DictConfig

from fedrec.app.build import build_task
from fedrec.app.cli import run
from fedrec.data.ratings import load_ratings
from fedrec.errors import ConfigError
from fedrec.recsys.selection import ValidationSelection
from fedrec.tasks.recommendation import higher_is_better

QUICK = ("+experiment=fedgnn_synthetic", "quick=false", "task.rounds=6", "data.users=150", "data.items=80",
         "data.ratings=4000", "data.num_clients=15", "task.pseudo_items=10", "plots=false",
         "logger.tensorboard=false")


def history(val: list[float], test: list[float]) -> list[dict[str, float]]:
    return [{"val_rmse": v, "test_rmse": t, "test_f1": 1 - t, "train_loss": 9.0} for v, t in zip(val, test)]


@pytest.mark.parametrize(("val", "want"), [
    ([0.5, 0.4, 0.45, 0.41, 0.6], 1),  # the best validation round, not the best test round
    ([0.5, 0.4, 0.4, 0.3, 0.3], 3),  # a tie keeps the earlier round
    ([math.nan, 0.7, math.nan], 1),  # rounds without a validation value are skipped
])
def test_the_selected_round_is_the_best_validation_round(val: list[float], want: int) -> None:
    test = [0.9, 0.8, 0.3, 0.7, 0.1][:len(val)]
    sel = ValidationSelection("val_rmse", higher_is_better)
    for r, metrics in enumerate(history(val, test)):
        sel.update(r, metrics)
    out = sel.summary()
    assert out["selected_round"] == want and out["selected_on"] == "val_rmse"
    assert out["selected_test_rmse"] == test[want] and out["selected_test_f1"] == 1 - test[want]
    assert out["selected_val_rmse"] == val[want] and "selected_train_loss" not in out
    again = ValidationSelection("val_rmse", higher_is_better)  # a resumed run continues from the state
    again.load_state_dict(sel.state_dict())
    assert again.summary() == out


def test_a_higher_is_better_metric_selects_its_maximum() -> None:
    sel = ValidationSelection("val_ndcg@10", higher_is_better)
    for r, v in enumerate([0.1, 0.3, 0.2]):
        sel.update(r, {"val_ndcg@10": v, "test_ndcg@10": 10 * v})
    assert sel.summary()["selected_round"] == 1 and sel.summary()["selected_test_ndcg@10"] == 3.0


def test_a_runs_selection_is_what_its_metrics_show(compose_cfg: Callable[..., DictConfig], tmp_path: Path) -> None:
    summary = run(compose_cfg(*QUICK, "data.val_fraction=0.2"), output_dir=tmp_path)
    rounds = pd.read_csv(tmp_path / "metrics.csv")
    best = int(np.argmin(rounds["val_rmse"].to_numpy()))
    assert summary["selected_round"] == best
    assert summary["selected_test_rmse"] == pytest.approx(rounds["test_rmse"][best], rel=1e-12)
    assert summary["selected_val_rmse"] == pytest.approx(rounds["val_rmse"][best], rel=1e-12)


def test_without_a_validation_split_nothing_is_selected(compose_cfg: Callable[..., DictConfig]) -> None:
    with pytest.raises(ConfigError, match="task.select_on=val_rmse selects on a validation split"):
        build_task(compose_cfg(*QUICK, "task.select_on=val_rmse"))
    with pytest.raises(ConfigError, match="task.select_on must name a validation metric"):
        build_task(compose_cfg(*QUICK, "data.val_fraction=0.2", "task.select_on=test_rmse"))


def test_the_u1_split_has_the_published_counts(data_dir: Path) -> None:
    data = load_ratings("ml-100k", data_dir, split="u1")
    training = len(data.initial) + len(data.stream) + len(data.val)
    assert (len(data.test), training) == (20_000, 80_000)
    u1 = pd.read_csv(data_dir / "ml-100k" / "u1.test", sep="\t", names=["user", "item", "rating", "ts"])
    got = set(zip(data.user_ids[data.test.user], data.item_ids[data.test.item]))
    assert got == set(zip(u1.user, u1.item))
    assert len(load_ratings("ml-100k", data_dir, split="ua").test) == 9430  # 10 per user
    with pytest.raises(ConfigError, match="test_fraction must be null with split=u1"):
        load_ratings("ml-100k", data_dir, split="u1", test_fraction=0.2)
    with pytest.raises(ConfigError, match="split=u1 is one of MovieLens-100K's own test sets; filmtrust has none"):
        load_ratings("filmtrust", data_dir, split="u1")


def test_without_streaming_every_training_rating_is_there_from_round_0(data_dir: Path) -> None:
    streamed = load_ratings("ml-100k", data_dir, split="u1", val_fraction=0.05)
    whole = load_ratings("ml-100k", data_dir, split="u1", val_fraction=0.05, stream=False)
    assert len(streamed.stream) == 76_000 // 2 and len(whole.stream) == 0
    assert len(whole.initial) == 76_000 and len(whole.training_until(0)) == 76_000
    key = lambda r: set(zip(r.user.tolist(), r.item.tolist()))
    assert key(whole.initial) == key(streamed.initial) | key(streamed.stream)  # the same training ratings
    assert key(whole.val) == key(streamed.val) and key(whole.test) == key(streamed.test)
    with pytest.raises(ConfigError, match="data.stream must be true or false, got 'no'"):
        load_ratings("ml-100k", data_dir, stream="no")

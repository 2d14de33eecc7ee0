"""A run's plots say what it did (fedrec.app.plots): titles carry the overrides, the spread over replicates is a band,
real-data bandit runs plot the normalised reward and rating plots state the RMSE's scale."""
from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure
from omegaconf import DictConfig

from fedrec.app import plots
from fedrec.app.cli import run, run_title
from fedrec.data import load_ratings

QUICK = ("logger.tensorboard=false", "task.steps=200", "task.steps_per_round=100", "++env.max_users=30")


@pytest.fixture
def saved(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Figure]]:
    """Every figure a run saves, by file name, instead of its PNG (kept open for the test to read its axes)."""
    figures: dict[str, Figure] = {}
    monkeypatch.setattr(plots, "save_figure", lambda fig, path: figures.setdefault(Path(path).name, fig))
    yield figures
    plt.close("all")


def band_vertices(fig: Figure) -> set[tuple[float, float]]:
    (band,) = fig.axes[0].collections
    return {(float(x), float(y)) for x, y in band.get_paths()[0].vertices}


def test_band_is_mean_plus_minus_one_std() -> None:
    history = [{"steps": 1, "regret": 1.0, "regret_std": 0.5}, {"steps": 2, "regret": 2.0, "regret_std": 1.0},
               {"steps": 3, "regret": 4.0, "regret_std": 0.25}]
    fig = plots.metric_figure(history, "steps", "step", "regret", "regret")
    assert list(fig.axes[0].lines[0].get_ydata()) == [1.0, 2.0, 4.0]
    assert band_vertices(fig) == {(1, 0.5), (2, 1.0), (3, 3.75), (1, 1.5), (2, 3.0), (3, 4.25)}
    assert fig.axes[0].get_legend().get_texts()[0].get_text() == "mean ± 1 std over replicates"


def test_band_of_trials_is_min_to_max_and_a_single_run_has_none() -> None:
    history = [{"steps": 1, "regret": 1.0, "regret_min": 0.0, "regret_max": 3.0},
               {"steps": 2, "regret": 2.0, "regret_min": 1.5, "regret_max": 2.5}]
    assert band_vertices(plots.metric_figure(history, "steps", "", "regret", "")) == {
        (1, 0.0), (2, 1.5), (1, 3.0), (2, 2.5)}
    for single in ([{"steps": 1, "regret": 1.0}, {"steps": 2, "regret": 2.0}],
                   [{"steps": 1, "regret": 1.0, "regret_min": 1.0, "regret_max": 1.0}]):
        assert len(plots.metric_figure(single, "steps", "", "regret", "").axes[0].collections) == 0


def test_title_keeps_the_overrides_that_change_results_and_is_wrapped() -> None:
    overrides = ["+experiment=async_linucb_lastfm", "hydra.run.dir=/tmp/x", "data_dir=/d", "protocol.gamma_u=2",
                 "ckpt_path=/c.ckpt", "trainer.max_rounds=3", "logger.tensorboard=false", "~policy", "plots=true",
                 "num_threads=2", "download_data=true", "seed=3", "hydra/launcher=basic"]
    assert run_title("lastfm", overrides) == "lastfm\n+experiment=async_linucb_lastfm protocol.gamma_u=2 ~policy seed=3"
    assert run_title("quickstart", ["hydra.run.dir=/tmp/x"]) == "quickstart"

    long = "run\n" + " ".join(f"protocol.option_{i}=value_{i}" for i in range(12))
    lines = plots.metric_figure([{"t": 0, "y": 1.0}], "t", "", "y", "", long).axes[0].get_title().split("\n")
    assert len(lines) > 3 and max(map(len, lines)) <= plots.TITLE_WIDTH
    assert " ".join(lines) == long.replace("\n", " ")


def test_replicated_real_data_run_plots_normalised_reward_with_bands(
    compose_cfg: Callable[..., DictConfig], data_dir: Path, tmp_path: Path, saved: dict[str, Figure]
) -> None:
    cfg = compose_cfg("+experiment=async_linucb_lastfm", f"data_dir={data_dir}", "replicates=3", *QUICK)
    summary = run(cfg, output_dir=tmp_path)

    assert {"regret.png", "regret_vs_comm.png", "normalized_reward.png"} <= set(saved)
    ax = saved["normalized_reward.png"].axes[0]
    assert ax.get_title() == "async_linucb_lastfm"  # run() without Hydra's command line: the name alone
    assert list(ax.lines[0].get_ydata())[-1] == summary["normalized_reward"]
    with open(tmp_path / "metrics.csv", newline="") as f:
        last = list(csv.DictReader(f))[-1]
    for metric in ("cumulative_regret", "normalized_reward"):  # the round's spread is the summary's at the end
        assert float(last[f"{metric}_std"]) == summary[f"{metric}_std"] > 0
    assert len(saved["normalized_reward.png"].axes[0].collections) == 1  # the band


def test_single_replicate_logs_no_spread(compose_cfg: Callable[..., DictConfig], data_dir: Path,
                                         tmp_path: Path, saved: dict[str, Figure]) -> None:
    run(compose_cfg("+experiment=async_linucb_lastfm", f"data_dir={data_dir}", "replicates=1", *QUICK), tmp_path)
    with open(tmp_path / "metrics.csv", newline="") as f:
        assert not [c for c in csv.DictReader(f).fieldnames or [] if c.endswith("_std")]
    assert len(saved["regret.png"].axes[0].collections) == 0


def test_rmse_plots_state_the_rating_scale(compose_cfg: Callable[..., DictConfig], data_dir: Path, tmp_path: Path,
                                           saved: dict[str, Figure]) -> None:
    cfg = compose_cfg("+experiment=fedgnn_ml100k_dp", f"data_dir={data_dir}", "task.rounds=2",
                      "logger.tensorboard=false")
    run(cfg, output_dir=tmp_path)
    assert json.loads((tmp_path / "summary.json").read_text())["rating_scale"] == "ratings 1–5 as r / 5"
    for name in ("test_rmse.png", "rmse_vs_epsilon.png"):
        assert saved[name].axes[0].get_ylabel() == "test RMSE (ratings 1–5 as r / 5)"
    assert saved["test_f1.png"].axes[0].get_ylabel() == "test F1 (threshold 0.5)"


@pytest.mark.filterwarnings("ignore:.*duplicated:UserWarning")  # FilmTrust's three repeated lines
@pytest.mark.parametrize(("name", "normalize", "scale"), [
    ("filmtrust", "max", "ratings 0.5–4 as r / 4"),
    ("ml-100k", "minmax", "ratings 1–5 as (r − 1) / 4"),
])
def test_rating_scale_names_the_normalisation(data_dir: Path, name: str, normalize: str, scale: str) -> None:
    assert load_ratings(name, data_dir, normalize=normalize).scale == scale


def test_title_of_a_train_py_run_carries_its_overrides(
    train_py: Callable[..., Any], tmp_path: Path, saved: dict[str, Figure]
) -> None:
    train_py(f"hydra.run.dir={tmp_path}", "task.steps=200", "protocol.gamma_u=3", "logger.tensorboard=false")
    assert saved["regret.png"].axes[0].get_title() == "quickstart\ntask.steps=200 protocol.gamma_u=3"

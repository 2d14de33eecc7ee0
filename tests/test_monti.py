"""The Monti et al. matrices (Douban, Flixster, YahooMusic): the published sizes and rating scales, the side graphs,
the fixed test split read independently from the files with h5py, the training split rules, the original-scale
RMSE, one-line errors for missing, damaged and malformed files, and the experiments end to end."""
from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from fedrec.app.cli import run
from fedrec.data import RatingData, load_ratings
from fedrec.data.download import REGISTRY, ensure_dataset
from fedrec.data.monti import MONTI_FILE, read_monti
from fedrec.errors import ConfigError, DatasetNotFoundError
from fedrec.metrics import metrics_from_sums, rating_sums
from tests.helpers import read_csv

#: GC-MC (Berg et al. 2017) Table 1: users, items, ratings; the test sizes are sRMGCNN's split (the files' Otest)
PUBLISHED = {
    "douban": (3000, 3000, 136_891, 13_689),
    "flixster": (3000, 3000, 26_173, 2_617),
    "yahoo_music": (3000, 3000, 5_335, 533),
}
#: the rating levels GC-MC Table 1 gives
LEVELS = {
    "douban": np.arange(1.0, 6.0),
    "flixster": np.arange(1, 11) / 2,
    "yahoo_music": np.arange(1.0, 101.0),
}
#: which side graphs each file holds (GC-MC Table 1, "features": users, users and items, items)
GRAPHS = {"douban": (True, False), "flixster": (True, True), "yahoo_music": (False, True)}


@pytest.fixture(scope="module", params=sorted(PUBLISHED))
def monti(request: pytest.FixtureRequest, data_dir: Path) -> RatingData:
    return load_ratings(request.param, data_dir, seed=0, rounds=10)


def file_entries(path: Path, mask: str) -> set[tuple[int, int, float]]:
    """(user, item, raw rating) of the entries ``mask`` marks, read with h5py alone: MATLAB stores M (users × items)
    by column, so HDF5's array is its transpose."""
    with h5py.File(path, "r") as f:
        ratings, marked = f["M"][()].T, f[mask][()].T
    user, item = np.nonzero(marked)
    return set(zip(user.tolist(), item.tolist(), ratings[user, item].tolist()))


def entries(data: RatingData, *parts: str) -> set[tuple[int, int, float]]:
    """(user, item, raw rating) of ``data``'s splits ``parts``, the ratings denormalised and rounded to the scale."""
    out: set[tuple[int, int, float]] = set()
    for part in parts:
        r = getattr(data, part)
        raw = np.round(data.denormalize(r.rating) * 2) / 2  # every scale here is on a grid of halves
        out |= set(zip(r.user.tolist(), r.item.tolist(), raw.tolist()))
    return out


def test_published_sizes_and_rating_scale(monti: RatingData) -> None:
    users, items, ratings, test = PUBLISHED[monti.name]
    assert (monti.num_users, monti.num_items, monti.num_ratings, len(monti.test)) == (users, items, ratings, test)
    assert monti.num_clients == users
    raw = monti.denormalize(np.concatenate([monti.test.rating, monti.training.rating]))
    levels = LEVELS[monti.name]
    assert np.isin(np.round(raw * 2) / 2, levels).all()
    assert np.abs(raw - np.round(raw * 2) / 2).max() < 1e-4  # float32 storage of r / r_max
    assert monti.rating_range == (levels[0], levels[-1])
    assert monti.rating_unit == levels[-1]  # normalize=max: r / r_max


def test_side_graphs(monti: RatingData) -> None:
    has_users, has_items = GRAPHS[monti.name]
    for graph, present, n in ((monti.user_graph, has_users, monti.num_users),
                              (monti.item_graph, has_items, monti.num_items)):
        assert (graph is not None) == present
        if present:
            assert graph.shape == (n, n) and graph.nnz > 0
            assert set(np.unique(graph.data)) == {1.0}
            assert (graph != graph.T).nnz == 0


def test_fixed_test_split_is_the_files_otest(monti: RatingData, data_dir: Path) -> None:
    path = data_dir / REGISTRY[monti.name].folder / MONTI_FILE
    assert entries(monti, "test") == file_entries(path, "Otest")
    assert entries(monti, "val", "initial", "stream") == file_entries(path, "Otraining")


def test_training_ratings_follow_the_val_initial_stream_rules(data_dir: Path) -> None:
    a = load_ratings("flixster", data_dir, seed=0, rounds=10, val_fraction=0.1)
    b = load_ratings("flixster", data_dir, seed=1, rounds=10, val_fraction=0.1)
    n_train = 26_173 - 2_617
    assert len(a.val) == round(n_train * 0.1) == 2356
    assert (len(a.initial), len(a.stream)) == (10_600, 10_600)  # ceil and floor of the rest's half
    assert a.stream_round.max() == 9 and (np.diff(a.stream_round) >= 0).all()
    for part in ("user", "item", "rating"):  # the test split is the file's whatever the seed
        assert np.array_equal(getattr(a.test, part), getattr(b.test, part))
    assert not np.array_equal(a.val.user, b.val.user)  # the training split is the seed's


def test_minmax_normalisation_and_the_original_scale_rmse(data_dir: Path) -> None:
    data = load_ratings("yahoo_music", data_dir, rounds=5, normalize="minmax")
    assert data.rating_range == (1.0, 100.0) and data.rating_unit == 99.0
    target = torch.from_numpy(data.test.rating)
    pred = torch.rand(len(target), generator=torch.Generator().manual_seed(0))
    raw_rmse = np.sqrt(np.mean((data.denormalize(pred.numpy()) - data.denormalize(target.numpy())) ** 2))
    metrics = metrics_from_sums(rating_sums(pred, target), data.rating_unit)
    assert metrics["rmse_raw"] == pytest.approx(raw_rmse, rel=1e-6)
    assert "rmse_raw" not in metrics_from_sums(rating_sums(pred, target))


def test_a_test_fraction_is_refused(data_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"^test_fraction must be null for douban: its test set is the file's"):
        load_ratings("douban", data_dir, test_fraction=0.2)


# ------------------------------------------------------------------------------------------------ small files
def write_mat(folder: Path, name: str, **matrices: np.ndarray) -> Path:
    """A MATLAB v7.3-like file of ``matrices`` (given users × items, stored transposed as MATLAB does)."""
    path = folder / name / MONTI_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        for key, a in matrices.items():
            f.create_dataset(key, data=np.asarray(a, dtype=np.float64).T)
    return path


def small_douban() -> dict[str, np.ndarray]:
    """4 users × 3 items: user 0 rated item 2 with 5 (test) and item 0 with 1, user 3 rated item 1 with 4 (test) and
    item 2 with 2; users 1 and 2 are friends."""
    m = np.zeros((4, 3))
    m[0, 2], m[0, 0], m[3, 1], m[3, 2] = 5, 1, 4, 2
    test = np.zeros((4, 3))
    test[0, 2] = test[3, 1] = 1
    social = np.zeros((4, 4))
    social[1, 2] = social[2, 1] = 1
    return {"M": m, "Otraining": (m != 0) & (test == 0), "Otest": test, "W_users": social}


def test_a_small_file_is_read_users_by_items(tmp_path: Path) -> None:
    write_mat(tmp_path, "douban", **small_douban())
    data = load_ratings("douban", tmp_path, rounds=2)
    assert (data.num_users, data.num_items) == (4, 3)
    assert entries(data, "test") == {(0, 2, 5.0), (3, 1, 4.0)}
    assert entries(data, "initial", "stream") == {(0, 0, 1.0), (3, 2, 2.0)}
    assert data.user_graph.toarray().tolist() == small_douban()["W_users"].tolist()


def one_line(excinfo: pytest.ExceptionInfo[BaseException]) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"M": "drop"}, r"no matrix M \(it holds Otest, Otraining, W_users\); expected M, Otraining, Otest, W_users"),
        ({"W_users": "drop"}, r"no matrix W_users"),
        ({"W_users": np.zeros((3, 3))}, r"W_users is 3 × 3; it must be 4 × 4 \(the users of M\)"),
        ({"Otest": np.zeros((4, 4))}, r"Otest is 4 × 4, M is 4 × 3; they must agree"),
        ({"Otest": np.full((4, 3), 0.5)}, r"Otest must hold only 0 and 1"),
        ({"Otraining": np.ones((4, 3))}, r"Otraining and Otest share 2 entries"),
        ({"Otest": np.zeros((4, 3))}, r"together mark exactly the nonzero entries of M \(4 ratings, 2 masked"),
        ({"M": "seven"}, r"M\(1, 3\) must be an integer from 1 to 5 \(Douban's scale\), got 7 \(1 such rating"),
    ],
)
def test_a_malformed_file_is_one_line_naming_it(tmp_path: Path, change: dict[str, object], expected: str) -> None:
    matrices = small_douban()
    for key, value in change.items():
        if isinstance(value, str) and value == "drop":
            del matrices[key]
        elif isinstance(value, str):  # "seven": an off-scale rating at MATLAB's M(1, 3)
            matrices[key][0, 2] = 7
        else:
            matrices[key] = value
    path = write_mat(tmp_path, "douban", **matrices)
    with pytest.raises(ConfigError) as excinfo:
        load_ratings("douban", tmp_path)
    assert one_line(excinfo).startswith(f"{path}: ")
    assert excinfo.match(expected)


@pytest.mark.parametrize("damage", ["truncated", "text"])
def test_a_truncated_or_foreign_file_is_one_line_naming_it(tmp_path: Path, data_dir: Path, damage: str) -> None:
    path = tmp_path / "flixster" / MONTI_FILE
    path.parent.mkdir()
    if damage == "truncated":
        path.write_bytes((data_dir / "flixster" / MONTI_FILE).read_bytes()[:1_000_000])
    else:
        path.write_text("user item rating\n1 1 4\n")
    with pytest.raises(ConfigError) as excinfo:
        read_monti("flixster", tmp_path)
    assert one_line(excinfo).startswith(f"{path}: cannot be read as a MATLAB v7.3 (HDF5) file (")
    assert excinfo.match(r"damaged or truncated: install the dataset again$")


def test_a_file_that_differs_from_its_listed_checksum_is_refused(tmp_path: Path, data_dir: Path) -> None:
    shutil.copy(data_dir / "SHA256SUMS", tmp_path / "SHA256SUMS")
    path = tmp_path / "yahoo_music" / MONTI_FILE
    path.parent.mkdir()
    path.write_bytes((data_dir / "yahoo_music" / MONTI_FILE).read_bytes()[:-1] + b"\0")
    with pytest.raises(ConfigError) as excinfo:
        load_ratings("yahoo_music", tmp_path)
    assert one_line(excinfo).startswith(f"{path}: its SHA-256 ")


def test_a_missing_file_names_it_and_how_to_install_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as excinfo:
        load_ratings("yahoo_music", tmp_path)
    path = tmp_path / "yahoo_music" / MONTI_FILE
    assert str(excinfo.value).startswith(f"dataset file not found: {path}\n")
    assert REGISTRY["yahoo_music"].page in str(excinfo.value)
    for download in (False, True):  # what a run gets: there is no archive to download
        with pytest.raises(DatasetNotFoundError) as excinfo:
            ensure_dataset("yahoo_music", tmp_path, download=download)
        message = one_line(excinfo)
        assert message.startswith(f"dataset yahoo_music is not installed: {path} is missing. yahoo_music has no "
                                  f"archive to download: save {MONTI_FILE} from {REGISTRY['yahoo_music'].page} ")
        assert REGISTRY["yahoo_music"].sha256 in message


# ------------------------------------------------------------------------------------------------ experiments
def test_an_experiment_reports_the_original_scale_rmse(compose_cfg, data_dir: Path, tmp_path: Path) -> None:
    cfg = compose_cfg("+experiment=fedgnn_yahoo_music", f"data_dir={data_dir}", "task.rounds=2", "plots=false",
                      "logger.tensorboard=false")
    summary = run(cfg, output_dir=tmp_path / "run")
    assert summary["dataset"] == "yahoo_music" and summary["rating_scale"] == "ratings 1–100 as r / 100"
    assert summary["final_test_rmse_raw"] == pytest.approx(100 * summary["final_test_rmse"], rel=1e-12)
    rows = read_csv(tmp_path / "run" / "metrics.csv")
    assert [float(r["test_rmse_raw"]) for r in rows] == pytest.approx([100 * float(r["test_rmse"]) for r in rows])
    assert min(float(r["test_rmse_raw"]) for r in rows) == summary["best_test_rmse_raw"]

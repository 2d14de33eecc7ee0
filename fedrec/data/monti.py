"""The rating matrices of Monti et al. (NIPS 2017, sRMGCNN): Douban, Flixster and YahooMusic, with their fixed
train/test split and side graphs, as GC-MC (Berg et al. 2017), IGMC and FedGNN (Wu et al. 2021) use them.

Each dataset is one file, ``<data_dir>/<name>/training_test_dataset.mat`` (MATLAB v7.3, i.e. HDF5; installed by
hand, see :data:`fedrec.data.download.REGISTRY`). Its variables, as MATLAB sees them (h5py reads every matrix
transposed, MATLAB storing by column):

* ``M``: users × items ratings, 0 where unrated; ``Otraining`` and ``Otest``: 0/1 masks of the same shape that
  partition the rated entries into the fixed training and test sets.
* The side graphs, 0/1 symmetric adjacency matrices: ``W_users`` (users × users: Douban's social network,
  Flixster's), ``W_movies`` (Flixster's item graph) and ``W_tracks`` (YahooMusic's item graph).

Sizes (users, items and ratings as GC-MC's Table 1; the test sizes are the files' ``Otest``):

* ``douban``: 3,000 users × 3,000 items, 136,891 ratings of which 13,689 test, ratings 1, 2, ..., 5, user graph.
* ``flixster``: 3,000 × 3,000, 26,173 ratings, 2,617 test, ratings 0.5, 1, ..., 5, user and item graphs.
* ``yahoo_music``: 3,000 × 3,000, 5,335 ratings, 533 test, ratings 1, 2, ..., 100, item graph.

Users and items keep the matrix's indices ``0..2999`` (MATLAB's ``1..3000``), so that they index the graphs; users
and items without a rating stay in (Flixster has 2,341 users with a rating, YahooMusic 1,357 users and 1,363 items).

Validation (:func:`read_monti`): the file must open as HDF5 and hold ``M``, ``Otraining``, ``Otest`` and the
dataset's graphs, all of one users × items shape (graphs square on their side); the masks must be 0/1, disjoint,
and together mark exactly the nonzero ratings; every rating must lie on the dataset's scale. Anything else is a
one-line :class:`~fedrec.errors.ConfigError` naming the file; a missing file is a DatasetNotFoundError saying how
to install it.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from fedrec.data.download import dataset_file
from fedrec.data.scales import RatingScale
from fedrec.errors import ConfigError, check_choice

#: The Monti et al. datasets :func:`fedrec.data.load_ratings` reads with their fixed test split.
MONTI_DATASETS = ("douban", "flixster", "yahoo_music")
#: The file of each dataset in its folder (the name IGMC's and GC-MC's loaders read).
MONTI_FILE = "training_test_dataset.mat"


@dataclass(frozen=True)
class _Layout:
    """What one dataset's file holds: its rating scale and the variable of each side graph (None: no graph)."""

    scale: RatingScale
    user_graph: str | None
    item_graph: str | None


_LAYOUTS = {
    "douban": _Layout(RatingScale(1.0, 5.0, 1.0, "an integer from 1 to 5 (Douban's scale)"), "W_users", None),
    "flixster": _Layout(
        RatingScale(0.5, 5.0, 0.5, "one of 0.5, 1, 1.5, ..., 5 (Flixster's scale, steps of 0.5)"), "W_users", "W_movies"
    ),
    "yahoo_music": _Layout(RatingScale(1.0, 100.0, 1.0, "an integer from 1 to 100 (YahooMusic's scale)"), None,
                           "W_tracks"),
}


@dataclass(frozen=True, eq=False)
class MontiMatrix:
    """One Monti et al. dataset as its file holds it: every rating (raw scale, in (user, item) order), whether it is
    in the fixed test set, and the side graphs (scipy CSR adjacency matrices, None where the file has none)."""

    name: str
    path: Path
    num_users: int
    num_items: int
    user: np.ndarray  # (N,) int64 row of M (0-based)
    item: np.ndarray  # (N,) int64 column of M (0-based)
    rating: np.ndarray  # (N,) float64 raw rating
    test: np.ndarray  # (N,) bool: in Otest (else in Otraining)
    user_graph: sp.csr_matrix | None  # (num_users, num_users)
    item_graph: sp.csr_matrix | None  # (num_items, num_items)

    @property
    def rating_range(self) -> tuple[float, float]:
        """The smallest and largest rating in the file (which fix the normalisation, as for the other datasets)."""
        return float(self.rating.min()), float(self.rating.max())


def read_monti(name: str, data_dir: str | Path) -> MontiMatrix:
    """Dataset ``name`` (one of :data:`MONTI_DATASETS`) read from ``<data_dir>/<name>/training_test_dataset.mat``
    and validated (module docstring)."""
    layout = _LAYOUTS[check_choice("name", name, MONTI_DATASETS)]
    path = dataset_file(name, data_dir, MONTI_FILE)
    variables = ["M", "Otraining", "Otest", *(g for g in (layout.user_graph, layout.item_graph) if g)]
    arrays = _read_variables(path, variables)
    ratings, train, test = arrays["M"], arrays["Otraining"], arrays["Otest"]
    for key in ("Otraining", "Otest"):
        if arrays[key].shape != ratings.shape:
            raise ConfigError(f"{path}: {key} is {_shape(arrays[key])}, M is {_shape(ratings)}; they must agree")
        if not np.isin(arrays[key], (0.0, 1.0)).all():
            raise ConfigError(f"{path}: {key} must hold only 0 and 1 (a mask of M)")
    train, test = train.astype(bool), test.astype(bool)
    if (train & test).any():
        raise ConfigError(f"{path}: Otraining and Otest share {int((train & test).sum())} entries; they must be "
                          "disjoint")
    rated = ratings != 0
    if (rated != (train | test)).any():
        raise ConfigError(f"{path}: Otraining and Otest must together mark exactly the nonzero entries of M "
                          f"({int(rated.sum())} ratings, {int((train | test).sum())} masked entries)")
    user, item = np.nonzero(rated)
    rating = ratings[user, item]
    off = layout.scale.off_scale(rating)
    if off.any():
        k = int(np.argmax(off))
        raise ConfigError(f"{path}: M({user[k] + 1}, {item[k] + 1}) must be {layout.scale.text}, got "
                          f"{rating[k]:g} ({int(off.sum())} such rating(s) in the file)")
    num_users, num_items = ratings.shape
    return MontiMatrix(
        name=name,
        path=path,
        num_users=num_users,
        num_items=num_items,
        user=user.astype(np.int64),
        item=item.astype(np.int64),
        rating=rating.astype(np.float64),
        test=test[user, item],
        user_graph=_graph(arrays, layout.user_graph, num_users, "users", path),
        item_graph=_graph(arrays, layout.item_graph, num_items, "items", path),
    )


def _read_variables(path: Path, variables: list[str]) -> dict[str, np.ndarray]:
    """The 2-D matrices ``variables`` of the MATLAB v7.3 file ``path``, in MATLAB's orientation (transposed from
    HDF5's), or a one-line ConfigError if the file cannot be read or lacks one."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            held = sorted(f)
            arrays = {v: np.asarray(f[v][()], dtype=np.float64)
                      for v in variables if isinstance(f.get(v), h5py.Dataset)}
    except (OSError, ValueError, TypeError) as e:  # not HDF5, truncated, or a variable that is not numeric
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"{path}: cannot be read as a MATLAB v7.3 (HDF5) file ({reason}); it is damaged or "
                          "truncated: install the dataset again") from None
    absent = [v for v in variables if v not in arrays]
    if absent:
        raise ConfigError(f"{path}: no matrix {absent[0]} (it holds {', '.join(held) or 'nothing'}); expected "
                          f"{', '.join(variables)}")
    for v, a in arrays.items():
        if a.ndim != 2:
            raise ConfigError(f"{path}: {v} must be a matrix, it has shape {a.shape}")
    return {v: a.T for v, a in arrays.items()}


def _graph(arrays: dict[str, np.ndarray], key: str | None, n: int, side: str, path: Path) -> sp.csr_matrix | None:
    """The side graph ``key`` as a CSR matrix, checked to be n × n (``n`` the ``side`` of M); None without one."""
    if key is None:
        return None
    graph = arrays[key]
    if graph.shape != (n, n):
        raise ConfigError(f"{path}: {key} is {_shape(graph)}; it must be {n} × {n} (the {side} of M)")
    return sp.csr_matrix(graph)


def _shape(a: np.ndarray) -> str:
    return " × ".join(map(str, a.shape))

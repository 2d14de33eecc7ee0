"""The downloadable dataset a run reads, and building a task that fetches it first when asked to
(``download_data=true``)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from fedrec.app.build.builders import build_task
from fedrec.app.build.groups import group_class
from fedrec.errors import DatasetNotFoundError


@dataclass(frozen=True)
class RunDataset:
    """The downloadable dataset a run reads (:data:`fedrec.data.download.REGISTRY`)."""

    group: str  #: the config group that reads it (``data`` or ``env``)
    name: str
    data_dir: Path


def run_dataset(cfg: DictConfig) -> RunDataset | None:
    """The downloadable dataset the run reads: its ``data`` group's, or what its environment's class declares
    (``dataset``); None for runs on generated data."""
    from fedrec.data.download import REGISTRY

    key = "data" if cfg.get("data") is not None else "env"
    node = cfg.get(key)
    if node is None:
        return None
    name = node.get("name") if key == "data" else getattr(group_class(node, "env"), "dataset", None)
    if name not in REGISTRY or node.get("data_dir") is None:
        return None
    return RunDataset(key, str(name), Path(str(node.data_dir)))


def build_task_fetching_data(cfg: DictConfig) -> Any:
    """:func:`build_task`; if the dataset it reads is missing, download it first with ``download_data=true`` (a
    message and a progress bar on stderr), else raise a DatasetNotFoundError naming the flag and the download
    command. A failed download is a DatasetNotFoundError too (the run cannot get its data), naming the group."""
    try:
        return build_task(cfg)
    except DatasetNotFoundError:
        from fedrec.data.download import DownloadError, ensure_dataset, missing_files

        dataset = run_dataset(cfg)
        if dataset is None or not missing_files(dataset.name, dataset.data_dir):  # another file: the loader's text
            raise
        try:
            ensure_dataset(dataset.name, dataset.data_dir, download=cfg.get("download_data", False))
        except (DatasetNotFoundError, DownloadError) as e:
            raise DatasetNotFoundError(f"{dataset.group}: {e}") from e
    return build_task(cfg)


__all__ = ["RunDataset", "build_task_fetching_data", "run_dataset"]

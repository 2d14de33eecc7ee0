"""Shared fixtures: the data directory, deterministic single-threaded torch, configs composed from ``conf/`` and
``train.py`` run in-process; :func:`hydra_state_restored` for the tests that run a Hydra app in-process themselves
(``from conftest import hydra_state_restored``)."""
from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hypothesis import settings
from omegaconf import DictConfig

torch.set_num_threads(1)
# no wall-clock limits: an example's first call may compile a numba kernel, and CI machines are loaded
settings.register_profile("fedrec", deadline=None)
settings.load_profile("fedrec")

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
DATA_DIR = Path(os.environ.get("FEDREC_DATA_DIR", ROOT / "data"))


@contextmanager
def hydra_state_restored() -> Iterator[None]:
    """What runs inside leaves no Hydra state behind (the run's config, the initialised Hydra), so that a later
    test can compose or run again, and no logging set-up: the handlers Hydra's job logging installed on the root
    logger are closed and the root's handlers and level put back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        HydraConfig.instance().cfg = None
        GlobalHydra.instance().clear()
        for h in root.handlers:
            if h not in handlers:
                h.close()
        root.handlers[:] = handlers
        root.setLevel(level)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA_DIR.is_dir():
        pytest.fail(f"datasets not found at {DATA_DIR}: set FEDREC_DATA_DIR")
    return DATA_DIR


@pytest.fixture(scope="session")
def compose_cfg() -> Callable[..., DictConfig]:
    """``compose_cfg(*overrides, **kw)``: the config ``train.py *overrides`` runs, composed from ``conf/`` (``kw`` go to
    Hydra's ``compose``). Hydra is initialised only while composing, so a test may also run ``train.py`` itself."""
    def compose_cfg(*overrides: str, **kw: Any) -> DictConfig:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            return compose("config", overrides=list(overrides), **kw)

    return compose_cfg


@pytest.fixture
def float64() -> Iterator[None]:
    """Models built inside default to float64, where a computation summed in another order or shape differs only in
    the last places (2.2e-16 on AMD EPYC's AVX-512 kernels); float32 differs by more, by how much depends on the
    CPU's kernels."""
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(dtype)


@pytest.fixture(scope="module")
def train_script() -> Any:
    spec = importlib.util.spec_from_file_location("fedrec_train_script", ROOT / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def train_py(train_script: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """``train_py(*args)`` runs ``python train.py *args`` in this process: Hydra parses ``sys.argv``."""
    # hydra.main finds conf/ next to the script when the task function's module is __main__
    monkeypatch.setenv("HYDRA_MAIN_MODULE", "__main__")

    def call(*args: str) -> Any:
        monkeypatch.setattr(sys, "argv", [str(ROOT / "train.py"), *args])
        return train_script.main()

    with hydra_state_restored():  # for the compose-based tests
        yield call

"""Shared fixtures: the data directory and deterministic single-threaded torch."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

DATA_DIR = Path(os.environ.get("FEDREC_DATA_DIR", Path(__file__).resolve().parents[2] / "shared" / "data"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA_DIR.is_dir():
        pytest.fail(f"datasets not found at {DATA_DIR}: set FEDREC_DATA_DIR")
    return DATA_DIR

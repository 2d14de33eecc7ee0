"""Checkpoint files: written atomically, loaded with a clear error when missing or corrupt."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fedrec.errors import ConfigError
from fedrec.io import atomic_torch_save

CHECKPOINT_VERSION = 1


def save_checkpoint(path: str | Path, checkpoint: dict[str, Any]) -> Path:
    """Write ``checkpoint`` to ``path`` so that a crash never leaves a partial file behind."""
    return atomic_torch_save(path, {"version": CHECKPOINT_VERSION, **checkpoint})


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"ckpt_path: no checkpoint file at {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise ConfigError(f"ckpt_path: {path} is not a readable fedrec checkpoint ({e})") from e
    if not isinstance(ckpt, dict) or ckpt.get("version") != CHECKPOINT_VERSION:
        raise ConfigError(f"ckpt_path: {path} is not a fedrec checkpoint of version {CHECKPOINT_VERSION}")
    return ckpt

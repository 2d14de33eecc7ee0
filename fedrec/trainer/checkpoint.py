"""Checkpoint files: written atomically with the identity of their run and a digest of their content; loaded
weights-only, refused with a clear error when missing, corrupt or of another run."""
from __future__ import annotations

import contextlib
import hashlib
import json
import re
import struct
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedrec.errors import ConfigError
from fedrec.utils.io import atomic_torch_save, remove_stale_temporaries

#: 2: run identity and content digest, loaded with ``weights_only=True``
CHECKPOINT_VERSION = 2
#: differing fields an error lists before "and N more"
LISTED_DIFFERENCES = 8
#: what a resume can never change: the seed, and the digests of the dataset files the run read (``data_files``)
IDENTITY = ("seed", "data_files")
_ABSENT = object()


# ------------------------------------------------------------------------------------------------ files
def save_checkpoint(path: str | Path, checkpoint: dict[str, Any]) -> Path:
    """Write ``checkpoint`` and a digest of its content to ``path`` so that a crash never leaves a partial file."""
    state = to_plain({"version": CHECKPOINT_VERSION, **checkpoint})
    return atomic_torch_save(path, {**state, "digest": content_digest(state)})


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (weights-only) and verify its digest."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"ckpt_path: no checkpoint file at {path}")
    with contextlib.suppress(OSError):  # best effort: the folder may be read-only
        remove_stale_temporaries(path)
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        reason = re.sub(r"\s+", " ", re.sub(r"\x1b\[[0-9;]*m", "", str(e))).strip()[:200]
        raise ConfigError(f"ckpt_path: {path} is not a readable fedrec checkpoint ({reason})") from e
    if not isinstance(ckpt, dict) or ckpt.get("version") != CHECKPOINT_VERSION:
        found = ckpt.get("version") if isinstance(ckpt, dict) else None
        raise ConfigError(f"ckpt_path: {path} is not a fedrec checkpoint of version {CHECKPOINT_VERSION} (found "
                          f"version {found!r}; a checkpoint of an older fedrec cannot be resumed by this one)")
    digest = ckpt.pop("digest", None)
    if digest != content_digest(ckpt):
        raise ConfigError(f"ckpt_path: {path} is corrupt: its content does not match the digest written with it")
    return ckpt


# ------------------------------------------------------------------------------------------------ content
def to_plain(obj: Any) -> Any:
    """``obj`` with numpy scalars as Python numbers: ``torch.load(weights_only=True)`` reads no numpy types."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Mapping):
        return {k: to_plain(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(to_plain(v) for v in obj)
    return obj


def content_digest(obj: Any) -> str:
    """SHA-256 of a checkpoint's content (structure, numbers and tensor bytes), the same before saving and after
    loading, so that any change to what a resume would use is detected."""
    h = hashlib.sha256()
    _feed(h, obj, "checkpoint")
    return h.hexdigest()


def _feed(h: Any, obj: Any, where: str) -> None:
    """Add one value to the digest, tagged with its type and length so that no two contents encode alike."""
    if obj is None or isinstance(obj, bool):
        h.update(b"N" if obj is None else b"T" if obj else b"F")
    elif isinstance(obj, int):
        _chunk(h, b"i", str(obj).encode())
    elif isinstance(obj, float):
        h.update(b"f" + struct.pack("<d", obj))
    elif isinstance(obj, str):
        _chunk(h, b"s", obj.encode("utf-8", "surrogatepass"))
    elif isinstance(obj, Mapping):
        h.update(b"d" + struct.pack("<Q", len(obj)))
        for k, v in obj.items():
            _feed(h, k, where)
            _feed(h, v, f"{where}.{k}")
    elif isinstance(obj, (list, tuple)):
        h.update((b"l" if isinstance(obj, list) else b"t") + struct.pack("<Q", len(obj)))
        for i, v in enumerate(obj):
            _feed(h, v, f"{where}[{i}]")
    elif isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous().reshape(-1)
        _chunk(h, b"x", f"{t.dtype}{tuple(obj.shape)}".encode())
        _chunk(h, b"", t.view(torch.uint8).numpy().data if t.numel() else b"")
    else:
        raise TypeError(f"{where} is a {type(obj).__module__}.{type(obj).__qualname__}, which a weights-only "
                        "checkpoint cannot hold (use tensors, numbers, strings, lists and dicts)")


def _chunk(h: Any, tag: bytes, data: Any) -> None:
    """Add a tagged, length-prefixed byte string to the digest."""
    h.update(tag + struct.pack("<Q", len(data)))
    h.update(data)


# ------------------------------------------------------------------------------------------------ identity
def fedrec_version() -> str:
    """The installed fedrec's version (``unknown`` when it runs from a source tree that is not installed)."""
    try:
        return metadata.version("fedrec")
    except metadata.PackageNotFoundError:
        return "unknown"


def task_sizes(task: Any) -> dict[str, dict[str, int]]:
    """The integer ``num_*`` and ``dim`` attributes of the task's parts (dataset, environment, protocol, model):
    sizes a checkpoint's state only fits if they match."""
    sizes: dict[str, dict[str, int]] = {}
    for part, obj in vars(task).items():
        if part.startswith("_") or not hasattr(obj, "__dict__"):
            continue
        found = {k: v for k, v in vars(obj).items() if (k.startswith("num_") or k == "dim") and type(v) is int}
        if found:
            sizes[part] = found
    return sizes


def config_hash(config: Mapping[str, Any]) -> str:
    """SHA-256 of a JSON config (keys sorted): equal for configs that give the same results."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=repr).encode()).hexdigest()


def run_identity(config: Mapping[str, Any] | None, task: Any) -> dict[str, Any]:
    """What a checkpoint records of its run: the task's class, the config that changes results (``None`` when the
    trainer was given none) and its hash, the sizes of the task's parts and the fedrec version."""
    return {
        "task_class": f"{type(task).__module__}.{type(task).__qualname__}",
        "config": None if config is None else dict(config),
        "config_hash": None if config is None else config_hash(config),
        "sizes": task_sizes(task),
        "fedrec_version": fedrec_version(),
    }


def identity_differences(saved: Mapping[str, Any], current: Mapping[str, Any],
                         allowed: Sequence[str] = ()) -> list[str]:
    """The fields in which a checkpoint's run identity and this run's differ, as ``name (value in the checkpoint,
    value here)``, without the ``allowed`` names (a name allows the fields under it too). The configs are compared
    only when both runs have one."""
    found = _differences(saved.get("task_class"), current["task_class"], "task_class")
    configs = saved.get("config"), current["config"]
    if None not in configs and saved.get("config_hash") != current["config_hash"]:
        found += _differences(*configs, "")
    found += _differences(saved.get("sizes"), current["sizes"], "sizes")
    found += _differences(saved.get("fedrec_version"), current["fedrec_version"], "fedrec_version")
    return _described([d for d in found if not any(d[0] == a or d[0].startswith(f"{a}.") for a in allowed)],
                      "the checkpoint")


def config_differences(old: Mapping[str, Any], new: Mapping[str, Any], where: str) -> list[str]:
    """The fields in which config ``old`` (the one ``where`` holds) and ``new`` differ, as ``name (value in
    WHERE, value here)``."""
    return _described(_differences(old, new, ""), where)


def _described(found: list[tuple[str, Any, Any]], where: str) -> list[str]:
    """``(name, old, new)`` differences as ``name (old in WHERE, new here)``."""
    return [f"{name} ({_show(old)} in {where}, {_show(new)} here)" for name, old, new in found]


def listed(differences: Sequence[str]) -> str:
    """Differences as an error lists them: the first :data:`LISTED_DIFFERENCES`, then how many more."""
    more = len(differences) - LISTED_DIFFERENCES
    return "; ".join(differences[:LISTED_DIFFERENCES]) + (f"; and {more} more" if more > 0 else "")


def check_same_run(path: str | Path, saved: Mapping[str, Any], current: Mapping[str, Any],
                   allowed: Sequence[str] = ()) -> None:
    """Refuse, with one line naming the differing fields, to resume checkpoint ``path`` of another run; the way
    out it names is one that works (``resume_allow_changes`` cannot take an :data:`IDENTITY` field)."""
    diffs = identity_differences(saved, current, allowed)
    if not diffs:
        return
    names = [d.split(" ", 1)[0] for d in diffs]
    fixed = list(dict.fromkeys(n.split(".")[0] for n in names if n.split(".")[0] in IDENTITY))
    if fixed and len(fixed) == len({n.split(".")[0] for n in names}):
        hint = (f"Resume it with the run's own {' and '.join(fixed)} (resume_allow_changes cannot take "
                f"{'them' if len(fixed) > 1 else 'it'}), or start a new run")
    else:
        cannot = f" (not {' or '.join(fixed)}, which cannot change)" if fixed else ""
        hint = f"Resume it with its run's settings, or name the fields meant to change in resume_allow_changes{cannot}"
    raise ConfigError(f"ckpt_path: {path} is a checkpoint of another run, differing in {listed(diffs)}. {hint}")


def _differences(old: Any, new: Any, name: str) -> list[tuple[str, Any, Any]]:
    """``(dotted name, old, new)`` of every differing leaf; a group present on one side only, or built from another
    ``_target_``, is one difference."""
    if isinstance(old, Mapping) and isinstance(new, Mapping) and old.get("_target_") == new.get("_target_"):
        keys = [*new, *(k for k in old if k not in new)]
        prefix = f"{name}." if name else ""
        return [d for k in keys for d in _differences(old.get(k, _ABSENT), new.get(k, _ABSENT), f"{prefix}{k}")]
    same = old == new and isinstance(old, bool) == isinstance(new, bool)  # 5 == 5.0, but True is not 1
    return [] if same else [(name, old, new)]


def _show(value: Any) -> str:
    """A short one-line rendering of a config value: a group by its ``_target_``, an absent one as ``none``."""
    if value is _ABSENT or value is None:
        return "none"
    if isinstance(value, Mapping):
        text = str(value["_target_"]) if "_target_" in value else json.dumps(value, default=str)
    else:
        text = re.sub(r"\s+", " ", str(value))
    return text if len(text) <= 60 else text[:57] + "..."

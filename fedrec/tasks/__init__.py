"""Tasks (the LightningModule analogue): what one round of a federated task does.

Names load on first use, so ``import fedrec.trainer`` (which needs only the base class) does not pull in the
recommendation task's dependencies.
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

_WHERE = {
    "BanditTask": "bandit", "FederatedTask": "base", "FedRecTask": "recommendation", "MultiAgentTask": "multi_agent",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'fedrec.tasks' has no attribute {name!r}")
    return getattr(import_module(f"fedrec.tasks.{_WHERE[name]}"), name)

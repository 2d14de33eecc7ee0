"""The task kinds a config can build, each registered with its builder and the config groups it reads.

A kind is what a task class declares (:attr:`fedrec.tasks.FederatedTask.kind`). Registering one with
:func:`register_kind` is all a new kind needs: the group checks, the builder's dispatch and the "group not used"
refusals read this registry, so no central table is edited.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig


@dataclass(frozen=True)
class Kind:
    """A task kind: its builder, the groups a run of it must have, and the optional groups only it reads."""

    name: str
    build: Callable[[DictConfig], Any]
    #: groups a run of this kind needs; a run of another kind refuses them
    groups: tuple[str, ...]
    #: groups only this kind reads but that may be absent, each with what a run of another kind lacks
    #: ("has no server optimiser"); a run of another kind that sets one is told it would change nothing
    optional: Mapping[str, str] = field(default_factory=dict)
    #: more groups a run of this kind leaves unread, from its config (group -> why), e.g. what its protocol ignores
    unused: Callable[[DictConfig], dict[str, str]] | None = None

    @property
    def label(self) -> str:
        """The kind as prose: ``multi-agent``."""
        return self.name.replace("_", "-")


#: the registered kinds, by name
KINDS: dict[str, Kind] = {}


def register_kind(name: str, groups: tuple[str, ...], optional: Mapping[str, str] | None = None,
                  unused: Callable[[DictConfig], dict[str, str]] | None = None,
                  ) -> Callable[[Callable[[DictConfig], Any]], Callable[[DictConfig], Any]]:
    """Register the decorated function as the builder of task kind ``name`` (config -> task), with the groups it
    needs, the optional ones only it reads and what else it leaves unread (:class:`Kind`). A name registered twice
    is refused."""
    def register(build: Callable[[DictConfig], Any]) -> Callable[[DictConfig], Any]:
        if name in KINDS:
            raise ValueError(f"task kind {name!r} is registered already (by {KINDS[name].build.__qualname__})")
        KINDS[name] = Kind(name, build, tuple(groups), dict(optional or {}), unused)
        return build
    return register


def own_groups() -> set[str]:
    """Every group some kind needs: a run of another kind refuses it."""
    return {g for kind in KINDS.values() for g in kind.groups}


__all__ = ["KINDS", "Kind", "own_groups", "register_kind"]

"""OmegaConf resolvers of fedrec's configs (registered on import; :mod:`fedrec.build` imports this module, so
every builder resolves them).

``${by_conventions:PAPER,AUTHORS}`` is ``PAPER``, or ``AUTHORS`` when the run's ``privacy.conventions`` is
``authors``: the one switch ``privacy.conventions=authors`` thereby also sets the fields that go with the authors'
accounting (the planner's reward split, the optimiser's state, the validation split; BGTplanner spec §1.4, §5).
An explicit value of such a field overrides the switch.
"""
from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

__all__ = ["by_conventions"]


def by_conventions(paper: Any, authors: Any, *, _root_: Any) -> Any:
    """``authors`` if the config's ``privacy.conventions`` is ``"authors"``, else ``paper``."""
    return authors if OmegaConf.select(_root_, "privacy.conventions", default="paper") == "authors" else paper


if not OmegaConf.has_resolver("by_conventions"):
    OmegaConf.register_new_resolver("by_conventions", by_conventions)

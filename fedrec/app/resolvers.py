"""OmegaConf resolvers of fedrec's configs (registered on import; :mod:`fedrec.app.build` imports this module, so
every builder resolves them).

``${by_conventions:PAPER,AUTHORS}`` is ``PAPER``, or ``AUTHORS`` when the run's ``privacy.conventions`` is
``authors``: the one switch ``privacy.conventions=authors`` thereby also sets the fields that go with the authors'
accounting (the planner's reward split, the optimiser's state, the validation split, as in
BGTplanner's released code, where the paper is silent). An explicit value of such a field overrides the switch.

``${by_placement:CLIENT,SERVER}`` is ``CLIENT``, or ``SERVER`` when ``privacy.placement`` is ``server``: the fields
whose right value depends on where the noise is added (the adjacency and sensitivity that server placement's sampled
analysis assumes, the aggregator's client weights) follow ``privacy.placement=server`` unless set explicitly.
"""
from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

__all__ = ["by_conventions", "by_placement"]


def by_conventions(paper: Any, authors: Any, *, _root_: Any) -> Any:
    """``authors`` if the config's ``privacy.conventions`` is ``"authors"``, else ``paper``."""
    return authors if OmegaConf.select(_root_, "privacy.conventions", default="paper") == "authors" else paper


def by_placement(client: Any, server: Any, *, _root_: Any) -> Any:
    """``server`` if the config's ``privacy.placement`` is ``"server"``, else ``client``."""
    return server if OmegaConf.select(_root_, "privacy.placement", default="client") == "server" else client


for _name, _resolver in (("by_conventions", by_conventions), ("by_placement", by_placement)):
    if not OmegaConf.has_resolver(_name):
        OmegaConf.register_new_resolver(_name, _resolver)

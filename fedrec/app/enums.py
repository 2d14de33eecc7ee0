"""Where the choices of the config's fixed-choice fields (enums) live, for the command-line check of
:mod:`fedrec.app.schema`.

The choices themselves are the code's own constants, the ones its objects pass to
:func:`fedrec.errors.check_choice` when they are built; this table only says where each lives (``"module:NAME"``,
``NAME`` may be a class attribute ``Class.NAME``), and a constant is imported only when the command line sets its
field (so the check of a command line imports only what it needs). ``tests/test_enums.py`` scans fedrec for every
``check_choice("group.field", ..., CONSTANT)`` and fails on one this table lacks or points elsewhere.

A field is found in :data:`CHOICES` by its dotted config path (the fields the code itself names so: their choices
do not depend on the class that reads them), or in :data:`CLASS_CHOICES` by the ``_target_`` of the node that holds
it (as the config files spell it) and its name there, where the same name means different choices to different
classes (``env.noise``, ``data.split``, ``protocol.mode``). A field in neither is checked only when its object is
built.
"""
from __future__ import annotations

import functools
import importlib
from collections.abc import Collection

__all__ = ["CHOICES", "CLASS_CHOICES", "choices_of", "resolve", "where_of"]

#: config field (dotted path) -> where its choices live
CHOICES: dict[str, str] = {
    "aggregator.center": "fedrec.recsys.aggregate:CENTERS",
    "aggregator.reduce": "fedrec.recsys.aggregate:REDUCTIONS",
    "aggregator.weighting": "fedrec.recsys.aggregate:WEIGHTINGS",
    "attack.knowledge": "fedrec.recsys.attack:KNOWLEDGE",
    "attack.perturbation": "fedrec.recsys.attack:PERTURBATIONS",
    "model.head": "fedrec.models.recommender:HEADS",
    "planner.action_grid": "fedrec.planners.bgtplanner:ACTION_GRIDS",
    "planner.reward_split": "fedrec.planners.base:REWARD_SPLITS",
    "planner.rho": "fedrec.planners.bgtplanner:RHO_RULES",
    "privacy.adjacency": "fedrec.privacy.mechanisms:ADJACENCIES",
    "privacy.calibration": "fedrec.privacy.tree:CALIBRATIONS",
    "privacy.conventions": "fedrec.privacy.client_dp:CONVENTIONS",
    "privacy.laplace_split": "fedrec.privacy.tree:LAPLACE_SPLITS",
    "privacy.placement": "fedrec.privacy.client_dp:PLACEMENTS",
    "privacy.rng": "fedrec.privacy.client_dp:RNGS",
    "protocol.backend": "fedrec.protocols.base:BACKENDS",
    "protocol.layout": "fedrec.protocols.client_server:ClientServerLinUCB.LAYOUTS",
    "protocol.noise_placement": "fedrec.protocols.fclub:NOISE_PLACEMENTS",
    "strategy.on_bad_update": "fedrec.recsys.strategy:BAD_UPDATE_POLICIES",
    "strategy.participation": "fedrec.recsys.strategy:PARTICIPATIONS",
    "task.eval.ranking": "fedrec.recsys.evaluate:RANKINGS",
    "task.objective": "fedrec.recsys.objectives:OBJECTIVES",
    "task.optimizer": "fedrec.recsys.server:OPTIMIZERS",
    "task.optimizer_state": "fedrec.recsys.server:OPTIMIZER_STATES",
    "topology.kind": "fedrec.federation.topology:KINDS",
    "trainer.accelerator": "fedrec.trainer.distributed:ACCELERATORS",
    "trainer.strategy": "fedrec.trainer.distributed:STRATEGIES",
}

#: (a node's ``_target_``, a field of the node) -> where the field's choices live
CLASS_CHOICES: dict[tuple[str, str], str] = {
    ("fedrec.bandits.LinTS", "sampler"): "fedrec.bandits.linear:LinTS.SAMPLERS",
    ("fedrec.data.load_implicit", "name"): "fedrec.data.ratings:TEXT_DATASETS",
    ("fedrec.data.load_implicit", "split"): "fedrec.data.implicit:SPLITS",
    ("fedrec.data.load_ratings", "name"): "fedrec.data.ratings:DATASETS",
    ("fedrec.data.load_ratings", "normalize"): "fedrec.data.ratings:NORMALIZATIONS",
    ("fedrec.data.load_ratings", "split"): "fedrec.data.ratings:SPLITS",
    ("fedrec.envs.clustered.ClusteredLinearEnv", "theta"): "fedrec.envs.clustered:THETA_SOURCES",
    ("fedrec.envs.criteo.CriteoReplayEnv", "combine"): "fedrec.envs.replay:COMBINE",
    ("fedrec.envs.diabetes.DiabetesMAB", "split"): "fedrec.envs.diabetes:SPLITS",
    ("fedrec.envs.mab.MultiAgentMAB", "noise"): "fedrec.envs.mab:NOISES",
    ("fedrec.envs.replay.MovieLensReplayEnv", "combine"): "fedrec.envs.replay:COMBINE",
    ("fedrec.privacy.ClientDP", "accountant"): "fedrec.privacy.accountant:ACCOUNTANTS",
    ("fedrec.protocols.FederatedClustering", "bonus"): "fedrec.protocols.clustering:BONUS",
    ("fedrec.protocols.FederatedClustering", "conventions"): "fedrec.protocols.clustering:CONVENTIONS",
    ("fedrec.protocols.GossipBandit", "mode"): "fedrec.protocols.gossip:MODES",
    ("fedrec.protocols.LocalClustering", "bonus"): "fedrec.protocols.clustering:BONUS",
    ("fedrec.protocols.LocalClustering", "conventions"): "fedrec.protocols.clustering:CONVENTIONS",
    ("fedrec.protocols.LocalClustering", "method"): "fedrec.protocols.club:METHODS",
    ("fedrec.protocols.VerticalLinearBandit", "mask"): "fedrec.federation.vertical:MASKS",
    ("fedrec.protocols.VerticalLinearBandit", "mode"): "fedrec.protocols.vertical:MODES",
    ("fedrec.protocols.VerticalLinearBandit", "partial_columns"): "fedrec.protocols.vertical:PARTIAL_COLUMNS",
}


@functools.lru_cache(maxsize=None)
def resolve(where: str) -> tuple[str, ...]:
    """The choices at ``where`` (``"module:NAME"`` or ``"module:Class.NAME"``): the constant's items (a dict's
    keys), in its order."""
    module, _, name = where.partition(":")
    value: object = importlib.import_module(module)
    for part in name.split("."):
        value = getattr(value, part)
    assert isinstance(value, Collection) and not isinstance(value, str), where
    return tuple(value)


def where_of(key: str, target: str | None) -> str | None:
    """Where the choices of field ``key`` (dotted) live when its node is built by ``target``; None if it is not a
    field of fixed choices (as far as this table knows)."""
    if target is not None:
        found = CLASS_CHOICES.get((target, key.rpartition(".")[2]))
        if found is not None:
            return found
    return CHOICES.get(key)


def choices_of(key: str, target: str | None) -> tuple[str, ...] | None:
    """The choices of field ``key`` when its node is built by ``target`` (imported now), or None: not an enum, or
    its module cannot be imported here (the built object checks the value)."""
    where = where_of(key, target)
    try:
        return None if where is None else resolve(where)
    except (ImportError, AttributeError):  # tests/test_enums.py keeps every entry resolvable
        return None

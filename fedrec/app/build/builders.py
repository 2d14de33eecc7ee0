"""Turn a composed config into a task: one builder per task kind, registered with the kind
(:func:`~fedrec.app.build.kinds.register_kind`) and chosen by the ``kind`` that the class ``task._target_`` names
declares (:attr:`fedrec.tasks.FederatedTask.kind`).

A builder instantiates the config groups its kind needs and wires them together from what the objects declare,
never from class names or signatures: the sizes a protocol takes from its environment
(:meth:`~fedrec.protocols.StepProtocol.world`), a local policy only for protocols that ``takes_policy``, the
dataset an environment reads (``dataset``). A run too large for the memory is refused before it is allocated
(:mod:`fedrec.app.build.capacity`). Errors name the config group (``error: protocol: ...``).
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import numpy as np
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

import fedrec.app.resolvers  # noqa: F401  (the configs' ${by_conventions:...}, so build_task resolves any config)
from fedrec.app.build import capacity
from fedrec.app.build.groups import (
    check_groups,
    check_privacy,
    group_class,
    group_target,
    instantiate_group,
    one_line,
    privacy_mechanism,
    task_kind,
)
from fedrec.app.build.kinds import KINDS, register_kind
from fedrec.errors import ConfigError, check_int


def build_task(cfg: DictConfig) -> Any:
    """The task a config describes, built by its kind's builder (``replicates`` checked first: every builder sizes
    its state with it)."""
    check_groups(cfg)
    check_int("replicates", cfg.get("replicates"))
    return KINDS[task_kind(cfg)].build(cfg)


# ---------------------------------------------------------------------------------------------------- bandits
def _policy_factory(node: DictConfig, dim: int, seed: int, key: str) -> Any:
    """A policy node as a factory for a protocol, checked by building one row (errors name ``key``)."""
    from fedrec.protocols.base import build_policy

    try:
        factory = instantiate(node, _partial_=True)
        build_policy(factory, dim, (), seed)
    except InstantiationException as e:
        raise ConfigError(f"{key}: {one_line(e)}") from e
    except ConfigError as e:
        raise ConfigError(f"{key}: {str(e).removeprefix('policy: ')}") from e
    return factory


def _protocol_and_policy(cfg: DictConfig, dim: int) -> tuple[DictConfig, Any]:
    """The protocol node and its policy factory: the protocol's own ``policy`` node when it has one (the vertical
    protocols: VFUCB is LinUCB's, VFTS LinTS's), else the ``policy`` group."""
    node, policy, key = cfg.protocol, cfg.get("policy"), "policy"
    if "policy" in cfg.protocol:
        policy, key = cfg.protocol.policy, "protocol.policy"
        if not isinstance(policy, DictConfig) or "_target_" not in policy:
            raise ConfigError(f"protocol.policy: {cfg.protocol.get('_target_')} takes no policy node of its own "
                              f"(got {OmegaConf.to_container(policy) if isinstance(policy, DictConfig) else policy!r})")
        node = OmegaConf.masked_copy(cfg.protocol, [k for k in cfg.protocol if k != "policy"])
    return node, None if policy is None else _policy_factory(policy, dim, cfg.seed, key)


def _from_world(node: DictConfig, world: Mapping[str, Any]) -> dict[str, Any]:
    """What a protocol takes from its environment; a config value that contradicts it is refused."""
    for field, value in world.items():
        mine = node.get(field)
        mine = OmegaConf.to_container(mine) if OmegaConf.is_config(mine) else mine
        if mine is not None and mine != value:
            raise ConfigError(f"protocol.{field}: the environment sets it to {value}, got {mine}")
    return dict(world)


def _unused_policy(cfg: DictConfig) -> dict[str, str]:
    """The ``policy`` group when the bandit run's protocol does not read it: one that carries its own policy node
    or takes no local policy."""
    cls = group_class(cfg.protocol, "protocol")
    if "policy" in cfg.protocol:
        return {"policy": f"{cls.__name__} carries its own policy node: set protocol.policy.* instead"}
    if not getattr(cls, "takes_policy", False):
        return {"policy": f"{cls.__name__} takes no local policy"}
    return {}


@register_kind("bandit", groups=("env", "protocol"), optional={"policy": "takes no local policy"},
               unused=_unused_policy)
def build_bandit(cfg: DictConfig) -> Any:
    """A step-wise bandit run: the environment, then the protocol sized for it (with the local policy when the
    protocol takes one, and the privacy group's mechanism when the protocol applies it), then the task; a run too
    large for the machine's memory is refused first."""
    capacity.check_bandit(cfg)
    env = instantiate_group(cfg.env, "env", replicates=cfg.replicates, seed=cfg.seed)
    cls = group_class(cfg.protocol, "protocol")
    mechanism = privacy_mechanism(cfg)
    check_privacy(cls, mechanism)
    node, policy = _protocol_and_policy(cfg, env.dim)
    extra = _from_world(node, cls.world(env))
    if getattr(cls, "takes_policy", False):
        extra["policy"] = policy
    if mechanism is not None:
        extra["privacy"] = instantiate_group(cfg.privacy, "privacy")
    protocol = instantiate_group(node, "protocol", replicates=cfg.replicates, seed=cfg.seed, **extra)
    return instantiate_group(cfg.task, "task", env=env, protocol=protocol)


@register_kind("multi_agent", groups=("env", "protocol", "topology"))
def build_multi_agent(cfg: DictConfig) -> Any:
    """Every agent of a topology acts every round: the environment, the graph, then the protocol with the
    horizon T = ``task.steps`` (it enters the privacy calibration), then the task. The ``privacy`` group's
    mechanism (``privacy=tree_laplace``: :class:`~fedrec.privacy.TreeLaplace`) goes to the protocols that declare
    it; the others run under ``tree_laplace`` only at ε = ∞, where it adds no noise."""
    from fedrec.privacy import TreeLaplace

    capacity.check_multi_agent(cfg)
    env = instantiate_group(cfg.env, "env", replicates=cfg.replicates, seed=cfg.seed)
    topology = instantiate_group(cfg.topology, "topology")
    cls = group_class(cfg.protocol, "protocol")
    mechanism = privacy_mechanism(cfg)
    privacy: dict[str, Any] = {}
    if mechanism is not None and issubclass(mechanism, cls.privacy_mechanisms):
        privacy["privacy"] = instantiate_group(cfg.privacy, "privacy")
    elif mechanism is not None and issubclass(mechanism, TreeLaplace):
        if instantiate_group(cfg.privacy, "privacy").adds_noise:
            raise ConfigError(f"privacy.epsilon: {cls.__name__} adds no privacy noise, so it runs only at epsilon=inf; "
                              "pick a protocol that takes privacy=tree_laplace (protocol=fed_ucb)")
    else:
        check_privacy(cls, mechanism)
    horizon = check_int("task.steps", cfg.task.get("steps"))
    protocol = instantiate_group(cfg.protocol, "protocol", topology=topology, num_arms=env.num_arms,
                                 horizon=horizon, replicates=cfg.replicates, seed=cfg.seed, **privacy)
    return instantiate_group(cfg.task, "task", env=env, protocol=protocol)


# ------------------------------------------------------------------------------------------- recommendation
@register_kind("recommendation", groups=("data", "model", "aggregator"),
               optional={"server": "has no server optimiser", "attack": "has no malicious clients",
                         "planner": "has no privacy-budget planner"})
def build_recommendation(cfg: DictConfig) -> Any:
    """Round-based federated recommendation: the split ratings, the model sized for them (seeded first; data, a model
    or a round too large for the machine's memory is refused before allocating it; a model the round cannot
    federate is refused), client DP
    for the data's clients, the aggregator, the server optimiser, the attack and the round strategy when their groups
    are set (``attack=none`` is no attack), then the task."""
    if cfg.replicates != 1:
        raise ConfigError(f"replicates: federated recommendation runs one replicate (got {cfg.replicates}); "
                          "sweep seeds with -m seed=0,1,2 instead")
    from fedrec.data.implicit import ImplicitData

    # a loader that streams ratings over the rounds takes their number (implicit feedback has no stream)
    streams = "rounds" in inspect.signature(group_target(cfg.data, "data")).parameters
    rounds = {"rounds": check_int("task.rounds", cfg.task.get("rounds"))} if streams else {}
    capacity.check_data(cfg)
    data = instantiate_group(cfg.data, "data", seed=cfg.seed, **rounds)
    implicit = isinstance(data, ImplicitData)
    training_user = data.train.pairs()[0] if implicit else data.training.user
    sizes = (data.num_users, data.num_items, len(training_user), data.num_clients,
             capacity.whole(cfg.task.get("train_negatives"), 0) if implicit else 0)
    chunk = None
    if cfg.task.get("client_chunk") is not None:  # the clients' counts (a pass over every rating) only for chunks
        chunk = capacity.largest_chunk(cfg, np.bincount(data.client_of_user[training_user],
                                                        minlength=data.num_clients),
                                       np.bincount(data.client_of_user, minlength=data.num_clients))
    capacity.check_recommendation(cfg, *sizes, implicit=implicit, chunk=chunk)
    model = _model(cfg, data.num_users, data.num_items)
    shared = sum(p.numel() for p in model.shared_parameters().values())
    # with the clients' copies of ω
    capacity.check_recommendation(cfg, *sizes, implicit=implicit, shared=shared, chunk=chunk)
    privacy = None
    mechanism = privacy_mechanism(cfg)
    if mechanism is not None:
        check_privacy(group_class(cfg.task, "task"), mechanism)
        privacy = instantiate_group(cfg.privacy, "privacy", num_clients=data.num_clients)
    aggregator = instantiate_group(cfg.aggregator, "aggregator")
    server = instantiate_group(cfg.server, "server") if cfg.get("server") is not None else None
    attack = None
    if cfg.get("attack") is not None and cfg.attack.get("_target_") is not None:
        attack = instantiate_group(cfg.attack, "attack")
    strategy = instantiate_group(cfg.strategy, "strategy") if cfg.get("strategy") is not None else None
    return instantiate_group(cfg.task, "task", data=data, model=model, aggregator=aggregator, privacy=privacy,
                             seed=cfg.seed, server=server, attack=attack, strategy=strategy)


def _model(cfg: DictConfig, num_users: int, num_items: int) -> Any:
    """The run's model, seeded, sized for the data and checked to be one the round can federate (errors name
    ``model``)."""
    import torch

    from fedrec.models.plain import check_federated

    target = group_target(cfg.model, "model")
    missing = sorted(getattr(target, "__abstractmethods__", ())) if inspect.isclass(target) else []
    if missing:
        raise ConfigError(f"model: {target.__qualname__} leaves {', '.join(missing)} undefined (an abstract class; a "
                          "model written with ordinary layers defines forward(user_vecs, item_vecs) -> logits)")
    extra = {}
    expansion = (cfg.task.get("expansion") or {}).get("neighbours") or 0
    if expansion:  # graph expansion needs a model built to read neighbours
        if not getattr(target, "reads_neighbours", False):
            name = getattr(target, "__qualname__", target)
            raise ConfigError(f"task.expansion.neighbours={expansion}: model {name} does not read expansion "
                              "neighbours (model=fedgnn does; set task.expansion.neighbours=0 for another model)")
        extra["expansion"] = True
    torch.manual_seed(cfg.seed)  # model initialisation
    model = instantiate_group(cfg.model, "model", num_users=num_users, num_items=num_items, **extra)
    try:
        check_federated(model)
    except ConfigError as e:
        raise ConfigError(f"model: {e}") from e
    return model

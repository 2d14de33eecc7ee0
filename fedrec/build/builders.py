"""Turn a composed config into a task: one builder per task kind, chosen by the ``kind`` that the class
``task._target_`` names declares (:attr:`fedrec.tasks.FederatedTask.kind`).

A builder instantiates the config groups its kind needs and wires them together from what the objects declare,
never from class names or signatures: the sizes a protocol takes from its environment
(:meth:`~fedrec.protocols.StepProtocol.world`), a local policy only for protocols that ``takes_policy``, the
dataset an environment reads (``dataset``). Errors name the config group (``error: protocol: ...``).
"""
from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import get_class, get_object, instantiate
from omegaconf import DictConfig, OmegaConf

import fedrec.resolvers  # noqa: F401  (the configs' ${by_conventions:...}, so build_task resolves any config)
from fedrec.errors import ConfigError, DatasetNotFoundError, check_int

#: the config groups each task kind needs; groups of other kinds are refused
GROUPS = {
    "bandit": ("env", "protocol"),
    "multi_agent": ("env", "protocol", "topology"),
    "recommendation": ("data", "model", "aggregator"),
}
#: groups that belong to one kind only: a run of another kind refuses them
_OWN = {"env", "protocol", "topology", "data", "model", "aggregator"}


def one_line(e: BaseException) -> str:
    """An exception's message on one line."""
    return re.sub(r"\s+", " ", str(e)).strip()


#: the start of a message that already names a dotted field (``task.pseudo_items must ...``)
_NAMES_FIELD = re.compile(r"[A-Za-z_]\w*\.[A-Za-z_]\w*")


def _in_group(key: str, message: str) -> str:
    """``message`` of an error raised while building config group ``key``, prefixed ``key: `` unless it already
    names a dotted field: the task's check of ``attack.fraction`` names that field, not the task."""
    return message if _NAMES_FIELD.match(message) else f"{key}: {message}"


def instantiate_group(node: DictConfig, key: str, **kwargs: Any) -> Any:
    """Instantiate config ``node`` with ``kwargs``; errors name the config group ``key`` (:func:`_in_group`)."""
    try:  # partial first: Hydra would turn dataclass arguments (e.g. RatingData) into configs
        factory = instantiate(node, _partial_=True, _recursive_=False)
    except InstantiationException as e:
        raise ConfigError(f"{key}: {one_line(e)}") from e
    try:
        return factory(**kwargs)
    except (ConfigError, DatasetNotFoundError) as e:
        raise type(e)(_in_group(key, str(e))) from e
    except TypeError as e:
        if "argument" not in str(e):  # not a bad or missing config key: a genuine error
            raise
        raise ConfigError(f"{key}: {e}") from e


def group_target(node: Any, key: str, *, kind: Callable[[str], Any] = get_object) -> Any:
    """What a config group's ``_target_`` names, a class or a function (errors name the group)."""
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    if target is None:
        raise ConfigError(f"{key}: the group builds nothing (it has no _target_)")
    try:
        return kind(str(target))
    except (ImportError, AttributeError, ValueError) as e:
        what = "class" if kind is get_class else "target"
        raise ConfigError(f"{key}: cannot find the {what} {target!r} ({one_line(e)})") from e


def group_class(node: Any, key: str) -> type:
    """The class a config group's ``_target_`` names (errors name the group)."""
    return group_target(node, key, kind=get_class)


def task_kind(cfg: DictConfig) -> str:
    """The kind of task ``cfg`` describes: what the class ``task._target_`` names declares."""
    if cfg.get("task") is None:
        raise ConfigError("task: a run needs the task group (task=NAME, a file of conf/task/)")
    kind = getattr(group_class(cfg.task, "task"), "kind", None)
    if kind not in BUILDERS:
        raise ConfigError(f"task: {cfg.task._target_} declares no task kind fedrec builds (kind one of "
                          f"{list(BUILDERS)}, got {kind!r})")
    return kind


def _article(word: Any) -> str:
    return "an" if str(word)[:1] in "aeiou" else "a"


def check_groups(cfg: DictConfig) -> None:
    """The config groups the run's kind needs are there (not removed with ``~env``, ``~model``, ...) and those of
    other kinds are absent, before anything is built (errors name the group)."""
    kind = task_kind(cfg)
    what = f"a {kind.replace('_', '-')} run (task={cfg.task._target_})"
    for group in GROUPS[kind]:
        if cfg.get(group) is None:
            raise ConfigError(f"{group}: {what} needs the {group} group ({group}=NAME, a file of conf/{group}/)")
    for group in sorted(_OWN - set(GROUPS[kind])):
        if cfg.get(group) is not None:
            raise ConfigError(f"{group}: {what} does not use the {group} group (remove it with ~{group}, or pick "
                              f"the task of a run that uses it)")
    for group in ("env", "protocol"):  # what each declares it runs under (kind), before anything is built
        if group in GROUPS[kind]:
            serves = getattr(group_class(cfg[group], group), "kind", None)
            if serves != kind:
                cls = cfg[group]._target_.rsplit(".", 1)[-1]
                task = {"bandit": "task=bandit with ~topology",
                        "multi_agent": "task=multi_agent with a topology=..."}.get(serves)
                pick = f"pick {_article(group)} {group} of {what}"
                instead = f"{pick}, or {task}" if task else pick
                raise ConfigError(f"{group}: {cls} is {_article(serves)} {str(serves).replace('_', '-')} {group}; "
                                  f"{instead}")


def unused_groups(cfg: DictConfig) -> dict[str, str]:
    """The groups ``cfg`` composes (``conf/config.yaml`` selects some for every run) that its kind or protocol does
    not use, each with why: setting them on the command line would change nothing."""
    kind = task_kind(cfg)
    unused: dict[str, str] = {}
    if kind != "recommendation":
        for group, what in (("server", "server optimiser"), ("attack", "malicious clients"),
                            ("planner", "privacy-budget planner")):
            unused[group] = f"a {kind.replace('_', '-')} run has no {what} (it belongs to recommendation runs)"
    if kind != "bandit":
        unused["policy"] = f"a {kind.replace('_', '-')} run takes no local policy (bandit protocols do)"
    else:
        cls = group_class(cfg.protocol, "protocol")
        if "policy" in cfg.protocol:
            unused["policy"] = f"{cls.__name__} carries its own policy node: set protocol.policy.* instead"
        elif not getattr(cls, "takes_policy", False):
            unused["policy"] = f"{cls.__name__} takes no local policy"
    return unused


def check_used(cfg: DictConfig, touched: Mapping[str, str]) -> None:
    """No command-line override (``touched``: group -> the override) sets a group the run does not use (for a
    ``cfg`` that passed :func:`check_groups`)."""
    for group, reason in unused_groups(cfg).items():
        if group in touched:
            raise ConfigError(f"{group}: {reason}; '{touched[group]}' would change nothing")


def ignored_fields(cfg: DictConfig) -> dict[str, str]:
    """Fields the run's options leave unread, each with why: a value set on the command line would change
    nothing (sampled-ranking negatives without sampled ranking, a noise placement without noise)."""
    ignored: dict[str, str] = {}
    kind = task_kind(cfg)
    if kind == "recommendation":
        ranking = OmegaConf.select(cfg, "task.eval.ranking", default=None)
        if ranking != "sampled":
            shown = ranking if ranking is not None else "null (full on implicit data, none on ratings)"
            ignored["task.eval.negatives"] = (f"only sampled ranking reads it, and task.eval.ranking={shown}; set "
                                              "task.eval.ranking=sampled")
    elif isinstance(cfg.get("protocol"), DictConfig) and "noise_placement" in cfg.protocol \
            and _privacy_mechanism(cfg) is None:
        ignored["protocol.noise_placement"] = ("the run adds no noise (no privacy mechanism), so there is none to "
                                               "place; select one (privacy=tree_gaussian)")
    return ignored


def check_ignored(cfg: DictConfig, keys: Iterable[str]) -> None:
    """No command-line value override (``keys``: the fields it sets) sets a field :func:`ignored_fields` names."""
    given = {key.lstrip("+~") for key in keys}
    for key, reason in ignored_fields(cfg).items():
        if key in given:
            raise ConfigError(f"{key}: {reason}; the value given would change nothing")


def build_task(cfg: DictConfig) -> Any:
    """The task a config describes, built by its kind's builder (``replicates`` checked first: every builder sizes
    its state with it)."""
    check_groups(cfg)
    check_int("replicates", cfg.get("replicates"))
    return BUILDERS[task_kind(cfg)](cfg)


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


def _privacy_mechanism(cfg: DictConfig) -> type | None:
    """The class the ``privacy`` group builds, None without one (no group, no ``_target_``, or privacy=none)."""
    node = cfg.get("privacy")
    if not isinstance(node, DictConfig) or node.get("_target_") is None or node.get("mechanism") == "none":
        return None
    return group_class(node, "privacy")


def _check_privacy(cls: type, mechanism: type | None) -> None:
    """A protocol applies only the privacy mechanisms it declares (``privacy_mechanisms``: classes the ``privacy``
    group may build, subclasses included)."""
    if mechanism is not None and not issubclass(mechanism, cls.privacy_mechanisms):
        takes = " or ".join(m.__name__ for m in cls.privacy_mechanisms)
        applies = f"applies only {takes}" if takes else "applies no privacy mechanism"
        raise ConfigError(f"privacy: {cls.__name__} {applies}, got {mechanism.__name__}")


#: bytes per float of the state a bandit run allocates
_FLOAT = 8


def available_memory() -> int | None:
    """The bytes a new allocation can get: the kernel's ``MemAvailable``, and under an address-space limit
    (``ulimit -v``, RLIMIT_AS) no more than the limit less what the process has mapped already; None where
    neither is known."""
    import resource

    free = _proc_field("/proc/meminfo", "MemAvailable:")
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    mapped = _proc_field("/proc/self/status", "VmSize:")
    if soft != resource.RLIM_INFINITY and mapped is not None:
        headroom = max(soft - mapped, 0)
        free = headroom if free is None else min(free, headroom)
    return free


def _proc_field(path: str, name: str) -> int | None:
    """The bytes a ``/proc`` file gives for field ``name`` (in kB there); None where unknown."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(name):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _state_rows(cfg: DictConfig, num_clients: int) -> int:
    """Per replicate, the clients whose state a bandit run may allocate: all of them, or with
    ``protocol.layout=sparse`` (rows on arrival, capacity doubled) at most twice the arrivals, which ``task.steps``
    bounds (one client acts per step)."""
    steps = cfg.task.get("steps")
    if cfg.protocol.get("layout") != "sparse" or not isinstance(steps, int):
        return num_clients
    return min(num_clients, 2 * steps)


def bandit_memory_estimate(cfg: DictConfig) -> int:
    """An estimate of the bytes a bandit run's sizes need, from its config before anything is allocated: per replicate
    and client that holds state (:func:`_state_rows`), three (d + 1)² blocks of statistics (the protocol's V, its
    inverse and the client's copy) and the client's θ; per replicate, the environment's cached chunks (two of
    ``chunk_size`` steps, K contexts of d floats and the rewards) and the round's tensors. Sizes a config does not
    give (real data) count as 1."""
    given = {k: cfg.env.get(k) for k in ("num_clients", "dim", "num_arms", "chunk_size")}
    size = {k: v if isinstance(v, int) and not isinstance(v, bool) else 1 for k, v in given.items()}
    per_client = 3 * (size["dim"] + 1) ** 2 + size["dim"]
    per_chunk = 3 * size["chunk_size"] * size["num_arms"] * (size["dim"] + 2)
    rows = _state_rows(cfg, size["num_clients"])
    return int(cfg.replicates) * (rows * per_client + per_chunk) * _FLOAT


def check_fits(cfg: DictConfig, need: int, field: str, sizes: str) -> None:
    """Refuse a run whose estimated memory ``need`` (bytes) exceeds the user's limit ``max_memory_gb`` or what the
    machine has, before allocating it (it would otherwise die in the allocator), naming ``field`` and the ``sizes``
    that make the estimate."""
    limit = cfg.get("max_memory_gb")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit > 0:
            raise ConfigError(f"max_memory_gb must be a positive number of GiB or null, got {limit!r}")
        if need > limit * 2**30:
            raise ConfigError(f"max_memory_gb={limit}: the run needs about {need / 2**30:.1f} GiB ({sizes}); lower "
                              "one of them or raise max_memory_gb")
    available = available_memory()
    if available is not None and need > available:
        raise ConfigError(f"{field}: the run needs about {need / 2**30:.1f} GiB ({sizes}) and "
                          f"{available / 2**30:.1f} GiB is available; lower one of them")


def check_memory(cfg: DictConfig) -> None:
    """Refuse a bandit run too large for the memory (:func:`bandit_memory_estimate`, :func:`check_fits`)."""
    sizes = (f"replicates={cfg.replicates}, env.num_clients={cfg.env.get('num_clients')}, "
             f"task.steps={cfg.task.get('steps')}, protocol.layout={cfg.protocol.get('layout', 'dense')}, "
             f"env.dim={cfg.env.get('dim')}, env.num_arms={cfg.env.get('num_arms')}, "
             f"env.chunk_size={cfg.env.get('chunk_size')}")
    check_fits(cfg, bandit_memory_estimate(cfg), "replicates" if cfg.replicates > 1 else "env.num_clients", sizes)


def multi_agent_memory_estimate(cfg: DictConfig) -> int:
    """An estimate of the bytes a multi-agent run's sizes need, from its config before anything is allocated: the
    communication graph's N × N adjacency (bytes) and, per replicate, agent and arm, the gossip protocols' six 8-byte
    statistics (counts, sums, estimates) and their four tree-noise arrays of one entry per level of a horizon of
    ``task.steps`` rounds. Sizes a config does not give count as 1."""
    n, arms = _as_whole(cfg.env.get("num_agents"), 1), _as_whole(cfg.env.get("num_arms"), 1)
    levels = _as_whole(cfg.task.get("steps"), 1).bit_length()  # ⌊log₂ T⌋ + 1, the tree's levels
    return n * n + _as_whole(cfg.replicates, 1) * n * arms * (6 + 4 * levels) * _FLOAT


def recommendation_memory_estimate(cfg: DictConfig, num_users: int, num_items: int, num_training: int,
                                   num_clients: int, negatives: int = 0) -> int:
    """An estimate of the bytes a recommendation run needs once its data is loaded, before its model is allocated:
    four float32 copies of the embedding tables (the parameters, their gradients and Adam's two moments) and of a
    round's uploaded rows (each training rating's item row and ``task.pseudo_items`` pseudo rows per client: the
    rows, their gradients, their noise and the shuffled upload), ``model.embed_dim`` floats each. A client draws at
    most ``num_items`` pseudo items (:func:`~fedrec.recsys.upload.sample_pseudo_items`), whatever the config asks.
    On implicit feedback each training positive draws ``negatives`` negatives a round, and each negative costs four
    float32 vectors of the model's width (its item row and its user's state, gathered per pair, and their gradients)
    and eight 8-byte values (the draw's temporaries in :func:`~fedrec.data.implicit.sample_negatives`, the pair's
    indices, logit and gradient): 320 bytes at width 16, where ML-100K's peak grew by 310-375 bytes per negative
    between 1, 20 and 100 negatives per positive. Graph expansion (``task.expansion.neighbours`` K) gives each
    training rating K neighbour slots of eight float32 vectors (attached for training and evaluation, transformed,
    attended, and their gradients) and three 8-byte values, and a k × k copy of the item layer's weights and its
    gradient: 280 bytes a slot at width 8, where ML-100K's peak grew by 255 (408 MB with K = 20)."""
    k, pseudo = _as_whole(cfg.model.get("embed_dim"), 1), min(_as_whole(cfg.task.get("pseudo_items"), 0), num_items)
    drawn = num_training * negatives
    slots = _as_whole((cfg.task.get("expansion") or {}).get("neighbours"), 0)
    expansion = num_training * (slots * (8 * 4 * k + 24) + 8 * k * k) if slots else 0
    return 4 * 4 * k * (num_users + num_items + num_training + num_clients * pseudo + drawn) + 8 * 8 * drawn + \
        expansion


def _as_whole(value: Any, otherwise: int) -> int:
    """``value`` as an int if it is a whole number (``1e8`` included: the model reads it so), else ``otherwise``
    (the model's own check then refuses it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        return otherwise
    return int(value)


def build_bandit(cfg: DictConfig) -> Any:
    """A step-wise bandit run: the environment, then the protocol sized for it (with the local policy when the
    protocol takes one, and the privacy group's mechanism when the protocol applies it), then the task; a run too
    large for the machine's memory is refused first."""
    check_memory(cfg)
    env = instantiate_group(cfg.env, "env", replicates=cfg.replicates, seed=cfg.seed)
    cls = group_class(cfg.protocol, "protocol")
    mechanism = _privacy_mechanism(cfg)
    _check_privacy(cls, mechanism)
    node, policy = _protocol_and_policy(cfg, env.dim)
    extra = _from_world(node, cls.world(env))
    if getattr(cls, "takes_policy", False):
        extra["policy"] = policy
    if mechanism is not None:
        extra["privacy"] = instantiate_group(cfg.privacy, "privacy")
    protocol = instantiate_group(node, "protocol", replicates=cfg.replicates, seed=cfg.seed, **extra)
    return instantiate_group(cfg.task, "task", env=env, protocol=protocol)


def build_multi_agent(cfg: DictConfig) -> Any:
    """Every agent of a topology acts every round: the environment, the graph, then the protocol with the
    horizon T = ``task.steps`` (it enters the privacy calibration), then the task. The ``privacy`` group's
    mechanism (``privacy=tree_laplace``: :class:`~fedrec.privacy.TreeLaplace`) goes to the protocols that declare
    it; the others run under ``tree_laplace`` only at ε = ∞, where it adds no noise."""
    from fedrec.privacy import TreeLaplace

    check_fits(cfg, multi_agent_memory_estimate(cfg),
               "env.num_agents" if _as_whole(cfg.replicates, 1) == 1 else "replicates",
               f"replicates={cfg.replicates}, env.num_agents={cfg.env.get('num_agents')}, "
               f"env.num_arms={cfg.env.get('num_arms')}, task.steps={cfg.task.get('steps')}")
    env = instantiate_group(cfg.env, "env", replicates=cfg.replicates, seed=cfg.seed)
    topology = instantiate_group(cfg.topology, "topology")
    cls = group_class(cfg.protocol, "protocol")
    mechanism = _privacy_mechanism(cfg)
    privacy: dict[str, Any] = {}
    if mechanism is not None and issubclass(mechanism, cls.privacy_mechanisms):
        privacy["privacy"] = instantiate_group(cfg.privacy, "privacy")
    elif mechanism is not None and issubclass(mechanism, TreeLaplace):
        if instantiate_group(cfg.privacy, "privacy").adds_noise:
            raise ConfigError(f"privacy.epsilon: {cls.__name__} adds no privacy noise, so it runs only at epsilon=inf; "
                              "pick a protocol that takes privacy=tree_laplace (protocol=fed_ucb)")
    else:
        _check_privacy(cls, mechanism)
    horizon = check_int("task.steps", cfg.task.get("steps"))
    protocol = instantiate_group(cfg.protocol, "protocol", topology=topology, num_arms=env.num_arms,
                                 horizon=horizon, replicates=cfg.replicates, seed=cfg.seed, **privacy)
    return instantiate_group(cfg.task, "task", env=env, protocol=protocol)


# ------------------------------------------------------------------------------------------- recommendation
def build_recommendation(cfg: DictConfig) -> Any:
    """Round-based federated recommendation: the split ratings, the model sized for them (seeded first; a model too
    large for the machine's memory is refused before allocating; one the round cannot federate is refused), client DP
    for the data's clients, the aggregator, the server optimiser, the attack and the round strategy when their groups
    are set (``attack=none`` is no attack), then the task."""
    if cfg.replicates != 1:
        raise ConfigError(f"replicates: federated recommendation runs one replicate (got {cfg.replicates}); "
                          "sweep seeds with -m seed=0,1,2 instead")
    from fedrec.data.implicit import ImplicitData

    # a loader that streams ratings over the rounds takes their number (implicit feedback has no stream)
    streams = "rounds" in inspect.signature(group_target(cfg.data, "data")).parameters
    rounds = {"rounds": check_int("task.rounds", cfg.task.get("rounds"))} if streams else {}
    data = instantiate_group(cfg.data, "data", seed=cfg.seed, **rounds)
    implicit = isinstance(data, ImplicitData)
    training = len(data.train) if implicit else len(data.training)
    negatives = _as_whole(cfg.task.get("train_negatives"), 0) if implicit else 0
    check_fits(cfg, recommendation_memory_estimate(cfg, data.num_users, data.num_items, training, data.num_clients,
                                                   negatives),
               "task.expansion.neighbours" if (cfg.task.get("expansion") or {}).get("neighbours") else
               "task.train_negatives" if negatives * training > data.num_users + data.num_items + training
               else "model.embed_dim",
               f"model.embed_dim={cfg.model.get('embed_dim')}, {data.num_users} users, {data.num_items} items, "
               f"{training} training ratings, task.pseudo_items={cfg.task.get('pseudo_items')}"
               + (f", task.train_negatives={negatives}" if implicit else ""))
    model = _model(cfg, data.num_users, data.num_items)
    privacy = None
    mechanism = _privacy_mechanism(cfg)
    if mechanism is not None:
        _check_privacy(group_class(cfg.task, "task"), mechanism)
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


#: the builder of each task kind (:attr:`fedrec.tasks.FederatedTask.kind`)
BUILDERS: dict[str, Callable[[DictConfig], Any]] = {
    "bandit": build_bandit,
    "multi_agent": build_multi_agent,
    "recommendation": build_recommendation,
}


# -------------------------------------------------------------------------------------------------- datasets
@dataclass(frozen=True)
class RunDataset:
    """The downloadable dataset a run reads (:data:`fedrec.data.download.REGISTRY`)."""

    group: str  #: the config group that reads it (``data`` or ``env``)
    name: str
    data_dir: Path


def run_dataset(cfg: DictConfig) -> RunDataset | None:
    """The downloadable dataset the run reads: its ``data`` group's, or what its environment's class declares
    (``dataset``); None for runs on generated data."""
    from fedrec.data.download import REGISTRY

    key = "data" if cfg.get("data") is not None else "env"
    node = cfg.get(key)
    if node is None:
        return None
    name = node.get("name") if key == "data" else getattr(group_class(node, "env"), "dataset", None)
    if name not in REGISTRY or node.get("data_dir") is None:
        return None
    return RunDataset(key, str(name), Path(str(node.data_dir)))


def build_task_fetching_data(cfg: DictConfig) -> Any:
    """:func:`build_task`; if the dataset it reads is missing, download it first with ``download_data=true`` (a
    message and a progress bar on stderr), else raise a DatasetNotFoundError naming the flag and the download
    command. A failed download is a DatasetNotFoundError too (the run cannot get its data), naming the group."""
    try:
        return build_task(cfg)
    except DatasetNotFoundError:
        from fedrec.data.download import DownloadError, ensure_dataset, missing_files

        dataset = run_dataset(cfg)
        if dataset is None or not missing_files(dataset.name, dataset.data_dir):  # another file: the loader's text
            raise
        try:
            ensure_dataset(dataset.name, dataset.data_dir, download=cfg.get("download_data", False))
        except (DatasetNotFoundError, DownloadError) as e:
            raise DatasetNotFoundError(f"{dataset.group}: {e}") from e
    return build_task(cfg)

"""Refuse a run too large for the memory before it is allocated (it would otherwise die in the allocator).

Each object states what its sizes cost (``memory_estimate``, a classmethod of the protocol, environment, model and
task classes, and an attribute of a data loader that generates its data): this module gathers a run's sizes from
its config, asks the classes the config names, and checks the sum against the user's ``max_memory_gb`` and what the
process can get (:func:`check_fits`). Sizes a config does not give (real data) or that are not whole numbers count
as 1: the object's own check then refuses a bad one with its own message.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from omegaconf import DictConfig

from fedrec.app.build.groups import group_class, group_target, privacy_mechanism
from fedrec.errors import ConfigError


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


def check_fits(cfg: DictConfig, need: int, field: str, sizes: str) -> None:
    """Refuse a run whose estimated memory ``need`` (bytes) exceeds the user's limit ``max_memory_gb`` or what the
    process can get (:func:`available_memory`), before allocating it, naming ``field`` and the ``sizes`` that make
    the estimate."""
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


def whole(value: Any, otherwise: int) -> int:
    """``value`` as an int if it is a whole number (``1e8`` included: the objects read it so), else ``otherwise``
    (the object's own check then refuses it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        return otherwise
    return int(value)


def _estimate(target: Any, sizes: Mapping[str, Any]) -> int:
    """What ``target`` (a class or a loader function) says ``sizes`` cost; 0 for one that states nothing."""
    estimate = getattr(target, "memory_estimate", None)
    return int(estimate(sizes)) if callable(estimate) else 0


# ---------------------------------------------------------------------------------------------------- bandits
def bandit_sizes(cfg: DictConfig) -> dict[str, Any]:
    """The sizes a bandit run's objects estimate from (config values; ``steps`` None where not whole)."""
    sizes = {k: whole(cfg.env.get(k), 1) for k in ("num_clients", "dim", "num_arms", "chunk_size")}
    steps = cfg.task.get("steps")
    return {"replicates": whole(cfg.replicates, 1), **sizes, "layout": cfg.protocol.get("layout", "dense"),
            "steps": steps if isinstance(steps, int) and not isinstance(steps, bool) else None}


def bandit_memory_estimate(cfg: DictConfig) -> int:
    """The bytes a bandit run's sizes need: its environment's and its protocol's estimates."""
    sizes = bandit_sizes(cfg)
    return _estimate(group_class(cfg.env, "env"), sizes) + _estimate(group_class(cfg.protocol, "protocol"), sizes)


def check_bandit(cfg: DictConfig) -> None:
    """Refuse a bandit run too large for the memory (:func:`bandit_memory_estimate`, :func:`check_fits`)."""
    sizes = (f"replicates={cfg.replicates}, env.num_clients={cfg.env.get('num_clients')}, "
             f"task.steps={cfg.task.get('steps')}, protocol.layout={cfg.protocol.get('layout', 'dense')}, "
             f"env.dim={cfg.env.get('dim')}, env.num_arms={cfg.env.get('num_arms')}, "
             f"env.chunk_size={cfg.env.get('chunk_size')}")
    check_fits(cfg, bandit_memory_estimate(cfg), "replicates" if cfg.replicates > 1 else "env.num_clients", sizes)


# ------------------------------------------------------------------------------------------------ multi-agent
def multi_agent_memory_estimate(cfg: DictConfig) -> int:
    """The bytes a multi-agent run's sizes need: its environment's estimate and its protocol's (the graph and the
    agents' state)."""
    sizes = {"replicates": whole(cfg.replicates, 1), "num_agents": whole(cfg.env.get("num_agents"), 1),
             "num_arms": whole(cfg.env.get("num_arms"), 1), "steps": whole(cfg.task.get("steps"), 1)}
    return _estimate(group_class(cfg.env, "env"), sizes) + _estimate(group_class(cfg.protocol, "protocol"), sizes)


def check_multi_agent(cfg: DictConfig) -> None:
    """Refuse a multi-agent run too large for the memory (:func:`multi_agent_memory_estimate`)."""
    check_fits(cfg, multi_agent_memory_estimate(cfg), "env.num_agents" if whole(cfg.replicates, 1) == 1
               else "replicates", f"replicates={cfg.replicates}, env.num_agents={cfg.env.get('num_agents')}, "
               f"env.num_arms={cfg.env.get('num_arms')}, task.steps={cfg.task.get('steps')}")


# --------------------------------------------------------------------------------------------- recommendation
def check_data(cfg: DictConfig) -> None:
    """Refuse data whose generation alone would not fit, before generating it (a loader that generates data in
    memory states its cost: ``memory_estimate`` of its arguments)."""
    target = group_target(cfg.data, "data")
    if not callable(getattr(target, "memory_estimate", None)):
        return
    sizes = {k: whole(v, 1) if isinstance(v, (int, float)) else v for k, v in cfg.data.items() if k != "_target_"}
    fields = [k for k in ("users", "items", "ratings") if k in cfg.data]
    check_fits(cfg, _estimate(target, sizes), "data.ratings" if "ratings" in cfg.data else "data",
               ", ".join(f"data.{k}={cfg.data[k]}" for k in fields))


def recommendation_sizes(cfg: DictConfig, num_users: int, num_items: int, num_training: int, num_clients: int,
                         negatives: int = 0, shared: int = 0, chunk: tuple[int, int] | None = None) -> dict[str, Any]:
    """The sizes a recommendation run's model and task estimate from, once its data is loaded (``shared``: the
    model's ω size, 0 before the model exists; ``chunk``: the training ratings and users of the largest chunk of
    clients that train at once, :func:`largest_chunk`; None: the whole round's). ``streamed``: whether a chunk's
    uploads are summed before the next chunk trains (:func:`~fedrec.recsys.aggregate.streams_chunks`, as the task
    decides), so that they too follow the chunk."""
    from fedrec.recsys.aggregate import streams_chunks

    expansion = cfg.task.get("expansion") or {}
    chunk_training, chunk_users = (num_training, num_users) if chunk is None else chunk
    attack = cfg.get("attack") is not None and cfg.attack.get("_target_") is not None
    server_placed = privacy_mechanism(cfg) is not None and cfg.privacy.get("placement") == "server"
    streamed = chunk is not None and cfg.get("aggregator") is not None and \
        streams_chunks(cfg.task.get("client_chunk"), group_class(cfg.aggregator, "aggregator"), server_placed, attack)
    return {"users": num_users, "items": num_items, "training": num_training, "clients": num_clients,
            "negatives": negatives, "embed_dim": whole(cfg.model.get("embed_dim"), 1),
            "pseudo_items": whole(cfg.task.get("pseudo_items"), 0), "neighbours": whole(expansion.get("neighbours"), 0),
            "shared": shared, "chunk_training": chunk_training, "chunk_users": chunk_users, "streamed": streamed,
            "chunk_clients": whole(cfg.task.get("client_chunk"), num_clients) if streamed else num_clients}


def largest_chunk(cfg: DictConfig, ratings_per_client: np.ndarray, users_per_client: np.ndarray
                  ) -> tuple[int, int] | None:
    """An upper bound on the training ratings and users of any ``task.client_chunk`` clients that train at once:
    those of the chunk's number of clients with the most of each; None without chunks."""
    chunk = cfg.task.get("client_chunk")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 0 < chunk < len(ratings_per_client):
        return None  # no chunks, or one of all clients (the task refuses a bad value itself)
    return tuple(int(np.sort(np.asarray(c))[::-1][:chunk].sum()) for c in (ratings_per_client, users_per_client))


def recommendation_memory_estimate(cfg: DictConfig, num_users: int, num_items: int, num_training: int,
                                   num_clients: int, negatives: int = 0, shared: int = 0,
                                   chunk: tuple[int, int] | None = None) -> int:
    """The bytes a recommendation run needs once its data is loaded: its model class's estimate (the tables and
    their optimiser state, and what local training holds per rating of a chunk) and its task class's (a round's
    rows, negatives, expansion slots and, once the model exists, the clients' copies of its ``shared`` ω values)."""
    sizes = recommendation_sizes(cfg, num_users, num_items, num_training, num_clients, negatives, shared, chunk)
    return _estimate(group_target(cfg.model, "model"), sizes) + _estimate(group_class(cfg.task, "task"), sizes)


def check_recommendation(cfg: DictConfig, num_users: int, num_items: int, num_training: int, num_clients: int,
                         negatives: int, implicit: bool, shared: int = 0, chunk: tuple[int, int] | None = None) -> None:
    """Refuse a recommendation run too large for the memory (:func:`recommendation_memory_estimate`), naming the
    size that dominates."""
    sizes = recommendation_sizes(cfg, num_users, num_items, num_training, num_clients, negatives)
    field = ("task.expansion.neighbours" if sizes["neighbours"] else
             "task.train_negatives" if negatives * num_training > num_users + num_items + num_training
             else "model.embed_dim")
    check_fits(cfg, recommendation_memory_estimate(cfg, num_users, num_items, num_training, num_clients, negatives,
                                                   shared, chunk),
               field, f"model.embed_dim={cfg.model.get('embed_dim')}, {num_users} users, {num_items} items, "
               f"{num_training} training ratings, task.pseudo_items={cfg.task.get('pseudo_items')}"
               + (f", task.train_negatives={negatives}" if implicit else "")
               + ("" if chunk is None else f", task.client_chunk={cfg.task.get('client_chunk')}"))


__all__ = ["available_memory", "bandit_memory_estimate", "bandit_sizes", "check_bandit", "check_data",
           "check_fits", "check_multi_agent", "check_recommendation", "largest_chunk", "multi_agent_memory_estimate",
           "recommendation_memory_estimate", "recommendation_sizes", "whole"]

"""Build a run from a composed Hydra config, train it, and write the run directory's results."""
from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fedrec.errors import ConfigError, DatasetNotFoundError, check_int
from fedrec.io import atomic_write, atomic_write_json


class PublicMetricsLogger:
    """A Lightning logger that never receives the metrics ``is_private`` flags (``logger.private_metrics=false``);
    it offers what :class:`~fedrec.trainer.FederatedTrainer` calls on a logger."""

    def __init__(self, logger: Any, is_private: Callable[[str], bool]) -> None:
        self.logger, self.is_private = logger, is_private

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.logger.log_metrics({k: v for k, v in metrics.items() if not self.is_private(k)}, step=step)

    def save(self) -> None:
        self.logger.save()

    def finalize(self, status: str) -> None:
        self.logger.finalize(status)


def logs_private_metrics(cfg: DictConfig) -> bool:
    """``logger.private_metrics``: whether metrics computed from clients' raw data are logged (default true)."""
    value = cfg.get("private_metrics", True)
    if not isinstance(value, bool):
        raise ConfigError(f"logger.private_metrics must be true or false, got {value!r}")
    return value


def build_loggers(cfg: DictConfig, out_dir: Path, is_private: Callable[[str], bool] | None = None) -> list[Any]:
    """Lightning's CSV logger (``metrics.csv`` in the run dir) and TensorBoard logger (``tb/``); with
    ``logger.private_metrics=false`` they never receive a metric ``is_private`` flags."""
    from lightning.fabric.loggers import CSVLogger, TensorBoardLogger

    loggers: list[Any] = []
    if cfg.get("csv", True):
        loggers.append(CSVLogger(root_dir=str(out_dir), name="", version=""))
    if cfg.get("tensorboard", True):
        loggers.append(TensorBoardLogger(root_dir=str(out_dir), name="", version="tb", default_hp_metric=False))
    if is_private is not None and not logs_private_metrics(cfg):
        loggers = [PublicMetricsLogger(lg, is_private) for lg in loggers]
    return loggers


def mark_private_metrics(summary: dict[str, Any], history: list[dict[str, float]],
                         is_private: Callable[[str], bool], logged: bool) -> dict[str, Any]:
    """``summary`` with ``private_metrics`` (the per-round metrics computed from clients' raw data) and
    ``private_metrics_logged``; without the fields derived from them if they are not ``logged``."""
    names = sorted({name for metrics in history for name in metrics if is_private(name)})
    kept = summary if logged else {k: v for k, v in summary.items() if not is_private(k)}
    return {**kept, "private_metrics": names, "private_metrics_logged": logged}


def _one_line(e: Exception) -> str:
    return re.sub(r"\s+", " ", str(e)).strip()


def _build(node: DictConfig, key: str, **kwargs: Any) -> Any:
    """Instantiate config ``node`` with ``kwargs``; errors name the config group ``key``."""
    try:  # partial first: Hydra would turn dataclass arguments (e.g. RatingData) into configs
        factory = instantiate(node, _partial_=True, _recursive_=False)
    except InstantiationException as e:
        raise ConfigError(f"{key}: {_one_line(e)}") from e
    try:
        return factory(**kwargs)
    except (ConfigError, DatasetNotFoundError) as e:
        raise type(e)(f"{key}: {e}") from e
    except TypeError as e:
        if "argument" not in str(e):  # not a bad or missing config key: a genuine error
            raise
        raise ConfigError(f"{key}: {e}") from e


def _policy_factory(node: DictConfig, dim: int, seed: int, key: str = "policy") -> Any:
    """A policy node as a factory for a protocol, checked by building one row (errors name ``key``)."""
    from fedrec.protocols.base import build_policy

    try:
        factory = instantiate(node, _partial_=True)
        build_policy(factory, dim, (), seed)
    except InstantiationException as e:
        raise ConfigError(f"{key}: {_one_line(e)}") from e
    except ConfigError as e:
        raise ConfigError(f"{key}: {str(e).removeprefix('policy: ')}") from e
    return factory


def _protocol_and_policy(cfg: DictConfig, dim: int) -> tuple[DictConfig, Any]:
    """The protocol node and its policy factory: the protocol's own ``policy`` node when it has one (the vertical
    protocols: VFUCB is LinUCB's, VFTS LinTS's), else the ``policy`` group."""
    node, policy, key = cfg.protocol, cfg.get("policy"), "policy"
    if "policy" in cfg.protocol:
        policy, key = cfg.protocol.policy, "protocol.policy"
        node = OmegaConf.masked_copy(cfg.protocol, [k for k in cfg.protocol if k != "policy"])
    return node, None if policy is None else _policy_factory(policy, dim, cfg.seed, key)


def _build_multi_agent(cfg: DictConfig) -> Any:
    """Every agent of a topology acts every round (``protocol=gossip_ucb|fed_ucb``); ``privacy=tree_laplace``
    gives Fed_UCB its ε and noise options."""
    env = _build(cfg.env, "env", replicates=cfg.replicates, seed=cfg.seed)
    topology = _build(cfg.topology, "topology")
    privacy: dict[str, Any] = {}
    if cfg.get("privacy") is not None:
        node = OmegaConf.to_container(cfg.privacy)
        if node.pop("mechanism", None) != "tree_laplace":
            raise ConfigError("privacy: a multi-agent protocol takes privacy=tree_laplace (or no privacy group)")
        privacy = node
    target = str(cfg.protocol.get("_target_"))
    if privacy and not target.endswith("FedUCB"):  # a protocol without noise is fine only at ε = ∞
        if not math.isinf(float(privacy["epsilon"])):
            raise ConfigError(f"privacy.epsilon: {target} adds no privacy noise, so it runs only at epsilon=inf; "
                              "use protocol=fed_ucb for a finite epsilon")
        privacy = {}
    horizon = check_int("task.steps", cfg.task.get("steps"))  # T is also the protocol's horizon (ε', eq. 12)
    protocol = _build(cfg.protocol, "protocol", topology=topology, num_arms=env.num_arms, horizon=horizon,
                      replicates=cfg.replicates, seed=cfg.seed, **privacy)
    return _build(cfg.task, "task", env=env, protocol=protocol)


def build_task(cfg: DictConfig) -> Any:
    """The task a config describes: a bandit task (``env`` + ``protocol``) or federated recommendation
    (``data`` + ``model`` + ``privacy`` + ``aggregator``)."""
    if cfg.get("topology") is not None:
        return _build_multi_agent(cfg)
    if cfg.get("data") is None:
        env = _build(cfg.env, "env", replicates=cfg.replicates, seed=cfg.seed)
        node, policy = _protocol_and_policy(cfg, env.dim)
        extra = {}
        if node.get("partition", "absent") is None and getattr(env, "partition", None) is not None:
            extra["partition"] = list(env.partition)  # a logged dataset's parties (fedrec.envs.replay)
        protocol = _build(node, "protocol", num_clients=env.num_clients, dim=env.dim, replicates=cfg.replicates,
                          policy=policy, seed=cfg.seed, **extra)
        return _build(cfg.task, "task", env=env, protocol=protocol)
    if cfg.replicates != 1:
        raise ConfigError(f"replicates: federated recommendation runs one replicate (got {cfg.replicates}); "
                          "sweep seeds with -m seed=0,1,2 instead")
    import torch

    data = _build(cfg.data, "data", seed=cfg.seed, rounds=cfg.task.rounds)
    torch.manual_seed(cfg.seed)  # model initialisation
    model = _build(cfg.model, "model", num_users=data.num_users, num_items=data.num_items)
    privacy = None
    if cfg.privacy.get("mechanism") != "none":
        privacy = _build(cfg.privacy, "privacy", num_clients=data.num_clients)
    aggregator = _build(cfg.aggregator, "aggregator")
    return _build(cfg.task, "task", data=data, model=model, aggregator=aggregator, privacy=privacy, seed=cfg.seed)


def run(cfg: DictConfig, output_dir: str | Path | None = None) -> dict[str, Any]:
    """Run the experiment described by ``cfg`` and return its summary.

    ``output_dir`` defaults to Hydra's run directory. The directory receives ``config_resolved.yaml``,
    ``metrics.csv``, TensorBoard events, ``summary.json``, checkpoints and PNG plots.
    """
    if output_dir is None:
        from hydra.core.hydra_config import HydraConfig

        output_dir = HydraConfig.get().runtime.output_dir
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if cfg.get("num_threads"):
        import torch

        torch.set_num_threads(int(cfg.num_threads))
    atomic_write(out / "config_resolved.yaml", lambda f: f.write(OmegaConf.to_yaml(cfg, resolve=True)), mode="w")

    from fedrec.trainer import FederatedTrainer

    task = build_task(cfg)
    is_private = getattr(task, "is_private_metric", None)  # tasks whose metrics may come from clients' raw data
    log_private = logs_private_metrics(cfg.logger)
    planner = _build(cfg.planner, "planner") if cfg.get("planner") is not None else None
    trainer = FederatedTrainer(
        default_root_dir=out, loggers=build_loggers(cfg.logger, out, is_private),
        callbacks=[planner] if planner else [], **OmegaConf.to_container(cfg.trainer),
    )
    history = trainer.fit(task, ckpt_path=cfg.get("ckpt_path"))
    summary = {
        "experiment": cfg.name,
        "seed": cfg.seed,
        **task.summary(),
        **(planner.summary() if planner else {}),
        "rounds_run": trainer.round,
        "wall_seconds": trainer.wall_seconds,
    }
    if is_private is not None:
        summary = mark_private_metrics(summary, history, is_private, log_private)
        if not log_private:
            history = [{k: v for k, v in metrics.items() if not is_private(k)} for metrics in history]
    atomic_write_json(out / "summary.json", summary)
    if cfg.get("plots", True) and history:
        from fedrec.plots import plot_run

        plot_run(history, out, title=str(cfg.name))
    return summary

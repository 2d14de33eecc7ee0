"""Build a run from a composed Hydra config, train it, and write the run directory's results."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fedrec.errors import ConfigError, DatasetNotFoundError
from fedrec.io import atomic_write, atomic_write_json


def build_loggers(cfg: DictConfig, out_dir: Path) -> list[Any]:
    """Lightning's CSV logger (``metrics.csv`` in the run dir) and TensorBoard logger (``tb/``)."""
    from lightning.fabric.loggers import CSVLogger, TensorBoardLogger

    loggers: list[Any] = []
    if cfg.get("csv", True):
        loggers.append(CSVLogger(root_dir=str(out_dir), name="", version=""))
    if cfg.get("tensorboard", True):
        loggers.append(TensorBoardLogger(root_dir=str(out_dir), name="", version="tb", default_hp_metric=False))
    return loggers


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


def _policy_factory(node: DictConfig, dim: int, seed: int) -> Any:
    """The ``policy`` group as a factory for a protocol, checked by building one row (errors name ``policy``)."""
    from fedrec.protocols.base import build_policy

    try:
        factory = instantiate(node, _partial_=True)
    except InstantiationException as e:
        raise ConfigError(f"policy: {_one_line(e)}") from e
    build_policy(factory, dim, (), seed)
    return factory


def build_task(cfg: DictConfig) -> Any:
    """The task a config describes: a bandit task (``env`` + ``protocol``) or federated recommendation
    (``data`` + ``model`` + ``privacy`` + ``aggregator``)."""
    if cfg.get("data") is None:
        env = _build(cfg.env, "env", replicates=cfg.replicates, seed=cfg.seed)
        policy = _policy_factory(cfg.policy, env.dim, cfg.seed) if cfg.get("policy") is not None else None
        protocol = _build(cfg.protocol, "protocol", num_clients=env.num_clients, dim=env.dim,
                          replicates=cfg.replicates, policy=policy, seed=cfg.seed)
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
    planner = _build(cfg.planner, "planner") if cfg.get("planner") is not None else None
    trainer = FederatedTrainer(
        default_root_dir=out, loggers=build_loggers(cfg.logger, out), callbacks=[planner] if planner else [],
        **OmegaConf.to_container(cfg.trainer),
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
    atomic_write_json(out / "summary.json", summary)
    if cfg.get("plots", True) and history:
        from fedrec.plots import plot_run

        plot_run(history, out, title=str(cfg.name))
    return summary

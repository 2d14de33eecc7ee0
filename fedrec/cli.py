"""Build a run from a composed Hydra config, train it, and write the run directory's results."""
from __future__ import annotations

import inspect
import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

import fedrec.resolvers  # noqa: F401  (registers ${by_conventions:...} before any config is resolved)
from fedrec.errors import ConfigError, DatasetNotFoundError, check_int
from fedrec.io import atomic_write, atomic_write_json, writing
from fedrec.run_folder import TB_EVENTS, output_errors, prepare_output_dir, resumes_in_place
from fedrec.trainer import Callback
from fedrec.trainer.distributed import check_distribution, check_shardable, launched_as_secondary

log = logging.getLogger(__name__)

#: top-level config keys that say how a run is executed, logged and written, not what it computes: a checkpoint's
#: identity leaves them out, so a resume may change them (e.g. trainer.max_rounds to run on)
RUN_SETTINGS = ("trainer", "logger", "plots", "hydra", "ckpt_path", "resume_allow_changes", "num_threads",
                "download_data")
#: keys, at any depth, that say where the inputs are rather than what they are (the dataset's sizes are checked)
LOCATION_KEYS = ("data_dir",)
#: the config groups a run cannot do without, by task kind (recommendation runs have a ``data`` group; without a
#: ``privacy`` group they are non-private, as with privacy=none)
REQUIRED_GROUPS = {
    "bandit": ("env", "protocol", "task", "trainer", "logger"),
    "recommendation": ("model", "aggregator", "task", "trainer", "logger"),
}


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
    from lightning_fabric.loggers import CSVLogger, TensorBoardLogger

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


def _accepts(node: DictConfig, key: str, argument: str) -> bool:
    """Whether the class that config ``node`` builds takes ``argument`` (errors name the config group ``key``)."""
    try:
        return argument in inspect.signature(get_class(str(node.get("_target_")))).parameters
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"{key}: cannot find the class {node.get('_target_')!r} ({e})") from e


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
        if not isinstance(policy, DictConfig) or "_target_" not in policy:
            raise ConfigError(f"protocol.policy: {cfg.protocol.get('_target_')} takes no policy node of its own "
                              f"(got {OmegaConf.to_container(policy) if isinstance(policy, DictConfig) else policy!r})")
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
        if _accepts(node, "protocol", "policy"):
            extra["policy"] = policy  # protocols with a pluggable local model (FCLUB's are their own)
        protocol = _build(node, "protocol", num_clients=env.num_clients, dim=env.dim, replicates=cfg.replicates,
                          seed=cfg.seed, **extra)
        return _build(cfg.task, "task", env=env, protocol=protocol)
    if cfg.replicates != 1:
        raise ConfigError(f"replicates: federated recommendation runs one replicate (got {cfg.replicates}); "
                          "sweep seeds with -m seed=0,1,2 instead")
    import torch

    data = _build(cfg.data, "data", seed=cfg.seed, rounds=cfg.task.rounds)
    torch.manual_seed(cfg.seed)  # model initialisation
    model = _build(cfg.model, "model", num_users=data.num_users, num_items=data.num_items)
    privacy = None
    if cfg.get("privacy") is not None and cfg.privacy.get("mechanism") != "none":
        privacy = _build(cfg.privacy, "privacy", num_clients=data.num_clients)
    aggregator = _build(cfg.aggregator, "aggregator")
    return _build(cfg.task, "task", data=data, model=model, aggregator=aggregator, privacy=privacy, seed=cfg.seed)


def identity_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config without run settings and input locations: what a run must share with the run whose
    checkpoint it resumes."""
    resolved = OmegaConf.to_container(cfg, resolve=True)
    return _without_locations({k: v for k, v in resolved.items() if k not in RUN_SETTINGS})


def _without_locations(node: Any) -> Any:
    """``node`` without the :data:`LOCATION_KEYS` of its dicts, at every depth."""
    if isinstance(node, dict):
        return {k: _without_locations(v) for k, v in node.items() if k not in LOCATION_KEYS}
    return node


def allowed_changes(cfg: DictConfig) -> list[str]:
    """``resume_allow_changes``: the fields a resume may change (a single name is taken as a list of one)."""
    value = cfg.get("resume_allow_changes") or []
    return [str(value)] if isinstance(value, str) else [str(v) for v in value]


class RunResults(Callback):
    """Writes ``summary.json`` and the plots once the rounds are done and before the final checkpoint, so that a
    failing checkpoint write (full disk) does not lose a finished run's results."""

    def __init__(self, cfg: DictConfig, out: Path, planner: Any, is_private: Callable[[str], bool] | None,
                 title: str) -> None:
        self.cfg, self.out, self.planner, self.is_private, self.title = cfg, out, planner, is_private, title
        self.summary: dict[str, Any] = {}

    def on_fit_end(self, trainer: Any, task: Any) -> None:
        """Summarise the run, then write ``summary.json`` and its plots (rank 0 of a multi-process run)."""
        cfg, history = self.cfg, trainer.history
        summary = {
            "experiment": cfg.name,
            "seed": cfg.seed,
            **task.summary(),
            **(self.planner.summary() if self.planner else {}),
            "rounds_run": trainer.round,
            "wall_seconds": trainer.wall_seconds,
        }
        if self.is_private is not None:
            log_private = logs_private_metrics(cfg.logger)
            summary = mark_private_metrics(summary, history, self.is_private, log_private)
            if not log_private:
                history = [{k: v for k, v in metrics.items() if not self.is_private(k)} for metrics in history]
        self.summary = summary
        if not trainer.is_global_zero:
            return
        atomic_write_json(self.out / "summary.json", summary)
        if cfg.get("plots", True) and history:
            from fedrec.plots import plot_run

            plot_run(history, self.out, title=self.title, rating_scale=summary.get("rating_scale"))


def _clear_tensorboard(out: Path) -> None:
    """Remove the TensorBoard events of the run a resume continues in ``out``: the resume logs the checkpoint's
    history again, so keeping them would show every round up to the crash twice."""
    events = sorted(out.glob(TB_EVENTS))
    with writing(f"{out / 'tb'} (removing the events logged before the resume)"):
        for f in events:
            f.unlink()
    if events:
        log.info("resuming in %s: TensorBoard events rewritten from the checkpoint's history", out)


def _detach_log_files() -> None:
    """Close and remove the root logger's file handlers (Hydra's ``<job>.log``): a secondary rank logs to the
    console only, and its delayed file handler never creates the file."""
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler)]:
        root.removeHandler(handler)
        handler.close()


def _whole(value: Any) -> bool:
    """Whether a config value is an integer (not a bool, a float or a string)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_run_fields(cfg: DictConfig) -> None:
    """The top-level fields and the groups that fit the task kind, before anything runs (errors name the field):
    bandit runs (``env``) take no ``data``, and a ``privacy`` group only with a ``topology`` (Fed_UCB; FCLUB's
    privacy is ``protocol.epsilon``); recommendation runs (``data``) take no ``env`` or ``protocol``."""
    seed = cfg.get("seed")
    if not _whole(seed) or seed < 0:
        raise ConfigError(f"seed: must be an integer >= 0, got {seed!r}")
    threads = cfg.get("num_threads")
    if threads is not None and (not _whole(threads) or threads < 1):
        raise ConfigError(f"num_threads: must be an integer >= 1 or null, got {threads!r}")
    if cfg.get("data") is not None:
        for group in ("env", "protocol"):
            if cfg.get(group) is not None:
                raise ConfigError(f"data: a run takes either a dataset (data=, recommendation) or env and protocol "
                                  f"(bandits), got data={cfg.data.get('name', '…')} and a {group} group")
    elif cfg.get("privacy") is not None and cfg.get("topology") is None:
        mechanism = cfg.privacy.get("mechanism") if isinstance(cfg.privacy, DictConfig) else cfg.privacy
        if mechanism != "none":
            raise ConfigError(f"privacy: {mechanism} applies to recommendation runs (data=...) and to decentralised "
                              "protocols (privacy=tree_laplace with a topology); bandit protocols here take none "
                              "(CDP-FCLUB-DC: protocol.epsilon)")


def check_groups(cfg: DictConfig) -> None:
    """The config groups the run's kind needs are there (not removed with ``~env``, ``~model``, ...) and
    ``download_data`` is a flag, before anything runs (errors name the group or field)."""
    kind = "recommendation" if cfg.get("data") is not None else "bandit"
    for group in REQUIRED_GROUPS[kind]:
        if cfg.get(group) is None:
            what = "a recommendation run (data=...)" if kind == "recommendation" else "a bandit run (no data group)"
            raise ConfigError(f"{group}: {what} needs the {group} group ({group}=NAME, a file of conf/{group}/)")
    if not isinstance(cfg.get("download_data", False), bool):
        raise ConfigError(f"download_data: must be true or false, got {cfg.download_data!r}")


def run_dataset(cfg: DictConfig) -> tuple[str, str, Path] | None:
    """(config group, name, data directory) of the downloadable dataset the run reads (:mod:`fedrec.data.download`):
    its ``data`` group's, or the ``dataset`` its environment's class declares; None for other runs."""
    from fedrec.data.download import REGISTRY

    key = "data" if cfg.get("data") is not None else "env"
    node = cfg.get(key)
    if key == "data":
        name = node.get("name")
    else:
        target = node.get("_target_")
        name = None if target is None else getattr(get_class(str(target)), "dataset", None)
    if name not in REGISTRY or node.get("data_dir") is None:
        return None
    return key, str(name), Path(str(node.data_dir))


def build_task_fetching_data(cfg: DictConfig) -> Any:
    """:func:`build_task`; if the dataset it reads is missing, download it first with ``download_data=true`` (a
    message and a progress bar on stderr), else raise a DatasetNotFoundError naming the flag and the download command.
    A failed download is a DatasetNotFoundError too (the run cannot get its data), naming the config group."""
    try:
        return build_task(cfg)
    except DatasetNotFoundError:
        from fedrec.data.download import DownloadError, ensure_dataset, missing_files

        dataset = run_dataset(cfg)
        if dataset is None or not missing_files(*dataset[1:]):  # another file is missing: the loader's message
            raise
        key, name, data_dir = dataset
        try:
            ensure_dataset(name, data_dir, download=cfg.get("download_data", False))
        except (DatasetNotFoundError, DownloadError) as e:
            raise DatasetNotFoundError(f"{key}: {e}") from e
    return build_task(cfg)


def run_title(name: str, overrides: Sequence[str]) -> str:
    """The plots' title: the run's name, and on a second line the command-line overrides that change what it
    computes (not those of :data:`RUN_SETTINGS` or :data:`LOCATION_KEYS`: how it runs, where its inputs are)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    noise = (*RUN_SETTINGS, *LOCATION_KEYS)
    kept = [o.input_line for o in OverridesParser.create().parse_overrides(list(overrides))
            if re.split(r"[./]", o.key_or_group)[0] not in noise]
    return "\n".join([name, " ".join(kept)]) if kept else name


def run(cfg: DictConfig, output_dir: str | Path | None = None) -> dict[str, Any]:
    """Run the experiment described by ``cfg`` and return its summary.

    ``output_dir`` defaults to Hydra's run directory. The directory receives ``config_resolved.yaml``,
    ``metrics.csv``, TensorBoard events, ``summary.json``, PNG plots and checkpoints (written last). A folder that
    holds another run is refused; a resume from a checkpoint inside ``output_dir`` continues that run there.
    """
    from hydra.core.hydra_config import HydraConfig

    check_run_fields(cfg)
    check_groups(cfg)
    if output_dir is None:
        output_dir = HydraConfig.get().runtime.output_dir
    out = Path(output_dir)
    ckpt_path = cfg.get("ckpt_path")
    secondary = launched_as_secondary()  # a secondary rank of a multi-process run writes nothing
    if secondary:
        _detach_log_files()
    else:
        prepare_output_dir(out, ckpt_path)
    from fedrec.threads import torch_threads
    from fedrec.trainer import FederatedTrainer

    tr = cfg.trainer
    devices = check_distribution(tr.get("accelerator", "cpu"), tr.get("devices", 1), tr.get("strategy", "auto"))[1]
    with torch_threads(cfg.get("num_threads")):  # the build (data, environment, model) as the rounds
        task = build_task_fetching_data(cfg)
    check_shardable(task, devices)  # before launching any process
    is_private = getattr(task, "is_private_metric", None)  # tasks whose metrics may come from clients' raw data
    planner = _build(cfg.planner, "planner") if cfg.get("planner") is not None else None
    overrides = HydraConfig.get().overrides.task if HydraConfig.initialized() else []  # none without Hydra's CLI
    results = RunResults(cfg, out, planner, is_private, run_title(str(cfg.name), overrides))
    trainer = FederatedTrainer(
        default_root_dir=out, loggers=[] if secondary else build_loggers(cfg.logger, out, is_private),
        callbacks=[planner, results] if planner else [results], run_config=identity_config(cfg),
        allow_changes=allowed_changes(cfg), num_threads=cfg.get("num_threads"),
        **OmegaConf.to_container(cfg.trainer),
    )
    try:
        if ckpt_path is not None:  # before writing anything: a checkpoint of another run is refused
            trainer.restore(task, ckpt_path)
        with output_errors():
            if trainer.is_global_zero:
                if resumes_in_place(out, ckpt_path) and cfg.logger.get("tensorboard", True):
                    _clear_tensorboard(out)
                atomic_write(out / "config_resolved.yaml",
                             lambda f: f.write(OmegaConf.to_yaml(cfg, resolve=True)), mode="w")
            trainer.fit(task)
    finally:
        trainer.collective.close()  # a sweep's next job in this process starts its own processes
    return results.summary

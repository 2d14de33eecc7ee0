"""Run a composed Hydra config: check its fields, build its task (:mod:`fedrec.build`), train it, and write the run
directory's results."""
from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from fedrec.build import build_task_fetching_data, check_groups, check_used, instantiate_group
from fedrec.data.integrity import recording
from fedrec.errors import ConfigError
from fedrec.io import atomic_write, atomic_write_json, writing
from fedrec.run_folder import TB_EVENTS, claimed, output_errors, resumes_in_place
from fedrec.trainer import Callback
from fedrec.trainer.distributed import check_distribution, check_shardable, launched_as_secondary

log = logging.getLogger(__name__)

#: top-level config keys that say how a run is executed, logged and written, not what it computes: a checkpoint's
#: identity leaves them out, so a resume may change them (e.g. trainer.max_rounds to run on)
RUN_SETTINGS = ("trainer", "logger", "plots", "hydra", "ckpt_path", "resume_allow_changes", "num_threads",
                "download_data", "quick", "quick_recipe", "max_memory_gb")
#: keys, at any depth, that say where the inputs are rather than what they are (the dataset's sizes are checked)
LOCATION_KEYS = ("data_dir",)
#: what a resume can never change: the seed, and the digests of the dataset files the run read (``data_files``)
IDENTITY = ("seed", "data_files")
#: the config groups every run needs (the task kind's own groups are checked by :func:`fedrec.build.check_groups`)
RUN_GROUPS = ("task", "trainer", "logger")


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
    """``resume_allow_changes``: the fields a resume may change (a single name is taken as a list of one); the
    :data:`IDENTITY` fields are refused, since a run resumed under another one would report numbers it did not
    compute."""
    value = cfg.get("resume_allow_changes") or []
    names = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, ListConfig)) else None
    if names is None or not all(isinstance(n, str) for n in names):
        raise ConfigError(f"resume_allow_changes: must be a list of dotted field names, got {value!r}")
    fixed = [n for n in names if n.split(".")[0] in IDENTITY]
    if fixed:
        raise ConfigError(f"resume_allow_changes: {fixed[0]} is part of what the run is and cannot change on a resume "
                          f"({', '.join(IDENTITY)}); start a new run instead")
    return names


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
    """The top-level fields and the groups every run needs, before anything runs (errors name the field); the
    groups of the task's kind are checked by :func:`fedrec.build.check_groups`."""
    seed = cfg.get("seed")
    if not _whole(seed) or seed < 0:
        raise ConfigError(f"seed: must be an integer >= 0, got {seed!r}")
    threads = cfg.get("num_threads")
    if threads is not None and (not _whole(threads) or threads < 1):
        raise ConfigError(f"num_threads: must be an integer >= 1 or null, got {threads!r}")
    if not isinstance(cfg.get("download_data", False), bool):
        raise ConfigError(f"download_data: must be true or false, got {cfg.download_data!r}")
    for group in RUN_GROUPS:
        if cfg.get(group) is None:
            raise ConfigError(f"{group}: a run needs the {group} group ({group}=NAME, a file of conf/{group}/)")
    check_groups(cfg)


def check_sweep_job(cfg: DictConfig, overrides: Sequence[str]) -> None:
    """A sweep job's own overrides against its own schema, and none for a group the run does not use: ``train.py``
    checked the command line before Hydra composed it, each sweep at its first value, and the jobs of a sweep over
    groups differ in what they declare and use."""
    from fedrec import schema

    check_used(cfg, schema.touched_groups(schema.check_job(overrides)))


def resume_command(checkpoint: Path) -> str:
    """The command that resumes the Hydra job running now from ``checkpoint``, in its own folder."""
    from hydra.core.hydra_config import HydraConfig

    hydra = HydraConfig.get()
    kept = [o for o in hydra.overrides.task if not o.startswith(("ckpt_path=", "hydra.run.dir="))]
    return shlex.join(["python", "train.py", *kept, f"ckpt_path={checkpoint}",
                       f"hydra.run.dir={hydra.runtime.output_dir}"])


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
    from hydra.types import RunMode

    check_run_fields(cfg)
    overrides = HydraConfig.get().overrides.task if HydraConfig.initialized() else []  # none without Hydra's CLI
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        check_sweep_job(cfg, overrides)
    if output_dir is None:
        output_dir = HydraConfig.get().runtime.output_dir
    out = Path(output_dir)
    secondary = launched_as_secondary()  # a secondary rank of a multi-process run writes nothing
    if secondary:
        _detach_log_files()
        return _run(cfg, out, overrides, secondary)
    with claimed(out, cfg.get("ckpt_path")):
        return _run(cfg, out, overrides, secondary)


def _run(cfg: DictConfig, out: Path, overrides: Sequence[str], secondary: bool) -> dict[str, Any]:
    """:func:`run` once the run folder is claimed (or, on a secondary rank, not written at all)."""
    ckpt_path = cfg.get("ckpt_path")
    from fedrec.threads import torch_threads
    from fedrec.trainer import FederatedTrainer

    tr = cfg.trainer
    devices = check_distribution(tr.get("accelerator", "cpu"), tr.get("devices", 1), tr.get("strategy", "auto"))[1]
    with torch_threads(cfg.get("num_threads")), recording() as data_files:  # the build threads as the rounds
        task = build_task_fetching_data(cfg)
    check_shardable(task, devices)  # before launching any process
    is_private = getattr(task, "is_private_metric", None)  # tasks whose metrics may come from clients' raw data
    planner = instantiate_group(cfg.planner, "planner") if cfg.get("planner") is not None else None
    results = RunResults(cfg, out, planner, is_private, run_title(str(cfg.name), overrides))
    trainer = FederatedTrainer(
        default_root_dir=out, loggers=[] if secondary else build_loggers(cfg.logger, out, is_private),
        callbacks=[planner, results] if planner else [results],
        run_config={**identity_config(cfg), "data_files": dict(sorted(data_files.items()))},
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

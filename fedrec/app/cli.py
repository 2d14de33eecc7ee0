"""Run a composed Hydra config: check its fields, build its task (:mod:`fedrec.app.build`), train it, and write the run
directory's results."""
from __future__ import annotations

import contextlib
import csv
import inspect
import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning_fabric.loggers import CSVLogger
from lightning_fabric.loggers.csv_logs import _ExperimentWriter
from lightning_fabric.loggers.logger import rank_zero_experiment
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict, read_write

from fedrec.app.build import (
    build_task_fetching_data,
    check_groups,
    check_ignored,
    check_used,
    group_target,
    instantiate_group,
    one_line,
)
from fedrec.app.run_folder import (
    RUN_OUTPUTS,
    TB_EVENTS,
    OutputError,
    claimed,
    output_errors,
    resumes_in_place,
    run_outputs,
)
from fedrec.data.integrity import recording
from fedrec.errors import ConfigError
from fedrec.trainer import Callback
from fedrec.trainer.callbacks import RunningTask, RunningTrainer
from fedrec.trainer.checkpoint import IDENTITY, config_differences, listed
from fedrec.trainer.distributed import check_distribution, check_shardable, launched_as_secondary
from fedrec.trainer.trainer import logs_of
from fedrec.utils.commands import python_command
from fedrec.utils.io import atomic_write, atomic_write_json, writing
from fedrec.utils.jit import compile_notice
from fedrec.utils.stop_request import STOP_FILE

log = logging.getLogger(__name__)

#: top-level config keys that say how a run is executed, logged and written, not what it computes: a checkpoint's
#: identity leaves them out, so a resume may change them (e.g. trainer.max_rounds to run on)
RUN_SETTINGS = ("trainer", "logger", "plots", "hydra", "ckpt_path", "resume_allow_changes", "num_threads",
                "download_data", "quick", "quick_recipe", "max_memory_gb", "sweep")
#: keys, at any depth, that say where the inputs are rather than what they are (the dataset's sizes are checked)
LOCATION_KEYS = ("data_dir",)
#: the config groups every run needs (the task kind's own groups are checked by :func:`fedrec.app.build.check_groups`)
RUN_GROUPS = ("task", "trainer", "logger")
#: the namespace of the run's headline among a logger's metrics (beside the per-round curves of the same names)
SUMMARY_PREFIX = "summary/"


class _AtomicMetricsWriter(_ExperimentWriter):
    """Lightning's ``metrics.csv`` writer, except that the rewrite a new column forces replaces the file atomically:
    a run killed during it keeps the rows written before (Lightning rewrites the file in place)."""

    def _rewrite_with_new_header(self, fieldnames: list[str]) -> None:
        with open(self.metrics_file_path, newline="") as f:
            rows = list(csv.DictReader(f))

        def write(f: Any) -> None:
            writer = csv.DictWriter(f, fieldnames=fieldnames)
            writer.writeheader()
            writer.writerows(rows)

        atomic_write(self.metrics_file_path, write, mode="w")


class MetricsCSVLogger(CSVLogger):
    """Lightning's CSV logger writing through :class:`_AtomicMetricsWriter` (the same bytes, made when first
    used, as Lightning's)."""

    @property
    @rank_zero_experiment
    def experiment(self) -> _ExperimentWriter:
        if self._experiment is None:
            os.makedirs(self._root_dir, exist_ok=True)
            self._experiment = _AtomicMetricsWriter(log_dir=self.log_dir)
        return self._experiment


class PublicMetricsLogger:
    """A Lightning logger that never receives the metrics ``is_private`` flags (``logger.private_metrics=false``);
    it offers what :class:`~fedrec.trainer.FederatedTrainer` calls on a logger."""

    def __init__(self, logger: Any, is_private: Callable[[str], bool]) -> None:
        self.logger, self.is_private = logger, is_private

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        self.logger.log_metrics({k: v for k, v in metrics.items() if not self.is_private(k)}, step=step)

    def log_hyperparams(self, params: Mapping[str, Any], metrics: Mapping[str, float] | None = None) -> None:
        """The hyper-parameters, with those ``metrics`` that are not private (judged by the name after any
        ``summary/`` namespace)."""
        if metrics is None:
            self.logger.log_hyperparams(params)
        else:
            self.logger.log_hyperparams(params, metrics={k: v for k, v in metrics.items()
                                                         if not self.is_private(k.rsplit("/", 1)[-1])})

    def save(self) -> None:
        self.logger.save()

    def finalize(self, status: str) -> None:
        self.logger.finalize(status)

    @property
    def log_dir(self) -> str | None:
        """The wrapped logger's folder, which a failed write names (:func:`~fedrec.trainer.trainer.logs_of`)."""
        return getattr(self.logger, "log_dir", None)


def logs_private_metrics(cfg: DictConfig) -> bool:
    """``logger.private_metrics``: whether metrics computed from clients' raw data are logged (default true)."""
    value = cfg.get("private_metrics", True)
    if not isinstance(value, bool):
        raise ConfigError(f"logger.private_metrics must be true or false, got {value!r}")
    return value


def build_loggers(cfg: DictConfig, out_dir: Path, is_private: Callable[[str], bool] | None = None,
                  run_name: str | None = None) -> list[Any]:
    """Lightning's CSV logger (``metrics.csv`` in the run dir, :class:`MetricsCSVLogger`), TensorBoard logger
    (``tb/``, ``tb/RUN_NAME/`` for a named run) and the loggers ``logger.extra`` lists (e.g. MLflow, W&B); with
    ``logger.private_metrics=false`` none of them receives a metric ``is_private`` flags."""
    from lightning_fabric.loggers import TensorBoardLogger

    loggers: list[Any] = []
    if cfg.get("csv", True):
        loggers.append(MetricsCSVLogger(root_dir=str(out_dir), name="", version=""))
    if cfg.get("tensorboard", True):
        sub_dir = None if run_name is None else run_name.replace(os.sep, "_")
        loggers.append(TensorBoardLogger(root_dir=str(out_dir), name="", version="tb", sub_dir=sub_dir,
                                         default_hp_metric=False))
    loggers += build_entries(cfg.get("extra"), "logger.extra", _check_logger,
                             missing="the MLflow and W&B loggers come with pip install -e '.[mlflow]' or '.[wandb]'")
    if is_private is not None and not logs_private_metrics(cfg):
        loggers = [PublicMetricsLogger(lg, is_private) for lg in loggers]
    return loggers


def _check_logger(obj: Any, where: str) -> None:
    """A ``logger.extra`` entry must offer what the trainer and :class:`LoggedHyperparameters` call on a logger."""
    lacking = [m for m in ("log_metrics", "log_hyperparams", "save", "finalize") if not callable(getattr(obj, m, None))]
    if lacking:
        raise ConfigError(f"{where}: {type(obj).__qualname__} is not a Lightning logger (it has no "
                          f"{', '.join(lacking)})")


def _check_callback(obj: Any, where: str) -> None:
    """A ``callbacks`` entry must be a :class:`~fedrec.trainer.Callback` (it then receives every hook)."""
    if not isinstance(obj, Callback):
        raise ConfigError(f"{where}: {type(obj).__module__}.{type(obj).__qualname__} is not a subclass of "
                          "fedrec.trainer.Callback")
    obj.config_key = where


def build_entries(nodes: Any, key: str, check: Callable[[Any, str], None], missing: str = "") -> list[Any]:
    """The objects a config list of ``_target_`` entries builds (``callbacks``, ``logger.extra``), each passed to
    ``check`` with where it is declared; errors name the entry (``callbacks[1].patience: ...``), and one of a
    package that is not installed ends with the ``missing`` hint."""
    if nodes is None:
        return []
    if not isinstance(nodes, ListConfig):
        raise ConfigError(f"{key}: must be a list of {{_target_: CLASS, ...}} entries, got {_shown(nodes)}")
    built = []
    for i, node in enumerate(nodes):
        where = f"{key}[{i}]"
        if not isinstance(node, DictConfig) or not node.get("_target_"):
            raise ConfigError(f"{where}: must be {{_target_: CLASS, ...}} naming the class to build, got "
                              f"{_shown(node)}")
        hint = f"; {missing}" if missing else ""
        try:
            group_target(node, where)
        except ConfigError as e:
            raise ConfigError(f"{e}{hint}") from e
        try:
            obj = instantiate_group(node, where)
        except ConfigError as e:  # the class's own check of a field ("patience: ...") names it under the entry
            message = str(e).removeprefix(f"{where}: ")
            raise ConfigError(f"{where}.{message}" if re.match(r"\w+: ", message) else str(e)) from e
        except ImportError as e:  # e.g. a Lightning logger whose package is not installed
            raise ConfigError(f"{where}: {node._target_} needs a package that is not installed "
                              f"({one_line(e)}){hint}") from e
        check(obj, where)
        built.append(obj)
    return built


def _shown(node: Any) -> str:
    """A config value as an error shows it (plain Python, not OmegaConf's node types)."""
    return repr(OmegaConf.to_container(node) if isinstance(node, (DictConfig, ListConfig)) else node)


def run_name(cfg: DictConfig) -> str | None:
    """The name the loggers give the run (``cfg`` is the logger group): ``logger.run_name`` if set, else in a
    multirun job its values of the swept overrides (``seed=1,task.lr=0.1``, :func:`sweep_job_name`), else none: a
    single run keeps the loggers' own names and TensorBoard's ``tb/``."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    given = cfg.get("run_name")
    if given is not None:
        if not isinstance(given, str) or not given.strip():
            raise ConfigError(f"logger.run_name: must be a non-empty name or null, got {given!r}")
        return given
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    hydra = HydraConfig.get()
    sweep: list[str] = []
    with contextlib.suppress(OSError):  # Hydra's sweepers write it before the first job; another may not
        sweep = list(OmegaConf.load(Path(hydra.sweep.dir) / "multirun.yaml").hydra.overrides.task)
    return sweep_job_name(list(hydra.overrides.task), sweep) or hydra.job.override_dirname or None


def sweep_job_name(job: Sequence[str], sweep: Sequence[str]) -> str:
    """A multirun job's name: its values of the overrides that ``sweep`` (the multirun's command line) sweeps, in
    that order, in Hydra's ``override_dirname`` form (``seed=1,task.lr=0.1``); empty when it sweeps none."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    mine = {o.key_or_group: o for o in parser.parse_overrides(list(job))}
    swept = [o.key_or_group for o in parser.parse_overrides(list(sweep)) if o.is_sweep_override()]
    return ",".join(f"{mine[k].get_key_element()}={mine[k].get_value_element_as_str()}" for k in swept if k in mine)


def takes_metrics(logger: Any) -> bool:
    """Whether ``logger.log_hyperparams`` also takes the run's metrics (TensorBoard's: its HParams view lists a run
    only with them)."""
    inner = logger.logger if isinstance(logger, PublicMetricsLogger) else logger
    return "metrics" in inspect.signature(inner.log_hyperparams).parameters


def hyperparameters(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as one level of dotted keys (``task.lr``, ``callbacks.0.patience``, as the command line
    names them): how the loggers list hyper-parameters; a list of plain values stays one value."""
    def flat(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
        if isinstance(node, dict) and node:
            items: Any = node.items()
        elif isinstance(node, list) and any(isinstance(v, (dict, list)) for v in node):
            items = enumerate(node)
        else:
            yield prefix[:-1], node
            return
        for k, v in items:
            yield from flat(v, f"{prefix}{k}.")

    return dict(flat(OmegaConf.to_container(cfg, resolve=True), ""))


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
    # callbacks may change results (early stopping ends a run sooner), so they are part of what a run is; an empty
    # list is left out, so that a run without any has the identity it had before the list existed
    return _without_locations({k: v for k, v in resolved.items()
                               if k not in RUN_SETTINGS and not (k == "callbacks" and not v)})


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


class RunResults(Callback[RunningTask]):
    """Writes ``summary.json`` and the plots once the rounds are done and before the final checkpoint, so that a
    failing checkpoint write (full disk) does not lose a finished run's results."""

    def __init__(self, cfg: DictConfig, out: Path, planner: Any, is_private: Callable[[str], bool] | None,
                 title: str) -> None:
        self.cfg, self.out, self.planner, self.is_private, self.title = cfg, out, planner, is_private, title
        self.summary: dict[str, Any] = {}

    def on_fit_end(self, trainer: RunningTrainer, task: RunningTask) -> None:
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
            from fedrec.app.plots import plot_run

            plot_run(history, self.out, title=self.title, rating_scale=summary.get("rating_scale"))


class LoggedHyperparameters(Callback[RunningTask]):
    """Logs the run's resolved config as hyper-parameters (:func:`hyperparameters`) to every logger: at the start,
    and at the end to those that take metrics with them (TensorBoard's HParams view), with the run's rounds and
    headline as ``summary/NAME``. Fabric's CSV logger keeps none (``config_resolved.yaml`` holds them)."""

    def __init__(self, params: Mapping[str, Any], results: RunResults) -> None:
        self.params, self.results = dict(params), results

    def on_fit_start(self, trainer: RunningTrainer, task: RunningTask) -> None:
        for lg in trainer.loggers:
            if not takes_metrics(lg):
                with writing(logs_of(lg)), contextlib.suppress(NotImplementedError):
                    lg.log_hyperparams(self.params)

    def on_fit_end(self, trainer: RunningTrainer, task: RunningTask) -> None:
        """After :class:`RunResults` has summarised the run (its summary holds private metrics only if they are
        logged)."""
        from fedrec.app.sweeps import headline

        summary = self.results.summary
        metrics = {f"{SUMMARY_PREFIX}{k}": v for k, v in
                   {"rounds_run": float(summary["rounds_run"]), **headline(summary)}.items()}
        for lg in trainer.loggers:
            if takes_metrics(lg):
                with writing(logs_of(lg)):
                    lg.log_hyperparams(self.params, metrics=metrics)


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
    groups of the task's kind are checked by :func:`fedrec.app.build.check_groups`."""
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
    """A sweep job's own overrides against its own schema, none for a group or field the run does not use: ``train.py``
    checked the command line before Hydra composed it, each sweep at its first value, and the jobs of a sweep over
    groups differ in what they declare and use."""
    from fedrec.app import schema

    line = schema.check_job(overrides)
    check_used(cfg, schema.touched_groups(line))
    check_ignored(cfg, [str(o.key_or_group) for o in line.values])


def continue_sweep_job(cfg: DictConfig, out: Path) -> dict[str, Any] | None:
    """A sweep job whose folder holds a run of this job's configuration, as a rerun of an interrupted sweep finds
    it: the finished run's summary (kept, the job is not run again), or None after pointing ``ckpt_path`` at the
    run's checkpoint (the job continues from it) or, for a run stopped before its first checkpoint, after removing
    its logs (the job starts over). A run of another configuration is refused (:class:`OutputError` naming the
    fields); an empty folder is None."""
    found = run_outputs(out)
    if not found or cfg.get("ckpt_path") is not None:
        return None
    recorded = out / "config_resolved.yaml"
    if not recorded.is_file():
        raise OutputError(f"output: {out} holds a run ({', '.join(found)}) without its {recorded.name}, so it "
                          "cannot be told to be this job's; write this sweep to a new folder (hydra.sweep.dir=...)")
    differences = config_differences(identity_config(OmegaConf.load(recorded)), identity_config(cfg), recorded.name)
    if differences:
        raise OutputError(f"output: {out} holds a run of another configuration, differing in {listed(differences)}; "
                          "a rerun of a sweep continues only its own jobs: write this sweep to a new folder "
                          "(hydra.sweep.dir=...)")
    if "summary.json" in found:
        log.info("%s: finished before, its summary.json is kept (the job is not run again)", out)
        return json.loads((out / "summary.json").read_text())
    checkpoint = RUN_OUTPUTS[2]
    if checkpoint not in found:
        log.info("%s: starting the job over (its earlier run stopped before its first checkpoint)", out)
        with writing(f"{out} (removing the logs of the run that stopped before its first checkpoint)"):
            for f in [out / "metrics.csv", *out.glob(TB_EVENTS)]:
                f.unlink(missing_ok=True)
        return None
    from hydra.core.hydra_config import HydraConfig

    log.info("%s: continuing the job from its %s", out, checkpoint)
    with open_dict(cfg):
        cfg.ckpt_path = str(out / checkpoint)
    hydra = HydraConfig.get()
    with read_write(hydra.overrides):  # the command line of the run's other processes (trainer.devices >= 2)
        hydra.overrides.task.append(f"ckpt_path={cfg.ckpt_path}")
    return None


def resume_command(checkpoint: Path) -> str:
    """The command that resumes the Hydra job running now from ``checkpoint``, in its own folder."""
    from hydra.core.hydra_config import HydraConfig

    hydra = HydraConfig.get()
    kept = [o for o in hydra.overrides.task if not o.startswith(("ckpt_path=", "hydra.run.dir="))]
    return python_command("train.py", *kept, f"ckpt_path={checkpoint}", f"hydra.run.dir={hydra.runtime.output_dir}")


def finished_resume(ckpt: Path, rounds: int, total: int, out: Path) -> str:
    """The refusal of a resume, into another folder ``out``, of a run that has no round left: it would only copy
    the finished run there."""
    return (f"ckpt_path: {ckpt} holds a finished run ({rounds} rounds, of {total}), so the resume would run no round "
            f"and only copy its results into {out}; they are in {ckpt.parent.parent}. To run it on, lengthen it "
            "(e.g. task.rounds or task.steps, named in resume_allow_changes)")


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
    sweep = None
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        check_sweep_job(cfg, overrides)
        nodes = cfg.trainer.get("num_nodes", 1)
        if nodes != 1:  # every node would run the whole sweep, each writing its own sweep files
            raise ConfigError(f"trainer.num_nodes={nodes} in a sweep: a run on several nodes is one command started "
                              "on each node (torchrun, srun); run each of the sweep's jobs as its own command")
        sweep = Path(HydraConfig.get().sweep.dir)
    if output_dir is None:
        output_dir = HydraConfig.get().runtime.output_dir
    out = Path(output_dir)
    stop_file = None if sweep is None else sweep / STOP_FILE  # an interrupted sweep stops its running jobs
    secondary = launched_as_secondary()  # a secondary rank of a multi-process run writes nothing
    if secondary:
        _detach_log_files()
        return _run(cfg, out, overrides, secondary, stop_file)
    if sweep is not None:
        kept = continue_sweep_job(cfg, out)
        if kept is not None:
            return kept
    with claimed(out, cfg.get("ckpt_path")), compile_notice():  # rank 0 says that a first run compiles
        return _run(cfg, out, overrides, secondary, stop_file)


def _run(cfg: DictConfig, out: Path, overrides: Sequence[str], secondary: bool,
         stop_file: Path | None) -> dict[str, Any]:
    """:func:`run` once the run folder is claimed (or, on a secondary rank, not written at all)."""
    ckpt_path = cfg.get("ckpt_path")
    from fedrec.trainer import FederatedTrainer
    from fedrec.utils.threads import torch_threads

    tr = cfg.trainer
    _, devices, _, num_nodes = check_distribution(tr.get("accelerator", "cpu"), tr.get("devices", 1),
                                                  tr.get("strategy", "auto"), tr.get("num_nodes", 1))
    callbacks = build_entries(cfg.get("callbacks"), "callbacks", _check_callback)  # before the (slow) build
    name = run_name(cfg.logger)
    if name is not None and cfg.logger.get("run_name") is None:  # what ${logger.run_name} gives the extra loggers
        with open_dict(cfg.logger):
            cfg.logger.run_name = name
    with torch_threads(cfg.get("num_threads")), recording() as data_files:  # the build threads as the rounds
        task = build_task_fetching_data(cfg)
    check_shardable(task, devices, num_nodes)  # before launching any process
    is_private = getattr(task, "is_private_metric", None)  # tasks whose metrics may come from clients' raw data
    planner = instantiate_group(cfg.planner, "planner") if cfg.get("planner") is not None else None
    results = RunResults(cfg, out, planner, is_private, run_title(str(cfg.name), overrides))
    trainer = FederatedTrainer(
        default_root_dir=out, loggers=[] if secondary else build_loggers(cfg.logger, out, is_private, name),
        callbacks=[*([planner] if planner else []), *callbacks, results,
                   LoggedHyperparameters(hyperparameters(cfg), results)],
        run_config={**identity_config(cfg), "data_files": dict(sorted(data_files.items()))},
        allow_changes=allowed_changes(cfg), num_threads=cfg.get("num_threads"), stop_file=stop_file,
        **OmegaConf.to_container(cfg.trainer),
    )
    try:
        if ckpt_path is not None:  # before writing anything: a checkpoint of another run is refused
            trainer.restore(task, ckpt_path)
            if trainer.finished(task) and not resumes_in_place(out, ckpt_path):
                raise ConfigError(finished_resume(Path(str(ckpt_path)), trainer.round, trainer.total_rounds(task), out))
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

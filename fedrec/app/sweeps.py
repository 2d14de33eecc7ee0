"""What a run reports at its end, and what a multirun reports over its jobs (a Hydra callback and a command).

A run's *headline* is its task's main result: regret (bandits), relative CTR (replay), normalised reward (the
real-data streams of Async-LinUCB) or the final test RMSE (recommendation), with communication and ε where the task
has them. ``train.py`` prints it and returns the first value as the sweep objective. :class:`SweepSummary` reads
every job folder of a multirun when it ends, whatever launcher ran the jobs, and writes into the sweep folder:

* ``summary.csv`` (one row per job: its overrides, status and the metrics of ``sweep.metrics``, by default its
  headline) and ``summary.md`` (their mean ± std over seeds of each setting); the failed jobs are listed with their
  errors;
* ``runs.csv``, one row per job: ``job`` (its folder), one column per command-line override (``attack.fraction``,
  ``seed``: the key names the column, the value is the cell), ``status`` (``ok`` or the job's error line), then
  every key of its ``summary.json`` (a nested dict's keys dotted, a list as JSON text; a key that is also an
  override's is ``summary.KEY``);
* ``rounds.csv``: the ``metrics.csv`` of every finished job (one row per logged round) behind its ``job`` and
  override columns.

A sweep stops on SIGINT or SIGTERM (:class:`StopOnSignal`): each running job saves its checkpoint after its round, no
other job starts, and the sweep ends with the command that continues it; run again into its folder, a sweep keeps its
finished jobs, continues the interrupted ones from their checkpoints and runs the others (``fedrec.app.cli.run``).

``python -m fedrec.app.sweeps SWEEP_DIR --metric M --rows KEY --columns KEY`` pivots ``runs.csv`` into a table of mean ±
std over seeds (:func:`pivot`); a swept key on neither rows nor columns is refused rather than pooled as seeds.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import statistics
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from hydra.experimental.callback import Callback as HydraCallback
from omegaconf import DictConfig, ListConfig, OmegaConf

from fedrec.errors import STOP_SIGNALS, ConfigError, Interrupted, did_you_mean, run_script
from fedrec.utils.commands import python_command
from fedrec.utils.io import WriteError, atomic_write
from fedrec.utils.stop_request import STOP_FILE, request_stop, requested_stop

#: the main result of each task kind, in order of preference (the first present is the sweep objective): on real
#: click data the papers' metric, the reward relative to a random policy (bandit runs) or the replayed CTR relative to
#: it (logged streams), else the cumulative regret (synthetic worlds), the final test RMSE (recommendation from
#: ratings) or the final test NDCG@10 (top-K recommendation from implicit feedback, which has no RMSE)
PRIMARY = ("normalized_reward", "relative_ctr", "cumulative_regret", "final_test_rmse", "final_test_ndcg@10")
#: reported beside it when present
SECONDARY = ("cumulative_regret", "comm_messages", "epsilon_spent", "ari", "best_test_rmse", "best_test_f1",
             "final_test_hr@10")
#: a failed job's error line in its log (train.py logs it there as well as on the terminal)
ERROR_PREFIX = "error: "
#: the sweep's tables of every job and of every job's rounds
RUNS, ROUNDS = "runs.csv", "rounds.csv"
#: the overrides whose jobs :func:`pivot` pools into one mean ± std: replicates of the same setting
POOLED = ("seed",)
#: a job folder's error line from the latest run of its job, which failed: the job counts as failed even when the
#: folder holds a summary.json (another configuration's run, which the job refused to continue)
JOB_ERROR = ".fedrec.error"


def headline(summary: dict[str, Any]) -> dict[str, float]:
    """The run's main result first, then the secondary numbers it has (a null one, e.g. the ε of a non-private
    run, is left out)."""
    main = [k for k in PRIMARY if summary.get(k) is not None][:1]
    return {k: float(summary[k]) for k in (*main, *(k for k in SECONDARY if summary.get(k) is not None))}


def objective(summary: dict[str, Any]) -> float:
    """The sweep objective of a run, the number an optimising sweeper (``hydra/sweeper=optuna``) minimises or
    maximises: the validation metric at the selected round (``selected_<task.select_on>``) when the run has a
    validation split, so that a search never tunes on the test set; else its main result (NaN when none)."""
    selected = f"selected_{summary.get('selected_on')}"
    if selected in summary:
        return float(summary[selected])
    values = headline(summary)
    return next(iter(values.values())) if values else math.nan


def describe(out: Path, summary: dict[str, Any]) -> str:
    """One line for the terminal: where the run wrote, and its headline."""
    numbers = ", ".join(f"{k} = {v:.6g}" for k, v in headline(summary).items())
    return f"run folder: {out}" + (f"; {numbers}" if numbers else "")


@dataclass(frozen=True)
class Job:
    """One job folder of a sweep: its name (the folder relative to the sweep), command-line overrides, summary
    (None when the job did not finish) and status (``ok``, or the error line it logged)."""

    name: str
    folder: Path
    overrides: list[str]
    summary: dict[str, Any] | None
    status: str


class StopOnSignal:
    """The SIGINT and SIGTERM handler of a sweep's processes outside its jobs' rounds (the trainer takes them there,
    then the job asks the same): the first signal asks every job of the sweep to stop (its stop file,
    :mod:`fedrec.utils.stop_request`), so that a running job saves after its round and a job not started does not start.
    In the process that launched the sweep (given the ``command`` that continues it) a second signal stops it at
    once (:class:`~fedrec.errors.Interrupted`: a launcher ends its worker processes without their round); in a
    worker process nothing raises, as an exception there would end the sweep at once."""

    def __init__(self, sweep: Path, command: str | None) -> None:
        self.sweep, self.command, self.received = sweep, command, False
        self.previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}

    def __call__(self, signum: int, frame: object) -> None:
        if self.received and self.command is not None:
            raise Interrupted(signum, f"{signal.Signals(signum).name} again: the sweep stopped at once, its running "
                                      "jobs without saving their round (the checkpoints written before are kept); "
                                      f"continue it with: {self.command}")
        self.received = True
        request_stop(self.sweep / STOP_FILE, signum)

    @classmethod
    def install(cls, sweep: Path, command: str | None = None) -> None:
        """Take SIGINT and SIGTERM in this process for sweep folder ``sweep``, unless it already does (a job that
        runs in the process that launched its sweep); only the main thread can."""
        taken = isinstance(signal.getsignal(STOP_SIGNALS[0]), cls)
        if not taken and threading.current_thread() is threading.main_thread():
            handler = cls(sweep, command)
            for s in STOP_SIGNALS:
                signal.signal(s, handler)

    @classmethod
    def uninstall(cls) -> None:
        """Give SIGINT and SIGTERM back to the handlers they had before :meth:`install`."""
        handler = signal.getsignal(STOP_SIGNALS[0])
        if isinstance(handler, cls) and threading.current_thread() is threading.main_thread():
            for s, previous in handler.previous.items():
                signal.signal(s, previous)


def continue_command(config: DictConfig) -> str:
    """The command that continues the sweep of ``config`` in its folder: its command line, ``hydra.sweep.dir``
    set."""
    hydra = config.hydra
    own = [o for o in hydra.overrides.hydra if not o.startswith(("hydra.sweep.dir=", "hydra.mode="))]
    return python_command("train.py", "-m", *hydra.overrides.task, *own, f"hydra.sweep.dir={hydra.sweep.dir}")


class SweepSummary(HydraCallback):
    """Hydra callback (``hydra.callbacks`` in conf/config.yaml): while a multirun runs, stop it on a signal
    (:class:`StopOnSignal`); after it, write the sweep's tables, or say how to continue a stopped one."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Check ``sweep.metrics`` before any job runs: a bad value is ``error: sweep.metrics ...`` (exit code 2);
        then remove the stop request of an earlier run of the sweep and take the signals."""
        try:
            chosen_metrics(config)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        sweep = Path(config.hydra.sweep.dir)
        (sweep / STOP_FILE).unlink(missing_ok=True)
        StopOnSignal.install(sweep, continue_command(config))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Write the tables from the job folders, warn of a chosen metric no job has, list the failed jobs (exit
        code 2 when there are any, or when a table cannot be written: ``error: output: ...``, not Hydra's warning).
        A sweep that was asked to stop is one ``interrupted:`` line with the command that continues it (exit code
        128 + the signal's number)."""
        StopOnSignal.uninstall()
        sweep = Path(config.hydra.sweep.dir)
        jobs = read_jobs(sweep)
        signum = requested_stop(sweep / STOP_FILE)
        if signum is not None:
            (sweep / STOP_FILE).unlink()
            done = sum(job.status == "ok" for job in jobs)
            print(f"interrupted: {signal.Signals(signum).name}: the sweep stopped with {done} of {len(jobs)} jobs "
                  "finished (each job that was running saved its checkpoint); continue it with: "
                  f"{continue_command(config)}", file=sys.stderr)
            raise SystemExit(128 + signum)
        if not jobs:
            return
        metrics = chosen_metrics(config)
        try:
            write_summary(sweep, summary_rows(jobs, metrics))
            write_runs(sweep, jobs)
        except WriteError as e:
            print(f"error: output: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        for name in missing_metrics(jobs, metrics or []):
            keys = {k for job in jobs for k in job.summary or {}}
            print(f"warning: sweep.metrics: no finished job's summary.json has a number named {name!r}"
                  f"{did_you_mean(name, keys)}; summary.csv and summary.md leave it out", file=sys.stderr)
        failed = [job for job in jobs if job.status != "ok"]
        for job in failed:
            print(f"failed job {job.name} ({' '.join(job.overrides)}): {job.status}", file=sys.stderr)
        print(f"sweep: {len(jobs) - len(failed)} of {len(jobs)} jobs finished; {sweep / 'summary.csv'} "
              f"({RUNS} and {ROUNDS} beside it)", file=sys.stderr)
        if failed:
            raise SystemExit(2)


def chosen_metrics(config: DictConfig) -> list[str] | None:
    """``sweep.metrics``: the summary.json keys that summary.csv and summary.md report (None: each job's
    headline); anything but null or a non-empty list of names is a :class:`ConfigError` naming the field."""
    metrics = OmegaConf.select(config, "sweep.metrics", default=None)
    if metrics is None:
        return None
    value = OmegaConf.to_container(metrics) if isinstance(metrics, ListConfig) else metrics
    if not isinstance(value, list) or not value or not all(isinstance(m, str) for m in value):
        raise ConfigError("sweep.metrics must be null (each job's headline) or a non-empty list of summary.json "
                          f"keys, e.g. [final_test_benign_rmse,final_test_rmse], got {value!r}")
    return list(dict.fromkeys(value))


def job_folders(sweep: Path) -> list[Path]:
    """The job folders of a sweep (those with a ``.hydra/overrides.yaml``), in job order: numbered folders by
    number (2 before 10), others by name. A launcher's own files (e.g. submitit's ``.submitit/``) are no job
    folders."""
    def order(folder: Path) -> tuple:
        rel = folder.relative_to(sweep).parts
        return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in rel)

    return sorted((f.parent.parent for f in sweep.glob("**/.hydra/overrides.yaml")), key=order)


def without_timings(summary: dict[str, Any]) -> dict[str, Any]:
    """A run's summary without the fields that measure time (``wall_seconds``, a planner's ``overhead_seconds`` and
    ``planner_seconds_per_round``): what two runs of the same job, serial or on any launcher, must agree on."""
    return {k: v for k, v in summary.items() if "_seconds" not in k}


def record_job_error(job: Path, line: str | None) -> None:
    """Record in ``job``'s folder that its job failed now with error ``line`` (:data:`JOB_ERROR`), or (None) that
    it starts again; a folder that cannot take the record leaves the job's status to its files."""
    with contextlib.suppress(OSError, WriteError):
        if line is None:
            (job / JOB_ERROR).unlink(missing_ok=True)
        else:
            atomic_write(job / JOB_ERROR, lambda f: f.write(line), mode="w")


def read_jobs(sweep: Path) -> list[Job]:
    """Every job folder of ``sweep`` in job order, with its overrides, summary and status (a job whose latest run
    failed has no summary, whatever its folder holds)."""
    jobs = []
    for folder in job_folders(sweep):
        overrides = yaml.safe_load((folder / ".hydra" / "overrides.yaml").read_text()) or []
        summary_file, error_file = folder / "summary.json", folder / JOB_ERROR
        failed = error_file.read_text().strip() if error_file.is_file() else None
        summary = json.loads(summary_file.read_text()) if summary_file.is_file() and failed is None else None
        status = failed or ("ok" if summary is not None else _error_of(folder))
        jobs.append(Job(str(folder.relative_to(sweep)), folder, [str(o) for o in overrides], summary, status))
    return jobs


def _error_of(job: Path) -> str:
    """The error line a failed job logged, or a note that it left no summary."""
    log = job / "train.log"
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    errors = [line[line.index(ERROR_PREFIX):] for line in lines if ERROR_PREFIX in line]
    return errors[-1] if errors else "no summary.json (the job did not finish)"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def summary_rows(jobs: Sequence[Job], metrics: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One summary.csv row per job: its folder, overrides, status and ``metrics`` (None: its headline)."""
    rows = []
    for job in jobs:
        row: dict[str, Any] = {"job": job.name, "overrides": " ".join(job.overrides), "status": job.status}
        if job.summary is not None and metrics is None:
            row.update(headline(job.summary))
        elif job.summary is not None:
            row.update({m: float(job.summary[m]) for m in metrics if _is_number(job.summary.get(m))})
        rows.append(row)
    return rows


def missing_metrics(jobs: Sequence[Job], metrics: Sequence[str]) -> list[str]:
    """The ``metrics`` that no finished job's summary has as a number (none when no job finished)."""
    done = [job.summary for job in jobs if job.summary is not None]
    return [m for m in metrics if done and not any(_is_number(s.get(m)) for s in done)]


def write_summary(sweep: Path, rows: list[dict[str, Any]]) -> None:
    """``summary.csv`` (every job) and ``summary.md`` (mean ± std over seeds, grouped by the other overrides)."""
    columns = ["job", "overrides", "status", *dict.fromkeys(k for r in rows for k in r if k not in
                                                            ("job", "overrides", "status"))]
    _write_csv(sweep / "summary.csv", pd.DataFrame(rows, columns=columns, dtype=object))
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if r["status"] == "ok":
            key = " ".join(o for o in r["overrides"].split() if not o.startswith("seed="))
            groups.setdefault(key, []).append(r)
    metrics = columns[3:]
    lines = ["| setting | jobs | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]
    for key, members in groups.items():
        cells = []
        for m in metrics:
            values = [r[m] for r in members if m in r]
            spread = f" ± {statistics.stdev(values):.4g}" if len(values) > 1 else ""
            cells.append(f"{statistics.fmean(values):.6g}{spread}" if values else "")
        lines.append(f"| {key or '(defaults)'} | {len(members)} | " + " | ".join(cells) + " |")
    atomic_write(sweep / "summary.md", lambda f: f.write("\n".join(lines) + "\n"), mode="w")


def settings(overrides: Sequence[str]) -> dict[str, str]:
    """Each command-line override as key -> value text: a ``+``/``++`` prefix is dropped from the key, and a
    removal (``~KEY``) is ``null``."""
    out = {}
    for override in overrides:
        key, sep, value = override.partition("=")
        out[key.lstrip("+~")] = value if sep and not key.startswith("~") else "null"
    return out


def flat(summary: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """summary.json's keys as columns: a nested dict's keys dotted (``a.b``), a list as JSON text."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value) if isinstance(value, list) else value
    return out


def _renamed(values: dict[str, Any], taken: set[str], prefix: str) -> dict[str, Any]:
    """``values`` with each key that is ``taken`` (an override's column) prefixed."""
    return {(prefix + k if k in taken else k): v for k, v in values.items()}


def _overrides_of(jobs: Sequence[Job]) -> tuple[list[dict[str, str]], list[str]]:
    """Each job's :func:`settings`, and every key any job overrides (the tables' override columns), in order."""
    overrides = [settings(job.overrides) for job in jobs]
    return overrides, list(dict.fromkeys(k for o in overrides for k in o))


def runs_table(jobs: Sequence[Job]) -> pd.DataFrame:
    """runs.csv: one row per job, its folder, its overrides' columns, its status and its summary's keys."""
    overrides, keys = _overrides_of(jobs)
    taken = {"job", "status", *keys}
    results = [_renamed(flat(job.summary or {}), taken, "summary.") for job in jobs]
    rows = [{"job": job.name, **o, "status": job.status, **r} for job, o, r in zip(jobs, overrides, results)]
    columns = ["job", *keys, "status", *dict.fromkeys(k for r in results for k in r)]
    return pd.DataFrame(rows, columns=columns, dtype=object)


def rounds_table(jobs: Sequence[Job]) -> pd.DataFrame:
    """rounds.csv: every finished job's ``metrics.csv`` (one row per logged round) behind its folder and overrides'
    columns (a metric named like an override is ``metrics.NAME``)."""
    overrides, keys = _overrides_of(jobs)
    parts = []
    for job, o in zip(jobs, overrides):
        path = job.folder / "metrics.csv"
        if job.summary is None or not path.is_file():
            continue
        rounds = pd.read_csv(path)
        rounds.columns = [f"metrics.{c}" if c in {"job", *keys} else c for c in rounds.columns]
        parts.append(pd.concat([pd.DataFrame({"job": job.name, **o}, index=rounds.index), rounds], axis=1))
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    metrics = [c for c in frame.columns if c not in {"job", *keys}]
    return frame.reindex(columns=["job", *keys, *metrics])


def _write_csv(path: Path, frame: pd.DataFrame) -> None:
    atomic_write(path, lambda f: frame.to_csv(f, index=False), mode="w")


def write_runs(sweep: Path, jobs: Sequence[Job]) -> None:
    """``runs.csv`` and ``rounds.csv`` of the sweep's jobs, each written atomically."""
    _write_csv(sweep / RUNS, runs_table(jobs))
    _write_csv(sweep / ROUNDS, rounds_table(jobs))


def read_runs(path: Path) -> pd.DataFrame:
    """A sweep's runs.csv (``path``: the file or its sweep folder); only an empty cell is missing, an override's
    text stays as given (``null``, ``None``)."""
    file = path / RUNS if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"{path}: no {RUNS} (a multirun writes it into its sweep folder when its jobs have ended)")
    runs = pd.read_csv(file, keep_default_na=False, na_values=[""])
    if "job" not in runs.columns or "status" not in runs.columns:
        raise ConfigError(f"{file}: not a sweep's {RUNS} (expected the columns job, the overrides, status, the "
                          "summary's keys)")
    return runs


def override_columns(runs: pd.DataFrame) -> list[str]:
    """The overrides' columns of runs.csv: those between ``job`` and ``status``."""
    columns = list(runs.columns)
    return columns[columns.index("job") + 1:columns.index("status")]


def split_runs(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """runs.csv as (overrides, results): the override columns, and job, status and the summary's keys under their
    summary.json names (``summary.seed`` is ``seed`` again)."""
    keys = override_columns(runs)
    results = runs.drop(columns=keys)
    back = {c: c.removeprefix("summary.") for c in results.columns
            if c.startswith("summary.") and c.removeprefix("summary.") in keys}
    return runs[keys], results.rename(columns=back)


def finished_runs(dirs: Sequence[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(overrides, results) of :func:`split_runs` for the finished jobs of every sweep under ``dirs`` (each folder
    holding a runs.csv), row for row; results gain ``sweep``, the job's sweep folder. A missing folder, or no
    finished job, is a :class:`ConfigError`."""
    overrides, results = [], []
    for d in dirs:
        if not Path(d).is_dir():
            raise ConfigError(f"{d}: no such folder")
        for file in sorted(Path(d).rglob(RUNS)):
            o, r = split_runs(read_runs(file))
            done = r["status"] == "ok"
            overrides.append(o[done])
            results.append(r[done].assign(sweep=str(file.parent)))
    if not sum(len(r) for r in results):
        raise ConfigError(f"no finished jobs in the {RUNS} of the sweeps under {[str(d) for d in dirs]}")
    return pd.concat(overrides, ignore_index=True), pd.concat(results, ignore_index=True)


def read_rounds(sweep: Path) -> dict[str, pd.DataFrame]:
    """A sweep folder's rounds.csv by job (the name of its folder): each finished job's logged rounds."""
    file = Path(sweep) / ROUNDS
    if not file.is_file():
        raise ConfigError(f"{sweep}: no {ROUNDS} (a multirun writes it into its sweep folder when its jobs have ended)")
    rounds = pd.read_csv(file)
    return {str(job): part.reset_index(drop=True) for job, part in rounds.groupby("job", sort=False)}


def pivot(runs: pd.DataFrame, metric: str, rows: Sequence[str] = (), columns: Sequence[str] = ()) -> pd.DataFrame:
    """Mean, sample std and number of the finished jobs' ``metric`` for each setting of the ``rows`` and
    ``columns`` keys, pooling only the :data:`POOLED` overrides: an override that differs between the jobs and is
    on neither side is refused (:class:`ConfigError` naming it) instead of being pooled as seeds."""
    keys = [*rows, *columns]
    for option, key in [("--metric", metric), *(("--rows", k) for k in rows), *(("--columns", k) for k in columns)]:
        if key not in runs.columns:
            raise ConfigError(f"{option}: runs.csv has no column {key!r}{did_you_mean(key, runs.columns)}")
    if len(set(keys)) < len(keys) or metric in keys:
        raise ConfigError(f"--rows {' '.join(rows)} --columns {' '.join(columns)}: each key on one side only, "
                          f"and not the metric {metric!r}")
    done = runs[runs["status"] == "ok"]
    if done.empty:
        raise ConfigError("runs.csv: no job of the sweep finished (no status ok)")
    values = pd.to_numeric(done[metric], errors="coerce")
    if values.isna().all():
        raise ConfigError(f"--metric: {metric!r} is no number in any finished job")
    cells = pd.Series([", ".join(f"{k}={_label(v)}" for k, v in zip(keys, rec)) or "the whole table"
                       for rec in done[keys].itertuples(index=False)], index=done.index)
    refuse_pooling(done[override_columns(done)], cells,
                   f"put it on --rows or --columns (only {', '.join(POOLED)} is pooled into mean ± std)")
    if not keys:
        return pd.DataFrame({"mean": [values.mean()], "std": [values.std()], "runs": [values.count()]})
    grouped = done.assign(**{metric: values}).groupby(keys, dropna=False, sort=True)[metric]
    return grouped.agg(["mean", "std", "count"]).reset_index().rename(columns={"count": "runs"})


def refuse_pooling(overrides: pd.DataFrame, cells: pd.Series, hint: str) -> None:
    """Refuse (:class:`ConfigError` naming it, then ``hint``) an override other than :data:`POOLED` whose value
    differs between jobs of one cell of a table (``cells``: each job's cell, row for row): a cell's mean ± std may
    pool seeds only."""
    for key in overrides.columns:
        if key in POOLED:
            continue
        counts = overrides[key].groupby(cells, sort=False).nunique(dropna=False)
        if (counts > 1).any():
            cell = counts.idxmax()
            shown = ", ".join(_label(v) for v in overrides.loc[cells == cell, key].drop_duplicates())
            raise ConfigError(f"{key} differs between the jobs of one cell ({cell}: {shown}): {hint}")


def _label(value: Any) -> str:
    """A key's value as a table shows it (an override a job did not give: ``–``)."""
    if pd.isna(value):
        return "–"
    return f"{value:g}" if isinstance(value, float) else str(value)


def markdown(table: pd.DataFrame, metric: str, rows: Sequence[str] = (), columns: Sequence[str] = ()) -> str:
    """A :func:`pivot` table as Markdown: one row per setting of ``rows``, one column per setting of ``columns``,
    each cell ``mean ± std`` (a single job: its value), and a line naming what was pooled."""
    def labels(frame: pd.DataFrame, keys: Sequence[str]) -> list[tuple[str, ...]]:
        return [tuple(_label(v) for v in rec) for rec in frame[list(keys)].itertuples(index=False)]

    cells = {(r, c): f"{m:.6g} ± {s:.4g}" if n > 1 else f"{m:.6g}" for r, c, m, s, n in
             zip(labels(table, rows), labels(table, columns), table["mean"], table["std"], table["runs"])}
    lefts = list(dict.fromkeys(labels(table, rows)))
    heads = list(dict.fromkeys(labels(table.sort_values(list(columns), kind="stable"), columns)))
    names = [", ".join(f"{k}={v}" for k, v in zip(columns, h)) or metric for h in heads]
    lines = ["| " + " | ".join([*rows, *names]) + " |", "|---" * (len(rows) + len(heads)) + "|"]
    lines += ["| " + " | ".join([*r, *(cells.get((r, h), "–") for h in heads)]) + " |" for r in lefts]
    runs = "/".join(str(n) for n in sorted(set(table["runs"])))
    pooled = ", ".join(k for k in POOLED if k not in (*rows, *columns))
    over = f": mean ± std over {pooled}" if pooled else ""
    return "\n".join(lines) + f"\n\n{metric}{over}; finished jobs per cell: {runs}."


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m fedrec.app.sweeps SWEEP_DIR --metric M [--rows KEY...] [--columns KEY...] [--csv]``: print the
    sweep's :func:`pivot` as Markdown, or as CSV (one line per setting: its keys, mean, std, runs)."""
    p = argparse.ArgumentParser(prog="python -m fedrec.app.sweeps",
                                description="Pivot a sweep's runs.csv into a table of mean ± std over seeds; every "
                                "other swept override must be on rows or columns.")
    p.add_argument("sweep", type=Path, help="a multirun's sweep folder (or its runs.csv)")
    p.add_argument("--metric", required=True, help="a summary.json key (a column of runs.csv), e.g. final_test_rmse")
    p.add_argument("--rows", nargs="+", default=[], metavar="KEY", help="keys whose settings are the table's rows")
    p.add_argument("--columns", nargs="+", default=[], metavar="KEY", help="keys whose settings are its columns")
    p.add_argument("--csv", action="store_true", help="print CSV instead of Markdown")
    args = p.parse_args(argv)

    def show() -> None:
        table = pivot(read_runs(args.sweep), args.metric, args.rows, args.columns)
        if args.csv:
            print(table.to_csv(index=False), end="")
        else:
            print(markdown(table, args.metric, args.rows, args.columns))

    run_script(show)


if __name__ == "__main__":
    main()

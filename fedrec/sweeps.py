"""What a run reports at its end, and what a multirun reports over its jobs (a Hydra callback).

A run's *headline* is its task's main result: regret (bandits), relative CTR (replay), normalised reward (the
real-data streams of Async-LinUCB) or the final test RMSE (recommendation), with communication and ε where the task
has them. ``train.py`` prints it and returns the first value as the sweep objective. :class:`SweepSummary` reads
every job folder of a multirun when it ends, whatever launcher ran the jobs: ``summary.csv`` (one row per job: its
overrides, headline and status), ``summary.md`` (mean ± std over seeds of each setting) and the failed jobs listed
with their errors.
"""
from __future__ import annotations

import csv
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml
from hydra.experimental.callback import Callback as HydraCallback
from omegaconf import DictConfig

from fedrec.io import atomic_write

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


def headline(summary: dict[str, Any]) -> dict[str, float]:
    """The run's main result first, then the secondary numbers it has (a null one, e.g. the ε of a non-private
    run, is left out)."""
    main = [k for k in PRIMARY if summary.get(k) is not None][:1]
    return {k: float(summary[k]) for k in (*main, *(k for k in SECONDARY if summary.get(k) is not None))}


def objective(summary: dict[str, Any]) -> float:
    """The sweep objective of a run: its main result (NaN when the task reports none)."""
    values = headline(summary)
    return next(iter(values.values())) if values else math.nan


def describe(out: Path, summary: dict[str, Any]) -> str:
    """One line for the terminal: where the run wrote, and its headline."""
    numbers = ", ".join(f"{k} = {v:.6g}" for k, v in headline(summary).items())
    return f"run folder: {out}" + (f"; {numbers}" if numbers else "")


class SweepSummary(HydraCallback):
    """Hydra callback (``hydra.callbacks`` in conf/config.yaml): after a multirun, write the sweep's table."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        rows = collect(Path(config.hydra.sweep.dir))
        if not rows:
            return
        write_tables(Path(config.hydra.sweep.dir), rows)
        failed = [r for r in rows if r["status"] != "ok"]
        for r in failed:
            print(f"failed job {r['job']} ({r['overrides']}): {r['status']}", file=sys.stderr)
        print(f"sweep: {len(rows) - len(failed)} of {len(rows)} jobs finished; "
              f"{Path(config.hydra.sweep.dir) / 'summary.csv'}", file=sys.stderr)
        if failed:
            raise SystemExit(2)


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


def collect(sweep: Path) -> list[dict[str, Any]]:
    """One row per job folder (those with a ``.hydra/overrides.yaml``): overrides, headline, status."""
    rows = []
    for job in job_folders(sweep):
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()) or []
        row: dict[str, Any] = {"job": str(job.relative_to(sweep)), "overrides": " ".join(overrides)}
        summary_file = job / "summary.json"
        if summary_file.is_file():
            row.update(headline(json.loads(summary_file.read_text())), status="ok")
        else:
            row["status"] = _error_of(job)
        rows.append(row)
    return rows


def _error_of(job: Path) -> str:
    """The error line a failed job logged, or a note that it left no summary."""
    log = job / "train.log"
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    errors = [line[line.index(ERROR_PREFIX):] for line in lines if ERROR_PREFIX in line]
    return errors[-1] if errors else "no summary.json (the job did not finish)"


def write_tables(sweep: Path, rows: list[dict[str, Any]]) -> None:
    """``summary.csv`` (every job) and ``summary.md`` (mean ± std over seeds, grouped by the other overrides)."""
    columns = ["job", "overrides", "status", *dict.fromkeys(k for r in rows for k in r if k not in
                                                            ("job", "overrides", "status"))]
    def write_csv(f: Any) -> None:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)

    atomic_write(sweep / "summary.csv", write_csv, mode="w")
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

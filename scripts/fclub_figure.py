"""Fig. 2, Fig. 4 and the parameter studies (Fig. 3) of Liu et al. (FCLUB, UAI 2022) from Hydra multiruns of
``train.py +experiment=fclub_*`` (what ``scripts/reproduce_fclub.sh`` and ``scripts/fclub_study.sh`` write).

Every run folder (``SWEEP_DIR/*/`` with ``summary.json``, ``metrics.csv`` and ``config_resolved.yaml``) is
identified from its resolved config, not from its folder name: the method (FCLUB-DC, FCLUB, CDP-FCLUB-DC, Homo,
Homo-DC from ``FederatedClustering``'s thresholds and ``pooled`` and the ``privacy`` group, "CDP-FCLUB-DC (trigger)"
when the summary reports the authors' noise placement; CLUB, SCLUB, LinUCB from ``LocalClustering``'s ``method``),
the conventions preset and the study factors n, m, L, d, U = D and ε. Every
number is the mean over seeds (the run's replicates) ± their standard deviation, as the runs report them.

Comparison (several methods): ``fclub_fig2_regret.png`` (cumulative regret against the round, one line per
method, band ±1 std over seeds, one panel per conventions value), ``fclub_fig4_communication.png`` (cumulative
messages of FCLUB, FCLUB-DC and CDP-FCLUB-DC, log y), both in SWEEP_DIR, and a Markdown table on stdout:
method × conventions → regret at T/10 and at T, messages at T, ARI, clusters, ε spent, seconds. The regret at T/10
is the ``metrics.csv`` row at step T/10 ("–" when the run logged no such row: steps_per_round must divide T/10).

One factor (one method, one of n, m, L, d, U = D, ε varied; the ε study of reproduce_fclub.sh): ``fclub_<factor>.png``
(regret curves per value, regret at T and messages at T against the value with ±1 std error bars) and its table.

    .venv/bin/python scripts/fclub_figure.py SWEEP_DIR              # comparison or one factor, detected
    .venv/bin/python scripts/fclub_figure.py --epsilon SWEEP_DIR    # the ε study (ε must be what varies)
    .venv/bin/python scripts/fclub_figure.py --study STUDY_DIR      # every STUDY_DIR/*/ is one factor's sweep;
                                                                    # writes STUDY_DIR/study_<factor>.png
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml
from matplotlib.axes import Axes

from fedrec.app.plots import integer_ticks, legend_below, legend_beside, plt, save_figure, set_title, subplots

#: the methods in the paper's order (Table 3), each with a fixed colour across panels and figures
#: (CDP-FCLUB-DC with protocol.noise_placement=trigger, the authors' code's, is not differentially private)
METHODS = ("CDP-FCLUB-DC", "CDP-FCLUB-DC (trigger)", "FCLUB-DC", "FCLUB", "SCLUB", "CLUB", "LinUCB", "Homo-DC",
           "Homo")
COLOURS = dict(zip(METHODS, ("tab:red", "tab:pink", "tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown",
                             "tab:gray", "tab:olive")))
#: the methods of Fig. 4 (communication)
COMMUNICATING = ("FCLUB", "FCLUB-DC", "CDP-FCLUB-DC", "CDP-FCLUB-DC (trigger)")
CONVENTIONS = ("paper", "authors")
#: the study factors, in the paper's order: key -> (label, where in the resolved config, log x axis)
FACTORS = {
    "n": ("users n", ("env", "num_clients"), False),
    "m": ("clusters m", ("env", "num_clusters"), False),
    "L": ("local servers L", ("env", "num_servers"), False),
    "d": ("dimension d", ("env", "dim"), False),
    "UD": ("thresholds U = D", None, True),
    "epsilon": ("privacy ε", ("privacy", "epsilon"), True),
}
#: a factor's symbol in legends and table headers
SYMBOLS = {"n": "n", "m": "m", "L": "L", "d": "d", "UD": "U = D", "epsilon": "ε"}
FILE_KEYS = {"UD": "U_D"}


class InputError(Exception):
    """A sweep that cannot be read or tabulated: ``error: ...`` on stderr, exit code 2."""


@dataclass
class Run:
    path: Path
    method: str
    conventions: str
    summary: dict
    cols: dict[str, np.ndarray]
    factors: dict[str, object] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return int(self.summary["steps"])

    def value(self, key: str, default: float = math.nan) -> float:
        v = self.summary.get(key)
        return default if v is None else float(v)

    def regret_at(self, t: float) -> tuple[float, float]:
        """(mean, std) of the logged cumulative regret at step t exactly; NaN when no row has that step."""
        hit = np.flatnonzero(self.cols["steps"] == t)
        if not len(hit):
            return math.nan, math.nan
        std = self.cols.get("cumulative_regret_std")
        return float(self.cols["cumulative_regret"][hit[0]]), 0.0 if std is None else float(std[hit[0]])


def method_of(protocol: dict, privacy: dict | None, placement: str | None = None) -> str:
    """The paper's name of the method a resolved ``protocol`` config runs under the resolved ``privacy`` group, with
    " (trigger)" for CDP's noise in the upload trigger only (``placement``, as the run's summary reports it)."""
    target = str(protocol.get("_target_", "")).rsplit(".", 1)[-1]
    if target == "LocalClustering":
        names = {"club": "CLUB", "sclub": "SCLUB", "linucb": "LinUCB"}
        if protocol.get("method") not in names:
            raise InputError(f"unknown LocalClustering method {protocol.get('method')!r}")
        return names[protocol["method"]]
    if target == "FederatedClustering":
        sync = float(protocol["upload_threshold"]) == 1.0 and float(protocol["download_threshold"]) == 1.0
        if protocol.get("pooled"):
            return "Homo" if sync else "Homo-DC"
        if (privacy or {}).get("_target_") is not None:  # the tree_gaussian group (privacy=none has no target)
            return ("CDP-FCLUB" if sync else "CDP-FCLUB-DC") + (" (trigger)" if placement == "trigger" else "")
        return "FCLUB" if sync else "FCLUB-DC"
    raise InputError(f"not an FCLUB-family or clustering-baseline protocol: {protocol.get('_target_')!r}")


def factors_of(cfg: dict) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, (_, where, _) in FACTORS.items():
        if where is None:
            up, down = cfg["protocol"].get("upload_threshold"), cfg["protocol"].get("download_threshold")
            out[key] = None if up is None else (float(up) if up == down else (float(up), float(down)))
        else:
            v = (cfg.get(where[0]) or {}).get(where[1])
            out[key] = None if v is None else float(v)
    return out


def load(run: Path) -> Run:
    try:
        summary = json.loads((run / "summary.json").read_text())
        cfg = yaml.safe_load((run / "config_resolved.yaml").read_text())
        with open(run / "metrics.csv", newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("cumulative_regret")]
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise InputError(f"{run}: cannot read the run ({e})") from e
    if not rows:
        raise InputError(f"{run}/metrics.csv: no logged round")
    cols = {k: np.array([float(r[k]) for r in rows]) for k in rows[0] if all(r.get(k) not in (None, "") for r in rows)}
    protocol = cfg.get("protocol") or {}
    return Run(run, method_of(protocol, cfg.get("privacy"), summary.get("noise_placement")),
               str(protocol.get("conventions", "paper")), summary, cols, factors_of(cfg))


def load_sweep(sweep: Path) -> list[Run]:
    if not sweep.is_dir():
        raise InputError(f"{sweep}: not a folder")
    runs = [load(p.parent) for p in sorted(sweep.glob("*/summary.json"))]
    if not runs:
        raise InputError(f"{sweep}: no run folders (*/summary.json) in it")
    return runs


def curve(run: Run) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(rounds, mean regret, std or None) of a run's logged rounds, from the origin (no regret before round 1)."""
    std = run.cols.get("cumulative_regret_std")
    return (np.r_[0.0, run.cols["steps"]], np.r_[0.0, run.cols["cumulative_regret"]],
            None if std is None else np.r_[0.0, std])


def pm(mean: float, std: float, digits: int = 1) -> str:
    if math.isnan(mean):
        return "–"
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def clusters(run: Run) -> str:
    """'global / local' (FCLUB family, mean over seeds) or the per-server clusters of a baseline."""
    if run.summary.get("global_clusters") is not None:
        return f"{run.value('global_clusters'):.1f} / {run.value('local_clusters'):.1f}"
    return "–" if run.summary.get("clusters") is None else f"{run.value('clusters'):.1f}"


def eps_spent(run: Run) -> str:
    """The accountant's ε; "not applicable" when the run's shared statistics carry no noise (trigger placement)."""
    if run.summary.get("epsilon") == "not applicable":
        return "not applicable"
    return "–" if run.summary.get("epsilon_spent") is None else f"{run.value('epsilon_spent'):.4g}"


def cells(run: Run) -> list[str]:
    """The table cells of a run: regret at T/10 and at T, messages at T, uploads / downloads, ARI, clusters,
    ε spent and wall-clock seconds (of all its seeds)."""
    r = run
    return [pm(*r.regret_at(r.steps / 10)), pm(r.value("cumulative_regret"), r.value("cumulative_regret_std", 0.0)),
            pm(r.value("comm_messages"), r.value("comm_messages_std", 0.0)),
            f"{r.value('comm_upload_messages', 0.0):.1f} / {r.value('comm_download_messages', 0.0):.1f}",
            pm(r.value("ari"), r.value("ari_std", 0.0), 3), clusters(r), eps_spent(r), f"{r.value('wall_seconds'):.1f}"]


def setting_line(runs: list[Run]) -> str:
    s = runs[0].summary
    seeds = sorted({int(r.summary.get("replicates", 1)) for r in runs})
    steps = sorted({r.steps for r in runs})
    return (f"{s.get('experiment', '?')}: T = {', '.join(map(str, steps))}, "
            f"{', '.join(map(str, seeds))} seed(s) (replicates); mean ± std over seeds")


def sorted_runs(runs: list[Run]) -> list[Run]:
    def key(r: Run) -> tuple:
        conv = CONVENTIONS.index(r.conventions) if r.conventions in CONVENTIONS else len(CONVENTIONS)
        meth = METHODS.index(r.method) if r.method in METHODS else len(METHODS)
        return conv, r.conventions, meth, r.method
    return sorted(runs, key=key)


def _fullest(axes: Iterable[Axes]) -> Axes:
    """The panel with the most legend entries, whose legend stands for the figure's."""
    return max(axes, key=lambda ax: len(ax.get_legend_handles_labels()[1]))


def comparison(runs: list[Run], out: Path) -> None:
    """Fig. 2, Fig. 4 and the method × conventions table."""
    seen: dict[tuple[str, str], Path] = {}
    for r in runs:
        if (r.method, r.conventions) in seen:
            raise InputError(f"two runs of {r.method} under conventions={r.conventions}: "
                             f"{seen[(r.method, r.conventions)]} and {r.path}; a sweep of one method over a factor "
                             "takes --epsilon or --study")
        seen[(r.method, r.conventions)] = r.path
    runs = sorted_runs(runs)
    conventions = list(dict.fromkeys(r.conventions for r in runs))

    fig, axes = subplots(1, len(conventions), figsize=(6 * len(conventions), 5), squeeze=False)
    for ax, conv in zip(axes[0], conventions):
        for r in (r for r in runs if r.conventions == conv):
            t, y, sd = curve(r)
            ax.plot(t, y, label=r.method, color=COLOURS.get(r.method))
            if sd is not None:
                ax.fill_between(t, y - sd, y + sd, alpha=0.2, linewidth=0, color=COLOURS.get(r.method))
        set_title(ax, f"cumulative regret, conventions={conv}")
        ax.set_xlabel("round t")
        integer_ticks(ax)
        ax.set_ylabel("cumulative regret (mean ± 1 std over seeds)")
        ax.grid(alpha=0.3)
    legend_below(fig, _fullest(axes[0]))
    save_figure(fig, out / "fclub_fig2_regret.png")

    comm = [r for r in runs if r.method in COMMUNICATING]
    if comm:
        fig, axes = subplots(1, len(conventions), figsize=(6 * len(conventions), 5), squeeze=False)
        for ax, conv in zip(axes[0], conventions):
            for r in (r for r in comm if r.conventions == conv):
                t, c = r.cols["steps"], r.cols.get("comm_messages")
                if c is not None:
                    ax.plot(t, np.where(c > 0, c, np.nan), label=r.method, color=COLOURS.get(r.method))
            ax.plot(t, t, ":", color="black", linewidth=0.8, label="one message per round")
            ax.set_yscale("log")
            set_title(ax, f"cumulative communication, conventions={conv}")
            ax.set_xlabel("round t")
            integer_ticks(ax)
            ax.set_ylabel("messages (uploads + downloads, mean over seeds)")
            ax.grid(alpha=0.3, which="both")
        legend_below(fig, _fullest(axes[0]))
        save_figure(fig, out / "fclub_fig4_communication.png")

    print(setting_line(runs) + "\n")
    print("| conventions | method | regret at T/10 | regret at T | messages at T | uploads / downloads | ARI | "
          "clusters (global / local) | ε spent | seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        print("| " + " | ".join([r.conventions, r.method, *cells(r)]) + " |")


def varying(runs: list[Run]) -> list[str]:
    return [k for k in FACTORS if len({repr(r.factors.get(k)) for r in runs}) > 1]


def x_of(value: object, key: str) -> float:
    """The x coordinate of a factor value (U − 1 for the thresholds, on a log axis)."""
    if key == "UD":
        up = value[0] if isinstance(value, tuple) else value
        return float(up) - 1.0
    return float(value)


def show(value: object) -> str:
    if isinstance(value, tuple):
        return f"U = {value[0]:g}, D = {value[1]:g}"
    return f"{value:g}"


def trend(values: list[object], means: list[float], stds: list[float]) -> str:
    """What the measured regret at T does as the factor grows (no expectation assumed)."""
    diffs = np.diff(means)
    if np.all(diffs < 0):
        shape = "decreases monotonically"
    elif np.all(diffs > 0):
        shape = "increases monotonically"
    else:
        shape = "is not monotone"
    apart = sum(abs(d) > s1 + s2 for d, s1, s2 in zip(diffs, stds[:-1], stds[1:]))
    return (f"measured: regret at T {shape} in the factor ({show(values[0])}: {means[0]:.1f} → "
            f"{show(values[-1])}: {means[-1]:.1f}); {apart} of {len(diffs)} neighbouring steps differ by more than "
            "the sum of their ±1 std")


def factor_report(runs: list[Run], key: str, png: Path) -> None:
    """One factor's figure and table: runs of one method (and conventions) differing in ``key`` only."""
    methods = {(r.method, r.conventions) for r in runs}
    if len(methods) > 1:
        raise InputError(f"a factor study holds runs of one method; found {sorted(methods)}")
    label, _, log_x = FACTORS[key]
    runs = sorted(runs, key=lambda r: x_of(r.factors[key], key))
    values = [r.factors[key] for r in runs]
    xs = [x_of(v, key) for v in values]
    means = [r.value("cumulative_regret") for r in runs]
    stds = [r.value("cumulative_regret_std", 0.0) for r in runs]
    msg = [r.value("comm_messages") for r in runs]
    msg_std = [r.value("comm_messages_std", 0.0) for r in runs]

    fig, axes = subplots(1, 3, figsize=(15, 4.8))
    cmap = plt.get_cmap("viridis")
    for i, (r, v) in enumerate(zip(runs, values)):
        t, y, sd = curve(r)
        colour = cmap(i / max(1, len(runs) - 1))
        axes[0].plot(t, y, color=colour, label=f"{SYMBOLS[key]} = {show(v)}")
        if sd is not None:
            axes[0].fill_between(t, y - sd, y + sd, alpha=0.15, linewidth=0, color=colour)
    axes[0].set_xlabel("round t")
    integer_ticks(axes[0])
    axes[0].set_ylabel("cumulative regret (mean ± 1 std over seeds)")
    legend_beside(axes[0])
    axes[1].errorbar(xs, means, yerr=stds, marker="o", capsize=3)
    axes[1].set_ylabel("regret at T (mean ± 1 std over seeds)")
    axes[2].errorbar(xs, msg, yerr=msg_std, marker="o", capsize=3, color="tab:green")
    axes[2].set_ylabel("messages at T (mean ± 1 std over seeds)")
    for ax in axes[1:]:
        ax.set_xlabel("U = D (spaced as U − 1, log)" if key == "UD" else label + (" (log)" if log_x else ""))
        if log_x:
            ax.set_xscale("log")
        ax.set_xticks(xs, [show(v) for v in values], fontsize="small", rotation=30 if key == "UD" else 0,
                      ha="right" if key == "UD" else "center")
        ax.minorticks_off()
    for ax in axes:
        ax.grid(alpha=0.3)
    set_title(fig, f"{runs[0].method} ({runs[0].conventions} conventions): {label} varied")
    save_figure(fig, png)

    print(f"{runs[0].method}, conventions={runs[0].conventions}, {label} varied; " + setting_line(runs) + "\n")
    print(f"| {SYMBOLS[key]} | regret at T/10 | regret at T | messages at T | uploads / downloads | ARI | "
          "clusters (global / local) | ε spent | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r, v in zip(runs, values):
        print("| " + " | ".join([show(v), *cells(r)]) + " |")
    if len(runs) > 1:
        print("\n" + trend(values, means, stds))


def single_factor(runs: list[Run], where: str) -> str:
    keys = varying(runs)
    if len(keys) != 1:
        found = ", ".join(keys) if keys else "none"
        raise InputError(f"{where}: a factor study varies exactly one of {', '.join(FACTORS)}; varied: {found}")
    return keys[0]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sweep", type=Path, help="a Hydra multirun folder (or, with --study, a folder of them)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--epsilon", action="store_true", help="the ε study: one method, only privacy.epsilon varied")
    mode.add_argument("--study", action="store_true", help="every subfolder is one factor's sweep (fclub_study.sh)")
    args = p.parse_args(argv)
    try:
        if args.study:
            if not args.sweep.is_dir():
                raise InputError(f"{args.sweep}: not a folder")
            sweeps = sorted(d for d in args.sweep.iterdir() if d.is_dir() and any(d.glob("*/summary.json")))
            if not sweeps:
                raise InputError(f"{args.sweep}: no sweep folders (*/*/summary.json) in it")
            studies = []
            for sweep in sweeps:
                runs = load_sweep(sweep)
                studies.append((list(FACTORS).index(key := single_factor(runs, str(sweep))), key, sweep, runs))
            for i, (_, key, sweep, runs) in enumerate(sorted(studies, key=lambda s: (s[0], s[2].name))):
                print(("\n" if i else "") + f"### {FACTORS[key][0]} ({sweep.name})\n")
                factor_report(runs, key, args.sweep / f"study_{FILE_KEYS.get(key, key)}.png")
            return
        runs = load_sweep(args.sweep)
        methods = {(r.method, r.conventions) for r in runs}
        if args.epsilon:
            key = single_factor(runs, str(args.sweep))
            if key != "epsilon":
                raise InputError(f"{args.sweep}: --epsilon needs runs that differ in privacy.epsilon only; "
                                 f"varied: {key}")
            factor_report(runs, key, args.sweep / "fclub_epsilon.png")
        elif len(methods) == 1 and len(runs) > 1:
            key = single_factor(runs, str(args.sweep))
            factor_report(runs, key, args.sweep / f"fclub_{FILE_KEYS.get(key, key)}.png")
        else:
            comparison(runs, args.sweep)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()

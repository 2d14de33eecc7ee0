"""The robust-aggregation table script (scripts/robust_table.py) on hand-made sweeps (job folders and the runs.csv /
rounds.csv that fedrec.app.sweeps writes from them): its numbers against pandas, and the runs it refuses to pool."""
from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from fedrec.app.sweeps import read_jobs, write_runs

ROOT = Path(__file__).resolve().parents[1]
#: the aggregator option of each rule class the grid below runs (Bulyan: one of the rules added later)
OPTIONS = {"CoordinateMedian": "median", "Bulyan": "bulyan"}


def write_job(folder: Path, overrides: list[str], summary: dict, rounds: pd.DataFrame | None = None) -> None:
    """A finished job's folder: its overrides, summary.json and (when given) metrics.csv."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (folder / "summary.json").write_text(json.dumps(summary))
    if rounds is not None:
        rounds.to_csv(folder / "metrics.csv", index=False)


def grid_sweep(sweep: Path, rule: str, attack: str = "ItemPromotion", extra: tuple[str, ...] = (),
               fractions: tuple[float, ...] = (0.0, 0.2)) -> pd.DataFrame:
    """One rule's sweep over fractions x privacy x 3 seeds, as reproduce_robust.sh runs it; returns what each job
    reports."""
    rng = np.random.default_rng(len(rule) + 7 * len(sweep.parts))
    rows = []
    for job, (fraction, privacy, seed) in enumerate(itertools.product(fractions, ("none", "gaussian"), (0, 1, 2))):
        row = {"rule": rule, "fraction": fraction, "privacy": privacy, "final_test_benign_rmse": rng.uniform(0.2, 0.3),
               "final_test_target_exposure": rng.uniform(0, 0.1)}
        summary = {"aggregator": rule, "attack": attack, "model": "FedGNN", "dataset": "ml-100k", "seed": seed,
                   "privacy": privacy, **({"epsilon_total": 10.0} if privacy == "gaussian" else {}),
                   **{k: v for k, v in row.items() if k.startswith("final_")}}
        write_job(sweep / str(job), ["+experiment=fedgnn_ml100k_robust", f"aggregator={OPTIONS.get(rule, 'x')}",
                                     f"attack.fraction={fraction:g}", f"privacy={privacy}", f"seed={seed}", *extra],
                  summary)
        rows.append(row)
    write_runs(sweep, read_jobs(sweep))
    return pd.DataFrame(rows)


def robust_table(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "robust_table.py"), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_grid_table_equals_a_groupby_over_seeds(tmp_path: Path) -> None:
    written = pd.concat([grid_sweep(tmp_path / "grid" / rule, rule) for rule in OPTIONS], ignore_index=True)
    res = robust_table(tmp_path / "grid", "--out", tmp_path / "out" / "robust")
    assert res.returncode == 0, res.stderr
    want = written.groupby(["rule", "fraction", "privacy"])["final_test_benign_rmse"].agg(["mean", "std"])
    lines = (tmp_path / "out" / "robust.md").read_text().splitlines()
    assert lines[2] == ("| rule | none, 0% malicious | none, 20% malicious | gaussian ε=10, 0% malicious | "
                        "gaussian ε=10, 20% malicious |")
    rows = {line.split(" | ")[0].strip("| "): line.strip(" |").split(" | ")[1:] for line in lines[4:6]}
    assert list(rows) == ["median", "Bulyan"]  # the rules' labels, in the table's order
    for rule, cells in zip(OPTIONS, rows.values()):
        for cell, (privacy, fraction) in zip(cells, itertools.product(("none", "gaussian ε=10"), (0.0, 0.2))):
            m, s = want.loc[(rule, fraction, privacy.split(" ")[0])]
            assert cell == f"{m:.4f} ± {s:.4f}"
    long = pd.read_csv(tmp_path / "out" / "robust.csv")
    assert len(long) == 2 * 2 * 2 * 2 and set(long["runs"]) == {3}
    exposure = long[long["metric"] == "final_test_target_exposure"].set_index(["rule", "fraction", "privacy"])
    want = written.groupby(["rule", "fraction", "privacy"])["final_test_target_exposure"].mean()
    np.testing.assert_allclose(exposure.loc[("Bulyan", 0.2, "gaussian ε=10"), "mean"],
                               want.loc[("Bulyan", 0.2, "gaussian")], rtol=1e-12)
    assert (tmp_path / "out" / "robust.png").stat().st_size > 0


@pytest.mark.parametrize("case, message", [
    ("rule", "aggregator: no label for FedFoo"),
    ("attacks", "attack: the jobs run GaussianNoise, ItemPromotion"),  # two attacks are no two seeds
    ("rounds", "task.rounds differs between the jobs of one cell (CoordinateMedian, 0 malicious, none: 20, 40)"),
    ("fraction", "attack.fraction: the table's columns are attack fractions"),
])
def test_grid_refuses_what_it_would_pool_or_cannot_name(tmp_path: Path, case: str, message: str) -> None:
    if case == "rule":
        grid_sweep(tmp_path / "grid" / "foo", "FedFoo")
    elif case == "attacks":
        grid_sweep(tmp_path / "grid" / "a", "CoordinateMedian")
        grid_sweep(tmp_path / "grid" / "b", "CoordinateMedian", attack="GaussianNoise", extra=("attack=noise",))
    elif case == "rounds":
        for rounds in (20, 40):
            grid_sweep(tmp_path / "grid" / str(rounds), "CoordinateMedian", extra=(f"task.rounds={rounds}",))
    else:
        sweep = tmp_path / "grid" / "median"
        write_job(sweep / "0", ["seed=0"], {"aggregator": "CoordinateMedian", "attack": "ItemPromotion",
                                            "model": "FedGNN", "privacy": "none", "final_test_benign_rmse": 0.2,
                                            "final_test_target_exposure": 0.0})
        write_runs(sweep, read_jobs(sweep))
    res = robust_table(tmp_path / "grid", "--out", tmp_path / "robust")
    assert res.returncode == 2 and res.stderr.startswith("error: ") and message in res.stderr, res.stderr
    assert not (tmp_path / "robust.md").exists()


def server_sweep(sweep: Path, servers: dict[str, str | None]) -> pd.DataFrame:
    """Jobs with each ``server`` override (None: none given) -> the summary's server class, 2 seeds each."""
    rows = []
    for job, ((option, cls), seed) in enumerate(itertools.product(servers.items(), (0, 1))):
        curve = np.linspace(0.3, 0.2 + 0.01 * job, 5)
        summary = {"model": "FedGNN", "seed": seed, "final_test_rmse": curve[-1], "best_test_rmse": curve.min(),
                   **({"server_optimizer": cls} if cls else {})}
        write_job(sweep / str(job), ["+experiment=fedgnn_ml100k", f"seed={seed}",
                                     *([f"server={option}"] if option != "default" else [])], summary,
                  pd.DataFrame({"step": range(5), "test_rmse": curve}))
        rows.append({"server": option, "final": curve[-1], "best": curve.min()})
    write_runs(sweep, read_jobs(sweep))
    return pd.DataFrame(rows)


def test_servers_table_names_each_optimiser_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    written = pd.concat([server_sweep(tmp_path / "servers" / "default", {"default": None}),
                         server_sweep(tmp_path / "servers" / "reddi", {"fedavg": "FedAvgM", "fedadam": "FedAdam"})])
    res = robust_table("--servers", tmp_path / "servers", "--out", tmp_path / "servers_table")
    assert res.returncode == 0, res.stderr
    want = written.groupby("server")[["final", "best"]].agg(["mean", "std"])
    lines = (tmp_path / "servers_table.md").read_text().splitlines()
    labels = {"default": "Adam on the aggregate (default)", "fedadam": "FedAdam", "fedavg": "FedAvg (server x + ηΔ)"}
    assert [line.split(" | ")[0].strip("| ") for line in lines[2:]] == [labels[k] for k in labels]
    for line, option in zip(lines[2:], labels):
        w = want.loc[option]
        assert line == (f"| {labels[option]} | {w['final', 'mean']:.4f} ± {w['final', 'std']:.4f} | "
                        f"{w['best', 'mean']:.4f} ± {w['best', 'std']:.4f} | 2 |")
    assert (tmp_path / "servers_table.png").stat().st_size > 0
    server_sweep(tmp_path / "servers" / "prox", {"fedprox": "FedProx"})
    res = robust_table("--servers", tmp_path / "servers", "--out", tmp_path / "again")
    assert res.returncode == 2 and "server_optimizer: no label for FedProx" in res.stderr, res.stderr

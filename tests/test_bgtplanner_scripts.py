"""The Table II and Figure 3 scripts on hand-made run summaries."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.bgtplanner_sensitivity import table
from scripts.bgtplanner_table import improvements, paper_cells

ROOT = Path(__file__).resolve().parents[1]


def write_run(folder: Path, **summary) -> None:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))


def test_table_aggregates_seeds_and_puts_the_paper_beside(tmp_path: Path) -> None:
    base = {"dataset": "ml-100k", "final_test_f1": 0.6, "best_test_f1": 0.62, "rounds_run": 80}
    for seed, rmse in enumerate([0.30, 0.34]):
        write_run(tmp_path / "t" / f"bgt{seed}", privacy="gaussian", planner="bgtplanner", epsilon_spent=9.9,
                  final_test_rmse=rmse, best_test_rmse=rmse - 0.01, **base)
    write_run(tmp_path / "t" / "uni", privacy="laplace", planner="uniform", epsilon_spent=10.0,
              final_test_rmse=0.5, best_test_rmse=0.45, **base)
    write_run(tmp_path / "f" / "0", privacy="none", epsilon_spent=None, final_test_rmse=0.2, best_test_rmse=0.19,
              **base)
    out = tmp_path / "table2"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bgtplanner_table.py"), str(tmp_path / "t"),
                    str(tmp_path / "f"), "--out", str(out)], check=True, capture_output=True, text=True)
    md = out.with_suffix(".md").read_text()
    assert "| BGTplanner | 0.3200 ± 0.0283 (0.3223) | – (0.3449) |" in md
    assert "| FedSGD (no DP) | 0.2000 ± 0.0000 (0.2017) | 0.2000 ± 0.0000 (0.2017) |" in md
    assert "| Uniform (DPSGD for GM) | – (0.3356) | 0.5000 ± 0.0000 |" in md
    rows = list(csv.DictReader(open(out.with_suffix(".csv"))))
    bgt = [r for r in rows if r["method"] == "bgtplanner" and r["metric"] == "final_test_rmse"]
    assert len(bgt) == 1 and bgt[0]["runs"] == "2" and float(bgt[0]["paper"]) == 0.3223
    assert not [r for r in rows if r["method"] == "fedsgd" and r["metric"] == "epsilon_spent"]


def test_fig3_draws_a_png_and_prints_the_curve(tmp_path: Path) -> None:
    for eps in (2, 10):
        for planner in ("bgtplanner", "uniform"):
            write_run(tmp_path / "fig" / f"{planner}{eps}", privacy="gaussian", planner=planner, epsilon_total=eps,
                      final_test_rmse=0.4 - eps / 100, final_test_f1=0.6, rounds_run=90)
    out = tmp_path / "fig3.png"
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "bgtplanner_fig3.py"), str(tmp_path / "fig"),
                          "--out", str(out)], check=True, capture_output=True, text=True)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| gaussian | bgtplanner | 2 | 0.3800 | 0.6000 | 90.0 | 1 |" in res.stdout


def test_improvements_reproduce_the_papers_averages() -> None:
    """Spec §7.16: 3.40% (GM) / 10.12% (LM) / 6.76% RMSE and 0.71% F1 from the Table II numbers."""
    rmse = improvements(paper_cells("rmse"), "rmse")
    assert round(rmse["mean gaussian"], 2) == 3.40 and round(rmse["mean laplace"], 2) == 10.12
    assert round(rmse["mean"], 2) == 6.76
    assert round(improvements(paper_cells("f1"), "f1")["mean"], 2) == 0.71


def test_sensitivity_table_from_run_summaries() -> None:
    run = {"final_test_rmse": 0.33, "best_test_rmse": 0.32, "rounds_run": 84,
           "planner_action_counts": [10, 20, 30, 4, 20], "planner_planned_rounds": 54, "planner_gp_argmax_changes": 3,
           "planner_gp_tv_mean": 0.01}
    other = {**run, "final_test_rmse": 0.35, "planner_gp_argmax_changes": 1, "planner_gp_tv_mean": 0.03}
    uniform = {"final_test_rmse": 0.34, "best_test_rmse": 0.33, "rounds_run": 100}
    md, rows = table([("defaults", [run, other]), ("uniform", [uniform]), ("missing", [])])
    assert "| defaults | 0.3400 ± 0.0141 | 0.3200 ± 0.0000 | 84.0 | 10.0 / 20.0 / 30.0 / 4.0 / 20.0 | 4 of 108 | " \
           "0.0200 ± 0.0141 |" in md
    assert "| uniform | 0.3400 ± 0.0000 | 0.3300 ± 0.0000 | 100.0 | – | – | – |" in md
    assert "| missing | – | – | – | – | – | – |" in md
    assert [r[0] for r in rows] == ["defaults", "uniform"]


@pytest.mark.parametrize("argv", [["--seeds", "a,b"], ["--jobs", "0"]])
def test_sensitivity_script_names_bad_arguments(tmp_path: Path, argv: list[str]) -> None:
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "bgtplanner_sensitivity.py"), "--out",
                          str(tmp_path / "o"), *argv], capture_output=True, text=True)
    assert res.returncode == 2 and argv[0] in res.stderr and not (tmp_path / "o").exists()


@pytest.mark.parametrize("args, message", [
    (["{out}", "two"], "JOBS must be a positive integer"),
    (["{out}", "0"], "JOBS must be a positive integer"),
    (["{full}"], "already holds results"),
])
def test_fedgnn_dp_script_refuses_bad_arguments(tmp_path: Path, args: list[str], message: str) -> None:
    """scripts/reproduce_fedgnn_dp.sh: one error line, exit 2 and no run started, nothing written."""
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "table.md").write_text("a result\n")
    res = subprocess.run(["bash", str(ROOT / "scripts" / "reproduce_fedgnn_dp.sh"),
                          *(a.format(out=tmp_path / "out", full=tmp_path / "full") for a in args)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.startswith("error:") and message in res.stderr, res.stderr
    assert not (tmp_path / "out").exists() and (tmp_path / "full" / "table.md").read_text() == "a result\n"

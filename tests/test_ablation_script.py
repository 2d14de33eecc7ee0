"""scripts/reproduce_fedpergnn_ablation.sh: its rows run with the overrides they name and its table reports each
row's jobs as their own summaries do; bad arguments are one error line."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedrec.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "reproduce_fedpergnn_ablation.sh"


def run_script(args: list[str], env: dict[str, str], timeout: int = 60) -> subprocess.CompletedProcess[str]:
    """The script with ``env`` as its only DATASET and PARTS (not the caller's)."""
    base = {k: v for k, v in os.environ.items() if k not in ("DATASET", "PARTS")}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT,
                          env={**base, **env}, timeout=timeout)


def test_the_rows_run_their_overrides_and_the_table_reports_their_jobs(tmp_path: Path, data_dir: Path) -> None:
    out = tmp_path / "ablation"
    res = run_script([str(out), "0,1", "2", "quick=true"], {"DATASET": "yahoo_music", "PARTS": "full biases",
                                                            "FEDREC_DATA_DIR": str(data_dir)}, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = (out / "ablation.md").read_text().splitlines()
    assert lines[0].startswith("| fedpergnn_yahoo_music |") and len(lines) == 6
    assert lines[4:] == ["", "Every row also ran with `quick=true`."]
    for part, line, overrides in [("full", lines[2], []),
                                  ("biases", lines[3], ["model.bias=false", "task.mean_init=false",
                                                        "task.side_graphs.biases=false"])]:
        jobs = sorted(p for p in (out / part).iterdir() if (p / "summary.json").exists())
        assert len(jobs) == 2
        values = []
        for job in jobs:
            # a multirun's job writes its overrides back as Hydra parsed them (false as False)
            given = [o.lower() for o in yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())]
            assert given[0] == "+experiment=fedpergnn_yahoo_music" and all(o in given for o in overrides)
            values.append(json.loads((job / "summary.json").read_text())["selected_test_rmse_raw"])
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1] == (f"`{' '.join(overrides)}`" if overrides else "")
        assert cells[2] == f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}" and cells[3] == "2"
    assert res.stdout.splitlines()[-6:] == lines


@pytest.mark.parametrize("args, env, message", [
    (["{out}", "zero"], {}, "SEEDS must be a comma-separated list"),
    (["{out}", "0", "0"], {}, "JOBS must be a positive integer"),
    (["{out}"], {"DATASET": "netflix"}, "DATASET must be ml100k, douban, flixster or yahoo_music"),
    (["{out}"], {"PARTS": "full dropout"}, "PARTS: unknown row 'dropout'"),
    (["{out}"], {"DATASET": "ml100k", "PARTS": "side_graph"}, "PARTS: side_graph needs a side graph"),
    (["{out}"], {"PARTS": "l2 full l2"}, "PARTS: row 'l2' is named twice"),
    (["{out}"], {"PARTS": "  "}, "PARTS: name at least one row"),
    (["{full}"], {}, "already holds results"),
])
def test_bad_arguments_are_one_error_line(tmp_path: Path, args: list[str], env: dict[str, str], message: str) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "ablation.md").write_text("a result\n")
    res = run_script([a.format(out=tmp_path / "out", full=tmp_path / "full") for a in args], env)
    assert res.returncode == 2 and res.stderr.startswith("error:") and message in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()


def test_the_table_gives_a_single_seed_without_a_spread(tmp_path: Path) -> None:
    from scripts.ablation_table import table

    (tmp_path / "rows.tsv").write_text("fedpergnn_flixster\t\nfull\tthe whole experiment\t\n"
                                       "l2\twithout L2\ttask.weight_decay=0\n")
    for part, values in [("full", [0.9, 0.8]), ("l2", [1.25])]:
        (tmp_path / part).mkdir()
        (tmp_path / part / "runs.csv").write_text(
            "job,seed,status,selected_test_rmse_raw\n"
            + "".join(f"{i},{i},ok,{v}\n" for i, v in enumerate(values)) + "9,9,error: diverged,\n")
    assert table(tmp_path).splitlines()[2:] == [
        f"| the whole experiment |  | 0.8500 ± {statistics.stdev([0.9, 0.8]):.4f} | 2 |",
        "| without L2 | `task.weight_decay=0` | 1.2500 | 1 |"]


def test_a_failed_row_keeps_its_place_with_the_seeds_that_finished(tmp_path: Path) -> None:
    from scripts.ablation_table import table

    (tmp_path / "rows.tsv").write_text("fedpergnn_flixster\t\nfull\tthe whole experiment\t\n"
                                       "l2\twithout L2\ttask.weight_decay=0\n"
                                       "head\tthe sigmoid head\tmodel.head=sigmoid\n")
    (tmp_path / "FAILED").write_text("l2\nhead\n")
    for part, runs in [("full", "0,0,ok,0.9\n"), ("l2", "0,0,ok,1.25\n1,1,error: diverged,\n")]:
        (tmp_path / part).mkdir()
        (tmp_path / part / "runs.csv").write_text("job,seed,status,selected_test_rmse_raw\n" + runs)
    assert table(tmp_path).splitlines()[2:] == ["| the whole experiment |  | 0.9000 | 1 |",
                                                "| without L2 | `task.weight_decay=0` | 1.2500 (some seeds failed: "
                                                "`l2.log`) | 1 |",
                                                "| the sigmoid head | `model.head=sigmoid` | failed (`head.log`) | 0 |"]
    (tmp_path / "FAILED").write_text("l2\n")  # a row not recorded as failed must be readable
    with pytest.raises(ConfigError, match="row 'head'"):
        table(tmp_path)


@pytest.mark.parametrize("rows, runs, message", [
    (None, None, "rows.tsv: missing"),
    ("", None, "rows.tsv:1: expected the experiment's name"),
    ("fedpergnn_flixster\nfull\tno overrides column\n", None, "rows.tsv:2: expected folder, label and overrides"),
    ("fedpergnn_flixster\t\n", None, "rows.tsv: no rows"),
    ("fedpergnn_flixster\t\nfull\tthe whole experiment\t\n", "job,seed,status\n0,0,error: diverged\n",
     "row 'full'"),
])
def test_the_table_refuses_what_it_cannot_read_naming_the_file(tmp_path: Path, rows: str | None, runs: str | None,
                                                               message: str) -> None:
    if rows is not None:
        (tmp_path / "rows.tsv").write_text(rows)
    if runs is not None:
        (tmp_path / "full").mkdir()
        (tmp_path / "full" / "runs.csv").write_text(runs)
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "ablation_table.py"), str(tmp_path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 2 and res.stderr.startswith("error:") and message in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and not (tmp_path / "ablation.md").exists()

"""scripts/fclub_figure.py on tiny real multiruns, and the argument checks of the FCLUB reproduction scripts."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIGURE = ROOT / "scripts" / "fclub_figure.py"
PNG = b"\x89PNG\r\n\x1a\n"
#: a tiny world that needs no dataset (ortho-cap θ), 2 seeds, T = 400 logged every 40 rounds (so T/10 is a row)
TINY = ["+experiment=fclub_synthetic", "env.theta=ortho_cap", "replicates=2", "task.steps=400",
        "task.steps_per_round=40", "trainer.enable_progress_bar=false", "logger.tensorboard=false", "plots=false",
        "hydra.sweep.subdir=${hydra.job.override_dirname}",
        "hydra.job.config.override_dirname.exclude_keys=[experiment,env.theta,replicates,task.steps,"
        "task.steps_per_round,trainer.enable_progress_bar,logger.tensorboard,plots]"]


def multiruns(*sweeps: tuple[Path, list[str]]) -> None:
    """``train.py -m`` into each sweep folder with its overrides, side by side (one process each)."""
    procs = [subprocess.Popen([sys.executable, str(ROOT / "train.py"), "-m", *TINY, f"hydra.sweep.dir={sweep}",
                               *overrides], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for sweep, overrides in sweeps]
    for proc in procs:
        _, err = proc.communicate()
        assert proc.returncode == 0, err[-2000:]


def figure(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(FIGURE), *args], cwd=ROOT, capture_output=True, text=True)


def table_rows(stdout: str, width: int) -> list[list[str]]:
    """The body rows of the Markdown table(s) in ``stdout`` with ``width`` cells."""
    rows = []
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == width and not set(cells[0]) <= {"-"}:
            rows.append(cells)
    return rows[1:] if rows and rows[0][0] in ("conventions", "ε") else rows


def pm(summary: dict, key: str, digits: int = 1) -> str:
    return f"{summary[key]:.{digits}f} ± {summary[f'{key}_std']:.{digits}f}"


def regret_at(run: Path, step: int) -> str:
    with open(run / "metrics.csv", newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["steps"] and float(r["steps"]) == step)
    return f"{float(row['cumulative_regret']):.1f} ± {float(row['cumulative_regret_std']):.1f}"


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """compare/: FCLUB-DC and CLUB × paper and authors conventions; study/epsilon/: CDP-FCLUB-DC at ε = 1 and 4;
    placement/: CDP-FCLUB-DC under both conventions (the authors' runs its noise in the upload trigger only)."""
    root = tmp_path_factory.mktemp("fclub")
    multiruns((root / "compare", ["protocol=fclub_dc,club", "protocol.conventions=paper,authors"]),
              (root / "study" / "epsilon", ["protocol=cdp_fclub_dc", "privacy.epsilon=1,4"]),
              (root / "placement", ["protocol=cdp_fclub_dc", "protocol.conventions=paper,authors"]))
    return root


def test_comparison_table_equals_the_runs_and_draws_both_figures(sweeps: Path) -> None:
    sweep = sweeps / "compare"
    res = figure(str(sweep))
    assert res.returncode == 0, res.stderr
    rows = table_rows(res.stdout, 10)
    protocols = {"FCLUB-DC": "fclub_dc", "CLUB": "club"}
    assert [(r[0], r[1]) for r in rows] == [("paper", "FCLUB-DC"), ("paper", "CLUB"), ("authors", "FCLUB-DC"),
                                            ("authors", "CLUB")]
    for conv, method, at10, at_t, msg, updown, ari, clusters, eps, seconds in rows:
        run = sweep / f"protocol.conventions={conv},protocol={protocols[method]}"
        s = json.loads((run / "summary.json").read_text())
        assert s["steps"] == 400 and s["replicates"] == 2
        assert at_t == pm(s, "cumulative_regret")
        assert at10 == regret_at(run, 40)
        assert msg == pm(s, "comm_messages")
        assert updown == f"{s['comm_upload_messages']:.1f} / {s['comm_download_messages']:.1f}"
        assert ari == pm(s, "ari", 3)
        if method == "CLUB":
            assert clusters == f"{s['clusters']:.1f}" and msg == "0.0 ± 0.0"
        else:
            assert clusters == f"{s['global_clusters']:.1f} / {s['local_clusters']:.1f}"
        assert eps == "–" and seconds == f"{s['wall_seconds']:.1f}"
    for name in ("fclub_fig2_regret.png", "fclub_fig4_communication.png"):
        assert (sweep / name).read_bytes()[:8] == PNG


def test_comparison_names_the_trigger_placement_and_reports_no_epsilon_for_it(sweeps: Path) -> None:
    sweep = sweeps / "placement"
    res = figure(str(sweep))
    assert res.returncode == 0, res.stderr
    spent = json.loads((sweep / "protocol.conventions=paper,protocol=cdp_fclub_dc" / "summary.json").read_text())
    assert [(r[0], r[1], r[8]) for r in table_rows(res.stdout, 10)] == [
        ("paper", "CDP-FCLUB-DC", f"{spent['epsilon_spent']:.4g}"),
        ("authors", "CDP-FCLUB-DC (trigger)", "not applicable")]


def test_epsilon_study_table_and_figure(sweeps: Path) -> None:
    sweep = sweeps / "study" / "epsilon"
    res = figure("--epsilon", str(sweep))
    assert res.returncode == 0, res.stderr
    rows = table_rows(res.stdout, 9)
    assert [r[0] for r in rows] == ["1", "4"]
    for eps, at10, at_t, msg, _, ari, _, spent, _ in rows:
        run = sweep / f"privacy.epsilon={eps},protocol=cdp_fclub_dc"
        s = json.loads((run / "summary.json").read_text())
        assert at_t == pm(s, "cumulative_regret") and msg == pm(s, "comm_messages") and ari == pm(s, "ari", 3)
        assert at10 == regret_at(run, 40)
        assert spent == f"{s['epsilon_spent']:.4g}"
    assert "measured: regret at T" in res.stdout
    assert (sweep / "fclub_epsilon.png").read_bytes()[:8] == PNG
    # the same sweep is detected as a one-factor study without the flag, and as one factor of a --study folder
    assert table_rows(figure(str(sweep)).stdout, 9) == rows
    res = figure("--study", str(sweeps / "study"))
    assert res.returncode == 0, res.stderr
    assert "### privacy ε (epsilon)" in res.stdout and table_rows(res.stdout, 9) == rows
    assert (sweeps / "study" / "study_epsilon.png").read_bytes()[:8] == PNG


@pytest.mark.parametrize("args, message", [
    ([], "required"),
    (["{tmp}/missing"], "not a folder"),
    (["{tmp}"], "no run folders"),
    (["--epsilon", "--study", "{tmp}"], "not allowed with"),
    (["--epsilon", "{compare}"], "varied"),
    (["--study", "{tmp}"], "no sweep folders"),
])
def test_figure_refuses_bad_arguments(sweeps: Path, tmp_path: Path, args: list[str], message: str) -> None:
    res = figure(*(a.format(tmp=tmp_path, compare=sweeps / "compare") for a in args))
    assert res.returncode == 2 and "error:" in res.stderr and message in res.stderr, res.stderr


@pytest.mark.parametrize("script, args, message", [
    ("reproduce_fclub.sh", ["{out}", "ten"], "SEEDS"),
    ("reproduce_fclub.sh", ["{out}", "2", "405"], "multiple of 10"),
    ("reproduce_fclub.sh", ["{out}", "2", "400", "fclub_netflix"], "DATASET"),
    ("reproduce_fclub.sh", ["{full}", "2", "400"], "already holds results"),
    ("fclub_study.sh", ["{out}", "0"], "SEEDS"),
    ("fclub_study.sh", ["{out}", "2", "-5"], "STEPS"),
    ("fclub_study.sh", ["{full}", "2", "400"], "already holds results"),
])
def test_scripts_refuse_bad_arguments(tmp_path: Path, script: str, args: list[str], message: str) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "table.md").write_text("a result\n")
    res = subprocess.run(["bash", str(ROOT / "scripts" / script),
                          *(a.format(out=tmp_path / "out", full=tmp_path / "full") for a in args)],
                         capture_output=True, text=True, env={**os.environ, "FCLUB_DATASET": ""})
    assert res.returncode == 2 and "error:" in res.stderr and message in res.stderr, res.stderr
    assert not (tmp_path / "out").exists()

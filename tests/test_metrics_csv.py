"""``metrics.csv`` (:class:`fedrec.app.cli.MetricsCSVLogger`): the bytes Lightning's CSV logger writes, and a file that
a kill during the rewrite forced by a new column leaves whole."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
from lightning_fabric.loggers import CSVLogger

from fedrec.app.cli import MetricsCSVLogger

#: rounds as a run logs them: a column appears in round 2 (e.g. an evaluation every other round)
ROUNDS = [{"loss": 1.5}, {"loss": 1.25}, {"loss": 1.0, "test_rmse": 0.9}, {"loss": 0.75, "test_rmse": 0.8}]


def write(logger: CSVLogger, rounds: list[dict[str, float]]) -> None:
    for step, metrics in enumerate(rounds):
        logger.log_metrics(metrics, step=step)
        logger.save()


def test_the_file_is_lightnings_byte_for_byte(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    write(MetricsCSVLogger(root_dir=str(ours), name="", version=""), ROUNDS)
    write(CSVLogger(root_dir=str(theirs), name="", version=""), ROUNDS)
    assert (ours / "metrics.csv").read_bytes() == (theirs / "metrics.csv").read_bytes()
    with (ours / "metrics.csv").open(newline="") as f:
        assert [row["test_rmse"] for row in csv.DictReader(f)] == ["", "", "0.9", "0.8"]


def test_a_kill_during_the_rewrite_for_a_new_column_keeps_the_rows_written_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logger = MetricsCSVLogger(root_dir=str(tmp_path), name="", version="")
    write(logger, ROUNDS[:2])
    before = (tmp_path / "metrics.csv").read_bytes()

    def killed(self: csv.DictWriter, rows: object) -> None:
        raise KeyboardInterrupt  # as a signal arriving halfway through the rewrite

    monkeypatch.setattr(csv.DictWriter, "writerows", killed)
    with pytest.raises(KeyboardInterrupt):
        write(logger, ROUNDS[2:3])
    assert (tmp_path / "metrics.csv").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.csv"]  # no temporary left behind

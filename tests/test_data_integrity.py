"""Dataset files are checked against the SHA256SUMS beside them when they are read, and a run's checkpoint records
the digests of what it read, so a resume on changed data is refused; identity fields cannot be allowed to change."""
from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from omegaconf import DictConfig

from fedrec.app.cli import run
from fedrec.data.integrity import SUMS, line_count, listed_digest, write_sums
from fedrec.data.ratings import read_raw_ratings
from fedrec.errors import ConfigError

Compose = Callable[..., DictConfig]
RUN = ("+experiment=fedgnn_ml100k", "task.rounds=3", "logger.tensorboard=false", "plots=false")


@pytest.fixture
def ml100k(data_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the ML-100K folder with a SHA256SUMS of its own, as ``download`` installs it."""
    copy = tmp_path / "data"
    shutil.copytree(data_dir / "ml-100k", copy / "ml-100k")
    (copy / "ml-100k" / SUMS).unlink(missing_ok=True)
    write_sums(copy / "ml-100k")
    return copy


def test_the_sums_list_each_file_with_its_sha256(ml100k: Path) -> None:
    path = ml100k / "ml-100k" / "u.data"
    sums, digest = listed_digest(path)
    assert sums == ml100k / "ml-100k" / SUMS
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_shared_data_directory_sums_are_found_one_level_up(data_dir: Path) -> None:
    listed = listed_digest(data_dir / "ml-100k" / "u.data")
    if not (data_dir / SUMS).is_file() and not (data_dir / "ml-100k" / SUMS).is_file():
        assert listed is None
    else:
        assert listed is not None and listed[1] == hashlib.sha256((data_dir / "ml-100k" / "u.data").read_bytes()
                                                                   ).hexdigest()


def test_a_file_truncated_at_a_record_boundary_is_refused_naming_it(ml100k: Path) -> None:
    path = ml100k / "ml-100k" / "u.data"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1000]))  # well-formed, 1,000 ratings short
    with pytest.raises(ConfigError, match=rf"^{path}: its SHA-256 .* differs from .* the file is damaged, truncated"):
        read_raw_ratings("ml-100k", ml100k)


def test_an_unlisted_file_truncated_at_a_record_boundary_is_refused_by_its_line_count(ml100k: Path) -> None:
    (ml100k / "ml-100k" / SUMS).unlink()
    path = ml100k / "ml-100k" / "u.data"
    assert len(read_raw_ratings("ml-100k", ml100k)) == 100_000  # unlisted and whole: read as it is
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:-1000]))
    with pytest.raises(ConfigError, match=rf"^{path}: 99000 lines, but the published file has 100000: it is "
                                          r"truncated or another version; install the dataset again \(or list"):
        read_raw_ratings("ml-100k", ml100k)


def test_a_listed_file_of_its_own_is_read_as_it_is(ml100k: Path) -> None:
    """Listing a file in a SHA256SUMS is how a deliberately different file (a subset) is used."""
    path = ml100k / "ml-100k" / "u.data"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:50]))
    write_sums(ml100k / "ml-100k")
    assert len(read_raw_ratings("ml-100k", ml100k)) == 50


@pytest.mark.parametrize(("text", "lines"), [("", 0), ("a", 1), ("a\n", 1), ("a\nb", 2), ("a\n\nb\n", 3)])
def test_line_count_counts_a_last_line_without_newline(tmp_path: Path, text: str, lines: int) -> None:
    (tmp_path / "f").write_text(text)
    assert line_count(tmp_path / "f") == lines


def test_a_resume_on_changed_data_is_refused(ml100k: Path, tmp_path: Path, compose_cfg: Compose) -> None:
    """Same sizes, other contents: one rating changed (the sums are rewritten, as for a re-installed dataset)."""
    run(compose_cfg(*RUN, f"data_dir={ml100k}", "trainer.max_rounds=2"), output_dir=tmp_path / "part")
    path = ml100k / "ml-100k" / "u.data"
    text = path.read_text()
    first = text.splitlines()[0].split("\t")
    changed = "\t".join([first[0], first[1], "1" if first[2] != "1" else "2", first[3]])
    path.write_text(text.replace("\t".join(first), changed, 1))
    write_sums(ml100k / "ml-100k")
    ckpt = tmp_path / "part" / "checkpoints" / "last.ckpt"
    with pytest.raises(ConfigError, match=r"data_files\.ml-100k/u\.data \(") as info:
        run(compose_cfg(*RUN, f"data_dir={ml100k}", f"ckpt_path={ckpt}"), output_dir=tmp_path / "part")
    assert str(info.value).startswith(f"ckpt_path: {ckpt} is a checkpoint of another run")


@pytest.mark.parametrize("value, needle", [
    ("[seed]", "resume_allow_changes: seed is part of what the run is"),
    ("[data_files]", "resume_allow_changes: data_files is part of what the run is"),
    ("123", "resume_allow_changes: must be a list of dotted field names, got 123"),
])
def test_identity_fields_cannot_be_allowed_to_change(compose_cfg: Compose, tmp_path: Path, value: str,
                                                     needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        run(compose_cfg("task.steps=200", "task.steps_per_round=100", f"resume_allow_changes={value}"),
            output_dir=tmp_path / "run")
    assert str(info.value).startswith(needle)

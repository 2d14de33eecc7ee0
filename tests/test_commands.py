"""The commands fedrec prints for the user (fedrec.utils.commands) name the Python that runs them as it can be typed: a
path below the working directory, ``python`` when the PATH finds that same interpreter, else the absolute path."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fedrec.utils import commands


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A stand-in interpreter at ``tmp_path/.venv/bin/python`` (a link to this Python)."""
    exe = tmp_path / ".venv" / "bin" / "python"
    exe.parent.mkdir(parents=True)
    exe.symlink_to(sys.executable)
    return exe


def test_an_interpreter_below_the_working_directory_is_its_relative_path(venv: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(venv))
    monkeypatch.chdir(tmp_path)
    assert commands.interpreter() == ".venv/bin/python"
    monkeypatch.chdir(venv.parent)
    assert commands.interpreter() == "./python"  # a bare name would be looked up on the PATH


def test_elsewhere_it_is_python_when_the_path_finds_it_else_its_absolute_path(
        venv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", str(venv))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("PATH", str(venv.parent))
    assert commands.interpreter() == "python"
    monkeypatch.setenv("PATH", str(elsewhere))
    assert commands.interpreter() == str(venv)


def test_a_printed_command_runs_as_printed(venv: Path, tmp_path: Path) -> None:
    """Printed from tmp_path by a Python under it, the command runs in a shell there with no PATH to Python."""
    code = "from fedrec.utils.commands import python_command; print(python_command('-c', 'print(\"ran as printed\")'))"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "PATH": "/nonexistent"}
    printed = subprocess.run([str(venv), "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                             check=True).stdout.strip()
    assert shlex.split(printed)[0] == ".venv/bin/python"
    out = subprocess.run(["/bin/sh", "-c", printed], cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ran as printed"

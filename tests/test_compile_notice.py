"""The first run after an install compiles numba kernels for up to a minute: it says so in one line, once; a run
whose kernels numba has cached says nothing."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numba
import pytest

from fedrec.utils.jit import COMPILE_NOTICE, compile_notice

ROOT = Path(__file__).resolve().parents[1]

#: two kernels of a module of the test's own, compiled as fedrec's are (cached on disk)
KERNELS = """
from fedrec.utils.jit import jit


@jit
def add_one(x):
    return x + 1


@jit
def double(x):
    return 2 * x
"""


def load(path: Path, name: str) -> ModuleType:
    """The module at ``path`` imported afresh under ``name`` (new kernels, which numba finds in its cache if there)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_cold_cache_is_announced_once_and_a_warm_one_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "cache"))  # an empty cache of the test's own
    source = tmp_path / "kernels.py"
    source.write_text(KERNELS)
    with compile_notice():
        cold = load(source, "fedrec_test_kernels_cold")
        assert (cold.add_one(1), cold.double(2)) == (2, 4)
    assert capsys.readouterr().err == f"{COMPILE_NOTICE}\n"  # two kernels compiled, one line
    with compile_notice():
        warm = load(source, "fedrec_test_kernels_warm")
        assert (warm.add_one(1), warm.double(2)) == (2, 4)
    assert capsys.readouterr().err == ""


def test_a_function_numba_does_not_cache_is_not_announced(capsys: pytest.CaptureFixture[str]) -> None:
    """numba's own helpers, and functions compiled without a cache, compile in every process: no first use."""
    with compile_notice():
        assert numba.njit(lambda x: x - 1)(1) == 0
    assert capsys.readouterr().err == ""


def test_train_py_on_an_empty_numba_cache_says_once_that_it_compiles(tmp_path: Path) -> None:
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}  # numba's cache in an empty folder
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "+experiment=fedgnn_synthetic", "quick=true",
                           "plots=false", f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.splitlines().count(COMPILE_NOTICE) == 1, proc.stderr[-3000:]

"""The commands fedrec prints for the user to run next (resume a run, continue a sweep, install a dataset), spelt
with the Python that runs now, so that they work as printed outside an activated virtual environment."""
from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path


def interpreter() -> str:
    """This Python as the user can type it: its path relative to the working directory when it lies below it (e.g.
    ``.venv/bin/python`` after the README's set-up), ``python`` when that name finds it on the PATH, else its
    absolute path."""
    exe, cwd = Path(sys.executable), Path.cwd()
    if exe.is_relative_to(cwd):
        relative = exe.relative_to(cwd)
        return str(relative) if len(relative.parts) > 1 else f"./{relative}"
    found = shutil.which("python")
    if found is not None and Path(found).resolve() == exe.resolve():
        return "python"
    return str(exe)


def python_command(*args: str) -> str:
    """``args`` run by :func:`interpreter`, quoted for a POSIX shell."""
    return shlex.join([interpreter(), *args])

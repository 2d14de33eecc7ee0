"""Lazy package exports: a package lists its public names and the submodule of each, and a name's submodule is
imported on first use, so importing the package stays cheap (no pandas, scikit-learn or networkx until needed)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(package: str, where: Mapping[str, str]) -> tuple[list[str], Callable[[str], Any]]:
    """``__all__`` (sorted) and a module ``__getattr__`` that loads ``name`` from ``package.where[name]``."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(f"{package}.{where[name]}"), name)

    return sorted(where), __getattr__

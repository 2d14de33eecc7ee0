"""The documentation site builds strictly, its generated configuration reference covers conf/, and every public
name has a docstring and a place in the API reference."""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
MKDOCS = Path(sys.executable).parent / "mkdocs"

#: the public packages and modules: each must define ``__all__`` (see docs/stability.md)
PUBLIC = (
    "fedrec",
    "fedrec.aggregation",
    "fedrec.bandits",
    "fedrec.data",
    "fedrec.envs",
    "fedrec.errors",
    "fedrec.federation",
    "fedrec.metrics",
    "fedrec.models",
    "fedrec.planners",
    "fedrec.privacy",
    "fedrec.privacy.audit",
    "fedrec.protocols",
    "fedrec.recsys",
    "fedrec.tasks",
    "fedrec.trainer",
)

#: exported names that are data, not classes or functions, so carry no docstring of their own
CONSTANTS = {
    ("fedrec.data", "DATASETS"): "tuple of the dataset names load_ratings accepts",
    ("fedrec.data", "NORMALIZATIONS"): "tuple of the rating normalisations (data.normalize)",
    ("fedrec.data", "SPLITS"): "tuple of the implicit-feedback split rules load_implicit accepts",
    ("fedrec.metrics", "F1_THRESHOLD"): "float; documented by the #: comment above it",
}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not MKDOCS.exists():
        pytest.fail(f"{MKDOCS} is missing: install the docs extra (bash scripts/setup.sh)")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def test_mkdocs_build_strict_succeeds(site: Path) -> None:
    assert (site / "index.html").exists()
    for page in ("getting-started", "concepts", "configuration", "benchmarks", "stability", "threat_model",
                 "papers/async_linucb", "papers/gossip", "papers/vfl", "papers/fclub", "papers/fedgnn_dp",
                 "papers/bgtplanner", "papers/robust_fedrec", "api/bandits", "api/aggregation"):
        assert (site / page / "index.html").exists(), page


def test_configuration_reference_covers_every_group_option_and_experiment(site: Path) -> None:
    html = (site / "configuration" / "index.html").read_text(encoding="utf-8")
    groups = sorted(d for d in CONF.iterdir() if d.is_dir() and d.name != "hydra")  # hydra/: Hydra's own settings
    assert groups
    for group in groups:
        assert f'id="group-{group.name}"' in html, group.name
        for option in group.glob("*.yaml"):
            assert f'id="{group.name}-{option.stem}"' in html, f"{group.name}={option.stem}"
    experiments = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
    assert "quickstart" in experiments
    for name in experiments:
        assert f"+experiment={name}" in html, name
    # every field row has a meaning (from a YAML comment, a sibling option or the target's docstring); code in
    # table cells carries <wbr> where it may wrap (docs/hooks.py)
    rows = re.findall(r"<tr>\s*<td><code>((?:[^<]|<wbr>)+)</code></td>\s*<td><code>(?:[^<]|<wbr>)*</code></td>"
                      r"\s*<td>(.*?)</td>", html, flags=re.S)
    assert len(rows) > 300
    assert [name for name, meaning in rows if not meaning.strip()] == []


def _public_names() -> list[tuple[str, str]]:
    names = []
    for package in PUBLIC:
        module = importlib.import_module(package)
        names += [(package, name) for name in getattr(module, "__all__", ())]
    return names


@pytest.mark.parametrize("package", PUBLIC)
def test_public_package_has_all(package: str) -> None:
    module = importlib.import_module(package)
    assert isinstance(getattr(module, "__all__", None), (list, tuple)), f"{package} has no __all__"
    assert (module.__doc__ or "").strip(), f"{package} has no module docstring"
    assert len(set(module.__all__)) == len(module.__all__), f"{package}.__all__ has duplicates"


def _own_docstring(obj: object) -> str:
    doc = obj.__doc__ if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj) and (doc or "").startswith(f"{obj.__name__}("):
        return ""  # the signature dataclasses write when the class has no docstring
    return (doc or "").strip()


@pytest.mark.parametrize("package", PUBLIC)
def test_every_public_name_exists_and_has_a_docstring(package: str) -> None:
    module = importlib.import_module(package)
    missing, undocumented, unlisted_constants = [], [], []
    for name in getattr(module, "__all__", ()):
        if not hasattr(module, name):
            missing.append(name)
            continue
        obj = getattr(module, name)
        if not (inspect.isclass(obj) or callable(obj)):
            if (package, name) not in CONSTANTS:
                unlisted_constants.append(name)
            continue
        if not _own_docstring(obj):
            undocumented.append(name)
    assert missing == [], f"{package}.__all__ names that do not exist: {missing}"
    assert undocumented == [], f"{package}: public names without a docstring: {undocumented}"
    assert unlisted_constants == [], (f"{package}: exported constants must be listed in CONSTANTS with a reason: "
                                      f"{unlisted_constants}")


@pytest.mark.parametrize("package", PUBLIC)
def test_public_functions_and_methods_have_type_hints(package: str) -> None:
    """Every exported function, and every public method (and ``__init__``) of an exported class, annotates its
    parameters (``self``/``cls`` and ``*args``/``**kwargs`` aside) and its return."""
    module = importlib.import_module(package)
    unannotated = []
    for name in getattr(module, "__all__", ()):
        obj = getattr(module, name)
        functions = [(name, obj)] if inspect.isfunction(obj) else [
            (f"{name}.{attr}", f) for attr, f in vars(obj).items()
            if inspect.isfunction(f) and f.__module__ == obj.__module__  # not typing.Protocol's generated __init__
            and (attr == "__init__" or not attr.startswith("_"))] if inspect.isclass(obj) else []
        for qualname, f in functions:
            sig = inspect.signature(f)
            bare = [p for p, v in sig.parameters.items() if p not in ("self", "cls") and v.annotation is v.empty
                    and v.kind not in (v.VAR_POSITIONAL, v.VAR_KEYWORD)]
            if bare or sig.return_annotation is sig.empty:
                unannotated.append(f"{qualname}({', '.join(bare)}){'' if bare else ' -> ?'}")
    assert unannotated == [], f"{package}: public callables without type hints: {unannotated}"


def test_api_reference_documents_every_public_class_and_function(site: Path) -> None:
    ids: set[str] = set()
    for page in (site / "api").rglob("index.html"):
        ids |= set(re.findall(r'id="(fedrec\.[\w.]+)"', page.read_text(encoding="utf-8")))
    absent = []
    for package, name in _public_names():
        obj = getattr(importlib.import_module(package), name)
        if (package, name) in CONSTANTS:
            continue
        where = {f"{package}.{name}", f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', name)}"}
        if not where & ids:
            absent.append(f"{package}.{name}")
    assert absent == [], f"public names missing from the API reference (docs/api/*.md): {absent}"

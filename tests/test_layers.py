"""fedrec's import layers: every import of a fedrec module (at module level, inside functions and under
``if TYPE_CHECKING:``) points to a lower layer of :data:`LAYERS` or stays inside its own entry of the table, and
the modules import one another without circles."""
from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

#: fedrec's layers, highest first; each is a group of entries (packages or modules). A module belongs to the longest
#: entry that is its dotted name or a prefix of it. An import may point to a lower layer, or to a module of the
#: same entry (a package's own modules); one pointing to another entry of the same layer (sideways) or to a higher
#: layer (upwards) is a violation. ``train.py``, the entry point, sits above them all and calls ``fedrec.app.cli``.
LAYERS: tuple[tuple[str, ...], ...] = (
    # the application layer, fedrec.app
    ("fedrec.app.cli", "fedrec.app.audit_cli"),  # the command lines: train.py's run, python -m fedrec.app.audit_cli
    ("fedrec.app.presets",),  # quick=true expanded into the experiment's recipe, then checked like any override
    ("fedrec.app.schema",),  # a command line checked against the config files before anything is built
    ("fedrec.app.enums",),  # where the config's fixed-choice fields find their choices (imported by name, lazily)
    ("fedrec.app.build", "fedrec.app.sweeps", "fedrec.app.run_folder", "fedrec.app.plots"),  # what the lines run on
    ("fedrec.app.resolvers", "fedrec.app.hydra_private"),  # the configs' resolvers; Hydra's private API, wrapped
    # the library
    ("fedrec.trainer", "fedrec.planners"),  # the round loop, and the budget planners that steer it
    ("fedrec.trainer.callbacks",),  # the hooks the trainer calls and planners implement
    ("fedrec.tasks",),
    ("fedrec.protocols", "fedrec.recsys"),  # bandit protocols; the round of federated recommendation
    ("fedrec.models",),
    ("fedrec.federation", "fedrec.privacy", "fedrec.bandits", "fedrec.envs", "fedrec.aggregation"),
    ("fedrec.data",),  # dataset files, splits and downloads, read by environments and tasks
    ("fedrec.metrics",),  # rating metrics
    # the utilities, fedrec.utils
    ("fedrec.utils.rng", "fedrec.utils.tables", "fedrec.utils.threads", "fedrec.utils.blocks",
     "fedrec.utils.exports", "fedrec.utils.stop_request", "fedrec.utils.commands"),
    ("fedrec.errors", "fedrec.utils.io", "fedrec.utils.jit", "fedrec.utils.seeding"),  # what the utilities build on
    ("fedrec", "fedrec.app", "fedrec.utils"),  # the packages themselves (they import nothing)
)

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fedrec"


def module_name(path: Path) -> str:
    """The dotted name of the fedrec module at ``path`` (a package is its ``__init__.py``)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(module: str, source: str, is_package: bool, known: set[str]) -> set[str]:
    """The fedrec modules of ``known`` that ``source`` (module ``module``) imports anywhere in its text: each
    ``import`` and ``from ... import`` statement, wherever it sits (functions, ``if TYPE_CHECKING:``), relative
    ones resolved; ``from a import b`` names the module ``a.b`` if there is one, else ``a``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                anchor = ".".join(package[: len(package) - node.level + 1])
                base = f"{anchor}.{base}" if base else anchor
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:  # ``import fedrec.x.y`` with y an attribute: its module
                name = name.rpartition(".")[0]
            if name:
                found.add(name)
    return found


def import_graph() -> nx.DiGraph:
    """fedrec's modules, with an edge from each module to every fedrec module it imports."""
    graph = nx.DiGraph()
    known = set(MODULES)
    for module, path in MODULES.items():
        graph.add_node(module)
        for target in imported_modules(module, path.read_text(encoding="utf-8"), path.name == "__init__.py", known):
            if target != module:
                graph.add_edge(module, target)
    return graph


def entry_of(module: str) -> str:
    """The entry of :data:`LAYERS` that ``module`` belongs to (the longest one naming it or a package above it)."""
    entries = [e for layer in LAYERS for e in layer if module == e or module.startswith(e + ".")]
    return max(entries, key=len)


def layer_of(entry: str) -> int:
    """The index of ``entry``'s layer in :data:`LAYERS` (0 = the top)."""
    return next(i for i, layer in enumerate(LAYERS) if entry in layer)


def violations(graph: nx.DiGraph) -> set[tuple[str, str]]:
    """The imports of ``graph`` that go sideways or upwards."""
    bad = set()
    for source, target in graph.edges:
        here, there = entry_of(source), entry_of(target)
        if here != there and layer_of(there) <= layer_of(here):
            bad.add((source, target))
    return bad


def describe(pairs: set[tuple[str, str]]) -> str:
    lines = []
    for source, target in sorted(pairs):
        here, there = entry_of(source), entry_of(target)
        way = "sideways" if layer_of(here) == layer_of(there) else "upwards"
        lines.append(f"  {source} -> {target}  ({here} imports {way} into {there})")
    return "\n".join(lines)


def test_the_scanner_sees_every_kind_of_import() -> None:
    source = (
        "from __future__ import annotations\n"
        "import numpy\n"
        "import fedrec.errors\n"
        "from typing import TYPE_CHECKING\n"
        "from fedrec.data import download, DATASETS\n"
        "from .base import BanditEnv\n"
        "from . import mab\n"
        "if TYPE_CHECKING:\n"
        "    from fedrec.tasks.base import FederatedTask\n"
        "def build():\n"
        "    from fedrec.protocols.base import build_policy\n"
        "    import fedrec.trainer.trainer as tt\n"
    )
    found = imported_modules("fedrec.envs.synthetic", source, is_package=False, known=set(MODULES))
    assert found == {
        "fedrec.errors", "fedrec.data.download", "fedrec.data", "fedrec.envs.base", "fedrec.envs.mab",
        "fedrec.tasks.base", "fedrec.protocols.base", "fedrec.trainer.trainer",
    }  # fmt: skip


def test_every_module_has_a_layer_and_every_entry_a_module() -> None:
    entries = [e for layer in LAYERS for e in layer]
    assert len(entries) == len(set(entries)), "an entry is listed twice in LAYERS"
    unplaced = [m for m in MODULES if entry_of(m) == "fedrec" and m != "fedrec"]
    assert not unplaced, f"add these modules (or their packages) to a layer of LAYERS: {unplaced}"
    unused = [e for e in entries if not any(m == e or m.startswith(e + ".") for m in MODULES)]
    assert not unused, f"LAYERS names modules that do not exist: {unused}"


def test_imports_follow_the_layers() -> None:
    found = violations(import_graph())
    assert not found, f"imports that break the layers of tests/test_layers.py:\n{describe(found)}"


@pytest.mark.parametrize(
    ("source", "target", "why"),
    [
        ("fedrec.trainer.callbacks", "fedrec.trainer.trainer", "upwards"),
        ("fedrec.envs.criteo", "fedrec.federation.vertical", "sideways"),
        ("fedrec.planners.bgtplanner", "fedrec.trainer", "sideways"),
        ("fedrec.data.ratings", "fedrec.envs.base", "upwards"),
    ],
)
def test_the_rule_flags_the_leaks_it_was_written_for(source: str, target: str, why: str) -> None:
    graph = nx.DiGraph([(source, target), ("fedrec.envs.realdata", "fedrec.data.ratings")])
    assert violations(graph) == {(source, target)}
    assert why in describe({(source, target)})


def test_modules_import_one_another_without_circles() -> None:
    cycles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert not cycles, f"import circles (each set imports itself through the others): {cycles}"


def test_the_top_level_holds_packages_and_a_few_substantial_modules() -> None:
    """Small helpers live in ``fedrec.utils`` and the application in ``fedrec.app``: a module directly under
    ``fedrec/`` (other than ``__init__.py``) is a public library module of at least 30 lines."""
    small = {path.name: n for path in PACKAGE.glob("*.py") if path.name != "__init__.py"
             and (n := len(path.read_text(encoding="utf-8").splitlines())) < 30}
    assert not small, f"top-level modules under 30 lines (move them into fedrec/utils or a package): {small}"

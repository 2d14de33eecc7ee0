"""The table of :mod:`fedrec.app.enums` cannot drift from the code: every
``check_choice("group.field", value, CONSTANT)`` in fedrec (a literal dotted name, a constant) has its entry, pointing
at that very constant; every entry resolves to strings, and every class it names takes the field."""
from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from fedrec.app import enums, schema

PACKAGE = Path(__file__).resolve().parents[1] / "fedrec"
#: dotted names whose check_choice passes choices computed where it is called (no constant to point at), and why
#: they are left to the built object
UNREGISTERED = {
    "privacy.mechanism": "ClientDP's ('none', *mechs): the privacy group's option (privacy=none|gaussian|laplace) "
                         "selects it",
}


def obj(where: str) -> object:
    """The object at ``where`` (``module:NAME`` or ``module:Class.NAME``), as it is (not copied)."""
    module, _, name = where.partition(":")
    value: object = importlib.import_module(module)
    for part in name.split("."):
        value = getattr(value, part)
    return value


def dotted_calls() -> list[tuple[str, str, str | None]]:
    """(module, dotted field name, ``module:NAME`` of the choices or None if they are no constant) of every
    ``check_choice`` call in fedrec with a literal dotted first argument."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        classes = {id(n): c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for n in ast.walk(c)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and len(node.args) >= 3
                    and getattr(node.func, "id", getattr(node.func, "attr", None)) == "check_choice"):
                continue
            name, choices = node.args[0], node.args[2]
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str) and "." in name.value
                    and " " not in name.value):
                continue
            if isinstance(choices, ast.Name):
                where = f"{module}:{choices.id}"
            elif (isinstance(choices, ast.Attribute) and isinstance(choices.value, ast.Name)
                  and choices.value.id in ("self", "cls") and id(node) in classes):
                where = f"{module}:{classes[id(node)]}.{choices.attr}"
            else:
                where = None
            found.append((module, name.value, where))
    return found


CALLS = dotted_calls()


def test_the_scan_finds_the_calls_it_was_written_for() -> None:
    fields = {field for _, field, _ in CALLS}
    assert {"task.optimizer", "strategy.participation", "protocol.layout", "privacy.placement"} <= fields
    assert ("fedrec.protocols.client_server", "protocol.layout",
            "fedrec.protocols.client_server:ClientServerLinUCB.LAYOUTS") in CALLS
    assert len(CALLS) >= 25


@pytest.mark.parametrize("module, field, where", CALLS, ids=[f"{m}:{f}" for m, f, _ in CALLS])
def test_every_dotted_check_choice_has_its_entry(module: str, field: str, where: str | None) -> None:
    if where is None:
        assert field in UNREGISTERED, (f"{module}: check_choice({field!r}, ...) passes no constant; name its choices "
                                       "in a module constant and add it to fedrec/app/enums.py")
        return
    leaf = field.rpartition(".")[2]
    entries = [w for k, w in enums.CHOICES.items() if k == field]
    entries += [w for (_, name), w in enums.CLASS_CHOICES.items() if name == leaf]  # where it depends on the class
    assert entries, (
        f"{module}: check_choice({field!r}, ..., {where.partition(':')[2]}) has no entry in fedrec/app/enums.py")
    assert any(obj(w) is obj(where) for w in entries), (
        f"fedrec/app/enums.py points {field} at {entries}, but {module} checks it against {where}")


@pytest.mark.parametrize("where", sorted({*enums.CHOICES.values(), *enums.CLASS_CHOICES.values()}))
def test_every_entry_resolves_to_strings(where: str) -> None:
    choices = enums.resolve(where)
    assert choices and all(isinstance(c, str) for c in choices)


@pytest.mark.parametrize("target, field", sorted(enums.CLASS_CHOICES))
def test_every_class_of_an_entry_takes_its_field(target: str, field: str) -> None:
    cfg = OmegaConf.create({"node": {"_target_": target}})
    assert schema._parameter(f"node.{field}", cfg, schema.CommandLine((), ())) is not None, (
        f"{target} takes no argument {field!r}")


def test_a_class_entry_wins_over_the_dotted_one_and_other_classes_are_left_alone() -> None:
    assert enums.where_of("env.noise", "fedrec.envs.mab.MultiAgentMAB") == "fedrec.envs.mab:NOISES"
    assert enums.where_of("env.noise", "fedrec.envs.synthetic.LinearEnv") is None  # its literal ("std", "variance")
    assert enums.choices_of("task.optimizer", None) == ("adam", "sgd")
    assert enums.choices_of("task.seed", None) is None

"""Every fenced code block of README.md and docs/ runs, so that a doc that does not run fails the tests (issue 44).

The blocks are read from the Markdown. A ``bash``/``sh``/``shell``/``console`` block is split into commands (``\\``
continuations joined, ``#`` comments dropped, ``cd DIR`` moving the block's later commands, ``VAR=value`` prefixes
kept as their environment); a ``python`` block is a program. Commands run in a temporary workspace that links the
checkout's ``.venv``, ``train.py``, ``conf``, ``scripts`` and ``examples``, so that they run as written, relative
paths and all, and write nothing into the checkout; the datasets are read from ``FEDREC_DATA_DIR``, as by every test.
Commands call ``.venv/bin/python`` (what ``scripts/setup.sh`` creates, and what the README's set-up commands run):
a bare ``python`` or ``pip`` fails the tests, as it would outside an activated environment.

What runs where:

* default suite
    * every ``train.py`` and ``python -m fedrec.app.audit_cli`` command: ``quick=true`` appended, expanded and checked
      against the config files in process (``fedrec.app.presets.expand_quick``, then
      ``fedrec.app.schema.check_command_line``: what ``train.py`` does before Hydra runs anything);
    * the commands of :data:`RUN_BY_DEFAULT` (one or two per page or experiment family, the known failures among
      them): run in process with ``quick=true``, ``hydra.run.dir``/``hydra.sweep.dir`` in the workspace unless the
      command names its own, and exit code 0 (the run checks them as above first, as ``train.py`` does);
    * ``python -m fedrec.data list`` and ``download`` of a dataset the data directory holds (a check, no network);
    * every ``bash scripts/*.sh`` command: the script run with a recording ``.venv/bin/python`` (and a ``sleep``
      that does not wait) in a workspace of its own (its output folder there), and every ``train.py`` line it would
      run checked as above (without ``quick=true``: the reproductions' own settings), its groups and values against
      its schemas; the config a line composes with its values is checked for one line of each shape (the same flags,
      group choices and keys set: lines that differ only in values, such as ``privacy.conventions=paper`` and
      ``=authors``);
    * ``python`` blocks: pages whose blocks run in seconds, in one fresh namespace per page in order (``docs/papers/
      robust_fedrec.md``); a block that shows code of the library (``doc-test: defines FILE``) is checked against
      that file: each class and function it shows exists there, with the same parameters, methods and fields.

  Hydra's compositions take most of this time: the checks and default runs share them within a worker
  (:func:`cached_hydra`: each config file read once, each group listing and composition of the same command-line
  groups and values made once; the answers are Hydra's own).
* ``slow`` (``-m slow``): every command run in full as above, ``quick=true`` appended to ``train.py`` and
  ``fedrec.app.audit_cli`` commands (the scripts with their documented arguments, minutes to an hour each); every
  ``train.py`` line of every script checked in full, each composed with its own values, without the shared
  compositions; and every ``python`` page (``docs/library.md`` trains FedGNN for 100 rounds, about 25 s).

A block or one of its commands opts out only by an HTML comment on the lines before its fence, which MkDocs and
GitHub do not show: ``<!-- doc-test: skip "SUBSTRING" (reason) -->`` (without ``"SUBSTRING"``: the whole block) or
``<!-- doc-test: compose-only "SUBSTRING" (reason) -->`` (checked, never run). A block or command that is neither run
nor skipped with a reason fails the tests, and so does a marker that matches nothing.
"""
from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import re
import shlex
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import hydra_state_restored

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
SHELL, PYTHON = ("bash", "sh", "shell", "console"), ("python", "py")
#: what the README's set-up makes (scripts/setup.sh); a command calls it by this path from the repository root
VENV_PYTHON = ".venv/bin/python"
#: what the workspace links from the checkout, so that the commands run as written
LINKED = (".venv", "train.py", "conf", "scripts", "examples")
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
_MARKER = re.compile(r"<!--\s*doc-test:\s*(skip|compose-only|defines)\s*(?:\"([^\"]+)\")?\s*(?:\((.*)\))?\s*-->")

#: (page, a text of the command): run in full in the default suite, one or two per page or experiment family
RUN_BY_DEFAULT = (
    ("docs/running.md", "fedrec.app.audit_cli +experiment=fedgnn_ml100k_dp"),
    ("docs/getting-started.md", "train.py +experiment=fedgnn_ml100k"),
    ("docs/papers/recsys_kit.md", "task.eval.ranking=sampled task.eval.save_topk=true"),
    ("docs/extending.md", "'hydra.searchpath=[pkg://myrec.conf]' +experiment=myrec_synthetic quick=true"),
)
#: pages whose python blocks run in the default suite (the others: slow)
PYTHON_BY_DEFAULT = ("docs/papers/robust_fedrec.md",)


@dataclass(frozen=True)
class Marker:
    """An opt-out (or a ``defines`` check) written before a block's fence."""

    kind: str  #: skip | compose-only | defines
    match: str | None  #: the text of the commands it applies to (None: the whole block), or defines' file
    reason: str


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page."""

    page: str  #: relative to the repository root
    line: int  #: of its opening fence
    lang: str
    text: str  #: dedented
    markers: tuple[Marker, ...]


@dataclass(frozen=True)
class Command:
    """One command of a shell block, as the block runs it."""

    block: Block
    text: str  #: as written, continuations joined, comment dropped
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  #: its ``VAR=value`` prefixes
    cwd: str  #: relative to the repository root (a ``cd`` earlier in the block)

    @property
    def id(self) -> str:
        return f"{self.block.page}:{self.block.line}:{self.text}"

    def marker(self) -> Marker | None:
        """The block's marker that applies to this command, if any."""
        return next((m for m in self.block.markers if m.kind in ("skip", "compose-only")
                     and (m.match is None or self.says(m.match))), None)

    def says(self, text: str) -> bool:
        """Whether ``text`` is a run of whole words of the command."""
        return f" {text} " in f" {self.text} "

    @property
    def kind(self) -> str:
        """train | audit | data | script | cd, or what else the command is (``other: ...``)."""
        argv = self.argv
        if argv[0] == "cd":
            return "cd"
        if argv[0] == "bash" and len(argv) > 1 and argv[1].startswith("scripts/"):
            return "script"
        if Path(argv[0]).name != "python" or len(argv) < 2:
            return f"other: {argv[0]}"
        if (ROOT / self.cwd / argv[0]).resolve() != (ROOT / VENV_PYTHON).resolve():
            return f"other: a python that is not {VENV_PYTHON}"
        if Path(argv[1]).name == "train.py":
            return "train"
        module = {"fedrec.app.audit_cli": "audit", "fedrec.data": "data"}
        return module.get(argv[2], f"other: -m {argv[2]}") if argv[1] == "-m" else f"other: {argv[1]}"

    @property
    def arguments(self) -> list[str]:
        """What follows the program (``train.py``, ``-m MODULE``, the script)."""
        return list(self.argv[3:] if self.argv[1] == "-m" else self.argv[2:])


def _markers(lines: list[str], fence: int) -> tuple[Marker, ...]:
    """The doc-test markers on the lines before line ``fence`` (blank lines between them allowed)."""
    found = []
    i = fence - 1
    while i >= 0 and (not lines[i].strip() or _MARKER.search(lines[i])):
        m = _MARKER.search(lines[i])
        if m:
            kind, match, reason = m.groups()
            found.append(Marker(kind, match, (reason or "").strip()))
        i -= 1
    return tuple(reversed(found))


def read_blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, in order."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == m.group(2)), len(lines))
        blocks.append(Block(str(page.relative_to(ROOT)), i + 1, m.group(3).lower(),
                            textwrap.dedent("\n".join(lines[i + 1:end])), _markers(lines, i)))
        i = end + 1
    return blocks


def split_commands(block: Block) -> list[Command]:
    """The commands of a shell block (continuations joined, comments dropped, ``cd`` followed)."""
    commands, cwd = [], "."
    for logical in re.sub(r"\\\n\s*", " ", block.text).splitlines():
        words = shlex.split(logical, comments=True)
        if not words:
            continue
        env = []
        while re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]) and len(words) > 1:
            env.append(tuple(words.pop(0).split("=", 1)))
        text = logical.split(" #", 1)[0].strip()
        commands.append(Command(block, text, tuple(words), tuple(env), cwd))
        if words[0] == "cd":
            cwd = os.path.normpath(os.path.join(cwd, words[1]))
    return commands


BLOCKS = [b for page in PAGES for b in read_blocks(page)]
COMMANDS = [c for b in BLOCKS if b.lang in SHELL for c in split_commands(b)]
PYTHON_PAGES = sorted({b.page for b in BLOCKS if b.lang in PYTHON})


def _runnable(kind: str) -> list[Command]:
    """The commands of ``kind`` that run or are checked (not skipped), each command line once."""
    seen, runnable = set(), []
    for c in COMMANDS:
        if c.kind == kind and (c.marker() is None or c.marker().kind == "compose-only") and \
                (c.argv, c.env, c.cwd) not in seen:
            seen.add((c.argv, c.env, c.cwd))
            runnable.append(c)
    return runnable


def _executed(kind: str) -> list[Command]:
    return [c for c in _runnable(kind) if c.marker() is None]


def _by_default(command: Command) -> bool:
    return any(page == command.block.page and command.says(text) for page, text in RUN_BY_DEFAULT)


def _ids(command: Command) -> str:
    return command.id


# ---- what every block is ---------------------------------------------------------------------------------------------


def test_every_block_and_command_is_run_or_skipped_with_a_reason() -> None:
    assert len(COMMANDS) > 50 and PYTHON_PAGES, "no blocks found: has the Markdown layout changed?"
    unhandled = []
    for block in BLOCKS:
        if block.lang not in (*SHELL, *PYTHON):  # diagrams, trees, formulas, tables
            if re.search(r"(^|\s)(python3?|pip|bash|train\.py)\s", block.text):
                unhandled.append(f"{block.page}:{block.line}: commands in a ```{block.lang} block (label it bash)")
            continue
        for m in block.markers:
            if not m.reason:
                unhandled.append(f"{block.page}:{block.line}: doc-test {m.kind} without a reason")
    for c in COMMANDS:
        if c.kind.startswith("other") and c.marker() is None:
            unhandled.append(f"{c.id}: neither run by this test nor skipped with a reason ({c.kind})")
    assert unhandled == [], "\n".join(unhandled)


def test_every_marker_and_default_run_matches_a_command() -> None:
    """A stale opt-out (its command was edited or removed) fails instead of hiding nothing."""
    stale = [f"{b.page}:{b.line}: {m.kind} {m.match!r}" for b in BLOCKS for m in b.markers
             if m.kind != "defines" and m.match is not None
             and not any(c.block == b and c.says(m.match) for c in COMMANDS)]
    stale += [f"RUN_BY_DEFAULT {page}: {text!r}" for page, text in RUN_BY_DEFAULT
              if sum(c.block.page == page and c.says(text) for c in _executed("train") + _executed("audit")) != 1]
    assert stale == [], "\n".join(stale)


def test_shell_blocks_call_the_set_up_python() -> None:
    """A bare ``python``/``pip`` runs whatever is first on the PATH: outside an activated environment, not
    fedrec's."""
    bare = [c.id for c in COMMANDS if c.argv[0] in ("python", "python3", "pip", "pip3")]
    assert bare == [], f"use {VENV_PYTHON} (or .venv/bin/pip), what scripts/setup.sh creates:\n" + "\n".join(bare)


# ---- running the commands --------------------------------------------------------------------------------------------


def _link_checkout(folder: Path) -> Path:
    for name in LINKED:
        (folder / name).symlink_to(ROOT / name)
    return folder


@pytest.fixture
def workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with the checkout's links (:data:`LINKED`) in which the commands run as written."""
    monkeypatch.chdir(_link_checkout(tmp_path))
    return tmp_path


@pytest.fixture(scope="session")
def _shared_links(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _link_checkout(tmp_path_factory.mktemp("doc_checks"))


@pytest.fixture
def check_workspace(_shared_links: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """:func:`workspace` for the checks, which write nothing: one per test session, so that the commands' checks
    share what Hydra answered (:func:`cached_hydra`) in the same folder."""
    monkeypatch.chdir(_shared_links)
    return _shared_links


@contextmanager
def _as_command(command: Command, workspace: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> Iterator[None]:
    """The process set up as the command runs (its folder, ``PYTHONPATH``, ``sys.argv``), Hydra and logging state
    put back afterwards."""
    cwd = workspace / command.cwd
    monkeypatch.chdir(cwd)
    for name, value in command.env:
        if name != "PYTHONPATH":
            monkeypatch.setenv(name, value)
        for path in reversed(value.split(os.pathsep) if name == "PYTHONPATH" else []):
            monkeypatch.syspath_prepend(str((cwd / path).resolve()))
    monkeypatch.setenv("HYDRA_MAIN_MODULE", "__main__")  # hydra.main finds conf/ beside the script it runs
    monkeypatch.setattr(sys, "argv", argv)
    with hydra_state_restored():
        yield


def _exit_code(main: Callable[[], Any]) -> int:
    try:
        result = main()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return result if isinstance(result, int) else 0


def quick_run_arguments(arguments: list[str], out: str) -> list[str]:
    """``arguments`` with ``quick=true``, and ``hydra.run.dir``/``hydra.sweep.dir`` set to ``out`` where they do not
    name their own, placed right after the command's last override: Hydra's argparse takes the overrides as one run of
    positional arguments, so they cannot follow an option that comes after them (``--cfg hydra -p hydra.launcher``)."""
    given = {a.split("=", 1)[0] for a in arguments}
    extra = ["quick=true", *(f"{key}={out}" for key in ("hydra.run.dir", "hydra.sweep.dir") if key not in given)]
    overrides = [i for i, a in enumerate(arguments) if not a.startswith("-") and ("=" in a or a.startswith("~"))]
    at = overrides[-1] + 1 if overrides else len(arguments)
    return [*arguments[:at], *extra, *arguments[at:]]


def run_command(command: Command, workspace: Path, monkeypatch: pytest.MonkeyPatch, train_script: Any) -> int:
    """Run ``command`` in process (a run of several processes as its own; runs and audits with
    :func:`quick_run_arguments`) and give its exit code."""
    kind, arguments = command.kind, command.arguments
    out = str(workspace / "doc_runs" / str(COMMANDS.index(command)))  # absolute: a command may cd into a link
    processes = (_value(command, key) for key in ("trainer.devices", "trainer.num_nodes"))
    if kind == "train" and any(value not in (None, "1") for value in processes):
        # Fabric starts a run's other processes from this process's own command line (here pytest's) and stops this
        # process when one of them fails, so a run of several processes runs as its own process
        return subprocess.run([sys.executable, str(ROOT / "train.py"), *quick_run_arguments(arguments, out)],
                              cwd=workspace / command.cwd, env={**os.environ, **dict(command.env)}).returncode
    if kind == "train":
        with _as_command(command, workspace, monkeypatch, [str(ROOT / "train.py"),
                                                           *quick_run_arguments(arguments, out)]):
            return _exit_code(train_script.main)
    if kind == "audit":
        from fedrec.app import audit_cli as audit

        with _as_command(command, workspace, monkeypatch, ["fedrec.app.audit_cli",
                                                           *quick_run_arguments(arguments, out)]):
            return _exit_code(audit.cli)
    if kind == "data":
        from fedrec.data.__main__ import main

        with _as_command(command, workspace, monkeypatch, ["fedrec.data", *arguments]):
            return _exit_code(lambda: main(arguments))
    raise AssertionError(f"{command.id}: not a command this test runs in process ({kind})")


#: Hydra's answers within the test session (each worker's), by everything they depend on (see :func:`_where`); the
#: config files do not change while the tests run: the config files as loaded, the group options and the
#: compositions of ``fedrec.app.schema.hydra_lookups``
_LOADED: dict[tuple[Any, ...], bytes] = {}
_OPTIONS: dict[tuple[Any, ...], list[str]] = {}
_COMPOSED: dict[tuple[Any, ...], Any] = {}


def _where(*key: Any) -> tuple[Any, ...]:
    """``key`` with the folders a config's relative and ``pkg://`` paths resolve against."""
    return (*key, os.getcwd(), tuple(sys.path))


@pytest.fixture
def cached_hydra(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hydra's answers kept for the session, the same answers sooner (its compositions take most of the checks'
    time): each config file is read once, each load a copy of its own; ``fedrec.app.schema.hydra_lookups``' group
    listings and compositions are kept by the config, the initialised Hydra's search path and the command line's
    ``hydra.searchpath`` (the schemas a check composes, one per group sweep option, are the same for every command
    of the same groups), shared read only; errors are not kept."""
    import pickle

    from hydra._internal.config_repository import ConfigRepository
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from fedrec.app import schema

    real_load = ConfigRepository.load_config

    def load_config(self: ConfigRepository, config_path: str) -> Any:
        key = _where(tuple((type(s).__name__, s.path) for s in self.get_sources()), config_path)
        if key not in _LOADED:
            _LOADED[key] = pickle.dumps(real_load(self, config_path))
        return pickle.loads(_LOADED[key])  # a copy of its own (Hydra changes what it loads), faster than deepcopy

    monkeypatch.setattr(ConfigRepository, "load_config", load_config)
    real = schema.hydra_lookups

    def hydra_lookups(config_name: str, hydra_overrides: Sequence[str] = ()) -> tuple[Any, Any]:
        options, composed = real(config_name, hydra_overrides)
        search = GlobalHydra.instance().config_loader().get_search_path().get_path()
        where = _where(config_name, tuple(hydra_overrides), tuple((e.provider, e.path) for e in search))

        def cached_options(group: str) -> list[str]:
            if (where, group) not in _OPTIONS:
                _OPTIONS[where, group] = options(group)
            return list(_OPTIONS[where, group])

        def cached_composed(overrides: list[str]) -> Any:
            key = (where, *overrides)
            if key not in _COMPOSED:
                _COMPOSED[key] = composed(overrides)
                OmegaConf.set_readonly(_COMPOSED[key], True)  # shared: a check that changed it would fail here
            return _COMPOSED[key]

        return cached_options, cached_composed

    monkeypatch.setattr(schema, "hydra_lookups", hydra_lookups)


def check_command(command: Command, workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``train.py`` (or ``fedrec.app.audit_cli``) checks before Hydra runs: ``quick=true`` expanded, the command
    line against the config files."""
    from fedrec.app.presets import expand_quick
    from fedrec.app.schema import check_command_line

    name = "audit" if command.kind == "audit" else "config"
    if "hydra/launcher=slurm" in command.arguments:  # checked as on a cluster's login node, where srun is
        srun = workspace / "slurm-bin" / "srun"
        srun.parent.mkdir(exist_ok=True)
        srun.write_text("#!/bin/sh\nexit 0\n")
        srun.chmod(0o755)
        monkeypatch.setenv("PATH", f"{srun.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    with _as_command(command, workspace, monkeypatch, [str(ROOT / "train.py")]):
        check_command_line(CONF, expand_quick(CONF, [*command.arguments, "quick=true"], name), name)


#: the commands run in full by default (:data:`RUN_BY_DEFAULT`): their run checks them first, as train.py does
RUNS = [c for c in _executed("train") + _executed("audit") if _by_default(c)]


@pytest.mark.usefixtures("cached_hydra")
@pytest.mark.parametrize("command", [c for c in _runnable("train") + _runnable("audit") if c not in RUNS], ids=_ids)
def test_command_composes(command: Command, check_workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_command(command, check_workspace, monkeypatch)


def _value(command: Command, key: str) -> str | None:
    return next((a.split("=", 1)[1] for a in command.arguments if a.split("=", 1)[0] == key), None)


def _run_in_order(command: Command, workspace: Path, monkeypatch: pytest.MonkeyPatch, train_script: Any) -> None:
    """Run ``command`` after the run of its block that writes the checkpoint it resumes from, if any."""
    ckpt = _value(command, "ckpt_path")
    block = [c for c in COMMANDS if c.block == command.block]
    needed = [c for c in block[:block.index(command)] if ckpt and c.kind == "train" and c.marker() is None
              and _value(c, "hydra.run.dir") and ckpt.startswith(f"{_value(c, 'hydra.run.dir')}/")]
    assert not ckpt or needed, f"{command.id}: no command of its block writes {ckpt}"
    for c in (*needed, command):
        assert run_command(c, workspace, monkeypatch, train_script) == 0, c.id


@pytest.mark.usefixtures("cached_hydra")
@pytest.mark.parametrize("command", RUNS, ids=_ids)
def test_command_runs(command: Command, workspace: Path, monkeypatch: pytest.MonkeyPatch, train_script: Any) -> None:
    _run_in_order(command, workspace, monkeypatch, train_script)


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c in _executed("train") + _executed("audit") if not _by_default(c)],
                         ids=_ids)
def test_every_command_runs(command: Command, workspace: Path, monkeypatch: pytest.MonkeyPatch,
                            train_script: Any) -> None:
    _run_in_order(command, workspace, monkeypatch, train_script)


@pytest.mark.parametrize("command", _executed("data"), ids=_ids)
def test_data_command_runs(command: Command, workspace: Path, monkeypatch: pytest.MonkeyPatch,
                           train_script: Any) -> None:
    assert run_command(command, workspace, monkeypatch, train_script) == 0


# ---- scripts ---------------------------------------------------------------------------------------------------------

#: stands for .venv/bin/python while a script is recorded: appends its arguments to $DOC_TEST_LOG, makes the sweep
#: or run folder a train.py call names with an empty summary.md (what the scripts read back), and succeeds
_RECORDER = """#!{python}
import json, os, pathlib, sys
with open(os.environ["DOC_TEST_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
for a in sys.argv[2:] if sys.argv[1:2] == ["train.py"] else []:
    if a.startswith(("hydra.sweep.dir=", "hydra.run.dir=")):
        folder = pathlib.Path(a.split("=", 1)[1].strip("'"))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "summary.md").touch()
"""


def script_arguments(command: Command, out: Path) -> list[str]:
    """The script's arguments, its output folder (a reproduction's first argument) in ``out``."""
    arguments = list(command.argv[1:])
    if Path(arguments[0]).name.startswith(("reproduce_", "fclub_study")) and len(arguments) > 1:
        arguments[1] = str(out)
    return arguments


def record_script(command: Command, folder: Path) -> list[list[str]]:
    """The python command lines ``command`` runs: the script run in ``folder`` with a recording python (and a
    ``sleep`` of 0.02 s: a script that waits for its sweeps in turn polls every 2 s, the recorded ones end at
    once)."""
    import json
    import shutil

    (folder / ".venv" / "bin").mkdir(parents=True)
    recorder = folder / ".venv" / "bin" / "python"
    recorder.write_text(_RECORDER.format(python=sys.executable))
    recorder.chmod(0o755)
    (folder / "shims").mkdir()
    (folder / "shims" / "sleep").write_text(f"#!/bin/sh\nexec {shutil.which('sleep')} 0.02\n")
    (folder / "shims" / "sleep").chmod(0o755)
    (folder / "scripts").symlink_to(ROOT / "scripts")
    log = folder / "calls.jsonl"
    env = {**os.environ, **dict(command.env), "DOC_TEST_LOG": str(log),
           "PATH": f"{folder / 'shims'}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["bash", *script_arguments(command, folder / "out")], cwd=folder, capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, f"{command.id}: {proc.stderr[-2000:]}"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def train_calls(command: Command, folder: Path) -> list[list[str]]:
    """The arguments of each ``train.py`` call the script would run (recorded in ``folder``)."""
    calls = [argv[1:] for argv in record_script(command, folder) if argv[:1] == ["train.py"]]
    assert calls, f"{command.id}: runs no train.py"
    return calls


def check_script_calls(calls: list[list[str]], every: bool) -> None:
    """Each call checked as ``train.py`` checks it: its groups and values against its schemas, then the config it
    composes with its values (and what the run needs and uses of it) for ``every`` call, else for the first call of
    each shape: the same flags, group choices (each option of a sweep) and keys set (``hydra.*`` left out: folders).
    Calls of one shape have the same schemas; only the config they compose with their values differs."""
    from hydra._internal.utils import get_args_parser

    from fedrec.app import schema

    shapes: set[tuple[Any, ...]] = set()
    for arguments in calls:
        if not every:
            args, _ = get_args_parser().parse_known_args(arguments)
            with schema.hydra_of(CONF, args):
                options, compose = schema.hydra_lookups(args.config_name or "config",
                                                        schema.searchpath(args.overrides))
                line = schema.check(args.overrides, options, compose)
            flags = tuple(a for a in arguments if a.startswith("-") and a not in args.overrides)
            key = (flags, tuple(str(o.input_line) for o in line.groups),
                   tuple(sorted(str(o.key_or_group) for o in line.values)))
            if key in shapes:
                continue
            shapes.add(key)
        schema.check_command_line(CONF, arguments)


@pytest.mark.usefixtures("check_workspace", "cached_hydra")
@pytest.mark.parametrize("command", _runnable("script"), ids=_ids)
def test_script_train_lines_compose(command: Command, tmp_path: Path) -> None:
    """Each train.py command line the script would run is checked: every group and value, and one call of each
    shape composed with its values (every call: slow; its full run: slow)."""
    check_script_calls(train_calls(command, tmp_path), every=False)


@pytest.mark.slow
@pytest.mark.parametrize("command", _runnable("script"), ids=_ids)
def test_every_script_train_line_composes(command: Command, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each train.py command line the script would run, checked in full as train.py checks it (Hydra's answers not
    memoised)."""
    calls = train_calls(command, tmp_path)
    monkeypatch.chdir(tmp_path)
    check_script_calls(calls, every=True)


@pytest.mark.slow
@pytest.mark.parametrize("command", _executed("script"), ids=_ids)
def test_script_runs(command: Command, workspace: Path) -> None:
    proc = subprocess.run(["bash", *script_arguments(command, workspace / "out")], cwd=workspace, text=True,
                          capture_output=True, env={**os.environ, **dict(command.env)})
    assert proc.returncode == 0, f"{command.id}: {proc.stderr[-3000:]}"


# ---- python blocks ---------------------------------------------------------------------------------------------------


def run_python_page(page: str, workspace: Path) -> None:
    """The page's python blocks in order in one fresh namespace (a block may use what an earlier one defined)."""
    namespace: dict[str, Any] = {"__name__": "__doc_test__"}
    for block in (b for b in BLOCKS if b.page == page and b.lang in PYTHON):
        if any(m.kind == "defines" for m in block.markers):
            continue
        exec(compile(block.text, f"{page}:{block.line}", "exec"), namespace)  # noqa: S102  (the page's own code)


@pytest.mark.parametrize("page", [p for p in PYTHON_PAGES if p in PYTHON_BY_DEFAULT])
def test_python_blocks_run(page: str, workspace: Path) -> None:
    run_python_page(page, workspace)


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PYTHON_PAGES if p not in PYTHON_BY_DEFAULT])
def test_every_python_page_runs(page: str, workspace: Path) -> None:
    run_python_page(page, workspace)


def _parameters(node: ast.FunctionDef) -> list[str]:
    a = node.args
    return [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]


def defined_where_shown(block: Block, source: Path) -> list[str]:
    """What ``block`` shows that ``source`` does not define: each class (its methods' parameters, its fields and
    class attributes) and function (its parameters), by name."""
    spec = importlib.util.spec_from_file_location(f"doc_test_{source.stem}", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    missing = []

    def same_function(shown: ast.FunctionDef, real: Any, where: str) -> None:
        if not callable(real):
            missing.append(f"{where}: not a function")
        elif list(inspect.signature(real).parameters) != _parameters(shown):
            missing.append(f"{where}{tuple(_parameters(shown))}: the source takes "
                           f"{tuple(inspect.signature(real).parameters)}")

    for node in ast.parse(block.text).body:
        real = getattr(module, getattr(node, "name", ""), None)
        if isinstance(node, ast.FunctionDef):
            if real is None:
                missing.append(node.name)
                continue
            same_function(node, real, node.name)
        elif isinstance(node, ast.ClassDef):
            if real is None:
                missing.append(node.name)
                continue
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    same_function(item, vars(real).get(item.name), f"{node.name}.{item.name}")
                elif isinstance(item, ast.AnnAssign) and item.target.id not in getattr(real, "__annotations__", {}):
                    missing.append(f"{node.name}.{item.target.id}")
                elif isinstance(item, ast.Assign) and not all(hasattr(real, t.id) for t in item.targets):
                    missing.append(f"{node.name}.{ast.unparse(item.targets[0])}")
    return missing


@pytest.mark.parametrize("block", [b for b in BLOCKS if any(m.kind == "defines" for m in b.markers)],
                         ids=lambda b: f"{b.page}:{b.line}")
def test_code_shown_from_the_library_matches_it(block: Block) -> None:
    source = ROOT / next(m.match for m in block.markers if m.kind == "defines")
    assert source.is_file(), f"{block.page}:{block.line}: doc-test defines {source}: no such file"
    assert defined_where_shown(block, source) == [], f"{block.page}:{block.line} shows code {source} does not have"

"""The package's code, configs, scripts and examples cite nothing a user of the package lacks.

Docstrings and comments may name a paper and its own sections, equations and algorithms, but not the project's
internal notes (implementation specs, their ambiguity labels and proposal tags, the copies of the papers): a reader
cannot follow "spec §3.2", "AMBIG-4" or "../shared/specs/...". Each pattern below is one such citation; the test
lists every hit as ``file:line``.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: (glob under the repository root) of every file scanned
SCANNED = ("fedrec/**/*.py", "conf/**/*.yaml", "scripts/**/*.py", "scripts/**/*.sh", "train.py", "examples/**/*.py")

#: (label, regex) of a citation of an internal file; all case-insensitive
PATTERNS: tuple[tuple[str, str], ...] = (
    ("spec §", r"\bspec ?§"),                      # "spec §3.2", "spec§3.2", "BGTplanner spec §1.3"
    ("spec <name>.md", r"\bspec \w+\.md\b"),       # "spec fclub.md §2.8"
    ("spec's / spec test", r"\bspec(?:'s| tests?\b)"),  # "the spec's reading", "spec test 5"
    ("specs/", r"\bspecs/"),                       # a path into the specs folder
    ("seeds/", r"\bseeds/(?=[\w.-])"),             # a path into the seed-paper folder (not "seeds" as a word)
    ("AMBIG-", r"\bAMBIG-"),                       # "AMBIG-4": an ambiguity label of a spec
    ("[AMBIG]", r"\[AMBIG\]"),
    ("[PROP]", r"\[PROP\]"),                       # a spec's proposal tag
    ("../shared", r"\.\./shared\b"),
    ("shared/specs", r"\bshared/specs\b"),
    ("shared/seeds", r"\bshared/seeds\b"),
)
COMPILED = tuple((label, re.compile(rx, re.IGNORECASE)) for label, rx in PATTERNS)


def scanned_files(root: Path) -> list[Path]:
    """Every file of :data:`SCANNED` under ``root`` (sorted, without caches)."""
    files = {p for pattern in SCANNED for p in root.glob(pattern) if p.is_file() and "__pycache__" not in p.parts}
    return sorted(files)


def citation_hits(root: Path, files: list[Path] | None = None) -> list[str]:
    """``file:line: [label] text`` for every line of ``files`` (default: :func:`scanned_files`) with a citation."""
    hits = []
    for path in files if files is not None else scanned_files(root):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            labels = [label for label, rx in COMPILED if rx.search(line)]
            if labels:
                hits.append(f"{path.relative_to(root)}:{number}: [{', '.join(labels)}] {line.strip()}")
    return hits


def test_scans_the_package():
    """The globs find the library, the configs and the scripts (a wrong root would pass vacuously)."""
    names = {p.relative_to(ROOT).as_posix() for p in scanned_files(ROOT)}
    assert "fedrec/__init__.py" in names and "train.py" in names
    assert any(n.startswith("conf/") and n.endswith(".yaml") for n in names)
    assert any(n.startswith("scripts/") for n in names)


def test_no_citation_of_private_files():
    hits = citation_hits(ROOT)
    assert not hits, ("citations of files a user of the package does not have (name the paper and its own "
                      "section, equation or algorithm instead):\n" + "\n".join(hits))


@pytest.mark.parametrize("line", [
    '"""The phase rule (spec §2.2)."""',
    "# BGTplanner spec§1.3",
    "x = 1  # see ../shared/specs/gossip.md",
    "# read shared/seeds/000_abc.txt",
    "# specs/fclub.md",
    "# seeds/001_x.txt",
    "#: (AMBIG-7) empty intervals",
    "#: the paper is silent [AMBIG]",
    "#: our reading [PROP]",
    '"""Baselines (spec fclub.md §2.8)."""',
    "# the Spec's reading",
    "# (spec test 5)",
])
def test_a_planted_citation_is_reported(tmp_path, line):
    path = tmp_path / "fedrec" / "planted.py"
    path.parent.mkdir()
    path.write_text(f"x = 0\n{line}\n", encoding="utf-8")
    hits = citation_hits(tmp_path, [path])
    assert len(hits) == 1 and hits[0].startswith("fedrec/planted.py:2: ["), hits


@pytest.mark.parametrize("line", [
    "for seed in seeds: run(seed)",
    "seeds = [0, 1, 2]  # mean over seeds",
    "spec = importlib.util.spec_from_file_location(name, path)",
    "if spec.ranking == 'none': return {}",
    "def evaluate(model, spec: RankingEval) -> None: ...",
    "# numba issue 7135; see docs/papers/gossip.md and the paper's §3.1",
    "# Algorithm 1, line 5 of the FCLUB paper; Eq. (7); App. B.1",
    "# the specification of the shared/data folder's layout",
    "# the paper's Gaussian rewards are ambiguous about the support",
])
def test_legitimate_text_is_not_reported(tmp_path, line):
    path = tmp_path / "planted.py"
    path.write_text(line + "\n", encoding="utf-8")
    assert citation_hits(tmp_path, [path]) == []

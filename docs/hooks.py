"""MkDocs hooks of the fedrec site.

* The configuration reference is generated at build time from ``conf/``: every page that holds the marker
  ``<!-- generated: configuration reference -->`` gets, in its place, one section per config group with one table
  per option (field, default, meaning), the meanings taken from the YAML comments beside or above each field.
* Links from a page to a repository file outside ``docs/`` (``../tests/test_vertical.py``, ``../scripts/...``) keep
  working on GitHub; in the site they become links into ``repo_url`` when the config sets one, else plain text. A
  link to a file that does not exist is a warning, so ``mkdocs build --strict`` fails on it.
* A pipe in a table cell's code span is written ``\\|`` for GitHub and shown as ``|`` on the site, and code in
  table cells wraps only at separators (``<wbr>``; docs/stylesheets/extra.css stops breaks inside words).
* MathJax (for ``pymdownx.arithmatex``'s ``$...$`` formulas) is served from an installed package, not a CDN.
"""
from __future__ import annotations

import importlib.util
import logging
import posixpath
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.fedrec")

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
MARKER = "<!-- generated: configuration reference -->"

#: groups that are not chosen on the command line but included by other options' ``defaults``
INCLUDED_ONLY = {
    "fclub": "shared fields of the FCLUB family, included by `protocol=fclub_dc|fclub|cdp_fclub_dc|homo|homo_dc` "
             "and the per-server baselines",
    "vfl": "shared fields of the vertical protocols, included by `protocol=vfucb|vfts|central_*|partial_*`",
}

_KEY = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w.@/-]*)\s*:(?:\s+(?P<rest>.*))?$")
_ITEM = re.compile(r"^\s*-\s+(?P<item>[^#]*?)\s*(?:#\s?(?P<comment>.*))?$")
_NOT_A_REF = re.compile(r'<autoref (?P<attrs>[^>]*identifier="(?P<id>[^"]*[;\s][^"]*)"[^>]*)>(?P<title>.*?)</autoref>',
                        re.S)
_LINK = re.compile(r"(?<!!)\[(?P<text>[^\]]+)\]\((?P<target>[^)\s]+)\)")
_FENCE = re.compile(r"(^```.*?^```[^\n]*$)", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]+`")
_TABLE_CELL = re.compile(r"<td\b[^>]*>.*?</td>", re.S)
_CELL_CODE = re.compile(r"(<code>)([^<]*)(</code>)")
#: where a long name in a table cell's code may wrap: after a path or list separator, before a dotted module part
_CODE_BREAK = re.compile(r"(?<=[/|,=])(?=.)|(?<=\w)(?=\.[A-Za-z_])")
#: where the site serves MathJax from (mkdocs.yml's extra_javascript); the file comes from the installed
#: django-static-mathjax package (the docs extra), so formulas render without a network
MATHJAX_URI = "javascripts/mathjax/tex-svg.js"


# ---------------------------------------------------------------------------------------------------- reading conf/
def _split_comment(text: str) -> tuple[str, str]:
    """``value  # comment`` -> (value, comment); a ``#`` inside quotes or not preceded by a space is kept."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or text[i - 1].isspace()):
            return text[:i].rstrip(), text[i + 1:].strip()
    return text.rstrip(), ""


def read_option(path: Path) -> dict[str, Any]:
    """One YAML option file: its description (the leading comment block), its ``defaults`` list with each entry's
    comment, the ``@package`` directive and every field as (dotted key, value, comment)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    values = yaml.safe_load("\n".join(lines)) or {}
    header: list[str] = []
    package = None
    comments: dict[str, str] = {}
    defaults: list[tuple[str, str]] = []
    pending: list[str] = []
    stack: list[tuple[int, str]] = []
    seen_key = False
    in_defaults = False
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            text = stripped.lstrip("#").strip()
            if text.startswith("@package"):
                package = text.split(None, 1)[1] if " " in text else None
            elif not seen_key:
                header.append(text)
            else:
                pending.append(text)
            continue
        if not stripped:
            pending = [] if seen_key else pending
            continue
        seen_key = True
        item = _ITEM.match(line)
        if item and in_defaults:
            defaults.append((item["item"], " ".join([*pending, item["comment"] or ""]).strip()))
            pending = []
            continue
        match = _KEY.match(line)
        if not match:
            pending = []
            continue
        indent = len(match["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = ".".join([k for _, k in stack] + [match["key"]])
        stack.append((indent, match["key"]))
        in_defaults = key == "defaults"
        _, trailing = _split_comment(match["rest"] or "")
        comment = " ".join(c for c in [*pending, trailing] if c)
        if comment:
            comments[key] = comment
        pending = []
    fields = [(key, value, comments.get(key, "")) for key, value in _flatten(values) if key != "defaults"]
    return {"header": " ".join(header).strip(), "package": package, "defaults": defaults, "fields": fields,
            "comments": comments}


def _flatten(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from _flatten(value, f"{prefix}{key}" if not prefix else f"{prefix}.{key}")
    else:
        yield prefix, node


def _prefix(group: str, option: dict[str, Any]) -> str:
    """Where an option's fields land in the composed config: the group's node, the root for ``@package _global_``
    (experiments), the protocol node for the shared FCLUB / VFL bases."""
    if option["package"] == "_global_":
        return ""
    return "protocol" if group in INCLUDED_ONLY else group


def config_groups(conf: Path = CONF) -> dict[str, list[Path]]:
    """Every config group under ``conf`` (a folder of YAML options) and its option files, sorted; ``hydra/`` holds
    settings of Hydra itself (launchers), documented on the running page, not run fields."""
    return {d.name: sorted(d.glob("*.yaml")) for d in sorted(conf.iterdir()) if d.is_dir() and d.name != "hydra"}


# ------------------------------------------------------------------------------------ meanings of uncommented fields
class Meanings:
    """Where a field has no comment of its own, its meaning comes from, in order: the same field's comment in
    another option of its group (or, for an experiment's ``protocol.gamma_u``, in the ``protocol`` group), the
    top-level ``config.yaml``, then the ``Args:`` entry of the docstring of the class or function the option
    instantiates (read statically by griffe, nothing imported)."""

    TARGET = "the class or function Hydra instantiates with this node's fields"
    PARTIAL = "Hydra builds a factory (functools.partial) instead of an instance"

    def __init__(self, conf: Path = CONF) -> None:
        self.comments: dict[str, str] = {}
        self.targets: dict[str, set[str]] = {}
        self._docs: dict[str, dict[str, str]] = {}
        self._package: Any = None
        for key, _, comment in read_option(conf / "config.yaml")["fields"]:
            if comment:
                self.comments[key] = comment
        for group, files in config_groups(conf).items():
            for path in files:
                option = read_option(path)
                for key, value, comment in option["fields"]:
                    name = f"{_prefix(group, option)}.{key}".lstrip(".")
                    if comment and group != "experiment":
                        self.comments.setdefault(name, comment)
                    if name.endswith("_target_") and isinstance(value, str):
                        self.targets.setdefault(name.rsplit(".", 1)[0] if "." in name else group, set()).add(value)

    def of(self, name: str) -> str:
        """The meaning of the dotted field ``name`` (``protocol.policy.lam``), or ''."""
        if name.endswith("_target_"):
            return self.TARGET
        if name.endswith("_partial_"):
            return self.PARTIAL
        if name in self.comments:
            return self.comments[name]
        node, _, field = name.rpartition(".")
        for alias in (node, node.rsplit(".", 1)[-1]):  # protocol.policy.lam -> the policy group's lam
            if f"{alias}.{field}" in self.comments:
                return self.comments[f"{alias}.{field}"]
        for target in sorted(self.targets.get(node, ())):
            meaning = self._docstring_args(target).get(field)
            if meaning:
                return meaning
        return ""

    def _docstring_args(self, target: str) -> dict[str, str]:
        if target not in self._docs:
            self._docs[target] = _args_of(self._load(), target)
        return self._docs[target]

    def _load(self) -> Any:
        if self._package is None:
            import griffe

            self._package = griffe.load("fedrec", search_paths=[str(ROOT)], resolve_aliases=False)
        return self._package


def _args_of(package: Any, target: str) -> dict[str, str]:
    """The ``Args:`` entries of ``target``'s docstring (class docstring, else ``__init__``'s), one per name
    (``a, b: ...`` documents both)."""
    obj = _find(package, target.removeprefix("fedrec."))
    if obj is None:
        return {}
    docs = [obj.docstring]
    if obj.is_class and "__init__" in obj.members:
        docs.append(obj.members["__init__"].docstring)
    out: dict[str, str] = {}
    for doc in filter(None, docs):
        for section in doc.parse("google", warnings=False):
            if section.kind.value == "parameters":
                for param in section.value:
                    for name in param.name.split(","):
                        out.setdefault(name.strip(), " ".join(param.description.split()))
    return out


def _find(package: Any, path: str) -> Any:
    try:
        obj = package[path]
        return obj.final_target if obj.is_alias else obj
    except Exception:  # lazily exported (fedrec.tasks.FedRecTask): look in the package's modules
        parent, _, name = path.rpartition(".")
        try:
            modules = package[parent].modules.values() if parent else []
        except Exception:
            return None
        for module in modules:
            if name in module.members:
                return _find(package, f"{module.path.removeprefix('fedrec.')}.{name}")
    return None


# -------------------------------------------------------------------------------------------------------- rendering
def _cell(text: str) -> str:
    """Escape a table cell: pipes (outside code spans), HTML brackets and stray asterisks."""
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):
        parts[i] = (parts[i].replace("|", r"\|").replace("<", "&lt;").replace(">", "&gt;")
                    .replace("*", r"\*"))
    return "".join(parts)


def _value(value: Any) -> str:
    if isinstance(value, str):
        text = value
    else:
        text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
        text = text.removesuffix("\n...").removesuffix("...").strip()
    text = text.replace("`", "'")
    return f"`{text}`" if text else "`''`"


def _table(fields: list[tuple[str, Any, str]], prefix: str, meanings: Meanings) -> list[str]:
    if not fields:
        return ["*(no fields of its own)*", ""]
    out = ["| field | default | meaning |", "|---|---|---|"]
    for key, value, comment in fields:
        name = f"{prefix}.{key}" if prefix else key
        out.append(f"| `{name}` | {_value(value)} | {_cell(comment or meanings.of(name))} |")
    return [*out, ""]


def _defaults_line(defaults: list[tuple[str, str]]) -> list[str]:
    if not defaults:
        return []
    entries = ", ".join(f"`{entry}`" for entry, _ in defaults)
    return [f"Composes: {entries}.", ""]


def config_reference(conf: Path = CONF) -> str:
    """The whole reference in Markdown: top-level keys and group defaults of ``config.yaml``, then every group."""
    root = read_option(conf / "config.yaml")
    groups = config_groups(conf)
    meanings = Meanings(conf)
    out = ["## Top-level keys (`conf/config.yaml`) {#top-level}", "", root["header"], "",
           "| group | default option | meaning |", "|---|---|---|"]
    chosen: dict[str, str] = {}
    for entry, comment in root["defaults"]:
        if ":" in entry:
            group, option = (s.strip() for s in entry.split(":", 1))
            chosen[group] = option
            out.append(f"| [`{group}`](#group-{group}) | `{option}` | {_cell(comment)} |")
    out += ["", *_table(root["fields"], "", meanings)]
    for group, files in groups.items():
        default = chosen.get(group)
        out += [f"## `{group}` {{#group-{group}}}", ""]
        if group == "experiment":
            out += ["Selected with `+experiment=NAME` (none by default). An experiment is a `@package _global_` "
                    "file: it overrides other groups' choices and any key of the composed config.", ""]
        elif group in INCLUDED_ONLY:
            out += [f"Not chosen on the command line: {INCLUDED_ONLY[group]}.", ""]
        else:
            shown = f"`{default}`" if default not in (None, "null") else "none (`null`)"
            out += [f"Options: {', '.join(f'`{f.stem}`' for f in files)}. Default: {shown}. "
                    f"Choose with `{group}=OPTION`; override a field with `{group}.FIELD=VALUE`.", ""]
        for path in files:
            option = read_option(path)
            title = f"`+experiment={path.stem}`" if group == "experiment" else f"`{group}={path.stem}`"
            out += [f"### {title} {{#{group}-{path.stem}}}", ""]
            if option["header"]:
                out += [option["header"], ""]
            out += _defaults_line(option["defaults"])
            out += _table(option["fields"], _prefix(group, option), meanings)
    return "\n".join(out)


# ------------------------------------------------------------------------------------------ links out of docs/
def _outside_links(markdown: str, page_uri: str, docs_dir: Path, repo_url: str | None) -> str:
    chunks = _FENCE.split(markdown)

    def replace(match: re.Match[str]) -> str:
        target = match["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target):
            return match[0]
        path_part = target.split("#", 1)[0]
        resolved = (docs_dir / posixpath.dirname(page_uri) / path_part).resolve()
        if resolved.is_relative_to(docs_dir.resolve()):
            return match[0]
        if not resolved.exists() or not resolved.is_relative_to(ROOT):
            log.warning("Doc file '%s' links to '%s', which is not a file of the repository", page_uri, target)
            return match[0]
        if repo_url:
            return f"[{match['text']}]({repo_url.rstrip('/')}/blob/HEAD/{resolved.relative_to(ROOT).as_posix()})"
        return match["text"]

    for i in range(0, len(chunks), 2):
        chunks[i] = _LINK.sub(replace, chunks[i])
    return "".join(chunks)


# --------------------------------------------------------------------------------------------- pipes in tables
def _table_code_pipes(markdown: str) -> str:
    """GitHub tables need ``\\|`` for a pipe even inside a code span (and show ``|``); Python-Markdown's tables
    never split a row inside a code span and would show the backslash, so the site drops it there."""
    chunks = _FENCE.split(markdown)
    for i in range(0, len(chunks), 2):
        lines = chunks[i].split("\n")
        for j, line in enumerate(lines):
            if line.lstrip().startswith("|"):
                lines[j] = _CODE_SPAN.sub(lambda m: m[0].replace("\\|", "|"), line)
        chunks[i] = "\n".join(lines)
    return "".join(chunks)


def _table_code_breaks(html: str) -> str:
    """Let long commands and option lists in table cells wrap at separators only: the site's CSS keeps code from
    breaking inside a word, and ``<wbr>`` marks where a line may break instead (copying the text is unchanged)."""
    def cell(match: re.Match[str]) -> str:
        return _CELL_CODE.sub(lambda m: m[1] + _CODE_BREAK.sub("<wbr>", m[2]) + m[3], match[0])

    return _TABLE_CELL.sub(cell, html)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs event: fill in the generated reference, resolve links to repository files outside docs/ and unescape
    pipes in tables' code spans."""
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, config_reference())
    markdown = _outside_links(markdown, page.file.src_uri, Path(config["docs_dir"]), config.get("repo_url"))
    return _table_code_pipes(markdown)


def on_files(files: Files, config: Any) -> Files:
    """MkDocs event: add MathJax's self-contained SVG build (no font files) from the installed package."""
    spec = importlib.util.find_spec("mathjax")
    source = Path(spec.origin).parent / "static" / "mathjax" / "es5" / "tex-svg.js" if spec and spec.origin else None
    if source is None or not source.exists():
        raise PluginError("MathJax is missing: install the docs extra (bash scripts/setup.sh), which brings "
                          "django-static-mathjax")
    files.append(File.generated(config, MATHJAX_URI, abs_src_path=str(source)))
    return files


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs event: bracketed math such as ``[x; y][x; y]ᵀ`` (in pages and docstrings) parses as a reference-style
    link; an "identifier" with a semicolon or a space is no Python name or heading, so put the text back. Then mark
    where code in table cells may wrap."""
    return _table_code_breaks(_NOT_A_REF.sub(lambda m: f"[{m['title']}][{m['id']}]", html))

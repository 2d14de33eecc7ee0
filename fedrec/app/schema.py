"""The command line checked against what the config files declare, before anything is built or written.

A run's schema is the config that its group selections (``protocol=sync``, ``+experiment=NAME``, ``~privacy``)
compose to before any value override: every field the selected files declare, typed by its value there. A value
override must name one of those fields (a ``+key=value`` that adds a field no file of the run declares would be
read by nothing, so it is refused), and a field a file declares ``true``/``false`` takes only ``true`` or ``false``
(Hydra reads ``flase`` as the text "flase", which Python would take as true), and a field of fixed choices (an
enum: ``task.optimizer``, ``privacy.placement``, ...; :mod:`fedrec.app.enums` says where each one's choices live in the
code) takes only one of them, each value of a sweep alike. Errors are :class:`ConfigError` naming the field as
typed, with the close matches.
"""
from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from fedrec.errors import ConfigError, did_you_mean

#: what a group's selection looks up: the options of a config group ([] if there is no such group)
GroupOptions = Callable[[str], list[str]]
#: what composes a schema: the config of the given group overrides, with ``hydra.runtime.choices``
Compose = Callable[[list[str]], DictConfig]

_MISSING = object()
#: Hydra's settings that name the folders a run writes into (never empty)
_FOLDERS = ("hydra.run.dir", "hydra.sweep.dir")


@dataclass(frozen=True)
class CommandLine:
    """The overrides of a command line, split into group selections and value overrides (Hydra's own ``hydra.*``
    overrides are left to Hydra)."""

    groups: tuple[Any, ...]  #: overrides that select (or add, or remove) a config group's option
    values: tuple[Any, ...]  #: overrides of a field's value


def parse(overrides: Sequence[str], options: GroupOptions) -> CommandLine:
    """Split ``overrides`` by whether their key is a config group; a line Hydra cannot parse is refused."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    groups, values = [], []
    for line in overrides:
        try:
            override = parser.parse_override(line)
        except HydraException as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else "cannot parse it"
            raise ConfigError(f"{line}: not an override Hydra can read ({first}); the form is key=value, "
                              "+key=value to add a key, ~key to remove one (quote values with spaces or "
                              "brackets)") from None
        if override.is_hydra_override():
            if override.key_or_group in _FOLDERS and not any(str(v or "").strip() for v in elements(override)):
                raise ConfigError(f"{override.key_or_group}: empty; it names the folder the run writes into "
                                  "(the run would write into the current directory)")
            continue
        (groups if options(override.key_or_group) else values).append(override)
    return CommandLine(tuple(groups), tuple(values))


def elements(override: Any) -> list[Any]:
    """The values an override sets: one, or each of a choice or range sweep (an interval sweep's values are drawn
    by its sweeper and not known here)."""
    if not override.is_sweep_override():
        return [override.value()]
    return list(override.sweep_iterator()) if override.is_discrete_sweep() else []


def check_group_options(line: CommandLine, options: GroupOptions) -> None:
    """Every option a group override selects exists in its group (``protocol=asyn`` is refused with the options);
    ``GROUP=null``, which Hydra cannot compose, says how to remove a group instead."""
    for override in line.groups:
        if override.is_delete():
            continue
        group = override.key_or_group
        known = options(group)
        for value in elements(override):
            if value is None:
                raise ConfigError(f"{group}: null is not a config of the {group} group (one of: "
                                  f"{', '.join(sorted(known))}); to run without the group, remove it with '~{group}'")
            if str(value) not in known:
                raise ConfigError(f"{group}: no config '{value}' in the {group} group"
                                  f"{did_you_mean(str(value), known)}; one of: {', '.join(sorted(known))}")


def first_of(overrides: Iterable[Any]) -> list[str]:
    """``overrides`` as command-line text with each sweep at its first value (the other values of a sweep are
    checked in their own jobs)."""
    from hydra.core.override_parser.types import ValueType

    out = []
    for override in overrides:
        if override.value_type == ValueType.INTERVAL_SWEEP:  # an optimising sweeper's range: its lower end
            out.append(f"{override.get_key_element()}={override.value().start}")
        elif override.is_sweep_override() and not override.is_delete():
            first = next(iter(override.sweep_string_iterator()), None)
            if first is None:
                continue
            out.append(f"{override.get_key_element()}={first}")
        else:
            out.append(str(override.input_line))
    return out


def _describe(key: str, schema: DictConfig) -> str:
    """How the error names where a field is missing: the selected option of its group (``privacy=none``)."""
    choices = OmegaConf.select(schema, "hydra.runtime.choices", default=None) or {}
    parts = key.split(".")
    for n in range(len(parts) - 1, 0, -1):
        group = "/".join(parts[:n])
        if choices.get(group) is not None:
            return f"{group}={choices[group]}"
    return "the run's config"


def _target_of(key: str, schema: DictConfig, line: CommandLine) -> str | None:
    """The ``_target_`` of ``key``'s parent node, as the command line may set it (None if the node has none)."""
    parent = key.rpartition(".")[0]
    node = OmegaConf.select(schema, parent, default=None) if parent else None
    if not isinstance(node, DictConfig) or "_target_" not in node:
        return None
    target = node.get("_target_")
    for override in line.values:
        if override.key_or_group == f"{parent}._target_" and not override.is_sweep_override():
            target = override.value()
    return None if target is None else str(target)


def _parameter(key: str, schema: DictConfig, line: CommandLine) -> Any:
    """The keyword parameter (an ``inspect.Parameter``) named by ``key``'s last part of the class that builds
    ``key``'s parent node (:func:`_target_of`), or None if it takes none or cannot be found."""
    import inspect

    from hydra.utils import get_object

    target = _target_of(key, schema, line)
    if target is None:
        return None
    leaf = key.rpartition(".")[2]
    try:
        built = get_object(target)
        callables = [c.__init__ for c in built.__mro__ if "__init__" in vars(c)] if inspect.isclass(built) else [built]
        for f in callables:  # a class whose **kwargs pass on to its base: the base's named arguments too
            params = inspect.signature(f).parameters.values()
            for p in params:
                if p.name == leaf and p.kind not in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL, p.VAR_KEYWORD):
                    return p
            if not any(p.kind is p.VAR_KEYWORD for p in params):
                return None
    except (ImportError, AttributeError, ValueError, TypeError):
        pass  # the build names a target it cannot find
    return None


def _constructor_takes(key: str, schema: DictConfig, line: CommandLine) -> bool:
    """Whether the class that builds ``key``'s parent node (its ``_target_``, as the command line may set it) takes
    ``key``'s last part as a keyword argument: a user's own model's argument is read although no option file
    declares it."""
    return _parameter(key, schema, line) is not None


def _takes_null(key: str, schema: DictConfig, line: CommandLine) -> bool:
    """Whether ``key`` may be null: the run's config declares it null (or as an interpolation that is null or
    cannot be resolved here), or the class that builds its node defaults it to None (or cannot be told: the built
    object checks it)."""
    if OmegaConf.select(schema, key, default=None, throw_on_resolution_failure=False) is None:
        return True
    param = _parameter(key, schema, line)
    return param is None or param.default is None


def check_choices(override: Any, schema: DictConfig, line: CommandLine) -> None:
    """A field of fixed choices (:mod:`fedrec.app.enums`) set to one of them, each value of a sweep alike; an
    interpolation (``${...}``) is left to the run, null to where the field may be null."""
    key = override.key_or_group
    options = None if override.is_delete() else choices(key, schema, line)
    if options is None:
        return
    for value in elements(override):
        if isinstance(value, str) and (value in options or "${" in value):
            continue
        if value is None and _takes_null(key, schema, line):
            continue
        got = "null" if value is None else repr(value)
        raise ConfigError(f"{key}: must be one of {list(options)}, got {got}{did_you_mean(str(value), options)}")


def choices(key: str, schema: DictConfig, line: CommandLine = CommandLine((), ())) -> tuple[str, ...] | None:
    """The choices of field ``key`` of ``schema`` (:mod:`fedrec.app.enums`, for the class that builds its node as the
    command line ``line`` may set it), or None if it is not a field of fixed choices."""
    from fedrec.app import enums

    return enums.choices_of(key, _target_of(key, schema, line))


def check_values(line: CommandLine, schema: DictConfig) -> None:
    """Every value override names a field of ``schema``, keeps a declared boolean a boolean and a field of fixed
    choices one of its choices."""
    for override in line.values:
        key = override.key_or_group
        declared = OmegaConf.select(schema, key, default=_MISSING)
        if declared is _MISSING and _constructor_takes(key, schema, line):
            if not (override.is_add() or override.is_force_add()):
                raise ConfigError(f"{key}: {_describe(key, schema)} does not declare it, but its class takes it: add "
                                  f"it with +{override.input_line.lstrip('+')}")
            check_choices(override, schema, line)
            continue
        if declared is _MISSING:
            parts = key.split(".")
            choices = OmegaConf.select(schema, "hydra.runtime.choices", default=None) or {}
            top = {str(k) for k in schema if k != "hydra"} | {str(g).split("/")[0] for g in choices}
            if len(parts) > 1 and parts[0] not in top:  # a typo of a group or field name (protocl.gamma_u)
                raise ConfigError(f"{key}: the run's config has no '{parts[0]}'{did_you_mean(parts[0], top)}; "
                                  "nothing would read it")
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(schema, parent, default=None) if parent else schema
            fields = [str(k) for k in node if k != "hydra"] if isinstance(node, DictConfig) else []
            nothing = ("" if isinstance(node, DictConfig) or not parent
                       else f" ({parent} is not set; {parent.split('.')[0]}=NAME selects a config of its group)")
            consequence = "nothing to remove" if override.is_delete() else "nothing would read it"
            raise ConfigError(f"{key}: {_describe(key, schema)} has no field '{leaf}'{nothing}"
                              f"{did_you_mean(leaf, fields)}; {consequence}")
        if isinstance(declared, bool) and not override.is_delete():
            for value in elements(override):
                if not isinstance(value, bool):
                    raise ConfigError(f"{key}: must be true or false, got {value!r}")
        check_choices(override, schema, line)


def schemas(line: CommandLine) -> Iterator[list[str]]:
    """The group overrides of the schemas a command line's values are checked against: each sweep at its first
    option, then each other option of each group sweep with the rest at their first (linear in the options, where
    a sweep's jobs are their product; a job checks its own combination)."""
    first = first_of(line.groups)
    yield first
    for i, override in enumerate(line.groups):
        if override.is_sweep_override() and not override.is_delete():
            for option in list(override.sweep_string_iterator())[1:]:
                yield [*first[:i], f"{override.get_key_element()}={option}", *first[i + 1:]]


def check(overrides: Sequence[str], options: GroupOptions, compose: Compose) -> CommandLine:
    """Parse ``overrides``, check their group options, compose the schemas and check the values against them."""
    line = parse(overrides, options)
    check_group_options(line, options)
    if line.values:
        for groups in schemas(line):
            check_values(line, compose(groups))
    return line


def touched_groups(line: CommandLine) -> dict[str, str]:
    """The top-level config groups the command line selects or sets a field of, each with its first override."""
    touched: dict[str, str] = {}
    for override in (*line.groups, *line.values):
        touched.setdefault(re.split(r"[./@]", override.key_or_group)[0], str(override.input_line))
    return touched


def searchpath(overrides: Sequence[str]) -> list[str]:
    """The ``hydra.searchpath=[...]`` overrides of a command line: the config folders (``pkg://`` or ``file://``)
    they add are part of every composition and group listing of the run."""
    return [line for line in overrides if line.split("=", 1)[0].lstrip("+") == "hydra.searchpath"]


@contextmanager
def hydra_of(conf_dir: Path, args: Any) -> Iterator[None]:
    """Hydra initialised with the config search path ``train.py``'s ``hydra.main`` builds for the parsed command
    line ``args``: the primary config folder (``--config-path``, relative to ``train.py``'s folder; else
    ``conf_dir``), and ``--config-dir`` after it."""
    from hydra import version
    from hydra.core.config_search_path import SearchPathQuery
    from hydra.initialize import get_gh_backup, restore_gh_from_backup

    from fedrec.app.hydra_private import config_search_path, start_hydra

    primary = str(conf_dir)
    if args.config_path is not None:
        given = str(args.config_path)
        primary = given if given.startswith("pkg://") or Path(given).is_absolute() else str(conf_dir.parent / given)
    search = config_search_path(primary)
    if args.config_dir is not None:
        extra = Path(args.config_dir).resolve()
        if not extra.is_dir():
            raise ConfigError(f"--config-dir: {extra} is not a folder (the folder of your own config files)")
        search.prepend(provider="command-line", path=f"file://{extra}", anchor=SearchPathQuery(provider="schema"))
    backup = get_gh_backup()
    version.setbase("1.3")
    start_hydra(search)
    try:
        yield
    finally:
        restore_gh_from_backup(backup)


def hydra_lookups(config_name: str, hydra_overrides: Sequence[str] = ()) -> tuple[GroupOptions, Compose]:
    """The group options and the schema composer of the initialised Hydra (inside a Hydra app, or
    :func:`hydra_of`), both seeing the folders ``hydra_overrides`` (:func:`searchpath`) add; a composition Hydra
    refuses is a ConfigError on one line."""
    from hydra import compose
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.object_type import ObjectType
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    loader = GlobalHydra.instance().config_loader()
    extra = list(hydra_overrides)

    def options(group: str) -> list[str]:
        return loader.get_group_options(group, results_filter=ObjectType.CONFIG, config_name=config_name,
                                        overrides=extra)

    def composed(overrides: list[str]) -> DictConfig:
        try:
            return compose(config_name, overrides=[*overrides, *extra], return_hydra_config=True)
        except (HydraException, OmegaConfBaseException) as e:
            message = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
            raise ConfigError(f"{' '.join(overrides) or config_name}: {message}") from None

    return options, composed


def check_command_line(conf_dir: Path, argv: Sequence[str], config_name: str = "config") -> None:
    """``train.py``'s command line checked before Hydra composes it (Hydra's own errors are several lines and exit
    code 1): its groups and values against the schema, then the whole config composed once (each sweep at its
    first value) and its groups against what the run needs and uses. The user's own config folders
    (``hydra.searchpath``, ``--config-dir``, ``--config-path``) are part of the schema; inspection flags
    (``--help``, ``--cfg``, ...) are left to Hydra."""
    from fedrec.app.hydra_private import args_parser

    args, _ = args_parser().parse_known_args(list(argv))
    if (args.help or args.hydra_help or args.info or args.cfg or args.shell_completion
            or args.experimental_rerun):
        return
    with hydra_of(conf_dir, args):
        options, compose = hydra_lookups(args.config_name or config_name, searchpath(args.overrides))
        line = check(args.overrides, options, compose)
        launcher = [o for o in args.overrides if o.split("=", 1)[0].lstrip("+") == "hydra/launcher"]
        cfg = compose([*first_of((*line.groups, *line.values)), *launcher])
    from fedrec.app.build import check_groups, check_ignored, check_used

    if args.multirun:
        check_launcher(cfg)
    check_groups(cfg)
    check_used(cfg, touched_groups(line))
    check_ignored(cfg, [str(o.key_or_group) for o in line.values])


def check_launcher(cfg: DictConfig) -> None:
    """A sweep on SLURM's launcher needs SLURM's ``srun`` here, as submitit does: without it, one line before any
    folder is made, not submitit's traceback."""
    target = str(OmegaConf.select(cfg, "hydra.launcher._target_", default=""))
    if target.endswith(".SlurmLauncher") and shutil.which("srun") is None:
        raise ConfigError("hydra/launcher: the SLURM launcher submits with srun, and this machine has none (not a node "
                          "of a SLURM cluster); submit the sweep from the cluster's login node, or run it here with "
                          "hydra/launcher=joblib")


def check_job(overrides: Sequence[str]) -> CommandLine:
    """A Hydra job's own overrides against its own schema: the jobs of a sweep over groups differ in what they
    declare (``-m privacy=none,gaussian privacy.epsilon=4`` fails in the job without a privacy mechanism)."""
    from hydra.core.hydra_config import HydraConfig

    hydra = HydraConfig.get()
    options, compose = hydra_lookups(hydra.job.config_name, searchpath(hydra.overrides.hydra))
    return check(overrides, options, compose)

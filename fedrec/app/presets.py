"""``quick=true``: an experiment's short recipe, a run of seconds that exercises everything the full one does.

Every experiment file lists its recipe as ``quick_recipe``: command-line overrides (``task.steps=200``,
``planner.min_rounds=6``, ...) that make it small. :func:`expand_quick` appends them to a command line that says
``quick=true``, leaving out those whose key the command line sets itself (the user's value wins) and those for a
field the run does not have (``planner.min_rounds`` under ``planner=uniform``), so the run is an ordinary run of
those overrides: checked by the schema like any typed override, recorded in the run's
``.hydra/overrides.yaml``, named in its plots' titles and resumable with the same command line.

A sweep over a group's options (``-m planner=uniform,bgtplanner quick=true``) takes on its command line the entries
every option has; an entry for a field only some of its jobs have cannot go there (Hydra refuses it in the others),
so :func:`job_recipe` applies it in each job that has the field. That job resumes with its own command line, whose
``quick=true`` expands to the same recipe.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from fedrec.errors import ConfigError

#: the switch and the list it expands
SWITCH, RECIPE = "quick", "quick_recipe"
_ABSENT = object()


def _key(override: Any) -> str:
    """The field an override sets, without its ``+``/``++``/``~`` prefix."""
    return str(override.key_or_group)


def _recipe(cfg: DictConfig, given: set[str], has: Callable[[str], bool] | None = None) -> list[str]:
    """The entries of ``cfg``'s recipe whose key ``given`` does not set and that ``has`` (a predicate on keys;
    default: ``cfg`` has the field) accepts."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    recipe = cfg.get(RECIPE)
    if not recipe:
        raise ConfigError(f"{SWITCH}=true: the experiment '{cfg.get('name')}' declares no {RECIPE}")
    has = has or (lambda key: OmegaConf.select(cfg, key, default=_ABSENT) is not _ABSENT)
    parser = OverridesParser.create()
    keys = {entry: _key(parser.parse_override(entry)) for entry in recipe}
    return [entry for entry, key in keys.items() if key not in given and has(key)]


def expand_quick(conf_dir: Path, argv: Sequence[str], config_name: str = "config") -> list[str]:
    """``argv`` with the composed experiment's ``quick_recipe`` appended when it sets ``quick=true`` (else ``argv``
    itself); a recipe entry whose key ``argv`` sets, or that the composed config does not have (in a sweep over a
    group: that any of its options does not have, see :func:`job_recipe`), is left out. A sweep over experiments
    is refused: each has its own recipe."""
    from fedrec.app.hydra_private import args_parser

    args, _ = args_parser().parse_known_args(list(argv))
    if not any(line.split("=", 1)[0].lstrip("+") == SWITCH for line in args.overrides):
        return list(argv)
    from fedrec.app import schema

    with schema.hydra_of(conf_dir, args):
        options, compose = schema.hydra_lookups(args.config_name or config_name, schema.searchpath(args.overrides))
        line = schema.check(args.overrides, options, compose)
        swept = [o for o in line.groups if _key(o).lstrip("+") == "experiment" and o.is_sweep_override()]
        if swept:
            raise ConfigError(f"{SWITCH}=true: {swept[0].input_line} sweeps over experiments, each with its own "
                              "quick recipe; run the quick recipe of one experiment at a time")
        cfg = compose(schema.first_of((*line.groups, *line.values)))
        if cfg.get(SWITCH) is not True:
            return list(argv)
        options_cfgs = [cfg, *(compose(groups) for groups in list(schema.schemas(line))[1:])]
    given = {_key(o) for o in (*line.groups, *line.values)}
    recipe = _recipe(cfg, given, lambda key: all(
        OmegaConf.select(c, key, default=_ABSENT) is not _ABSENT for c in options_cfgs))
    end = _end_of_overrides(list(argv))
    return [*argv[:end], *recipe, *argv[end:]]


def _end_of_overrides(argv: list[str]) -> int:
    """Where the run of overrides holding ``quick=...`` ends in ``argv``: the recipe goes there, since argparse
    takes one run of overrides (``quick=true --cfg job`` gets the recipe before ``--cfg``)."""
    end = max(i for i, token in enumerate(argv) if token.split("=", 1)[0].lstrip("+") == SWITCH) + 1
    while end < len(argv) and not argv[end].startswith("-"):
        end += 1
    return end


def quick_notes(cfg: DictConfig, summary: Mapping[str, Any]) -> list[str]:
    """What a ``quick=true`` run's headline says that the full run's would not: a clustering score of 0 (``ari``)
    comes of a recipe that ends before the clusters form (FCLUB's quick runs all end so), not of the method."""
    if cfg.get(SWITCH) is not True or summary.get("ari") != 0:
        return []
    return [f"{SWITCH}=true: ari = 0 because the recipe ends before the clusters form (a run of seconds); the full "
            "run (without quick=true) measures the clustering"]


def job_recipe(cfg: DictConfig) -> list[str]:
    """The recipe entries a job of a ``quick=true`` sweep takes beyond its command line, applied to ``cfg`` (the
    job's config, in place): those for fields only some of the sweep's jobs have, which :func:`expand_quick` left
    out. Outside a sweep, or without ``quick=true``, nothing."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    hydra = HydraConfig.get()
    if hydra.mode != RunMode.MULTIRUN or cfg.get(SWITCH) is not True:
        return []
    parser = OverridesParser.create()
    entries = _recipe(cfg, {_key(parser.parse_override(o)) for o in hydra.overrides.task})
    for entry in entries:
        override = parser.parse_override(entry)
        OmegaConf.update(cfg, _key(override), override.value(), merge=False)
    return entries

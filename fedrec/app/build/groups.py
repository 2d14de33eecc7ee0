"""Check a composed config's groups and fields against its task kind before anything is built, and instantiate a
group so that its errors name it (``error: protocol: ...``)."""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import get_class, get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from fedrec.app.build.kinds import KINDS, Kind, own_groups
from fedrec.errors import ConfigError, DatasetNotFoundError


def one_line(e: BaseException) -> str:
    """An exception's message on one line."""
    return re.sub(r"\s+", " ", str(e)).strip()


#: the start of a message that already names a dotted field (``task.pseudo_items must ...``)
_NAMES_FIELD = re.compile(r"[A-Za-z_]\w*\.[A-Za-z_]\w*")


def _in_group(key: str, message: str) -> str:
    """``message`` of an error raised while building config group ``key``, prefixed ``key: `` unless it already
    names a dotted field: the task's check of ``attack.fraction`` names that field, not the task."""
    return message if _NAMES_FIELD.match(message) else f"{key}: {message}"


def instantiate_group(node: DictConfig, key: str, **kwargs: Any) -> Any:
    """Instantiate config ``node`` with ``kwargs``; errors name the config group ``key`` (:func:`_in_group`)."""
    try:  # partial first: Hydra would turn dataclass arguments (e.g. RatingData) into configs
        factory = instantiate(node, _partial_=True, _recursive_=False)
    except InstantiationException as e:
        raise ConfigError(f"{key}: {one_line(e)}") from e
    try:
        return factory(**kwargs)
    except (ConfigError, DatasetNotFoundError) as e:
        raise type(e)(_in_group(key, str(e))) from e
    except TypeError as e:
        if "argument" not in str(e):  # not a bad or missing config key: a genuine error
            raise
        raise ConfigError(f"{key}: {e}") from e


def group_target(node: Any, key: str, *, kind: Callable[[str], Any] = get_object) -> Any:
    """What a config group's ``_target_`` names, a class or a function (errors name the group)."""
    target = node.get("_target_") if isinstance(node, DictConfig) else None
    if target is None:
        raise ConfigError(f"{key}: the group builds nothing (it has no _target_)")
    try:
        return kind(str(target))
    except (ImportError, AttributeError, ValueError) as e:
        what = "class" if kind is get_class else "target"
        raise ConfigError(f"{key}: cannot find the {what} {target!r} ({one_line(e)})") from e


def group_class(node: Any, key: str) -> type:
    """The class a config group's ``_target_`` names (errors name the group)."""
    return group_target(node, key, kind=get_class)


def task_kind(cfg: DictConfig) -> str:
    """The kind of task ``cfg`` describes: what the class ``task._target_`` names declares (a registered kind,
    :func:`~fedrec.app.build.kinds.register_kind`)."""
    if cfg.get("task") is None:
        raise ConfigError("task: a run needs the task group (task=NAME, a file of conf/task/)")
    kind = getattr(group_class(cfg.task, "task"), "kind", None)
    if kind not in KINDS:
        raise ConfigError(f"task: {cfg.task._target_} declares no task kind fedrec builds (kind one of "
                          f"{list(KINDS)}, got {kind!r})")
    return kind


def _article(word: Any) -> str:
    return "an" if str(word)[:1] in "aeiou" else "a"


def check_groups(cfg: DictConfig) -> None:
    """The config groups the run's kind needs are there (not removed with ``~env``, ``~model``, ...) and those of
    other kinds are absent, before anything is built (errors name the group)."""
    kind = KINDS[task_kind(cfg)]
    what = f"a {kind.label} run (task={cfg.task._target_})"
    for group in kind.groups:
        if cfg.get(group) is None:
            raise ConfigError(f"{group}: {what} needs the {group} group ({group}=NAME, a file of conf/{group}/)")
    for group in sorted(own_groups() - set(kind.groups)):
        if cfg.get(group) is not None:
            raise ConfigError(f"{group}: {what} does not use the {group} group (remove it with ~{group}, or pick "
                              f"the task of a run that uses it)")
    for group in ("env", "protocol"):  # what each declares it runs under (kind), before anything is built
        if group in kind.groups:
            serves = getattr(group_class(cfg[group], group), "kind", None)
            if serves != kind.name:
                cls = cfg[group]._target_.rsplit(".", 1)[-1]
                task = {"bandit": "task=bandit with ~topology",
                        "multi_agent": "task=multi_agent with a topology=..."}.get(serves)
                pick = f"pick {_article(group)} {group} of {what}"
                instead = f"{pick}, or {task}" if task else pick
                raise ConfigError(f"{group}: {cls} is {_article(serves)} {str(serves).replace('_', '-')} {group}; "
                                  f"{instead}")


def unused_groups(cfg: DictConfig) -> dict[str, str]:
    """The groups ``cfg`` composes (``conf/config.yaml`` selects some for every run) that its kind does not read,
    each with why: another kind's optional groups, and what the kind's own ``unused`` hook names (e.g. a policy
    its protocol does not take). Setting them on the command line would change nothing."""
    kind = KINDS[task_kind(cfg)]
    owners: dict[str, list[Kind]] = {}
    for other in KINDS.values():
        for group in other.optional:
            if other is not kind and group not in kind.optional:
                owners.setdefault(group, []).append(other)
    unused = {group: f"a {kind.label} run {them[0].optional[group]} (it belongs to "
                     f"{' and '.join(k.label for k in them)} runs)" for group, them in owners.items()}
    if kind.unused is not None:
        unused.update(kind.unused(cfg))
    return unused


def check_used(cfg: DictConfig, touched: Mapping[str, str]) -> None:
    """No command-line override (``touched``: group -> the override) sets a group the run does not use (for a
    ``cfg`` that passed :func:`check_groups`)."""
    for group, reason in unused_groups(cfg).items():
        if group in touched:
            raise ConfigError(f"{group}: {reason}; '{touched[group]}' would change nothing")


def ignored_fields(cfg: DictConfig) -> dict[str, str]:
    """Fields the run's options leave unread, each with why: a value set on the command line would change
    nothing (sampled-ranking negatives without sampled ranking, a noise placement without noise)."""
    ignored: dict[str, str] = {}
    kind = task_kind(cfg)
    if kind == "recommendation":
        ranking = OmegaConf.select(cfg, "task.eval.ranking", default=None)
        if ranking != "sampled":
            shown = ranking if ranking is not None else "null (full on implicit data, none on ratings)"
            ignored["task.eval.negatives"] = (f"only sampled ranking reads it, and task.eval.ranking={shown}; set "
                                              "task.eval.ranking=sampled")
    elif isinstance(cfg.get("protocol"), DictConfig) and "noise_placement" in cfg.protocol \
            and privacy_mechanism(cfg) is None:
        ignored["protocol.noise_placement"] = ("the run adds no noise (no privacy mechanism), so there is none to "
                                               "place; select one (privacy=tree_gaussian)")
    return ignored


def check_ignored(cfg: DictConfig, keys: Iterable[str]) -> None:
    """No command-line value override (``keys``: the fields it sets) sets a field :func:`ignored_fields` names."""
    given = {key.lstrip("+~") for key in keys}
    for key, reason in ignored_fields(cfg).items():
        if key in given:
            raise ConfigError(f"{key}: {reason}; the value given would change nothing")


def privacy_mechanism(cfg: DictConfig) -> type | None:
    """The class the ``privacy`` group builds, None without one (no group, no ``_target_``, or privacy=none)."""
    node = cfg.get("privacy")
    if not isinstance(node, DictConfig) or node.get("_target_") is None or node.get("mechanism") == "none":
        return None
    return group_class(node, "privacy")


def check_privacy(cls: type, mechanism: type | None) -> None:
    """A protocol applies only the privacy mechanisms it declares (``privacy_mechanisms``: classes the ``privacy``
    group may build, subclasses included)."""
    if mechanism is not None and not issubclass(mechanism, cls.privacy_mechanisms):
        takes = " or ".join(m.__name__ for m in cls.privacy_mechanisms)
        applies = f"applies only {takes}" if takes else "applies no privacy mechanism"
        raise ConfigError(f"privacy: {cls.__name__} {applies}, got {mechanism.__name__}")

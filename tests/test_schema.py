"""The command line checked against the config files' schema (:mod:`fedrec.app.schema`), before Hydra composes it.

The battery runs over a thousand bad command lines, generated from every experiment's own composed config and from
variants that select the options no experiment does (:data:`VARIANTS`): each yes/no field given a typo, each field
of fixed choices (:mod:`fedrec.app.enums`) given a typo, fields misspelt, a field added with ``+`` that no file
declares, an option no group has. They run in-process through :func:`fedrec.app.schema.check`, the function ``train.py``
calls, with the schema composed once per configuration; a sample runs end to end through ``train.py`` in
``test_schema_cli.py``. A test per configuration runs its lines and names every one that fails: the configurations
are composed when the tests run, not when pytest collects them (which every worker does).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, OmegaConf

from fedrec.app import schema
from fedrec.app.build import check_used
from fedrec.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
EXPERIMENTS = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
#: top-level groups whose fields the battery perturbs (the run settings trainer/logger are Lightning's and ours)
GROUPS = ("env", "protocol", "policy", "topology", "privacy", "task", "data", "model", "aggregator", "server",
          "attack", "planner", "strategy")
#: options no experiment selects, composed onto one (the case ids say ``EXPERIMENT+VARIANT``): each attack, server
#: optimiser and robust rule's parameters, client- and server-placed DP, the tree mechanisms and their protocols
#: (noise placement), sampled ranking, graph expansion and side graphs, the sparse layout
VARIANTS = {
    "fedgnn_synthetic+sign_flip": ["attack=sign_flip", "server=fedadam", "aggregator=krum"],
    "fedgnn_synthetic+alie": ["attack=alie", "server=fedyogi", "aggregator=trimmed_mean"],
    "fedgnn_synthetic+item_promotion": ["attack=item_promotion", "server=fedavgm", "aggregator=centered_clipping"],
    "fedgnn_synthetic+min_max": ["attack=min_max", "server=fedadagrad", "aggregator=bulyan"],
    "fedgnn_synthetic+noise": ["attack=noise", "aggregator=norm_bound", "privacy=laplace"],
    "fedgnn_synthetic+scale": ["attack=scale", "aggregator=geometric_median", "privacy=gaussian",
                               "privacy.placement=server", "strategy.participation=poisson"],
    "fedgnn_ml100k+ranking": ["task.eval.ranking=sampled", "task.expansion.neighbours=8", "aggregator=multi_krum"],
    "fedpergnn_flixster+side_graphs": ["task.side_graphs.items=0.1", "task.side_graphs.biases=true"],
    "fclub_synthetic+cdp": ["protocol=cdp_fclub_dc", "privacy=tree_gaussian"],
    "gossip_synthetic_k3+fed_ucb": ["protocol=fed_ucb", "privacy=tree_laplace"],
    "async_linucb_synthetic+sparse": ["protocol.layout=sparse", "max_memory_gb=4"],
}


@pytest.fixture(scope="module")
def lookups() -> Iterator[tuple[schema.GroupOptions, schema.Compose]]:
    """The group options and a schema composer memoised by its group overrides (the battery composes each
    experiment's schema once)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        options, composer = schema.hydra_lookups("config")
        cached = functools.lru_cache(maxsize=None)(lambda groups: composer(list(groups)))
        yield functools.lru_cache(maxsize=None)(options), lambda groups: cached(tuple(groups))


def fields(cfg: DictConfig, groups: tuple[str, ...] = GROUPS) -> Iterator[tuple[str, Any]]:
    """Every (dotted key, value) leaf of the perturbed ``groups`` of ``cfg`` (interpolations unresolved)."""
    def walk(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
        for key, value in node.items():
            if isinstance(value, dict):
                yield from walk(value, f"{prefix}.{key}")
            elif not str(key).startswith("_"):
                yield f"{prefix}.{key}", value
    for group in groups:
        if OmegaConf.is_dict(cfg.get(group)):
            yield from walk(OmegaConf.to_container(cfg[group], resolve=False), group)


#: the configurations the batteries cover: every experiment and every variant
NAMES = [*EXPERIMENTS, *VARIANTS]


@functools.cache
def config(name: str) -> DictConfig:
    """The composed config of experiment or variant ``name`` (:data:`VARIANTS`)."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("config", overrides=[f"+experiment={name.split('+')[0]}", *VARIANTS.get(name, [])])


def leaves_of(name: str, groups: tuple[str, ...] = GROUPS) -> list[tuple[str, Any]]:
    """The leaves of config ``name`` the battery perturbs: all of an experiment's, and of a variant only those its
    options bring (under each group it selects, beside each field it sets), which its experiment has not covered."""
    leaves = list(fields(config(name), groups))
    if name not in VARIANTS:
        return leaves
    keys = [o.split("=", 1)[0] for o in VARIANTS[name]]
    prefixes = tuple(f"{k}." if "." not in k else f"{k.rpartition('.')[0]}." for k in keys)
    return [(key, value) for key, value in leaves if key.startswith(prefixes)]


def command_line(name: str, *perturbed: str) -> list[str]:
    """The command line of config ``name`` (an experiment, or a variant: its options too, bar one that sets a key
    ``perturbed`` sets) with the ``perturbed`` overrides."""
    keys = {p.split("=", 1)[0].lstrip("+") for p in perturbed}
    kept = [o for o in VARIANTS.get(name, []) if o.split("=", 1)[0] not in keys]
    return [f"+experiment={name.split('+')[0]}", *kept, *perturbed]


def typo(value: str, choices: tuple[str, ...]) -> str:
    """``value`` with its second and third letters swapped (``adam`` -> ``aadm``), or ``bogus`` if that is a choice
    or no change."""
    wrong = value[:1] + value[2:3] + value[1:2] + value[3:]
    return wrong if wrong != value and wrong not in choices else "bogus"


def enum_battery(exp: str) -> list[tuple[str, list[str], str, tuple[str, ...]]]:
    """(case id, command line, the field, its choices): a typo of every field of fixed choices of config ``exp``
    (of its value there, else of its first choice: a null or interpolated default)."""
    cases, cfg = [], config(exp)
    for key, value in leaves_of(exp, (*GROUPS, "trainer")):
        choices = schema.choices(key, cfg)
        if choices is None:
            continue
        assert value is None or "${" in str(value) or value in choices, f"{exp}: {key}={value} is no choice"
        good = value if isinstance(value, str) and "${" not in value else choices[0]
        wrong = typo(good, choices)
        cases.append((f"{exp}:{key}={wrong}", command_line(exp, f"{key}={wrong}"), key, choices))
    return cases


def battery(exp: str) -> list[tuple[str, list[str], str]]:
    """(case id, command line, the field the error must name), from config ``exp``."""
    cases = []
    leaves = leaves_of(exp)
    for key, value in leaves:
        if isinstance(value, bool):  # a typo of a boolean, and a word that is not one
            cases.append((f"{exp}:{key}=flase", command_line(exp, f"{key}=flase"), key))
            cases.append((f"{exp}:{key}=yes", command_line(exp, f"{key}=yes"), key))
    # a misspelt field (its last two letters swapped): every third of an experiment's, each of a variant's
    for key, _ in leaves if exp in VARIANTS else leaves[::3]:
        parent, _, leaf = key.rpartition(".")
        if len(leaf) > 3 and leaf[-1] != leaf[-2]:
            typo = f"{parent}.{leaf[:-2]}{leaf[-1]}{leaf[-2]}"
            cases.append((f"{exp}:{typo}", command_line(exp, f"{typo}=1"), typo))
    if exp in VARIANTS:
        return cases
    base = [f"+experiment={exp}"]
    for group in ("privacy", "protocol", "env", "data", "aggregator", "planner"):
        cases.append((f"{exp}:+{group}.undeclared", [*base, f"+{group}.undeclared_field=5"],
                      f"{group}.undeclared_field"))
    cases.append((f"{exp}:option", [*base, "protocol=asyn"], "protocol"))
    cases.append((f"{exp}:plots", [*base, "plots=fals"], "plots"))
    return cases


def failures(cases: list[tuple[Any, ...]], lookups: Any, expected: Callable[..., str]) -> str:
    """Each of ``cases`` (case id, command line, the field, ...) whose command line is not refused with one line
    starting ``expected(field, ...)``, with what happened instead, a line each ('' if none)."""
    options, composer = lookups
    failed = []
    for case, argv, *named in cases:
        try:
            schema.check(argv, options, composer)
            failed.append(f"{case}: accepted")
        except ConfigError as e:
            message = str(e)
            if not message.startswith(expected(*named)) or "\n" in message:
                failed.append(f"{case}: {message}")
    return "\n".join(failed)


def test_the_battery_covers_every_experiment_with_many_lines() -> None:
    cases = [case for name in NAMES for case in battery(name)]
    assert len(cases) >= 150
    assert {case.split(":")[0] for case, _, _ in cases} == {*EXPERIMENTS, *VARIANTS}
    assert sum("=flase" in case for case, _, _ in cases) >= 20  # yes/no fields of several families
    named = {field for _, _, field in cases}
    for field in ("attack.fractino", "attack.factro", "attack.knowledeg", "attack.target_itme", "server.bet1a",
                  "server.bias_correction", "aggregator.iteratiosn", "aggregator.boudn", "privacy.placemetn",
                  "privacy.adaptive_clip", "strategy.local_stesp", "strategy.participatino", "task.eval.negativse",
                  "task.expansion.neighbousr", "task.side_graphs.biases", "privacy.laplace_splti",
                  "privacy.calibratino", "protocol.noise_placemetn"):
        assert field in named, field


def test_the_enum_battery_covers_every_experiment_and_many_fields() -> None:
    cases = [case for name in NAMES for case in enum_battery(name)]
    assert {case.split(":")[0] for case, *_ in cases} >= set(EXPERIMENTS)
    fields = {field for _, _, field, _ in cases}
    assert {"task.optimizer", "strategy.participation", "privacy.placement", "aggregator.weighting", "data.normalize",
            "model.head", "task.eval.ranking", "protocol.backend", "protocol.mode", "env.theta",
            "trainer.accelerator"} <= fields, sorted(fields)
    assert len(cases) >= 150


@pytest.mark.parametrize("name", NAMES)
def test_a_typo_of_a_fixed_choice_is_one_error_naming_the_field_and_its_choices(lookups: Any, name: str) -> None:
    failed = failures(enum_battery(name), lookups, lambda field, choices: f"{field}: must be one of {list(choices)}, "
                                                                          "got ")
    assert not failed, failed


@pytest.mark.parametrize("name", NAMES)
def test_bad_command_line_is_one_error_naming_the_field(lookups: Any, name: str) -> None:
    failed = failures(battery(name), lookups, lambda field: f"{field}: ")
    assert not failed, failed


@pytest.mark.parametrize("argv", [
    ["+experiment=gossip_synthetic_k3", "env.vary_means=true", "protocol.consistency_fresh=false"],
    ["+experiment=vfl_synthetic", "protocol=vfts", "protocol.refresh_mask=true", "protocol.policy.sampler=symmetric"],
    ["+experiment=fedgnn_ml100k", "logger.csv=false", "plots=false"],
    ["+experiment=bgtplanner_ml100k", "++planner.num_actions=2", "planner.scale_features=true"],
    ["+experiment=async_linucb_lastfm", "env.max_users=30", "seed=0,1"],
    ["+experiment=fedgnn_ml100k_robust", "privacy=none,gaussian", "aggregator=krum,median", "seed=0,1,2"],
    ["protocol=sync", "policy=lints", "policy.v=0.5"],
    ["~privacy", "hydra.run.dir=/tmp/x"],
])
def test_good_command_lines_pass(lookups: Any, argv: list[str]) -> None:
    options, composer = lookups
    schema.check(argv, options, composer)


@pytest.mark.parametrize("argv, needle", [
    (["protocol.preregister=flase"], "protocol.preregister: must be true or false, got 'flase'"),
    (["seed=0,1", "protocol.preregister=true,flase"], "protocol.preregister: must be true or false"),
    (["protocol=asyn"], "protocol: no config 'asyn' in the protocol group (did you mean 'async'?)"),
    (["+experiment=lastfm"], "did you mean 'async_linucb_am_lastfm' or 'async_linucb_lastfm'?"),
    (["protocol.prerigester=true"], "protocol=async has no field 'prerigester' (did you mean 'preregister'?)"),
    (["+experiment=fedgnn_ml100k", "privacy=none", "+privacy.epsilon=5"], ("privacy.epsilon: privacy=none has no "
                                                                          "field 'epsilon'; nothing would read it")),
    (["+privacy.epsilon=5"], ("privacy.epsilon: the run's config has no field 'epsilon' (privacy is not set; "
                             "privacy=NAME selects")),
    (["protocl.gamma_u=2"], "protocl.gamma_u: the run's config has no 'protocl' (did you mean 'protocol'?)"),
    (["privacy=null"], "privacy: null is not a config of the privacy group"),
    (["~protocol.prerigester"], "nothing to remove"),
    (["seed=[1,2"], "seed=[1,2: not an override Hydra can read"),
    (["hydra.run.dir="], "hydra.run.dir: empty"),
    (["+experiment=fedgnn_ml100k", "task.optimizer=adma"],
     "task.optimizer: must be one of ['adam', 'sgd'], got 'adma' (did you mean 'adam'?)"),
    (["+experiment=fedgnn_ml100k", "strategy.participation=posson"],
     "strategy.participation: must be one of ['all', 'fixed', 'poisson'], got 'posson' (did you mean 'poisson'?)"),
    (["+experiment=fedgnn_ml100k", "task.optimizer=null"], "task.optimizer: must be one of ['adam', 'sgd'], got null"),
    (["+experiment=fedgnn_ml100k", "task.optimizer=1"], "task.optimizer: must be one of ['adam', 'sgd'], got 1"),
    (["+experiment=vfl_synthetic", "protocol.mode=centrl"], "protocol.mode: must be one of ['vertical', 'central', "
                                                            "'partial'], got 'centrl' (did you mean 'central'?)"),
])
def test_messages_say_what_to_type(lookups: Any, argv: list[str], needle: str) -> None:
    options, composer = lookups
    with pytest.raises(ConfigError) as info:
        schema.check(argv, options, composer)
    assert needle in str(info.value)


@pytest.mark.parametrize("argv, group", [
    (["+experiment=vfl_synthetic", "policy=lints"], "policy"),
    (["+experiment=fclub_synthetic", "policy.alpha=5"], "policy"),
    (["+experiment=gossip_synthetic_k3", "policy=lints"], "policy"),
    (["+experiment=fedgnn_ml100k", "policy.lam=2"], "policy"),
    (["+experiment=async_linucb_synthetic", "attack=noise"], "attack"),
    (["+experiment=sync_linucb_synthetic", "server=fedadam"], "server"),
    (["+experiment=async_linucb_synthetic", "planner=uniform"], "planner"),
])
def test_a_group_the_run_does_not_use_is_refused(lookups: Any, argv: list[str], group: str) -> None:
    options, composer = lookups
    line = schema.check(argv, options, composer)
    with pytest.raises(ConfigError, match=rf"^{group}: .*would change nothing"):
        check_used(composer(argv), schema.touched_groups(line))


def test_groups_the_run_uses_pass(lookups: Any) -> None:
    options, composer = lookups
    for argv in (["protocol=sync", "policy=lints"], ["+experiment=fedgnn_ml100k", "server=fedadam", "attack=noise"]):
        line = schema.check(argv, options, composer)
        check_used(composer(argv), schema.touched_groups(line))


@pytest.mark.parametrize("argv, field", [
    (["+experiment=fedgnn_ml100k", "task.optimizer=adam,adma"], "task.optimizer"),  # one bad value of a sweep
    (["+experiment=fedgnn_ml100k", "task.optimizer=choice(sgd,adma)"], "task.optimizer"),
    (["+experiment=fedgnn_ml100k", "seed=0,1", "privacy=gaussian", "privacy.placement=client,sever"],
     "privacy.placement"),
    (["+experiment=fedgnn_ml100k", "aggregator=fedavg,krum", "aggregator.weighting=uniform,unifrom"],
     "aggregator.weighting"),
    (["+experiment=fedgnn_ml100k", "privacy=gaussian", "privacy.adjacency=null"], "privacy.adjacency"),  # interpolated
    (["env=mab_synthetic", "env.noise=std"], "env.noise"),  # the choices of the class that reads it
    (["protocol=gossip_ucb", "protocol._target_=fedrec.protocols.GossipBandit", "+protocol.mode=lcal"],
     "protocol.mode"),  # a field added with + that the class takes: checked too
])
def test_a_bad_fixed_choice_is_refused_before_any_job(lookups: Any, argv: list[str], field: str) -> None:
    options, composer = lookups
    with pytest.raises(ConfigError, match=rf"^{field}: must be one of \["):
        schema.check(argv, options, composer)


@pytest.mark.parametrize("argv", [
    ["+experiment=fedgnn_ml100k", "task.optimizer=adam,sgd", "task.optimizer_state=reset"],
    ["+experiment=fedgnn_ml100k", "strategy.participation=all,fixed,poisson", "strategy.on_bad_update=drop"],
    ["+experiment=fedgnn_ml100k", "privacy=gaussian", "privacy.placement=client,server", "privacy.rng=secure",
     "privacy.conventions=authors", "privacy.adjacency=add_remove", "privacy.accountant=prv"],
    ["+experiment=fedgnn_ml100k", "data.normalize=minmax", "data.split=u1", "task.eval.ranking=sampled"],
    ["+experiment=fedgnn_ml100k", "task.optimizer=${oc.env:FEDREC_OPTIMIZER,adam}"],  # an interpolation: the run's
    ["+experiment=fedgnn_ml100k", "task.objective=null", "task.eval.ranking=null"],  # null where the default is null
    ["+experiment=fedpergnn_ml100k", "task.objective=null"],  # declared sse here, but the task defaults it to None
    ["+experiment=vfl_synthetic", "protocol.mode=vertical,central,partial", "protocol.mask=gaussian"],
    ["+experiment=fclub_synthetic", "protocol.conventions=authors", "protocol.bonus=squared", "env.theta=ortho_cap"],
    ["env.noise=variance"],  # LinearEnv's noise: not in the table, left to the environment
    ["protocol.backend=torch", "protocol.layout=sparse", "protocol.preregister=false"],
])
def test_good_fixed_choices_pass(lookups: Any, argv: list[str]) -> None:
    options, composer = lookups
    schema.check(argv, options, composer)

"""fedrec.app.hydra_private against the installed Hydra: each wrapped private piece still does what fedrec relies on,
so a Hydra release that changes one fails here by name."""
from __future__ import annotations

from pathlib import Path

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.initialize import get_gh_backup, restore_gh_from_backup

from fedrec.app.hydra_private import args_parser, config_search_path, start_hydra, sweep_jobs

CONF = Path(__file__).resolve().parent.parent / "conf"


def test_the_parser_reads_train_py_s_command_line() -> None:
    args, rest = args_parser().parse_known_args(
        ["+experiment=fclub_synthetic", "seed=3", "--cfg", "job", "--config-dir", "mine", "-m"])
    assert args.overrides == ["+experiment=fclub_synthetic", "seed=3"]
    assert (args.cfg, args.config_dir, args.multirun, rest) == ("job", "mine", True, [])
    assert args_parser().parse_known_args([])[0].config_path is None


def test_the_search_path_starts_a_hydra_that_composes_fedrec_s_configs() -> None:
    search = config_search_path(str(CONF))
    assert str(CONF) in [entry.path for entry in search.get_path()]
    backup = get_gh_backup()
    try:
        start_hydra(search)
        assert GlobalHydra.instance().is_initialized()
        from hydra import compose

        cfg = compose("config", overrides=["+experiment=fclub_synthetic", "seed=5"])
        assert cfg.seed == 5 and cfg.name == "fclub_synthetic" and cfg.task.steps == 100_000
    finally:
        restore_gh_from_backup(backup)


def test_a_sweep_expands_into_its_jobs_in_the_basic_sweeper_s_order() -> None:
    parsed = OverridesParser.create().parse_overrides(["a=1,2", "b=x,y", "c=7"])
    expected = [["a=1", "b=x", "c=7"], ["a=1", "b=y", "c=7"], ["a=2", "b=x", "c=7"], ["a=2", "b=y", "c=7"]]
    assert sweep_jobs(parsed, None) == expected
    assert sweep_jobs(parsed, 1) == expected  # batches do not change the jobs or their order


def test_the_config_writer_is_replaced_with_the_one_hydra_calls() -> None:
    """Hydra writes a job's ``.hydra/*.yaml`` through ``hydra.core.utils._save_config(cfg, filename, output_dir)``;
    the replacement takes its place (and is put back here)."""
    import inspect

    import hydra.core.utils

    from fedrec.app.hydra_private import replace_config_writer

    original = hydra.core.utils._save_config
    assert list(inspect.signature(original).parameters) == ["cfg", "filename", "output_dir"]
    calls = []
    try:
        replace_config_writer(lambda cfg, filename, output_dir: calls.append(filename))
        hydra.core.utils._save_config({}, "config.yaml", Path("."))
        assert calls == ["config.yaml"]
    finally:
        hydra.core.utils._save_config = original

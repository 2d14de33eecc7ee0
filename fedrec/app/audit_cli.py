"""``python -m fedrec.app.audit_cli +experiment=NAME [overrides]``: audit the client-level DP of a run's configuration.

The config is composed as ``train.py`` composes it (``conf/audit.yaml`` adds the ``audit`` settings to
``conf/config.yaml``) and its task is built as for a run. Under ``privacy.placement=server`` the server's clipped sum
and noise are audited with a canary client sampled at the strategy's rate
(:func:`fedrec.privacy.audit.audit_server_dp`); otherwise the task's own privatiser (its
:class:`~fedrec.privacy.ClientDP`, the round's :func:`~fedrec.recsys.privatize.privatize_uploads`, the model's ω
tensors and item-row width, the run's rounds) is then audited with a white-box canary client
(:func:`fedrec.privacy.audit.audit_client_dp`). One headline line gives the empirical ε lower bound beside the ε
the privatiser's accountant reports, and ``audit.json`` goes to the output folder (``hydra.run.dir``, as for a
run). A bad value or a missing dataset is one ``error:`` line and exit code 2.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

import fedrec.app.resolvers  # noqa: F401  (${by_conventions:...} in the configs)
from fedrec.errors import ConfigError, DatasetNotFoundError, check_float, check_int, run_script

CONF = Path(__file__).resolve().parents[2] / "conf"
#: the privacy mechanisms this command audits (client-level DP of a recommendation run)
MECHANISMS = ("gaussian", "laplace")


def audit_settings(cfg: DictConfig) -> dict[str, Any]:
    """The ``audit`` node's values, checked (errors name ``audit.<field>``): runs per input, confidence, the
    canary's rounds (null: the run's ``task.rounds``) and real item rows."""
    node = cfg.get("audit") or {}
    rounds = node.get("rounds")
    return {
        "trials": check_int("audit.trials", node.get("trials", 20_000), minimum=1),
        "confidence": check_float("audit.confidence", node.get("confidence", 0.95), low=0.0, high=1.0,
                                  low_open=True, high_open=True),
        "rounds": None if rounds is None else check_int("audit.rounds", rounds, minimum=1),
        "rows": check_int("audit.rows", node.get("rows", 1), minimum=0),
    }


def check_audit_memory(cfg: DictConfig, settings: dict[str, Any], model: Any) -> None:
    """Refuse an audit too large for the memory before it allocates: its ``2 · trials`` canary uploads run at once,
    each its ω values and item rows in about eight 4-byte copies (the uploads, the noise, the released values and
    the statistics)."""
    from fedrec.app.build import check_fits

    values = sum(p.numel() for p in model.shared_parameters().values()) + max(settings["rows"], 1) * model.row_dim
    check_fits(cfg, 2 * settings["trials"] * values * 8 * 4, "audit.trials",
               f"audit.trials={settings['trials']}, canary uploads of {values} values")


def audit_config(cfg: DictConfig, output_dir: str | Path | None = None) -> dict[str, Any]:
    """Audit the client-level DP of the run ``cfg`` describes; write and return the ``audit.json`` record.

    ``output_dir`` defaults to Hydra's run directory.
    """
    from hydra.core.hydra_config import HydraConfig

    from fedrec.app.build import build_task_fetching_data, task_kind
    from fedrec.privacy.audit import audit_client_dp
    from fedrec.recsys.privatize import privatize_uploads
    from fedrec.utils.io import atomic_write_json
    from fedrec.utils.threads import torch_threads

    settings = audit_settings(cfg)
    privacy = cfg.get("privacy")
    mechanism = privacy.get("mechanism") if isinstance(privacy, DictConfig) else None
    if task_kind(cfg) != "recommendation" or mechanism not in MECHANISMS:
        raise ConfigError(f"privacy: python -m fedrec.app.audit_cli audits the client-level DP of a recommendation run "
                          f"(privacy=gaussian|laplace), got task={cfg.task.get('_target_')} with privacy="
                          f"{mechanism}; the Fed_UCB and CDP-FCLUB trees are audited by scripts/audit_privacy.py")
    with torch_threads(cfg.get("num_threads")):  # as a run: batched small tensors run best on one thread
        task = build_task_fetching_data(cfg)
        model = task.model
        check_audit_memory(cfg, settings, model)
        if task.server_placed:
            result = _audit_server(task, settings, cfg.seed)
        else:
            result = audit_client_dp(
                task.privacy, privatize_uploads,
                tensor_sizes=[p.numel() for p in model.shared_parameters().values()],
                rows=settings["rows"], width=model.row_dim, rounds=settings["rounds"] or task.num_rounds,
                trials=settings["trials"], seed=cfg.seed, confidence=settings["confidence"],
                dtype=model.item_emb.dtype)
    record = {**result.to_dict(), "experiment": cfg.name, "exceeds": result.exceeds,
              "threat_model": f"{result.mechanism}, {result.threat_model}"}
    out = Path(HydraConfig.get().runtime.output_dir if output_dir is None else output_dir)
    atomic_write_json(out / "audit.json", record)
    return record


def _audit_server(task: Any, settings: dict[str, Any], seed: int) -> Any:
    """Server-placed DP (``privacy.placement=server``): the task's clipped sum and noise with a canary client
    sampled at the strategy's rate in each of the rounds (:func:`fedrec.privacy.audit.audit_server_dp`), against
    what the run's accountant reports for those rounds. The canary's upload spans the model's ω tensors and
    ``audit.rows`` item rows; the item table's other rows carry only noise, which no test reads."""
    from fedrec.privacy.accountant import SampledGaussianAccountant
    from fedrec.privacy.audit import audit_server_dp

    dp, rounds, rows = task.privacy, settings["rounds"] or task.num_rounds, max(settings["rows"], 1)
    if dp.server.schedule is not None:
        raise ConfigError("audit: the server-placement audit draws every round at one noise multiplier; run it "
                          "without privacy.noise_schedule")
    ledger = SampledGaussianAccountant(dp.delta, dp.server_accountant.accountant)
    ledger.step(dp.server.noise_multiplier, rounds, dp.sample_rate)
    return audit_server_dp(dp.server, sample_rate=dp.sample_rate, rounds=rounds, epsilon_reported=ledger.epsilon(),
                           delta=dp.delta, tensor_sizes=[p.numel() for p in task.model.shared_parameters().values()],
                           rows=rows, width=task.model.row_dim, num_items=rows, trials=settings["trials"],
                           seed=seed, confidence=settings["confidence"])


def headline(record: dict[str, Any]) -> str:
    """One line: the bound beside the reported ε, and whether it contradicts it."""
    reported = f"reported ε = {record['epsilon_reported']:.4g}"
    if record.get("epsilon_nominal") is not None:
        reported = f"nominal ε = {record['epsilon_nominal']:.4g} (accountant: {record['epsilon_reported']:.4g})"
    verdict = "EXCEEDS the reported ε" if record["exceeds"] else "consistent"
    return (f"{record['experiment']}: ε ≥ {record['epsilon_lower']:.4g} at {record['confidence']:.0%} confidence "
            f"({record['trials']} trials per input) vs {reported} [{record['threat_model']}]: {verdict}")


@hydra.main(version_base="1.3", config_path=str(CONF), config_name="audit")
def main(cfg: DictConfig) -> None:
    """Audit the composed config; a bad value or a missing dataset is one ``error:`` line (exit code 2)."""
    try:
        record = audit_config(cfg)
    except (ConfigError, DatasetNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(headline(record))


def cli() -> None:
    """``python -m fedrec.app.audit_cli +experiment=NAME [overrides]``: ``quick=true`` expanded into the
    experiment's short recipe and the command line checked against the config files' schema first (one ``error:``
    line, exit code 2), as ``train.py`` does."""
    from fedrec.app.presets import expand_quick
    from fedrec.app.schema import check_command_line

    def checked() -> None:
        sys.argv[1:] = expand_quick(CONF, sys.argv[1:], config_name="audit")
        check_command_line(CONF, sys.argv[1:], config_name="audit")

    run_script(checked)
    main()


if __name__ == "__main__":
    cli()

"""Every privatiser of fedrec audited (fedrec.privacy.audit): one table of mechanism, threat model, the ε the
configuration states and the ε its accountant reports, the empirical ε lower bound at 95 % confidence, and the
trials per input.

    .venv/bin/python scripts/audit_privacy.py [--out PATH] [--scale 1.0] [--seed 0]

Rows: the textbook Gaussian and Laplace mechanisms (the audit's own calibration, their ε known exactly); client DP
on FedGNN/MF uploads through the round's privatiser (Gaussian and Laplace, replace-one and add/remove, one round
and ten, and the authors' conventions at BGTplanner's nominal ε = 10); Fed_UCB's Laplace tree (both ε splits);
CDP-FCLUB-DC's Gaussian tree (the paper's σ and the accountant's, an observation added/removed or replaced). Prints
the table as Markdown and, with ``--out``, writes ``PATH.md`` and ``PATH.csv``. The default sizes take a few
minutes on one core; ``--scale`` multiplies every trial count.
"""
from __future__ import annotations

import argparse
import csv
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from fedrec.privacy import ClientDP
from fedrec.privacy.audit import AuditResult, audit_client_dp, audit_fclub, audit_fed_ucb, audit_textbook
from fedrec.privacy.tree import fclub_accounted_sigma, fclub_node_sigma
from fedrec.recsys.privatize import privatize_uploads

COLUMNS = ("mechanism", "threat model", "stated ε", "accountant ε", "ε lower bound (95%)", "trials per input",
           "verdict")
#: CDP-FCLUB's setting: (ε, δ) = (1, 0.1) of the FCLUB worlds, t_c = 7 uploads per phase, one phase
FCLUB = {"epsilon": 1.0, "delta": 0.1, "uploads": 7}


def client_dp(mechanism: str, epsilon: float, adjacency: str = "replace_one", conventions: str = "paper") -> ClientDP:
    """One client's DP setting as conf/privacy/<mechanism>.yaml builds it (clip 0.1)."""
    return ClientDP(1, mechanism=mechanism, epsilon=epsilon, adjacency=adjacency,
                    sensitivity_factor=2.0 if adjacency == "replace_one" else 1.0, conventions=conventions)


def audits(scale: float, seed: int) -> list[tuple[str, Callable[[], AuditResult]]]:
    """(stated-ε note, audit) for every row, with the trial counts of the default sizes times ``scale``."""
    def n(trials: int) -> int:
        return max(1_000, int(trials * scale))

    rows: list[tuple[str, Callable[[], AuditResult]]] = []
    for mech in ("gaussian", "laplace"):
        for eps in (1.0, 4.0):
            rows.append(("", lambda m=mech, e=eps: audit_textbook(m, e, trials=n(100_000), seed=seed)))
    for mech in ("gaussian", "laplace"):
        for adjacency, rounds in (("replace_one", 1), ("add_remove", 1), ("replace_one", 10)):
            rows.append(("", lambda m=mech, a=adjacency, r=rounds: audit_client_dp(
                client_dp(m, 2.0, a), privatize_uploads, rounds=r, trials=n(100_000), seed=seed)))
        rows.append(("BGTplanner's nominal ε", lambda m=mech: audit_client_dp(
            client_dp(m, 10.0, conventions="authors"), privatize_uploads, tensor_sizes=(4, 4), rows=2,
            trials=n(1_000_000), seed=seed)))
    for split in ("paper", "levels"):
        rows.append(("configured ε", lambda s=split: audit_fed_ucb(1.0, 8, s, trials=n(100_000), seed=seed)))
    e, d, t_c = FCLUB["epsilon"], FCLUB["delta"], FCLUB["uploads"]
    sigmas = {"paper": fclub_node_sigma(e, d, t_c), "accountant": fclub_accounted_sigma(e, d, t_c, 1)}
    for calibration, sigma in sigmas.items():
        for adjacency in ("add_remove", "replace_one"):
            rows.append(("configured ε", lambda s=sigma, a=adjacency, c=calibration: replace(audit_fclub(
                s, d, t_c, adjacency=a, trials=n(100_000), seed=seed, epsilon_nominal=e),
                mechanism=f"CDP-FCLUB-DC Gaussian tree (calibration={c})")))
    return rows


def verdict(r: AuditResult) -> str:
    """Whether the bound contradicts the accountant's ε, or only the stated one."""
    if r.exceeds:
        return "**exceeds the accountant's ε**"
    if r.epsilon_nominal is not None and r.epsilon_lower > r.epsilon_nominal:
        return "exceeds the stated ε (as the accountant says)"
    return "consistent"


def row(note: str, r: AuditResult) -> dict[str, str]:
    stated = r.epsilon_nominal if r.epsilon_nominal is not None else r.epsilon_reported
    stated_text = f"{stated:.3g}" + (f" ({note})" if note else "")
    accountant = "exact" if r.mechanism.startswith("textbook") else f"{r.epsilon_reported:.3g}"
    return dict(zip(COLUMNS, (r.mechanism, r.threat_model, stated_text, accountant, f"{r.epsilon_lower:.3f}",
                              f"{r.trials:,}", verdict(r))))


def markdown(rows: list[dict[str, str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r[c] for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write PATH.md and PATH.csv")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every trial count")
    parser.add_argument("--seed", type=int, default=0, help="key of every audit's draws")
    args = parser.parse_args()
    torch.set_num_threads(1)  # batched small tensors: one thread is fastest (as a run's num_threads=1)
    rows = []
    for note, run in audits(args.scale, args.seed):
        start = time.perf_counter()
        result = run()
        rows.append(row(note, result))
        print(f"{result.mechanism}, {result.threat_model}: ε ≥ {result.epsilon_lower:.3f} "
              f"({time.perf_counter() - start:.1f} s)", flush=True)
    table = markdown(rows)
    print(table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(table + "\n", encoding="utf-8")
        with open(args.out.with_suffix(".csv"), "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()

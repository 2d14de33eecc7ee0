"""Fed_UCB's ratio R(1) : R(2) : R(5) under each alternative reading of the paper where it is ambiguous, for the
Fig. 2(a) and 2(b) settings (the experiments gossip_synthetic_k3 / _n10: seed 0, T = 10^6, K3 and the ring C10):
one Markdown table row per (figure, reading) with the mean regret (over trials and agents) at t = 6·10^5 and 10^6
and the ratios, the paper claiming about 1 : 1/2 : 1/5 at 6·10^5. All readings run in one process, one protocol
per (reading, ε) with its trials batched; rows print as they finish.

    .venv/bin/python scripts/gossip_readings.py --trials 10                      # every reading, both figures
    .venv/bin/python scripts/gossip_readings.py --trials 2 --readings default,bernoulli --figures a
"""
from __future__ import annotations

import argparse
import math
from typing import Any

from fedrec.envs.mab import MultiAgentMAB
from fedrec.federation.topology import complete, ring
from fedrec.privacy import TreeLaplace
from fedrec.protocols.gossip import FedUCB

#: figure → (N, M, topology)
FIGURES = {"a": (3, 5, complete), "b": (10, 10, ring)}
#: reading → (env, privacy, protocol) keyword overrides, each flag one alternative reading of an ambiguous point
#: of the paper (reward kind, log base, ε split, empty nodes, which ñ the consistency rule tests)
READINGS: dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]] = {
    "default": ({}, {}, {}),
    "bernoulli": ({"noise": "bernoulli"}, {}, {}),
    "clipped": ({"noise": "clipped"}, {}, {}),
    "log2": ({}, {}, {"privacy_log2": True}),
    "levels": ({}, {"laplace_split": "levels"}, {}),
    "noise_empty": ({}, {"noise_empty_intervals": True}, {}),
    "fresh": ({}, {}, {"consistency_fresh": True}),
}
T, AT = 1_000_000, 600_000


def run(figure: str, reading: str, eps: float, trials: int, seed: int) -> tuple[float, float]:
    """Mean regret (over trials and agents) at t = 6·10^5 and at T."""
    N, M, topology = FIGURES[figure]
    env_kw, privacy_kw, protocol_kw = READINGS[reading]
    env = MultiAgentMAB(N, M, trials, seed=seed, **env_kw)
    p = FedUCB(topology(N), M, T, trials, seed, TreeLaplace(eps, **privacy_kw), **protocol_kw)
    p.play(env, AT)
    at = float(p.regret.mean())
    p.play(env, T - AT)
    return at, float(p.regret.mean())


def ratio(r: dict[float, float], base: float = 0.0) -> str:
    return " : ".join(f"{(r[e] - base) / (r[1.0] - base):.2f}" for e in (1.0, 2.0, 5.0))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--figures", default="a,b")
    p.add_argument("--readings", default=",".join(READINGS))
    p.add_argument("--excess", action="store_true", help="also run ε = ∞ and give the ratios in excess of it")
    args = p.parse_args()
    epsilons = (1.0, 2.0, 5.0, math.inf) if args.excess else (1.0, 2.0, 5.0)
    print("| figure | reading | R(1) at 6·10⁵ | ratio at 6·10⁵ | R(1) at 10⁶ | ratio at 10⁶ | trials |\n"
          "|---|---|---|---|---|---|---|", flush=True)
    for figure in args.figures.split(","):
        for reading in args.readings.split(","):
            got = {eps: run(figure, reading, eps, args.trials, args.seed) for eps in epsilons}
            cells = []
            for j in (0, 1):
                r = {eps: v[j] for eps, v in got.items()}
                text = ratio(r) + (f" ({ratio(r, r[math.inf])} in excess)" if math.inf in r else "")
                cells += [f"{r[1.0]:,.0f}", text]
            print(f"| 2({figure}) | {reading} | " + " | ".join(cells) + f" | {args.trials} |", flush=True)


if __name__ == "__main__":
    main()

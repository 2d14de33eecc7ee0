"""Time another version of the Gossip_UCB / Fed_UCB kernel file against this tree's, in one process.

On this VM a block of the same kernel runs at one of two speeds about 1.45x apart, switching within a run, so
timings from separate processes cannot tell a 10 % change from the machine's state. Here both kernels play the
same protocol in alternating blocks of rounds (the first of each pair swapped every block), and what is reported is
the median over blocks of their time ratio, beside each one's median and minimum CPU ns per agent-step and whether
their regret stayed equal (an exact rewrite must keep it to the last digit).

    .venv/bin/python -m scripts.gossip_kernel_ab OTHER_TREE/fedrec/protocols/kernels/gossip.py --figures ab

OTHER's own imports load from this tree, so only the kernel file itself may differ.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time

import numba
import numpy as np

import fedrec.protocols.gossip as gossip_module
from fedrec.envs.mab import MultiAgentMAB
from fedrec.federation.topology import complete, ring
from fedrec.privacy import TreeLaplace
from fedrec.protocols.gossip import FedUCB

#: figure -> (N, M, topology) of Zhu et al. Fig. 2(a) and 2(b)
FIGURES = {"a": (3, 5, complete), "b": (10, 10, ring)}


def load_kernel(path: str) -> tuple:
    """The serial kernel of the file at ``path``, twice (the protocol indexes its pair by R > 1)."""
    spec = importlib.util.spec_from_file_location("gossip_kernel_other", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # numba rebuilds a cached kernel's globals from its module by name
    spec.loader.exec_module(module)
    return module.GOSSIP_RUN[0], module.GOSSIP_RUN[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("other", help="the other kernel file")
    p.add_argument("--figures", default="ab")
    p.add_argument("--replicates", type=int, default=2)
    p.add_argument("--block", type=int, default=20_000, help="rounds per timed block")
    p.add_argument("--blocks", type=int, default=8, help="timed blocks per kernel and setting")
    args = p.parse_args()
    numba.set_num_threads(1)
    kernels = {"this": (gossip_module.GOSSIP_RUN[0],) * 2, "other": load_kernel(args.other)}
    R = args.replicates
    print("| figure | ε | this (median, min) | other (median, min) | other / this, median | regret equal |\n"
          "|---|---|---|---|---|---|")
    for figure in args.figures:
        N, M, make = FIGURES[figure]
        for eps in (1.0, math.inf):
            env = MultiAgentMAB(N, M, R, seed=0)
            protocols = {}
            for name, kernel in kernels.items():  # compile (or load) outside the timer
                gossip_module.GOSSIP_RUN = kernel
                protocols[name] = FedUCB(make(N), M, 10**6, R, 0, TreeLaplace(eps))
                protocols[name].play(env, 64)
            times: dict[str, list[float]] = {name: [] for name in kernels}
            for b in range(args.blocks):
                for name in (("this", "other") if b % 2 else ("other", "this")):
                    gossip_module.GOSSIP_RUN = kernels[name]
                    start = time.process_time()
                    protocols[name].play(env, args.block)
                    times[name].append((time.process_time() - start) / (args.block * R * N) * 1e9)
            this, other = np.array(times["this"]), np.array(times["other"])
            equal = np.array_equal(protocols["this"].regret.numpy(), protocols["other"].regret.numpy())
            print(f"| {figure} | {eps} | {np.median(this):.0f}, {this.min():.0f} | {np.median(other):.0f}, "
                  f"{other.min():.0f} | {np.median(other / this):.3f} | {equal} |", flush=True)
    gossip_module.GOSSIP_RUN = kernels["this"]


if __name__ == "__main__":
    main()

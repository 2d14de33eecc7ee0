"""Each compiled protocol kernel compiles once per variant (serial, parallel): the Python side hands it C-contiguous,
writable arrays whatever views it was given, so numba never builds a second copy of a kernel for another memory
layout (each copy of the FCLUB kernel costs about half a minute of compiling at first use)."""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from fedrec.bandits.linear import LinUCB
from fedrec.envs.clustered import ClusteredLinearEnv
from fedrec.envs.mab import MultiAgentMAB
from fedrec.federation.topology import ring
from fedrec.protocols.centralized import CentralizedLinUCB
from fedrec.protocols.fclub import FederatedClustering
from fedrec.protocols.gossip import GossipUCB
from fedrec.protocols.kernels.centralized import ROWS_RUN
from fedrec.protocols.kernels.fclub import PHASE_RUN
from fedrec.protocols.kernels.gossip import GOSSIP_RUN
from fedrec.protocols.vertical import VerticalLinearBandit


def strided(x: torch.Tensor) -> torch.Tensor:
    """The same values as a non-contiguous view (every other element of a tensor twice as long in the last axis)."""
    wide = torch.stack([x, torch.zeros_like(x)], -1).flatten(-2)
    view = wide[..., ::2]
    assert not view.is_contiguous() and torch.equal(view, x)
    return view


def test_fclub_phase_kernel_has_one_type_per_variant(data_dir: Path) -> None:
    """A call that is one block, then one cut at phase boundaries (slices of the call's steps, strided inputs): one
    type (numba would reuse a strided-layout copy for contiguous arrays, not the other way round)."""
    env = ClusteredLinearEnv(data_dir=data_dir, replicates=2, seed=4, chunk_size=200)
    batch = env.interactions(0, 40)
    for R in (1, 2):
        p = FederatedClustering(env.num_clients, env.dim, R, seed=7)
        p.run(batch.clients[:R, :2], batch.contexts[:R, :2], batch.rewards[:R, :2])  # rounds 1-2: one whole block
        p.run(batch.clients[:R, 2:], strided(batch.contexts[:R, 2:]), strided(batch.rewards[:R, 2:]))  # cut at 3, 7, …
    assert [len(k.signatures) for k in PHASE_RUN] == [1, 1]


def test_centralized_rows_kernel_has_one_type_per_variant() -> None:
    """A contiguous block first, then VFUCB's fresh-mask control, which hands the rows kernel one step at a time as
    slices (strided rewards and logged arms): one type."""
    g = torch.Generator().manual_seed(0)
    R, S, K, d = 2, 12, 4, 4
    contexts = torch.rand(R, S, K, d, generator=g, dtype=torch.float64)
    rewards = torch.rand(R, S, K, generator=g, dtype=torch.float64)
    clients = torch.randint(0, 5, (R, S), generator=g)
    logged = torch.randint(0, K, (R, S), generator=g)
    policy = functools.partial(LinUCB, alpha=0.5, lam=1.0)
    for r in (1, 2):
        CentralizedLinUCB(5, d, r, policy, 0, backend="compiled").replay(clients[:r], contexts[:r], rewards[:r],
                                                                         logged[:r])
        VerticalLinearBandit(5, d, r, policy, 0, parties=2, refresh_mask=True, track_central=False,
                             backend="compiled").replay(clients[:r], contexts[:r], rewards[:r], logged[:r])
    assert [len(k.signatures) for k in ROWS_RUN] == [1, 1]


def test_gossip_kernel_has_one_type_per_variant() -> None:
    """An environment whose means are one table for every replicate (a broadcast, read-only view) hands the kernel
    a writable copy, the same type as per-replicate means."""
    for R in (1, 2):
        for means in (None, np.random.default_rng(0).random((4, 3))):
            env = MultiAgentMAB(4, 3, replicates=R, seed=1, means=means)
            assert env.means.flags.writeable and env.means.flags.c_contiguous
            GossipUCB(ring(4), 3, 20, replicates=R, seed=2, backend="compiled").play(env, 5)
    assert [len(k.signatures) for k in GOSSIP_RUN] == [1, 1]


def test_no_compiled_function_takes_more_than_eight_parameters() -> None:
    """Kernel helpers take named structures, not long positional lists (a swapped pair of 17 arrays type-checks and
    computes nonsense): every ``@jit`` function of fedrec takes at most 8 parameters."""
    import ast

    root = Path(__file__).resolve().parent.parent / "fedrec"
    wide = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            jitted = isinstance(node, ast.FunctionDef) and any(
                getattr(d, "id", None) == "jit" or getattr(getattr(d, "func", None), "id", None) == "jit"
                for d in node.decorator_list)
            if jitted and len(node.args.args) > 8:
                wide.append(f"{path.relative_to(root.parent)}::{node.name} ({len(node.args.args)})")
    assert not wide, f"compiled functions with more than 8 parameters: {wide}"

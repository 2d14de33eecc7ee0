"""The sparse layout of the star-network protocols (issue 29, item 4): state rows allocated on arrival make the
same decisions, the same messages and the same statistics as the dense layout (every client's rows up front),
on both backends and across a resume from a compact checkpoint; a run whose arrivals exceed the user's memory
limit is refused before allocating. The dense layout is the reference: it is the code path that ran before the
sparse one existed, with a slot per client from the start."""
from __future__ import annotations

import copy
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from omegaconf import DictConfig

from fedrec.app import build
from fedrec.errors import ConfigError
from fedrec.federation import Channel
from fedrec.protocols import AsyncLinUCB, SyncLinUCB
from tests.helpers import BACKENDS, assert_same_ledger, lints, stream, ucb

Compose = Callable[..., DictConfig]


class Recorder(Channel):
    """Delivers payloads unchanged and records every message batch (compiled kernels then stop at each one)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.log: list[tuple] = []

    def deliver(self, kind, payload, sender, receiver):
        ids = [torch.as_tensor(e[1]).reshape(-1).tolist() for e in (sender, receiver)]
        self.log.append((kind, sender[0], ids[0], receiver[0], ids[1], payload.clone()))
        return payload


ASYNC_CASES = [
    dict(gamma=1.5, R=1, policy="ucb", to_uploader=True, check=False, refresh=True),
    dict(gamma=1.2, R=3, policy="ucb", to_uploader=False, check=True, refresh=False),
    dict(gamma=(1.5, 3.0), R=2, policy="ucb", to_uploader=True, check=True, refresh=True),
    dict(gamma=2.0, R=2, policy="lints", to_uploader=False, check=False, refresh=False),
    dict(gamma=math.inf, R=1, policy="lints", to_uploader=True, check=True, refresh=True),
]
SYNC_CASES = [dict(threshold=0.5, R=1, policy="ucb"), dict(threshold=2.0, R=3, policy="ucb"),
              dict(threshold=1.0, R=2, policy="lints")]


def make(kind, case, backend, layout, N, d, seed=4):
    policy = lints() if case["policy"] == "lints" else ucb()
    if kind == "sync":
        return SyncLinUCB(N, d, case["R"], threshold=case["threshold"], policy=policy, seed=seed, backend=backend,
                          layout=layout)
    gu, gd = case["gamma"] if isinstance(case["gamma"], tuple) else (case["gamma"], case["gamma"])
    return AsyncLinUCB(N, d, case["R"], gamma_u=gu, gamma_d=gd, policy=policy, download_to_uploader=case["to_uploader"],
                       check_on_register=case["check"], refresh_on_download=case["refresh"], seed=seed,
                       backend=backend, layout=layout)


def play(p, it, cuts, start=0, end=None):
    """Run steps [start, end) of the stream in blocks ending at ``cuts`` (the sparse layout allocates per block)."""
    out = []
    for stop in (*cuts, it.clients.shape[1] if end is None else end):
        out.append(p.run(it.clients[:, start:stop], it.contexts[:, start:stop], it.rewards[:, start:stop]))
        start = stop
    return torch.cat(out, 1)


def assert_same_clients(dense, sparse):
    """Every client that arrived holds bit-identical statistics in both layouts (its row found through ``row_of``);
    the servers agree bit for bit; the sparse layout holds rows for the arrived clients only."""
    R, N = dense.replicates, dense.num_clients
    arrived = sparse.row_of.view(R, N) >= 0
    assert sparse.allocated.tolist() == arrived.sum(1).tolist()
    ids = arrived.view(-1).nonzero().view(-1)
    rows_d, rows_s = dense.row_of[ids], sparse.row_of[ids]
    assert torch.equal(sparse.client_of[rows_s], ids % N)
    d_rows, s_rows = dense._row_state(), sparse._row_state()
    assert d_rows.keys() == s_rows.keys()
    for k, (module, attr) in d_rows.items():
        a, b = getattr(module, attr), getattr(*s_rows[k])
        assert torch.equal(a[rows_d], b[rows_s]), k
    for k in ("server", "server_count"):
        assert torch.equal(getattr(dense, k), getattr(sparse, k)), k
    assert sparse.capacity <= max(2 * int(sparse.allocated.max()), 1)


def assert_same_messages(a: Recorder, b: Recorder):
    assert len(a.log) == len(b.log) > 0
    for x, y in zip(a.log, b.log):
        assert x[:5] == y[:5]
        assert torch.equal(x[5], y[5])


def _params(kind, cases):
    return [pytest.param(kind, c, backend, id=f"{kind}-{backend}-" + "-".join(f"{k}={v}" for k, v in c.items()))
            for c in cases for backend in BACKENDS]


@pytest.mark.parametrize("kind, case, backend", _params("async", ASYNC_CASES) + _params("sync", SYNC_CASES))
def test_sparse_equals_dense_decision_for_decision(kind, case, backend):
    N, d, T = 400, 4, 500  # fewer arrivals than clients: the sparse layout grows several times
    it = stream(N=N, d=d, T=T, seed=6, replicates=case["R"], arrival="zipf")
    dense, sparse = make(kind, case, backend, "dense", N, d), make(kind, case, backend, "sparse", N, d)
    arms = dense.run(it.clients, it.contexts, it.rewards)
    assert torch.equal(play(sparse, it, (1, 2, 3, 40, 41, 200)), arms)
    assert_same_ledger(dense, sparse)
    assert_same_clients(dense, sparse)
    assert sparse.capacity < N
    if kind == "sync" or case["gamma"] != math.inf:
        assert dense.ledger.totals()["comm_messages"].min() > 0  # the comparison covers communication


@pytest.mark.parametrize("kind, case, backend", [
    ("async", ASYNC_CASES[1], "compiled"), ("async", ASYNC_CASES[3], "torch"), ("sync", SYNC_CASES[1], "compiled"),
    ("sync", SYNC_CASES[2], "torch")])
def test_sparse_sends_the_dense_messages_in_the_dense_order(kind, case, backend):
    N, d, T = 60, 3, 300
    it = stream(N=N, d=d, T=T, seed=7, replicates=case["R"], arrival="zipf")
    runs = {}
    for layout in ("dense", "sparse"):
        p = make(kind, case, backend, layout, N, d)
        p.channel = Recorder(p.replicates, {"client": N, "server": 1})
        runs[layout] = (play(p, it, (50, 51, 120)), p)
    assert torch.equal(runs["dense"][0], runs["sparse"][0])
    assert_same_messages(runs["dense"][1].channel, runs["sparse"][1].channel)


@pytest.mark.parametrize("kind, case, backend", [
    ("async", ASYNC_CASES[1], "compiled"), ("async", ASYNC_CASES[1], "torch"), ("async", ASYNC_CASES[3], "compiled"),
    ("async", ASYNC_CASES[3], "torch"), ("sync", SYNC_CASES[1], "compiled"), ("sync", SYNC_CASES[2], "torch")])
def test_a_sparse_run_resumed_from_a_compact_checkpoint_equals_the_dense_run(kind, case, backend):
    N, d, T, T1 = 300, 4, 400, 170
    it = stream(N=N, d=d, T=T, seed=8, replicates=case["R"], arrival="zipf")
    dense = make(kind, case, backend, "dense", N, d)
    arms = dense.run(it.clients, it.contexts, it.rewards)
    first = make(kind, case, backend, "sparse", N, d)
    head = play(first, it, range(1, T1), end=T1)  # step by step: the slots double, 1, 2, 4, ..., 128
    state = copy.deepcopy(first.state_dict())
    # compact: the row buffers hold the slots in use only, the map and the allocation counts
    used = int(first.allocated.max())
    assert first.capacity > used  # doubling left spare slots, which the checkpoint leaves out
    R = case["R"]
    assert state["policy.G"].shape[0] == state["buffer"].shape[0] == state["client_of"].shape[0] == R * used
    assert state["row_of"].shape == (R * N,)
    resumed = make(kind, case, backend, "sparse", N, d, seed=99)  # LinTS's seed comes from the checkpoint
    resumed.load_state_dict(state)
    tail = play(resumed, it, (T1 + 1, 250), start=T1)
    assert torch.equal(torch.cat([head, tail], 1), arms)
    assert_same_ledger(dense, resumed)
    assert_same_clients(dense, resumed)


def test_the_sparse_layout_refuses_preregistration_and_unknown_layouts():
    with pytest.raises(ConfigError, match="^protocol.layout=sparse: preregistered"):
        AsyncLinUCB(10, 3, preregister=True, layout="sparse")
    with pytest.raises(ConfigError, match=r"^protocol.layout must be one of \['dense', 'sparse'\], got 'packed'$"):
        SyncLinUCB(10, 3, layout="packed")


def test_a_million_clients_hold_rows_for_the_arrived_ones_only():
    N, d = 1_000_000, 3
    it = stream(N=N, d=d, T=50, seed=9)
    p = AsyncLinUCB(N, d, policy=ucb(), layout="sparse", backend="torch")
    p.run(it.clients, it.contexts, it.rewards)
    arrived = int(np.unique(it.clients.numpy()).size)
    assert int(p.allocated[0]) == arrived
    assert p.policy.G.shape[0] == p.capacity <= 2 * arrived


# ------------------------------------------------------------------------------------------- memory limit
def test_the_sparse_estimate_counts_arrivals_bounded_by_steps(compose_cfg: Compose) -> None:
    base = ("replicates=2", "env.num_clients=1000000", "env.dim=25", "env.num_arms=25", "env.chunk_size=1000",
            "task.steps=100000")
    dense = build.bandit_memory_estimate(compose_cfg(*base))
    sparse = build.bandit_memory_estimate(compose_cfg(*base, "protocol.layout=sparse"))
    per_row = (3 * 26**2 + 25) * 8
    assert dense - sparse == 2 * (1_000_000 - 200_000) * per_row  # at most 2·steps slots (doubling) per replicate
    few = build.bandit_memory_estimate(compose_cfg(*base[:-1], "task.steps=1000000", "protocol.layout=sparse"))
    assert few == dense  # more steps than clients: every client may arrive


def test_a_run_above_the_memory_limit_is_refused_naming_the_field(compose_cfg: Compose,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = compose_cfg("env.num_clients=1000000", "task.steps=100000", "protocol.layout=sparse", "max_memory_gb=1")
    need = build.bandit_memory_estimate(cfg)
    assert need > 2**30
    built = []
    monkeypatch.setattr(build.builders, "instantiate_group", lambda *a, **k: built.append(a))
    with pytest.raises(ConfigError, match=rf"^max_memory_gb=1: the run needs about {need / 2**30:.1f} GiB "
                                          r"\(replicates=1, env.num_clients=1000000, task.steps=100000, "
                                          r"protocol.layout=sparse, .*\); lower one of them or raise max_memory_gb$"):
        build.build_task(cfg)
    assert built == []  # refused before the environment or the protocol is built


# ------------------------------------------------------------------------------------------- a run resumed
RUN = ("task.steps=600", "task.steps_per_round=50", "env.num_clients=2000", "env.dim=5", "env.num_arms=5",
       "logger.tensorboard=false", "plots=false", "trainer.checkpoint_every=4")
PROTOCOL = {"async": "protocol.gamma_u=2.0", "sync": "protocol=sync"}


@pytest.mark.parametrize("protocol", ["async", "sync"])
def test_a_sparse_run_interrupted_and_resumed_equals_the_dense_run(compose_cfg: Compose, tmp_path, protocol) -> None:
    from fedrec.app.cli import run

    base = (*RUN, PROTOCOL[protocol])
    full = run(compose_cfg(*base), output_dir=tmp_path / "dense")
    assert full["comm_messages"] > 0
    sparse = (*base, "protocol.layout=sparse")
    part = run(compose_cfg(*sparse, "trainer.max_rounds=5"), output_dir=tmp_path / "part")
    assert part["steps"] == 250
    ckpt = tmp_path / "part" / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, weights_only=False)
    protocol_state = next(_find(state, "client_of"))
    used = int(protocol_state["allocated"].max())
    assert used < 250 and protocol_state["policy.G"].shape[0] == used  # the arrived clients' rows only
    resumed = run(compose_cfg(*sparse, f"ckpt_path={ckpt}"), output_dir=tmp_path / "resumed")
    strip = lambda s: {k: v for k, v in s.items() if k != "wall_seconds"}  # noqa: E731
    assert strip(resumed) == strip(full)


def _find(node, key):
    """The mappings inside a checkpoint that hold ``key``."""
    if isinstance(node, dict):
        if key in node:
            yield node
        for v in node.values():
            yield from _find(v, key)

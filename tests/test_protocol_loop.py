"""The public loop (:class:`fedrec.protocols.TriggeredLinUCB`): a protocol written here as a trigger function and a
class equals a plain-Python reference loop decision for decision — the arm of every step, the steps that
synchronise, the messages and the final statistics — on both backends, and runs from a config; the documentation's
worked example, run as written, is FedLinUCB."""
from __future__ import annotations

import functools
import math
import re
import textwrap
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch

from fedrec.bandits import LinUCB
from fedrec.envs.synthetic import LinearEnv
from fedrec.errors import check_int
from fedrec.protocols import TriggeredLinUCB
from fedrec.protocols.kernels.linear import PolicyRows
from fedrec.protocols.kernels.triggered import SyncState, compiled_loop
from fedrec.utils.jit import I64

LAM, ALPHA, N, D, K = 0.1, 0.3, 8, 4, 6


class Batch(NamedTuple):
    """The trigger's own field: the attribute ``batch``."""

    batch: int


def batch_full(r: int, row: int, pol: PolicyRows, st: SyncState, own: Batch) -> bool:
    """Event trigger: the acting client has gathered ``batch`` observations since the last sync."""
    return st.buffer_count[row] >= own.batch


class BatchSyncLinUCB(TriggeredLinUCB):
    """Local LinUCB clients, synchronised whenever one of them holds ``batch`` new observations."""

    trigger = staticmethod(batch_full)
    trigger_fields = Batch

    def __init__(self, num_clients: int, dim: int, replicates: int = 1, batch: int = 5, **kw) -> None:
        super().__init__(num_clients, dim, replicates, **kw)
        self.batch = batch


def reference(clients, contexts, rewards, batch: int) -> dict:
    """The protocol in plain Python, one client dict at a time: each client's LinUCB on its augmented Gram matrix
    [x; y][x; y]ᵀ, an upload buffer of the same, and a global sync (uploads in client order, then the aggregate to
    every client seen so far) after any step that leaves the acting client with ``batch`` buffered observations."""
    G, buf, count, observed = {}, {}, {}, {}
    server, server_count, syncs, arms, messages = np.zeros((D + 1, D + 1)), 0, [], [], 0
    for t, c in enumerate(clients.tolist()):
        if c not in G:
            G[c], buf[c], count[c], observed[c] = np.zeros((D + 1, D + 1)), np.zeros((D + 1, D + 1)), 0, 0
        inv = np.linalg.inv(G[c][:D, :D] + LAM * np.eye(D))
        X = contexts[t]
        scores = X @ (inv @ G[c][:D, D]) + ALPHA * np.sqrt(np.einsum("kd,de,ke->k", X, inv, X))
        a = int(np.argmax(scores))
        z = np.append(X[a], rewards[t, a])
        G[c] += np.outer(z, z)
        buf[c] += np.outer(z, z)
        count[c] += 1
        observed[c] += 1
        arms.append(a)
        if count[c] >= batch:
            syncs.append(t)
            messages += 2 * len(G)  # an upload and a download per client seen so far
            for j in sorted(G):
                server += buf[j]
                server_count += count[j]
                buf[j], count[j] = np.zeros((D + 1, D + 1)), 0
            for j in G:
                G[j], observed[j] = server.copy(), server_count
    return {"arms": arms, "syncs": syncs, "G": G, "buffer": buf, "count": observed, "server": server,
            "messages": messages}


def stream(T=240, R=1, seed=5):
    return LinearEnv(num_clients=N, dim=D, num_arms=K, replicates=R, seed=seed, contexts="ball").interactions(0, T)


def protocol(R=1, batch=5, backend="compiled") -> BatchSyncLinUCB:
    return BatchSyncLinUCB(N, D, R, batch=batch, policy=functools.partial(LinUCB, lam=LAM, alpha=ALPHA),
                           backend=backend)


def assert_equals_reference(p: BatchSyncLinUCB, r: int, ref: dict) -> None:
    """Replicate ``r``'s final statistics: every client's Gram matrix, buffer and count, the server's aggregate,
    the sync rounds and the messages they cost. The kernel adds in the reference's order (equal to the last bit);
    the torch path sums a sync's uploads in one reduction (equal to rounding)."""
    cap = p.capacity

    def same(ours: torch.Tensor, theirs: np.ndarray) -> bool:
        expected = torch.from_numpy(theirs)
        return torch.equal(ours, expected) if p.use_compiled() else torch.allclose(ours, expected, rtol=1e-12, atol=0)

    for c in range(N):
        row = int(p.row_of[r * N + c])
        if c in ref["G"]:
            assert same(p.policy.G[row], ref["G"][c]), c
            assert same(p.buffer[row], ref["buffer"][c]), c
            assert int(p.policy.count[row]) == ref["count"][c]
            logdet = np.linalg.slogdet(ref["G"][c][:D, :D] + LAM * np.eye(D))[1]
            assert float(p.policy.logdet[row]) == pytest.approx(logdet, abs=1e-9)
        else:
            assert not bool(p.registered[row]) and int(p.policy.count[row]) == 0
    assert same(p.server[r], ref["server"])
    assert int(p.sync_rounds[r]) == len(ref["syncs"])
    assert int(p.ledger.totals()["comm_messages"][r]) == ref["messages"]
    assert int(p.registered[r * cap : (r + 1) * cap].sum()) == len(ref["G"])


@pytest.mark.parametrize("backend", ["compiled", "torch"])
@pytest.mark.parametrize("batch", [1, 5, 40])
def test_a_protocol_on_the_public_loop_equals_the_reference_decision_for_decision(backend, batch):
    """Played one step per call, the sync rounds after each step give the steps that synchronised; played as one
    block, the same decisions again."""
    it = stream()
    ref = reference(it.clients[0].numpy(), it.contexts[0].numpy(), it.rewards[0].numpy(), batch)
    stepwise, arms, syncs = protocol(batch=batch, backend=backend), [], []
    for t in range(it.clients.shape[1]):
        arms.append(int(stepwise.run(it.clients[:, t : t + 1], it.contexts[:, t : t + 1], it.rewards[:, t : t + 1])))
        if int(stepwise.sync_rounds[0]) > len(syncs):
            syncs.append(t)
    assert arms == ref["arms"]
    assert syncs == ref["syncs"] and len(syncs) > 0
    assert_equals_reference(stepwise, 0, ref)
    block = protocol(batch=batch, backend=backend)
    assert block.run(it.clients, it.contexts, it.rewards)[0].tolist() == ref["arms"]
    assert_equals_reference(block, 0, ref)


def test_each_replicate_of_the_parallel_loop_equals_the_reference():
    it = stream(R=3)
    p = protocol(R=3)
    arms = p.run(it.clients, it.contexts, it.rewards)
    for r in range(3):
        ref = reference(it.clients[r].numpy(), it.contexts[r].numpy(), it.rewards[r].numpy(), 5)
        assert arms[r].tolist() == ref["arms"]
        assert_equals_reference(p, r, ref)


def test_one_compiled_loop_per_trigger_named_by_its_code():
    """The loop is compiled once per trigger function; a trigger with other code gets a loop of another name, so
    numba's cache cannot hand back a loop with an older trigger inlined."""
    serial, parallel = compiled_loop(batch_full)
    assert compiled_loop(batch_full) == (serial, parallel)

    def stricter(r, row, pol, st, own):
        return st.buffer_count[row] > own.batch

    stricter.__name__ = batch_full.__name__  # the same name, another body
    other = compiled_loop(stricter)[0]
    assert other.py_func.__name__.startswith("_run_batch_full_") and other.py_func.__name__ != serial.py_func.__name__


def test_a_protocol_defined_outside_the_library_runs_from_a_config(compose_cfg, tmp_path):
    from fedrec.app.cli import run as cli_run

    cfg = compose_cfg("protocol=fed_linucb", f"protocol._target_={__name__}.BatchSyncLinUCB", "~protocol.period",
                      "+protocol.batch=3", "task.steps=300", "logger.tensorboard=false", "plots=false")
    summary = cli_run(cfg, output_dir=tmp_path)
    assert summary["comm_upload_messages"] == summary["comm_download_messages"] > 0
    assert math.isfinite(summary["cumulative_regret"])


def test_the_worked_example_of_the_docs_is_fedlinucb():
    """The code of the "Add a protocol" page (docs/concepts.md), run as written, plays as the library's FedLinUCB
    (on the torch path, where the page's trigger decides on numpy views, so nothing is compiled)."""
    from fedrec.protocols.fed_linucb import FedLinUCB

    page = (Path(__file__).parents[1] / "docs" / "concepts.md").read_text(encoding="utf-8")
    section = page.split("## Add a protocol", 1)[1].split("\n## ", 1)[0]
    blocks = [textwrap.dedent(b) for b in re.findall(r"```python\n(.*?)```", section, flags=re.S)]
    assert len(blocks) == 2
    # exec inherits this module's postponed annotations: the page's structure reads them in this module
    namespace = {"__name__": __name__, "NamedTuple": NamedTuple, "I64": I64, "TriggeredLinUCB": TriggeredLinUCB,
                 "torch": torch, "check_int": check_int}
    exec("\n".join(blocks), namespace)  # noqa: S102 - the documentation's own example
    it = stream(R=2)
    policy = functools.partial(LinUCB, lam=LAM, alpha=ALPHA)
    ours, theirs = (cls(N, D, 2, period=9, policy=policy, backend="torch")
                    for cls in (namespace["FedLinUCB"], FedLinUCB))
    assert torch.equal(ours.run(it.clients, it.contexts, it.rewards), theirs.run(it.clients, it.contexts, it.rewards))
    assert torch.equal(ours.sync_rounds, theirs.sync_rounds) and int(ours.sync_rounds.min()) == 240 // 9

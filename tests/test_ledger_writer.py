"""The one compiled ledger writer (:func:`fedrec.protocols.kernels.ledger.record`): it counts a message where the
channel's :meth:`~fedrec.federation.ledger.CommLedger.record` does, and what the compiled protocols count equals a
plain count of their messages (FedLinUCB's clock, Gossip_UCB's one edge per round, the FCLUB family's two
structures)."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from fedrec.bandits import LinUCB
from fedrec.envs.clustered import ClusteredLinearEnv
from fedrec.envs.mab import MultiAgentMAB
from fedrec.envs.synthetic import LinearEnv
from fedrec.federation.ledger import KINDS, RECEIVED, SENT, UNITS, CommLedger
from fedrec.federation.topology import ring
from fedrec.protocols import FederatedClustering
from fedrec.protocols.fed_linucb import FedLinUCB
from fedrec.protocols.gossip import GossipUCB
from fedrec.protocols.kernels.ledger import record

ROLES = {"client": 5, "server": 2}


def test_the_compiled_writer_counts_as_the_channels_ledger_and_a_plain_loop() -> None:
    """Random messages between and within roles (peer messages have one traffic array on both sides), counted by
    the compiled writer, by :meth:`CommLedger.record` one batch at a time, and by a plain dictionary count."""
    rng = np.random.default_rng(0)
    R = 3
    compiled, batched = CommLedger(R, ROLES), CommLedger(R, ROLES)
    plain: dict[tuple, int] = {}
    for _ in range(200):
        kind = KINDS[rng.integers(len(KINDS))]
        (src, dst) = [list(ROLES)[i] for i in rng.integers(len(ROLES), size=2)]
        s, e, r = int(rng.integers(ROLES[src])), int(rng.integers(ROLES[dst])), int(rng.integers(R))
        scalars, itemsize = int(rng.integers(0, 50)), int(rng.choice([4, 8]))
        record(compiled.traffic(src).numpy(), s, compiled.traffic(dst).numpy(), e, r, KINDS.index(kind), scalars,
               itemsize)
        batched.record(kind, (src, torch.tensor([s])), (dst, torch.tensor([e])), torch.tensor([r]),
                       torch.tensor([scalars]), itemsize)
        for role, endpoint, side in ((src, s, "sent"), (dst, e, "received")):
            for unit, amount in zip(UNITS, (1, scalars, scalars * itemsize)):
                key = (role, r, endpoint, kind, side, unit)
                plain[key] = plain.get(key, 0) + amount
    for role in ROLES:
        assert torch.equal(compiled.traffic(role), batched.traffic(role))
        t = compiled.traffic(role)
        for (rl, r, endpoint, kind, side, unit), amount in plain.items():
            if rl == role:
                assert int(t[r, endpoint, KINDS.index(kind), ("sent", "received").index(side),
                             UNITS.index(unit)]) == amount
        counted = {k for k in plain if k[0] == role}
        assert int(t.sum()) == sum(plain[k] for k in counted)


def test_sent_and_received_are_the_ledgers_sides() -> None:
    traffic = np.zeros((1, 2, len(KINDS), 2, len(UNITS)), dtype=np.int64)
    record(traffic, 0, traffic, 1, 0, KINDS.index("peer"), 3, 8)
    assert traffic[0, 0, KINDS.index("peer"), SENT].tolist() == [1, 3, 24]
    assert traffic[0, 1, KINDS.index("peer"), RECEIVED].tolist() == [1, 3, 24]
    assert int(traffic.sum()) == 2 * (1 + 3 + 24)


@pytest.mark.parametrize("R", [1, 2])
def test_fed_linucb_counts_what_its_clock_implies(R: int) -> None:
    """Every ``period``-th step every client that has acted uploads and downloads one {ΔV, Δb} message."""
    N, d, T, period = 9, 3, 240, 20
    it = LinearEnv(num_clients=N, dim=d, num_arms=4, replicates=R, seed=5, contexts="ball").interactions(0, T)
    p = FedLinUCB(N, d, R, period=period, policy=functools.partial(LinUCB, lam=0.1, alpha=0.3))
    p.run(it.clients, it.contexts, it.rewards)
    totals = p.ledger.totals()
    for r in range(R):
        registered = [len(set(it.clients[r, :t].tolist())) for t in range(period, T + 1, period)]
        messages = sum(registered)
        scalars = messages * (d * d + d)
        for kind in ("upload", "download"):
            assert int(totals[f"comm_{kind}_messages"][r]) == messages
            assert int(totals[f"comm_{kind}_scalars"][r]) == scalars
            assert int(totals[f"comm_{kind}_bytes"][r]) == 8 * scalars


@pytest.mark.parametrize("R", [1, 2])
def test_gossip_counts_two_peer_messages_of_every_arm_per_round(R: int) -> None:
    N, M, rounds = 5, 3, 30
    env = MultiAgentMAB(N, M, replicates=R, seed=1)
    p = GossipUCB(ring(N), M, rounds + 5, replicates=R, seed=2, backend="compiled")
    p.play(env, rounds)
    totals = p.ledger.totals()
    for r in range(R):
        assert int(totals["comm_peer_messages"][r]) == 2 * rounds
        assert int(totals["comm_peer_scalars"][r]) == 2 * rounds * M
        assert int(totals["comm_peer_bytes"][r]) == 2 * rounds * M * 8
        assert int(totals["comm_messages"][r]) == 2 * rounds


def test_fclub_counts_each_message_once_on_each_side(data_dir) -> None:
    """FCLUB's messages run between a local server and the global server: what the local servers sent (received)
    the global server received (sent), in every unit, and every message has (d² + d + 1) float64 scalars."""
    env = ClusteredLinearEnv(data_dir=data_dir, replicates=2, seed=4, chunk_size=200)
    batch = env.interactions(0, 200)
    p = FederatedClustering(env.num_clients, env.dim, 2, seed=7)
    p.run(batch.clients, batch.contexts, batch.rewards)
    L, totals, d = p.ledger, p.ledger.totals(), env.dim
    for kind, local_side, global_side in (("upload", "sent", "received"), ("download", "received", "sent")):
        for unit in UNITS:
            local = L.per_endpoint("server", kind, unit, local_side).sum(1)
            assert torch.equal(local, L.per_endpoint("global", kind, unit, global_side).sum(1))
            assert torch.equal(local, totals[f"comm_{kind}_{unit}"])
        messages = totals[f"comm_{kind}_messages"]
        assert bool((messages > 0).all())
        assert torch.equal(totals[f"comm_{kind}_scalars"], messages * (d * d + d + 1))
        assert torch.equal(totals[f"comm_{kind}_bytes"], messages * (d * d + d + 1) * 8)

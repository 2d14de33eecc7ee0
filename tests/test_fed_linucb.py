"""FedLinUCB with a fixed synchronisation period (the worked example of adding a compiled protocol): compiled ≡
torch, both ≡ a per-client numpy reference, the communication a clock implies, and its config end to end."""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from fedrec.bandits import LinUCB
from fedrec.envs.synthetic import LinearEnv
from fedrec.protocols import AsyncLinUCB
from fedrec.protocols.fed_linucb import FedLinUCB
from tests.reference.sync_and_am import RefSyncLinUCB

LAM, ALPHA = 0.1, 0.3
POLICY = functools.partial(LinUCB, lam=LAM, alpha=ALPHA)


class RefFedLinUCB(RefSyncLinUCB):
    """The authors'-style Sync-LinUCB reference with a clock as its trigger: every ``period``-th step syncs."""

    def __init__(self, dim: int, period: int) -> None:
        super().__init__(dim, lam=LAM, alpha=ALPHA, threshold=math.inf)
        self.period, self.steps = period, 0

    def play(self, clientID: int, arms: np.ndarray, rewards: np.ndarray) -> int:
        self.steps += 1
        self.threshold = -math.inf if self.steps % self.period == 0 else math.inf  # the trigger fires or cannot
        return super().play(clientID, arms, rewards)


def stream(T=300, N=8, d=4, R=1, seed=2):
    return LinearEnv(num_clients=N, dim=d, num_arms=6, replicates=R, seed=seed, contexts="ball").interactions(0, T)


def run(p, it):
    return p.run(it.clients, it.contexts, it.rewards)


@pytest.mark.parametrize("period", [1, 7, 50])
@pytest.mark.parametrize("R", [1, 3])
def test_compiled_and_torch_paths_agree(period, R):
    it = stream(R=R)
    a, b = (FedLinUCB(8, 4, R, period=period, policy=POLICY, backend=backend) for backend in ("compiled", "torch"))
    assert torch.equal(run(a, it), run(b, it))
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for k in sa:
        assert torch.allclose(sa[k].double(), sb[k].double(), rtol=0, atol=1e-9), k
    assert torch.equal(a.ledger.totals()["comm_messages"], b.ledger.totals()["comm_messages"])


@pytest.mark.parametrize("period", [1, 7, 50])
def test_decisions_and_messages_equal_the_per_client_reference(period):
    it = stream()
    ours = FedLinUCB(8, 4, period=period, policy=POLICY)
    arms = run(ours, it)[0].tolist()
    ref = RefFedLinUCB(4, period)
    ref_arms = [ref.play(int(it.clients[0, t]), it.contexts[0, t].numpy(), it.rewards[0, t].numpy())
                for t in range(it.clients.shape[1])]
    assert arms == ref_arms
    totals = ours.ledger.totals()
    assert (int(totals["comm_upload_messages"]), int(totals["comm_download_messages"])) == (ref.uploads, ref.downloads)
    assert int(ours.sync_rounds) == 300 // period


def test_a_period_longer_than_the_run_is_local_linucb():
    """Without a sync every client plays its own LinUCB: Async-LinUCB with γ = ∞ decides the same, and no message
    is sent."""
    it = stream(R=2)
    fed = FedLinUCB(8, 4, 2, period=10_000, policy=POLICY)
    local = AsyncLinUCB(8, 4, 2, gamma_u=math.inf, gamma_d=math.inf, policy=POLICY)
    assert torch.equal(run(fed, it), run(local, it))
    assert int(fed.ledger.totals()["comm_messages"].sum()) == 0


def test_resume_from_the_state_dict_continues_the_clock():
    it = stream(T=200)
    whole = FedLinUCB(8, 4, period=30, policy=POLICY)
    expected = run(whole, it)
    first = FedLinUCB(8, 4, period=30, policy=POLICY)
    head = first.run(it.clients[:, :110], it.contexts[:, :110], it.rewards[:, :110])
    second = FedLinUCB(8, 4, period=30, policy=POLICY)
    second.load_state_dict(first.state_dict())
    tail = second.run(it.clients[:, 110:], it.contexts[:, 110:], it.rewards[:, 110:])
    assert torch.equal(torch.cat([head, tail], 1), expected)
    assert int(second.sync_rounds) == int(whole.sync_rounds) == 200 // 30


def test_bad_period_is_refused_by_name():
    from fedrec.errors import ConfigError

    with pytest.raises(ConfigError, match="period"):
        FedLinUCB(8, 4, period=0)


def test_the_config_runs_end_to_end(compose_cfg, tmp_path):
    from fedrec.app.cli import run as cli_run

    cfg = compose_cfg("protocol=fed_linucb", "protocol.period=40", "task.steps=400", "replicates=2",
                      "logger.tensorboard=false", "plots=false")
    summary = cli_run(cfg, output_dir=tmp_path)
    registered = summary["comm_upload_messages"] / (400 // 40)  # every sync: one upload per registered client
    assert summary["comm_upload_messages"] == summary["comm_download_messages"] > 0
    assert 0 < registered <= cfg.env.num_clients
    assert math.isfinite(summary["cumulative_regret"])

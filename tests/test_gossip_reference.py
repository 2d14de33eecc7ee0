"""fedrec's Gossip_UCB / Fed_UCB against the per-agent Python reference of tests/reference/gossip.py (written from
the gossip spec §2.3–2.7, drawing every random number through the same keyed helpers): on one seed both must make
the same decisions and reach the same regret, on the compiled and the torch backends."""
from __future__ import annotations

import math

import numpy as np
import pytest

from fedrec.envs.mab import MultiAgentMAB
from fedrec.federation.topology import complete
from fedrec.privacy import TreeLaplace
from fedrec.protocols.gossip import FedUCB
from tests.reference.gossip import RefGossipUCB, dyadic_intervals

N, M, T = 3, 4, 300


def test_dyadic_intervals_cover_one_to_t() -> None:
    for t in (1, 2, 7, 12, 300):
        covered = sorted(tau for q, e in dyadic_intervals(t) for tau in range(q + 1, e + 1))
        assert covered == list(range(1, t + 1))


@pytest.mark.parametrize("backend", ["compiled", "torch"])
@pytest.mark.parametrize("epsilon", [1.0, math.inf])
def test_reference_matches_fedrec(epsilon: float, backend: str) -> None:
    env = MultiAgentMAB(N, M, seed=3)
    ref = RefGossipUCB(complete(N), M, horizon=T, epsilon=epsilon, seed=5)
    ref_arms = np.array(ref.play(env, T))
    ours = FedUCB(complete(N), M, T, replicates=1, seed=5, privacy=TreeLaplace(epsilon), backend=backend)
    arms = ours.play(env, T, return_arms=True)[0].numpy()
    mismatch = np.flatnonzero((arms != ref_arms).any(axis=1))
    assert mismatch.size == 0, f"first differing round: t = {mismatch[0] + 1}"
    np.testing.assert_allclose(ours.regret[0].numpy(), ref.regret, rtol=0, atol=1e-9)
    np.testing.assert_allclose(ours.theta[0].numpy(), [a.theta for a in ref.agents], rtol=0, atol=1e-9)
    assert len({tuple(row) for row in ref_arms}) > 1  # the agents did not all sit on one arm from the start

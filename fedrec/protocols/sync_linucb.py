"""Sync-LinUCB (the paper's Algorithm 4, DisLinUCB of Wang et al. 2019 adapted): global sync rounds."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from fedrec.bandits.linear import RowState
from fedrec.errors import check_float
from fedrec.protocols.base import PolicyFactory
from fedrec.protocols.kernels.linear import PolicyRows
from fedrec.protocols.kernels.triggered import SyncState
from fedrec.protocols.triggered import TriggeredLinUCB


class DeterminantRatio(NamedTuple):
    """Sync-LinUCB's trigger setting (its attribute of the same name)."""

    threshold: float  #: D of Algorithm 4


def determinant_ratio(r: int, row: int, pol: PolicyRows, st: SyncState, own: DeterminantRatio) -> bool:
    """Algorithm 4's trigger: the acting client's Δt_i · log(det V_i(λ) / det S_i(λ)) > D."""
    return st.steps_since_sync[row] * (pol.logdet[row] - st.synced_logdet[row]) > own.threshold


class SyncLinUCB(TriggeredLinUCB):
    """Every client uploads and downloads whenever the active client's Δt_i·log(det V_i(λ)/det S_i(λ)) > D.

    A sync round costs 2 messages per registered client (idle clients upload empty buffers too), after which
    every registered client holds the server aggregate (V_g, b_g). ``layout``: as in
    :class:`~fedrec.protocols.AsyncLinUCB`.
    """

    trigger = staticmethod(determinant_ratio)
    trigger_fields = DeterminantRatio

    def __init__(
        self,
        num_clients: int,
        dim: int,
        replicates: int = 1,
        threshold: float = 10.0,
        policy: PolicyFactory | None = None,
        preregister: bool = False,
        seed: int = 0,
        backend: str = "auto",
        layout: str = "dense",
    ) -> None:
        super().__init__(num_clients, dim, replicates, policy, preregister, seed, backend, layout)
        self.threshold = check_float("threshold", threshold, low=0.0, allow_inf=True)

    def _due(self, rows: Tensor, new: RowState) -> Tensor:
        gain = new["policy.logdet"] - self.synced_logdet[rows]
        return new["steps_since_sync"].to(torch.float64) * gain > self.threshold

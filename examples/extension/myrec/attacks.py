"""An attack: free riders (Lin et al. 2019), clients that train nothing and upload noise of a small scale (zeros by
default) to look like participants while taking the global model."""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from fedrec.errors import check_float
from fedrec.models import FederatedRecommender
from fedrec.recsys import Attack, Uploads
from fedrec.recsys.data import RoundData


class FreeRider(Attack):
    """Every malicious upload (ω and each row) replaced by N(0, ``noise``²) draws, seeded by the run and the round
    so that a resumed run repeats them."""

    def __init__(self, fraction: float = 0.1, noise: float = 0.0) -> None:
        super().__init__(fraction)
        self.noise = check_float("attack.noise", noise, low=0.0)

    def poison(self, up: Uploads, bad: Tensor, round_idx: int, model: FederatedRecommender,
               data: RoundData) -> Uploads:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + round_idx)
        shared = torch.randn(up.shared.shape, generator=g, dtype=up.shared.dtype) * self.noise
        rows = torch.randn(up.rows.shape, generator=g, dtype=up.rows.dtype) * self.noise
        row_bad = bad[up.row_client].unsqueeze(1)
        return replace(up, shared=torch.where(bad.unsqueeze(1), shared.to(up.shared), up.shared),
                       rows=torch.where(row_bad, rows.to(up.rows), up.rows))

"""Aggregation (step ④ of the round): how the server combines the clients' uploads (pluggable; ``aggregator=...``).

An upload (:class:`Uploads`) carries the client's (noised) ω update and one embedding row per uploaded item, with
the item ids X^t. ω is combined as a weighted mean over the clients; each item's row is the weighted mean over the
clients that uploaded that item (item-wise averaging, FedGNN [3] / BGTplanner spec §1.3). The server step
(:mod:`fedrec.recsys.server`) then applies its optimiser to the result, so both aggregators produce a gradient-like
update. Nothing depends on the order of the rows (clients shuffle them, :func:`fedrec.recsys.upload.upload_order`):
only float64 rounding does.

An aggregation rule is a small class over the uploads: an :class:`Aggregator` whose :meth:`~Aggregator.partial`
sums add up over disjoint sets of clients runs sharded across processes (:meth:`~Aggregator.finish` turns the total
into the update); one that overrides ``__call__`` sees every upload at once and runs in one process.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fedrec.errors import ConfigError, check_float, check_int

WEIGHTINGS = ("uploaded_items", "ratings", "uniform")


@dataclass
class Uploads:
    """What the participating clients of a round send, as the server receives it."""

    clients: Tensor  # (C,) global client ids
    shared: Tensor  # (C, P) flattened ω updates (P = 0 for models without ω)
    row_client: Tensor  # (R,) index into clients
    row_item: Tensor  # (R,) global item ids: X^t, real and pseudo items, in no meaningful order
    rows: Tensor  # (R, k) item-row updates
    num_ratings: Tensor | None  # (C,) ratings each client trained on; None under DP (it is private)


@dataclass
class AggregateSums:
    """Weighted sums of uploads (float64), additive over disjoint sets of clients."""

    shared: Tensor  # (P,) Σ_c w_c ω_c
    weight: Tensor  # (1,) Σ_c w_c
    rows: Tensor  # (I, k) Σ w_c · row, per item
    row_weight: Tensor  # (I,) Σ w_c over the item's uploaders
    row_count: Tensor  # (I,) the item's uploaders

    @classmethod
    def zeros(cls, num_shared: int, num_items: int, dim: int, device: torch.device | str = "cpu") -> AggregateSums:
        """The sums of no uploads."""
        def z(*shape: int) -> Tensor:
            return torch.zeros(*shape, dtype=torch.float64, device=device)
        return cls(z(num_shared), z(1), z(num_items, dim), z(num_items), z(num_items))

    def tensors(self) -> list[Tensor]:
        """The fields, in order (what an all-reduce adds up in place)."""
        return [self.shared, self.weight, self.rows, self.row_weight, self.row_count]


class Aggregator:
    """Weighted mean of ω over clients and item-wise weighted mean of embedding rows over uploaders.

    Args:
        weighting: client weights: ``"uploaded_items"`` (|real ∪ pseudo items|, the authors' n_u),
            ``"ratings"`` (local data size, McMahan et al.'s FedAvg) or ``"uniform"``.
        local_steps: SGD steps each client takes before uploading (1: it uploads its gradient).
        local_lr: the clients' SGD step size (used when ``local_steps > 1``).
    """

    def __init__(self, weighting: str = "uploaded_items", local_steps: int = 1, local_lr: float = 0.05) -> None:
        if weighting not in WEIGHTINGS:
            raise ConfigError(f"aggregator.weighting must be one of {list(WEIGHTINGS)}, got {weighting!r}")
        self.weighting = weighting
        self.local_steps = check_int("aggregator.local_steps", local_steps)
        self.local_lr = check_float("aggregator.local_lr", local_lr, low=0.0, low_open=True)

    def client_weights(self, up: Uploads) -> Tensor:
        C = up.clients.numel()
        if self.weighting == "uploaded_items":
            return torch.bincount(up.row_client, minlength=C).double()
        if self.weighting == "ratings":
            if up.num_ratings is None:
                raise ConfigError("aggregator.weighting=ratings needs the clients' rating counts, which private "
                                  "uploads do not carry")
            return up.num_ratings.double()
        return torch.ones(C, dtype=torch.float64)

    def __call__(self, up: Uploads) -> tuple[Tensor, Tensor, Tensor]:
        """``(ω update (P,), item ids (I_t,), item-row updates (I_t, k))`` for the items in X^t."""
        num_items = int(up.row_item.max()) + 1 if up.row_item.numel() else 0
        return self.finish(self.partial(up, num_items), up.shared.dtype)

    def partial(self, up: Uploads, num_items: int) -> AggregateSums:
        """The weighted sums of these uploads, which add up over disjoint sets of clients (a sharded run adds its
        processes' with an all-reduce)."""
        device = up.rows.device
        w = self.client_weights(up).to(device)
        rw, row_item = w[up.row_client.to(device)], up.row_item.to(device)
        zeros = torch.zeros(num_items, dtype=torch.float64, device=device)
        return AggregateSums(
            shared=(w.unsqueeze(1) * up.shared.double()).sum(0),
            weight=w.sum().reshape(1),
            rows=torch.zeros(num_items, up.rows.shape[1], dtype=torch.float64, device=device).index_add(
                0, row_item, rw.unsqueeze(1) * up.rows.double()),
            row_weight=zeros.index_add(0, row_item, rw),
            row_count=torch.bincount(row_item, minlength=num_items).double(),
        )

    def finish(self, sums: AggregateSums, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor, Tensor]:
        """The weighted means of all clients' summed uploads: ``(ω update, item ids, item-row updates)``."""
        items = torch.nonzero(sums.row_count > 0).reshape(-1)
        rows = sums.rows[items] / sums.row_weight[items].unsqueeze(1)
        return (sums.shared / sums.weight).to(dtype), items, rows.to(dtype)


class FedSGD(Aggregator):
    """FedSGD (McMahan et al. 2017) as the authors run it: one gradient per client, weighted by its uploaded
    items."""

    def __init__(self, weighting: str = "uploaded_items") -> None:
        super().__init__(weighting=weighting, local_steps=1)


class FedAvg(Aggregator):
    """FedAvg (McMahan et al. 2017): ``local_steps`` local SGD steps per client before uploading. Updates are
    weighted by uploaded items by default, which DP allows; ``weighting="ratings"`` (local data size, McMahan's
    rule) reveals private counts and is refused with privacy on. The server applies its optimiser to the mean
    update (with ``task.optimizer=sgd``, ``task.lr = local_lr`` and no weight decay this is McMahan's averaging
    of local models; with Adam it is FedAdam-like)."""

    def __init__(self, local_steps: int = 5, local_lr: float = 0.05, weighting: str = "uploaded_items") -> None:
        super().__init__(weighting=weighting, local_steps=local_steps, local_lr=local_lr)

"""Communication accounting: messages, scalars and bytes per direction, per replicate run."""
from __future__ import annotations

import torch
from torch import Tensor, nn

DIRECTIONS = ("upload", "download", "peer")
UNITS = ("messages", "scalars", "bytes")


class CommLedger(nn.Module):
    """Counts what passes a :class:`Channel`, separately for each replicate and direction.

    Papers count communication differently (the Async-LinUCB paper counts messages; its sibling code counts
    scalars), so all three units are kept: messages, scalars (numbers sent) and bytes.
    """

    def __init__(self, replicates: int = 1) -> None:
        super().__init__()
        self.register_buffer("counts", torch.zeros(len(DIRECTIONS), replicates, len(UNITS), dtype=torch.long))
        self._units: dict[tuple[int, int], Tensor] = {}

    def record(self, direction: str, owners: Tensor, scalars_per_message: int | Tensor, bytes_per_scalar: int) -> None:
        """Count one message per entry of ``owners`` (the replicate index each message belongs to); its size is
        ``scalars_per_message``, one number for all or a tensor with one size per message."""
        if isinstance(scalars_per_message, Tensor):
            s = scalars_per_message.to(torch.long)
            units = torch.stack([torch.ones_like(s), s, s * bytes_per_scalar], 1)
        else:
            key = (scalars_per_message, bytes_per_scalar)
            if key not in self._units:
                self._units[key] = torch.tensor([[1, scalars_per_message, scalars_per_message * bytes_per_scalar]])
            units = self._units[key].expand(len(owners), -1)
        self.counts[DIRECTIONS.index(direction)].index_add_(0, owners, units)

    def totals(self) -> dict[str, Tensor]:
        """Per-replicate totals: ``comm_messages``, ``comm_scalars``, ``comm_bytes`` and each per direction."""
        out: dict[str, Tensor] = {}
        for u, unit in enumerate(UNITS):
            out[f"comm_{unit}"] = self.counts[:, :, u].sum(0)
            for d, direction in enumerate(DIRECTIONS):
                out[f"comm_{direction}_{unit}"] = self.counts[d, :, u].clone()
        return out

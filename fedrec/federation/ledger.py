"""Communication accounting: messages, scalars and bytes per direction, per replicate run."""
from __future__ import annotations

import torch
from torch import Tensor, nn

DIRECTIONS = ("upload", "download", "peer")


class CommLedger(nn.Module):
    """Counts what passes a :class:`Channel`, separately for each replicate and direction.

    Papers count communication differently (the Async-LinUCB paper counts messages; its sibling code counts
    scalars), so all three units are kept: messages, scalars (numbers sent) and bytes.
    """

    def __init__(self, replicates: int = 1) -> None:
        super().__init__()
        for d in DIRECTIONS:
            for unit in ("messages", "scalars", "bytes"):
                self.register_buffer(f"{d}_{unit}", torch.zeros(replicates, dtype=torch.long))

    def record(self, direction: str, owners: Tensor, scalars_per_message: int, bytes_per_scalar: int) -> None:
        """Count one message per entry of ``owners`` (the replicate index each message belongs to)."""
        ones = torch.ones_like(owners)
        getattr(self, f"{direction}_messages").index_add_(0, owners, ones)
        getattr(self, f"{direction}_scalars").index_add_(0, owners, ones * scalars_per_message)
        getattr(self, f"{direction}_bytes").index_add_(0, owners, ones * (scalars_per_message * bytes_per_scalar))

    def record_counts(self, direction: str, messages: Tensor, scalars_per_message: int, bytes_per_scalar: int) -> None:
        """Count ``messages[r]`` messages for each replicate ``r`` at once."""
        messages = messages.to(torch.long)
        getattr(self, f"{direction}_messages").add_(messages)
        getattr(self, f"{direction}_scalars").add_(messages * scalars_per_message)
        getattr(self, f"{direction}_bytes").add_(messages * (scalars_per_message * bytes_per_scalar))

    def totals(self) -> dict[str, Tensor]:
        """Per-replicate totals: ``comm_messages``, ``comm_scalars``, ``comm_bytes`` and each per direction."""
        out: dict[str, Tensor] = {}
        for unit in ("messages", "scalars", "bytes"):
            total = sum(getattr(self, f"{d}_{unit}") for d in DIRECTIONS)
            out[f"comm_{unit}"] = total
            for d in DIRECTIONS:
                out[f"comm_{d}_{unit}"] = getattr(self, f"{d}_{unit}").clone()
        return out

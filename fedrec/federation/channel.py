"""The channel every federated message passes: it counts the message in the ledger and delivers it."""
from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from fedrec.federation.ledger import DIRECTIONS, CommLedger


class Channel(nn.Module):
    """Delivers batched messages between clients and server and records them in a :class:`CommLedger`.

    A message's size is its number of scalars. Subclasses may transform payloads in transit (noise,
    quantisation).
    """

    def __init__(self, replicates: int = 1, bytes_per_scalar: int = 8) -> None:
        super().__init__()
        self.ledger = CommLedger(replicates)
        self.bytes_per_scalar = int(bytes_per_scalar)

    def send(self, direction: str, owners: Tensor, payload: Any, scalars_per_message: int | Tensor) -> Any:
        """Send one message per row of ``payload``; ``owners`` names each message's replicate."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        self.ledger.record(direction, owners, scalars_per_message, self.bytes_per_scalar)
        return self.deliver(direction, payload)

    def deliver(self, direction: str, payload: Any) -> Any:
        """What arrives of ``payload`` (already counted); the identity here."""
        return payload

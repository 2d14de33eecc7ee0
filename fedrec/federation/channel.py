"""The channel every federated message passes: it counts messages in the ledger and delivers their payloads.

A message has a kind (:data:`~fedrec.federation.ledger.KINDS`), a sender and a receiver, each an endpoint
``(role, id)`` such as ``("client", 3)`` or ``("server", 0)``. What a receiver uses is what :meth:`Channel.send`
returns: subclasses that transform payloads in transit (noise, quantisation, loss) override :meth:`deliver`.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from fedrec.errors import check_choice
from fedrec.federation.ledger import KINDS, CommLedger

Endpoints = tuple[str, "Tensor | int"]


class Channel(nn.Module):
    """Delivers batched, addressed messages and records them in a :class:`CommLedger`.

    Args:
        replicates: independent runs batched together.
        endpoints: endpoint roles and their counts, e.g. ``{"client": N, "server": 1}``.
        bytes_per_scalar: size of one number on the wire (8 for float64).
    """

    def __init__(self, replicates: int = 1, endpoints: Mapping[str, int] | None = None,
                 bytes_per_scalar: int = 8) -> None:
        super().__init__()
        self.ledger = CommLedger(replicates, endpoints)
        self.bytes_per_scalar = int(bytes_per_scalar)

    @property
    def transparent(self) -> bool:
        """True when payloads arrive unchanged, so a compiled protocol may deliver them itself and count them in
        bulk; a subclass that overrides :meth:`deliver` makes every message pass through Python."""
        return type(self).deliver is Channel.deliver

    def send(
        self, kind: str, sender: Endpoints, receiver: Endpoints, payload: Any, scalars: int | Tensor,
        replicates: Tensor | int = 0,
    ) -> Any:
        """Send a batch of messages and return what arrives.

        ``sender`` and ``receiver`` are ``(role, ids)`` with one id per message (or one id for all);
        ``replicates`` names each message's replicate run; ``scalars`` is each message's size. The number of
        messages is the longest of the id and replicate tensors.
        """
        check_choice("message kind", kind, KINDS)
        parts = [torch.as_tensor(v, dtype=torch.long).reshape(-1)
                 for v in (sender[1], receiver[1], replicates, scalars)]
        m = max(p.numel() for p in parts)
        if m and any(p.numel() not in (1, m) for p in parts):
            raise ValueError(f"{kind} messages: sender, receiver, replicate and size counts disagree "
                             f"({[p.numel() for p in parts]})")
        s_ids, r_ids, reps, sizes = (p.expand(m) for p in parts)
        self.ledger.record(kind, (sender[0], s_ids), (receiver[0], r_ids), reps, sizes, self.bytes_per_scalar)
        return self.deliver(kind, payload, (sender[0], s_ids), (receiver[0], r_ids))

    def deliver(self, kind: str, payload: Any, sender: tuple[str, Tensor], receiver: tuple[str, Tensor]) -> Any:
        """What arrives of ``payload`` (already counted), one message per id in ``sender``/``receiver``: the
        identity here."""
        return payload

"""Communication accounting per replicate run, per message kind and per endpoint, in three units.

Papers count communication differently (the Async-LinUCB paper counts messages, its sibling code scalars), so
messages, scalars and bytes are all kept. Every endpoint role (clients, the server, local servers, parties) has
a traffic array ``(replicates, endpoints, kinds, sides, units)``: what each endpoint sent and received. Every
message has exactly one sender, so the totals are the sums of the sent side over all roles.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

KINDS = ("upload", "download", "peer")
SIDES = ("sent", "received")
UNITS = ("messages", "scalars", "bytes")
#: the indices of the kinds, sides and units in a traffic array (what compiled writers index by)
UPLOAD, DOWNLOAD, PEER = (KINDS.index(k) for k in ("upload", "download", "peer"))
SENT, RECEIVED = (SIDES.index(s) for s in ("sent", "received"))
MESSAGES, SCALARS, BYTES = (UNITS.index(u) for u in ("messages", "scalars", "bytes"))


class CommLedger(nn.Module):
    """Counts the messages that pass a :class:`~fedrec.federation.channel.Channel`.

    Args:
        replicates: independent runs batched together (counts are kept per replicate).
        endpoints: endpoint roles and how many endpoints each has, e.g. ``{"client": N, "server": 1}``.
    """

    def __init__(self, replicates: int = 1, endpoints: Mapping[str, int] | None = None) -> None:
        super().__init__()
        self.replicates = int(replicates)
        self.roles = dict(endpoints or {"client": 1, "server": 1})
        for role, n in self.roles.items():
            shape = (self.replicates, int(n), len(KINDS), len(SIDES), len(UNITS))
            self.register_buffer(f"traffic_{role}", torch.zeros(shape, dtype=torch.long))

    @property
    def device(self) -> torch.device:
        """Where the counts live (they move with the module, e.g. a protocol put on the trainer's GPU)."""
        return self.traffic(next(iter(self.roles))).device

    def traffic(self, role: str) -> Tensor:
        """The ``(replicates, endpoints, kinds, sides, units)`` counts of ``role`` (a view, updated in place)."""
        if role not in self.roles:
            raise ValueError(f"unknown endpoint role {role!r}; this ledger has {sorted(self.roles)}")
        return getattr(self, f"traffic_{role}")

    def record(
        self, kind: str, sender: tuple[str, Tensor], receiver: tuple[str, Tensor], replicates: Tensor,
        scalars: Tensor, bytes_per_scalar: int,
    ) -> None:
        """Count one message per entry of ``replicates``; ``sender``/``receiver`` are (role, ids) and ``scalars``
        the size of each message (all broadcast to the number of messages)."""
        k, device = KINDS.index(kind), self.device  # ids and sizes may come from another device
        replicates, s = replicates.to(device), scalars.to(device, torch.long)
        units = torch.stack([torch.ones_like(s), s, s * bytes_per_scalar], -1)  # MESSAGES, SCALARS, BYTES
        for side, (role, ids) in ((SENT, sender), (RECEIVED, receiver)):
            t = self.traffic(role)
            n = t.shape[1]
            flat = (replicates * n + ids.to(device)) * (len(KINDS) * len(SIDES)) + k * len(SIDES) + side
            t.view(-1, len(UNITS)).index_add_(0, flat, units)

    def totals(self) -> dict[str, Tensor]:
        """Per-replicate totals: ``comm_messages``, ``comm_scalars``, ``comm_bytes`` and each per kind."""
        sent = sum(self.traffic(role)[:, :, :, SENT].sum(1) for role in self.roles)  # (R, kinds, units)
        out: dict[str, Tensor] = {}
        for u, unit in enumerate(UNITS):
            out[f"comm_{unit}"] = sent[:, :, u].sum(1)
            for k, kind in enumerate(KINDS):
                out[f"comm_{kind}_{unit}"] = sent[:, k, u].clone()
        return out

    def per_endpoint(self, role: str, kind: str | None = None, unit: str = "messages", side: str = "sent") -> Tensor:
        """``(replicates, endpoints)`` counts of what each endpoint of ``role`` sent (or received), in ``unit``,
        of one message ``kind`` or of all kinds."""
        t = self.traffic(role)[:, :, :, SIDES.index(side), UNITS.index(unit)]
        return t.sum(-1) if kind is None else t[:, :, KINDS.index(kind)].clone()

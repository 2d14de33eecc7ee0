"""The compiled ledger writer: how a kernel counts a message into the ledger's traffic arrays.

The arrays are :class:`~fedrec.federation.ledger.CommLedger`'s, ``(R, endpoints, kinds, sides, units)``, indexed
by its named kinds, sides and units; this is the compiled twin of :meth:`CommLedger.record` for one message.
"""
from __future__ import annotations

import numpy as np

from fedrec.federation.ledger import BYTES, MESSAGES, RECEIVED, SCALARS, SENT
from fedrec.utils.jit import jit


@jit
def tally(traffic: np.ndarray, r: int, endpoint: int, kind: int, side: int, scalars: int, itemsize: int) -> None:
    """One message of ``kind`` on ``side`` of ``endpoint`` in replicate ``r``: ``scalars`` scalars of ``itemsize``
    bytes each."""
    traffic[r, endpoint, kind, side, MESSAGES] += 1
    traffic[r, endpoint, kind, side, SCALARS] += scalars
    traffic[r, endpoint, kind, side, BYTES] += scalars * itemsize


@jit
def record(sent: np.ndarray, sender: int, received: np.ndarray, receiver: int, r: int, kind: int, scalars: int,
           itemsize: int) -> None:
    """Count one message of ``kind`` from endpoint ``sender`` (of the traffic array ``sent``) to ``receiver`` (of
    ``received``) in replicate ``r``: ``scalars`` scalars of ``itemsize`` bytes each (the payload dtype's size)."""
    tally(sent, r, sender, kind, SENT, scalars, itemsize)
    tally(received, r, receiver, kind, RECEIVED, scalars, itemsize)

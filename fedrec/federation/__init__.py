"""Plumbing every protocol and task shares: the addressed channel and its ledger, the processes of a run, and
topologies (protocols themselves are in :mod:`fedrec.protocols`, the round of federated recommendation in
:mod:`fedrec.recsys`).

The channel and ledger load with the package; the other names load on first use (topologies need networkx).
``Aggregator``, ``FedSGD``, ``FedAvg``, ``Uploads`` and ``AggregateSums`` moved to :mod:`fedrec.recsys`; importing
them from here still works in the 0.x series (see docs/stability.md) but warns.
"""
from __future__ import annotations

import warnings
from typing import Any

from fedrec._exports import lazy_exports
from fedrec.federation.channel import Channel
from fedrec.federation.ledger import CommLedger

_LAZY, _lazy_getattr = lazy_exports(__name__, {
    "Collective": "collective",
    "Topology": "topology",
    "make_topology": "topology",
})
#: public names that moved to :mod:`fedrec.recsys`, still importable from here (not in ``__all__``)
MOVED_TO_RECSYS = ("AggregateSums", "Aggregator", "FedAvg", "FedSGD", "Uploads")
__all__ = sorted(["Channel", "CommLedger", *_LAZY])


def __getattr__(name: str) -> Any:
    if name in MOVED_TO_RECSYS:
        warnings.warn(f"fedrec.federation.{name} moved to fedrec.recsys.{name}", DeprecationWarning, stacklevel=2)
        from fedrec import recsys

        return getattr(recsys, name)
    return _lazy_getattr(name)

"""Plumbing every protocol and task shares: the addressed channel and its ledger, the processes of a run, and
topologies (protocols themselves are in :mod:`fedrec.protocols`, the round of federated recommendation in
:mod:`fedrec.recsys`).

The channel and ledger load with the package; the other names load on first use (topologies need networkx).
"""
from __future__ import annotations

from fedrec.federation.channel import Channel
from fedrec.federation.ledger import CommLedger
from fedrec.utils.exports import lazy_exports

_LAZY, __getattr__ = lazy_exports(__name__, {
    "Collective": "collective",
    "Topology": "topology",
    "make_topology": "topology",
})
__all__ = ["Channel", "CommLedger"]  # a literal list: linters then see the two eager names as exported
__all__ += sorted(_LAZY)

"""Federated recommendation: the round of :class:`fedrec.tasks.FedRecTask`, one module per concern (BGTplanner's
Fig. 1, steps ①–⑤).

* ``data.py``: a round's training ratings, flat and grouped by client (``RoundData``);
* ``local.py``: the clients' losses and local updates, all clients in one backward pass;
* ``upload.py``: upload assembly: pseudo items, the item ids X^t, synthesised pseudo rows, the upload order;
* ``aggregate.py``: how the server combines the uploads (``Uploads``, ``Aggregator``, ``FedSGD``, ``FedAvg``).

The aggregators load on first use. The modules use :mod:`fedrec.models`; :mod:`fedrec.tasks` sequences them.
"""
from __future__ import annotations

from fedrec._exports import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "AggregateSums": "aggregate",
    "Aggregator": "aggregate",
    "FedAvg": "aggregate",
    "FedSGD": "aggregate",
    "Uploads": "aggregate",
})

"""Federated recommendation: the round of :class:`fedrec.tasks.FedRecTask`, one module per concern (BGTplanner's
Fig. 1, steps ①–⑤).

* ``data.py``: a round's training ratings, flat and grouped by client (``RoundData``), and its shards;
* ``local.py``: the clients' losses and local updates, all clients in one backward pass;
* ``upload.py``: upload assembly: pseudo items, the item ids X^t, synthesised pseudo rows, the upload order;
* ``privatize.py``: the round's budget and draw keys, clipping and noising of the uploads, the accounting;
* ``aggregate.py``: how the server combines the uploads (``Uploads``, ``Aggregator``, ``FedSGD``, ``FedAvg``);
* ``server.py``: the server optimiser's step on ω and the item table, and the clients' step on their user rows;
* ``evaluate.py``: test and validation metrics of the current model.

The aggregators load on first use. The modules use :mod:`fedrec.models`, :mod:`fedrec.federation` (channel,
collective) and :mod:`fedrec.privacy` (``ClientDP``); :mod:`fedrec.tasks` sequences them.
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

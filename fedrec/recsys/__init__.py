"""Federated recommendation: the round of :class:`fedrec.tasks.FedRecTask`, one module per concern (BGTplanner's
Fig. 1, steps ①–⑤).

* ``data.py``: a round's training ratings, flat and grouped by client (``RoundData``), and its shards;
* ``objectives.py``: the clients' losses: RMSE of ratings, BPR or pointwise BCE of implicit feedback;
* ``local.py``: the clients' local updates, all clients in one backward pass;
* ``upload.py``: upload assembly: pseudo items, the item ids X^t, synthesised pseudo rows, the upload order;
* ``strategy.py``: the round's strategy (``Strategy``): participation (all, fixed, Poisson), simulated dropouts and
  stragglers, the clients' local work, and the server's side: admission by the privacy budget, client-placed
  noise, the bad-update policy, aggregation or server-placed noise, the optimiser steps, the accounting;
* ``expansion.py``: FedGNN's graph expansion through a third-party server (``task.expansion``);
* ``side_graphs.py``: the data's user and item graphs as graph regularisation (``task.side_graphs``);
* ``privatize.py``: the round's budget and draw keys, clipping and noising of the uploads, the accounting;
* ``attack.py``: malicious clients that poison their uploads (``ScaledUpdates``, ``GaussianNoise``,
  ``ItemPromotion``);
* ``aggregate.py``: how the server combines the uploads (``Uploads``, ``Aggregator``, ``FedSGD``, ``FedAvg``, and
  the robust rules ``CoordinateMedian``, ``TrimmedMean``, ``Krum``, ``MultiKrum``, ``NormBound``);
* ``server.py``: the server optimiser's step on ω and the item table (``task.optimizer``, or a server optimiser of
  :mod:`fedrec.aggregation`), and the clients' step on their user rows;
* ``evaluate.py``: test and validation metrics of the current model: rating metrics, ranking metrics
  (``RankingEval``), under an attack the benign users' and the target item's exposure;
* ``canaries.py``: canary clients inside one private run and its one-run audit (``CanaryClients``,
  ``audit_one_run``);
* ``ranking.py``: top-K ranking metrics (HR@K, NDCG@K, Recall@K, MRR) of a score matrix, full or against sampled
  negatives, and the ``topk.npz`` lists (``UserItems``: each user's training or held-out items).

The aggregators load on first use. The modules use :mod:`fedrec.models`, :mod:`fedrec.federation` (channel,
collective), :mod:`fedrec.privacy` (``ClientDP``, and :mod:`fedrec.privacy.central` for server-placed noise) and
:mod:`fedrec.aggregation` (the rules and server optimisers on plain tensors); :mod:`fedrec.tasks` sequences them.
"""
from __future__ import annotations

from fedrec.utils.exports import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "AggregateSums": "aggregate",
    "Aggregator": "aggregate",
    "ALittleIsEnough": "attack",
    "Attack": "attack",
    "Bulyan": "aggregate",
    "CenteredClipping": "aggregate",
    "CoordinateMedian": "aggregate",
    "FedAvg": "aggregate",
    "FedSGD": "aggregate",
    "GaussianNoise": "attack",
    "GeometricMedian": "aggregate",
    "ItemPromotion": "attack",
    "Krum": "aggregate",
    "MinMax": "attack",
    "MultiKrum": "aggregate",
    "NormBound": "aggregate",
    "RobustAggregator": "aggregate",
    "ScaledUpdates": "attack",
    "Strategy": "strategy",
    "TrimmedMean": "aggregate",
    "UserItems": "ranking",
    "Uploads": "aggregate",
})

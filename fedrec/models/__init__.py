"""Federated recommendation models: FedGNN (graph attention over local star graphs), an MF baseline, NeuMF (GMF +
MLP), LightGCN (light graph convolution over local star graphs; the whole-graph form for one party) and the base of
models written with ordinary layers (:class:`PlainRecommender`).

The models load on first use: LightGCN's module imports torch_geometric, which runs without it need not load.
"""
from __future__ import annotations

from fedrec.utils.exports import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "CentralLightGCN": "lightgcn",
    "FedGNN": "fedgnn",
    "FederatedRecommender": "recommender",
    "LightGCN": "lightgcn",
    "MatrixFactorization": "recommender",
    "NeuMF": "neumf",
    "PlainRecommender": "plain",
    "StarGAT": "fedgnn",
})

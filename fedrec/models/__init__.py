"""Federated recommendation models: FedGNN (graph attention over local star graphs), an MF baseline and NeuMF
(GMF + MLP). The models load on first use."""
from __future__ import annotations

from fedrec._exports import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "FedGNN": "fedgnn",
    "FederatedRecommender": "recommender",
    "MatrixFactorization": "recommender",
    "NeuMF": "neumf",
    "StarGAT": "fedgnn",
})

"""Federated recommenders (FedGNN)."""
from fedrec.models.fedgnn import FedGNN, StarGAT, per_client_gradients

__all__ = ["FedGNN", "StarGAT", "per_client_gradients"]

"""Federated recommendation models: FedGNN (graph attention over local star graphs) and an MF baseline."""
from fedrec.models.fedgnn import FedGNN, StarGAT
from fedrec.models.recommender import FederatedRecommender, MatrixFactorization

__all__ = ["FedGNN", "FederatedRecommender", "MatrixFactorization", "StarGAT"]

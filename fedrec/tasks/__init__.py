"""Tasks: what one round of a federated run does (the LightningModule analogue)."""
from fedrec.tasks.bandit import BanditTask
from fedrec.tasks.base import FederatedTask
from fedrec.tasks.recommendation import FedRecTask

__all__ = ["BanditTask", "FedRecTask", "FederatedTask"]

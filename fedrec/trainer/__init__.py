"""Trainer core: the federated loop, callbacks, checkpoints."""
from fedrec.trainer.callbacks import Callback, ProgressBar
from fedrec.trainer.trainer import FederatedTrainer, torch_threads

__all__ = ["Callback", "FederatedTrainer", "ProgressBar", "torch_threads"]

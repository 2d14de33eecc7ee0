"""Trainer core: the federated loop, callbacks, checkpoints."""
from fedrec.threads import torch_threads
from fedrec.trainer.callbacks import Callback, ProgressBar
from fedrec.trainer.trainer import FederatedTrainer

__all__ = ["Callback", "FederatedTrainer", "ProgressBar", "torch_threads"]

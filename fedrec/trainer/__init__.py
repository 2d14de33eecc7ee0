"""Trainer core: the federated loop, callbacks, checkpoints, interrupts that save."""
from fedrec.trainer.callbacks import Callback, EarlyStopping, ProgressBar, RunningTask, RunningTrainer
from fedrec.trainer.interrupt import RunInterrupted
from fedrec.trainer.trainer import FederatedTrainer
from fedrec.utils.threads import torch_threads

__all__ = ["Callback", "EarlyStopping", "FederatedTrainer", "ProgressBar", "RunInterrupted", "RunningTask",
           "RunningTrainer", "torch_threads"]

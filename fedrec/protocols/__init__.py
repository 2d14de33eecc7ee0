"""Federated bandit protocols: step-wise ``nn.Module``s over batched clients and replicates, state in buffers."""
from fedrec.protocols.async_linucb import AsyncLinUCB
from fedrec.protocols.async_linucb_am import AsyncLinUCBAM
from fedrec.protocols.base import StepProtocol, paper_linucb
from fedrec.protocols.centralized import CentralizedLinUCB
from fedrec.protocols.sync_linucb import SyncLinUCB

__all__ = ["AsyncLinUCB", "AsyncLinUCBAM", "CentralizedLinUCB", "StepProtocol", "SyncLinUCB", "paper_linucb"]

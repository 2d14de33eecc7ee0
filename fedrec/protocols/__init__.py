"""Federated bandit protocols: step-wise ``nn.Module``s over batched clients and replicates, state in buffers."""
from fedrec.protocols.async_linucb import AsyncLinUCB
from fedrec.protocols.async_linucb_am import AsyncLinUCBAM
from fedrec.protocols.base import MultiAgentProtocol, ProtocolModule, StepProtocol, paper_linucb
from fedrec.protocols.centralized import CentralizedLinUCB
from fedrec.protocols.club import LocalClustering
from fedrec.protocols.fclub import FederatedClustering
from fedrec.protocols.gossip import CentralUCB, FedUCB, GossipBandit, GossipUCB, LocalUCB
from fedrec.protocols.sync_linucb import SyncLinUCB
from fedrec.protocols.triggered import TriggeredLinUCB
from fedrec.protocols.vertical import VerticalLinearBandit

__all__ = [
    "AsyncLinUCB", "AsyncLinUCBAM", "CentralUCB", "CentralizedLinUCB", "FedUCB", "FederatedClustering", "GossipBandit",
    "GossipUCB", "LocalClustering", "LocalUCB", "MultiAgentProtocol", "ProtocolModule", "StepProtocol", "SyncLinUCB",
    "TriggeredLinUCB",
    "VerticalLinearBandit",
    "paper_linucb",
]

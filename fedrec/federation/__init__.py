"""Federation layer: channel and communication ledger, and the federated bandit protocols."""
from fedrec.federation.async_linucb import AsyncLinUCB
from fedrec.federation.async_linucb_am import AsyncLinUCBAM
from fedrec.federation.channel import Channel
from fedrec.federation.ledger import CommLedger
from fedrec.federation.protocol import BanditProtocol, CentralizedLinUCB
from fedrec.federation.sync_linucb import SyncLinUCB

__all__ = [
    "AsyncLinUCB", "AsyncLinUCBAM", "BanditProtocol", "CentralizedLinUCB", "Channel", "CommLedger", "SyncLinUCB",
]

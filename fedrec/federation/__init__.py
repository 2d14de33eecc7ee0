"""Plumbing every protocol and task shares: the addressed channel and its ledger, topologies, aggregators and
the clients' local updates of federated learning (protocols themselves are in :mod:`fedrec.protocols`)."""
from fedrec.federation.channel import Channel
from fedrec.federation.ledger import CommLedger

__all__ = ["Channel", "CommLedger"]

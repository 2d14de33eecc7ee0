"""Tasks (the LightningModule analogue): what one round of a federated task does.

Names load on first use, so ``import fedrec.trainer`` (which needs only the base class) does not pull in the
recommendation task's dependencies.
"""
from __future__ import annotations

from fedrec.utils.exports import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "BanditTask": "bandit", "FederatedTask": "base", "FedRecTask": "recommendation", "MultiAgentTask": "multi_agent",
})

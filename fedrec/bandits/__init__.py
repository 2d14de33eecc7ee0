"""Bandit policies as torch modules (no Lightning, PyG or Opacus imported here)."""
from fedrec.bandits.linear import LinearBandit, LinTS, LinUCB, confidence_radius

__all__ = ["LinTS", "LinUCB", "LinearBandit", "confidence_radius"]

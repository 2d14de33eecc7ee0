"""Bandit environments: synthetic linear worlds, streams built from real interaction logs, and multi-agent
multi-armed bandits (synthetic :mod:`fedrec.envs.mab`, UCI diabetes :mod:`fedrec.envs.diabetes`).

Names load on first use, so ``import fedrec.envs`` does not pull in pandas or scikit-learn.
"""
from __future__ import annotations

from fedrec.utils.exports import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "BanditEnv": "base",
    "Chunk": "base",
    "ClusteredLinearEnv": "clustered",
    "CriteoReplayEnv": "criteo",
    "DiabetesMAB": "diabetes",
    "Interactions": "base",
    "LastFMEnv": "realdata",
    "LinearEnv": "synthetic",
    "MovieLensEnv": "realdata",
    "MovieLensReplayEnv": "replay",
    "MultiAgentMAB": "mab",
    "ReplayEnv": "replay",
})

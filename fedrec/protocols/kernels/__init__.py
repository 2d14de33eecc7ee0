"""Compiled step kernels of the bandit protocols (numba, float64, in place on the protocols' buffers).

Shared pieces are written once: :mod:`.linalg` (Cholesky with log-det, row refactorisation) and :mod:`.linear`
(the LinUCB / LinTS local step); each protocol family has its step loop in a module of its own.
"""
from pathlib import Path

import fedrec.bandits.linear
import fedrec.envs.rewards
import fedrec.jit
import fedrec.privacy.tree_noise
import fedrec.rng

fedrec.jit.drop_stale_caches(
    [*Path(__file__).parent.glob("*.py"), Path(fedrec.rng.__file__), Path(fedrec.jit.__file__),
     Path(fedrec.bandits.linear.__file__), Path(fedrec.privacy.tree_noise.__file__), Path(fedrec.envs.rewards.__file__)]
)

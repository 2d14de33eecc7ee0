"""Compiled step kernels of the bandit protocols (numba, float64, in place on the protocols' buffers).

Shared pieces are written once: :mod:`.linalg` (Cholesky with log-det, row refactorisation), :mod:`.linear`
(the LinUCB / LinTS local step) and :mod:`.ledger` (counting a message); each protocol family has its step loop in a
module of its own, run over replicates by :func:`fedrec.utils.jit.over_replicates`.
"""
from pathlib import Path

import fedrec.bandits.linear
import fedrec.envs.rewards
import fedrec.federation.ledger
import fedrec.privacy.tree_noise
import fedrec.utils.jit
import fedrec.utils.rng

fedrec.utils.jit.drop_stale_caches(
    [*Path(__file__).parent.glob("*.py"), Path(fedrec.utils.rng.__file__), Path(fedrec.utils.jit.__file__),
     Path(fedrec.bandits.linear.__file__), Path(fedrec.privacy.tree_noise.__file__), Path(fedrec.envs.rewards.__file__),
     Path(fedrec.federation.ledger.__file__)]
)

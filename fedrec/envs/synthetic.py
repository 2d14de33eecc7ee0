"""Synthetic linear environments of the Async-LinUCB paper (§4, and the authors' code).

Homogeneous: one unit-norm θ shared by all clients. Heterogeneous: θ_i = [θ^(g); θ^(i)] with the global and
the client parts each unit-norm. Arm sets: K vectors drawn per step from a fixed pool (authors' code) or fresh
from the unit ball / sphere (the paper's "uniformly sampled from a ℓ2 ball"). Clients arrive uniformly or by
a Zipf law over a random ranking of the clients (the paper's unspecified "non-uniform distribution").
"""
from __future__ import annotations

import numpy as np

from fedrec.envs.base import BanditEnv, Chunk
from fedrec.errors import ConfigError, check_choice, check_float, check_int
from fedrec.utils.seeding import numpy_generator


def unit_rows(a: np.ndarray) -> np.ndarray:
    """Scale every row of ``a`` to unit ℓ2 norm."""
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


class LinearEnv(BanditEnv):
    """Linear rewards f_i(x) = θ_iᵀx plus Gaussian noise.

    Args:
        num_clients, dim, num_arms: N, d, K.
        global_dim: None for homogeneous clients; d_g < d for heterogeneous ones (θ^(g) on the first d_g
            coordinates, a client-specific θ^(i) on the other d − d_g).
        contexts: ``pool`` (K of ``pool_size`` fixed articles without replacement, coordinate k ~ N(0, (d−k)/d)
            then unit norm, as the authors' code), ``ball`` (uniform in the unit ball) or ``sphere``.
        noise_std: σ of the Gaussian reward noise (with ``noise="variance"``: σ², a reading of the vertical
            federated bandit paper's "N(0, 0.05)" as a variance; its other reading, a std, is the default).
        arrival: ``uniform`` or ``zipf`` (P(client of rank k) ∝ k^−zipf_exponent, ranks randomly permuted).
    """

    name = "linear"

    def __init__(
        self,
        num_clients: int = 1000,
        dim: int = 25,
        num_arms: int = 25,
        replicates: int = 1,
        seed: int = 0,
        global_dim: int | None = None,
        contexts: str = "pool",
        pool_size: int = 1000,
        noise_std: float = 0.1,
        arrival: str = "uniform",
        zipf_exponent: float = 1.0,
        chunk_size: int = 1000,
        noise: str = "std",
    ) -> None:
        super().__init__(num_clients, dim, num_arms, replicates, seed, chunk_size)
        check_choice("contexts", contexts, ("pool", "ball", "sphere"))
        check_choice("arrival", arrival, ("uniform", "zipf"))
        self.global_dim = None if global_dim is None else check_int("global_dim", global_dim)
        if self.global_dim is not None and self.global_dim >= self.dim:
            raise ConfigError(f"global_dim must be < dim ({self.dim}) for heterogeneous clients, got {global_dim}")
        self.contexts = contexts
        self.pool_size = check_int("pool_size", pool_size)
        if contexts == "pool" and self.pool_size < self.num_arms:
            raise ConfigError(f"pool_size ({pool_size}) must be >= num_arms ({num_arms})")
        check_choice("noise (how noise_std is read)", noise, ("std", "variance"))
        level = check_float("noise_std", noise_std, low=0.0)
        self.noise_std = level if noise == "std" else float(np.sqrt(level))
        self.arrival = arrival
        self.zipf_exponent = check_float("zipf_exponent", zipf_exponent, low=0.0)
        self._worlds = [self._world(r) for r in range(self.replicates)]

    def _world(self, replicate: int) -> dict[str, np.ndarray | None]:
        """θ of every client, the article pool and the arrival law of one replicate (homogeneous clients share one
        θ and uniform arrivals need no weights: neither is stored per client, which a million clients would feel)."""
        rng = numpy_generator(self.seed, "linear-world", replicate)
        d, N = self.dim, self.num_clients
        if self.global_dim is None:
            theta = np.broadcast_to(unit_rows(rng.standard_normal(d)), (N, d))
        else:
            dg = self.global_dim
            theta_g = unit_rows(rng.standard_normal(dg))
            theta_l = unit_rows(rng.standard_normal((N, d - dg)))
            theta = np.concatenate([np.broadcast_to(theta_g, (N, dg)), theta_l], axis=1)
        pool = None
        if self.contexts == "pool":
            scale = np.sqrt((d - np.arange(d)) / d)
            pool = unit_rows(rng.standard_normal((self.pool_size, d)) * scale)
        weights = None
        if self.arrival == "zipf":
            w = (1.0 + np.arange(N)) ** -self.zipf_exponent
            weights = (w / w.sum())[rng.permutation(N)]
        return {"theta": theta, "pool": pool, "weights": weights}

    def chunk(self, replicate: int, index: int) -> Chunk:
        rng = numpy_generator(self.seed, "linear-stream", replicate, index)
        world = self._worlds[replicate]
        S, K, d, N = self.chunk_size, self.num_arms, self.dim, self.num_clients
        if self.arrival == "uniform":
            clients = rng.integers(0, N, size=S)
        else:
            clients = rng.choice(N, size=S, p=world["weights"])
        if self.contexts == "pool":
            picks = np.argpartition(rng.random((S, self.pool_size)), K - 1, axis=1)[:, :K]
            contexts = world["pool"][picks]
        else:
            contexts = unit_rows(rng.standard_normal((S, K, d)))
            if self.contexts == "ball":
                contexts = contexts * rng.random((S, K, 1)) ** (1.0 / d)
        expected = np.einsum("skd,sd->sk", contexts, world["theta"][clients])
        noise = rng.normal(0.0, self.noise_std, size=S)
        return Chunk(clients, contexts, expected, noise)

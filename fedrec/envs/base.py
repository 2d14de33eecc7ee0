"""Bandit environments: a deterministic stream of (active client, arm contexts, rewards) per replicate."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrec.errors import check_int


@dataclass
class Interactions:
    """Steps [start, stop) of every replicate's stream.

    ``rewards = expected + noise``: the noise of a step is either shared by all its arms (shape (R, S)) or drawn
    per arm (shape (R, S, K), e.g. a Bernoulli reward for every arm); either way the regret
    ``max(expected) - expected[arm]`` is the pseudo-regret of the papers.
    """

    clients: Tensor  # (R, S) long: active client of each step
    contexts: Tensor  # (R, S, K, d) float64: the arm set A_t
    expected: Tensor  # (R, S, K) float64: expected reward of each arm for the active client
    noise: Tensor  # (R, S) float64: reward noise shared by the step's arms, or (R, S, K): per arm
    logged: Tensor | None = None  # (R, S) long: the arm the log played (replay streams only, see envs.replay)

    @property
    def rewards(self) -> Tensor:
        shared = self.noise.dim() < self.expected.dim()
        return self.expected + (self.noise.unsqueeze(-1) if shared else self.noise)


@dataclass
class Chunk:
    """One replicate's steps of one chunk, as numpy arrays (see :class:`Interactions`)."""

    clients: np.ndarray  # (S,)
    contexts: np.ndarray  # (S, K, d)
    expected: np.ndarray  # (S, K)
    noise: np.ndarray  # (S,) shared by the step's arms, or (S, K) per arm
    logged: np.ndarray | None = None  # (S,) replay streams only


class BanditEnv(ABC):
    """Base class: subclasses generate chunk ``c`` of replicate ``r`` from a generator derived from (seed, r, c).

    Chunks are pure functions of their indices, so any window of the stream can be regenerated after a
    resume without stored generator state.
    """

    name = "env"
    #: the task kind it serves (:attr:`fedrec.tasks.FederatedTask.kind`); the builder refuses another
    kind = "bandit"
    #: number of steps available (None: unbounded)
    horizon: int | None = None
    #: rewards are 0/1 click logs: report reward normalised by a uniformly random policy
    binary_rewards: bool = False
    #: a logged stream evaluated by replay (Li et al. 2010): chunks carry the logged arm, and only steps where
    #: the policy picks it count and update the policy
    replay: bool = False
    #: the downloadable dataset the environment reads, a name of :data:`fedrec.data.download.REGISTRY` (a run with
    #: ``download_data=true`` installs it when missing); None: it reads none, or which one depends on its arguments
    dataset: str | None = None

    def __init__(
        self, num_clients: int, dim: int, num_arms: int, replicates: int = 1, seed: int = 0, chunk_size: int = 1000
    ) -> None:
        self.num_clients = check_int("num_clients", num_clients)
        self.dim = check_int("dim", dim)
        self.num_arms = check_int("num_arms", num_arms)
        self.replicates = check_int("replicates", replicates)
        self.seed = int(seed)
        self.chunk_size = check_int("chunk_size", chunk_size)
        self._cache: dict[tuple[int, int], Chunk] = {}

    @classmethod
    def memory_estimate(cls, sizes: Mapping[str, Any]) -> int:
        """The bytes its cached chunks take for a run of ``sizes`` (``replicates``, ``chunk_size``, ``num_arms``,
        ``dim``), before any is drawn: per replicate two chunks of ``chunk_size`` steps of K contexts of d floats and
        the rewards, with the stacked copy a step window makes (three in all)."""
        steps, arms, d = sizes["chunk_size"], sizes["num_arms"], sizes["dim"]
        return sizes["replicates"] * 3 * steps * arms * (d + 2) * 8

    @abstractmethod
    def chunk(self, replicate: int, index: int) -> Chunk:
        ...

    def _cached_chunk(self, replicate: int, index: int) -> Chunk:
        key = (replicate, index)
        if key not in self._cache:
            if len(self._cache) >= 2 * self.replicates:
                self._cache.clear()
            self._cache[key] = self.chunk(replicate, index)
        return self._cache[key]

    def interactions(self, start: int, stop: int, replicates: range | None = None) -> Interactions:
        """The steps [start, stop) of every replicate (or of ``replicates``, the share of one process of a run
        sharded by replicates), stacked into tensors."""
        if self.horizon is not None and stop > self.horizon:
            raise ValueError(f"{self.name}: the stream has {self.horizon} steps, asked for steps up to {stop}")
        parts: list[list[Chunk]] = []
        for r in range(self.replicates) if replicates is None else replicates:
            pieces = []
            t = start
            while t < stop:
                c, off = divmod(t, self.chunk_size)
                end = min(stop - c * self.chunk_size, self.chunk_size)
                ch = self._cached_chunk(r, c)
                pieces.append(Chunk(ch.clients[off:end], ch.contexts[off:end], ch.expected[off:end], ch.noise[off:end],
                                    None if ch.logged is None else ch.logged[off:end]))
                t = c * self.chunk_size + end
            parts.append(pieces)

        def stack(field: str, dtype: torch.dtype) -> Tensor:
            per_rep = [np.concatenate([getattr(p, field) for p in pieces]) for pieces in parts]
            return torch.from_numpy(np.stack(per_rep)).to(dtype)

        return Interactions(
            clients=stack("clients", torch.long),
            contexts=stack("contexts", torch.float64),
            expected=stack("expected", torch.float64),
            noise=stack("noise", torch.float64),
            logged=stack("logged", torch.long) if self.replay else None,
        )

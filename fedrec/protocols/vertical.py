"""Vertical federated LinUCB / LinTS (Cao et al.: VFUCB, Algorithm 1; VFTS, Algorithm 2) and their baselines.

The active party (AP) runs an ordinary fedrec policy — LinUCB makes VFUCB, LinTS makes VFTS — on the masked
contexts x̃ = Σ_j Q^j x^j = Q x that the parties' shares add up to (Cao et al., Algorithms 1–2). Since Q is orthogonal
and fixed and the regulariser isotropic, Λ̃ = QΛQᵀ, θ̃ = Qθ̂ and every UCB score equals the central one (Theorem 4.1);
VFTS's scores are equal in law (Theorem A.1). The baselines (the paper's) are the same policy on all d columns in
the clear (``central``) or on a subset of the columns (``partial``: what the AP could do alone).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrec.bandits.linear import LinTS
from fedrec.errors import ConfigError, check_choice, check_float, check_int
from fedrec.federation.vertical import MASKS, Parties, check_partition, draw_mask, equal_partition
from fedrec.protocols.base import PolicyFactory
from fedrec.protocols.centralized import CentralizedLinUCB
from fedrec.utils.seeding import numpy_generator

MODES = ("vertical", "central", "partial")
PARTIAL_COLUMNS = ("random", "leading")


class VerticalLinearBandit(CentralizedLinUCB):
    """One policy per replicate at the AP, fed by every arriving user, in one of three ``mode``s.

    One user per step: the parties mask one round's K contexts at a time.

    Args:
        num_clients, dim, replicates, policy, seed, backend: as :class:`CentralizedLinUCB`; ``dim`` is the full
            context dimension d.
        mode: ``vertical`` (VFUCB / VFTS through the parties' masked shares), ``central`` (all d columns in the
            clear) or ``partial`` (a subset of the columns).
        partition: the parties' column blocks [d_1, …, d_M] (party 0 is the AP); None splits d equally among
            ``parties``.
        partial_ratio: the fraction of columns a ``partial`` run keeps (footnote 7: #data used / #data total).
        partial_columns: ``random`` (a subset drawn per replicate, as the paper's Criteo runs) or ``leading`` (the
            first columns: at ratio d_1/d exactly the AP's block).
        mask: ``o3m`` (orthogonal, the paper's) or ``gaussian`` (not orthogonal: a negative control).
        refresh_mask: draw a fresh mask every round (a negative control: Λ̃ then mixes coordinate systems).
        track_central: also run the central policy on the same stream, to report ‖θ‖ − ‖θ_central‖ (Fig. 4(b, d)).
    """

    max_agents_per_step = 1

    @classmethod
    def world(cls, env: Any) -> dict[str, Any]:
        """Sizes, and the parties' column blocks of a logged dataset that defines them (``env.partition``)."""
        partition = getattr(env, "partition", None)
        return {**super().world(env), **({} if partition is None else {"partition": list(partition)})}

    def __init__(
        self, num_clients: int, dim: int, replicates: int = 1, policy: PolicyFactory | None = None, seed: int = 0,
        mode: str = "vertical", partition: Sequence[int] | None = None, parties: int = 5,
        partial_ratio: float = 0.2, partial_columns: str = "random", mask: str = "o3m", refresh_mask: bool = False,
        track_central: bool = True, backend: str = "auto",
    ) -> None:
        check_choice("mode", mode, MODES)
        d = check_int("dim", dim)
        self.partition = check_partition(partition, d) if partition is not None else \
            equal_partition(d, check_int("parties", parties))
        self.partial_ratio = check_float("partial_ratio", partial_ratio, low=0.0, high=1.0, low_open=True)
        check_choice("partial_columns", partial_columns, PARTIAL_COLUMNS)
        check_choice("mask", mask, MASKS)
        kept = max(1, math.floor(self.partial_ratio * d + 0.5)) if mode == "partial" else d  # halves round up
        M = len(self.partition)
        super().__init__(num_clients, kept, replicates, policy, seed, backend,
                         endpoints={"party": M, "generator": 1})
        self.context_dim = d
        if isinstance(self.policy, LinTS) and self.policy.v <= 0:
            raise ConfigError(f"policy.v must be > 0 for Thompson sampling, got {self.policy.v}")
        self.mode, self.partial_columns, self.mask, self.refresh_mask = mode, partial_columns, mask, bool(refresh_mask)
        self.parties = Parties(self.partition, self.replicates)
        self.register_buffer("rounds", torch.zeros((), dtype=torch.long))
        self.register_buffer("columns", self._partial_columns(kept))
        if mode == "vertical":
            self._distribute_masks(0)
        self.central = None
        if track_central and mode != "central":
            self.central = CentralizedLinUCB(num_clients, d, replicates, policy, seed, backend)

    # ------------------------------------------------------------------------------------------ setup
    def get_extra_state(self) -> dict:
        return {"seed": self.seed}  # refresh_mask draws later masks from it: a resume must use the checkpoint's

    def set_extra_state(self, state: dict) -> None:
        self.seed = int(state["seed"])

    def _partial_columns(self, kept: int) -> Tensor:
        """The columns of every replicate's partial run, (R, kept), increasing."""
        d = self.context_dim
        if self.partial_columns == "leading" or kept == d:
            return torch.arange(kept).expand(self.replicates, kept).clone()
        picks = [np.sort(numpy_generator(self.seed, "vfl.partial", r).permutation(d)[:kept])
                 for r in range(self.replicates)]
        return torch.from_numpy(np.stack(picks))

    def _distribute_masks(self, draw: int) -> None:
        """The PMG draws every replicate's Q, sends party j its block Q^j (d × d_j, once per run) and forgets Q."""
        d, R = self.context_dim, self.replicates
        Q = torch.from_numpy(np.stack([draw_mask(d, self.seed, r, self.mask, draw) for r in range(R)]))
        reps = torch.arange(R)
        for j in range(self.parties.num_parties):
            block = self.channel.send("download", ("generator", 0), ("party", j), Q[:, :, self.parties.columns(j)],
                                      d * self.partition[j], reps)
            self.parties.block(j).copy_(block)

    # ------------------------------------------------------------------------------------------ steps
    def masked(self, contexts: Tensor) -> Tensor:
        """x̃ = Σ_j Q^j x^j of ``contexts`` (R, S, K, d) as the AP assembles it: its own share plus the K shares
        each passive party sends it per round (counted in the ledger: K·(M − 1) d-vectors per round)."""
        R, S, K, d = contexts.shape
        reps = torch.arange(R).repeat_interleave(S * K)
        total = self.parties.share(0, contexts)
        for j in range(1, self.parties.num_parties):
            total = total + self.channel.send("upload", ("party", j), ("party", 0), self.parties.share(j, contexts),
                                              d, reps)
        return total

    def _play(self, clients: Tensor, contexts: Tensor, rewards: Tensor, logged: Tensor | None) -> Tensor:
        """The AP's policy on its view of the contexts (masked, partial or clear); replay when ``logged``."""
        if self.central is not None:
            self.central._play(clients, contexts, rewards, logged)
        S = contexts.shape[1]
        if self.mode == "central":
            arms = super()._play(clients, contexts, rewards, logged)
        elif self.mode == "partial":
            cols = self.columns.to(contexts.device).view(self.replicates, 1, 1, -1)
            x = contexts.gather(-1, cols.expand(*contexts.shape[:-1], -1))
            arms = super()._play(clients, x.contiguous(), rewards, logged)
        elif not self.refresh_mask:
            arms = super()._play(clients, self.masked(contexts), rewards, logged)
        else:  # negative control: a fresh mask for every round
            parts = []
            for s in range(S):
                self._distribute_masks(int(self.rounds) + s + 1)
                parts.append(super()._play(clients[:, s:s + 1], self.masked(contexts[:, s:s + 1]),
                                           rewards[:, s:s + 1], None if logged is None else logged[:, s:s + 1]))
            arms = torch.cat(parts, 1)
        self.rounds += S
        return arms

    # ---------------------------------------------------------------------------------------- results
    def theta(self) -> Tensor:
        """The AP's estimate of every replicate (R, d'): θ̃ = Qθ̂ (vertical), θ̂ (central) or the partial one."""
        return self.policy.theta()

    def metrics(self) -> dict[str, Tensor]:
        """‖θ‖, its difference to the central run's (Fig. 4(b, d); ‖θ̃‖ = ‖θ̂‖ for VFCB) and per-party traffic."""
        norm = self.theta().norm(dim=-1)
        out: dict[str, Tensor] = {"theta_norm": norm}
        if self.central is not None:
            out["theta_norm_diff_central"] = norm - self.central.policy.theta().norm(dim=-1)
        elif self.mode == "central":
            out["theta_norm_diff_central"] = torch.zeros_like(norm)
        for j in range(self.parties.num_parties):
            for side in ("sent", "received"):
                out[f"comm_party{j}_{side}_scalars"] = self.ledger.per_endpoint("party", unit="scalars",
                                                                               side=side)[:, j]
        return out

    def extra_repr(self) -> str:
        return f"mode={self.mode}, partition={list(self.partition)}, dim={self.context_dim}"


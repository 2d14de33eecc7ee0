"""Server placement of client-level DP: DP-FedAvg's noised sum of clipped updates (McMahan et al., ICLR 2018).

Each participating client clips its whole upload (ω and every item row it sends, pseudo rows included) to L2
norm ``clip``; the server, a trusted aggregator or one that only sees the sum through secure aggregation, adds
the clipped uploads into one dense vector (ω and the whole item table, so the sum's support says nothing about
who sent which item) and adds **one** Gaussian draw of standard deviation ``z·Δ`` to it, with ``Δ = clip`` under
add/remove adjacency. The update is that noised sum divided by the round's *expected* number of clients (the
fixed-denominator estimator of McMahan et al.), so a client's presence changes the update by at most ``Δ`` over
it; under ``aggregator.reduce=sum`` it is the noised sum itself, in the units of the non-private summed update, so
that one ``task.weight_decay`` suits both the server's step and the clients' own user rows. Because every client
is in a round only with probability ``q``, the accountant composes Poisson-subsampled Gaussian rounds
(:class:`~fedrec.privacy.accountant.SampledGaussianAccountant`): amplification by sampling.

Adaptive clipping (Andrew, Thakkar, McMahan & Ramaswamy, NeurIPS 2021, Algorithm 1): each client also reports
``b_c − ½`` with ``b_c = 1[‖u_c‖ ≤ clip]``; the server noises that sum with ``N(0, σ_b²)``, estimates the fraction
of unclipped clients ``b̃`` and moves the clip geometrically, ``clip ← clip · exp(−η (b̃ − γ))`` towards the
``γ`` quantile of the update norms. The two noised sums together are one Gaussian mechanism of noise multiplier
``z``: the update's own is ``z_Δ = (z⁻² − (2σ_b)⁻²)^(−1/2)`` (their Theorem 1), so the accountant's ε is unchanged.

A noise schedule (``privacy.noise_schedule``, one factor ``g_t`` per round) sets round t's noise multiplier to
``z · g_t``, so a run can spend less of its budget on the early rounds, which only move the model towards where the
later ones average (the budget allocation of Lee & Kifer, KDD 2018); the accountant composes the rounds as they
were run, and the calibration finds the ``z`` whose scheduled rounds spend ε.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrec.errors import ConfigError, check_float
from fedrec.privacy.mechanisms import GaussianMechanism
from fedrec.utils.rng import KeyedRows


def check_schedule(schedule: Sequence[float]) -> tuple[float, ...]:
    """``privacy.noise_schedule`` as a tuple of the rounds' noise factors, each a number > 0."""
    if isinstance(schedule, (str, bytes)) or not isinstance(schedule, Sequence) or not len(schedule):
        raise ConfigError(f"privacy.noise_schedule must be a list of numbers > 0, one per round, got {schedule!r}")
    return tuple(check_float(f"privacy.noise_schedule[{t}]", g, low=0.0, low_open=True)
                 for t, g in enumerate(schedule))


@dataclass
class ClippedSums:
    """Sums of clipped uploads (float64), additive over disjoint sets of clients (a sharded run all-reduces
    them before the one noise draw)."""

    shared: Tensor  # (P,) Σ_c clip(u_c)'s ω part
    rows: Tensor  # (I, k) Σ_c clip(u_c)'s row of each item
    unclipped: Tensor  # (1,) Σ_c (1[‖u_c‖ ≤ clip] − ½), adaptive clipping's centred count

    @classmethod
    def zeros(cls, num_shared: int, num_items: int, dim: int, device: torch.device | str = "cpu") -> ClippedSums:
        """The sums of no uploads."""
        def z(*shape: int) -> Tensor:
            return torch.zeros(*shape, dtype=torch.float64, device=device)
        return cls(z(num_shared), z(num_items, dim), z(1))

    def tensors(self) -> list[Tensor]:
        """The fields, in order (what an all-reduce adds up in place)."""
        return [self.shared, self.rows, self.unclipped]


def clipped_sums(mechanism: GaussianMechanism, shared: Tensor, rows: Tensor, row_client: Tensor, row_item: Tensor,
                 num_items: int) -> ClippedSums:
    """Clip every client's whole upload (row ``c`` of ``shared`` and the ``rows`` it owns by ``row_client``) to the
    mechanism's clip with its certified clipping, and sum: ω over clients, each row into its item's slot."""
    C, device = shared.shape[0], rows.device
    row_client = row_client.to(device)
    norms = mechanism.client_norms([shared, rows], [None, row_client], C)
    shared, rows = mechanism.clip_parts([shared, rows], [None, row_client], C)
    return ClippedSums(
        shared=shared.double().sum(0),
        rows=torch.zeros(num_items, rows.shape[1], dtype=torch.float64, device=device).index_add(
            0, row_item.to(device), rows.double()),
        unclipped=((norms <= mechanism.clip).double() - 0.5).sum().reshape(1).to(device),
    )


class ServerNoise:
    """The one Gaussian draw on a round's clipped sums, and adaptive clipping (see the module docstring).

    Args:
        mechanism: the Gaussian mechanism whose ``clip`` and Δ the sums were clipped to (adaptive clipping moves
            its clip).
        noise_multiplier: z of the whole round (the update's and the count's noise together), > 0.
        adaptive: move the clip towards the ``target_quantile`` of the update norms (Andrew et al.).
        target_quantile: γ in (0, 1).
        clip_lr: η > 0, the geometric step of the clip.
        count_stddev: σ_b, the count's noise; None: the expected clients / 20 (Andrew et al.'s choice), at least z
            (the largest round's, under a schedule; so the update keeps z_Δ ≤ 1.16·z on small rounds).
        schedule: the rounds' factors ``g_t`` (round t's noise multiplier is ``z · g_t``, set by :meth:`at_round`);
            None: z every round.
    """

    def __init__(self, mechanism: GaussianMechanism, noise_multiplier: float, *, adaptive: bool = False,
                 target_quantile: float = 0.5, clip_lr: float = 0.2, count_stddev: float | None = None,
                 expected_clients: float = 1.0, schedule: Sequence[float] | None = None) -> None:
        self.mechanism = mechanism
        self.base_multiplier = check_float("privacy.noise_multiplier", noise_multiplier, low=0.0, low_open=True)
        self.schedule = None if schedule is None else check_schedule(schedule)
        self.noise_multiplier = self.base_multiplier  # the current round's z (:meth:`at_round`)
        if not isinstance(adaptive, bool):
            raise ConfigError(f"privacy.adaptive_clip must be true or false, got {adaptive!r}")
        self.adaptive = adaptive
        self.target_quantile = check_float("privacy.target_quantile", target_quantile, low=0.0, high=1.0,
                                           low_open=True, high_open=True)
        self.clip_lr = check_float("privacy.clip_lr", clip_lr, low=0.0, low_open=True)
        self.count_stddev = 0.0
        self.last_stddev = 0.0  # σ of the last draw on the update (:meth:`noised`), for steps that weigh by it
        if adaptive:
            largest = self.base_multiplier * max(self.schedule or (1.0,))  # the largest round's z
            self.count_stddev = max(expected_clients / 20.0, largest) if count_stddev is None else \
                check_float("privacy.count_stddev", count_stddev, low=0.0, low_open=True)
            if self.count_stddev <= largest / 2:
                raise ConfigError(f"privacy.count_stddev={self.count_stddev:.4g} leaves no noise for the update at "
                                  f"noise multiplier {largest:.4g}: it must exceed z/2 = {largest / 2:.4g} (more "
                                  f"clients per round, or set it larger)")
        self.update_multiplier = self._update_multiplier()

    def _update_multiplier(self) -> float:
        """z_Δ of the current round: z itself, or with adaptive clipping what the count's noise leaves of it."""
        z = self.noise_multiplier
        return (z ** -2 - (2.0 * self.count_stddev) ** -2) ** -0.5 if self.adaptive else z

    def at_round(self, round_idx: int) -> None:
        """Set round ``round_idx``'s noise multiplier, ``z · g_t`` under a schedule (z without one)."""
        if self.schedule is None:
            return
        self.noise_multiplier = self.base_multiplier * self.schedule[round_idx]
        self.update_multiplier = self._update_multiplier()

    @property
    def update_stddev(self) -> float:
        """σ of each coordinate of the update sum's noise: z_Δ · Δ at the current clip."""
        return self.update_multiplier * self.mechanism.sensitivity

    def noised(self, sums: ClippedSums, expected_clients: float, key: int, divide: bool = True
               ) -> tuple[Tensor, Tensor]:
        """``(ω update (P,), item-table update (I, k))``: the clipped sums plus one Gaussian draw each coordinate,
        from the stream of owner 0 under ``key`` (every process draws the same), over ``expected_clients`` if
        ``divide`` (``aggregator.reduce=mean``; the noised sum itself under ``sum``); with adaptive clipping the clip
        then moves (for the next round)."""
        P, (I, k) = sums.shared.numel(), sums.rows.shape
        draw = torch.from_numpy(KeyedRows(key, np.zeros(1, dtype=np.int64)).draw("normal", P + I * k + 1)[0])
        draw = draw.to(sums.shared.device)
        std = self.last_stddev = self.update_stddev
        denominator = expected_clients if divide else 1.0
        shared = (sums.shared + std * draw[:P]) / denominator
        rows = (sums.rows + std * draw[P:P + I * k].view(I, k)) / denominator
        if self.adaptive:
            unclipped = float(sums.unclipped[0]) + self.count_stddev * float(draw[-1])
            fraction = unclipped / expected_clients + 0.5
            self.mechanism.clip *= math.exp(-self.clip_lr * (fraction - self.target_quantile))
        return shared, rows

    def state_dict(self) -> dict[str, Any]:
        return {"clip": self.mechanism.clip}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mechanism.clip = float(state["clip"])

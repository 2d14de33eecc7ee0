"""Malicious clients (the ``attack`` group), so that robust aggregation rules meet what they defend against.

A fraction of the clients, ``⌊fraction · clients⌋`` of them drawn by the run seed (fixed for the run), are the
attacker's. **What the attacker knows and does**: it controls its clients entirely and knows what any client
knows, namely the global model it receives every round (ω and the item table) and its own clients' ratings and
user rows; it knows nothing of the benign clients' data or uploads. Each of its clients runs the honest client
(local training, under DP the clipping and noise, pseudo rows, the shuffle) and then transforms what it would
upload (after step ③ of the round):

* :class:`ScaledUpdates` (``attack=sign_flip``, ``attack=scale``): ω and every row multiplied by ``factor``
  (−1 flips the sign).
* :class:`GaussianNoise` (``attack=noise``): ω and every row replaced by an independent Gaussian direction of L2
  norm ``norm``.
* :class:`ItemPromotion` (``attack=item_promotion``): a model-poisoning attack on a target item, in the style of
  PipAttack / FedRecAttack. The item's row (added where the client does not upload the item; the client's other
  rows and ω stay honest, as camouflage) is ``−norm · h̄ / ‖h̄‖``: the server descends along uploads, so the item's
  embedding moves towards h̄, the mean representation h_u of the attacker's own users under the current model.
  Like FedRecAttack, which approximates benign users' embeddings from a small set of public interactions, the
  attacker approximates them from data it holds: its own users, who are ordinary users of the same population.
  The crafted row carries no DP noise (privacy protects the sender's data; the attacker gains nothing by it).
* :class:`ALittleIsEnough` (``attack=alie``, Baruch et al. 2019): every malicious client uploads, for ω and for
  each item row it uploads, ``μ − z·σ`` per coordinate, μ and σ the mean and (population) standard deviation of
  the honest updates the attacker knows, z from the paper's formula or set.
* :class:`MinMax` (``attack=min_max``, Shejwalkar and Houmansadr 2021): every malicious client uploads ``μ + γ·p``
  with ``p`` a perturbation (−σ, −μ/‖μ‖ or −sign μ) and γ the largest (by bisection) for which the upload lies no
  farther from any known honest update than those lie from each other.

The two statistical attacks see, by default (``knowledge=own``), only the honest updates of the attacker's own
clients (what their clients would have uploaded), as the threat model above says and as both papers allow (their
partial-knowledge case); ``knowledge=all`` lets them see every client's honest update of the round (the papers'
full-knowledge case, an omniscient attacker). An item's row is crafted from the known rows of that item.

Draws (which clients, the noise) come from the run's keyed streams (:mod:`fedrec.utils.rng`), so a resumed run repeats
them. An attack runs in one process (``trainer.devices=1``).
"""
from __future__ import annotations

import math
from abc import ABCMeta, abstractmethod
from collections.abc import Callable
from dataclasses import replace
from statistics import NormalDist
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrec.aggregation import share_count, squared_distances
from fedrec.data.ratings import RatingData
from fedrec.errors import ConfigError, check_choice, check_float, check_int
from fedrec.models.recommender import FederatedRecommender
from fedrec.recsys.aggregate import Uploads, itemwise
from fedrec.recsys.data import RoundData
from fedrec.recsys.evaluate import represent_users
from fedrec.utils.rng import KeyedRows, rank_within, stream_key


def unit_rows(draw: np.ndarray, norm: float) -> Tensor:
    """The rows of ``draw`` scaled to L2 norm ``norm`` (a zero-width row stays empty)."""
    t = torch.from_numpy(draw)
    return t * (norm / t.norm(dim=1, keepdim=True).clamp_min(1e-300))


def _one_in(count: int) -> str:
    """The smallest fraction, at three significant digits, that makes one of ``count`` clients (:func:`share_count`)."""
    shown = float(f"{1 / count:.3g}")
    while share_count(shown, count) == 0:  # rounding 1 / count to three digits went down
        shown = float(f"{shown + 10 ** (math.floor(math.log10(shown)) - 2):.3g}")
    return f"{shown:g}"


class Attack(metaclass=ABCMeta):
    """A fixed fraction of malicious clients and what they send.

    Args:
        fraction: the share of clients that are malicious, in [0, 1).
    """

    #: the item the attack promotes (None: an untargeted attack)
    target: int | None = None

    def __init__(self, fraction: float = 0.05) -> None:
        self.fraction = check_float("attack.fraction", fraction, low=0.0, high=1.0, high_open=True)
        self.malicious = torch.zeros(0, dtype=torch.bool)
        self.seed = 0

    def setup(self, data: RatingData, seed: int) -> None:
        """Draw the malicious clients of a run: the ``⌊fraction · clients⌋`` with the smallest uniform draws of the
        stream ``attack.clients``. A fraction above 0 that makes none is refused (0 runs the attack with none)."""
        self.seed = int(seed)
        n = data.num_clients
        if self.fraction > 0 and share_count(self.fraction, n) == 0:
            raise ConfigError(f"attack.fraction={self.fraction:g} makes no malicious client of the data's {n} clients "
                              f"(⌊fraction · clients⌋ = 0); one takes attack.fraction >= {_one_in(n)}, and "
                              "attack=none runs without malicious clients")
        draw = KeyedRows(stream_key(seed, "attack.clients"), np.arange(n)).draw("uniform", 1)[:, 0]
        self.malicious = torch.zeros(n, dtype=torch.bool)
        self.malicious[torch.from_numpy(np.argsort(draw, kind="stable")[:share_count(self.fraction, n)])] = True

    def benign_users(self, data: RatingData) -> np.ndarray:
        """``(num_users,)`` bool: the users of benign clients."""
        return ~self.malicious.numpy()[data.client_of_user]

    def __call__(self, up: Uploads, round_idx: int, model: FederatedRecommender, data: RoundData) -> Uploads:
        """The uploads the server receives: the malicious clients' transformed (``data`` is the round's)."""
        bad = self.malicious[up.clients]
        return self.poison(up, bad, round_idx, model, data) if bool(bad.any()) else up

    @abstractmethod
    def poison(self, up: Uploads, bad: Tensor, round_idx: int, model: FederatedRecommender,
               data: RoundData) -> Uploads:
        """Transform the uploads of the clients ``bad`` (bool per upload client, at least one)."""

    def summary(self) -> dict[str, Any]:
        """What a run's summary reports of the attack."""
        out: dict[str, Any] = {"attack": type(self).__name__, "malicious_clients": int(self.malicious.sum())}
        if self.target is not None:
            out["target_item"] = self.target
        return out


class ScaledUpdates(Attack):
    """Every malicious upload (ω and every row) multiplied by ``factor``: −1 flips its sign.

    Args:
        fraction: the share of malicious clients, in [0, 1).
        factor: the multiplier (−1: sign flip; 10: a boosted update).
    """

    def __init__(self, fraction: float = 0.05, factor: float = -1.0) -> None:
        super().__init__(fraction)
        self.factor = check_float("attack.factor", factor)

    def poison(self, up: Uploads, bad: Tensor, round_idx: int, model: FederatedRecommender,
               data: RoundData) -> Uploads:
        row_bad = bad[up.row_client].unsqueeze(1)
        return replace(up, shared=torch.where(bad.unsqueeze(1), self.factor * up.shared, up.shared),
                       rows=torch.where(row_bad, self.factor * up.rows, up.rows))


class GaussianNoise(Attack):
    """Every malicious upload replaced by Gaussian noise: ω and each row an independent N(0, I) direction scaled to
    L2 norm ``norm``, drawn from the client's stream under ``(seed, "attack.noise", round)`` (ω takes draws
    0..P−1, the client's j-th row the next k).

    Args:
        fraction: the share of malicious clients, in [0, 1).
        norm: the L2 norm of the noise in ω and in every row.
    """

    def __init__(self, fraction: float = 0.05, norm: float = 1.0) -> None:
        super().__init__(fraction)
        self.norm = check_float("attack.norm", norm, low=0.0, low_open=True)

    def poison(self, up: Uploads, bad: Tensor, round_idx: int, model: FederatedRecommender,
               data: RoundData) -> Uploads:
        key = stream_key(self.seed, "attack.noise", round_idx)
        P, k = up.shared.shape[1], up.rows.shape[1]
        shared, rows = up.shared.clone(), up.rows.clone()
        ids = up.clients[bad].numpy()
        if P:
            shared[bad] = unit_rows(KeyedRows(key, ids).draw("normal", P), self.norm).to(shared)
        row_bad = bad[up.row_client]
        owner = up.clients[up.row_client[row_bad]].numpy()
        rows[row_bad] = unit_rows(KeyedRows(key, owner, P + k * rank_within(owner)).draw("normal", k),
                                  self.norm).to(rows)
        return replace(up, shared=shared, rows=rows)


class ItemPromotion(Attack):
    """Promote a target item (see the module docstring): every malicious client uploads ``−norm · h̄ / ‖h̄‖`` as
    the target's row, h̄ the mean representation of the attacker's users in the round.

    Args:
        fraction: the share of malicious clients, in [0, 1).
        norm: the L2 norm of the crafted row.
        target_item: the item to promote (an index of the data's items); None draws it by the run seed among the
            less popular half of the items (those with at most the median number of training ratings), the usual
            target of promotion attacks.
    """

    def __init__(self, fraction: float = 0.05, norm: float = 1.0, target_item: int | None = None) -> None:
        super().__init__(fraction)
        self.norm = check_float("attack.norm", norm, low=0.0, low_open=True)
        self.target_item = None if target_item is None else check_int("attack.target_item", target_item, minimum=0)

    def setup(self, data: RatingData, seed: int) -> None:
        super().setup(data, seed)
        if self.target_item is not None:
            if self.target_item >= data.num_items:
                raise ConfigError(f"attack.target_item must be an item index below {data.num_items}, got "
                                  f"{self.target_item}")
            self.target = self.target_item
            return
        counts = np.bincount(data.training.item, minlength=data.num_items)
        candidates = np.flatnonzero(counts <= np.median(counts))
        u = KeyedRows(stream_key(seed, "attack.target"), np.zeros(1, dtype=np.int64)).draw("uniform", 1)[0, 0]
        self.target = int(candidates[int(u * len(candidates))])

    def direction(self, model: FederatedRecommender, data: RoundData) -> Tensor:
        """``(k,)``: h̄ / ‖h̄‖ over the attacker's users in ``data`` (zero if it has none this round)."""
        users = data.users[self.malicious[data.clients][data.user_client]]
        if users.numel() == 0:
            return torch.zeros(model.row_dim)
        mean = represent_users(model, data)[users.to(model.user_emb.device)].mean(0).cpu()
        return mean / mean.norm().clamp_min(1e-300)

    def poison(self, up: Uploads, bad: Tensor, round_idx: int, model: FederatedRecommender,
               data: RoundData) -> Uploads:
        crafted = (-self.norm * self.direction(model, data)).to(up.rows)
        row_bad = bad[up.row_client]
        rows = up.rows.clone()
        hit = row_bad & (up.row_item == self.target)
        rows[hit] = crafted
        missing = torch.ones(up.clients.numel(), dtype=torch.bool)
        missing[up.row_client[hit]] = False
        added = torch.nonzero(bad & missing).reshape(-1)  # malicious clients that do not upload the target
        row_client = torch.cat([up.row_client, added])
        order = torch.argsort(row_client, stable=True)  # keep the rows grouped by client
        return replace(up, row_client=row_client[order],
                       row_item=torch.cat([up.row_item, torch.full_like(added, self.target)])[order],
                       rows=torch.cat([rows, crafted.expand(added.numel(), -1)])[order])


KNOWLEDGE = ("own", "all")


class CraftedFromHonest(Attack):
    """An attack whose malicious clients all upload one vector crafted from the honest updates the attacker knows
    (its own clients' or, with ``knowledge="all"``, everyone's): one for ω, one per item for its rows.

    Args:
        fraction: the share of malicious clients, in [0, 1).
        knowledge: ``"own"`` (the attacker's clients' honest updates) or ``"all"`` (every client's).
    """

    def __init__(self, fraction: float = 0.05, knowledge: str = "own") -> None:
        super().__init__(fraction)
        self.knowledge = check_choice("attack.knowledge", knowledge, KNOWLEDGE)

    @abstractmethod
    def craft(self, honest: Tensor) -> Tensor:
        """``(b, P)``: the malicious update of each of ``b`` groups of ``n`` known honest updates ``(b, n, P)``."""

    def poison(self, up: Uploads, bad: Tensor, round_idx: int, model: FederatedRecommender,
               data: RoundData) -> Uploads:
        known = bad if self.knowledge == "own" else torch.ones_like(bad)
        shared, rows = up.shared.clone(), up.rows.clone()
        if shared.shape[1]:
            shared[bad] = self.craft(up.shared[known].double().unsqueeze(0))[0].to(shared)
        row_known, row_bad = known[up.row_client], bad[up.row_client]
        items, crafted = itemwise(lambda u, w: self.craft(u), up.rows[row_known].double(), up.row_item[row_known],
                                  torch.ones(int(row_known.sum()), dtype=torch.float64))
        rows[row_bad] = crafted[torch.searchsorted(items, up.row_item[row_bad])].to(rows)
        return replace(up, shared=shared, rows=rows)


class ALittleIsEnough(CraftedFromHonest):
    """"A Little Is Enough" (Baruch et al. 2019): every malicious client uploads ``μ − z·σ`` per coordinate, μ and
    σ the mean and population standard deviation of the known honest updates (ω over the clients, each item's row
    over its known uploaders). Unset, ``z`` is the paper's: with n clients and f of them malicious,
    ``s = ⌊n/2 + 1⌋ − f`` and ``z = Φ⁻¹((n − s)/n)``.

    Args:
        fraction: the share of malicious clients, in [0, 1).
        z: the shift in standard deviations; None: the paper's formula over the run's clients.
        knowledge: ``"own"`` or ``"all"`` (see :class:`CraftedFromHonest`).
    """

    def __init__(self, fraction: float = 0.05, z: float | None = None, knowledge: str = "own") -> None:
        super().__init__(fraction, knowledge)
        self.z_set = None if z is None else check_float("attack.z", z)
        self.z = self.z_set

    def setup(self, data: RatingData, seed: int) -> None:
        super().setup(data, seed)
        if self.z_set is None:
            self.z = paper_z(data.num_clients, int(self.malicious.sum()), self.fraction)

    def craft(self, honest: Tensor) -> Tensor:
        return honest.mean(-2) - self.z * honest.std(-2, correction=0)


def paper_z(n: int, f: int, fraction: float) -> float:
    """Baruch et al.'s z for n clients of which f are malicious: ``Φ⁻¹((n − s)/n)``, ``s = ⌊n/2 + 1⌋ − f`` (the
    benign clients the attacker needs to appear closer to the mean than). Refused where s < 1."""
    s = n // 2 + 1 - f
    if s < 1:
        raise ConfigError(f"attack.fraction={fraction:g} makes {f} of {n} clients malicious, too many for the "
                          "paper's z (s = ⌊n/2 + 1⌋ − f < 1); set attack.z")
    return NormalDist().inv_cdf((n - s) / n)


PERTURBATIONS = ("std", "unit", "sign")


class MinMax(CraftedFromHonest):
    """The min-max attack (Shejwalkar and Houmansadr 2021, NDSS, Algorithm 1 with the min-max objective): every
    malicious client uploads ``μ + γ·p``, μ the mean of the known honest updates, p the perturbation (``"std"``:
    −σ per coordinate; ``"unit"``: −μ/‖μ‖; ``"sign"``: −sign μ), and γ the largest for which the upload's largest
    L2 distance to a known honest update is at most the largest distance between two of them; γ is found by
    doubling from ``gamma_init`` and then bisection to within ``tolerance`` (the feasible γ ≥ 0 form an interval
    from 0, so the search is exact to the tolerance).

    Args:
        fraction: the share of malicious clients, in [0, 1).
        perturbation: ``"std"``, ``"unit"`` or ``"sign"``.
        gamma_init: the first γ tried (> 0).
        tolerance: the width of the final bracket around γ (> 0).
        knowledge: ``"own"`` or ``"all"`` (see :class:`CraftedFromHonest`).
    """

    def __init__(self, fraction: float = 0.05, perturbation: str = "std", gamma_init: float = 10.0,
                 tolerance: float = 1e-5, knowledge: str = "own") -> None:
        super().__init__(fraction, knowledge)
        self.perturbation = check_choice("attack.perturbation", perturbation, PERTURBATIONS)
        self.gamma_init = check_float("attack.gamma_init", gamma_init, low=0.0, low_open=True)
        self.tolerance = check_float("attack.tolerance", tolerance, low=0.0, low_open=True)

    def direction(self, honest: Tensor, mean: Tensor) -> Tensor:
        """``(b, P)``: the perturbation p of each group."""
        if self.perturbation == "std":
            return -honest.std(-2, correction=0)
        if self.perturbation == "unit":
            return -mean / mean.norm(dim=-1, keepdim=True).clamp_min(1e-300)
        return -torch.sign(mean)

    def craft(self, honest: Tensor) -> Tensor:
        mean = honest.mean(-2)
        p = self.direction(honest, mean)
        spread = squared_distances(honest).amax(dim=(-2, -1))

        def fits(gamma: Tensor) -> Tensor:
            upload = mean + gamma.unsqueeze(-1) * p
            return ((upload.unsqueeze(-2) - honest) ** 2).sum(-1).amax(-1) <= spread

        gamma = largest_feasible(fits, torch.full_like(spread, self.gamma_init), self.tolerance)
        return mean + gamma.unsqueeze(-1) * p


def largest_feasible(fits: Callable[[Tensor], Tensor], start: Tensor, tolerance: float, doublings: int = 64) -> Tensor:
    """Per entry, the largest γ ≥ 0 (to within ``tolerance``) with ``fits(γ)`` true, for a ``fits`` true on an
    interval from 0: ``start`` doubled while it fits, then the bracket halved; an entry that fits at every tried
    γ (a zero perturbation) keeps the last one."""
    low, high = torch.zeros_like(start), start
    for _ in range(doublings):
        ok = fits(high)
        if not bool(ok.any()):
            break
        low, high = torch.where(ok, high, low), torch.where(ok, 2 * high, high)
    while bool(((high - low) > tolerance).any()):
        mid = (low + high) / 2
        ok = fits(mid)
        low, high = torch.where(ok, mid, low), torch.where(ok, high, mid)
    return low

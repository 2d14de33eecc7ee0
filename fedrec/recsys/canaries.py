"""Canary clients in one private training run: the one-run audit (Steinke, Nasr & Jagielski, NeurIPS 2023) of a
whole server-placed federated recommendation run.

:class:`CanaryClients` is an attack (it transforms uploads after the clients' honest work, so the server clips a
canary's upload like any other); :func:`audit_one_run` runs a task built with them, scores each canary from the
released updates and turns the right guesses into an ε lower bound (:func:`fedrec.privacy.audit.one_run_bound`, the
paper's bound at the run's δ), beside the accountant's ε.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrec.data.ratings import RatingData
from fedrec.errors import ConfigError, check_float, check_int
from fedrec.models.recommender import FederatedRecommender
from fedrec.privacy.audit import check_confidence, correct_guesses, one_run_bound
from fedrec.recsys.aggregate import Uploads
from fedrec.recsys.attack import Attack, unit_rows
from fedrec.recsys.data import RoundData
from fedrec.utils.rng import KeyedRows, stream_key

__all__ = ["CanaryClients", "OneRunAudit", "audit_one_run"]


@dataclass(frozen=True)
class OneRunAudit:
    """What a one-run audit (:func:`audit_one_run`) found: the ε lower bound from ``correct`` right guesses out of
    ``guesses`` on ``canaries`` canary clients in one run of ``rounds`` rounds, beside the accountant's ε."""

    epsilon_lower: float  #: the ε lower bound at ``confidence`` (and δ = ``delta``)
    confidence: float
    delta: float  #: the run's δ, at which the bound and the reported ε are stated
    canaries: int
    guesses: int
    correct: int
    rounds: int
    epsilon_reported: float  #: the run's accountant's ε after the run
    mechanism: str = ""
    threat_model: str = ""

    @property
    def exceeds(self) -> bool:
        """Whether the bound is above the reported ε: the reported ε is then wrong for this threat model."""
        return self.epsilon_lower > self.epsilon_reported

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready values."""
        return asdict(self)


class CanaryClients(Attack):
    """Steinke et al.'s white-box gradient canaries, as clients of a federated recommendation run.

    ``canaries`` of the run's clients (the smallest uniform draws of the audit's stream ``audit.one_run.canaries``)
    stop sending their honest upload. Canary i is included with probability ½ (its own draw of
    ``audit.one_run.included``, independent of the run): included, it uploads a fixed vector c_i whenever the
    strategy samples it; excluded, it uploads zeros and no item rows, which the server's clipped sum cannot tell
    from an absent client (add/remove adjacency). They are the attack's "malicious" clients: the run's attack hook
    substitutes their uploads after the honest work and before the server clips, so the real clipping, sum and
    noise act on them.

    c_i (:meth:`draw_vectors`) is an N(0, I) direction on ``coordinates`` values of the update (ω and the item
    table, flattened), scaled to ``norm``; no two canaries share a coordinate (a keyed permutation deals them
    out), so the canaries are orthogonal. Their Dirac canaries (one coordinate each) are the case
    ``coordinates=1``. Shared coordinates would add the other canaries' uploads to every canary's score: with 4
    random item rows each (400 canaries on 200 items of width 8, MF, 20 rounds at q = ½, 1 % of the noise) the
    excluded canaries' scores spread over 3.7 times a canary's contribution per sampled round, against 2.4 (the
    honest clients' updates alone) with one coordinate each.

    Args:
        canaries: m, the canary clients (at most the run's clients).
        coordinates: the values each c_i spans (m · coordinates at most the update's values).
        seed: the audit's key (which clients, which are included, the vectors).
    """

    def __init__(self, canaries: int, *, coordinates: int = 1, seed: int = 0) -> None:
        super().__init__(0.0)
        self.canaries = check_int("canaries", canaries, minimum=2)
        self.coordinates = check_int("coordinates", coordinates, minimum=1)
        self.audit_seed = check_int("seed", seed, minimum=0)
        self.ids = torch.zeros(0, dtype=torch.int64)  # (m,) the canaries' client ids, ascending
        self.included = torch.zeros(0, dtype=torch.bool)  # (m,)
        self.slot = torch.zeros(0, dtype=torch.int64)  # (N,) each client's canary index, −1 for the others
        self.index = torch.zeros(0, 0, dtype=torch.int64)  # (m, coordinates) c_i's places in the flat update
        self.value = torch.zeros(0, 0, dtype=torch.float64)  # (m, coordinates) c_i's values there
        self.num_shared = 0

    def setup(self, data: RatingData, seed: int) -> None:
        """Draw the canary clients and which of them are included (from the audit's key, not the run's)."""
        self.seed = int(seed)
        n, m = data.num_clients, self.canaries
        if m > n:
            raise ConfigError(f"canaries={m} is more than the run's {n} clients")
        draw = KeyedRows(stream_key(self.audit_seed, "audit.one_run.canaries"), np.arange(n)).draw("uniform", 1)
        self.ids = torch.from_numpy(np.sort(np.argsort(draw[:, 0], kind="stable")[:m]))
        self.malicious = torch.zeros(n, dtype=torch.bool)
        self.malicious[self.ids] = True
        self.slot = torch.full((n,), -1, dtype=torch.int64)
        self.slot[self.ids] = torch.arange(m)
        coin = KeyedRows(stream_key(self.audit_seed, "audit.one_run.included"), np.arange(m)).draw("uniform", 1)
        self.included = torch.from_numpy(coin[:, 0] < 0.5)

    def draw_vectors(self, num_shared: int, num_items: int, width: int, norm: float) -> None:
        """Draw every c_i for an update of ``num_shared`` ω values and ``num_items`` item rows of ``width`` (flat:
        ω, then the table row by row): canary i takes places ``coordinates·i …`` of a keyed permutation of the
        update's values, and an N(0, I) direction there scaled to L2 norm ``norm``."""
        m, c = self.canaries, self.coordinates
        size = num_shared + num_items * width
        if m * c > size:
            raise ConfigError(f"{m} canaries of {c} coordinates need {m * c} distinct values; the update has {size}")
        perm = np.argsort(KeyedRows(stream_key(self.audit_seed, "audit.one_run.places"), np.zeros(1, dtype=np.int64)
                                    ).draw("uniform", size)[0], kind="stable")
        self.index = torch.from_numpy(np.ascontiguousarray(perm[:m * c].reshape(m, c)))
        direction = KeyedRows(stream_key(self.audit_seed, "audit.one_run.vectors"), np.arange(m)).draw("normal", c)
        self.value = unit_rows(direction, check_float("norm", norm, low=0.0, low_open=True))
        self.num_shared = num_shared

    def poison(self, up: Uploads, bad: Tensor, round_idx: int, model: FederatedRecommender,
               data: RoundData) -> Uploads:
        """The sampled canaries' uploads replaced: c_i for an included one (its ω values, and one item row per
        table value, zero but there), zeros and no rows for an excluded one."""
        device, P, k = up.row_client.device, self.num_shared, up.rows.shape[1]
        slots = self.slot[up.clients[bad].cpu()]
        inc = self.included[slots]
        where, value = self.index[slots[inc]], self.value[slots[inc]]  # (n, coordinates) for the n included
        sending = bad.nonzero().flatten().cpu()[inc]  # their positions in the upload
        shared = up.shared.clone()
        shared[bad] = 0
        owner = sending.unsqueeze(1).expand_as(where)
        on_shared = where < P
        shared[owner[on_shared].to(shared.device), where[on_shared].to(shared.device)] = value[on_shared].to(shared)
        place = where[~on_shared] - P
        rows = torch.zeros(place.numel(), k, dtype=torch.float64)
        rows[torch.arange(place.numel()), place % k] = value[~on_shared]
        honest = ~bad.to(device)[up.row_client]
        return replace(up, shared=shared,
                       row_client=torch.cat([up.row_client[honest], owner[~on_shared].to(device)]),
                       row_item=torch.cat([up.row_item[honest], (place // k).to(up.row_item)]),
                       rows=torch.cat([up.rows[honest], rows.to(up.rows)]))


def audit_one_run(build: Callable[[Attack], Any], canaries: int, *, guesses: int | None = None,
                  coordinates: int = 1, seed: int = 0, confidence: float = 0.95) -> OneRunAudit:
    """Audit a whole private training run in one run (Steinke, Nasr & Jagielski, NeurIPS 2023): ε ≥ the bound.

    The run is DP-FedAvg with server-placed noise (:mod:`fedrec.privacy.central`, non-adaptive clip), its canary
    clients :class:`CanaryClients` with c_i of norm 10·clip, so that clipping leaves each on the ball's edge. Every
    round's released update (the noised sum over the expected clients, or the sum itself under
    ``aggregator.reduce=sum``: ω and the whole item table) is recorded as
    the server steps with it, and canary i's score is Σ_t ⟨update_t, c_i/‖c_i‖⟩, the updates projected on its
    clipped direction. The auditor guesses "included" for the ``guesses``/2 highest scores and "excluded" for the
    ``guesses``/2 lowest, and the right guesses give the bound at the run's δ (:func:`one_run_p_value`). Only the
    canaries' inclusion differs between the inputs the theorem compares, and the run's draws (sampling, noise) do
    not depend on it, so the bound holds for the run's own guarantee: a bound above the accountant's ε proves that ε
    wrong (at ``confidence``). For a correct run it is far below ε by design: r guesses certify at most about
    log(r / log(1/α)) even if every one is right, and a Gaussian test guesses far less well than ε allows.

    Args:
        build: makes the run's task with the given attack (``FedRecTask(..., attack=attack)``), server-placed
            client DP (``ClientDP(..., placement="server")``) and the strategy whose sampling it accounts.
        canaries: m, the canary clients.
        guesses: r, even and at most m, fixed before the run (None: every canary, rounded down to even).
        coordinates, seed: :class:`CanaryClients`'s.
        confidence: the probability, in (0, 1), with which the bound holds.
    """
    conf = check_confidence(confidence)
    attack = CanaryClients(canaries, coordinates=coordinates, seed=seed)
    r = canaries - canaries % 2 if guesses is None else check_int("guesses", guesses, minimum=2)
    if r > canaries or r % 2:
        raise ConfigError(f"guesses must be even and at most canaries={canaries}, got {r}")
    task = build(attack)
    if task.attack is not attack:
        raise ConfigError("build must give the task the attack it is passed (FedRecTask(..., attack=attack))")
    if not task.server_placed or task.privacy.server.adaptive:
        raise ConfigError("audit_one_run audits server-placed DP with a fixed clip (privacy.placement=server, "
                          "privacy.adaptive_clip=false)")
    model, dp = task.model, task.privacy
    P = sum(p.numel() for p in model.shared_parameters().values())
    I, k = model.num_items, model.row_dim
    norm = 10.0 * dp.mechanism.clip
    attack.draw_vectors(P, I, k, norm)
    unit = attack.value / norm
    scores = torch.zeros(canaries, dtype=torch.float64)
    step = task.strategy.server_step

    def observe(model: FederatedRecommender, g_shared: Tensor, items: Tensor, g_items: Tensor) -> None:
        table = torch.zeros(I, k, dtype=torch.float64).index_copy(0, items.cpu(), g_items.detach().cpu().double())
        flat = torch.cat([g_shared.detach().cpu().double(), table.flatten()])
        scores.add_((flat[attack.index] * unit).sum(1))
        step(model, g_shared, items, g_items)

    task.strategy.server_step = observe
    try:
        for t in range(task.num_rounds):
            task.run_round(t)
    finally:
        task.strategy.server_step = step
    correct = correct_guesses(scores, attack.included, r)
    what = (f"{canaries} canary clients (add/remove, each included with probability 1/2; c_i on {coordinates} "
            f"coordinate{'s' * (coordinates > 1)} of its own at 10·clip), Poisson sampling at q={dp.sample_rate:g}, "
            f"{task.num_rounds} rounds, every update seen")
    return OneRunAudit(epsilon_lower=one_run_bound(canaries, r, correct, dp.delta, conf), confidence=conf,
                       delta=dp.delta, canaries=canaries, guesses=r, correct=correct, rounds=task.num_rounds,
                       epsilon_reported=float(task.summary()["epsilon_spent"]),
                       mechanism=f"server-placed Gaussian (DP-FedAvg), {type(model).__name__}", threat_model=what)

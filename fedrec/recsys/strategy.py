"""The round as a strategy: who takes part, what local work they do, and which uploads the server uses.

A :class:`Strategy` (``strategy=...``, in the manner of Flower's ``Strategy``) owns the round's seams that
federated-learning researchers set first; :class:`fedrec.tasks.FedRecTask` sequences them. The default strategy is
the round every experiment ran before it existed: every client holding ratings takes part, none fails, a
non-finite update aborts the run.

Participation (``participation``)
    ``all``; ``fixed``: ``clients_per_round`` of the clients holding ratings, uniformly without replacement;
    ``poisson``: each client independently with probability ``sample_rate``. A round that selects fewer than
    ``min_clients`` is skipped (no update; the privacy accountant still records it, which only overstates ε).
    Every client's draw comes from its own keyed stream under the round's key (the privacy setting's, so
    ``privacy.rng=secure`` keeps the sample secret too): the same clients take part at any process count and
    after a resume. For accounting, a client is in a round with probability ``q``: 1, ``sample_rate``, or
    ``clients_per_round / holding`` (sampling without replacement accounted as Poisson, the usual approximation
    for fixed-size rounds; ``poisson`` is the case the sampled-Gaussian analysis covers exactly).
Failures (simulated)
    ``dropout``: a selected client drops out with this probability before training (it sends nothing and spends
    no budget). ``deadline``: a client's round time is its share of the round's training ratings, ``n_c / mean(n)``,
    times a log-normal slowdown of mean 1 (σ = :data:`SLOWDOWN_SIGMA`) drawn from its stream; a client slower than
    ``deadline`` (in units of the mean client's time) is a straggler: it trains and sends, and the server, which
    closed the round, does not use its upload.
Bad updates (``on_bad_update``)
    An upload with a non-finite value, or (``max_update_norm``) of L2 norm above that bound as the server receives
    it, is ``drop``-ped (excluded before aggregation, and counted) or makes the run ``abort``.
Local work
    ``local_steps`` SGD steps of size ``local_lr`` per client (:func:`fedrec.recsys.local.local_updates`); unset,
    the aggregator's own (:attr:`fedrec.recsys.aggregate.Aggregator.default_local_steps`: 5 for FedAvg, 1 for the
    rest).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from fedrec.errors import ConfigError, check_choice, check_float, check_int
from fedrec.recsys.aggregate import Aggregator, FedSGD, Uploads
from fedrec.rng import KeyedRows

PARTICIPATIONS = ("all", "fixed", "poisson")
BAD_UPDATE_POLICIES = ("drop", "abort")
#: σ of the log-normal slowdown of a client's round time (mean 1), the straggler model's spread
SLOWDOWN_SIGMA = 0.5


@dataclass(frozen=True)
class RoundPlan:
    """Who is in a round, as ``(num_clients,)`` bool masks over the run's clients."""

    selected: Tensor  # sampled among the clients holding ratings
    dropped: Tensor  # selected, dropped out before training
    late: Tensor  # trained and sent after the deadline: not used
    skipped: bool  # fewer than min_clients selected: the round trains nothing

    @property
    def training(self) -> Tensor:
        """The clients that train and send this round (stragglers included)."""
        return self.selected & ~self.dropped


class Strategy:
    """Participation, failures, the bad-update policy and the clients' local work of a round (module docstring).

    Args:
        participation: ``"all"``, ``"fixed"`` or ``"poisson"``.
        clients_per_round: ``fixed``: clients per round.
        sample_rate: ``poisson``: each client's probability, in (0, 1].
        min_clients: a round selecting fewer is skipped.
        dropout: a selected client's probability of dropping out, in [0, 1).
        deadline: the straggler deadline in units of the mean client's round time (None: no deadline).
        on_bad_update: ``"drop"`` or ``"abort"``.
        max_update_norm: uploads of larger L2 norm are bad (None: only non-finite ones are).
        local_steps: local SGD steps per client (None: the aggregator's default).
        local_lr: their step size (and η_l of a server optimiser).
    """

    def __init__(self, participation: str = "all", clients_per_round: int | None = None,
                 sample_rate: float | None = None, min_clients: int = 1, dropout: float = 0.0,
                 deadline: float | None = None, on_bad_update: str = "abort", max_update_norm: float | None = None,
                 local_steps: int | None = None, local_lr: float = 0.05) -> None:
        self.participation = check_choice("strategy.participation", participation, PARTICIPATIONS)
        need = {"fixed": ("clients_per_round", clients_per_round), "poisson": ("sample_rate", sample_rate)}
        for mode, (name, value) in need.items():
            if (mode == self.participation) != (value is not None):
                raise ConfigError(f"strategy.{name} is " + (f"required by participation={mode}" if value is None else
                                  f"only read by participation={mode} (got participation={participation})"))
        self.clients_per_round = None if clients_per_round is None else check_int("strategy.clients_per_round",
                                                                                  clients_per_round)
        self.sample_rate = None if sample_rate is None else check_float("strategy.sample_rate", sample_rate, low=0.0,
                                                                        high=1.0, low_open=True)
        self.min_clients = check_int("strategy.min_clients", min_clients, minimum=0)
        self.dropout = check_float("strategy.dropout", dropout, low=0.0, high=1.0, high_open=True)
        self.deadline = None if deadline is None else check_float("strategy.deadline", deadline, low=0.0,
                                                                  low_open=True)
        self.on_bad_update = check_choice("strategy.on_bad_update", on_bad_update, BAD_UPDATE_POLICIES)
        self.max_update_norm = None if max_update_norm is None else check_float(
            "strategy.max_update_norm", max_update_norm, low=0.0, low_open=True)
        self._local_steps = None if local_steps is None else check_int("strategy.local_steps", local_steps)
        self.local_lr = check_float("strategy.local_lr", local_lr, low=0.0, low_open=True)
        self.local_steps = self._local_steps or 1

    @property
    def is_default(self) -> bool:
        """Whether every client holding ratings takes part and none fails (the round before strategies)."""
        return self.participation == "all" and self.dropout == 0.0 and self.deadline is None

    def setup(self, aggregator: Aggregator, num_clients: int) -> None:
        """Resolve the local steps against the aggregator and check the participation against the run's
        clients."""
        self.local_steps = self._local_steps or aggregator.default_local_steps
        if isinstance(aggregator, FedSGD) and self.local_steps > 1:
            raise ConfigError(f"strategy.local_steps={self.local_steps}: FedSGD uploads one gradient per client; "
                              "use aggregator=fedavg for local steps")
        if self.clients_per_round is not None and self.clients_per_round > num_clients:
            raise ConfigError(f"strategy.clients_per_round={self.clients_per_round} is more than the run's "
                              f"{num_clients} clients")
        if self.min_clients > num_clients:
            raise ConfigError(f"strategy.min_clients={self.min_clients} is more than the run's {num_clients} "
                              "clients: no round would run")

    def sampling_rate(self, holding: int) -> float:
        """q: the probability that a client holding ratings is selected in a round of ``holding`` such clients."""
        if self.participation == "poisson":
            return float(self.sample_rate)
        if self.participation == "fixed":
            return min(1.0, self.clients_per_round / max(holding, 1))
        return 1.0

    def expected_clients(self, holding: int) -> float:
        """The expected number of selected clients of a round of ``holding`` clients holding ratings."""
        return max(self.sampling_rate(holding) * holding, 1e-12)

    def plan(self, holding: Tensor, work: Tensor | None, key: int) -> RoundPlan:
        """The round's :class:`RoundPlan` for the clients ``holding`` ratings, with ``work`` ``(num_clients,)`` their
        training ratings (the straggler model's; read only with a ``deadline``), drawn from each client's stream under
        ``key``."""
        N = holding.numel()
        if self.is_default:
            none = torch.zeros(N, dtype=torch.bool)
            return RoundPlan(holding.clone(), none, none, False)
        # per client: participation, dropout, slowdown (one stream each, so one setting never moves another's draws)
        u = torch.from_numpy(KeyedRows(key, np.arange(N)).draw("uniform", 3))
        if self.participation == "poisson":
            selected = holding & (u[:, 0] < self.sample_rate)
        elif self.participation == "fixed":
            rank = torch.argsort(torch.where(holding, u[:, 0], math.inf), stable=True)
            selected = torch.zeros(N, dtype=torch.bool)
            selected[rank[:min(self.clients_per_round, int(holding.sum()))]] = True
        else:
            selected = holding.clone()
        skipped = int(selected.sum()) < self.min_clients
        if skipped:
            selected = torch.zeros(N, dtype=torch.bool)
        dropped = selected & (u[:, 1] < self.dropout)
        late = torch.zeros(N, dtype=torch.bool)
        trains = selected & ~dropped
        if self.deadline is not None and bool(trains.any()):
            w = work.double()
            slowdown = torch.exp(SLOWDOWN_SIGMA * _standard_normal(u[:, 2]) - SLOWDOWN_SIGMA ** 2 / 2)
            late = trains & (w / w[trains].mean() * slowdown > self.deadline)
        return RoundPlan(selected, dropped, late, skipped)

    @staticmethod
    def nonfinite(shared: Tensor, rows: Tensor, row_client: Tensor) -> Tensor:
        """``(C,)`` bool: the clients whose ω row or any of their item rows has a non-finite value."""
        device = rows.device
        bad_rows = ~torch.isfinite(rows).reshape(rows.shape[0], -1).all(1)
        per_client = torch.zeros(shared.shape[0], dtype=torch.long, device=device).index_add(
            0, row_client.to(device), bad_rows.long())
        return ~torch.isfinite(shared).all(1).to(device) | (per_client > 0)

    def bad_uploads(self, up: Uploads) -> Tensor:
        """``(C,)`` bool: the uploads, as the server receives them, that are non-finite or (``max_update_norm``) of
        larger L2 norm than it."""
        bad = self.nonfinite(up.shared, up.rows, up.row_client)
        if self.max_update_norm is not None:
            device = up.rows.device
            sq = up.shared.double().pow(2).sum(1).to(device).index_add(
                0, up.row_client.to(device), up.rows.double().pow(2).reshape(up.rows.shape[0], -1).sum(1))
            bad |= sq.sqrt() > self.max_update_norm
        return bad


def _standard_normal(u: Tensor) -> Tensor:
    """The standard normal quantiles of uniforms in (0, 1)."""
    return math.sqrt(2.0) * torch.erfinv(2.0 * u - 1.0)

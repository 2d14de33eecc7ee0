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
The server's side
    Bound to the run's aggregator, privacy and optimiser steps by :meth:`Strategy.setup`, the strategy admits the
    clients the privacy budget allows (:meth:`~Strategy.admit`), privatises client-placed uploads
    (:meth:`~Strategy.privatize`), screens what the server received (:meth:`~Strategy.screen`), combines the used
    uploads (:meth:`~Strategy.aggregate`: the aggregator's rule, or under ``privacy.placement=server`` one noise
    draw on their clipped sum), steps the server and the clients' user rows (:meth:`~Strategy.step`) and accounts
    the round (:meth:`~Strategy.record`). Local training, upload assembly and evaluation are the task's, which
    knows the data.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrec.errors import ConfigError, TrainingDiverged, check_choice, check_float, check_int
from fedrec.federation.collective import Collective
from fedrec.models.recommender import FederatedRecommender
from fedrec.privacy.central import ClippedSums, clipped_sums
from fedrec.privacy.client_dp import ClientDP
from fedrec.recsys.aggregate import AggregateSums, Aggregator, FedSGD, Uploads, is_additive
from fedrec.recsys.data import RoundData
from fedrec.recsys.item_solve import ItemSolveStep
from fedrec.recsys.privatize import privatize_uploads, record_round, round_budget
from fedrec.recsys.server import AdaptiveServerStep, ServerStep, UserStep
from fedrec.utils.rng import KeyedRows

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
        self.aggregator: Aggregator | None = None  # the run's, bound by setup
        self.privacy: ClientDP | None = None
        self.server_step: ServerStep | AdaptiveServerStep | ItemSolveStep = ServerStep()
        self.user_step: UserStep = UserStep()

    @property
    def is_default(self) -> bool:
        """Whether every client holding ratings takes part and none fails (the round before strategies)."""
        return self.participation == "all" and self.dropout == 0.0 and self.deadline is None

    def setup(self, aggregator: Aggregator, num_clients: int, num_rounds: int = 1, privacy: ClientDP | None = None,
              server_step: ServerStep | AdaptiveServerStep | ItemSolveStep | None = None,
              user_step: UserStep | None = None) -> None:
        """Bind the run's aggregator, privacy and optimiser steps, resolve the local steps against the aggregator,
        and check them against each other and the run's ``num_clients`` clients over ``num_rounds`` rounds (server
        placement calibrates its noise for the sampling rate here)."""
        self.aggregator, self.privacy = aggregator, privacy
        self.server_step, self.user_step = server_step or ServerStep(), user_step or UserStep()
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
        if privacy is None:
            return
        if privacy.accountant.num_clients != num_clients:
            raise ConfigError(f"privacy is set up for {privacy.accountant.num_clients} clients, the data has "
                              f"{num_clients}")
        if aggregator.weighting == "ratings":  # the server sees only each client's set of uploaded item ids
            raise ConfigError("aggregator.weighting=ratings weights by the clients' private rating counts, "
                              "which DP does not cover: use uploaded_items or uniform with privacy on")
        if self.server_placed:
            plain = type(aggregator).partial is Aggregator.partial and type(aggregator).__call__ is Aggregator.__call__
            if not plain or aggregator.weighting != "uniform":
                raise ConfigError(f"privacy.placement=server noises the plain sum of clipped uploads: it needs a "
                                  f"mean aggregator with uniform weights (aggregator=fedsgd|fedavg, "
                                  f"aggregator.weighting=uniform), got {type(aggregator).__name__} with "
                                  f"weighting={aggregator.weighting}")
            privacy.setup_server(num_rounds, self.sampling_rate(num_clients), self.expected_clients(num_clients))

    def check_processes(self, world_size: int) -> None:
        """Refuse an aggregator that cannot be summed over ``world_size`` > 1 processes (``trainer.devices``)."""
        if world_size > 1 and not self.additive:
            raise ConfigError(f"trainer.devices={world_size}: {type(self.aggregator).__name__} combines uploads in "
                              "its own __call__, which cannot be summed over processes; run it in one process or "
                              "implement Aggregator.partial/finish")

    @property
    def server_placed(self) -> bool:
        """Whether the DP noise is the server's, one draw on the clipped sum (``privacy.placement=server``)."""
        return self.privacy is not None and self.privacy.placement == "server"

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


    # ------------------------------------------------------------------------------------------ the server's side
    def admit(self, run: Tensor, budget: Tensor | None, num_rounds: int, round_idx: int
              ) -> tuple[Tensor, Tensor | None]:
        """Step ②: of the clients set to ``run`` (``(num_clients,)`` bool), those the privacy budget admits, and
        the round's per-client budgets of client-placed noise (``budget``, a planner's, or else the uniform split
        over ``num_rounds``; None without client noise). A server-placed round (at round ``round_idx``'s noise
        multiplier) past ε admits no one."""
        if self.server_placed:
            self.privacy.server.at_round(round_idx)
            return (run if self.privacy.server_round_affordable() else torch.zeros_like(run)), None
        if self.privacy is None:
            return run, None
        budget = round_budget(self.privacy, budget, run.numel(), num_rounds)
        return self.privacy.admissible(budget, run), budget

    def privatize(self, shared: Tensor, sizes: list[int], rows: Tensor, data: RoundData, budget: Tensor | None,
                  key: int) -> tuple[Tensor, Tensor]:
        """Step ③'s noise under ``privacy.placement=client``: every client of ``data`` clips and noises its ω (of
        tensors of ``sizes`` values) and real item rows at its ``budget``, drawing under ``key``
        (:func:`~fedrec.recsys.privatize.privatize_uploads`); otherwise the uploads go as they are."""
        if self.privacy is None or self.server_placed:
            return shared, rows
        return privatize_uploads(self.privacy, shared, sizes, rows, data.row_client.to(rows.device),
                                 budget[data.clients], data.clients, key)

    def screen(self, bad: Tensor, late: Tensor, diverged: Callable[[], str]) -> Tensor:
        """``(num_clients,)`` bool: the uploads the server does not use, the ``late`` ones and the ``bad``
        (non-zero) ones; under ``on_bad_update=abort`` a bad one stops the run with ``diverged()``'s message."""
        if self.on_bad_update == "abort" and bool((bad > 0).any()):
            raise TrainingDiverged(diverged())
        return late | (bad > 0)

    def diverged(self, round_idx: int, prox_mu: float) -> str:
        """Why round ``round_idx`` aborts on a bad update, naming first the setting to change (FedProx's
        ``prox_mu`` first, then the local steps' rate, else the optimiser's)."""
        if self.max_update_norm is not None:
            return (f"strategy.max_update_norm: round {round_idx}: a client's update is not finite or exceeds "
                    f"strategy.max_update_norm={self.max_update_norm:g} (raise it, or set "
                    "strategy.on_bad_update=drop to leave such updates out)")
        settings = []
        if prox_mu:
            settings.append(("task.prox_mu", prox_mu))
        if self.local_steps > 1:
            settings.append(("strategy.local_lr", self.local_lr))
        if not prox_mu:
            settings.append(("task.lr", self.user_step.lr))
        lower = " or ".join(f"{name} ({value:g})" for name, value in settings)
        return (f"{settings[0][0]}: round {round_idx}: a client's update is not finite (training diverged); "
                f"lower {lower}")

    @property
    def additive(self) -> bool:
        """Whether the server combines sums over clients (the aggregator's :meth:`~Aggregator.partial` sums, or
        server placement's clipped sums), which add up over any split of the clients: over processes, and over the
        chunks of a process's clients (``task.client_chunk``)."""
        return self.server_placed or is_additive(type(self.aggregator))

    def sums(self, uploads: Uploads | None, model: FederatedRecommender) -> AggregateSums | ClippedSums:
        """The additive sums of the used ``uploads`` of some clients (None: of none): the aggregator's weighted
        sums, or under server placement the clipped sums."""
        device = model.user_emb.device
        num_shared, num_items, dim = sum(p.numel() for p in model.shared_parameters().values()), model.num_items, \
            model.row_dim
        if self.server_placed:
            return clipped_sums(self.privacy.mechanism, uploads.shared, uploads.rows, uploads.row_client,
                                uploads.row_item, num_items) if uploads is not None and uploads.clients.numel() else \
                ClippedSums.zeros(num_shared, num_items, dim, device)
        return self.aggregator.partial(uploads, num_items) if uploads is not None else AggregateSums.zeros(
            num_shared, num_items, dim, device)

    @staticmethod
    def add_up(total: AggregateSums | ClippedSums, part: AggregateSums | ClippedSums) -> None:
        """Add ``part``'s sums (some clients') into ``total``'s, in place."""
        for t, p in zip(total.tensors(), part.tensors()):
            t.add_(p)

    def combine(self, sums: AggregateSums | ClippedSums, model: FederatedRecommender, together: list[Tensor],
                collective: Collective, holding: int, key: Callable[[str], int]) -> tuple[Tensor, Tensor, Tensor]:
        """The server's update ``(ω, item ids, item rows)`` of ``model`` from the round's :meth:`sums`: the
        aggregator's weighted means, or under server placement the sums noised by one draw under
        ``key("server_noise")`` and divided by the expected clients of a round of ``holding`` clients (under
        ``aggregator.reduce=sum`` the noised sum itself). In a run of several processes the sums, and the
        ``together`` tensors with them, are first added up over processes."""
        if collective.world_size > 1:
            collective.all_reduce([*sums.tensors(), *together])
        if not self.server_placed:
            return self.aggregator.finish(sums, model.item_emb.dtype)
        g_shared, g_rows = self.privacy.server.noised(sums, self.expected_clients(holding), key("server_noise"),
                                                      divide=self.aggregator.reduce == "mean")
        dtype = model.item_emb.dtype
        return g_shared.to(dtype), torch.arange(model.num_items, device=g_rows.device), g_rows.to(dtype)

    def aggregate(self, uploads: Uploads | None, model: FederatedRecommender, together: list[Tensor],
                  collective: Collective, holding: int, key: Callable[[str], int]) -> tuple[Tensor, Tensor, Tensor]:
        """The server's update from this process's used ``uploads`` (None: it has none): the aggregator's rule on
        them in one process, else :meth:`combine` of their :meth:`sums`."""
        if collective.world_size == 1 and not self.server_placed:
            return self.aggregator(uploads)
        return self.combine(self.sums(uploads, model), model, together, collective, holding, key)

    def step(self, model: FederatedRecommender, update: tuple[Tensor, Tensor, Tensor], users: Tensor,
             user_grads: Tensor) -> None:
        """Step ④'s close: the server's optimiser on ω and the item table from ``update`` ``(ω, item ids, item
        rows)``; the ``users`` whose uploads were used update their own rows from ``user_grads``."""
        self.server_step(model, *update)
        self.user_step(model, users, user_grads)

    def record(self, budget: Tensor | None, data: RoundData | None, num_clients: int, num_tensors: int) -> None:
        """Account the round: client placement charges the clients of ``data`` (None: no one trained) at their
        ``budget`` for ``num_tensors`` ω tensors and their rows; server placement records one sampled round, also
        one in which no one was sampled (while the budget lasts)."""
        if self.privacy is None:
            return
        if self.server_placed:
            if data is not None or self.privacy.server_round_affordable():
                self.privacy.record_server_round()
        elif data is not None:
            record_round(self.privacy, budget, data, num_clients, num_tensors)

    def state_dict(self) -> dict[str, Any]:
        """The server's and the clients' optimiser states."""
        return {"server_opt": self.server_step.state_dict(), "user_opt": self.user_step.state_dict()}

    def load_state_dict(self, model: FederatedRecommender, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` into the optimisers of ``model``."""
        self.server_step.load_state_dict(model, state["server_opt"])
        self.user_step.load_state_dict(model, state["user_opt"])


def _standard_normal(u: Tensor) -> Tensor:
    """The standard normal quantiles of uniforms in (0, 1)."""
    return math.sqrt(2.0) * torch.erfinv(2.0 * u - 1.0)

"""Round-based federated recommendation with client-level or central DP (BGTplanner's DPFR setting).

:class:`FedRecTask` sequences one round ``t`` (paper Fig. 1, steps ①–⑤). The round's seams that a federated-learning
researcher sets belong to its :class:`~fedrec.recsys.strategy.Strategy` (as in Flower); the task prepares the data,
trains the clients, assembles the uploads and evaluates, each concern a module of :mod:`fedrec.recsys`:

1. the clients that hold training ratings (initial half plus the stream so far) group them
   (:mod:`~fedrec.recsys.data`), sample pseudo items and announce their item ids X^t
   (:mod:`~fedrec.recsys.upload`, :meth:`FedRecTask.upload_items`); with ``task.expansion``, every few rounds they
   first expand their local graphs through a third-party server (:mod:`~fedrec.recsys.expansion`);
2. the strategy selects the clients that take part (all by default, or a fixed number or a Poisson sample) and
   simulates dropouts and stragglers (``Strategy.plan``); each client gets the round's budget, set by a callback
   through :meth:`FedRecTask.set_round_budget` (the planner hook) or else the uniform split, and clients it would
   take past their total sit the round out (``Strategy.admit``);
3. all clients compute their updates together (:mod:`~fedrec.recsys.local`), clip and noise ω and their real
   item rows under client placement (``Strategy.privatize``), append FedGNN's synthesised pseudo rows and shuffle
   their rows (:mod:`~fedrec.recsys.upload`), so that neither position nor order tells real items from pseudo ones;
   user rows stay on the client. Under an attack, the malicious clients transform their uploads
   (:mod:`~fedrec.recsys.attack`);
4. the channel counts the uploads; the strategy sets aside stragglers' and bad ones (``Strategy.screen``), combines
   the rest with the aggregator (:mod:`~fedrec.recsys.aggregate`) or, under ``privacy.placement=server``, adds one
   noise draw to their clipped sum (:mod:`fedrec.privacy.central`) (``Strategy.aggregate``), steps the server's
   optimiser and the used clients' user rows (``Strategy.step``, :mod:`~fedrec.recsys.server`) and accounts the
   round (``Strategy.record``); the server broadcasts;
5. the model is evaluated on the test (and validation) ratings (:mod:`~fedrec.recsys.evaluate`): RMSE, MAE and F1
   on explicit ratings, top-K ranking (``task.eval``) on either kind of data; under an attack also on the benign
   users alone, with the target item's exposure.

**Objectives** (``task.objective``, :mod:`fedrec.recsys.objectives`): the clients' RMSE (or MSE) on explicit ratings
(:func:`fedrec.data.load_ratings`), or on implicit feedback (:func:`fedrec.data.load_implicit`) BPR (the default) or
pointwise BCE against ``task.train_negatives`` negatives per training positive, drawn per client per round
(:func:`fedrec.data.implicit.sample_negatives`); the negatives' item rows are uploaded, privatised and aggregated
like the positives'. Implicit data has no stream: every training positive is there from round 0.

**Ranking** (``task.eval``): each evaluation round ranks, per user with held-out items, every item but the user's
training items (the round's; for the test split its validation items too, which it has interacted with), or with
``ranking=sampled`` its held-out items against ``negatives`` sampled ones (:mod:`fedrec.recsys.ranking`). On
explicit ratings every held-out rating counts as relevant, whatever its value (the "every interaction" convention
of implicit feedback; binarise with ``data=*_implicit`` and a threshold to count only liked items). The sampled
negatives are drawn once per run (the key of round 0 every round, as NCF fixes its negatives), so the curve over
rounds compares the model against one fixed candidate set. ``save_topk=true`` writes each test user's first
``max(ks)`` items to ``topk.npz`` in the run folder at the end (:func:`~fedrec.recsys.ranking.save_topk`).

**Central baseline** (``task.federated=false``): one party holding every user's data, i.e. one client that holds
all users, without client DP (refused) and without pseudo items; the one client's upload aggregates to itself, so
the same round trains the central model on the same loss (the mean over all the data) and the federated and
private gaps are measured on one code path. A federated run whose data has a single client is the same model.

Randomness is counter based (seed, component, round), so a resumed run repeats the uninterrupted one exactly;
with ``privacy.rng=secure`` the draws that protect clients (pseudo items, DP noise, pseudo rows, upload order)
come from the operating system's cryptographic source instead (:meth:`ClientDP.draw_key`).

Metrics computed centrally from clients' raw data without noise (the training loss, test and validation metrics)
are flagged by :meth:`FedRecTask.is_private_metric`, so the CLI can keep them out of the logs
(``logger.private_metrics=false``); callbacks such as planners still receive them.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrec.aggregation import ServerOptimizer
from fedrec.data.implicit import ImplicitData, sample_negatives
from fedrec.data.ratings import RatingData, Ratings
from fedrec.errors import ConfigError, check_choice, check_float, check_int
from fedrec.federation.channel import Channel
from fedrec.federation.collective import Collective
from fedrec.models.recommender import FederatedRecommender, MatrixFactorization
from fedrec.privacy.client_dp import ClientDP
from fedrec.recsys.aggregate import Aggregator, FedSGD, Uploads, streams_chunks
from fedrec.recsys.attack import Attack
from fedrec.recsys.data import RoundData, entry_order, round_data, shard, shard_bounds
from fedrec.recsys.evaluate import (
    RankingEval,
    RankingSplit,
    benign_test_rmse,
    evaluate,
    evaluate_ranking,
    evaluating,
    target_exposure,
    topk_lists,
)
from fedrec.recsys.expansion import ROLE as EXPANSION_ROLE
from fedrec.recsys.expansion import GraphExpansion
from fedrec.recsys.item_solve import ItemSolve, ItemSolveStep
from fedrec.recsys.local import local_updates, solve_user_rows
from fedrec.recsys.objectives import OBJECTIVES, WITH_NEGATIVES
from fedrec.recsys.privatize import round_key
from fedrec.recsys.ranking import UserItems, negatives_key, save_topk
from fedrec.recsys.selection import ValidationSelection
from fedrec.recsys.server import AdaptiveServerStep, ServerStep, UserStep
from fedrec.recsys.side_graphs import SideGraphs
from fedrec.recsys.strategy import RoundPlan, Strategy
from fedrec.recsys.upload import (
    assemble_uploads,
    sample_pseudo_items,
    upload_matrix,
    upload_scalars,
)
from fedrec.tasks.base import FederatedTask

log = logging.getLogger(__name__)

#: prefixes of the per-round metrics computed from clients' raw ratings without noise
PRIVATE_METRIC_PREFIXES = ("train_", "test_", "val_")
#: the metrics where higher is better (the suffix of ``test_NAME``, before any ``@K``); lower is better for the rest
HIGHER_IS_BETTER = ("f1", "hr", "ndcg", "recall", "mrr")
#: the file :attr:`RankingEval.save_topk` writes into the run folder
TOPK_FILE = "topk.npz"


def higher_is_better(name: str) -> bool:
    """Whether a larger value of metric ``name`` (e.g. ``test_ndcg@10``, ``val_rmse``) is the better one."""
    return name.rsplit("_", 1)[-1].split("@")[0] in HIGHER_IS_BETTER


@dataclass
class _ClientWork:
    """What step ③ of round ``round_idx`` needs beside the clients' data: the uploaded ω tensors' ``sizes``, the
    clients' noise ``budget`` (None without client noise), the round's keys, and where their user rows go
    (``user_grad``; ``solved`` for other processes under ``task.user_solve``)."""

    round_idx: int
    sizes: list[int]
    budget: Tensor | None
    keys: tuple[int, int, int]  # the round's privacy, pseudo rows' and upload order's keys, drawn once per round
    user_grad: Tensor
    solved: Tensor | None


@dataclass
class _Prepared:
    """A round's training data of every client holding ratings, and its pseudo items (before the budget step)."""

    training: Ratings
    data: RoundData
    pseudo: Tensor  # (C, M) item ids
    pseudo_valid: Tensor  # (C, M)
    negatives: Any = None  # the round's sampled negatives (fedrec.data.implicit.Triples), implicit feedback only
    order: np.ndarray | None = None  # the training ratings' entry_order, which a later round's merges its arrivals into


class FedRecTask(FederatedTask):
    """Federated recommendation (rating prediction or top-K from implicit feedback) driven by
    :class:`~fedrec.trainer.FederatedTrainer`.

    Args:
        data: the split ratings (:func:`fedrec.data.load_ratings`; ``data.rounds`` must equal ``rounds``) or
            implicit feedback (:func:`fedrec.data.load_implicit`).
        model: a :class:`~fedrec.models.FederatedRecommender` sized for ``data``.
        aggregator: how uploads are combined (FedSGD, FedAvg, a robust rule of :mod:`fedrec.recsys.aggregate`).
        privacy: client-level DP, or None for non-private training.
        rounds: T.
        pseudo_items: pseudo-interacted items per client per round (0 disables them).
        optimizer: server optimiser ``"adam"`` (Adam with L2 weight decay, the authors') or ``"sgd"``; clients
            update their own user rows with the same rule.
        lr, weight_decay: its step size and weight decay.
        optimizer_state: ``"reset"`` rebuilds the optimiser every round as the authors' code does (Adam's first
            step is then a sign-like step of size ``lr``); ``"persistent"`` keeps its moments across rounds.
        seed: the run seed.
        server: a server optimiser of Reddi et al.'s Algorithm 2 (:mod:`fedrec.aggregation`) that moves ω and the
            item rows by the clients' mean model change instead of ``optimizer`` (which the clients keep for their
            user rows); None: ``optimizer`` on the aggregate.
        prox_mu: FedProx's μ ≥ 0, the weight of ``μ/2 ‖w − w_global‖²`` in the clients' local steps (0: none).
        row_l2: λ ≥ 0 of the L2 term ``λ/2 (Σ‖p_u‖² + Σ‖q_i‖²)`` on the rows each client trains (0: none; the
            server optimiser's ``weight_decay`` acts on the aggregate instead).
        attack: malicious clients (:mod:`fedrec.recsys.attack`), or None.
        objective: the clients' loss, ``"rmse"``, ``"mse"``, ``"bpr"`` or ``"bce"`` (module docstring); None: RMSE on
            ratings, BPR on implicit feedback.
        train_negatives: negatives sampled per training positive per round (``bpr``, ``bce``).
        eval: the ranking evaluation (:class:`~fedrec.recsys.evaluate.RankingEval` fields: ``ranking``, ``ks``,
            ``negatives``, ``save_topk``).
        federated: False trains the central baseline (module docstring).
        strategy: the round's participation, failures, bad-update policy and local work
            (:class:`~fedrec.recsys.strategy.Strategy`); None: every client, every round, one local step (FedSGD)
            or the aggregator's default.
        select_on: the validation metric whose best round the ``selected_*`` results report
            (:class:`~fedrec.recsys.selection.ValidationSelection`); None: ``val_rmse`` on ratings,
            ``val_ndcg@10`` on implicit feedback. Needs a validation split when given.
        expansion: FedGNN's graph expansion (:mod:`fedrec.recsys.expansion`), ``neighbours`` per item and user
            (0: none) every ``every`` rounds; the model must be built with ``expansion=True`` (the builder does).
        mean_init: before round 0, set the model's global bias μ so that it predicts the mean training rating
            (through the inverse of its head): each client sends the server the sum and the count of its training
            ratings once. Needs ``model.bias``, explicit ratings and no privacy (the sums are not noised).
        side_graphs: graph regularisation by the data's user and item graphs (:mod:`fedrec.recsys.side_graphs`),
            weights ``users`` and ``items`` (0: off).
        user_solve: each training client sets its user rows to the ridge solution of its ratings given the item rows
            it downloaded (:func:`~fedrec.recsys.local.solve_user_rows`, L2 ``weight_decay``) before computing its
            upload at them, instead of a gradient step on them after the server's. Matrix factorisation with the
            linear head on the summed loss (``model=mf +model.head=linear task.objective=sse``), one local step.
        item_solve: the server's item step of alternating least squares (:mod:`fedrec.recsys.item_solve`, fields
            ``ridge``, ``factor_scale``, ``average_from``, ``count_power``, ``noise_ridge``, ``count_average``) in
            place of the optimiser's: clients upload residual sums, counts and their rows' second moment, every item
            takes a Newton step, and every client then re-solves its rows; None (or ``enabled: false``): off. Needs
            ``user_solve``, no pseudo items, FedSGD's plain sum, and server placement if private.
        client_chunk: at most this many clients train at once (:func:`~fedrec.recsys.local.local_updates`), so that
            local training's memory follows the chunk instead of the round, the same updates either way to float32
            rounding; with an additive combination (not a robust rule, no attack) the chunk's uploads are also
            assembled, screened and summed before the next chunk trains, so the round's uploads follow the chunk
            too. None: all of a process's clients at once.
    """

    kind = "recommendation"
    #: the privacy mechanisms its clients apply (client-level DP); the builder refuses the others
    privacy_mechanisms: tuple[type, ...] = (ClientDP,)

    #: a run of several processes shards the clients (``trainer.devices``)
    supports_sharding = True

    @classmethod
    def memory_estimate(cls, sizes: Mapping[str, Any]) -> int:
        """The bytes a round needs beyond the model's tables for ``sizes`` (``users``, ``items``, ``training``,
        ``clients``, ``embed_dim``, ``pseudo_items``, ``negatives``, ``neighbours``, and ``shared``, the model's ω
        size, 0 before the model exists), before anything is allocated:

        * four float32 copies of a round's uploaded rows (each training rating's item row and ``pseudo_items``
          pseudo rows per client, at most ``items`` of them: the rows, their gradients, their noise and the
          shuffled upload); when the round is ``streamed`` (``task.client_chunk`` with an additive combination:
          :meth:`_streamed`) only the largest chunk's (``chunk_training``, ``chunk_clients``), and the same for the
          clients' copies of ω below;
        * on implicit feedback, per negative four float32 vectors (its item row and its user's state, gathered per
          pair, and their gradients) and eight 8-byte values (the draw's temporaries in
          :func:`~fedrec.data.implicit.sample_negatives`, the pair's indices, logit and gradient): 320 bytes at
          width 16, where ML-100K's peak grew by 310-375 bytes per negative between 1, 20 and 100 negatives per
          positive;
        * with graph expansion, per training rating ``neighbours`` slots of eight float32 vectors (attached for
          training and evaluation, transformed, attended, and their gradients) and three 8-byte values: 280 bytes
          a slot at width 8, where ML-100K's peak grew by 255 (408 MB with 20 neighbours);
        * the clients' own copies of ω (:func:`~fedrec.recsys.local.local_updates` trains every client's copy at
          once): the start, the trained copy, its gradient and the flattened upload, four float32 copies per
          client (counted from the code; at ML-100K's 943 clients a width-4000 FedGNN's one copy is the 60 GB that
          torch was asked for);
        * 150 bytes per training rating for the round's data: the ratings taken out of the split and grouped by
          client, user and item (:func:`~fedrec.recsys.data.round_data`: keys, sort order, index arrays). Measured
          with 1.44 million more training ratings (the same users, items and clients), the peak grew by 275 bytes
          a rating with MF (this says 278; without this term it said 128, and a MF round at Netflix's size that it
          let start was killed for memory) and by 740 with FedGNN (790). The sort order kept for the next round
          (:func:`~fedrec.recsys.data.entry_order`, 8 bytes a rating) is one of the arrays counted there."""
        k, pseudo = sizes["embed_dim"], min(sizes["pseudo_items"], sizes["items"])
        drawn = sizes["training"] * sizes["negatives"]
        expansion = sizes["training"] * sizes["neighbours"] * (8 * 4 * k + 24)
        # a streamed round (task.client_chunk, an additive combination) holds one chunk's rows and ω copies at once
        training, clients = (sizes["chunk_training"], sizes["chunk_clients"]) if sizes.get("streamed") else \
            (sizes["training"], sizes["clients"])
        shared = 4 * 4 * clients * sizes.get("shared", 0)
        return 4 * 4 * k * (training + clients * pseudo + drawn) + 8 * 8 * drawn + expansion + shared + \
            150 * sizes["training"]

    def __init__(
        self,
        data: RatingData | ImplicitData,
        model: FederatedRecommender,
        aggregator: Aggregator,
        privacy: ClientDP | None = None,
        rounds: int = 100,
        pseudo_items: int = 50,
        optimizer: str = "adam",
        lr: float = 0.05,
        weight_decay: float = 1e-4,
        optimizer_state: str = "persistent",
        seed: int = 0,
        server: ServerOptimizer | None = None,
        prox_mu: float = 0.0,
        row_l2: float = 0.0,
        attack: Attack | None = None,
        objective: str | None = None,
        train_negatives: int = 1,
        eval: Mapping[str, Any] | None = None,
        federated: bool = True,
        strategy: Strategy | None = None,
        select_on: str | None = None,
        expansion: Mapping[str, Any] | None = None,
        mean_init: bool = False,
        side_graphs: Mapping[str, Any] | None = None,
        user_solve: bool = False,
        item_solve: Mapping[str, Any] | None = None,
        client_chunk: int | None = None,
    ) -> None:
        self.num_rounds = check_int("task.rounds", rounds)
        self.implicit = isinstance(data, ImplicitData)
        # null (or unset): the feedback's default objective
        self.objective = check_choice("task.objective", objective or ("bpr" if self.implicit else "rmse"), OBJECTIVES)
        if (self.objective in WITH_NEGATIVES) != self.implicit:
            raise ConfigError(f"task.objective={self.objective} trains on " + (
                "implicit feedback: use a data=*_implicit dataset" if not self.implicit else
                "explicit ratings, which implicit feedback has not: use bpr or bce"))
        self.train_negatives = check_int("task.train_negatives", train_negatives)
        self.ranking = RankingEval.from_config(eval, self.implicit, data.num_items)
        if not isinstance(federated, bool):
            raise ConfigError(f"task.federated must be true or false, got {federated!r}")
        self.federated = federated
        if not federated:
            if privacy is not None or attack is not None:
                raise ConfigError("task.federated=false trains one party's central model: it has no client DP and "
                                  "no malicious clients (set privacy=none and attack=none)")
            data = dataclasses.replace(data, num_clients=1, client_of_user=np.zeros(data.num_users, dtype=np.int64))
            pseudo_items = 0
        if self.implicit and attack is not None:
            raise ConfigError("attack: the attacks act on rating data; implicit feedback runs have none (attack=none)")
        if not self.implicit and data.rounds != self.num_rounds:
            raise ConfigError(f"task.rounds ({self.num_rounds}) must equal the rounds the data stream is spread "
                              f"over ({data.rounds})")
        if model.num_users != data.num_users or model.num_items != data.num_items:
            raise ConfigError(f"model is sized for {model.num_users} users and {model.num_items} items, the data "
                              f"has {data.num_users} and {data.num_items}")
        aggregator.validate(data.num_clients)
        self.strategy = strategy or Strategy()
        self.item_solve = ItemSolve.from_config(item_solve)
        server_step = ServerStep(optimizer, lr, weight_decay, optimizer_state) if server is None else \
            AdaptiveServerStep(server, self.strategy.local_lr)
        if self.item_solve is not None:
            noise = None if privacy is None else lambda: privacy.server.last_stddev  # set up with the strategy
            server_step = ItemSolveStep(self.item_solve, self.strategy.sampling_rate(data.num_clients), noise)
        self.strategy.setup(aggregator, data.num_clients, self.num_rounds, privacy, server_step,
                            UserStep(optimizer, lr, weight_decay, optimizer_state))
        self.data, self.model, self.aggregator, self.privacy = data, model, aggregator, privacy
        self.pseudo_items = check_int("task.pseudo_items", pseudo_items, minimum=0)
        if self.pseudo_items > data.num_items:  # sample_pseudo_items draws all a client has not rated: say so
            log.warning("task.pseudo_items=%d is more than the data's %d items: each client uploads every item it "
                        "has not rated as a pseudo item, as with task.pseudo_items=%d", self.pseudo_items,
                        data.num_items, data.num_items)
        self.prox_mu = check_float("task.prox_mu", prox_mu, low=0.0)
        self.row_l2 = check_float("task.row_l2", row_l2, low=0.0)
        if self.prox_mu and self.strategy.local_steps == 1:  # its term is zero at the first step, the only one
            raise ConfigError(f"task.prox_mu={prox_mu!r} acts only in local steps after the first, and the clients "
                              "take one (strategy.local_steps=1); set strategy.local_steps > 1 (aggregator=fedavg "
                              "takes 5) or task.prox_mu=0")
        self.seed = int(seed)
        self.server, self.attack = server, attack
        if attack is not None:
            attack.setup(data, self.seed)
        if not isinstance(mean_init, bool):
            raise ConfigError(f"task.mean_init must be true or false, got {mean_init!r}")
        if mean_init and not getattr(model, "bias", False):
            raise ConfigError("task.mean_init=true sets the model's global bias: add it with +model.bias=true")
        if mean_init and (self.implicit or privacy is not None):
            raise ConfigError("task.mean_init=true starts at the mean training rating, which " + (
                "implicit feedback has not (every positive is 1)" if self.implicit else
                "clients would send the server without noise: set privacy=none or task.mean_init=false"))
        self.mean_init = mean_init
        self.expansion = GraphExpansion.from_config(expansion, data.num_users, data.num_items)
        self.side_graphs = SideGraphs.from_config(side_graphs, getattr(data, "user_graph", None),
                                                  getattr(data, "item_graph", None), data.name, privacy is not None)
        if self.side_graphs is not None:
            self.side_graphs.width(model)  # refuses smoothing biases the model has not
        self.user_solve = _check_user_solve(user_solve, model, self.objective, self.strategy.local_steps,
                                            weight_decay, self.side_graphs)
        if self.item_solve is not None:
            _check_item_solve(self.user_solve, self.pseudo_items, aggregator, privacy, server, attack, self.expansion)
        self.client_chunk = None if client_chunk is None else check_int("task.client_chunk", client_chunk)
        if self.client_chunk is not None and self.item_solve is not None:
            raise ConfigError(f"task.client_chunk={client_chunk} chunks the clients' local training, which "
                              "task.item_solve replaces by its statistics: set task.client_chunk=null")
        endpoints = {"client": data.num_clients, "server": 1}
        if self.expansion is not None:
            if not getattr(model, "expansion", False):
                raise ConfigError(f"task.expansion.neighbours={self.expansion.count}: {type(model).__name__} does "
                                  "not read expansion neighbours (model=fedgnn does; set task.expansion."
                                  "neighbours=0 for another model)")
            endpoints[EXPANSION_ROLE] = 1
        self.channel = Channel(endpoints=endpoints, bytes_per_scalar=4)
        self.trainer: Any = None
        self.last_uploads: Uploads | None = None
        self.best: dict[str, tuple[float, int]] = {}
        if select_on is not None and not len(data.val):
            raise ConfigError(f"task.select_on={select_on} selects on a validation split, and the data has none "
                              "(set data.val_fraction > 0, or data.val=true on implicit feedback)")
        self.selection = ValidationSelection(select_on or ("val_ndcg@10" if self.implicit else "val_rmse"),
                                             higher_is_better)
        self.latest: dict[str, float] = {}
        self._budget: Tensor | None = None
        self._prepared: dict[int, _Prepared] = {}
        self.collective = Collective()  # the trainer's, once set up (several processes shard the clients)
        heldout = {name: (r.user, r.item) for name, r in (("test", data.test), ("val", data.val))} if not \
            self.implicit else {"test": data.test.pairs(), "val": data.val.pairs()}
        self._heldout = {name: UserItems.from_pairs(*pairs, data.num_users) for name, pairs in heldout.items()
                         if len(pairs[0])}
        #: uploads the server used (scalars, messages) and clients per round, summed over the rounds run
        self.used = {"scalars": 0, "messages": 0, "clients": 0, "rounds": 0}

    @property
    def server_placed(self) -> bool:
        """Whether the run's DP noise is added by the server to the clipped sum (``privacy.placement=server``)."""
        return self.strategy.server_placed

    # ------------------------------------------------------------------------------------------------ hooks
    def setup(self, trainer: Any) -> None:
        self.trainer = trainer
        self.collective = getattr(trainer, "collective", None) or Collective()
        self.model.to(self.collective.device)  # the trainer's accelerator; round data is moved where it is used
        self.strategy.check_processes(self.collective.world_size)
        if self.collective.world_size > 1 and self.attack is not None:
            raise ConfigError(f"trainer.devices={self.collective.world_size}: attacks run in one process (attack="
                              f"{type(self.attack).__name__}); set trainer.devices=1")
        if self.collective.world_size > 1 and self.item_solve is not None:
            raise ConfigError(f"trainer.devices={self.collective.world_size}: task.item_solve runs in one process; "
                              "set trainer.devices=1")

    def set_round_budget(self, budget: float | Tensor) -> None:
        """Set the next round's per-client privacy budget in :attr:`ClientDP.budget_unit` (ε_t for Laplace, an RDP
        budget for Gaussian): a number or a ``(num_clients,)`` tensor. Call it from ``on_round_start``."""
        if self.privacy is None:
            raise ConfigError("set_round_budget needs privacy=gaussian or privacy=laplace (privacy is none)")
        if self.server_placed:
            raise ConfigError("set_round_budget sets per-client budgets of client-placed noise; privacy.placement="
                              "server calibrates one noise multiplier for the run (no planner)")
        b = torch.as_tensor(budget, dtype=torch.float64)
        self._budget = b.expand(self.data.num_clients).clone() if b.dim() == 0 else b
        self.privacy.levels(self._budget)  # validate now, so the caller gets the error

    def upload_items(self, round_idx: int) -> Any:
        """X^t of round ``round_idx`` as a float64 ``scipy.sparse.csr_matrix`` (num_clients × num_items, 0/1):
        the items each client holding ratings will upload (real and pseudo), known before the budget is set.
        Each row's item ids are stored sorted, so the matrix is the set of uploaded ids and nothing more."""
        prep = self._prepare(round_idx)
        return upload_matrix(prep.data, prep.pseudo, prep.pseudo_valid, self.data.num_clients, self.data.num_items)

    def clients_holding_data(self, round_idx: int) -> Tensor:
        """``(num_clients,)`` bool: the clients with training ratings in round ``round_idx`` (those the strategy may
        select)."""
        holding = torch.zeros(self.data.num_clients, dtype=torch.bool)
        holding[self._prepare(round_idx).data.clients] = True
        return holding

    def evaluate_round(self, round_idx: int) -> dict[str, float]:
        """The current model's test (and validation) metrics on round ``round_idx``'s local graphs (e.g. before
        any training, for a planner's first reward)."""
        return self.evaluate(self._prepare(round_idx))

    def is_private_metric(self, name: str) -> bool:
        """Whether metric or summary field ``name`` is computed centrally from clients' raw ratings without DP
        noise: ``train_loss`` (their training ratings), every ``test_*``/``val_*`` metric (their held-out ratings),
        and the ``final_*``/``best_*`` summaries of those. Logging them leaks more than the privacy setting covers."""
        base = name.removeprefix("final_").removeprefix("best_").removesuffix("_round")
        return base.startswith(PRIVATE_METRIC_PREFIXES)

    # ------------------------------------------------------------------------------------------------ round
    def run_round(self, round_idx: int) -> dict[str, float]:
        prep = self._prepare(round_idx)  # ① the round's data, pseudo items and X^t
        if self.mean_init and round_idx == 0:
            self._start_at_the_mean(prep)
        if self.expansion is not None and self.expansion.due(round_idx):
            self._expand(round_idx, prep)
        plan = self._plan(round_idx, prep)  # who the strategy selects, and who fails
        d, pseudo, valid, budget = self._admit(round_idx, prep, plan)  # ② the budget, and who can afford it
        metrics: dict[str, float] = {}
        if d.num_clients == 0:
            if bool(plan.training.any()) and self.trainer is not None:  # the privacy budget left no one
                self.trainer.should_stop = True
            metrics.update(clients=0.0, train_loss=math.nan)
            self.strategy.record(None, None, self.data.num_clients, 0)  # server placement: a round no one was in
        else:
            metrics.update(self._train(round_idx, d, pseudo, valid, budget, plan.late))  # ③ and ④
        if not self.strategy.is_default:
            metrics.update(clients_selected=float(plan.selected.sum()), clients_dropped=float(plan.dropped.sum()),
                           clients_late=float(plan.late.sum()))
        self.used["rounds"] += 1
        self.used["clients"] += int(metrics["clients"])
        metrics.update(self.evaluate(prep))  # ⑤
        for name, value in metrics.items():
            self.latest[name] = value
        self._track_best(round_idx, metrics)
        self.selection.update(round_idx, metrics)
        if self.privacy is not None:
            metrics.update(self.privacy.round_metrics())
        metrics.update({k: float(v.sum()) for k, v in self.channel.ledger.totals().items()
                        if k in ("comm_upload_scalars", "comm_download_scalars", "comm_messages")})
        return metrics

    def _start_at_the_mean(self, prep: _Prepared) -> None:
        """``task.mean_init``: μ from the clients' rating sums and counts (one message of 2 scalars each)."""
        tr, model = prep.training, self.model
        mean = float(np.asarray(tr.rating, dtype=np.float64).mean())
        if model.head == "sigmoid":  # σ(μ) = mean, kept off the sigmoid's flat ends
            p = min(max(mean, 1e-3), 1 - 1e-3)
            mean = math.log(p / (1 - p))
        with torch.no_grad():
            model.global_bias.fill_(mean)
        clients = torch.from_numpy(np.unique(self.data.client_of_user[tr.user]))
        self.channel.send("upload", ("client", clients), ("server", 0), None, 2)

    def _expand(self, round_idx: int, prep: _Prepared) -> None:
        """Graph expansion over every client holding ratings, with the users' current vectors."""
        tr, model = prep.training, self.model
        self.expansion.expand(tr.user, tr.item, self.data.client_of_user,
                              model.user_emb.detach()[:, :model.embed_dim], self.channel,
                              self._key("expansion_hash", round_idx), self._key("expansion", round_idx))

    def _graphs(self, d: RoundData) -> RoundData:
        """``d`` with its entries' expansion neighbours (itself without expansion)."""
        return d if self.expansion is None else self.expansion.attach(d)

    def _key(self, name: str, round_idx: int) -> int:
        return round_key(self.privacy, self.seed, name, round_idx, self.collective)

    def _bounds(self, d: RoundData) -> list[tuple[int, int]]:
        return shard_bounds(d, self.collective.world_size, self.pseudo_items)

    def _prepare(self, round_idx: int) -> _Prepared:
        """Step ①: the round's training data of every client holding ratings, and their pseudo items. The grouping
        of the last round prepared is kept while no ratings arrive (explicit feedback: the same ratings group the
        same way; implicit feedback draws new negatives every round), and otherwise its sort order is: a later
        round's training ratings extend an earlier one's, so only the arrivals are sorted and merged in."""
        prep = self._prepared.get(round_idx)
        if prep is None:
            kept = next(iter(self._prepared.items()), None)
            self._prepared = {}  # only the current round is ever needed again
            last = kept[1] if kept is not None and kept[0] < round_idx else None  # its ratings begin this round's
            tr, negatives = self._training(round_idx)
            if last is not None and not self.implicit and len(tr) == len(last.training):  # no arrivals since
                d, order = last.data, last.order
            else:
                order = entry_order(tr.user, tr.item, self.data.client_of_user, self.data.num_items,
                                    None if last is None else last.order)
                d = round_data(tr.user, tr.item, tr.rating, self.data.client_of_user, self.data.num_items,
                               negatives=negatives, order=order)
            pseudo, valid = sample_pseudo_items(d, self.data.num_items, self.pseudo_items,
                                                self._key("pseudo_items", round_idx))
            prep = self._prepared[round_idx] = _Prepared(tr, d, pseudo, valid, negatives, order)
        return prep

    def _training(self, round_idx: int) -> tuple[Ratings, Any]:
        """The training ratings available at round ``round_idx`` (implicit feedback: every training positive, as a
        rating of 1) and, under BPR or BCE, every client's negatives of the round."""
        if not self.implicit:
            return self.data.training_until(round_idx), None
        user, item = self.data.train.pairs()
        tr = Ratings(user, item, np.ones(len(user), dtype=np.float32))
        clients = np.unique(self.data.client_of_user[user])
        return tr, sample_negatives(self.data, clients, round_idx, self.seed, self.train_negatives)

    def _plan(self, round_idx: int, prep: _Prepared) -> RoundPlan:
        """The strategy's selection and failures among the clients holding ratings (the same in every process)."""
        holding, work = self.clients_holding_data(round_idx), None
        if self.strategy.deadline is not None:  # the straggler model's work: each client's training ratings
            work = torch.zeros(self.data.num_clients, dtype=torch.long)
            work[prep.data.clients] = prep.data.ratings_per_client()
        key = 0 if self.strategy.is_default else self._key("participation", round_idx)
        return self.strategy.plan(holding, work, key)

    def _admit(self, round_idx: int, prep: _Prepared, plan: RoundPlan
               ) -> tuple[RoundData, Tensor, Tensor, Tensor | None]:
        """Step ②: the round's budget; the data, pseudo items and per-client budgets of the clients that train (the
        strategy's, which the privacy budget admits)."""
        d = prep.data
        run, budget = self.strategy.admit(plan.training, self._budget, self.num_rounds, round_idx)
        self._budget = None
        if not bool(run[d.clients].all()):
            keep = run[d.clients]
            tr = prep.training
            d = round_data(tr.user, tr.item, tr.rating, self.data.client_of_user, self.data.num_items, run.numpy(),
                           prep.negatives)
            return d, prep.pseudo[keep], prep.pseudo_valid[keep], budget
        return d, prep.pseudo, prep.pseudo_valid, budget

    def _train(self, round_idx: int, full: RoundData, pseudo: Tensor, valid: Tensor, budget: Tensor | None,
               late: Tensor) -> dict[str, float]:
        """Steps ③ and ④: this process computes, privatises and assembles its shard's uploads (every client, in a
        one-process run); the server drops late and bad uploads (the strategy's), the sums are added up over
        processes, and every process takes the same server and user steps, so all hold the same model. With
        ``task.client_chunk`` and an additive combination the shard's clients go a chunk at a time, each chunk's used
        uploads summed and dropped before the next (:meth:`_streamed`)."""
        model, k, s = self.model, self.model.row_dim, self.strategy
        model_sizes = [p.numel() for p in model.shared_parameters().values()]
        # what a client uploads: ω and its item rows, or under task.item_solve its rows' second moment and per item
        # its residual sums (one more value than a row) and count
        sizes = model_sizes if self.item_solve is None else [model.row_dim ** 2]
        width = k if self.item_solve is None else k + 1
        # drawn once, in this order, in every process (under privacy.rng=secure each is a broadcast)
        keys = (self._key("privacy", round_idx) if self.privacy is not None else 0,
                self._key("pseudo_rows", round_idx), self._key("upload_order", round_idx))
        full = self._graphs(full)
        d, lo, hi = shard(full, self._bounds(full), self.collective.global_rank)
        user_grad = torch.zeros_like(model.user_emb.detach())
        loss_sum = torch.zeros(1, dtype=torch.float64)
        bad = torch.zeros(self.data.num_clients, dtype=torch.float64)  # clients whose upload is bad, all processes
        single = self.collective.world_size == 1
        # task.user_solve over several processes: the rows this one's clients solved, for the others
        solved = torch.zeros_like(user_grad) if self.user_solve and not single else None
        work = _ClientWork(round_idx, sizes, budget, keys, user_grad, solved)
        uploads, sums, extra_rows = None, None, None
        if self._streamed() and d.num_clients:
            sums = s.sums(None, model)
            for a in range(0, d.num_clients, self.client_chunk):
                part = d.select(a, min(a + self.client_chunk, d.num_clients))
                up, broken, loss, _ = self._uploads(work, part, pseudo[lo + a:], valid[lo + a:])
                bad[part.clients] = broken.cpu().double()
                use = ~(broken.cpu() | late[part.clients])  # what the server will use, known before the sum
                up = self.channel.deliver("upload", up.keep(use), ("client", part.clients),
                                         ("server", torch.zeros_like(part.clients)))
                s.add_up(sums, s.sums(up, model))
                loss_sum += loss.double().cpu()[use].sum()
                del up  # so that the next chunk trains without this one's uploads alive
            self.last_uploads = None
        elif d.num_clients:
            uploads, broken, loss, extra_rows = self._uploads(work, d, pseudo[lo:hi], valid[lo:hi])
            self.last_uploads = uploads
            bad[d.clients] = broken.cpu().double()
            loss_sum[0] = loss.double().sum()
        # ④ the channel counts every client's upload (its size is known to all processes), the server uses those on
        # time and not bad, and the aggregator (or the server's noise) combines them
        scalars = upload_scalars(full, valid, sum(sizes), width)
        if extra_rows is not None:
            scalars = scalars + extra_rows * (k + 1)
        uploads = self.channel.send("upload", ("client", full.clients), ("server", 0), uploads, scalars)
        if not single:
            self.collective.all_reduce([bad] if solved is None else [bad, solved])
            if solved is not None:  # every process takes the rows the others' clients solved
                with torch.no_grad():
                    model.user_emb[full.users] = solved[full.users]
        unused = s.screen(bad, late, lambda: s.diverged(round_idx, self.prox_mu))
        used = ~unused[full.clients]
        n = int(used.sum())
        if uploads is not None and bool(unused[d.clients].any()):
            uploads = uploads.keep(~unused[d.clients])
            loss_sum[0] = loss.double()[~unused[d.clients].to(loss.device)].sum()
        if n:
            holding, key = int(self._prepare(round_idx).data.num_clients), lambda name: self._key(name, round_idx)
            update = s.combine(sums, model, [user_grad, loss_sum], self.collective, holding, key) \
                if sums is not None else s.aggregate(uploads, model, [user_grad, loss_sum], self.collective, holding,
                                                     key)
            users = full.users if n == full.num_clients else full.users[used[full.user_client]]
            if self.user_solve:  # their rows were solved in ③
                users = users[:0]
            user_grads = user_grad[users]
            if self.side_graphs is not None:  # the graphs' terms (the server's on items, the clients' on users)
                update = self.side_graphs.add_item_term(model, update)
                term = self.side_graphs.user_term(model, users, self.data.client_of_user, self.channel)
                user_grads = user_grads if term is None else user_grads + term
            s.step(model, update, users, user_grads)
        s.record(budget, full, self.data.num_clients, len(sizes))
        broadcast, receivers = sum(model_sizes) + self.data.num_items * k, full.clients
        if self.item_solve is not None:  # every client holding ratings solves its rows against the new table
            everyone = self._prepare(round_idx).data
            receivers = everyone.clients
            broadcast += 0 if s.server_step.item_weights() is None else self.data.num_items
            rows_of_users = solve_user_rows(model, everyone.to(model.user_emb.device), s.user_step.weight_decay)
            with torch.no_grad():
                model.user_emb[everyone.users.to(model.user_emb.device)] = rows_of_users
        self.channel.send("download", ("server", 0), ("client", receivers), None, broadcast)
        self.used["scalars"] += int(scalars[used].sum())
        self.used["messages"] += n
        out = {"clients": float(n), "train_loss": float(loss_sum[0]) / n if n else math.nan}
        if self.strategy.on_bad_update == "drop":
            out["clients_bad"] = float((bad > 0).sum())
        return out

    def _streamed(self) -> bool:
        """Whether a round's uploads, not only its local training, go ``task.client_chunk`` clients at a time
        (:func:`~fedrec.recsys.aggregate.streams_chunks`)."""
        s = self.strategy
        return streams_chunks(self.client_chunk, type(s.aggregator), s.server_placed, self.attack is not None)

    def _uploads(self, work: _ClientWork, d: RoundData, pseudo: Tensor, valid: Tensor
                 ) -> tuple[Uploads, Tensor, Tensor, Tensor | None]:
        """Step ③ for the clients of ``d`` (their pseudo items the first rows of ``pseudo`` and ``valid``): local
        training, privatisation of ω and the real item rows, upload assembly (and the attack, if any). Their user
        rows' gradients go into ``work.user_grad`` (under ``task.user_solve`` their solved rows into the model, and
        into ``work.solved``). Returns the uploads, which clients' uploads are bad (non-finite, or past
        ``strategy.max_update_norm``), each client's loss, and the rows the attack added per client (None without
        one)."""
        model, s, round_idx, device = self.model, self.strategy, work.round_idx, self.model.user_emb.device
        local = d.to(device)
        # the clients' own rows first, solved from the item rows they downloaded; under task.item_solve every
        # client re-solved its rows after the last step, so only a round that brings new ratings solves again
        if self.user_solve and (self.item_solve is None or round_idx == 0 or self.data.arrivals(round_idx)):
            rows_of_users = solve_user_rows(model, local, s.user_step.weight_decay)
            with torch.no_grad():
                model.user_emb[local.users] = rows_of_users
            if work.solved is not None:
                work.solved[d.users] = rows_of_users
        upd = local_updates(model, local, s.local_steps, s.local_lr, self.prox_mu, OBJECTIVES[self.objective],
                            self.row_l2, self.client_chunk) if self.item_solve is None else \
            self.item_solve.statistics(model, local, s.server_step.item_weights())
        shared, rows = upd.flat_shared(), upd.rows
        broken = s.nonfinite(shared, rows, d.row_client)
        if bool(broken.any()):  # the noise cannot hide a non-finite value: the upload is dropped (or aborts)
            shared, rows = shared.masked_fill(broken.unsqueeze(1), 0.0), rows.masked_fill(
                broken.to(device)[d.row_client.to(device)].unsqueeze(1), 0.0)
        privacy_key, rows_key, order_key = work.keys
        shared, rows = s.privatize(shared, work.sizes, rows, d, work.budget, privacy_key)
        n = d.num_clients
        uploads = assemble_uploads(d, shared, rows, pseudo[:n], valid[:n], rows_key, order_key,
                                   private=self.privacy is not None)
        extra_rows = None
        if self.attack is not None:  # one process: the shard is the whole round
            honest_rows = uploads.row_client
            uploads = self.attack(uploads, round_idx, model, d)
            extra_rows = torch.bincount(uploads.row_client, minlength=n) - torch.bincount(honest_rows, minlength=n)
        if self.attack is not None or s.max_update_norm is not None:  # what the server receives
            broken = broken | s.bad_uploads(uploads)
        work.user_grad.index_put_((d.users,), upd.users)
        return uploads, broken, upd.loss, extra_rows

    # ------------------------------------------------------------------------------------------------ metrics
    def evaluate(self, prep: _Prepared) -> dict[str, float]:
        """Step ⑤: test (and validation) metrics, users represented from the round's local graphs
        (:func:`fedrec.recsys.evaluate.evaluate`, :func:`~fedrec.recsys.evaluate.evaluate_ranking`: each process
        scores its shard's users), with the model in eval mode (no dropout)."""
        with evaluating(self.model):
            return self._evaluate(prep)

    def _evaluate(self, prep: _Prepared) -> dict[str, float]:
        prep = dataclasses.replace(prep, data=self._graphs(prep.data))
        bounds = self._bounds(prep.data)
        metrics = {} if self.implicit else evaluate(self.model, self.data, prep.data, bounds, self.collective)
        metrics.update(evaluate_ranking(self.model, self.data.client_of_user, self.data.num_clients, prep.data,
                                        bounds, self.collective, self._ranking_splits(prep), self.ranking,
                                        self._negatives_key()))
        if self.attack is not None:
            benign = self.attack.benign_users(self.data)
            metrics["test_benign_rmse"] = benign_test_rmse(self.model, self.data, prep.data, benign)
            if self.attack.target is not None:
                metrics["test_target_exposure"] = target_exposure(self.model, prep.data, self.attack.target,
                                                                  torch.from_numpy(np.flatnonzero(benign)))
        return metrics

    def _ranking_splits(self, prep: _Prepared) -> list[RankingSplit]:
        """The held-out splits to rank, each against the round's training items (the test split's also against the
        validation items)."""
        if self.ranking.ranking == "none":
            return []
        tr, num_users = prep.training, self.data.num_users
        train = UserItems.from_pairs(tr.user, tr.item, num_users)
        seen = train
        if "val" in self._heldout:
            vu, vi = (self.data.val.user, self.data.val.item) if not self.implicit else self.data.val.pairs()
            seen = UserItems.from_pairs(np.concatenate([tr.user, vu]), np.concatenate([tr.item, vi]), num_users)
        return [RankingSplit(name, seen if name == "test" else train, items) for name, items in self._heldout.items()]

    def _negatives_key(self) -> int:
        """The sampled ranking negatives' key: round 0's in every round (drawn once per run, module docstring)."""
        return negatives_key(self.seed, 0)

    def write_topk(self, folder: str | Path, round_idx: int) -> Path:
        """Write the test users' top-K lists as round ``round_idx`` ranks them (the current model) to
        ``folder``/:data:`TOPK_FILE`."""
        prep = self._prepare(round_idx)
        split = next(s for s in self._ranking_splits(prep) if s.name == "test")
        with evaluating(self.model):
            lists = topk_lists(self.model, self._graphs(prep.data), split, self.ranking, self._negatives_key())
        return save_topk(Path(folder) / TOPK_FILE, lists)

    def _track_best(self, round_idx: int, metrics: dict[str, float]) -> None:
        for name, v in metrics.items():
            if not name.startswith(("test_", "val_")) or math.isnan(v):
                continue
            better = (lambda a, b: a > b) if higher_is_better(name) else (lambda a, b: a < b)
            if name not in self.best or better(v, self.best[name][0]):
                self.best[name] = (v, round_idx)

    # ------------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "model": {k: v.clone() for k, v in self.model.state_dict().items()},
            **self.strategy.state_dict(),
            "privacy": None if self.privacy is None else self.privacy.state_dict(),
            "ledger": {k: v.clone() for k, v in self.channel.ledger.state_dict().items()},
            "best": dict(self.best),
            "selection": self.selection.state_dict(),
            "latest": dict(self.latest),
            "used": dict(self.used),
            **({} if self.expansion is None else {"expansion": self.expansion.state_dict()}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.strategy.load_state_dict(self.model, state)
        if (state["privacy"] is None) != (self.privacy is None):
            raise ConfigError("cannot resume: the checkpoint's privacy setting differs from this run's")
        if self.privacy is not None:
            self.privacy.load_state_dict(state["privacy"])
        self.channel.ledger.load_state_dict(state["ledger"])
        self.best = dict(state["best"])
        if "selection" in state:  # checkpoints before validation selection have none
            self.selection.load_state_dict(state["selection"])
        self.latest = dict(state["latest"])
        self.used = dict(state["used"])
        if self.expansion is not None:
            if "expansion" not in state:
                raise ConfigError("cannot resume: the checkpoint was written without task.expansion, this run has it")
            self.expansion.load_state_dict(state["expansion"])

    def summary(self) -> dict[str, Any]:
        """The run's final results; with ``task.eval.save_topk`` it also writes :data:`TOPK_FILE` into the run
        folder (rank 0), the lists of the last round's ranking."""
        trainer = self.trainer
        if self.ranking.save_topk and trainer is not None and trainer.root is not None and trainer.is_global_zero \
                and trainer.round > 0:
            self.write_topk(trainer.root, trainer.round - 1)
        out: dict[str, Any] = {"dataset": self.data.name, "model": type(self.model).__name__,
                               "aggregator": type(self.aggregator).__name__, "clients": self.data.num_clients,
                               "objective": self.objective, "federated": self.federated}
        if self.implicit:
            out.update({"positives": self.data.positives, "split": self.data.split})
        else:
            out["rating_scale"] = self.data.scale
        if self.ranking.ranking != "none":
            out["ranking"] = self.ranking.ranking
        if self.server is not None:
            out["server_optimizer"] = type(self.server).__name__
        if self.expansion is not None:
            out.update(self.expansion.summary())
        if self.side_graphs is not None:
            out.update(self.side_graphs.summary())
        if self.attack is not None:
            out.update(self.attack.summary())
        for name in sorted(self.latest):
            if name.startswith(("test_", "val_")):
                out[f"final_{name}"] = self.latest[name]
        for name, (v, r) in sorted(self.best.items()):
            out[f"best_{name}"] = v
            out[f"best_{name}_round"] = r
        out.update(self.selection.summary())
        s = self.strategy
        out.update({"participation": s.participation, "local_steps": s.local_steps,
                    "sample_rate": s.sampling_rate(self.data.num_clients),
                    "clients_per_round_mean": self.used["clients"] / max(self.used["rounds"], 1)})
        if self.privacy is None:
            out.update({"privacy": "none", "epsilon_spent": None, "delta": None, "noise_multiplier": None})
        else:
            privacy = self.privacy.summary()
            out.update(privacy)
            out.setdefault("noise_multiplier", privacy.get("mean_noise_multiplier"))
        out.update({k: int(v.sum()) for k, v in self.channel.ledger.totals().items()})
        out.update({"comm_upload_scalars_used": self.used["scalars"],
                    "comm_upload_messages_used": self.used["messages"]})
        return out


def _check_item_solve(user_solve: bool, pseudo_items: int, aggregator: Aggregator, privacy: ClientDP | None,
                      server: ServerOptimizer | None, attack: Attack | None, expansion: GraphExpansion | None) -> None:
    """Refuse ``task.item_solve`` where its step is not defined: without the clients' user solves (its residuals
    are taken at solved rows), with pseudo items (they would count as ratings), another rule than FedSGD's plain
    sum, client-placed noise (each client's noise would not be one draw on the sums), a server optimiser, attacks or
    graph expansion."""
    plain_sum = type(aggregator) is FedSGD and aggregator.reduce == "sum" and aggregator.weighting == "uniform"
    needs = [("task.user_solve=true", user_solve), ("task.pseudo_items=0", pseudo_items == 0),
             ("aggregator=fedsgd aggregator.weighting=uniform aggregator.reduce=sum", plain_sum),
             ("privacy.placement=server (or privacy=none)", privacy is None or privacy.placement == "server"),
             ("server=none", server is None), ("attack=none", attack is None),
             ("task.expansion.neighbours=0", expansion is None)]
    missing = [name for name, ok in needs if not ok]
    if missing:
        raise ConfigError(f"task.item_solve: the server's item solve needs {', '.join(missing)}")


def _check_user_solve(user_solve: Any, model: FederatedRecommender, objective: str, local_steps: int,
                      weight_decay: float, side_graphs: SideGraphs | None) -> bool:
    """``task.user_solve`` as a bool, refused where the closed form is not the clients' optimum: another model or
    head or loss, local steps (which would move the rows again), no L2 (a user with fewer ratings than a row's width
    has no unique solution) or the side graphs' term on user rows."""
    if not isinstance(user_solve, bool):
        raise ConfigError(f"task.user_solve must be true or false, got {user_solve!r}")
    if not user_solve:
        return False
    if not (isinstance(model, MatrixFactorization) and model.head == "linear" and objective == "sse"):
        raise ConfigError("task.user_solve=true solves matrix factorisation's user rows on the summed squared error: "
                          "it needs model=mf, +model.head=linear and task.objective=sse")
    if local_steps > 1:
        raise ConfigError(f"task.user_solve=true replaces the user rows' gradient steps, and the clients take "
                          f"{local_steps} local steps: use aggregator=fedsgd (one step)")
    if not weight_decay > 0:
        raise ConfigError("task.user_solve=true needs task.weight_decay > 0 (the ridge of the users' solves)")
    if side_graphs is not None:
        raise ConfigError("task.user_solve=true takes no task.side_graphs (their term acts on user rows' gradient "
                          "steps)")
    return True

"""Round-based federated recommendation with client-level DP (the DPFR of BGTplanner spec §1.3).

:class:`FedRecTask` sequences one round ``t`` (paper Fig. 1, steps ①–⑤); each concern is a module of
:mod:`fedrec.recsys`:

1. the clients that hold training ratings (initial half plus the stream so far) group them
   (:mod:`~fedrec.recsys.data`), sample pseudo items and announce their item ids X^t
   (:mod:`~fedrec.recsys.upload`, :meth:`FedRecTask.upload_items`);
2. each client gets the round's budget, set by a callback through :meth:`FedRecTask.set_round_budget` (the
   planner hook) or else the uniform split; clients it would take past their total sit the round out
   (:mod:`~fedrec.recsys.privatize`);
3. all clients compute their updates together (:mod:`~fedrec.recsys.local`), clip and noise ω and their real
   item rows (:mod:`~fedrec.recsys.privatize`), append FedGNN's synthesised pseudo rows and shuffle their rows
   (:mod:`~fedrec.recsys.upload`), so that neither position nor order tells real items from pseudo ones; user rows
   stay on the client;
   Under an attack, the malicious clients transform their uploads (:mod:`~fedrec.recsys.attack`);
4. the channel counts the uploads, the aggregator combines them (:mod:`~fedrec.recsys.aggregate`), the server
   optimiser steps and broadcasts, and the clients update their own user rows (:mod:`~fedrec.recsys.server`);
5. the model is evaluated on the test (and validation) ratings (:mod:`~fedrec.recsys.evaluate`), and under an
   attack on the benign users alone, with the target item's exposure.

Randomness is counter based (seed, component, round), so a resumed run repeats the uninterrupted one exactly;
with ``privacy.rng=secure`` the draws that protect clients (pseudo items, DP noise, pseudo rows, upload order)
come from the operating system's cryptographic source instead (:meth:`ClientDP.draw_key`).

Metrics computed centrally from clients' raw data without noise (the training loss, test and validation metrics)
are flagged by :meth:`FedRecTask.is_private_metric`, so the CLI can keep them out of the logs
(``logger.private_metrics=false``); callbacks such as planners still receive them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrec.aggregation import ServerOptimizer
from fedrec.data.ratings import RatingData, Ratings
from fedrec.errors import ConfigError, check_float, check_int
from fedrec.federation.channel import Channel
from fedrec.federation.collective import Collective
from fedrec.models.recommender import FederatedRecommender
from fedrec.privacy.client_dp import ClientDP
from fedrec.recsys.aggregate import AggregateSums, Aggregator, Uploads
from fedrec.recsys.attack import Attack
from fedrec.recsys.data import RoundData, round_data, shard, shard_bounds
from fedrec.recsys.evaluate import benign_test_rmse, evaluate, target_exposure
from fedrec.recsys.local import local_updates
from fedrec.recsys.privatize import privatize_uploads, record_round, round_budget, round_key
from fedrec.recsys.server import AdaptiveServerStep, ServerStep, UserStep
from fedrec.recsys.upload import assemble_uploads, sample_pseudo_items, upload_matrix, upload_scalars
from fedrec.tasks.base import FederatedTask

#: prefixes of the per-round metrics computed from clients' raw ratings without noise
PRIVATE_METRIC_PREFIXES = ("train_", "test_", "val_")


@dataclass
class _Prepared:
    """A round's training data of every client holding ratings, and its pseudo items (before the budget step)."""

    training: Ratings
    data: RoundData
    pseudo: Tensor  # (C, M) item ids
    pseudo_valid: Tensor  # (C, M)


class FedRecTask(FederatedTask):
    """Federated rating prediction driven by :class:`~fedrec.trainer.FederatedTrainer`.

    Args:
        data: the split ratings (:func:`fedrec.data.load_ratings`); ``data.rounds`` must equal ``rounds``.
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
        attack: malicious clients (:mod:`fedrec.recsys.attack`), or None.
    """

    kind = "recommendation"
    #: the privacy mechanisms its clients apply (client-level DP); the builder refuses the others
    privacy_mechanisms: tuple[type, ...] = (ClientDP,)

    #: a run of several processes shards the clients (``trainer.devices``)
    supports_sharding = True

    def __init__(
        self,
        data: RatingData,
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
        attack: Attack | None = None,
    ) -> None:
        self.num_rounds = check_int("task.rounds", rounds)
        if data.rounds != self.num_rounds:
            raise ConfigError(f"task.rounds ({self.num_rounds}) must equal the rounds the data stream is spread "
                              f"over ({data.rounds})")
        if model.num_users != data.num_users or model.num_items != data.num_items:
            raise ConfigError(f"model is sized for {model.num_users} users and {model.num_items} items, the data "
                              f"has {data.num_users} and {data.num_items}")
        aggregator.validate(data.num_clients)
        self.server_step = ServerStep(optimizer, lr, weight_decay, optimizer_state) if server is None else \
            AdaptiveServerStep(server, aggregator.local_lr)
        self.user_step = UserStep(optimizer, lr, weight_decay, optimizer_state)
        if privacy is not None:
            if privacy.accountant.num_clients != data.num_clients:
                raise ConfigError(f"privacy is set up for {privacy.accountant.num_clients} clients, the data has "
                                  f"{data.num_clients}")
            if aggregator.weighting == "ratings":  # the server sees only each client's set of uploaded item ids
                raise ConfigError("aggregator.weighting=ratings weights by the clients' private rating counts, "
                                  "which DP does not cover: use uploaded_items or uniform with privacy on")
        self.data, self.model, self.aggregator, self.privacy = data, model, aggregator, privacy
        self.pseudo_items = check_int("task.pseudo_items", pseudo_items, minimum=0)
        self.prox_mu = check_float("task.prox_mu", prox_mu, low=0.0)
        self.seed = int(seed)
        self.server, self.attack = server, attack
        if attack is not None:
            attack.setup(data, self.seed)
        self.channel = Channel(endpoints={"client": data.num_clients, "server": 1}, bytes_per_scalar=4)
        self.trainer: Any = None
        self.last_uploads: Uploads | None = None
        self.best: dict[str, tuple[float, int]] = {}
        self.latest: dict[str, float] = {}
        self._budget: Tensor | None = None
        self._prepared: dict[int, _Prepared] = {}
        self.collective = Collective()  # the trainer's, once set up (several processes shard the clients)

    # ------------------------------------------------------------------------------------------------ hooks
    def setup(self, trainer: Any) -> None:
        self.trainer = trainer
        self.collective = getattr(trainer, "collective", None) or Collective()
        self.model.to(self.collective.device)  # the trainer's accelerator; round data is moved where it is used
        if self.collective.world_size > 1 and type(self.aggregator).__call__ is not Aggregator.__call__:
            raise ConfigError(f"trainer.devices={self.collective.world_size}: {type(self.aggregator).__name__} "
                              "combines uploads in its own __call__, which cannot be summed over processes; run it "
                              "in one process or implement Aggregator.partial/finish")
        if self.collective.world_size > 1 and self.attack is not None:
            raise ConfigError(f"trainer.devices={self.collective.world_size}: attacks run in one process (attack="
                              f"{type(self.attack).__name__}); set trainer.devices=1")

    def set_round_budget(self, budget: float | Tensor) -> None:
        """Set the next round's per-client privacy budget in :attr:`ClientDP.budget_unit` (ε_t for Laplace, an RDP
        budget for Gaussian): a number or a ``(num_clients,)`` tensor. Call it from ``on_round_start``."""
        if self.privacy is None:
            raise ConfigError("set_round_budget needs privacy=gaussian or privacy=laplace (privacy is none)")
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
        """``(num_clients,)`` bool: the clients with training ratings in round ``round_idx`` (who take part)."""
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
        d, pseudo, valid, budget = self._admit(round_idx, prep)  # ② the budget, and who can afford it
        metrics: dict[str, float] = {"clients": float(d.num_clients)}
        if d.num_clients == 0:  # every client's budget is spent: nothing more can run
            if self.trainer is not None:
                self.trainer.should_stop = True
            metrics["train_loss"] = math.nan
        else:
            metrics["train_loss"] = self._train(round_idx, d, pseudo, valid, budget)  # ③ and ④
        metrics.update(self.evaluate(prep))  # ⑤
        for name, value in metrics.items():
            self.latest[name] = value
        self._track_best(round_idx, metrics)
        if self.privacy is not None:
            metrics.update(self.privacy.round_metrics())
        metrics.update({k: float(v.sum()) for k, v in self.channel.ledger.totals().items()
                        if k in ("comm_upload_scalars", "comm_download_scalars", "comm_messages")})
        return metrics

    def _key(self, name: str, round_idx: int) -> int:
        return round_key(self.privacy, self.seed, name, round_idx, self.collective)

    def _bounds(self, d: RoundData) -> list[tuple[int, int]]:
        return shard_bounds(d, self.collective.world_size, self.pseudo_items)

    def _prepare(self, round_idx: int) -> _Prepared:
        """Step ①: the round's training data of every client holding ratings, and their pseudo items."""
        prep = self._prepared.get(round_idx)
        if prep is None:
            self._prepared = {}  # only the current round is ever needed again
            tr = self.data.training_until(round_idx)
            d = round_data(tr.user, tr.item, tr.rating, self.data.client_of_user, self.data.num_items)
            pseudo, valid = sample_pseudo_items(d, self.data.num_items, self.pseudo_items,
                                                self._key("pseudo_items", round_idx))
            prep = self._prepared[round_idx] = _Prepared(tr, d, pseudo, valid)
        return prep

    def _admit(self, round_idx: int, prep: _Prepared) -> tuple[RoundData, Tensor, Tensor, Tensor | None]:
        """Step ②: the round's budget; the data, pseudo items and per-client budgets of the clients it admits."""
        d = prep.data
        if self.privacy is None:
            return d, prep.pseudo, prep.pseudo_valid, None
        budget = round_budget(self.privacy, self._budget, self.data.num_clients, self.num_rounds)
        self._budget = None
        run = self.privacy.admissible(budget, self.clients_holding_data(round_idx))
        if not bool(run[d.clients].all()):
            keep = run[d.clients]
            tr = prep.training
            d = round_data(tr.user, tr.item, tr.rating, self.data.client_of_user, self.data.num_items, run.numpy())
            return d, prep.pseudo[keep], prep.pseudo_valid[keep], budget
        return d, prep.pseudo, prep.pseudo_valid, budget

    def _train(self, round_idx: int, full: RoundData, pseudo: Tensor, valid: Tensor, budget: Tensor | None) -> float:
        """Steps ③ and ④: this process computes, privatises and assembles its shard's uploads (every client, in a
        one-process run), the sums are added up over processes, and every process takes the same server and user
        steps, so all hold the same model."""
        model, k, I = self.model, self.model.embed_dim, self.data.num_items
        sizes = [p.numel() for p in model.shared_parameters().values()]
        privacy_key = self._key("privacy", round_idx) if self.privacy is not None else 0
        rows_key, order_key = self._key("pseudo_rows", round_idx), self._key("upload_order", round_idx)
        d, lo, hi = shard(full, self._bounds(full), self.collective.global_rank)
        device = model.user_emb.device
        user_grad = torch.zeros_like(model.user_emb.detach())
        loss_sum, finite = torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
        single = self.collective.world_size == 1
        if d.num_clients:
            # ③ local training, privatisation of ω and the real item rows, upload assembly
            upd = local_updates(model, d.to(device), self.aggregator.local_steps, self.aggregator.local_lr,
                                self.prox_mu)
            shared, rows = upd.flat_shared(), upd.rows
            finite[0] = float(bool(torch.isfinite(shared).all()) and bool(torch.isfinite(rows).all()))
            if finite[0] and self.privacy is not None:
                shared, rows = privatize_uploads(self.privacy, shared, sizes, rows, d.row_client.to(device),
                                                 budget[d.clients], d.clients, privacy_key)
            uploads = assemble_uploads(d, shared, rows, pseudo[lo:hi], valid[lo:hi], rows_key, order_key,
                                       private=self.privacy is not None)
            if self.attack is not None:  # one process: the shard is the whole round
                honest_rows = uploads.row_client
                uploads = self.attack(uploads, round_idx, model, d)
                extra_rows = torch.bincount(uploads.row_client, minlength=d.num_clients) - torch.bincount(
                    honest_rows, minlength=d.num_clients)
            self.last_uploads = uploads
            user_grad.index_put_((d.users,), upd.users)
            loss_sum[0] = upd.loss.double().sum()
        else:  # more processes than clients this round: this one contributes nothing
            uploads = None
        # ④ the channel counts every client's upload (its size is known to all processes), the aggregator combines
        scalars = upload_scalars(full, valid, sum(sizes), k)
        if self.attack is not None and uploads is not None:
            scalars = scalars + extra_rows * (k + 1)
        uploads = self.channel.send("upload", ("client", full.clients), ("server", 0), uploads, scalars)
        if not single:  # one process adds up the others' sums (any aggregator's own __call__ runs in one process)
            sums = self.aggregator.partial(uploads, I) if uploads is not None else AggregateSums.zeros(
                sum(sizes), I, k, device)
            self.collective.all_reduce([*sums.tensors(), user_grad, loss_sum, finite])
        if int(finite[0]) != self.collective.world_size:
            raise FloatingPointError(f"round {round_idx}: a client's update is not finite (training diverged; "
                                     f"try a smaller task.lr)")
        g_shared, items, g_items = self.aggregator(uploads) if single else self.aggregator.finish(
            sums, model.item_emb.dtype)
        if self.privacy is not None:
            record_round(self.privacy, budget, full, self.data.num_clients, len(sizes))
        self.server_step(model, g_shared, items, g_items)
        self.user_step(model, full.users, user_grad[full.users])
        broadcast = sum(sizes) + I * k
        self.channel.send("download", ("server", 0), ("client", full.clients), None, broadcast)
        return float(loss_sum[0]) / full.num_clients

    # ------------------------------------------------------------------------------------------------ metrics
    def evaluate(self, prep: _Prepared) -> dict[str, float]:
        """Step ⑤: test (and validation) metrics, users represented from the round's local graphs
        (:func:`fedrec.recsys.evaluate.evaluate`: each process scores its shard's users)."""
        metrics = evaluate(self.model, self.data, prep.data, self._bounds(prep.data), self.collective)
        if self.attack is not None:
            benign = self.attack.benign_users(self.data)
            metrics["test_benign_rmse"] = benign_test_rmse(self.model, self.data, prep.data, benign)
            if self.attack.target is not None:
                metrics["test_target_exposure"] = target_exposure(self.model, prep.data, self.attack.target,
                                                                  torch.from_numpy(np.flatnonzero(benign)))
        return metrics

    def _track_best(self, round_idx: int, metrics: dict[str, float]) -> None:
        for name, v in metrics.items():
            kind = name.rsplit("_", 1)[-1]
            if not name.startswith(("test_", "val_")) or math.isnan(v):
                continue
            better = (lambda a, b: a > b) if kind == "f1" else (lambda a, b: a < b)
            if name not in self.best or better(v, self.best[name][0]):
                self.best[name] = (v, round_idx)

    # ------------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "model": {k: v.clone() for k, v in self.model.state_dict().items()},
            "server_opt": self.server_step.state_dict(),
            "user_opt": self.user_step.state_dict(),
            "privacy": None if self.privacy is None else self.privacy.state_dict(),
            "ledger": {k: v.clone() for k, v in self.channel.ledger.state_dict().items()},
            "best": dict(self.best),
            "latest": dict(self.latest),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.server_step.load_state_dict(self.model, state["server_opt"])
        self.user_step.load_state_dict(self.model, state["user_opt"])
        if (state["privacy"] is None) != (self.privacy is None):
            raise ConfigError("cannot resume: the checkpoint's privacy setting differs from this run's")
        if self.privacy is not None:
            self.privacy.load_state_dict(state["privacy"])
        self.channel.ledger.load_state_dict(state["ledger"])
        self.best = dict(state["best"])
        self.latest = dict(state["latest"])

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"dataset": self.data.name, "rating_scale": self.data.scale,
                               "model": type(self.model).__name__, "aggregator": type(self.aggregator).__name__,
                               "clients": self.data.num_clients}
        if self.server is not None:
            out["server_optimizer"] = type(self.server).__name__
        if self.attack is not None:
            out.update(self.attack.summary())
        for name in sorted(self.latest):
            if name.startswith(("test_", "val_")):
                out[f"final_{name}"] = self.latest[name]
        for name, (v, r) in sorted(self.best.items()):
            out[f"best_{name}"] = v
            out[f"best_{name}_round"] = r
        if self.privacy is None:
            out.update({"privacy": "none", "epsilon_spent": None, "delta": None})
        else:
            out.update(self.privacy.summary())
        out.update({k: int(v.sum()) for k, v in self.channel.ledger.totals().items()})
        return out

"""Round-based federated recommendation with client-level DP (the DPFR of BGTplanner spec §1.3).

One round ``t`` (paper Fig. 1, steps ①–⑤):

1. the clients that hold training ratings (initial half plus the stream so far) sample pseudo items and announce
   their item ids X^t (:meth:`FedRecTask.upload_items`);
2. each client gets the round's budget, set by a callback through :meth:`FedRecTask.set_round_budget` (the
   planner hook) or else the uniform split; clients it would take past their total sit the round out;
3. all clients compute their updates together (:func:`fedrec.recsys.local.local_updates`), clip and noise
   ω and their real item rows (:class:`fedrec.privacy.ClientDP`), append FedGNN's synthesised pseudo rows and
   shuffle their rows (:func:`fedrec.recsys.upload.upload_order`), so that neither position nor order tells
   real items from pseudo ones; user rows stay on the client and are updated there;
4. the channel counts the uploads, the aggregator combines them, the server optimiser steps and broadcasts;
5. the model is evaluated on the test (and validation) ratings.

Randomness is counter based (seed, component, round), so a resumed run repeats the uninterrupted one exactly;
with ``privacy.rng=secure`` the draws that protect clients (pseudo items, DP noise, pseudo rows, upload order)
come from the operating system's cryptographic source instead (:meth:`ClientDP.generator`).

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

from fedrec.data.ratings import RatingData, Ratings
from fedrec.errors import ConfigError, check_float, check_int
from fedrec.federation.channel import Channel
from fedrec.federation.collective import Collective
from fedrec.metrics import metrics_from_sums, rating_sums
from fedrec.models.recommender import FederatedRecommender
from fedrec.privacy.client_dp import ClientDP
from fedrec.recsys.aggregate import AggregateSums, Aggregator, Uploads
from fedrec.recsys.data import RoundData, round_data
from fedrec.recsys.local import local_updates
from fedrec.recsys.upload import pseudo_item_rows, sample_pseudo_items, upload_item_ids, upload_order
from fedrec.rng import stream_key
from fedrec.tasks.base import FederatedTask

OPTIMIZERS = ("adam", "sgd")
OPTIMIZER_STATES = ("reset", "persistent")
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
        aggregator: how uploads are combined (FedSGD / FedAvg).
        privacy: client-level DP, or None for non-private training.
        rounds: T.
        pseudo_items: pseudo-interacted items per client per round (0 disables them).
        optimizer: server optimiser ``"adam"`` (Adam with L2 weight decay, the authors') or ``"sgd"``; clients
            update their own user rows with the same rule.
        lr, weight_decay: its step size and weight decay.
        optimizer_state: ``"reset"`` rebuilds the optimiser every round as the authors' code does (Adam's first
            step is then a sign-like step of size ``lr``); ``"persistent"`` keeps its moments across rounds.
        seed: the run seed.
    """

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
    ) -> None:
        self.num_rounds = check_int("task.rounds", rounds)
        if data.rounds != self.num_rounds:
            raise ConfigError(f"task.rounds ({self.num_rounds}) must equal the rounds the data stream is spread "
                              f"over ({data.rounds})")
        if model.num_users != data.num_users or model.num_items != data.num_items:
            raise ConfigError(f"model is sized for {model.num_users} users and {model.num_items} items, the data "
                              f"has {data.num_users} and {data.num_items}")
        if optimizer not in OPTIMIZERS:
            raise ConfigError(f"task.optimizer must be one of {list(OPTIMIZERS)}, got {optimizer!r}")
        if optimizer_state not in OPTIMIZER_STATES:
            raise ConfigError(f"task.optimizer_state must be one of {list(OPTIMIZER_STATES)}, got {optimizer_state!r}")
        if privacy is not None:
            if privacy.accountant.num_clients != data.num_clients:
                raise ConfigError(f"privacy is set up for {privacy.accountant.num_clients} clients, the data has "
                                  f"{data.num_clients}")
            if aggregator.weighting == "ratings":  # the server sees only each client's set of uploaded item ids
                raise ConfigError("aggregator.weighting=ratings weights by the clients' private rating counts, "
                                  "which DP does not cover: use uploaded_items or uniform with privacy on")
        self.data, self.model, self.aggregator, self.privacy = data, model, aggregator, privacy
        self.pseudo_items = check_int("task.pseudo_items", pseudo_items, minimum=0)
        self.optimizer_name, self.optimizer_state = optimizer, optimizer_state
        self.lr = check_float("task.lr", lr, low=0.0, low_open=True)
        self.weight_decay = check_float("task.weight_decay", weight_decay, low=0.0)
        self.seed = int(seed)
        self.channel = Channel(endpoints={"client": data.num_clients, "server": 1}, bytes_per_scalar=4)
        self.trainer: Any = None
        self.last_uploads: Uploads | None = None
        self.best: dict[str, tuple[float, int]] = {}
        self.latest: dict[str, float] = {}
        self._budget: Tensor | None = None
        self._prepared: dict[int, _Prepared] = {}
        self._server_opt: torch.optim.Optimizer | None = None
        self._user_opt: torch.optim.Optimizer | None = None
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
        import scipy.sparse as sp

        prep = self._prepare(round_idx)
        indptr, ids = upload_item_ids(prep.data, prep.pseudo, prep.pseudo_valid, self.data.num_clients)
        X = sp.csr_matrix((np.ones(len(ids)), ids, indptr), shape=(self.data.num_clients, self.data.num_items))
        X.has_sorted_indices = True
        return X

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
    def _key(self, name: str, round_idx: int) -> int:
        """The key of draw ``name`` in round ``round_idx`` (every client draws from its own stream under it):
        derived from the run seed, or the privacy setting's (``privacy.rng=secure``: fresh from the operating
        system's cryptographic source, rank 0's in a sharded run)."""
        if self.privacy is None:
            return int(stream_key(self.seed, name, round_idx))
        key = self.privacy.draw_key(self.seed, name, round_idx)
        return key if self.privacy.rng == "reproducible" else int(self.collective.broadcast(key))

    def _bounds(self, d: RoundData) -> list[tuple[int, int]]:
        """Each process's clients of ``d``: contiguous ranges of its clients with about equal work, counted as
        ratings (the local graphs) plus uploaded rows, real and pseudo."""
        world = self.collective.world_size
        if world == 1:
            return [(0, d.num_clients)]
        cum = torch.cumsum(d.ratings_per_client() + d.rows_per_client() + self.pseudo_items, 0)
        total = int(cum[-1]) if d.num_clients else 0
        cuts = [0, *(int(torch.searchsorted(cum, total * r // world)) for r in range(1, world)), d.num_clients]
        cuts = [min(max(c, lo), d.num_clients) for c, lo in zip(cuts, [0] + cuts[:-1])]
        return list(zip(cuts[:-1], cuts[1:]))

    def _shard(self, d: RoundData, bounds: list[tuple[int, int]] | None = None) -> tuple[RoundData, int, int]:
        """This process's part of ``d`` and its client range (of ``bounds``, default :meth:`_bounds`)."""
        lo, hi = (bounds or self._bounds(d))[self.collective.global_rank]
        return (d if (lo, hi) == (0, d.num_clients) else d.select(lo, hi)), lo, hi

    def _prepare(self, round_idx: int) -> _Prepared:
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
        """Apply the round's budget: the data, pseudo items and per-client budgets of the clients that take part."""
        d = prep.data
        if self.privacy is None:
            return d, prep.pseudo, prep.pseudo_valid, None
        budget = self._budget if self._budget is not None else torch.full(
            (self.data.num_clients,), self.privacy.uniform_budget(self.num_rounds), dtype=torch.float64)
        self._budget = None
        run = self.privacy.admissible(budget, self.clients_holding_data(round_idx))
        if not bool(run[d.clients].all()):
            keep = run[d.clients]
            tr = prep.training
            d = round_data(tr.user, tr.item, tr.rating, self.data.client_of_user, self.data.num_items, run.numpy())
            return d, prep.pseudo[keep], prep.pseudo_valid[keep], budget
        return d, prep.pseudo, prep.pseudo_valid, budget

    def run_round(self, round_idx: int) -> dict[str, float]:
        prep = self._prepare(round_idx)
        d, pseudo, valid, budget = self._admit(round_idx, prep)
        metrics: dict[str, float] = {"clients": float(d.num_clients)}
        if d.num_clients == 0:  # every client's budget is spent: nothing more can run
            if self.trainer is not None:
                self.trainer.should_stop = True
            metrics["train_loss"] = math.nan
        else:
            metrics["train_loss"] = self._train(round_idx, d, pseudo, valid, budget)
        metrics.update(self.evaluate(prep))
        for name, value in metrics.items():
            self.latest[name] = value
        self._track_best(round_idx, metrics)
        if self.privacy is not None:
            metrics.update(self.privacy.round_metrics())
        metrics.update({k: float(v.sum()) for k, v in self.channel.ledger.totals().items()
                        if k in ("comm_upload_scalars", "comm_download_scalars", "comm_messages")})
        return metrics

    def _train(self, round_idx: int, full: RoundData, pseudo: Tensor, valid: Tensor, budget: Tensor | None) -> float:
        """One round of training: this process computes and privatises its shard's uploads (every client, in a
        one-process run), the sums are added up over processes, and every process takes the same server and user
        steps, so all hold the same model."""
        model, k, I = self.model, self.model.embed_dim, self.data.num_items
        names = list(model.shared_parameters())
        sizes = [p.numel() for p in model.shared_parameters().values()]
        privacy_key = self._key("privacy", round_idx) if self.privacy is not None else 0
        rows_key, order_key = self._key("pseudo_rows", round_idx), self._key("upload_order", round_idx)
        d, lo, hi = self._shard(full)
        device = model.user_emb.device
        user_grad = torch.zeros_like(model.user_emb.detach())
        loss_sum, finite = torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64)
        single = self.collective.world_size == 1
        if d.num_clients:
            upd = local_updates(model, d.to(device), self.aggregator.local_steps, self.aggregator.local_lr)
            shared = torch.cat([upd.shared[n].reshape(d.num_clients, -1) for n in names], 1) if names \
                else torch.zeros(d.num_clients, 0, device=device)
            rows = upd.rows
            finite[0] = float(bool(torch.isfinite(shared).all()) and bool(torch.isfinite(rows).all()))
            if finite[0] and self.privacy is not None:
                shared, rows = self.privacy.privatize(shared, sizes, rows, d.row_client.to(device),
                                                      budget[d.clients], d.clients, privacy_key)
            uploads = self._uploads(d, shared, rows, pseudo[lo:hi], valid[lo:hi], rows_key, order_key)
            self.last_uploads = uploads
            user_grad.index_put_((d.users,), upd.users)
            loss_sum[0] = upd.loss.double().sum()
        else:  # more processes than clients this round: this one contributes nothing
            uploads = None
        # every client's upload size, known to all processes: ω, and its real and pseudo rows with their item ids
        real_rows = full.rows_per_client()
        per_client = sum(sizes) + (real_rows + valid.sum(1)) * (k + 1)
        uploads = self.channel.send("upload", ("client", full.clients), ("server", 0), uploads, per_client)
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
            run = torch.zeros(self.data.num_clients, dtype=torch.bool)
            run[full.clients] = True
            tensors = torch.zeros(self.data.num_clients, dtype=torch.long)  # noised tensors per client
            tensors[full.clients] = len(sizes) + real_rows
            self.privacy.record(budget, run, tensors)
        self._server_step(names, g_shared, items, g_items)
        self._user_step(full.users, user_grad[full.users])
        broadcast = sum(sizes) + I * k
        self.channel.send("download", ("server", 0), ("client", full.clients), None, broadcast)
        return float(loss_sum[0]) / full.num_clients

    def _uploads(self, d: RoundData, shared: Tensor, rows: Tensor, pseudo: Tensor, valid: Tensor, rows_key: int,
                 order_key: int) -> Uploads:
        """What the clients of ``d`` send: ω, and their real item rows with FedGNN's synthesised pseudo rows
        appended and every client's rows shuffled (so real rows are not told apart by position)."""
        fake = pseudo_item_rows(rows.detach(), d.row_client, d.clients, valid, rows_key)
        pc = torch.arange(d.num_clients).unsqueeze(1).expand_as(pseudo)[valid]
        row_client = torch.cat([d.row_client, pc])
        order = upload_order(row_client, d.clients, order_key)
        return Uploads(
            clients=d.clients,
            shared=shared,
            row_client=row_client[order],
            row_item=torch.cat([d.row_item, pseudo[valid]])[order],
            rows=torch.cat([rows, fake[valid]])[order],
            num_ratings=d.ratings_per_client() if self.privacy is None else None,  # private under DP
        )

    def _optimizer(self, params: list[Tensor], existing: torch.optim.Optimizer | None) -> torch.optim.Optimizer:
        if existing is not None and self.optimizer_state == "persistent":
            return existing
        cls = torch.optim.Adam if self.optimizer_name == "adam" else torch.optim.SGD
        return cls(params, lr=self.lr, weight_decay=self.weight_decay)

    def _server_step(self, names: list[str], g_shared: Tensor, items: Tensor, g_items: Tensor) -> None:
        """The server optimiser on ω and the item table (every row: rows not in X^t get a zero gradient and only
        weight decay, as in the authors' code)."""
        params = self.model.shared_parameters()
        offset = 0
        for n in names:
            p = params[n]
            p.grad = g_shared[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        table = self.model.item_emb
        table.grad = torch.zeros_like(table).index_put_((items,), g_items)
        self._server_opt = self._optimizer([*params.values(), table], self._server_opt)
        self._server_opt.step()
        self._server_opt.zero_grad(set_to_none=True)

    def _user_step(self, users: Tensor, grads: Tensor) -> None:
        """Each participating client updates its own user rows with the same rule (elementwise, so one optimiser
        over the table computes every client's step at once); rows of other users are left untouched."""
        table = self.model.user_emb
        keep = torch.ones(table.shape[0], dtype=torch.bool)
        keep[users] = False
        before = table.detach()[keep].clone()
        table.grad = torch.zeros_like(table).index_put_((users,), grads)
        self._user_opt = self._optimizer([table], self._user_opt)
        saved = {k: v[keep].clone() for k, v in self._user_opt.state.get(table, {}).items() if v.dim() == 2}
        self._user_opt.step()
        self._user_opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            table[keep] = before
            for k, v in saved.items():
                self._user_opt.state[table][k][keep] = v

    # ------------------------------------------------------------------------------------------------ metrics
    @torch.no_grad()
    def predict(self, prep: _Prepared, user: np.ndarray, item: np.ndarray, data: RoundData | None = None) -> Tensor:
        """Predicted ratings of (user, item) pairs, each user represented from its current local graph (that of
        ``data``, a shard of the round's, if given: enough for its clients' users and those without ratings)."""
        m = self.model
        d = (prep.data if data is None else data).to(m.user_emb.device)
        h = m.represent(m.shared_parameters(), m.user_emb, m.item_emb[d.row_item][d.entry_row], d.users[d.entry_user])
        u, i = torch.from_numpy(np.asarray(user)), torch.from_numpy(np.asarray(item))
        return torch.sigmoid((h[u] * m.item_emb[i]).sum(-1))

    def evaluate(self, prep: _Prepared) -> dict[str, float]:
        """Test (and validation) metrics: each process scores the ratings of its shard's users (rank 0 also those
        of clients without training ratings) and the metrics' sums are added up over processes."""
        splits = [(name, r) for name, r in (("test", self.data.test), ("val", self.data.val)) if len(r)]
        bounds = self._bounds(prep.data)
        shard = self._shard(prep.data, bounds)[0]
        owner = np.zeros(self.data.num_clients, dtype=np.int64)  # the rank scoring each client's users
        for rank, (a, b) in enumerate(bounds):
            owner[prep.data.clients[a:b].numpy()] = rank
        sums = []
        for _, r in splits:
            mine = owner[self.data.client_of_user[r.user]] == self.collective.global_rank
            pred = self.predict(prep, r.user[mine], r.item[mine], shard)
            sums.append(rating_sums(pred, torch.from_numpy(r.rating[mine])))
        self.collective.all_reduce(sums)
        return {f"{name}_{metric}": v for (name, _), total in zip(splits, sums)
                for metric, v in metrics_from_sums(total).items()}

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
            "server_opt": None if self._server_opt is None else self._server_opt.state_dict(),
            "user_opt": None if self._user_opt is None else self._user_opt.state_dict(),
            "privacy": None if self.privacy is None else self.privacy.state_dict(),
            "ledger": {k: v.clone() for k, v in self.channel.ledger.state_dict().items()},
            "best": dict(self.best),
            "latest": dict(self.latest),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        if self.optimizer_state == "persistent":
            for key, attr, params in (("server_opt", "_server_opt", [*self.model.shared_parameters().values(),
                                                                    self.model.item_emb]),
                                      ("user_opt", "_user_opt", [self.model.user_emb])):
                if state[key] is not None:
                    opt = self._optimizer(params, None)
                    opt.load_state_dict(state[key])
                    setattr(self, attr, opt)
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

"""The recommendation task on implicit feedback (issue 27): BPR/BCE rounds, ranking metrics beside RMSE, the central
baseline (task.federated=false), resume, topk.npz."""
from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedrec.app.cli import run
from fedrec.app.sweeps import headline
from fedrec.data import load_implicit, load_ratings
from fedrec.data.implicit import ImplicitData, sample_negatives
from fedrec.errors import ConfigError
from fedrec.models import LightGCN, MatrixFactorization
from fedrec.privacy import ClientDP
from fedrec.recsys.ranking import UserItems, load_topk, split_popularity
from fedrec.tasks.recommendation import higher_is_better
from fedrec.trainer import FederatedTrainer
from tests import helpers
from tests.helpers import read_csv

CHEAP = ("plots=false", "logger.tensorboard=false")
#: this module's tasks: matrix factorisation, three rounds, no pseudo items unless they say otherwise
make_task = functools.partial(helpers.make_task, model_cls=MatrixFactorization, rounds=3, pseudo_items=0, seed=5)


@pytest.fixture(scope="module")
def ml100k(data_dir: Path) -> ImplicitData:
    return load_implicit("ml-100k", data_dir)


def pairs_of(items: UserItems) -> set[tuple[int, int]]:
    users = items.users_with_items()
    row, item = items.entries(users)
    return set(zip(users[row].tolist(), item.tolist()))


@pytest.mark.parametrize("num_clients", [None, 50])
def test_bpr_negatives_of_the_round_never_hit_a_training_positive(data_dir: Path, num_clients: int | None) -> None:
    """Every sampled negative of a round (also with several users per client, whose rows the client shares) is an
    item its user has no training positive of; each training positive gets train_negatives of them, and each is a
    row of the same client's upload."""
    data = load_implicit("ml-100k", data_dir, num_clients=num_clients)
    task = make_task(data, train_negatives=2)
    train = {(int(u), int(i)) for u, i in zip(*data.train.pairs())}
    for r in (0, 1):
        d = task._prepare(r).data
        user = d.users[d.entry_user[d.pair_entry]].numpy()
        item = d.row_item[d.pair_row].numpy()
        assert len(user) == 2 * len(train)
        assert not {(int(u), int(i)) for u, i in zip(user, item)} & train
        assert torch.equal(d.row_client[d.pair_row], d.entry_client[d.pair_entry])
        assert torch.equal(torch.bincount(d.pair_entry), torch.full((len(train),), 2))
        positives = {(int(u), int(i)) for u, i in zip(d.users[d.entry_user].numpy(), d.row_item[d.entry_row].numpy())}
        assert positives == train


def test_bpr_and_bce_losses_match_a_per_pair_loop(data_dir: Path) -> None:
    """The round's training loss (the clients' mean loss) against the definitions, pair by pair, for MF."""
    data = load_implicit("ml-100k", data_dir, num_clients=7)
    for objective in ("bpr", "bce"):
        task = make_task(data, objective=objective, train_negatives=2)
        P, Q = task.model.user_emb.detach().double(), task.model.item_emb.detach().double()
        t = sample_negatives(data, np.arange(7), 0, task.seed, 2)
        per_client: dict[int, list[float]] = {}
        for u, i, js in zip(t.user, t.positive, t.negative):
            c = int(data.client_of_user[u])
            s_i = float(P[u] @ Q[i])
            for j in js:
                s_j = float(P[u] @ Q[j])
                if objective == "bpr":
                    per_client.setdefault(c, []).append(-math.log(1 / (1 + math.exp(-(s_i - s_j)))))
                else:
                    per_client.setdefault(c, []).append(math.log1p(math.exp(s_j)))
            if objective == "bce":
                per_client[c].append(math.log1p(math.exp(-s_i)))
        want = np.mean([np.mean(v) for v in per_client.values()])
        got = task.run_round(0)["train_loss"]
        assert got == pytest.approx(want, rel=1e-5)


def test_one_client_holding_all_data_is_the_central_model_and_a_plain_adam_loop(data_dir: Path) -> None:
    """task.federated=false (per-user clients merged into one party, no pseudo items) trains exactly the model a
    federated run trains when its data has one client, and both equal central BPR training written out by hand:
    Adam with L2 weight decay on the mean BPR loss over all training triples of the round."""
    rounds, lr, wd = 3, 0.05, 1e-4
    central = make_task(load_implicit("ml-100k", data_dir), rounds=rounds, federated=False, pseudo_items=50,
                        lr=lr, weight_decay=wd)
    one = make_task(load_implicit("ml-100k", data_dir, num_clients=1), rounds=rounds, lr=lr, weight_decay=wd)
    FederatedTrainer(enable_progress_bar=False).fit(central)
    FederatedTrainer(enable_progress_bar=False).fit(one)
    for a, b in zip(central.model.parameters(), one.model.parameters()):
        assert torch.equal(a, b)
    assert central.summary()["clients"] == 1 and not central.summary()["federated"]

    data = load_implicit("ml-100k", data_dir)
    torch.manual_seed(0)
    ref = MatrixFactorization(data.num_users, data.num_items, 4)
    opt_items = torch.optim.Adam([ref.item_emb], lr=lr, weight_decay=wd)
    opt_users = torch.optim.Adam([ref.user_emb], lr=lr, weight_decay=wd)
    for r in range(rounds):
        t = sample_negatives(data, np.arange(data.num_clients), r, 5)
        u, i, j = (torch.from_numpy(v) for v in (t.user, t.positive, t.negative[:, 0]))
        P, Q = ref.user_emb, ref.item_emb
        loss = -torch.nn.functional.logsigmoid((P[u] * Q[i]).sum(1) - (P[u] * Q[j]).sum(1)).mean()
        loss.backward()
        opt_items.step()
        opt_users.step()
        opt_items.zero_grad()
        opt_users.zero_grad()
    for a, b in zip(central.model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_central_baseline_refuses_privacy_and_bad_objectives(data_dir: Path, ml100k: ImplicitData) -> None:
    with pytest.raises(ConfigError, match="task.federated=false"):
        make_task(ml100k, federated=False, privacy=ClientDP(ml100k.num_clients, "gaussian", epsilon=10.0,
                                                           delta=1e-5))
    with pytest.raises(ConfigError, match="task.objective=rmse"):
        make_task(ml100k, objective="rmse")
    ratings = load_ratings("ml-100k", data_dir, rounds=3)
    with pytest.raises(ConfigError, match="task.objective=bpr"):
        make_task(ratings, objective="bpr")
    with pytest.raises(ConfigError, match="task.eval.ranking"):
        make_task(ml100k, eval={"ranking": "partial"})
    with pytest.raises(ConfigError, match="task.eval.ks"):
        make_task(ml100k, eval={"ks": [0]})


def popularity_hr10(data: ImplicitData) -> float:
    """HR@10 of ranking every user's candidates by the items' training popularity (full ranking)."""
    return split_popularity(data, 10)["hr@10"]


@pytest.mark.slow
@pytest.mark.parametrize("model_cls, embed_dim, lr, rounds", [(LightGCN, 16, 0.1, 50)])
def test_central_training_reduces_the_loss_and_beats_popularity(ml100k: ImplicitData, model_cls, embed_dim: int,
                                                               lr: float, rounds: int) -> None:
    """Central BPR training on ML-100K (every interaction positive, leave-one-out, full ranking): the loss falls and
    the final test HR@10 beats ranking by popularity. NeuMF is not listed: in 40-60 central rounds (BPR at lr 0.05,
    0.1 or 0.2; BCE with 4 negatives) its HR@10 stayed at 0.040-0.046, below popularity's 0.050."""
    task = make_task(ml100k, model_cls=model_cls, embed_dim=embed_dim, rounds=rounds, federated=False, lr=lr,
                     eval={"ks": [10]})
    history = FederatedTrainer(enable_progress_bar=False).fit(task)
    assert history[-1]["train_loss"] < 0.5 * history[0]["train_loss"]
    assert history[-1]["test_hr@10"] > popularity_hr10(ml100k) > 0.04


def test_ranking_metrics_are_higher_is_better_and_the_error_metrics_lower() -> None:
    assert all(higher_is_better(n) for n in ("test_hr@10", "val_ndcg@20", "test_recall@5", "test_mrr", "test_f1"))
    assert not any(higher_is_better(n) for n in ("test_rmse", "val_mae", "test_benign_rmse"))


def test_implicit_run_logs_and_summarises_ranking_metrics_and_topk_recomputes_them(compose_cfg, data_dir: Path,
                                                                                  tmp_path: Path) -> None:
    """An implicit-feedback run through the CLI: ranking metrics logged per round, final_* the last round's, best_*
    the best with the right direction, NDCG@10 the headline; topk.npz's lists give the final HR@10, NDCG@10 and
    Recall@20 again by a plain loop."""
    out = tmp_path / "run"
    summary = run(compose_cfg("+experiment=mf_ml100k_implicit", f"data_dir={data_dir}", "task.rounds=4",
                              "task.eval.save_topk=true", *CHEAP), output_dir=out)
    rows = read_csv(out / "metrics.csv")
    assert len(rows) == 4 and "test_rmse" not in rows[0]
    for name in ("test_hr@10", "test_ndcg@10", "test_recall@20", "test_mrr", "val_ndcg@10"):
        values = [float(r[name]) for r in rows]
        assert summary[f"final_{name}"] == values[-1]
        assert summary[f"best_{name}"] == max(values)
        assert summary[f"best_{name}_round"] == int(np.argmax(values))
    assert next(iter(headline(summary))) == "final_test_ndcg@10"
    assert json.loads((out / "summary.json").read_text()) == summary

    lists = load_topk(out / "topk.npz")
    data = load_implicit("ml-100k", data_dir)
    assert np.array_equal(lists.users, data.evaluated_users()) and lists.topk.shape == (len(lists.users), 20)
    assert np.array_equal(lists.heldout[:, 0], data.test.indices) and lists.heldout.shape[1] == 1
    hr = ndcg = recall20 = 0.0
    for top, (held,) in zip(lists.topk, lists.heldout):
        rank = list(top).index(held) + 1 if held in top else None
        hr += rank is not None and rank <= 10
        ndcg += 1 / math.log2(rank + 1) if rank is not None and rank <= 10 else 0.0
        recall20 += rank is not None
    n = len(lists.users)
    assert hr / n == pytest.approx(summary["final_test_hr@10"], abs=1e-12)
    assert ndcg / n == pytest.approx(summary["final_test_ndcg@10"], abs=1e-12)
    assert recall20 / n == pytest.approx(summary["final_test_recall@20"], abs=1e-12)


def test_private_implicit_run_resumed_matches_the_uninterrupted_one(compose_cfg, data_dir: Path,
                                                                    tmp_path: Path) -> None:
    """Client DP, BPR negatives and pseudo items are keyed by round: a run interrupted after 2 of 4 rounds and
    resumed reports, logs and ranks (topk.npz) what the uninterrupted run does."""
    ov = ("+experiment=lightgcn_ml100k_implicit", f"data_dir={data_dir}", "task.rounds=4", "privacy=gaussian",
          "privacy.epsilon=10", "task.eval.save_topk=true", "task.eval.ranking=sampled", *CHEAP)
    full = run(compose_cfg(*ov), output_dir=tmp_path / "full")
    run(compose_cfg(*ov, "trainer.max_rounds=2"), output_dir=tmp_path / "part")
    resumed = run(compose_cfg(*ov, f"ckpt_path={tmp_path / 'part' / 'checkpoints' / 'last.ckpt'}"),
                  output_dir=tmp_path / "resumed")
    strip = lambda s: {k: v for k, v in s.items() if k != "wall_seconds"}
    assert strip(resumed) == strip(full) and full["privacy"] == "gaussian" and full["ranking"] == "sampled"
    assert read_csv(tmp_path / "resumed" / "metrics.csv") == read_csv(tmp_path / "full" / "metrics.csv")
    a, b = load_topk(tmp_path / "full" / "topk.npz"), load_topk(tmp_path / "resumed" / "topk.npz")
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_rating_run_ranks_its_held_out_ratings_without_changing_its_training(compose_cfg, data_dir: Path,
                                                                           tmp_path: Path) -> None:
    """task.eval.ranking=full on explicit ratings adds the ranking family beside RMSE (held out: every test rating)
    and changes nothing else the run computes."""
    ov = ("+experiment=mf_ml100k_robust", "attack=none", "aggregator=fedsgd", f"data_dir={data_dir}",
          "task.rounds=2", *CHEAP)
    plain = run(compose_cfg(*ov), output_dir=tmp_path / "plain")
    ranked = run(compose_cfg(*ov, "task.eval.ranking=full", "task.eval.save_topk=true"), output_dir=tmp_path / "ranked")
    same = lambda s: {k: v for k, v in s.items() if k in plain and k not in ("wall_seconds", "private_metrics")}
    assert same(ranked) == same(plain) and set(plain["private_metrics"]) < set(ranked["private_metrics"])
    assert next(iter(headline(ranked))) == "final_test_rmse"
    # HR@10 a second way: the share of test users with a held-out rating among the first ten items of topk.npz
    lists = load_topk(tmp_path / "ranked" / "topk.npz")
    hits = [np.isin(top[:10], held[held >= 0]).any() for top, held in zip(lists.topk, lists.heldout)]
    assert 0 < sum(hits) < len(hits) and ranked["final_test_hr@10"] == pytest.approx(np.mean(hits), rel=1e-12)

"""A round's grouping of the training ratings (:func:`fedrec.recsys.data.round_data`) is built once while no ratings
arrive and kept for the next rounds: the runs equal those that group every round afresh, and a stream regroups in
every round that brings ratings, merging the arrivals into the last round's sort order (:func:`entry_order`: the
order numpy's stable sort of the ratings by client, user and item gives, and a streamed or implicit-feedback run
equal to one that sorts afresh)."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import fedrec.tasks.recommendation as round_module
from fedrec.data.implicit import ImplicitData, Triples, load_implicit
from fedrec.data.ratings import RatingData
from fedrec.models import MatrixFactorization
from fedrec.privacy import ClientDP
from fedrec.recsys import FedSGD, Strategy
from fedrec.recsys.data import entry_order, round_data
from fedrec.tasks import FedRecTask
from tests.helpers import make_task, tiny_fixture, write_ml1m

ROUNDS = 4
whole = tiny_fixture(users=50, items=40, seed=5, rounds=ROUNDS, num_clients=9, stream=False)
streamed = tiny_fixture(users=50, items=40, seed=5, rounds=ROUNDS, num_clients=9)


@pytest.fixture(scope="module")
def implicit(tmp_path_factory: pytest.TempPathFactory) -> ImplicitData:
    folder = write_ml1m(tmp_path_factory.mktemp("ml1m"), users=50, items=40, seed=5)
    return load_implicit("ml-1m", folder, num_clients=9)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of groupings the task builds, counted as it calls :func:`round_data` (sampling's regrouping of
    the round's trained clients included)."""
    calls = [0]
    real = round_module.round_data

    def counted(*args: Any, **kw: Any) -> Any:
        calls[0] += 1
        return real(*args, **kw)

    monkeypatch.setattr(round_module, "round_data", counted)
    return calls


def _regrouped(task: FedRecTask, r: int) -> dict[str, float]:
    """Round ``r`` with the kept grouping forgotten first, so the round groups its ratings afresh."""
    task._prepared = {}
    return task.run_round(r)


CASES = {
    "fedgnn": lambda d: make_task(d),
    "mf_server_dp_sampled": lambda d: make_task(
        d, ClientDP(d.num_clients, "gaussian", epsilon=4.0, placement="server", adjacency="add_remove",
                    sensitivity_factor=1.0), FedSGD("uniform"), MatrixFactorization,
        strategy=Strategy(participation="poisson", sample_rate=0.6)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_run_without_arrivals_groups_once_and_equals_grouping_every_round(
        whole: RatingData, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kept, fresh = CASES[case](whole), CASES[case](whole)
    calls = _counting(monkeypatch)
    for r in range(ROUNDS):
        before = calls[0]
        got = kept.run_round(r)
        by_kept = calls[0] - before
        want = _regrouped(fresh, r)
        by_fresh = calls[0] - before - by_kept
        assert got == want, r
        # from round 1 the kept task skips the round's grouping (sampling still regroups the trained clients)
        assert by_kept == by_fresh - (r > 0), r
    for name, v in fresh.model.state_dict().items():
        assert torch.equal(kept.model.state_dict()[name], v), name


def test_a_streamed_run_regroups_in_every_round_that_brings_ratings(streamed: RatingData,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    task = make_task(streamed)
    for r in range(ROUNDS):
        before = calls[0]
        task.run_round(r)
        assert streamed.arrivals(r) > 0 or r == 0
        assert calls[0] - before == 1, r
    # and the kept grouping is the round's own: the last round's holds every training rating
    assert int(task._prepare(ROUNDS - 1).data.entry_rating.numel()) == len(streamed.training_until(ROUNDS - 1))


@given(seed=st.integers(0, 2**32 - 1), ratings=st.integers(0, 300), done=st.floats(0, 1),
       users=st.integers(1, 30), items=st.integers(1, 20), clients=st.integers(1, 8))
def test_merging_arrivals_into_an_earlier_order_gives_the_stable_sort_of_all(
        seed: int, ratings: int, done: float, users: int, items: int, clients: int) -> None:
    rng = np.random.default_rng(seed)
    user, item = rng.integers(0, users, ratings), rng.integers(0, items, ratings)  # repeated pairs too
    client_of_user = rng.integers(0, clients, users)
    want = np.lexsort((item, user, client_of_user[user]))  # numpy's stable sort by client, then user, then item
    first = int(done * ratings)
    earlier = entry_order(user[:first], item[:first], client_of_user, items)
    np.testing.assert_array_equal(entry_order(user, item, client_of_user, items), want)
    np.testing.assert_array_equal(entry_order(user, item, client_of_user, items, earlier), want)


@pytest.mark.parametrize("case", ["implicit", "streamed"])
def test_a_run_that_merges_into_the_last_order_equals_one_that_sorts_afresh(
        streamed: RatingData, implicit: ImplicitData, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    make = {"streamed": lambda: make_task(streamed),
            "implicit": lambda: make_task(implicit, rounds=ROUNDS, objective="bpr")}[case]
    merged, fresh = make(), make()
    sorts = [0]
    real = entry_order

    def counted(*args: Any, **kw: Any) -> Any:
        sorts[0] += kw.get("previous", args[4] if len(args) > 4 else None) is None
        return real(*args, **kw)

    monkeypatch.setattr(round_module, "entry_order", counted)
    for r in range(ROUNDS):
        assert merged.run_round(r) == _regrouped(fresh, r), r
    assert sorts[0] == 1 + ROUNDS  # the merged task sorted in round 0 only, the fresh one in every round
    for name, v in fresh.model.state_dict().items():
        assert torch.equal(merged.model.state_dict()[name], v), name


def grouped_by_hand(user: np.ndarray, item: np.ndarray, rating: np.ndarray, client_of_user: np.ndarray,
                    keep: np.ndarray | None, negatives: Triples | None) -> dict[str, list]:
    """:func:`round_data`'s arrays by a plain loop: the kept clients' ratings in the stable order of (client, user,
    item), the clients and users present by id, a client's rows its distinct items (its ratings' and its pairs')
    in increasing order, and each negative paired with the first entry of its (user, positive)."""
    entries = sorted((e for e in range(len(user)) if keep is None or keep[client_of_user[user[e]]]),
                     key=lambda e: (client_of_user[user[e]], user[e], item[e]))
    clients = sorted({int(client_of_user[user[e]]) for e in entries})
    users = sorted({int(user[e]) for e in entries})
    local = {c: n for n, c in enumerate(clients)}
    pairs = []  # (entry, negative item), by entry then as drawn
    for t in range(0 if negatives is None else len(negatives)):
        if keep is None or keep[client_of_user[negatives.user[t]]]:
            first = next(k for k, e in enumerate(entries)
                         if (user[e], item[e]) == (negatives.user[t], negatives.positive[t]))
            pairs += [(first, int(j)) for j in negatives.negative[t]]
    pairs.sort(key=lambda pair: pair[0])
    entry_client = [local[int(client_of_user[user[e]])] for e in entries]
    rows = sorted({(entry_client[k], int(item[e])) for k, e in enumerate(entries)}
                  | {(entry_client[k], j) for k, j in pairs})
    row = {r: n for n, r in enumerate(rows)}
    return {"clients": clients, "users": users,
            "user_client": [local[int(client_of_user[u])] for u in users],
            "entry_user": [users.index(int(user[e])) for e in entries],
            "entry_row": [row[entry_client[k], int(item[e])] for k, e in enumerate(entries)],
            "entry_rating": [float(np.float32(rating[e])) for e in entries],
            "row_client": [c for c, _ in rows], "row_item": [i for _, i in rows],
            "pair_entry": [k for k, _ in pairs], "pair_row": [row[entry_client[k], j] for k, j in pairs]}


@given(seed=st.integers(0, 2**32 - 1), ratings=st.integers(0, 120), users=st.integers(1, 12),
       items=st.sampled_from([1, 4, 15, 2_000]), clients=st.integers(1, 5), kept=st.booleans(), per=st.integers(0, 3),
       blocks=st.integers(1, 6))
def test_the_grouping_equals_a_plain_loop(seed: int, ratings: int, users: int, items: int, clients: int, kept: bool,
                                          per: int, blocks: int) -> None:
    """Clients of several users whose items interleave, repeated (user, item) pairs, dropped clients, negatives; a
    client's interleaved items ordered both ways, read off in item order where they are many of the catalogue (few
    items) and sorted where they are few (2,000 items); the ratings grouped in one block, or in several over threads
    (more blocks than clients too)."""
    rng = np.random.default_rng(seed)
    user, item = rng.integers(0, users, ratings), rng.integers(0, items, ratings)
    rating = rng.uniform(0, 1, ratings)
    client_of_user = rng.integers(0, clients, users)
    keep = rng.uniform(size=clients) < 0.7 if kept else None
    negatives = None
    if per:
        t = rng.integers(0, ratings, ratings // 2) if ratings else np.zeros(0, dtype=np.int64)
        negatives = Triples(user[t], item[t], rng.integers(0, items, (len(t), per)))
    got = round_data(user, item, rating, client_of_user, items, keep, negatives, blocks=blocks)
    for name, want in grouped_by_hand(user, item, rating, client_of_user, keep, negatives).items():
        assert getattr(got, name).tolist() == want, name

"""Ranking metrics (fedrec.recsys.ranking): against a plain per-user loop, hand-computed cases, ties, short candidate
lists, bad held-out items, sampled negatives, and topk.npz recomputed by other libraries (scikit-learn, PyG)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedrec.errors import ConfigError
from fedrec.recsys.ranking import (
    UserItems,
    check_ks,
    load_topk,
    metrics_from_ranking_sums,
    negatives_key,
    popularity_metrics,
    ranking_metric_names,
    ranking_metrics,
    ranking_sums,
    sample_negatives,
    save_topk,
    top_k,
)

# ---- an independent reference: one user at a time, Python's sort ---------------------------------------------


def reference_list(score: list[float], candidates: list[int], held: set[int]) -> list[int]:
    """A user's candidates best first: score descending (NaN as -inf), a held-out item after tied others, then id."""
    def key(i: int) -> tuple[float, bool, int]:
        s = -math.inf if math.isnan(score[i]) else score[i]
        return -s, i in held, i
    return sorted(candidates, key=key)


def reference_user(ranked: list[int], held: set[int], ks: list[int]) -> dict[str, float]:
    out = {}
    for k in ks:
        hits = sum(1 for i in ranked[:k] if i in held)
        out[f"hr@{k}"] = 1.0 if hits else 0.0
        out[f"recall@{k}"] = hits / len(held)
        dcg = sum(1 / math.log2(p + 2) for p, i in enumerate(ranked[:k]) if i in held)
        out[f"ndcg@{k}"] = dcg / sum(1 / math.log2(p + 2) for p in range(min(k, len(held))))
    out["mrr"] = 1 / (1 + min(ranked.index(i) for i in held))
    return out


def reference_metrics(lists: list[list[int]], held: list[set[int]], ks: list[int]) -> dict[str, float]:
    per_user = [reference_user(r, h, ks) for r, h in zip(lists, held)]
    return {name: sum(m[name] for m in per_user) / len(per_user) for name in per_user[0]}


def random_case(seed: int, num_users: int, num_items: int, tied: bool, dtype: torch.dtype):
    """Random training and held-out sets (each user holds out 1..all of its non-training items) and scores, ties
    frequent when ``tied``; the ranked users are a random subset in random order."""
    rng = np.random.default_rng(seed)
    train, held = [], []
    for _ in range(num_users):
        perm = rng.permutation(num_items)
        n_train = int(rng.integers(0, num_items))
        n_held = int(rng.integers(1, num_items - n_train + 1))
        train.append({int(i) for i in perm[:n_train]})
        held.append({int(i) for i in perm[n_train:n_train + n_held]})
    users = rng.permutation(num_users)[:int(rng.integers(1, num_users + 1))]
    raw = rng.integers(0, 3, (len(users), num_items)) if tied else rng.normal(size=(len(users), num_items))
    return users, train, held, torch.tensor(raw, dtype=dtype)


def as_user_items(sets: list[set[int]]) -> UserItems:
    pairs = [(u, i) for u, s in enumerate(sets) for i in s]
    return UserItems.from_pairs([u for u, _ in pairs], [i for _, i in pairs], len(sets))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), num_users=st.integers(1, 12), num_items=st.integers(1, 30), tied=st.booleans(),
       ks=st.lists(st.integers(1, 35), min_size=1, max_size=4), batch_size=st.integers(1, 8),
       double=st.booleans())
def test_full_ranking_equals_a_per_user_loop(seed, num_users, num_items, tied, ks, batch_size, double) -> None:
    users, train, held, scores = random_case(seed, num_users, num_items, tied,
                                             torch.float64 if double else torch.float32)
    lists = [reference_list(scores[r].tolist(), [i for i in range(num_items) if i not in train[u]], held[u])
             for r, u in enumerate(users)]
    got = ranking_metrics(scores, users, as_user_items(train), as_user_items(held), ks, batch_size=batch_size)
    want = reference_metrics(lists, [held[u] for u in users], sorted(set(ks)))
    assert got.keys() == want.keys()
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-12, abs=1e-15), name
    kmax = max(ks)
    topk = top_k(scores, users, as_user_items(train), as_user_items(held), kmax, batch_size=batch_size)
    assert topk.topk.tolist() == [r[:kmax] + [-1] * (kmax - len(r[:kmax])) for r in lists]
    assert topk.users.tolist() == users.tolist()
    assert [set(h[h >= 0].tolist()) for h in topk.heldout] == [held[u] for u in users]


@pytest.mark.parametrize("per_user", [1, 12])
def test_few_and_many_held_out_items_per_user_equal_the_loop(per_user) -> None:
    """Ranks come from comparisons with the whole row when users hold out few items (leave-one-out) and from sorted
    rows when they hold out more than log2(items) each: both against the loop, ties and -inf included."""
    rng = np.random.default_rng(per_user)
    num_users, num_items = 20, 24
    train_sets, held_sets = [], []
    for _ in range(num_users):
        perm = rng.permutation(num_items)
        train_sets.append(set(perm[:6].tolist()))
        held_sets.append(set(perm[6:6 + per_user].tolist()))
    scores = torch.tensor(rng.integers(0, 4, (num_users, num_items)), dtype=torch.float32)
    scores[scores == 0] = -math.inf
    users = np.arange(num_users)
    lists = [reference_list(scores[u].tolist(), [i for i in range(num_items) if i not in train_sets[u]],
                            held_sets[u]) for u in users]
    got = ranking_metrics(scores, users, as_user_items(train_sets), as_user_items(held_sets), [1, 5, 20])
    want = reference_metrics(lists, held_sets, [1, 5, 20])
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-12, abs=1e-15), name


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), num_users=st.integers(1, 10), num_items=st.integers(1, 40), tied=st.booleans(),
       count=st.integers(1, 12), batch_size=st.integers(1, 5))
def test_sampled_negatives_ranking_equals_a_per_user_loop(seed, num_users, num_items, tied, count,
                                                         batch_size) -> None:
    users, train, held, scores = random_case(seed, num_users, num_items, tied, torch.float32)
    tr, he = as_user_items(train), as_user_items(held)
    key = negatives_key(seed, 3)
    negatives, valid = sample_negatives(users, tr, he, num_items, key, count)
    lists = [reference_list(scores[r].tolist(), sorted(held[u] | set(negatives[r][valid[r]].tolist())), held[u])
             for r, u in enumerate(users)]
    got = ranking_metrics(scores, users, tr, he, [1, 3, 10], negatives=count, key=key, batch_size=batch_size)
    want = reference_metrics(lists, [held[u] for u in users], [1, 3, 10])
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-12, abs=1e-15), name
    topk = top_k(scores, users, tr, he, 10, negatives=count, key=key, batch_size=batch_size)
    assert topk.topk.tolist() == [r[:10] + [-1] * (10 - len(r[:10])) for r in lists]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), num_users=st.integers(2, 10), num_items=st.integers(2, 25),
       sampled=st.booleans())
def test_popularity_baseline_equals_a_per_user_loop(seed, num_users, num_items, sampled) -> None:
    """Ranking by training counts: every user's candidates (not its ``seen`` items) ordered by how many users trained
    on each item, ties by the rule; with sampled ranking the candidates are the held-out items and the same keyed
    negatives a run draws."""
    _, train, held, _ = random_case(seed, num_users, num_items, True, torch.float64)
    extra = np.random.default_rng(seed + 1).integers(0, num_items, num_users)  # a "validation" item, never ranked
    seen = [t | ({int(x)} - h) for t, h, x in zip(train, held, extra)]
    count = [sum(i in t for t in train) for i in range(num_items)]
    tr, sn, he = as_user_items(train), as_user_items(seen), as_user_items(held)
    ranked = he.users_with_items()
    key = negatives_key(seed, 0) if sampled else None
    if sampled:
        negatives, valid = sample_negatives(ranked, sn, he, num_items, key, 4)
        candidates = [sorted(held[u] | set(negatives[r][valid[r]].tolist())) for r, u in enumerate(ranked)]
    else:
        candidates = [[i for i in range(num_items) if i not in seen[u]] for u in ranked]
    lists = [reference_list([float(c) for c in count], cand, held[u]) for cand, u in zip(candidates, ranked)]
    got = popularity_metrics(tr, sn, he, num_items, [1, 5], negatives=4 if sampled else None, key=key)
    want = reference_metrics(lists, [held[u] for u in ranked], [1, 5])
    for name in want:
        assert got[name] == pytest.approx(want[name], rel=1e-12, abs=1e-15), name


# ---- hand-computed cases --------------------------------------------------------------------------------------


def one_user(train: list[int], held: list[int], num_users: int = 1) -> tuple[UserItems, UserItems]:
    return (UserItems.from_pairs([0] * len(train), train, num_users),
            UserItems.from_pairs([0] * len(held), held, num_users))


def test_hand_computed_two_held_out_items() -> None:
    # items 0..5 scored 0.9..0.4; item 1 is a training item: the list is 0, 2, 3, 4, 5, so held-out 3 and 5 are
    # at ranks 3 and 5
    train, held = one_user([1], [3, 5])
    scores = torch.tensor([[0.9, 0.8, 0.7, 0.6, 0.5, 0.4]])
    got = ranking_metrics(scores, [0], train, held, [1, 3, 5])
    idcg2 = 1 + 1 / math.log2(3)  # both held-out items first
    assert got == pytest.approx({
        "hr@1": 0.0, "hr@3": 1.0, "hr@5": 1.0,
        "ndcg@1": 0.0, "ndcg@3": (1 / 2) / idcg2, "ndcg@5": (1 / 2 + 1 / math.log2(6)) / idcg2,
        "recall@1": 0.0, "recall@3": 0.5, "recall@5": 1.0,
        "mrr": 1 / 3,
    }, rel=1e-12)
    assert top_k(scores, [0], train, held, 3).topk.tolist() == [[0, 2, 3]]


def test_ndcg_ideal_uses_at_most_k_held_out_items() -> None:
    # three held-out items ranked 1, 2, 3 among 4 candidates: NDCG@2 is 1 (the ideal holds 2 of them, not 3) while
    # recall@2 is 2/3 (over all held-out items)
    train, held = one_user([], [0, 1, 2])
    scores = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    got = ranking_metrics(scores, [0], train, held, [2, 3])
    assert got["ndcg@2"] == pytest.approx(1.0, rel=1e-12)
    assert got["recall@2"] == pytest.approx(2 / 3, rel=1e-12)
    assert got["ndcg@3"] == pytest.approx(1.0, rel=1e-12)
    assert got["mrr"] == 1.0


def test_ties_rank_held_out_items_after_the_others() -> None:
    # all scores equal, item 0 trained on: candidates 1..4, held-out 2 comes after 1, 3, 4: rank 4
    train, held = one_user([0], [2])
    got = ranking_metrics(torch.zeros(1, 5), [0], train, held, [1, 3, 4])
    assert got == pytest.approx({"hr@1": 0.0, "hr@3": 0.0, "hr@4": 1.0, "ndcg@1": 0.0, "ndcg@3": 0.0,
                                 "ndcg@4": 1 / math.log2(5), "recall@1": 0.0, "recall@3": 0.0, "recall@4": 1.0,
                                 "mrr": 1 / 4}, rel=1e-12)
    # item 1 scores highest; 0 (other), 2 and 3 (held out) tie below it, 4 is last: the list 1, 0, 2, 3, 4
    train, held = one_user([], [2, 3])
    scores = torch.tensor([[0.5, 0.9, 0.5, 0.5, 0.1]])
    assert top_k(scores, [0], train, held, 5).topk.tolist() == [[1, 0, 2, 3, 4]]
    assert ranking_metrics(scores, [0], train, held, [2])["mrr"] == 1 / 3


def test_constant_scores_never_hit() -> None:
    """A model scoring every item alike gets no hit for a user with at least K other candidates."""
    rng = np.random.default_rng(1)
    num_users, num_items = 50, 200
    train = UserItems.from_pairs(rng.integers(0, num_users, 2000), rng.integers(0, num_items, 2000), num_users)
    trained = np.zeros((num_users, num_items), dtype=bool)
    row, item = train.entries(np.arange(num_users))
    trained[row, item] = True
    held_item = np.array([rng.choice(np.flatnonzero(~t)) for t in trained])
    held = UserItems.from_pairs(np.arange(num_users), held_item, num_users)
    got = ranking_metrics(torch.full((num_users, num_items), 0.25), np.arange(num_users), train, held, [1, 10, 50])
    assert all(got[f"{m}@{k}"] == 0.0 for m in ("hr", "ndcg", "recall") for k in (1, 10, 50))
    others = num_items - 1 - trained.sum(1)
    assert got["mrr"] == pytest.approx(float(np.mean(1 / (others + 1))), rel=1e-12)  # each held-out item last


def test_fewer_candidates_than_k() -> None:
    # 4 items, 0 and 1 trained on: the list is 2 (0.9), 3 (0.1), shorter than K = 5
    train, held = one_user([0, 1], [3])
    scores = torch.tensor([[5.0, 5.0, 0.9, 0.1]])
    assert top_k(scores, [0], train, held, 5).topk.tolist() == [[2, 3, -1, -1, -1]]
    got = ranking_metrics(scores, [0], train, held, [1, 5])
    assert got == pytest.approx({"hr@1": 0.0, "hr@5": 1.0, "ndcg@1": 0.0, "ndcg@5": 1 / math.log2(3),
                                 "recall@1": 0.0, "recall@5": 1.0, "mrr": 1 / 2}, rel=1e-12)
    # every non-training item held out: no other candidate, every list hits whatever the scores
    train, held = one_user([0], [1, 2])
    got = ranking_metrics(torch.tensor([[9.0, 0.0, 0.0]]), [0], train, held, [1, 2])
    assert got["hr@1"] == 1.0 and got["recall@2"] == 1.0 and got["ndcg@2"] == pytest.approx(1.0, rel=1e-12)


def test_nan_scores_rank_last() -> None:
    train, held = one_user([], [1])
    scores = torch.tensor([[float("nan"), float("nan"), -math.inf, 0.0]])
    # 3 (0), then 0, 1 and 2 tie at -inf: the others by id (0, 2), then held-out 1: the list is 3, 0, 2, 1
    assert top_k(scores, [0], train, held, 4).topk.tolist() == [[3, 0, 2, 1]]
    assert ranking_metrics(scores, [0], train, held, [3])["mrr"] == 1 / 4


def test_full_ranking_excludes_training_items_and_includes_held_out_ones() -> None:
    rng = np.random.default_rng(2)
    users, train_sets, held_sets, scores = random_case(2, 30, 25, False, torch.float32)
    train, held = as_user_items(train_sets), as_user_items(held_sets)
    for r, u in enumerate(users):  # the training items score highest, then one held-out item
        scores[r, sorted(train_sets[u])] = 100.0
        scores[r, int(rng.choice(sorted(held_sets[u])))] = 50.0
    got = ranking_metrics(scores, users, train, held, [1])
    assert got["hr@1"] == 1.0 and got["mrr"] == 1.0
    lists = top_k(scores, users, train, held, 25)
    for r, u in enumerate(users):
        listed = set(lists.topk[r][lists.topk[r] >= 0].tolist())
        assert listed == set(range(25)) - train_sets[u]  # every candidate, held-out ones included
        assert lists.topk[r][0] in held_sets[u]


# ---- inputs ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [6, 7, -1])
def test_held_out_item_outside_the_catalogue_is_refused_by_name(bad) -> None:
    train = UserItems.from_pairs([0, 1], [0, 1], 2)
    held = UserItems.from_pairs([0, 1], [2, bad], 2)
    with pytest.raises(ConfigError, match=f"held-out item {bad} of user 1 is outside the catalogue 0..5"):
        ranking_metrics(torch.zeros(2, 6), [0, 1], train, held, [5])
    with pytest.raises(ConfigError, match=f"held-out item {bad} of user 1"):
        top_k(torch.zeros(2, 6), [0, 1], train, held, 5)
    with pytest.raises(ConfigError, match=f"held-out item {bad} of user 1"):
        sample_negatives([0, 1], train, held, 6, negatives_key(0, 0), 3)


def test_held_out_training_item_is_refused_by_name() -> None:
    train = UserItems.from_pairs([0, 0, 1], [0, 4, 1], 2)
    held = UserItems.from_pairs([0, 1], [2, 1], 2)
    with pytest.raises(ConfigError, match="held-out item 1 of user 1 is also one of its training items"):
        ranking_metrics(torch.zeros(2, 6), [0, 1], train, held, [5])
    with pytest.raises(ConfigError, match="held-out item 1 of user 1 is also one of its training items"):
        ranking_metrics(torch.zeros(2, 6), [0, 1], train, held, [5], negatives=2, key=negatives_key(0, 0))


def test_other_bad_inputs_are_refused_by_name() -> None:
    train = UserItems.from_pairs([0], [0], 3)
    held = UserItems.from_pairs([0, 1], [1, 2], 3)
    with pytest.raises(ConfigError, match="user 2 has no held-out item"):
        ranking_metrics(torch.zeros(2, 4), [0, 2], train, held, [1])
    with pytest.raises(ConfigError, match="user 5 is outside"):
        ranking_metrics(torch.zeros(2, 4), [0, 5], train, held, [1])
    with pytest.raises(ConfigError, match="training item 7 of user 0 is outside the catalogue"):
        ranking_metrics(torch.zeros(2, 4), [0, 1], UserItems.from_pairs([0], [7], 3), held, [1])
    with pytest.raises(ConfigError, match=r"one row per ranked user \(2\)"):
        ranking_metrics(torch.zeros(3, 4), [0, 1], train, held, [1])
    with pytest.raises(ConfigError, match="need a key"):
        ranking_metrics(torch.zeros(2, 4), [0, 1], train, held, [1], negatives=2)
    with pytest.raises(ConfigError, match="negatives"):
        ranking_metrics(torch.zeros(2, 4), [0, 1], train, held, [1], negatives=0, key=1)
    with pytest.raises(ConfigError, match="items of user 1 must be ascending and distinct, got 3 then 3"):
        UserItems(np.array([0, 1, 3]), np.array([0, 3, 3]))
    with pytest.raises(ConfigError, match="indptr"):
        UserItems(np.array([0, 2]), np.array([0]))


def test_ks_and_metric_names() -> None:
    assert check_ks([20, 5, 10, 5]) == [5, 10, 20]
    assert check_ks(10) == [10]
    for bad in ([], [0], [5, 2.5], "10", None):
        with pytest.raises(ConfigError, match="eval.ks"):
            check_ks(bad, "eval.ks")
    assert ranking_metric_names([10, 5]) == ["hr@5", "hr@10", "ndcg@5", "ndcg@10", "recall@5", "recall@10", "mrr"]


def test_sums_add_up_over_users_and_batches() -> None:
    users, train_sets, held_sets, scores = random_case(4, 40, 30, True, torch.float32)
    train, held = as_user_items(train_sets), as_user_items(held_sets)
    whole = ranking_sums(scores, users, train, held, [1, 5])
    a = len(users) // 2
    parts = (ranking_sums(scores[:a], users[:a], train, held, [1, 5], batch_size=3)
             + ranking_sums(scores[a:], users[a:], train, held, [1, 5], batch_size=1))
    assert torch.allclose(whole, parts, rtol=1e-12, atol=0)
    assert whole[0] == len(users)
    none = metrics_from_ranking_sums(ranking_sums(scores[:0], users[:0], train, held, [1]), [1])
    assert all(math.isnan(v) for v in none.values())


# ---- sampled negatives ----------------------------------------------------------------------------------------


def test_sampled_negatives_avoid_the_users_items_and_follow_the_key() -> None:
    users, train_sets, held_sets, _ = random_case(5, 60, 150, False, torch.float32)
    train, held = as_user_items(train_sets), as_user_items(held_sets)
    key = negatives_key(7, 2)
    items, valid = sample_negatives(users, train, held, 150, key)
    for r, u in enumerate(users):
        drawn = items[r][valid[r]].tolist()
        free = set(range(150)) - train_sets[u] - held_sets[u]
        assert len(drawn) == len(set(drawn)) == min(99, len(free))  # distinct; all of them when fewer than 99
        assert set(drawn) <= free  # never a training or held-out item of the user
    again, again_valid = sample_negatives(users, train, held, 150, negatives_key(7, 2))
    assert np.array_equal(items, again) and np.array_equal(valid, again_valid)
    other, _ = sample_negatives(users, train, held, 150, negatives_key(7, 3))
    assert not np.array_equal(items, other)
    assert negatives_key(7, 2) != negatives_key(8, 2)
    # a user's draws depend on its id and the key alone, not on the other users drawn with it
    part, part_valid = sample_negatives(users[::3], train, held, 150, key)
    assert np.array_equal(part, items[::3]) and np.array_equal(part_valid, valid[::3])


# ---- topk.npz, recomputed by other libraries -------------------------------------------------------------------


def test_topk_npz_round_trip_recomputes_the_metrics(tmp_path) -> None:
    from torch_geometric.metrics import LinkPredHitRatio, LinkPredMRR, LinkPredNDCG, LinkPredRecall

    num_items = 40
    users, train_sets, held_sets, scores = random_case(6, 50, num_items, True, torch.float32)
    train, held = as_user_items(train_sets), as_user_items(held_sets)
    ks = [3, 10, num_items]  # the longest list holds every candidate, so MRR is recomputable too
    want = ranking_metrics(scores, users, train, held, ks)
    path = save_topk(tmp_path / "topk.npz", top_k(scores, users, train, held, max(ks)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["topk.npz"]  # no temporary left
    with np.load(path) as f:
        assert sorted(f.files) == ["heldout", "topk", "users"]
        users_f, topk_f, heldout_f = f["users"], f["topk"], f["heldout"]
    assert np.array_equal(users_f, users) and np.array_equal(load_topk(path).topk, topk_f)
    # PyG's link-prediction metrics on the lists (a past-the-end sentinel for -1: PyG has no padding)
    pred = torch.from_numpy(np.where(topk_f < 0, num_items, topk_f))
    row, col = np.nonzero(heldout_f >= 0)
    label = torch.from_numpy(np.stack([row, heldout_f[row, col]]))
    for k in ks:
        for name, metric in (("hr", LinkPredHitRatio(k)), ("ndcg", LinkPredNDCG(k)), ("recall", LinkPredRecall(k))):
            metric.update(pred[:, :k], label)
            assert float(metric.compute()) == pytest.approx(want[f"{name}@{k}"], rel=1e-6), f"{name}@{k}"
    mrr = LinkPredMRR(num_items)
    mrr.update(pred, label)
    assert float(mrr.compute()) == pytest.approx(want["mrr"], rel=1e-6)


def test_ndcg_agrees_with_scikit_learn_on_untied_scores() -> None:
    from sklearn.metrics import ndcg_score

    users, train_sets, held_sets, scores = random_case(8, 40, 30, False, torch.float64)
    train, held = as_user_items(train_sets), as_user_items(held_sets)
    for k in (1, 5, 30):
        per_user = []
        for r, u in enumerate(users):
            cand = [i for i in range(30) if i not in train_sets[u]]
            if len(cand) > 1:  # scikit-learn needs two documents
                truth = np.array([[float(i in held_sets[u]) for i in cand]])
                per_user.append((u, ndcg_score(truth, scores[r, cand].numpy()[None], k=k)))
        keep = np.isin(users, [u for u, _ in per_user])
        got = ranking_metrics(scores[keep], users[keep], train, held, [k])[f"ndcg@{k}"]
        assert got == pytest.approx(np.mean([v for _, v in per_user]), rel=1e-12)

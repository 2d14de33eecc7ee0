"""scripts/bench_reference_ranking.py: its full-ranking metric on hand-computed cases and against fedrec's
evaluation, and (where RecBole is installed and ML-100K is in the data directory) its --quick path end to end."""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from fedrec.recsys.ranking import UserItems, ranking_metrics
from scripts.bench_reference_ranking import MODELS, main, ranking_hr_ndcg, seen_mask, topk_scores

DATA_DIR = Path(os.environ.get("FEDREC_DATA_DIR", Path(__file__).resolve().parents[1] / "data"))


def test_metric_by_hand() -> None:
    """Two users, five items. User 0 has seen item 0, holds out item 2 (0.5), and item 3 ties it: rank 2 (a tie
    ranks before the held-out item), so HR@1 = 0, HR@2 = 1, NDCG@2 = 1/log2(3). User 1 has seen items 1 and 4 (the
    two best scores), holds out item 0, the best of the rest: rank 1, HR = NDCG = 1 at every k."""
    scores = np.array([[0.9, 0.1, 0.5, 0.5, 0.3],
                       [0.2, 0.9, 0.1, 0.0, 0.8]])
    seen = seen_mask(2, 5, (np.array([0, 1, 1]), np.array([0, 1, 4])))
    heldout = np.array([2, 0])
    assert ranking_hr_ndcg(scores, seen, heldout, k=1) == (0.5, 0.5)
    hr, ndcg = ranking_hr_ndcg(scores, seen, heldout, k=2)
    assert hr == 1.0
    assert ndcg == pytest.approx((1 / math.log2(3) + 1) / 2)
    # a NaN score is -inf: user 0's held-out item then ranks last of its 4 candidates
    scores[0, 2] = np.nan
    assert ranking_hr_ndcg(scores, seen, heldout, k=3) == (0.5, 0.5)
    assert ranking_hr_ndcg(scores, seen, heldout, k=4)[1] == pytest.approx((1 / math.log2(5) + 1) / 2)


def test_metric_refuses_a_seen_heldout_item() -> None:
    with pytest.raises(ValueError, match="user 0's held-out item"):
        ranking_hr_ndcg(np.zeros((1, 3)), np.array([[True, False, False]]), np.array([0]))


@pytest.mark.parametrize("k", [1, 5, 10])
def test_metric_matches_fedrec_ranking(k: int) -> None:
    """On random scores with many ties, the script's HR@k and NDCG@k are fedrec's (fedrec.recsys.ranking)."""
    rng = np.random.default_rng(0)
    users, items = 40, 30
    scores = rng.integers(0, 6, (users, items)).astype(np.float64)
    seen = rng.random((users, items)) < 0.3
    heldout = np.array([rng.choice(np.flatnonzero(~row)) for row in seen])
    ours = ranking_hr_ndcg(scores, seen, heldout, k=k)
    u = np.arange(users)
    theirs = ranking_metrics(torch.from_numpy(scores), u, UserItems.from_pairs(*np.nonzero(seen), users),
                             UserItems.from_pairs(u, heldout, users), [k])
    assert ours == pytest.approx((theirs[f"hr@{k}"], theirs[f"ndcg@{k}"]), abs=1e-12)


def test_topk_scores_give_the_lists_metrics() -> None:
    """Scores made from top-k lists reproduce the lists' HR@k and NDCG@k: the check the script makes against a
    fedrec run's topk.npz."""
    seen = np.zeros((3, 6), dtype=bool)
    topk = np.array([[4, 1, 2], [5, 0, -1], [3, 2, 1]])  # user 1 has only two candidates listed
    heldout = np.array([2, 0, 5])  # ranks 3, 2, and not listed
    hr, ndcg = ranking_hr_ndcg(topk_scores(topk, 6), seen, heldout, k=3)
    assert hr == pytest.approx(2 / 3)
    assert ndcg == pytest.approx((1 / math.log2(4) + 1 / math.log2(3)) / 3)


def test_quick_end_to_end(tmp_path: Path) -> None:
    """--quick trains every model in both libraries (3 rounds, 1 epoch) and tabulates finite metrics."""
    pytest.importorskip("recbole")
    if not (DATA_DIR / "ml-100k" / "u.data").is_file():
        pytest.skip(f"ML-100K is not in {DATA_DIR} (set FEDREC_DATA_DIR)")
    out = tmp_path / "out"
    results = main(["--quick", "--out", str(out), "--data-dir", str(DATA_DIR)])
    for model in MODELS:
        for side in ("fedrec", "reference"):
            (row,) = [r for r in results if r["model"] == model and r["side"] == side]
            assert math.isfinite(row["hr@10"]) and math.isfinite(row["ndcg@10"])
            assert 0 <= row["ndcg@10"] <= row["hr@10"] <= 1
    table = (out / "table.md").read_text().splitlines()
    assert len(table) == 2 + len(MODELS) + 1  # header, rule, a row per model, popularity
    assert all("nan" not in line for line in table)

"""A round's grouping of the training ratings (:func:`fedrec.recsys.data.round_data`) is built once while no ratings
arrive and kept for the next rounds: the runs equal those that group every round afresh, and a stream regroups in
every round that brings ratings."""
from __future__ import annotations

from typing import Any

import pytest
import torch

import fedrec.tasks.recommendation as round_module
from fedrec.data.ratings import RatingData
from fedrec.models import MatrixFactorization
from fedrec.privacy import ClientDP
from fedrec.recsys import FedSGD, Strategy
from fedrec.tasks import FedRecTask
from tests.helpers import make_task, tiny_fixture

ROUNDS = 4
whole = tiny_fixture(users=50, items=40, seed=5, rounds=ROUNDS, num_clients=9, stream=False)
streamed = tiny_fixture(users=50, items=40, seed=5, rounds=ROUNDS, num_clients=9)


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

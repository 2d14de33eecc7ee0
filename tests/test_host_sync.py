"""The host-synchronisation counter, and a round whose count stays the same as clients and items grow (a GPU round
whose host waits grew with the clients would be bound by them, whatever the device)."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from fedrec.data.synthetic import synthetic_ratings
from fedrec.models import FedGNN, MatrixFactorization
from fedrec.privacy import ClientDP
from fedrec.recsys import FedAvg, FedSGD
from fedrec.tasks import FedRecTask
from fedrec.trainer import FederatedTrainer
from fedrec.trainer.host_sync import HostSyncCounter

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]


def test_the_counter_counts_reads_and_value_sized_outputs_of_its_device_only() -> None:
    t = torch.arange(6.0)
    with HostSyncCounter("cpu") as c:
        t[0].item()
        bool(t.any())
        t.tolist()
        t[t > 2]  # a boolean mask
        torch.nonzero(t)
        t.repeat_interleave(torch.tensor([1, 0, 2, 1, 1, 1]))
        _ = t + 1, t[2:4], t[torch.tensor([0, 2])], t.sum(), torch.sort(t)  # none of these waits
    assert c.count == 6
    assert c.by_op["TensorBase.item"] == 1 and c.by_op["TensorBase.__getitem__"] == 1
    with HostSyncCounter("meta") as other:  # CPU tensors are not the counted device's
        t.tolist()
        bool(t.any())
    assert other.count == 0


def _round_syncs(users: int, items: int, clients: int, device: str, **kw: Any) -> int:
    data = synthetic_ratings(users=users, items=items, ratings=users * 12, num_clients=clients, rounds=4, seed=1)
    torch.manual_seed(0)
    privacy = kw.pop("privacy", None)
    dp = None if privacy is None else ClientDP(data.num_clients, privacy, epsilon=10.0, clip=0.5)
    model = kw.pop("model", FedGNN)(data.num_users, data.num_items, 4)
    task = FedRecTask(data, model, kw.pop("aggregator", FedSGD)(), dp, rounds=4, pseudo_items=10, seed=0, **kw)
    task.setup(FederatedTrainer(accelerator=device))
    task.run_round(0)
    with HostSyncCounter(device) as counter:
        task.run_round(1)
    return counter.count


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("setting", ["fedgnn", "fedgnn-gaussian", "mf-fedavg-laplace"])
def test_a_rounds_host_syncs_do_not_grow_with_clients_or_items(device: str, setting: str) -> None:
    kw: dict[str, Any] = {"fedgnn": {}, "fedgnn-gaussian": {"privacy": "gaussian"},
                          "mf-fedavg-laplace": {"model": MatrixFactorization, "aggregator": FedAvg,
                                                "privacy": "laplace"}}[setting]
    small = _round_syncs(120, 40, 12, device, **dict(kw))
    large = _round_syncs(960, 320, 96, device, **dict(kw))
    assert small > 0  # the counter sees the round (it reads its metrics)
    assert large == small

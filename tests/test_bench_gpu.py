"""scripts/bench_gpu.py runs (on the CPU here, on tiny synthetic ratings): every step it times is one the round calls,
the shares add up to the round, and the task is left as it was; the GPU session that runs it has minutes, not time to
mend it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from scripts import bench_gpu


def test_the_step_shares_cover_the_rounds_steps_and_leave_the_task_as_it_was() -> None:
    data = bench_gpu.load("tiny", "unused", rounds=4)
    task = bench_gpu.build(data, "cpu", "gaussian")
    task.run_round(0)
    total, shares = bench_gpu.step_shares(task, 1, "cpu")
    called = {*bench_gpu.STEP_FUNCTIONS, "_prepare", "_admit", "evaluate", "privatize", "aggregate", "step", "record"}
    assert set(shares) == called | {"other"}  # combine: only a run of several processes or a streamed round's
    # the rest of the round is what no step took: negative if a timed step ran inside another (counted twice)
    assert total > 0 and all(v >= 0 for v in shares.values())
    for owner in (task, task.strategy):
        assert not set(owner.__dict__) & {n for names in bench_gpu.STEP_METHODS.values() for n in names}
    assert all(not isinstance(getattr(bench_gpu.round_module, n), bench_gpu._Timed) for n in bench_gpu.STEP_FUNCTIONS)
    task.run_round(2)  # and the task still plays rounds


def test_the_script_writes_a_record_per_size_and_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "bench.jsonl"
    monkeypatch.setattr(sys, "argv", ["bench_gpu", "--sizes", "tiny", "--devices", "cpu", "--rounds", "1",
                                      "--threads", "1", "--out", str(out), "--profile", str(tmp_path)])
    threads = torch.get_num_threads()
    try:
        bench_gpu.main()
    finally:  # the script sets the process's thread count
        torch.set_num_threads(threads)
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (record["size"], record["device"], record["clients"]) == ("tiny", "cpu", 30)
    assert record["seconds_per_round"] > 0 and record["host_syncs_per_round"] > 0
    assert "local_updates" in record["step_shares"]
    assert "Self CPU" in (tmp_path / "profile_tiny_cpu.txt").read_text()

"""A run on several machines (``trainer.num_nodes``) equals the one-process run (issue 41: many machines).

Two "nodes" of one process each are started on 127.0.0.1, by hand (``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``,
as on a cluster without a launcher) and with torchrun, each in a run folder of its own as on machines that share no
disk; their results are compared with a one-process run of the same command, and node 1 must write nothing. The
settings that cannot work (a bad ``num_nodes``, no way to reach the other nodes, a launcher that started another
number of processes, a task that does not shard, a sweep) are refused with one line naming ``trainer.num_nodes``,
before any process waits for another.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from fedrec.errors import ConfigError
from fedrec.trainer import FederatedTrainer
from fedrec.trainer.distributed import RANK_ENV, launched_as_secondary
from tests.test_sharding import RUN, _files, _same_results

ROOT = Path(__file__).resolve().parents[1]
#: what tells a process where it stands in a multi-process run, by launcher: cleared around every test here
LAUNCHER_ENV = (*RANK_ENV, "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS",
                "SLURM_NTASKS_PER_NODE", "SLURM_NNODES", "SLURM_JOB_NAME", "SLURM_LOCALID", "SLURM_NODEID")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_ENV}
    return {**env, "PYTHONHASHSEED": "0", **extra}


def _together(root: Path, runs: dict[str, tuple[list[str], dict[str, str]]]) -> dict[str, str]:
    """Start every run (name: its command and environment) at once, each in folder ``root/name``, wait for all and
    return their stdouts; a run that fails (or nodes that wait too long for each other) fails the test."""
    procs = {}
    for name, (cmd, env) in runs.items():
        (root / name).mkdir(parents=True)
        procs[name] = subprocess.Popen([*cmd, f"hydra.run.dir={root / name}"], cwd=root, env=env, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    outputs = {}
    try:
        for name, proc in procs.items():
            out, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, (name, err[-3000:])
            outputs[name] = out
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return outputs


def _results(out: Path) -> dict[str, Any]:
    return {"summary": json.loads((out / "summary.json").read_text()),
            "ckpt": torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)}


def _two_nodes_equal_one_process(root: Path, nodes: list[list[str]], env: list[dict[str, str]]) -> None:
    """The two nodes' commands run beside the one-process run of :data:`RUN`: node 0 holds its results and files (to
    float32 rounding, as in tests/test_sharding.py), node 1 wrote nothing, and only node 0 reports."""
    one = [sys.executable, str(ROOT / "train.py"), *RUN]
    out = _together(root, {"one": (one, _clean_env()), "node0": (nodes[0], env[0]), "node1": (nodes[1], env[1])})
    _same_results(_results(root / "one"), _results(root / "node0"))
    assert _files(root / "node0") - {"train.log"} == _files(root / "one") - {"train.log"}
    assert not [p for p in (root / "node1").rglob("*") if p.is_file()]
    assert "run folder:" in out["node0"] and "run folder:" not in out["node1"]


@pytest.mark.parametrize("devices", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_two_local_nodes_by_hand_equal_one_process(tmp_path: Path, devices: int) -> None:
    """Two nodes on 127.0.0.1, told where node 0 listens by MASTER_ADDR/MASTER_PORT and their place by NODE_RANK
    (Lightning's own environment, no launcher), give a private FedGNN run with a planner the metrics, ε, final
    parameters and written files of one process: with one process per node, and (slow: five processes on the
    machine) with two per node, each node's second one started by Lightning."""
    port = str(_free_port())
    command = [sys.executable, str(ROOT / "train.py"), *RUN, "trainer.num_nodes=2", f"trainer.devices={devices}"]
    env = [_clean_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=str(i)) for i in range(2)]
    _two_nodes_equal_one_process(tmp_path, [command, command], env)


@pytest.mark.slow
def test_two_local_nodes_by_torchrun_equal_one_process(tmp_path: Path) -> None:
    """The same two nodes started by torchrun (one agent per node, its static rendezvous at node 0): torchrun's
    ranks (RANK, not NODE_RANK) keep node 1 from writing. Marked slow: torchrun's agents add two start-ups."""
    port = str(_free_port())
    torchrun = str(Path(sys.executable).parent / "torchrun")
    commands = [[torchrun, "--nnodes=2", "--nproc-per-node=1", f"--node-rank={i}", "--master-addr=127.0.0.1",
                 f"--master-port={port}", str(ROOT / "train.py"), *RUN, "trainer.num_nodes=2"] for i in range(2)]
    _two_nodes_equal_one_process(tmp_path, commands, [_clean_env(), _clean_env()])


# ------------------------------------------------------------------------------------------------ settings
@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """This process as started by hand, with nothing that says it belongs to a multi-process run."""
    for name in LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.mark.parametrize("value", [0, -1, "2", True, 1.5])
def test_a_bad_num_nodes_names_the_field(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"^trainer\.num_nodes must be an integer >= 1 \(machines the run spans"):
        FederatedTrainer(num_nodes=value)


@pytest.mark.parametrize("env, missing", [({}, "MASTER_ADDR, MASTER_PORT, NODE_RANK"),
                                          ({"MASTER_ADDR": "10.0.0.1"}, "MASTER_PORT, NODE_RANK"),
                                          ({"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}, "NODE_RANK")])
def test_several_nodes_without_a_way_to_meet_are_refused(no_launcher: pytest.MonkeyPatch, env: dict[str, str],
                                                         missing: str) -> None:
    """Without a launcher or the variables, each node would wait alone on a port of its own: refused, naming what
    is missing, before anything is launched."""
    for name, value in env.items():
        no_launcher.setenv(name, value)
    with pytest.raises(ConfigError, match=rf"^trainer\.num_nodes=2: nothing says how to reach the other nodes "
                                          rf"\({missing} not set\); start each node with torchrun"):
        FederatedTrainer(num_nodes=2)


@pytest.mark.parametrize("name, value, message", [
    ("NODE_RANK", "2", r"NODE_RANK must be an integer from 0 to 1 \(this node's place\), got '2'"),
    ("NODE_RANK", "one", r"NODE_RANK must be an integer from 0 to 1 \(this node's place\), got 'one'"),
    ("MASTER_PORT", "http", r"MASTER_PORT must be a port number \(1 to 65535\) on node 0, got 'http'"),
    ("MASTER_PORT", "70000", r"MASTER_PORT must be a port number \(1 to 65535\) on node 0, got '70000'"),
])
def test_bad_node_variables_are_refused(no_launcher: pytest.MonkeyPatch, name: str, value: str, message: str) -> None:
    for var, default in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "NODE_RANK": "0"}.items():
        no_launcher.setenv(var, default)
    no_launcher.setenv(name, value)
    with pytest.raises(ConfigError, match=rf"^trainer\.num_nodes=2: {message}$"):
        FederatedTrainer(num_nodes=2)


@pytest.mark.parametrize("env, launcher", [
    ({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "3", "RANK": "0", "LOCAL_RANK": "0"}, "torchrun"),
    ({"SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_NNODES": "2", "SLURM_JOB_NAME": "job",
      "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}, "SLURM's srun"),
])
def test_a_launcher_that_started_another_count_is_refused(no_launcher: pytest.MonkeyPatch, env: dict[str, str],
                                                          launcher: str) -> None:
    """torchrun's or srun's process count must be num_nodes × devices (Lightning would otherwise wait for processes
    that never come, or refuse later with a traceback)."""
    for name, value in env.items():
        no_launcher.setenv(name, value)
    started = int(env.get("WORLD_SIZE", env.get("SLURM_NTASKS", "0")))
    with pytest.raises(ConfigError, match=rf"^trainer\.num_nodes=2 makes 2 processes, but {launcher} started "
                                          rf"{started}: set trainer\.num_nodes to its nodes"):
        FederatedTrainer(num_nodes=2)


@pytest.mark.parametrize("name", RANK_ENV)
def test_any_launchers_rank_above_zero_marks_a_secondary_process(no_launcher: pytest.MonkeyPatch, name: str) -> None:
    """Lightning's launcher, torchrun, srun, jsrun and mpirun each say a process's rank their own way; any rank
    above 0 writes nothing (node 1 under torchrun has LOCAL_RANK 0 and NODE_RANK unset, but RANK 1)."""
    assert not launched_as_secondary()
    no_launcher.setenv(name, "0")
    assert not launched_as_secondary()
    no_launcher.setenv(name, "1")
    assert launched_as_secondary()


# ------------------------------------------------------------------------------------------------ train.py
def _cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=tmp_path, capture_output=True,
                          text=True, env=_clean_env(**env), timeout=300)


def test_train_py_refuses_several_nodes_it_cannot_reach(tmp_path: Path) -> None:
    """One ``error:`` line and exit code 2, before the data is built, and no run folder left behind."""
    proc = _cli(tmp_path, "+experiment=fedgnn_synthetic", "quick=true", "trainer.num_nodes=2",
                f"hydra.run.dir={tmp_path / 'run'}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: trainer.num_nodes=2: nothing says how to reach the other nodes (MASTER_ADDR, "
                      "MASTER_PORT, NODE_RANK not set); start each node with torchrun or SLURM's srun, or set "
                      "MASTER_ADDR (node 0's address), MASTER_PORT (a free port there) and NODE_RANK (this node's, "
                      "from 0) on each"]
    assert not (tmp_path / "run").exists()


def test_a_bandit_run_of_one_replicate_refuses_several_nodes(tmp_path: Path) -> None:
    """The default bandit run has one replicate to shard (tests/test_bandit_sharding.py), before any node waits."""
    proc = _cli(tmp_path, "trainer.num_nodes=2", f"hydra.run.dir={tmp_path / 'run'}", MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(_free_port()), NODE_RANK="0")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "error: 2 processes (trainer.num_nodes × trainer.devices): a bandit run shards its replicates" in \
        proc.stderr


def test_a_sweep_of_multi_node_runs_is_refused(tmp_path: Path) -> None:
    """Each node would run the whole sweep and write its own sweep files: every job stops with an error naming
    trainer.num_nodes before it waits for another node, and the sweep lists them as failed."""
    proc = _cli(tmp_path, "-m", "seed=0,1", "trainer.num_nodes=2", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), NODE_RANK="0")
    assert proc.returncode == 2, proc.stderr[-3000:]
    failed = [line for line in proc.stderr.splitlines() if line.startswith("failed job")]
    assert len(failed) == 2, proc.stderr[-3000:]
    assert all("error: trainer.num_nodes=2 in a sweep: a run on several nodes is one command" in f for f in failed)
    assert not list((tmp_path / "sweep").rglob("summary.json"))

"""One run across processes: the trainer's ``accelerator``/``devices``/``num_nodes``/``strategy`` and what a task
needs of them.

A run with ``devices > 1`` is launched by Lightning Fabric's DDP strategy (gloo on CPU, NCCL on GPUs): the script
runs once per process from the point the trainer is built, as with Fabric's ``launch()``. With ``num_nodes > 1`` the
run spans several machines, ``devices`` processes on each: an external launcher (torchrun, SLURM's ``srun``, or
``MASTER_ADDR``/``MASTER_PORT``/``NODE_RANK`` set by hand on each node) starts each node's first process, and Fabric
starts the node's others. Tasks see the processes through a :class:`Collective`: its rank and size, an in-place sum
over processes and a broadcast from rank 0. A one-process run gets the trivial :class:`Collective` and never imports
Lightning.
"""
from __future__ import annotations

import numbers
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from fedrec.errors import ConfigError, check_choice
from fedrec.federation.collective import Collective

ACCELERATORS = ("cpu", "cuda", "auto")
STRATEGIES = ("auto", "ddp")
#: what Lightning's launcher sets in the launching process's environment (restored when a sweep's job ends)
LAUNCH_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")
#: the variables by which a launcher tells a process its place: any above 0 marks a process other than global rank 0
#: (Lightning's launcher: LOCAL_RANK, NODE_RANK; torchrun: RANK, GROUP_RANK; SLURM's srun: SLURM_PROCID; LSF's jsrun:
#: JSM_NAMESPACE_RANK; Open MPI's and MPICH's mpirun: OMPI_COMM_WORLD_RANK, PMI_RANK)
RANK_ENV = ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK",
            "OMPI_COMM_WORLD_RANK", "PMI_RANK")
#: what each node's process needs when no cluster launcher started it (what Lightning's own environment reads)
BY_HAND_ENV = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK")
#: Hydra's command-line flags that choose the config (kept when a sweep's job relaunches itself), each with a value
CONFIG_FLAGS = ("-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir")


class FabricCollective(Collective):
    """The processes of a Lightning Fabric run (after ``Fabric.launch``)."""

    def __init__(self, fabric: Any, environ: dict[str, str | None]) -> None:
        super().__init__(fabric.device)
        self.fabric, self.environ = fabric, environ
        self.global_rank, self.world_size = int(fabric.global_rank), int(fabric.world_size)

    def all_reduce(self, tensors: list[Tensor]) -> None:
        """One all-reduce of the tensors packed into a float64 buffer (exact for the counts and float64 sums the
        tasks reduce), unpacked in place."""
        if not tensors:
            return
        flat = torch.cat([t.reshape(-1).to(self.device, torch.float64) for t in tensors])
        total = self.fabric.all_reduce(flat, reduce_op="sum")
        offset = 0
        for t in tensors:
            n = t.numel()
            t.copy_(total[offset:offset + n].view_as(t).to(t.dtype))
            offset += n

    def broadcast(self, obj: Any) -> Any:
        return self.fabric.broadcast(obj, src=0)

    def close(self) -> None:
        """Leave the process group and restore the launch variables, so that the next job of a sweep in this
        process launches its own processes instead of joining these."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        for name, value in self.environ.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def check_distribution(accelerator: object, devices: object, strategy: object,
                       num_nodes: object = 1) -> tuple[str, int, str, int]:
    """``(accelerator, devices, strategy, num_nodes)`` validated, with errors naming the ``trainer.*`` field: devices
    and num_nodes integers >= 1, the accelerator present, ``ddp`` only with several processes (``auto`` with several
    means ddp), and a run on several nodes started by a launcher that says how to reach them (:func:`check_cluster`)."""
    check_choice("trainer.accelerator", accelerator, ACCELERATORS)
    if isinstance(devices, bool) or not isinstance(devices, numbers.Integral) or devices < 1:
        raise ConfigError(f"trainer.devices must be an integer >= 1 (processes of the run), got {devices!r}")
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, numbers.Integral) or num_nodes < 1:
        raise ConfigError(f"trainer.num_nodes must be an integer >= 1 (machines the run spans, trainer.devices "
                          f"processes on each), got {num_nodes!r}")
    check_choice("trainer.strategy", strategy, STRATEGIES)
    if accelerator == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("trainer.accelerator=cuda: no CUDA device is present (torch.cuda.is_available() is "
                              "False); use trainer.accelerator=cpu or auto")
        if devices > torch.cuda.device_count():
            raise ConfigError(f"trainer.devices={devices} with trainer.accelerator=cuda: only "
                              f"{torch.cuda.device_count()} CUDA devices are present")
    if accelerator == "auto":
        accelerator = "cuda" if torch.cuda.is_available() and devices <= torch.cuda.device_count() else "cpu"
    processes = int(devices) * int(num_nodes)
    if strategy == "ddp" and processes == 1:
        raise ConfigError("trainer.strategy=ddp shards a run across processes: set trainer.devices >= 2 (or "
                          "strategy=auto for one process)")
    if processes > 1:
        check_cluster(int(devices), int(num_nodes))
    return str(accelerator), int(devices), "ddp" if processes > 1 else "single", int(num_nodes)


def _processes_setting(devices: int, num_nodes: int) -> str:
    """The ``trainer.*`` settings that make a run span several processes, as errors name them."""
    if num_nodes == 1:
        return f"trainer.devices={devices}"
    return f"trainer.num_nodes={num_nodes}" + (f" × trainer.devices={devices}" if devices > 1 else "")


def check_cluster(devices: int, num_nodes: int) -> None:
    """That this multi-process run can meet its other processes, before any data is loaded: a cluster launcher's
    process count must be ``num_nodes × devices`` (Lightning would refuse it later, or wait for absent ones), and a
    run on several nodes without one needs :data:`BY_HAND_ENV` on every node (without them each node would wait,
    alone, on a port of its own). ConfigError naming ``trainer.num_nodes``/``trainer.devices`` otherwise."""
    from lightning_fabric.plugins.environments import (
        LSFEnvironment,
        MPIEnvironment,
        SLURMEnvironment,
        TorchElasticEnvironment,
    )

    launchers = {TorchElasticEnvironment: "torchrun", SLURMEnvironment: "SLURM's srun", LSFEnvironment: "LSF's jsrun",
                 MPIEnvironment: "MPI"}  # the order in which Lightning picks its environment
    setting = _processes_setting(devices, num_nodes)
    for environment, name in launchers.items():
        if environment.detect():
            started = environment().world_size()
            if started != devices * num_nodes:
                raise ConfigError(f"{setting} makes {devices * num_nodes} processes, but {name} started {started}: "
                                  "set trainer.num_nodes to its nodes and trainer.devices to its processes per node")
            return
    if num_nodes == 1:
        return  # Lightning's launcher starts the processes on this machine
    missing = [name for name in BY_HAND_ENV if not os.environ.get(name)
               and not (name == "NODE_RANK" and os.environ.get("GROUP_RANK"))]
    if missing:
        raise ConfigError(f"trainer.num_nodes={num_nodes}: nothing says how to reach the other nodes "
                          f"({', '.join(missing)} not set); start each node with torchrun or SLURM's srun, or set "
                          "MASTER_ADDR (node 0's address), MASTER_PORT (a free port there) and NODE_RANK (this "
                          "node's, from 0) on each")
    node = os.environ.get("NODE_RANK") or os.environ["GROUP_RANK"]
    if not node.isdigit() or int(node) >= num_nodes:
        raise ConfigError(f"trainer.num_nodes={num_nodes}: NODE_RANK must be an integer from 0 to {num_nodes - 1} "
                          f"(this node's place), got {node!r}")
    port = os.environ["MASTER_PORT"]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"trainer.num_nodes={num_nodes}: MASTER_PORT must be a port number (1 to 65535) on node 0, "
                          f"got {port!r}")


def check_shardable(task: Any, devices: int, num_nodes: int = 1) -> None:
    """A run on several processes (``devices`` on each of ``num_nodes``) needs a task that shards its work
    (``supports_sharding``) and, when it has ``check_processes``, accepts that many processes; a ConfigError naming
    the ``trainer.*`` settings otherwise."""
    processes = devices * num_nodes
    if processes > 1 and not getattr(task, "supports_sharding", False):
        raise ConfigError(f"{_processes_setting(devices, num_nodes)}: {type(task).__name__} runs in one process (only "
                          "tasks with supports_sharding shard across processes: federated recommendation runs, "
                          "data=..., their clients; bandit runs of protocol=async|sync|fed_linucb their replicates)")
    if processes > 1 and hasattr(task, "check_processes"):
        task.check_processes(processes)


def launched_as_secondary() -> bool:
    """Whether a launcher started this process as a rank other than global rank 0 (any of :data:`RANK_ENV` above 0,
    set before the script starts): such a process writes no files."""
    return any(int(os.environ.get(name, "0") or 0) > 0 for name in RANK_ENV)


def launch(accelerator: str, devices: int, strategy: str, num_nodes: int = 1) -> Collective:
    """The :class:`Collective` of a run on ``num_nodes × devices`` processes (from :func:`check_distribution`):
    several are launched with Lightning Fabric's DDP strategy (this script then runs on in every process); one needs
    nothing."""
    if strategy == "single":
        return Collective("cuda:0" if accelerator == "cuda" else "cpu")
    from lightning_fabric import Fabric

    environ = {name: os.environ.get(name) for name in LAUNCH_ENV}
    fabric = Fabric(accelerator=accelerator, devices=devices, num_nodes=num_nodes, strategy="ddp")
    with _as_one_job(devices, fabric.strategy.cluster_environment.creates_processes_externally):
        fabric.launch()
    return FabricCollective(fabric, environ)


@contextmanager
def _as_one_job(devices: int, started_externally: bool) -> Iterator[None]:
    """In a job of a Hydra sweep whose other processes Lightning's launcher starts (it reruns ``sys.argv`` in
    ``hydra.run.dir``; not when a launcher such as torchrun ``started_externally`` them), make it start them on this
    job alone, in this job's folder: its overrides, not the sweep's, and not ``-m``. Only Hydra's basic launcher runs
    jobs in the process that ``train.py`` started; joblib's and submitit's workers could not relaunch it."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if started_externally or not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        yield
        return
    from omegaconf import read_write

    hydra = HydraConfig.get()
    if not str(hydra.launcher.get("_target_", "")).endswith(".BasicLauncher"):
        raise ConfigError(f"trainer.devices={devices} in a sweep needs Hydra's basic launcher (the default): "
                          f"{hydra.launcher._target_} runs jobs in worker processes that cannot start the run's "
                          "other processes; sweep sharded runs one job at a time")
    argv, run_dir = sys.argv, hydra.run.dir
    flags = [a for i, a in enumerate(argv) if a.split("=")[0] in CONFIG_FLAGS
             or (i > 0 and argv[i - 1] in CONFIG_FLAGS)]
    sys.argv = [argv[0], *flags, *hydra.overrides.task]
    with read_write(hydra.run):
        hydra.run.dir = hydra.runtime.output_dir
    try:
        yield
    finally:
        sys.argv = argv
        with read_write(hydra.run):
            hydra.run.dir = run_dir

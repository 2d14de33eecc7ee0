"""One run across processes: the trainer's ``accelerator``/``devices``/``strategy`` and what a task needs of them.

A run with ``devices > 1`` is launched by Lightning Fabric's DDP strategy (gloo on CPU, NCCL on GPUs): the script
runs once per process from the point the trainer is built, as with Fabric's ``launch()``. Tasks see the processes
through a :class:`Collective`: its rank and size, an in-place sum over processes and a broadcast from rank 0. A
one-process run gets the trivial :class:`Collective` and never imports Lightning.
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


def check_distribution(accelerator: object, devices: object, strategy: object) -> tuple[str, int, str]:
    """``(accelerator, devices, strategy)`` validated, with errors naming the ``trainer.*`` field: devices an
    integer >= 1, the accelerator present, ``ddp`` only with several devices (``auto`` with several means ddp)."""
    check_choice("trainer.accelerator", accelerator, ACCELERATORS)
    if isinstance(devices, bool) or not isinstance(devices, numbers.Integral) or devices < 1:
        raise ConfigError(f"trainer.devices must be an integer >= 1 (processes of the run), got {devices!r}")
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
    if strategy == "ddp" and devices == 1:
        raise ConfigError("trainer.strategy=ddp shards a run across processes: set trainer.devices >= 2 (or "
                          "strategy=auto for one process)")
    return str(accelerator), int(devices), "ddp" if devices > 1 else "single"


def check_shardable(task: Any, devices: int) -> None:
    """A run on several ``devices`` needs a task that shards its work (``supports_sharding``) and, when it has
    ``check_processes``, accepts that many processes; a ConfigError naming ``trainer.devices`` otherwise."""
    if devices > 1 and not getattr(task, "supports_sharding", False):
        raise ConfigError(f"trainer.devices={devices}: {type(task).__name__} runs in one process (only tasks with "
                          "supports_sharding shard across processes: federated recommendation runs, data=..., their "
                          "clients; bandit runs of protocol=async|sync|fed_linucb their replicates)")
    if devices > 1 and hasattr(task, "check_processes"):
        task.check_processes(devices)


def launched_as_secondary() -> bool:
    """Whether this process was started by a multi-process launcher as a rank other than 0 (Lightning's launcher
    sets ``LOCAL_RANK``/``NODE_RANK`` before the script starts): such a process writes no files."""
    return int(os.environ.get("LOCAL_RANK", "0") or 0) > 0 or int(os.environ.get("NODE_RANK", "0") or 0) > 0


def launch(accelerator: str, devices: int, strategy: str) -> Collective:
    """The :class:`Collective` of a run on ``devices`` processes (from :func:`check_distribution`): several are
    launched with Lightning Fabric's DDP strategy (this script then runs on in every process); one needs nothing."""
    if strategy == "single":
        return Collective("cuda:0" if accelerator == "cuda" else "cpu")
    from lightning_fabric import Fabric

    environ = {name: os.environ.get(name) for name in LAUNCH_ENV}
    fabric = Fabric(accelerator=accelerator, devices=devices, strategy="ddp")
    with _as_one_job(devices):
        fabric.launch()
    return FabricCollective(fabric, environ)


@contextmanager
def _as_one_job(devices: int) -> Iterator[None]:
    """In a job of a Hydra sweep, make Lightning's launcher (which reruns ``sys.argv`` in ``hydra.run.dir``) start
    the other processes on this job alone, in this job's folder: its overrides, not the sweep's, and not ``-m``.
    Only Hydra's basic launcher runs jobs in the process that ``train.py`` started; joblib's and submitit's workers
    could not relaunch it."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if launched_as_secondary() or not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
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

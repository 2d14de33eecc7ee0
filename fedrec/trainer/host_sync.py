"""Counting host synchronisations: the tensor operations that make the host wait for an accelerator.

A GPU round is fast only while the host queues work without waiting for results. The host waits whenever it
reads a tensor's values (``.item()``, ``.tolist()``, ``bool(t)``, ``int(t)``, a copy to host memory) and whenever
an operation's output size depends on the values (``nonzero``, ``unique``, a boolean mask, ``bincount``, ...).
:class:`HostSyncCounter` counts those calls on the tensors of one device through torch's function-override hook,
so the count is the same on any machine: on the CPU it counts what a run on the GPU would wait for, and a test
can hold it constant as clients or item groups grow. On CUDA, ``torch.cuda.set_sync_debug_mode`` is the
driver's own view of the same thing.
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

#: reads of a tensor's values into Python or host memory
READS = frozenset({
    Tensor.item, Tensor.tolist, Tensor.__bool__, Tensor.__int__, Tensor.__float__, Tensor.__index__,
    Tensor.numpy, Tensor.cpu, torch.equal, Tensor.equal, torch.allclose, Tensor.allclose,
})
#: operations whose output size depends on the input's values
DATA_DEPENDENT = frozenset({
    torch.nonzero, Tensor.nonzero, torch.argwhere, Tensor.argwhere, torch.masked_select, Tensor.masked_select,
    torch.unique, Tensor.unique, torch.unique_consecutive, Tensor.unique_consecutive, torch.bincount,
    Tensor.bincount,
})
_INDEXING = frozenset({Tensor.__getitem__, Tensor.__setitem__, Tensor.index_put_, Tensor.index_put})


def _tensors(value: Any) -> list[Tensor]:
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _is_sync(func: Any, args: tuple, kwargs: dict) -> bool:
    if func in READS or func in DATA_DEPENDENT:
        return True
    if func is torch.repeat_interleave or func is Tensor.repeat_interleave:  # tensor repeats: the total is read
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        return isinstance(repeats, Tensor) and kwargs.get("output_size") is None
    if func in _INDEXING:  # a boolean mask selects a value-dependent number of elements
        index = args[1] if len(args) > 1 else None
        return any(t.dtype == torch.bool for t in _tensors(index))
    if func is Tensor.to:  # a copy to host memory
        target = next((a for a in (*args[1:], kwargs.get("device")) if isinstance(a, (str, torch.device))), None)
        return target is not None and torch.device(target).type == "cpu"
    return False


class HostSyncCounter(TorchFunctionMode):
    """Within ``with HostSyncCounter(device) as c:``, ``c.count`` is the number of calls that would make the host
    wait for ``device`` (module docstring), and ``c.by_op`` names them; calls on tensors of other devices (the
    round's host-side data in a GPU run) are not counted."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.device = torch.device(device)
        self.by_op: Counter[str] = Counter()

    @property
    def count(self) -> int:
        return sum(self.by_op.values())

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        tensors = _tensors(args) if _is_sync(func, args, kwargs) else []
        if tensors and tensors[0].device.type == self.device.type:
            self.by_op[getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))] += 1
        return func(*args, **kwargs)

"""The step interface every bandit protocol implements, and what the protocols share: policies, backends,
input checks and communication thresholds.

A protocol is an ``nn.Module`` over ``replicates`` independent runs of ``num_clients`` clients whose whole state
lives in buffers, so ``state_dict`` and checkpoints resume it exactly. Clients reach their state rows through
``row_of`` (a buffer: replicate × client → row), which a protocol may change at run time (clustering).
:meth:`StepProtocol.run` plays a block of steps on one of two backends: ``compiled`` (numba kernels working in
place on the buffers, CPU) or ``torch`` (a plain step-at-a-time loop batched over replicates: the readable
reference, and the path for other devices). ``auto`` takes ``compiled`` on the CPU when numba imports.
"""
from __future__ import annotations

import functools
import math
from abc import ABCMeta, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from fedrec.bandits.linear import LinearBandit, LinTS, LinUCB
from fedrec.errors import ConfigError, check_float, check_int
from fedrec.federation.channel import Channel
from fedrec.federation.ledger import CommLedger
from fedrec.jit import HAVE_NUMBA
from fedrec.protocols.kernels.checks import BAD_CLIENT, BAD_CONTEXT, BAD_REWARD, VALID, first_invalid

BACKENDS = ("auto", "compiled", "torch")

#: a policy factory: called with ``dim``, ``batch_shape`` (and ``seed`` for LinTS) it builds the local policy
PolicyFactory = Callable[..., LinearBandit]

#: a trigger fires when a log-determinant ratio exceeds log γ by more than this: cached log-determinants
#: come from different factorisations, so an exactly unchanged matrix may show a ratio of 1 ± 1e-15
TRIGGER_TOLERANCE = 1e-10


def log_threshold(name: str, gamma: float) -> float:
    """log γ + :data:`TRIGGER_TOLERANCE` for an event trigger; γ >= 1 and may be +inf (never communicate)."""
    return math.log(check_float(name, gamma, low=1.0, allow_inf=True)) + TRIGGER_TOLERANCE


def paper_linucb(**overrides: Any) -> PolicyFactory:
    """LinUCB with the Async-LinUCB paper's settings (λ = 0.1, the radius of Eq. 5 with σ = δ = 0.1)."""
    kw = dict(lam=0.1, alpha=None, sigma=0.1, delta=0.1)
    kw.update(overrides)
    return functools.partial(LinUCB, **kw)


def build_policy(policy: PolicyFactory | None, dim: int, batch_shape: tuple[int, ...], seed: int) -> LinearBandit:
    """The local policy of every state row, from a factory (e.g. Hydra's ``_partial_`` node ``policy``)."""
    factory = paper_linucb() if policy is None else policy
    target = factory.func if isinstance(factory, functools.partial) else factory
    kwargs: dict[str, Any] = {"dim": dim, "batch_shape": batch_shape}
    if isinstance(target, type) and issubclass(target, LinTS):
        kwargs["seed"] = seed
    try:
        built = factory(**kwargs)
    except (TypeError, ConfigError) as e:
        raise ConfigError(f"policy: {e}") from e
    if not isinstance(built, LinearBandit):
        raise ConfigError(f"policy must build a fedrec.bandits LinUCB or LinTS, got {type(built).__name__}")
    return built


def resolve_backend(backend: str) -> str:
    """``compiled`` or ``torch`` for a requested backend; ``auto`` is compiled when numba imports."""
    if backend not in BACKENDS:
        raise ConfigError(f"protocol.backend must be one of {list(BACKENDS)}, got {backend!r}")
    if backend == "compiled" and not HAVE_NUMBA:
        raise ConfigError("protocol.backend=compiled needs numba (pip install numba); use backend=torch")
    if backend == "auto":
        return "compiled" if HAVE_NUMBA else "torch"
    return backend


class ProtocolModule(nn.Module):
    """What every bandit protocol shares: replicates, the run seed, the backend, an addressed channel, and the
    kernels' cached views of the buffers.

    Args:
        replicates: independent runs batched together.
        seed: the run seed (policies and protocols derive their counter-based streams from it).
        backend: ``auto`` | ``compiled`` | ``torch`` (see the module docstring).
        endpoints: the channel's endpoint roles and counts.
    """

    def __init__(self, replicates: int, seed: int, backend: str, endpoints: Mapping[str, int]) -> None:
        super().__init__()
        self.replicates = check_int("replicates", replicates)
        self.seed = check_int("seed", seed, minimum=0)
        self.backend = resolve_backend(backend)
        self.channel = Channel(self.replicates, endpoints)

    @property
    def ledger(self) -> CommLedger:
        return self.channel.ledger

    def use_compiled(self) -> bool:
        """Whether this call runs the compiled kernels (CPU buffers and a compiled backend)."""
        first = next(iter(self.ledger.roles))
        policy = getattr(self, "policy", None)  # a policy the kernels do not implement plays on the torch path
        return self.backend == "compiled" and self.ledger.traffic(first).device.type == "cpu" \
            and getattr(policy, "compiled", True)

    def kernel_arrays(self) -> tuple[Any, ...]:
        """Zero-copy numpy views of the module's state for the kernels, made once and kept until the buffers move
        (``.to()``, ``.double()``, ...). Replacing a buffer or the channel by assignment is not supported."""
        if self.__dict__.get("_kernel_arrays") is None:
            self.__dict__["_kernel_arrays"] = self._make_kernel_arrays()
        return self.__dict__["_kernel_arrays"]

    def _make_kernel_arrays(self) -> tuple[Any, ...]:
        """See :meth:`kernel_arrays` (protocols with a compiled backend override it)."""
        return ()

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        self.__dict__["_kernel_arrays"] = None
        return super()._apply(fn, recurse)


class StepProtocol(ProtocolModule, metaclass=ABCMeta):
    """Interaction steps of ``replicates`` independent runs × ``num_clients`` clients, batched.

    Args:
        num_clients, dim, replicates: the world's size.
        seed: the run seed (policies with randomness derive their streams from it).
        backend: ``auto`` | ``compiled`` | ``torch`` (see the module docstring).
        endpoints: the channel's endpoint roles and counts (default: the clients and one server).
    """

    #: agents that may act in one step (None: any number; the clients tensor is then (R, S, A))
    max_agents_per_step: int | None = 1
    #: implements :meth:`replay` (offline evaluation on logged streams)
    supports_replay: bool = False

    def __init__(
        self, num_clients: int, dim: int, replicates: int = 1, seed: int = 0, backend: str = "auto",
        endpoints: Mapping[str, int] | None = None,
    ) -> None:
        num = check_int("num_clients", num_clients)
        super().__init__(replicates, seed, backend, endpoints or {"client": num, "server": 1})
        self.num_clients = num
        self.dim = check_int("dim", dim)
        self.context_dim = self.dim  # features per arm in the input (Async-LinUCB-AM splits them)
        R, N = self.replicates, self.num_clients
        self.register_buffer("row_of", torch.arange(R * N))
        self.register_buffer("_offsets", torch.arange(R) * N, persistent=False)
        self.register_buffer("_replicate_ids", torch.arange(R), persistent=False)

    def rows(self, clients: Tensor) -> Tensor:
        """State rows of ``clients`` (R,) (one per replicate) through ``row_of``."""
        return self.row_of[self._offsets + clients]

    # ------------------------------------------------------------------------------------------------ API
    def run(self, clients: Tensor, contexts: Tensor, rewards: Tensor) -> Tensor:
        """Play steps in order: ``clients`` (R, S), ``contexts`` (R, S, K, d), ``rewards`` (R, S, K) -> arms (R, S).

        With several agents per step (``max_agents_per_step`` allows it) the shapes are (R, S, A), (R, S, A, K, d)
        and (R, S, A, K). Inputs are checked before any state changes.
        """
        clients, contexts, rewards = self.check_inputs(clients, contexts, rewards)
        if clients.shape[1] == 0:
            return clients.clone()
        return self._run(clients, contexts, rewards)

    def step(self, clients: Tensor, contexts: Tensor, rewards: Tensor) -> Tensor:
        """Play one step: ``clients`` (R,), ``contexts`` (R, K, d), ``rewards`` (R, K) -> arms (R,)."""
        return self.run(torch.as_tensor(clients).unsqueeze(1), torch.as_tensor(contexts).unsqueeze(1),
                        torch.as_tensor(rewards).unsqueeze(1)).select(1, 0)

    def replay(self, clients: Tensor, contexts: Tensor, rewards: Tensor, logged: Tensor) -> Tensor:
        """Replay evaluation (Li et al. 2010): play steps (R, S) as :meth:`run` does, but a step changes the
        protocol's state only when its arm is ``logged`` (R, S), the arm the log played. Returns the arms."""
        if not self.supports_replay:
            raise ConfigError(f"protocol: {type(self).__name__} has no replay evaluation (logged streams take "
                              "protocols with one model per replicate, e.g. protocol=vfucb|central_linucb)")
        clients, contexts, rewards = self.check_inputs(clients, contexts, rewards)
        logged = torch.as_tensor(logged, device=clients.device)
        if clients.dim() != 2 or tuple(logged.shape) != tuple(clients.shape) or logged.dtype != torch.long:
            raise ValueError(f"replay takes clients (R, S) and logged arms of the same shape (long), got "
                             f"{tuple(clients.shape)} and {tuple(logged.shape)} ({logged.dtype})")
        if bool(((logged < 0) | (logged >= contexts.shape[-2])).any()):
            raise ValueError(f"logged arms must be in [0, {contexts.shape[-2]})")
        if clients.shape[1] == 0:
            return clients.clone()
        return self._replay(clients, contexts, rewards, logged.contiguous())

    @abstractmethod
    def _run(self, clients: Tensor, contexts: Tensor, rewards: Tensor) -> Tensor:
        """:meth:`run` on checked inputs."""

    def _replay(self, clients: Tensor, contexts: Tensor, rewards: Tensor, logged: Tensor) -> Tensor:
        """:meth:`replay` on checked inputs (protocols with ``supports_replay``)."""
        raise NotImplementedError

    def metrics(self) -> dict[str, Tensor]:
        """Protocol-specific per-replicate metrics (R,) that a task reports beside regret and communication."""
        return {}

    def check_inputs(self, clients: Tensor, contexts: Tensor, rewards: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Validate shapes, client ids and finiteness; errors name the argument. Returns CPU/dtype-normalised
        tensors on the protocol's device."""
        device = self._buffers["row_of"].device
        clients = torch.as_tensor(clients, device=device)
        if clients.dtype != torch.long:
            if clients.dtype.is_floating_point or clients.dtype == torch.bool or clients.dtype.is_complex:
                raise ValueError(f"clients must be an integer tensor, got {clients.dtype}")
            clients = clients.to(torch.long)
        R = self.replicates
        agents = clients.dim() == 3
        if clients.dim() not in (2, 3) or clients.shape[0] != R:
            raise ValueError(f"clients must have shape ({R}, steps) or ({R}, steps, agents), "
                             f"got {tuple(clients.shape)}")
        if agents and self.max_agents_per_step is not None and clients.shape[2] > self.max_agents_per_step:
            raise ValueError(f"{type(self).__name__} takes at most {self.max_agents_per_step} agent(s) per step, "
                             f"got clients of shape {tuple(clients.shape)}")
        lead = tuple(clients.shape)
        contexts = torch.as_tensor(contexts, device=device, dtype=torch.float64)
        if contexts.dim() != len(lead) + 2 or tuple(contexts.shape[: len(lead)]) != lead \
                or contexts.shape[-1] != self.context_dim or contexts.shape[-2] < 1:
            raise ValueError(f"contexts must have shape {lead + ('K', self.context_dim)} with K >= 1, "
                             f"got {tuple(contexts.shape)}")
        rewards = torch.as_tensor(rewards, device=device, dtype=torch.float64)
        if tuple(rewards.shape) != tuple(contexts.shape[:-1]):
            raise ValueError(f"rewards must have shape {tuple(contexts.shape[:-1])}, got {tuple(rewards.shape)}")
        clients, contexts, rewards = clients.contiguous(), contexts.contiguous(), rewards.contiguous()
        bad = self._first_invalid(clients, contexts, rewards)
        if bad == BAD_CLIENT:
            wrong = clients[(clients < 0) | (clients >= self.num_clients)][0]
            raise ValueError(f"clients must be ids in [0, {self.num_clients}), got {int(wrong)}")
        if bad == BAD_CONTEXT:
            raise ValueError("contexts must be finite (got NaN or inf)")
        if bad == BAD_REWARD:
            raise ValueError("rewards must be finite (got NaN or inf)")
        return clients, contexts, rewards

    def _first_invalid(self, clients: Tensor, contexts: Tensor, rewards: Tensor) -> int:
        """The first kind of invalid input (:mod:`~fedrec.protocols.kernels.checks` codes): compiled on the CPU,
        where the step API needs it cheap, torch reductions elsewhere."""
        if clients.device.type == "cpu" and HAVE_NUMBA:
            return first_invalid(clients.numpy(), contexts.numpy(), rewards.numpy(), self.num_clients)
        if bool(((clients < 0) | (clients >= self.num_clients)).any()):
            return BAD_CLIENT
        if not bool(torch.isfinite(contexts).all()):
            return BAD_CONTEXT
        return VALID if bool(torch.isfinite(rewards).all()) else BAD_REWARD


def policy_views(policy: LinearBandit) -> tuple[np.ndarray, ...]:
    """Zero-copy views of a policy's row state in the kernels' order (its parameters come from
    :meth:`~fedrec.bandits.LinearBandit.kernel_spec` at every call, so that a loaded seed takes effect)."""
    draws = policy.draws.numpy() if isinstance(policy, LinTS) else np.zeros(1, dtype=np.int64)
    return (policy.G.numpy(), policy.inv.numpy(), policy.logdet.numpy(), policy.count.numpy(),
            policy.since_refactor.numpy(), policy.stale.numpy(), draws)


def kernel_call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a compiled kernel, restoring torch's thread count (numba's parallel layer may change it)."""
    threads = torch.get_num_threads()
    try:
        return fn(*args)
    finally:
        if torch.get_num_threads() != threads:  # pragma: no cover - depends on numba's threading layer
            torch.set_num_threads(threads)

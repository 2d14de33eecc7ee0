"""The interfaces of the two protocol families and what every protocol shares: policies, backends, declared
capabilities, input checks and communication thresholds.

A protocol is an ``nn.Module`` over ``replicates`` independent runs whose whole state lives in buffers, so
``state_dict`` and checkpoints resume it exactly. :class:`StepProtocol`: one active client per step, fed contexts
and rewards from outside (clients reach their state rows through ``row_of``, a buffer: replicate × client → row,
which a protocol may change at run time, e.g. clustering). :class:`MultiAgentProtocol`: every agent of a graph acts
in every round against an environment whose rewards the loop draws. Both play on one of two backends:
``compiled`` (numba kernels working in place on the buffers, CPU) or ``torch`` (a plain step-at-a-time loop batched
over replicates: the readable reference, and the path for other devices); ``auto`` takes ``compiled`` on the CPU
when the protocol has it and numba imports.
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
from fedrec.envs.mab import MultiAgentMAB
from fedrec.errors import ConfigError, check_choice, check_float, check_int
from fedrec.federation.channel import Channel
from fedrec.federation.ledger import CommLedger
from fedrec.federation.topology import Topology
from fedrec.protocols.kernels.checks import BAD_CLIENT, BAD_CONTEXT, BAD_REWARD, VALID, first_invalid
from fedrec.protocols.kernels.linear import LinearParams, PolicyRows
from fedrec.utils.jit import HAVE_NUMBA, build

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


def resolve_backend(backend: str, offered: tuple[str, ...], name: str) -> str:
    """``compiled`` or ``torch`` for a requested backend among those protocol ``name`` ``offered``; ``auto`` is
    compiled when offered and numba imports, else torch. A backend the protocol lacks is refused, never replaced."""
    check_choice("protocol.backend", backend, BACKENDS)
    compiled = "compiled" in offered and HAVE_NUMBA
    if backend == "auto":
        if compiled or "torch" in offered:
            return "compiled" if compiled else "torch"
    elif backend in offered and (backend != "compiled" or HAVE_NUMBA):
        return backend
    if backend in offered or (backend == "auto" and "compiled" in offered):
        raise ConfigError(f"protocol.backend={backend}: {name} runs compiled, which needs numba (pip install numba)")
    raise ConfigError(f"protocol.backend={backend}: {name} runs on {list(offered)} only")


class ProtocolModule(nn.Module):
    """What every bandit protocol shares: replicates, the run seed, the backend, an addressed channel, and the
    kernels' cached views of the buffers.

    A protocol declares what it can do, and the base refuses the rest with an error naming the field (nothing
    falls back silently): :attr:`backends`, and :attr:`honours_channel`, whether every message's payload passes
    :meth:`~fedrec.federation.Channel.deliver` (a channel that transforms payloads is refused otherwise).

    Args:
        replicates: independent runs batched together.
        seed: the run seed (policies and protocols derive their counter-based streams from it).
        backend: ``auto`` | ``compiled`` | ``torch`` (see the module docstring).
        endpoints: the channel's endpoint roles and counts.
    """

    #: the backends this protocol implements
    backends: tuple[str, ...] = ("compiled", "torch")
    #: every message's payload passes the channel's ``deliver`` (kernels that count messages in bulk do not)
    honours_channel: bool = True
    #: the privacy mechanisms it applies (the classes the ``privacy`` config group builds); others are refused
    privacy_mechanisms: tuple[type, ...] = ()

    def __init__(self, replicates: int, seed: int, backend: str, endpoints: Mapping[str, int]) -> None:
        super().__init__()
        self.replicates = check_int("replicates", replicates)
        self.seed = check_int("seed", seed, minimum=0)
        self.requested_backend = backend
        self.backend = resolve_backend(backend, self.backends, type(self).__name__)
        self.channel = Channel(self.replicates, endpoints)

    @property
    def ledger(self) -> CommLedger:
        return self.channel.ledger

    def use_compiled(self) -> bool:
        """Whether this call runs the compiled kernels: a compiled backend, unless it cannot run here (buffers off
        the CPU, a policy the kernels lack), where ``auto`` takes the torch path and ``compiled`` is refused."""
        if self.backend != "compiled":
            return False
        first = next(iter(self.ledger.roles))
        device = self.ledger.traffic(first).device
        policy = getattr(self, "policy", None)
        if device.type != "cpu":
            why = f"the compiled kernels run on the CPU, and {type(self).__name__}'s buffers are on {device}"
        elif not getattr(policy, "compiled", True):
            why = f"the compiled kernels do not implement {type(policy).__name__}({policy.extra_repr()})"
        else:
            return True
        if self.requested_backend == "compiled" or "torch" not in self.backends:
            raise ConfigError(f"protocol.backend={self.requested_backend}: {why}; use backend=torch")
        return False

    def check_channel(self) -> None:
        """Refuse a payload-transforming channel that this protocol would bypass (:attr:`honours_channel`)."""
        if not self.honours_channel and not self.channel.transparent:
            raise ConfigError(f"channel: {type(self.channel).__name__} transforms payloads, but {type(self).__name__} "
                              "counts its messages without passing them through the channel")

    def kernel_views(self) -> dict[str, tuple]:
        """The module's state and settings as its kernels' named structures (zero-copy views of the buffers, see
        :func:`fedrec.utils.jit.build`), made once and kept until the buffers move (``.to()``, ``.double()``, ...) or a
        state dict is loaded. Replacing a buffer or the channel by assignment is not supported, and settings
        changed after construction are not seen by the kernels."""
        if self.__dict__.get("_views_cache") is None:
            self.__dict__["_views_cache"] = self._kernel_views()
        return self.__dict__["_views_cache"]

    def _kernel_views(self) -> dict[str, tuple]:
        """See :meth:`kernel_views` (protocols with a compiled backend override it)."""
        return {}

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        self.__dict__["_views_cache"] = None
        return super()._apply(fn, recurse)

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False) -> Any:
        """``nn.Module.load_state_dict``; the kernels' views are rebuilt (a loaded seed takes effect)."""
        self.__dict__["_views_cache"] = None
        return super().load_state_dict(state_dict, strict, assign)


class StepProtocol(ProtocolModule, metaclass=ABCMeta):
    """Interaction steps of ``replicates`` independent runs × ``num_clients`` clients, batched.

    Args:
        num_clients, dim, replicates: the world's size.
        seed: the run seed (policies with randomness derive their streams from it).
        backend: ``auto`` | ``compiled`` | ``torch`` (see the module docstring).
        endpoints: the channel's endpoint roles and counts (default: the clients and one server).
    """

    #: the task kind it runs under (:attr:`fedrec.tasks.FederatedTask.kind`); the builder refuses another
    kind = "bandit"
    #: agents that may act in one step (None: any number; the clients tensor is then (R, S, A))
    max_agents_per_step: int | None = 1
    #: implements :meth:`replay` (offline evaluation on logged streams)
    supports_replay: bool = False
    #: its clients run a pluggable local policy (the ``policy`` argument: LinUCB or LinTS)
    takes_policy: bool = False
    #: a run of several processes (``trainer.devices``) may shard its replicates over them: it builds its share
    #: (``replicates_part``) and places that share's state in the whole run's (``placed_entry``)
    shards_replicates: bool = False

    @classmethod
    def world(cls, env: Any) -> dict[str, Any]:
        """The arguments this protocol takes from the environment it plays: its clients and dimension."""
        return {"num_clients": env.num_clients, "dim": env.dim}

    @classmethod
    def memory_estimate(cls, sizes: Mapping[str, Any]) -> int:
        """The bytes of its state for a run of ``sizes`` (``replicates``, ``num_clients``, ``dim``, ``layout``,
        ``steps``), before it is allocated: per replicate and client that holds state, three (d + 1)² float64 blocks
        (the server's statistics, their inverse and the client's copy) and the client's θ. With ``layout=sparse``
        rows are made on arrival with their capacity doubled, so at most twice ``steps`` (one client acts a step)."""
        rows, d = sizes["num_clients"], sizes["dim"]
        if sizes.get("layout") == "sparse" and sizes.get("steps") is not None:
            rows = min(rows, 2 * sizes["steps"])
        return sizes["replicates"] * rows * (3 * (d + 1) ** 2 + d) * 8

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
        self.check_channel()
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
        self.check_channel()
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

    def summary(self) -> dict[str, Any]:
        """Protocol facts (not per-replicate numbers) a run's summary reports beside its metrics."""
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


class MultiAgentProtocol(ProtocolModule, metaclass=ABCMeta):
    """All ``num_agents`` agents of a :class:`~fedrec.federation.topology.Topology` act in every round,
    ``replicates`` independent runs batched, for ``horizon`` rounds at most.

    The sibling of :class:`StepProtocol` for environments whose rewards the step loop draws itself
    (:class:`~fedrec.envs.mab.MultiAgentMAB`); the channel has one ``client`` endpoint per agent (peer messages).
    Subclasses implement :meth:`_play`, :meth:`cumulative_regret` and :meth:`epsilon_spent`; ``t`` (a buffer)
    counts the rounds played.
    """

    #: the task kind it runs under (:attr:`fedrec.tasks.FederatedTask.kind`); the builder refuses another
    kind = "multi_agent"

    @classmethod
    def memory_estimate(cls, sizes: Mapping[str, Any]) -> int:
        """The bytes of its state for a run of ``sizes`` (``replicates``, ``num_agents``, ``num_arms``, ``steps``),
        before it is allocated: the communication graph's N × N adjacency (bytes) and, per replicate, agent and arm,
        six 8-byte statistics (counts, sums, estimates) and four tree-noise arrays of one entry per level of a
        horizon of ``steps`` rounds (⌊log₂ T⌋ + 1 levels), as the gossip protocols keep."""
        n, levels = sizes["num_agents"], sizes["steps"].bit_length()
        return n * n + sizes["replicates"] * n * sizes["num_arms"] * (6 + 4 * levels) * 8

    def __init__(self, topology: Topology, num_arms: int, horizon: int, replicates: int, seed: int,
                 backend: str) -> None:
        if not isinstance(topology, Topology):
            raise ConfigError(f"topology must be a fedrec.federation.topology.Topology, got {type(topology).__name__}")
        super().__init__(replicates, seed, backend, {"client": topology.num_agents})
        self.topology = topology
        self.num_agents = topology.num_agents
        self.num_arms = check_int("num_arms", num_arms, minimum=1)
        self.horizon = check_int("horizon", horizon, minimum=1)
        self.register_buffer("t", torch.zeros((), dtype=torch.long))

    def check_env(self, env: MultiAgentMAB) -> None:
        """The environment must have this protocol's agents, arms and replicates."""
        for field, mine in (("num_agents", self.num_agents), ("num_arms", self.num_arms),
                            ("replicates", self.replicates)):
            if getattr(env, field) != mine:
                raise ConfigError(f"env.{field} must equal the protocol's {field} ({mine}), got {getattr(env, field)}")

    def play(self, env: MultiAgentMAB, steps: int, return_arms: bool = False) -> Tensor | None:
        """Play ``steps`` rounds against ``env``; returns the arms (R, steps, N) with ``return_arms``, else None
        (long runs never materialise them)."""
        self.check_env(env)
        steps = check_int("steps", steps, minimum=0)
        if int(self.t) + steps > self.horizon:
            raise ConfigError(f"steps must keep the rounds within horizon={self.horizon}: {int(self.t)} played, "
                              f"got steps={steps}")
        self.check_channel()
        arms = torch.zeros(self.replicates, steps if return_arms else 0, self.num_agents, dtype=torch.long)
        if steps:
            self._play(env, steps, arms)
        return arms if return_arms else None

    @abstractmethod
    def _play(self, env: MultiAgentMAB, steps: int, arms: Tensor) -> None:
        """:meth:`play` on checked arguments; fills ``arms`` when its second dimension is ``steps``."""

    @abstractmethod
    def cumulative_regret(self) -> Tensor:
        """Each agent's pseudo-regret so far, (R, N)."""

    @abstractmethod
    def epsilon_spent(self) -> Tensor:
        """Each agent's privacy loss so far, (R, N): ``inf`` without privacy, 0 for an agent that releases
        nothing."""

    def summary(self) -> dict[str, Any]:
        """Protocol facts a run's summary reports beside its metrics."""
        return {"num_agents": self.num_agents, "num_arms": self.num_arms, "lambda2": self.topology.lambda2}


def policy_views(policy: LinearBandit) -> dict[str, tuple]:
    """A linear policy as the kernels take it: ``params`` (:class:`~fedrec.protocols.kernels.linear.LinearParams`)
    and ``rows`` (:class:`~fedrec.protocols.kernels.linear.PolicyRows`, zero-copy views of its buffers; LinUCB,
    which draws nothing, gets one unused draw counter and stream)."""
    draws = {} if isinstance(policy, LinTS) else {k: np.zeros(1, dtype=np.int64) for k in ("draws", "stream")}
    return {"params": build(LinearParams, policy.kernel_params()), "rows": build(PolicyRows, policy, **draws)}


def kernel_call(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a compiled kernel, restoring torch's thread count (numba's parallel layer may change it)."""
    threads = torch.get_num_threads()
    try:
        return fn(*args)
    finally:
        if torch.get_num_threads() != threads:  # pragma: no cover - depends on numba's threading layer
            torch.set_num_threads(threads)

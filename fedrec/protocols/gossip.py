"""Gossip_UCB and Fed_UCB (Zhu, Zhu, Liu & Liu, *Federated Bandit: A Gossiping Approach*, SIGMETRICS 2021):
N agents on a connected graph all pull an arm every round and gossip their estimates of the
global means over one random edge per round.

Both are :class:`GossipBandit` s: Gossip_UCB (Algorithm 1, eq. 11) is Fed_UCB (Algorithm 4, eq. 12, with the
noisy partial sums of Algorithms 2–3) at ε = ∞, and the two coincide draw for draw since the Laplace noise has
its own counter-based stream. The compiled step loop is :mod:`fedrec.protocols.kernels.gossip` (its docstring
lists the order of a round and how every draw is keyed); :meth:`GossipBandit._play_torch` is the readable
reference, batched over replicates, that the tests hold it to.

The same class and loop also play our two baselines (our choice, not in the paper: sanity checks only),
``mode="local"`` (:class:`LocalUCB`, UCB1 per agent without communication) and ``mode="central"``
(:class:`CentralUCB`, one UCB1 learner on the global means pulling one arm for all agents).

These protocols are :class:`~fedrec.protocols.base.MultiAgentProtocol` s: every agent acts in every round and the
rewards are drawn inside the step loop from the environment's counter-based stream (no (T × N × M) tensor).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from fedrec.envs.mab import MultiAgentMAB
from fedrec.errors import ConfigError, check_choice
from fedrec.federation.topology import Topology
from fedrec.privacy.accountant import LaplaceBasicAccountant
from fedrec.privacy.tree import TreeLaplace, cached_noise, mark_records
from fedrec.privacy.tree_noise import LAPLACE, node_noise_many
from fedrec.protocols.base import MultiAgentProtocol, kernel_call
from fedrec.protocols.kernels.gossip import (
    CENTRAL,
    GOSSIP,
    GOSSIP_RUN,
    LOCAL,
    GossipSettings,
    GossipState,
    Graph,
    PeerTraffic,
    Rounds,
)
from fedrec.utils.jit import build
from fedrec.utils.rng import KeyedRows, stream_key

#: ``mode`` of :class:`GossipBandit` → the kernel's code
MODES = {"gossip": GOSSIP, "local": LOCAL, "central": CENTRAL}


class GossipBandit(MultiAgentProtocol):
    """Fed_UCB (Algorithm 4) on ``topology`` with ``num_arms`` arms and horizon T; ε = ∞ is Gossip_UCB (Algorithm 1).

    Args:
        topology: the connected graph (N >= 2 agents).
        num_arms: M >= 1.
        horizon: T >= 1; it enters ε' = ε/⌈log₂ T⌉ and C̃, and bounds the rounds :meth:`play` may reach.
        replicates: independent trials run together.
        seed: keys the choice, edge and noise streams (:mod:`fedrec.protocols.kernels.gossip`).
        privacy: the Laplace tree noise of Fed_UCB (its ε, split and empty-interval reading), one stream per
            (agent, arm); None is ε = ∞, no noise.
        privacy_log2: use log₂ for the log²T · log t factor of C̃ (eq. 12 writes log without a
            base; default natural log everywhere).
        consistency_fresh: test the consistency rule against ñ(t+1) instead of ñ(t) (Algorithm 1
            computes ñ(t+1) in line 5 but tests against ñ(t) in line 6; the default is that literal reading).
        mode: ``"gossip"`` (the paper's algorithms), or one of our baselines (not in the paper, ε = ∞ only):
            ``"local"`` UCB1 per agent with index X̃_{i,k} + sqrt(2 ln t / n_{i,k}) and no communication at all (no
            count propagation, consistency rule or gossip; ϑ stays X̃), ``"central"`` one learner per replicate
            that pulls one arm for all N agents and sees their N rewards, with index (mean of all observations of
            k) + sqrt(2 ln t / Σ_i n_{i,k}), the count in observations (N per round, N at time 0). Both keep
            α₁ = 0, the ledger at zero, and the regret per agent with global means; the central learner's
            uploads are not modelled.
        backend: ``auto`` | ``compiled`` | ``torch``.

    State (buffers, (R, N, M) unless noted): ``n`` pulls incl. the time-0 pull, ``ntil`` ñ, ``x0`` X(0), ``sums``
    Σ_{τ>=1} of the rewards, ``xbar`` X̃ (noisy for finite ε), ``theta`` ϑ, the per-level noise state
    ``noise_last``/``noise_prev``/``noise_node``/``noise_value`` (R, N, M, ⌊log₂ T⌋ + 1) (the cached tree noise of
    :mod:`fedrec.privacy.tree_noise`, one stream per (r, i, k)), ``regret`` (R, N) the
    pseudo-regret Σ_t (μ_{k*} − μ_{a_i(t)}) with global means, and ``t`` the rounds played.
    """

    #: the kernel counts the gossip exchanges straight into the ledger (their payloads never pass the channel)
    honours_channel = False
    privacy_mechanisms = (TreeLaplace,)

    def __init__(
        self, topology: Topology, num_arms: int, horizon: int, replicates: int = 1, seed: int = 0,
        privacy: TreeLaplace | None = None, *, privacy_log2: bool = False, consistency_fresh: bool = False,
        mode: str = "gossip", backend: str = "auto",
    ) -> None:
        super().__init__(topology, num_arms, horizon, replicates, seed, backend)
        if privacy is not None and not isinstance(privacy, TreeLaplace):
            raise ConfigError(f"privacy must be a fedrec.privacy.TreeLaplace or None, got {type(privacy).__name__}")
        check_choice("mode", mode, MODES)
        if mode != "gossip" and privacy is not None and privacy.adds_noise:
            raise ConfigError(f"privacy.epsilon must be inf for the {mode} baseline (it adds no noise), got "
                              f"{privacy.epsilon!r}")
        self.mode = mode
        #: the tree noise (None: ε = ∞)
        self.privacy = privacy
        self.privacy_log2 = bool(privacy_log2)
        self.consistency_fresh = bool(consistency_fresh)
        N, T = self.num_agents, self.horizon
        #: Laplace scale b = 1/ε' of every dyadic node (sensitivity 1); 0 for ε = ∞
        self.scale = 0.0 if privacy is None else privacy.node_scale(T)
        gossip = mode == "gossip"
        #: α₁ = 64/N¹⁷ of eq. 11/12 (0 for the baselines)
        self.alpha1 = 64.0 / N ** 17 if gossip else 0.0
        #: the factor of ln t / n under the root: 2N (eq. 11/12) or 2 (UCB1 of the baselines)
        self.width_factor = 2.0 * N if gossip else 2.0
        log_T = math.log2(T) if self.privacy_log2 else math.log(T)
        #: P = 128 N log²T / ε² of eq. 12 (0 for ε = ∞)
        self.privacy_factor = 0.0 if math.isinf(self.epsilon) else 128.0 * N * log_T ** 2 / self.epsilon ** 2
        self.levels = TreeLaplace.levels(T)
        self.key_choice = stream_key(self.seed, "gossip.choice")
        self.key_edge = stream_key(self.seed, "gossip.edge")
        self.key_noise = stream_key(self.seed, "gossip.noise")
        R, M, L = self.replicates, self.num_arms, self.levels
        for name in ("n", "ntil"):
            self.register_buffer(name, torch.zeros(R, N, M, dtype=torch.long))
        for name in ("x0", "sums", "xbar", "theta"):
            self.register_buffer(name, torch.zeros(R, N, M, dtype=torch.float64))
        for name in ("noise_last", "noise_prev", "noise_node"):
            self.register_buffer(name, torch.zeros(R, N, M, L, dtype=torch.long))
        self.register_buffer("noise_value", torch.zeros(R, N, M, L, dtype=torch.float64))
        self.register_buffer("regret", torch.zeros(R, N, dtype=torch.float64))

    # ----------------------------------------------------------------------------------------------- privacy
    @property
    def epsilon(self) -> float:
        """The ε of every (agent, arm) stream (``inf``: no noise)."""
        return math.inf if self.privacy is None else self.privacy.epsilon

    def accountant(self) -> LaplaceBasicAccountant | None:
        """What one observation undergoes over the horizon: ⌊log₂ T⌋ + 1 Laplace node mechanisms at ε' = 1/b each
        (basic composition, :meth:`fedrec.privacy.TreeLaplace.accountant`); None for ε = ∞."""
        return None if self.privacy is None else self.privacy.accountant(self.horizon)

    def epsilon_spent(self) -> Tensor:
        """ε of every agent (R, N): each of its per-arm streams is ε-DP by the tree, and an observation lies in one
        stream (parallel composition). ``inf`` without noise; 0 for the local baseline, which releases nothing."""
        acc = self.accountant()
        eps = 0.0 if self.mode == "local" else math.inf if acc is None else acc.epsilon()
        return torch.full((self.replicates, self.num_agents), eps, dtype=torch.float64)

    def width(self, n: Tensor, t: int) -> Tensor:
        """C̃_{i,k}(t) of eq. 12 for pre-pull counts ``n`` (C of eq. 11 when ε = ∞): α₁ + sqrt(2N (P log t log n /
        n² + 1/n) log t), the formula of the kernel's ``ucb_width``; the baselines' sqrt(2 ln t / n) (``n``
        in observations for ``central``)."""
        log_t = math.log(t)
        log_t_privacy = log_t / math.log(2.0) if self.privacy_log2 else log_t
        nd = n.to(torch.float64)
        inv = 1.0 / nd
        return self.alpha1 + torch.sqrt(self.width_factor * (self.privacy_factor * log_t_privacy * torch.log(nd) * inv
                                                             * inv + inv) * log_t)

    def node_noise(self, replicate: Any, agent: Any, arm: Any, level: Any, index: Any) -> np.ndarray:
        """The Laplace noise of dyadic node (level, index) of stream (agent, arm), regenerated from the key
        (array arguments broadcast)."""
        r, i, k, lv, m = (np.ascontiguousarray(a, dtype=np.int64).ravel()
                          for a in np.broadcast_arrays(replicate, agent, arm, level, index))
        out = np.empty((len(r), 1))
        node_noise_many(self.key_noise, self._stream(r, i, k), lv, m, LAPLACE, self.scale, out)
        return out[:, 0]

    def _stream(self, replicate: Any, agent: Any, arm: Any) -> Any:
        """The noise (and reward) stream row (r·N + i)·M + k of (replicate, agent, arm)."""
        return (replicate * self.num_agents + agent) * self.num_arms + arm

    def _uniforms(self, key: np.uint64, rows: int, t: int) -> Tensor:
        """Draw t of streams 0 … ``rows`` − 1 under ``key`` (the kernel's choice and edge uniforms): (rows,)."""
        return torch.from_numpy(KeyedRows(key, np.arange(rows), t).draw("uniform", 1)[:, 0])

    # -------------------------------------------------------------------------------------------------- API
    def _play(self, env: MultiAgentMAB, steps: int, arms: Tensor) -> None:
        if self.use_compiled():
            self._play_compiled(env, steps, arms)
        else:
            self._play_torch(env, steps, arms)

    def cumulative_regret(self) -> Tensor:
        return self.regret

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "epsilon": self.epsilon}

    def _kernel_views(self) -> dict[str, tuple]:
        noise = dict(zip(("noise_last", "noise_prev", "noise_node", "noise_value"), self._noise_cache()))
        noise_empty = self.privacy is not None and self.privacy.noise_empty_intervals
        settings = build(GossipSettings, self, mode=MODES[self.mode], noise_empty_intervals=noise_empty,
                         bytes_per_scalar=self.channel.bytes_per_scalar)
        return {"graph": build(Graph, self.topology), "settings": settings, "state": build(GossipState, self, **noise),
                "traffic": build(PeerTraffic, {"client": self.ledger.traffic("client")})}

    def _noise_cache(self) -> tuple[Tensor, ...]:
        """Views of the noise buffers as the tree's caches, one row per stream (:meth:`_stream`): the (streams, L)
        node indices ``last``, ``prev``, ``node`` and the (streams, L, 1) scalar node noises."""
        L = self.levels
        return (self.noise_last.view(-1, L), self.noise_prev.view(-1, L), self.noise_node.view(-1, L),
                self.noise_value.view(-1, L, 1))

    def _play_compiled(self, env: MultiAgentMAB, steps: int, arms: Tensor) -> None:
        t0 = int(self.t)
        v = self.kernel_views()
        rounds = Rounds(t0=t0, steps=steps, initialise=t0 == 0, arms=arms.numpy())
        kernel_call(GOSSIP_RUN[self.replicates > 1], self.replicates, rounds, v["graph"], v["settings"], v["state"],
                    env.reward_source(), v["traffic"])
        self.t += steps

    # ------------------------------------------------------------------------------------- torch reference
    @torch.no_grad()
    def _play_torch(self, env: MultiAgentMAB, steps: int, arms: Tensor) -> None:
        """The reference step loop (Algorithms 1 and 4, and the baselines of ``mode``), one round of every replicate
        at a time."""
        R, N, M = self.replicates, self.num_agents, self.num_arms
        topo = self.topology
        neighbours = [torch.from_numpy(topo.indices[topo.indptr[i]:topo.indptr[i + 1]]) for i in range(N)]
        edges = torch.from_numpy(topo.edges)
        global_means = torch.from_numpy(np.ascontiguousarray(env.global_means))
        best = global_means.amax(1)
        reps = torch.arange(R)
        gossip, central = self.mode == "gossip", self.mode == "central"
        if int(self.t) == 0:  # time 0: every agent pulls every arm once
            for k in range(M):
                self.x0[:, :, k] = torch.from_numpy(env.rewards(np.full((R, N), k), 0))
            self.xbar.copy_(self.x0)
            self.theta.copy_(self.x0)
            self.n.fill_(1)
            self.ntil.fill_(1)
            if central:
                self.theta.copy_(self.x0.mean(1, keepdim=True).expand_as(self.x0))
        for s in range(steps):
            t = int(self.t) + 1
            u = self._uniforms(self.key_choice, R * N, t).view(R, N)
            if central:  # one learner: the pooled index, agent 0's draw breaks ties, every agent pulls its arm
                q = self.theta[:, :1] + self.width(self.n.sum(1, keepdim=True), t)
                a = _uniform_pick(q == q.amax(-1, keepdim=True), u[:, :1]).expand(R, N).contiguous()
            elif gossip:
                # lines 3–5: ñ(t+1) = max(n(t), max_{j ∈ N_i} ñ_j(t)) (eq. 1), n(t) the pre-pull count
                ntil_next = torch.stack([torch.maximum(self.n[:, i], self.ntil[:, nb].amax(1))
                                         for i, nb in enumerate(neighbours)], 1)
                # lines 6–13: a lagging arm if any (consistency rule), else argmax of ϑ + C̃ (eq. 11/12)
                lagging = self.n < (ntil_next if self.consistency_fresh else self.ntil) - N
                q = self.theta + self.width(self.n, t)
                top = q == q.amax(-1, keepdim=True)
                a = _uniform_pick(torch.where(lagging.any(-1, keepdim=True), lagging, top), u)
            else:  # local UCB1 on the agent's own mean (ϑ = X̃)
                q = self.theta + self.width(self.n, t)
                a = _uniform_pick(q == q.amax(-1, keepdim=True), u)
            # lines 14–15: observe, n += 1, the (noisy) sample mean of all n observations incl. X(0)
            x = torch.from_numpy(env.rewards(a.numpy(), t))
            idx = a.unsqueeze(-1)
            self.n.scatter_add_(2, idx, torch.ones_like(idx))
            self.sums.scatter_add_(2, idx, x.unsqueeze(-1))
            total = self.x0.gather(2, idx) + self.sums.gather(2, idx)
            if self.scale > 0.0:
                total = total + self._cover_noise(a, t).unsqueeze(-1)
            mean = total / self.n.gather(2, idx).to(torch.float64)
            d = torch.zeros_like(self.xbar).scatter_(2, idx, mean - self.xbar.gather(2, idx))
            self.xbar.scatter_(2, idx, mean)
            self.regret += best.unsqueeze(1) - global_means.gather(1, a)
            if central:  # ϑ of the pulled arm: the mean of all its observations over the agents
                arm = a[:, 0]
                pooled = (self.x0 + self.sums)[reps, :, arm].sum(1) / self.n[reps, :, arm].sum(1).to(torch.float64)
                self.theta[reps, :, arm] = pooled.unsqueeze(1)
            elif gossip:
                # lines 16–22: one uniformly random edge (u, v); ϑ(t) = W(t) ϑ(t−1) + X̃(t) − X̃(t−1)
                u_edge = self._uniforms(self.key_edge, R, t)
                e = (u_edge * topo.num_edges).floor().long().clamp(max=topo.num_edges - 1)
                eu, ev = edges[e, 0], edges[e, 1]
                avg = (self.theta[reps, eu] + self.theta[reps, ev]) * 0.5
                theta = self.theta + d
                theta[reps, eu] = avg + d[reps, eu]
                theta[reps, ev] = avg + d[reps, ev]
                self.theta.copy_(theta)
                self.channel.send("peer", ("client", torch.cat([eu, ev])), ("client", torch.cat([ev, eu])), None, M,
                                  torch.cat([reps, reps]))
                self.ntil.copy_(ntil_next)
            else:  # W(t) = I: ϑ(t) = ϑ(t−1) + X̃(t) − X̃(t−1)
                self.theta += d
            if arms.shape[1]:
                arms[:, s] = a
            self.t += 1

    def _cover_noise(self, a: Tensor, t: int) -> Tensor:
        """Σ of the cached Laplace noises of the non-empty dyadic nodes covering 1..t (Alg. 2–3) for the
        arms ``a`` (R, N) pulled at round t, after marking those pulls: (R, N). The torch form of the kernel's
        tree noise (:func:`fedrec.privacy.tree.mark_records`, :func:`~fedrec.privacy.tree.cached_noise`)."""
        R, N = a.shape
        r, i = torch.meshgrid(torch.arange(R), torch.arange(N), indexing="ij")
        rows, times = self._stream(r, i, a).flatten(), torch.full((R * N,), t)
        last, prev, node, value = self._noise_cache()
        mark_records(rows, times, last, prev)
        total = cached_noise(self.key_noise, rows, times, LAPLACE, self.scale, self.privacy.noise_empty_intervals,
                             last, prev, node, value)
        return total.view(R, N)


def _uniform_pick(candidates: Tensor, u: Tensor) -> Tensor:
    """The ⌊u·c⌋-th (0-based) True entry along the last dimension of ``candidates``, c the number of Trues."""
    count = candidates.sum(-1)
    pick = torch.minimum((u * count).floor().long(), count - 1)
    return ((candidates.cumsum(-1) == (pick + 1).unsqueeze(-1)) & candidates).to(torch.uint8).argmax(-1)


class GossipUCB(GossipBandit):
    """Gossip_UCB (Algorithm 1): UCB index ϑ + C of eq. 11, no privacy noise."""

    privacy_mechanisms = ()  # ε = ∞ only

    def __init__(self, topology: Topology, num_arms: int, horizon: int, replicates: int = 1, seed: int = 0, *,
                 consistency_fresh: bool = False, backend: str = "auto") -> None:
        super().__init__(topology, num_arms, horizon, replicates, seed, consistency_fresh=consistency_fresh,
                         backend=backend)


class FedUCB(GossipBandit):
    """Fed_UCB (Algorithm 4): ε-DP noisy sample means from Laplace tree noise (``privacy``) and the index ϑ̃ + C̃ of
    eq. 12; without privacy (or at ε = ∞) it is Gossip_UCB."""




class LocalUCB(GossipBandit):
    """Our local-only baseline (our choice, not in the paper): UCB1 per agent, index X̃_{i,k} + sqrt(2 ln t /
    n_{i,k}), no communication (``mode="local"``); it converges to each agent's local best arm."""

    privacy_mechanisms = ()  # ε = ∞ only

    def __init__(self, topology: Topology, num_arms: int, horizon: int, replicates: int = 1, seed: int = 0, *,
                 backend: str = "auto") -> None:
        super().__init__(topology, num_arms, horizon, replicates, seed, mode="local", backend=backend)


class CentralUCB(GossipBandit):
    """Our centralised baseline (our choice, not in the paper): one UCB1 learner per replicate on the global
    means pulls one arm for all N agents each round, index (mean of all observations of k) + sqrt(2 ln t / Σ_i
    n_{i,k}) with the count in observations (``mode="central"``)."""

    privacy_mechanisms = ()  # ε = ∞ only

    def __init__(self, topology: Topology, num_arms: int, horizon: int, replicates: int = 1, seed: int = 0, *,
                 backend: str = "auto") -> None:
        super().__init__(topology, num_arms, horizon, replicates, seed, mode="central", backend=backend)

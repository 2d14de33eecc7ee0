"""BGTplanner (Zhang et al., paper §V, Algorithms 1–3): a contextual bandit with
knapsacks that picks one of A budget levels per round.

* context x^t: the top-d singular values of the round's client × item upload matrix X^t (§V-A), the square roots
  of the top eigenvalues of its Gram matrix on the smaller side (dense, or ARPACK on the sparse X^t's Gram operator);
* reward predictor: Gaussian-process regression on z = [a, x^t] with the kernel of Eq. 4, a squared exponential
  on z times (1−α)^{|t−t'|/2}, which is a Matérn-½ kernel on the round index with length −2/ln(1−α)
  (fixed hyper-parameters, observation noise σ_μ² on the diagonal only; posterior mean Eq. 5), conditioned one
  observation at a time (a Cholesky row each, :class:`IncrementalGP`; scikit-learn's refit is the reference);
* constraint: dual variables on the (U+1)-simplex (one slack coordinate) updated by entropic online mirror
  descent (Eq. 8), scaled by Λ from the initial stage's LP (Eqs. 9–10, ``scipy.optimize.linprog``);
* allocator: inverse-gap weighting over the scores of Eq. 11 (Eqs. 12–13) with γ = 2·sqrt(A·T/((U+2)·ln T)).

Sign of the constraint term (§V-B): by default the score *penalises* spending above the per-round target,
``β(a) = μ(a) + Λ⟨ρ − C(a), λ̃⟩`` with dual gradient ``ρ − C(a)`` (the source method [36] and the authors'
code); ``paper_sign=True`` is the printed Eqs. 6–11, which reward spending and drive λ to 0.
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from fedrec.errors import ConfigError, check_choice, check_float, check_int
from fedrec.planners.base import BudgetPlanner
from fedrec.planners.gram import gram_operator, load_kernels
from fedrec.privacy.client_dp import BUDGET_MARGIN
from fedrec.utils.seeding import numpy_generator
from fedrec.utils.threads import torch_threads

if TYPE_CHECKING:
    from fedrec.tasks.recommendation import FedRecTask

ACTION_GRIDS = ("linspace", "code")
RHO_RULES = ("paper", "remaining")


def action_levels(total: float, rounds: int, min_rounds: int, num_actions: int, grid: str = "linspace") -> Tensor:
    """The A budget levels spread over [total/T, total/T_min] (paper §VII-A: "uniformly distributes"): both ends
    included (``linspace``), or the authors' ``lo + i(hi − lo)/A`` for i < A, which omits the top (``code``)."""
    lo, hi = total / rounds, total / min_rounds
    if grid == "linspace":
        return torch.linspace(lo, hi, num_actions, dtype=torch.float64)
    return lo + torch.arange(num_actions, dtype=torch.float64) * (hi - lo) / num_actions


def igw_gamma(num_actions: int, rounds: int, num_clients: int) -> float:
    """γ = 2·sqrt(A·T / ((U + 2)·ln T)) (from [36]; natural log as the authors' code)."""
    return 2.0 * math.sqrt(num_actions * rounds / ((num_clients + 2) * math.log(rounds)))


def igw_probabilities(scores: Tensor, gamma: float) -> Tensor:
    """Inverse-gap weighting (Eqs. 12–13): p(a) = 1 / (n + γ(β_max − β(a))) for a ≠ argmax, the rest to argmax."""
    n = scores.numel()
    best = int(torch.argmax(scores))
    p = 1.0 / (n + gamma * (scores[best] - scores))
    p[best] = 0.0
    p[best] = 1.0 - p.sum()
    return p


#: upload matrices whose smaller side is at most this many rows/columns take the dense Gram route
DENSE_SIDE = 128
#: ARPACK's relative tolerance on the Ritz values of the Gram matrix (eigenvalues = squared singular values): a
#: bound of 5e-7 on the singular values' relative error; measured ≤ 3e-13 on ML-100K's X^t, in 26–33 Gram products
#: with ARPACK's default basis of 2k + 1 vectors (a tolerance of 1e-8 or a basis of 30 took up to 52)
GRAM_TOL = 1e-6


def upload_context(X: Any, dim: int) -> np.ndarray:
    """The top ``dim`` singular values of the sparse 0/1 matrix X^t, descending (zero-padded past its rank).

    They are the square roots of the top eigenvalues of the Gram matrix on X's smaller side (X Xᵀ or Xᵀ X, in
    float64): by a dense symmetric eigensolver when that side has at most :data:`DENSE_SIDE` rows, else by
    ARPACK on the Gram operator of the sparse X (:func:`gram_top_eigenvalues`). Eigenvalues within rounding of
    zero (below ``max(X.shape)·eps·λ_max``) are exact zeros, so a rank-deficient X gets zeros past its rank
    (PROPACK returned a spurious value there). Tests: equal to a dense SVD to 1e-6 relative.
    """
    k = int(dim)
    if k <= 0:
        return np.zeros(0)
    X = X.tocsr().astype(np.float64, copy=False)  # 0/1 entries are exact
    small = min(X.shape)
    if X.nnz == 0 or small == 0:
        lam = np.zeros(0)
    elif small <= max(DENSE_SIDE, k + 1):
        G = (X @ X.T if X.shape[0] <= X.shape[1] else X.T @ X).toarray()
        lam = np.linalg.eigvalsh(G)[::-1][:k]
    else:
        lam = gram_top_eigenvalues(X, k)
    if len(lam):
        lam = np.where(lam > max(X.shape) * np.finfo(np.float64).eps * lam[0], lam, 0.0)
    s = np.sqrt(lam)
    return np.pad(s, (0, k - len(s)))


def gram_top_eigenvalues(X: Any, k: int, tol: float = GRAM_TOL) -> np.ndarray:
    """The top ``k`` eigenvalues (descending) of the Gram matrix on the smaller side of the sparse float64 ``X``
    (X Xᵀ or Xᵀ X), by ARPACK's implicitly restarted Lanczos (``scipy.sparse.linalg.eigsh``) on
    :func:`fedrec.planners.gram.gram_operator`, two passes over X: the Gram matrix is never formed. The start
    vector is fixed, so the result is a function of X alone. Like every single-vector Krylov method it finds a
    second copy of a repeated eigenvalue only through rounding; upload matrices with random pseudo items have no
    exact symmetry."""
    from scipy.sparse.linalg import LinearOperator, eigsh

    product = gram_operator(X)
    n = min(X.shape)

    def matvec(v: np.ndarray) -> np.ndarray:
        out = np.empty(n)
        product(np.ascontiguousarray(v, dtype=np.float64).reshape(-1), out)
        return out

    gram = LinearOperator((n, n), matvec=matvec, dtype=np.float64)
    v0 = np.random.default_rng(0).standard_normal(n)
    lam = eigsh(gram, k=k, which="LA", v0=v0, tol=tol, return_eigenvectors=False)
    return np.maximum(np.sort(lam)[::-1], 0.0)


def top_affordable_level(privacy: Any, levels: Tensor, holding: Tensor) -> int | None:
    """The highest level index every client in ``holding`` can afford now (None: not even the lowest), asking the
    accountant from the top down: one query when the top level is affordable (most rounds). Levels increase with
    the index and spending is monotone in the level, so the affordable levels are the prefix up to it."""
    return next((a for a in reversed(range(len(levels))) if privacy.affordable(float(levels[a]), holding)), None)


def solve_opt(rhat: np.ndarray, costs: np.ndarray, bound: float) -> float:
    """OPT̂ of the LP (9a–9c): max (1/T₀) Σ_t Σ_a r̂(a, x_t) o_{a,t} s.t. (1/T₀) Σ_t Σ_a C(a) o_{a,t} ≤ bound,
    o ≥ 0, Σ_a o_{a,t} = 1 for each t (a randomised policy per stage-2 context). ``rhat`` is ``(A, T₀)``."""
    from scipy.optimize import linprog

    A, T0 = rhat.shape
    c = -rhat.T.reshape(-1) / T0  # variables o[t, a], row-major
    a_ub = np.tile(costs, T0)[None, :] / T0
    a_eq = np.kron(np.eye(T0), np.ones((1, A)))
    res = linprog(c, A_ub=a_ub, b_ub=[bound], A_eq=a_eq, b_eq=np.ones(T0), bounds=(0, None), method="highs")
    if res.status != 0:
        raise RuntimeError(f"BGTplanner's initial-stage LP failed: {res.message}")
    return float(-res.fun)


_BLAS_CONTROLLER: Any = None


def _blas_controller() -> Any:
    """threadpoolctl's controller of the loaded BLAS libraries, built once (listing them takes ~15 ms)."""
    global _BLAS_CONTROLLER
    if _BLAS_CONTROLLER is None:
        import scipy.linalg  # noqa: F401  (load scipy's BLAS before the controller lists the libraries)
        import scipy.sparse.linalg  # noqa: F401
        from threadpoolctl import ThreadpoolController

        _BLAS_CONTROLLER = ThreadpoolController()
    return _BLAS_CONTROLLER


@contextmanager
def single_thread() -> Iterator[None]:
    """Run the enclosed code with torch's intra-op pool and numpy's/scipy's BLAS on one thread (restored on
    exit). The planner's per-round work is small (X^t's ~10⁵ ids, 943-long vectors, matrices of ≤ 100 rows):
    waking a second thread costs more than it saves, and much more when another process holds the other core
    (measured on 2 shared cores: building X^t 93 ms with two torch threads against 7 ms with one; the GP
    posterior 8 ms with two BLAS threads against 0.13 ms). Results do not depend on the thread count here."""
    with torch_threads(1), _blas_controller().limit(limits=1, user_api="blas"):
        yield


#: the length scale that takes a coordinate out of a stationary sklearn kernel (sklearn has no active_dims): its
#: share of any squared distance here is below (100 / 1e12)² = 1e-20 (in the Matérn-½ factor, whose distance is
#: not squared, it moves k by up to ‖z − z'‖·1e-12 when t = t': ~1e-13 here)
IGNORED = 1e12


class RewardGP:
    """GP regression of rewards on (z, t) with the kernel of Eq. 4 and fixed hyper-parameters (scikit-learn).

    The kernel is ``RBF(z; s) × Matern_½(t; −2/ln(1−α))``, each factor blind to the other's coordinates (length
    scale :data:`IGNORED` there); ``GaussianProcessRegressor(alpha=σ_μ², optimizer=None)`` adds σ_μ² to the
    diagonal only and returns the posterior of the latent f (Eq. 5 and its noise-free variance).

    Args:
        lengthscale: s of the squared exponential on z.
        temporal: α of the temporal factor (1−α)^{|t−t'|/2}; 0 switches it off.
        noise: σ_μ, the observation noise standard deviation.
    """

    def __init__(self, lengthscale: float = 0.2, temporal: float = 0.001, noise: float = 0.1) -> None:
        self.lengthscale = check_float("planner.lengthscale", lengthscale, low=0.0, low_open=True)
        self.temporal = check_float("planner.temporal", temporal, low=0.0, high=1.0, high_open=True)
        self.noise = check_float("planner.gp_noise", noise, low=0.0, low_open=True)

    @property
    def time_lengthscale(self) -> float:
        """ℓ_t with (1−α)^{|Δt|/2} = exp(−|Δt| / ℓ_t)."""
        return -2.0 / math.log1p(-self.temporal)

    def kernel_object(self, dim: int) -> Any:
        """The sklearn kernel over inputs ``[z (dim columns), t]``."""
        from sklearn.gaussian_process.kernels import RBF, Matern

        rbf = RBF(length_scale=[self.lengthscale] * dim + [IGNORED], length_scale_bounds="fixed")
        if self.temporal == 0:
            return rbf
        return rbf * Matern(length_scale=[IGNORED] * dim + [self.time_lengthscale], nu=0.5,
                            length_scale_bounds="fixed")

    def kernel(self, z1: np.ndarray, t1: np.ndarray, z2: np.ndarray, t2: np.ndarray) -> np.ndarray:
        """The kernel matrix between (z1, t1) and (z2, t2): Eq. 4 in closed form, ``exp(−‖z−z'‖²/(2s²)) ·
        exp(−|t−t'|/ℓ_t)``; :meth:`kernel_object` is the same kernel in scikit-learn (tests: equal to 1e-12)."""
        from scipy.spatial.distance import cdist

        z1, z2 = np.asarray(z1, dtype=np.float64), np.asarray(z2, dtype=np.float64)
        K = np.exp(-0.5 * cdist(z1 / self.lengthscale, z2 / self.lengthscale, "sqeuclidean"))
        if self.temporal != 0:
            dt = np.abs(np.asarray(t1, dtype=np.float64)[:, None] - np.asarray(t2, dtype=np.float64)[None, :])
            K *= np.exp(-dt / self.time_lengthscale)
        return K

    def posterior(self, z: np.ndarray, t: np.ndarray, r: np.ndarray, z_new: np.ndarray,
                  t_new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean (Eq. 5) and noise-free variance of f at (z_new, t_new) given rewards r at (z, t); the
        prior (0, 1) without observations. Refits scikit-learn's regressor on the whole history: the reference
        that :class:`IncrementalGP` (what the planner uses) equals to 1e-8."""
        if len(r) == 0:
            return np.zeros(len(z_new)), np.ones(len(z_new))
        from sklearn.gaussian_process import GaussianProcessRegressor

        gpr = GaussianProcessRegressor(self.kernel_object(z.shape[1]), alpha=self.noise**2, optimizer=None,
                                       normalize_y=False)
        gpr.fit(_inputs(z, t), np.asarray(r, dtype=np.float64))
        mean, std = gpr.predict(_inputs(z_new, t_new), return_std=True)
        return mean, std**2


def _inputs(z: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.column_stack([np.asarray(z, dtype=np.float64), np.asarray(t, dtype=np.float64)])


class IncrementalGP:
    """The posterior of a :class:`RewardGP` over a history that grows one observation at a time: the Cholesky
    factor L of K + σ_μ² I gains one row per observation (a triangular solve, O(n²)) instead of a refit (O(n³));
    w = L⁻¹ r grows with it. Then mean = (L⁻¹ k*)ᵀ w and variance = k(z*, z*) − ‖L⁻¹ k*‖², as
    ``GaussianProcessRegressor(optimizer=None)`` computes them (the hyper-parameters are fixed, paper §V-A).

    Args:
        gp: the kernel and noise.
        dim: columns of z.
    """

    def __init__(self, gp: RewardGP, dim: int) -> None:
        self.gp, self.dim, self.n = gp, int(dim), 0
        self._alloc(32)

    def _alloc(self, capacity: int) -> None:
        n = self.n
        z, t, L, w = (np.empty((capacity, self.dim)), np.empty(capacity), np.zeros((capacity, capacity)),
                      np.empty(capacity))
        if n:
            z[:n], t[:n], L[:n, :n], w[:n] = self.z[:n], self.t[:n], self.L[:n, :n], self.w[:n]
        self.z, self.t, self.L, self.w = z, t, L, w

    def add(self, z: Any, t: float, r: float) -> None:
        """Condition on one more observation: reward ``r`` at input ``z``, round ``t``."""
        from scipy.linalg import solve_triangular

        n = self.n
        if n == len(self.t):
            self._alloc(2 * n)
        z = np.asarray(z, dtype=np.float64).reshape(self.dim)
        k = self.gp.kernel(z[None, :], np.array([t], dtype=np.float64), self.z[:n], self.t[:n])[0]
        row = solve_triangular(self.L[:n, :n], k, lower=True, check_finite=False) if n else k
        pivot = 1.0 + self.gp.noise**2 - float(row @ row)  # k(z, z) = 1
        if not pivot > 0:
            raise np.linalg.LinAlgError(f"GP: K + noise² I is not positive definite at observation {n}")
        d = math.sqrt(pivot)
        self.L[n, :n], self.L[n, n] = row, d
        self.w[n] = (float(r) - float(row @ self.w[:n])) / d
        self.z[n], self.t[n] = z, float(t)
        self.n = n + 1

    def posterior(self, z_new: np.ndarray, t_new: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean (Eq. 5) and noise-free variance of f at (z_new, t_new); the prior (0, 1) without
        observations. Negative variances from rounding are 0, as scikit-learn returns them."""
        from scipy.linalg import solve_triangular

        z_new = np.asarray(z_new, dtype=np.float64).reshape(-1, self.dim)
        if self.n == 0:
            return np.zeros(len(z_new)), np.ones(len(z_new))
        n = self.n
        Ks = self.gp.kernel(z_new, np.asarray(t_new, dtype=np.float64), self.z[:n], self.t[:n])
        V = solve_triangular(self.L[:n, :n], Ks.T, lower=True, check_finite=False)
        return V.T @ self.w[:n], np.maximum(1.0 - np.einsum("ij,ij->j", V, V), 0.0)


class BGTPlanner(BudgetPlanner):
    """BGTplanner as a budget planner (see the module docstring; defaults are the paper's, §VII-A).

    Args:
        num_actions: A, budget levels.
        initial_rounds: T₀; the initial stage lasts (A+1)·T₀ rounds (each level T₀ times in blocks, then T₀
            uniformly random levels).
        min_rounds: T_min; levels span [B/T, B/T_min] with B the per-client total budget.
        lengthscale, temporal, gp_noise: s, α, σ_μ of the GP.
        context_dim: d, singular values in the context.
        scale_features: feed the GP ``a/(A−1)`` and ``x/‖x‖`` instead of the raw index and singular values (the
            paper and the authors' code use raw values, with which different actions are nearly uncorrelated).
        paper_sign: the printed sign of the constraint term (module docstring).
        rho: the per-round target ρ in the dual: ``"paper"`` B/T (Eq. 6) or ``"remaining"`` what is left after
            the initial stage over the rounds left (authors' code).
        action_grid: ``"linspace"`` (paper) or ``"code"`` (authors').
        eta: OMD step; None = 2 ln(U)/√T (authors' code). gamma: IGW γ; None = Eq. of [36].
        reward_scale: the GP is fitted to ``reward_scale ·`` r^t (1: the paper's RMSE decrease, ~1e-3 a round,
            against a dual penalty Λ⟨ρ − C(a), λ̃⟩ of order 1; a study knob, ``scripts/bgtplanner_sensitivity.py``).
        seed: seeds the random levels (stage 2 and the IGW draws), per round.

    The summary says how much the GP mattered in the planned rounds (stage ③): in how many of them its mean
    changed the score's argmax from the penalty's alone, and the mean total-variation distance between the
    sampling distribution and the one the penalty alone gives.
    """

    name = "bgtplanner"

    def __init__(
        self,
        num_actions: int = 5,
        initial_rounds: int = 5,
        min_rounds: int = 70,
        lengthscale: float = 0.2,
        temporal: float = 0.001,
        gp_noise: float = 0.1,
        context_dim: int = 5,
        scale_features: bool = False,
        paper_sign: bool = False,
        rho: str = "paper",
        action_grid: str = "linspace",
        eta: float | None = None,
        gamma: float | None = None,
        reward_scale: float = 1.0,
        seed: int = 0,
        reward_split: str = "val",
    ) -> None:
        super().__init__(reward_split)
        self.num_actions = check_int("planner.num_actions", num_actions, minimum=2)
        self.initial_rounds = check_int("planner.initial_rounds", initial_rounds, minimum=1)
        self.min_rounds = check_int("planner.min_rounds", min_rounds, minimum=1)
        self.gp = RewardGP(lengthscale, temporal, gp_noise)
        self.context_dim = check_int("planner.context_dim", context_dim)
        self.scale_features = bool(scale_features)
        self.sign = -1.0 if paper_sign else 1.0
        check_choice("planner.rho", rho, RHO_RULES)
        check_choice("planner.action_grid", action_grid, ACTION_GRIDS)
        self.rho_rule, self.action_grid = rho, action_grid
        self.eta_arg = None if eta is None else check_float("planner.eta", eta, low=0.0, low_open=True)
        self.gamma_arg = None if gamma is None else check_float("planner.gamma", gamma, low=0.0)
        self.reward_scale = check_float("planner.reward_scale", reward_scale, low=0.0, low_open=True)
        self.seed = int(seed)
        # state
        self.z: list[list[float]] = []  # GP inputs [a, x] of the rounds played
        self.t: list[int] = []
        self.r: list[float] = []
        self.actions: list[int] = []
        self.stage2_errors: list[float] = []
        self.stage2_contexts: list[tuple[int, list[float]]] = []
        self.gp_effect: list[tuple[bool, float]] = []  # per planned round: (argmax changed by μ, TV distance)
        self.dual: Tensor | None = None
        self.big_lambda: float | None = None
        self.M: float | None = None
        self.rho: float | None = None
        self._pending: dict[str, Any] | None = None
        self._posterior: IncrementalGP | None = None  # the GP conditioned on (z, t, r) so far (rebuilt on resume)
        self._settled: tuple[Tensor, set[float]] | None = None  # this round's clients and their affordable levels
        #: seconds spent in parts of the hooks (building X^t is the task's upload_items), for scripts/bench_fedgnn.py
        self.part_seconds = {"upload_matrix": 0.0, "context": 0.0, "accountant": 0.0, "gp": 0.0}

    # ---- setup -----------------------------------------------------------------------------------------------
    @property
    def stage_rounds(self) -> int:
        return (self.num_actions + 1) * self.initial_rounds

    def setup(self, task: FedRecTask) -> None:
        T, U, A = self.rounds, task.data.num_clients, self.num_actions
        if self.min_rounds > T:
            raise ConfigError(f"planner.min_rounds (T_min = {self.min_rounds}) must be at most task.rounds ({T})")
        if self.stage_rounds >= T:
            raise ConfigError(f"planner: the initial stage ((A+1)·T0 = {self.stage_rounds} rounds) must be shorter "
                              f"than task.rounds ({T})")
        # the margin keeps T rounds at the lowest level (or T_min at the highest) affordable despite float rounding
        self.levels = action_levels(self.total_budget * (1 - BUDGET_MARGIN), T, self.min_rounds, A, self.action_grid)
        self.gamma = igw_gamma(A, T, U) if self.gamma_arg is None else self.gamma_arg
        self.eta = 2.0 * math.log(U) / math.sqrt(T) if self.eta_arg is None else self.eta_arg
        self.num_clients = U
        _blas_controller()  # list the BLAS libraries once, before the rounds
        load_kernels()  # and compile (or load) the Gram kernel
        if self.dual is None:
            self.dual = torch.full((U + 1,), 1.0 / (U + 1), dtype=torch.float64)  # slack coordinate last

    # ---- GP --------------------------------------------------------------------------------------------------
    def features(self, action: int, context: np.ndarray) -> list[float]:
        x = np.asarray(context, dtype=np.float64)
        if self.scale_features:
            norm = np.linalg.norm(x)
            return [action / (self.num_actions - 1), *(x / norm if norm > 0 else x)]
        return [float(action), *x]

    def predict(self, context: np.ndarray, round_idx: int, actions: list[int] | None = None) -> Tensor:
        """GP posterior mean reward of each action (default: all) at this context and round, given every
        observation so far (:class:`IncrementalGP`: equal to refitting scikit-learn's regressor on the history)."""
        started = time.perf_counter()
        acts = list(range(self.num_actions)) if actions is None else actions
        zq = np.array([self.features(a, context) for a in acts])
        mean, _ = self.posterior_model().posterior(zq, np.full(len(acts), round_idx, dtype=np.float64))
        self.part_seconds["gp"] += time.perf_counter() - started
        return torch.from_numpy(mean)

    def posterior_model(self) -> IncrementalGP:
        """The GP conditioned on every observation in (z, t, r): the observations added since the last call are
        appended to its Cholesky factor."""
        gp = self._posterior
        if gp is None or gp.n > len(self.r):
            gp = self._posterior = IncrementalGP(self.gp, 1 + self.context_dim)
        for i in range(gp.n, len(self.r)):
            gp.add(self.z[i], self.t[i], self.r[i])
        return gp

    # ---- initial stage end: Λ (Eqs. 9–10) -------------------------------------------------------------------------
    def _estimate_lambda(self) -> None:
        T0, A, T = self.initial_rounds, self.num_actions, self.rounds
        E = float(np.mean(self.stage2_errors))
        self.M = math.sqrt(A * E + 4.0 * math.log(T * self.num_clients) / T0)
        rhat = np.stack([self.predict(np.asarray(x), t).numpy() for t, x in self.stage2_contexts], 1)  # (A, T0)
        opt = solve_opt(rhat, self.levels.numpy(), self.total_budget / T + 2 * self.M)
        self.big_lambda = T / self.total_budget * (opt + self.M)
        spent = float(sum(self.budgets))
        self.rho = (self.total_budget / T if self.rho_rule == "paper"
                    else (self.total_budget - spent) / (T - self.stage_rounds))

    # ---- planner hooks ----------------------------------------------------------------------------------------
    def choose(self, task: FedRecTask, round_idx: int, holding: Tensor) -> float | None:
        with single_thread():
            return self._choose(task, round_idx, holding)

    def _choose(self, task: FedRecTask, round_idx: int, holding: Tensor) -> float | None:
        clock, parts = time.perf_counter, self.part_seconds
        started = clock()
        X = task.upload_items(round_idx)  # X^t: built once per round
        parts["upload_matrix"] += clock() - started
        started = clock()
        context = upload_context(X, self.context_dim)
        parts["context"] += clock() - started
        started = clock()
        top = top_affordable_level(task.privacy, self.levels, holding)
        parts["accountant"] += clock() - started
        if top is None:
            self._settled = None
            return None
        feasible = list(range(top + 1))
        self._settled = (holding, {float(self.levels[a]) for a in feasible})
        rng = numpy_generator(self.seed, "bgtplanner", round_idx)
        T0, A = self.initial_rounds, self.num_actions
        pending: dict[str, Any] = {"context": context.tolist(), "round": round_idx}
        if round_idx < A * T0:  # stage ①: each level T0 times, in blocks (capped at the top affordable level)
            a = min(round_idx // T0, top)
        elif round_idx < self.stage_rounds:  # stage ②: uniformly random levels, predicted before observing
            a = int(rng.choice(feasible))
            pending["prediction"] = float(self.predict(context, round_idx, [a])[0])
        else:
            if self.big_lambda is None:
                self._estimate_lambda()
            mu = self.predict(context, round_idx, feasible)
            cost = self.levels[feasible]
            penalty = (self.rho - cost) * float(self.dual[:-1].sum())  # ⟨ρ − C(a), λ̃_{1:U}⟩, same for all clients
            scores = mu + self.sign * self.big_lambda * penalty
            p = igw_probabilities(scores, self.gamma)
            a = feasible[int(rng.choice(len(feasible), p=p.numpy() / float(p.sum())))]
            alone = self.sign * self.big_lambda * penalty  # what the dual alone would score
            pending["gp_effect"] = (int(scores.argmax()) != int(alone.argmax()),
                                    0.5 * float((p - igw_probabilities(alone, self.gamma)).abs().sum()))
        pending["action"] = a
        self._pending = pending
        return float(self.levels[a])

    def affordable(self, task: FedRecTask, budget: float, holding: Tensor) -> bool:
        """A level of the affordable prefix :meth:`choose` settled for these clients this round is affordable
        without asking the accountant again; anything else is asked."""
        settled, self._settled = self._settled, None
        if settled is not None and settled[0] is holding and float(budget) in settled[1]:
            return True
        return super().affordable(task, budget, holding)

    def observe(self, task: FedRecTask, round_idx: int, budget: float, reward: float) -> None:
        with single_thread():
            self._observe(round_idx, reward)

    def _observe(self, round_idx: int, reward: float) -> None:
        pend = self._pending
        a = pend["action"]
        reward = self.reward_scale * reward
        if "prediction" in pend:  # a stage-② round (recorded only once it has run)
            self.stage2_errors.append((pend["prediction"] - reward) ** 2)
            self.stage2_contexts.append((round_idx, list(pend["context"])))
        if "gp_effect" in pend:
            self.gp_effect.append(pend["gp_effect"])
        self.z.append(self.features(a, np.asarray(pend["context"])))
        self.t.append(round_idx)
        self.r.append(reward)
        started = time.perf_counter()
        self.posterior_model()  # one Cholesky row for the new observation
        self.part_seconds["gp"] += time.perf_counter() - started
        self.actions.append(a)
        if round_idx >= self.stage_rounds:  # entropic OMD on the dual (Eq. 8); slack gradient 0
            g = torch.zeros_like(self.dual)
            g[:-1] = self.sign * (self.rho - float(self.levels[a]))
            w = self.dual * torch.exp(-self.eta * g)
            self.dual = w / w.sum()
        self._pending = None

    # ---- state -----------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "z": [list(v) for v in self.z], "t": list(self.t), "r": list(self.r),
                "actions": list(self.actions), "stage2_errors": list(self.stage2_errors),
                "stage2_contexts": [(t, list(x)) for t, x in self.stage2_contexts],
                "gp_effect": list(self.gp_effect), "dual": None if self.dual is None else self.dual.clone(),
                "big_lambda": self.big_lambda, "M": self.M, "rho": self.rho}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.z, self.t, self.r = [list(v) for v in state["z"]], list(state["t"]), list(state["r"])
        self._posterior = None
        self.actions = list(state["actions"])
        self.stage2_errors = list(state["stage2_errors"])
        self.stage2_contexts = [(int(t), list(x)) for t, x in state["stage2_contexts"]]
        self.gp_effect = [(bool(c), float(tv)) for c, tv in state.get("gp_effect", [])]
        self.dual = None if state["dual"] is None else state["dual"].clone()
        self.big_lambda, self.M, self.rho = state["big_lambda"], state["M"], state["rho"]

    def summary(self) -> dict[str, Any]:
        counts = np.bincount(np.asarray(self.actions, dtype=np.int64), minlength=self.num_actions)
        return {**super().summary(), "planner_action_counts": counts.tolist(), "planner_Lambda": self.big_lambda,
                "planner_M": self.M, "planner_levels": self.levels.tolist() if hasattr(self, "levels") else None,
                "planner_dual_weight": None if self.dual is None else float(self.dual[:-1].sum()),
                "planner_gp_argmax_changes": sum(c for c, _ in self.gp_effect),
                "planner_gp_tv_mean": float(np.mean([tv for _, tv in self.gp_effect])) if self.gp_effect else None,
                "planner_planned_rounds": len(self.gp_effect)}

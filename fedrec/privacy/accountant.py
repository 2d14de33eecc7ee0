"""Per-client privacy accounting: an Opacus accountant (RDP or PRV) for Gaussian noise, basic composition for Laplace.

Every client privatises its whole upload with its own per-round level (noise multiplier or ε_t, see
:mod:`fedrec.privacy.mechanisms`), so each client has its own privacy history: the levels of the rounds it took
part in. Rounds a client sat out add nothing.

Gaussian
    A client's ε is what an Opacus accountant built from that client's history reports:
    ``history = [(noise_multiplier, sample_rate=1, count), ...]`` and ``get_epsilon(delta_total)``.
    ``sample_rate = 1`` because the client's whole data set enters its own upload every round it takes part
    (no subsampling amplification). Composition is order free, so the history is kept in canonical form
    (sorted by noise multiplier, equal levels merged); clients with the same multiset of levels share one
    accountant evaluation (943 clients on the same schedule cost one), and results are cached.
Laplace
    Basic sequential composition: ε = Σ_t ε_t, δ = 0. The sum is exact (rational arithmetic) and rounded
    *up* to a float, so ``spent() <= epsilon_total`` holds exactly whenever ``would_exceed`` said no.

Interface and registry
    Every ledger implements :class:`Accountant` (``step`` / ``epsilon(delta)`` / ``state_dict`` /
    ``load_state_dict``) and is registered by name: ``make_accountant("client", num_clients=...)`` builds a
    :class:`ClientAccountant`, ``"gaussian_rdp"`` a :class:`GaussianRDPAccountant` (Gaussian mechanisms without
    subsampling, composed in RDP; what the tree aggregation of :mod:`fedrec.privacy.tree` reports),
    ``"laplace_basic"`` a :class:`LaplaceBasicAccountant` (basic composition of pure-ε mechanisms) and
    ``"sampled_gaussian"`` a :class:`SampledGaussianAccountant` (DP-FedAvg's central DP: every round is a
    Poisson-subsampled Gaussian at client sampling rate q, so all clients share one history
    ``[(z, q, count), ...]`` and q < 1 gains amplification by sampling). Each saved state names its kind (the
    registered name) and a ledger refuses another kind's state, so one history is never replayed as another's; a
    state saved before states named their kind is read as the loader's own kind (its other fields are still checked).

Uniform split (the default schedule)
    Gaussian: :func:`uniform_noise_multiplier` is the constant noise multiplier z for which the accountant's ε
    after T rounds is (just below) ε_total. This is the tight uniform split. The naive alternative, calibrating
    every round with the analytic Gaussian mechanism at (ε_total/T, δ_total/T) and relying on basic
    composition, is valid but far noisier: at ε_total = 10, δ_total = 1e-5, T = 100 it needs z ≈ 41.3 per
    round, for which the accountant reports only ε ≈ 0.98 (RDP) / 0.90 (PRV) after 100 rounds (exact: 0.89,
    since T Gaussian rounds at z compose to one at z/√T). The tight split needs z ≈ 5.30 (RDP) or 5.00 (PRV),
    about 8× less noise. A per-round budget set by a planner is accounted the same way whatever rule produced
    its noise multiplier: the accountant, not the calibration rule, decides what has been spent.
    Laplace: :func:`uniform_epsilon_per_round` is ε_total/T, rounded down so that T rounds sum to at most
    ε_total exactly (otherwise float rounding could refuse the last round).
"""
from __future__ import annotations

import abc
import collections
import contextlib
import functools
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
from scipy.optimize import brentq
from torch import Tensor

from fedrec.errors import ConfigError, check_choice, check_float, check_int

__all__ = [
    "Accountant",
    "ClientAccountant",
    "GaussianRDPAccountant",
    "LaplaceBasicAccountant",
    "PrivacyBudgetExceeded",
    "MAX_EPSILON",
    "SampledGaussianAccountant",
    "check_epsilon_setting",
    "gaussian_rdp_epsilon",
    "gaussian_rdp_rho",
    "make_accountant",
    "opacus_accountant",
    "register_accountant",
    "sampled_noise_multiplier",
    "uniform_epsilon_per_round",
    "uniform_noise_multiplier",
]

MECHANISMS = ("gaussian", "laplace")
ACCOUNTANTS = ("rdp", "prv")
#: the largest finite ``privacy.epsilon`` a run accepts. ε bounds by e^ε how much more likely one person's data
#: makes any output; at e^100 (about 10^43) that bound constrains no attacker, so a larger ε would be reported as a
#: guarantee it is not. The papers reproduced here use ε ≤ 10; the largest ε run here is the end of the FCLUB ε
#: study (``scripts/reproduce_fclub.sh``: 100, once 512, where the paper's node noise let the clusters be found).
MAX_EPSILON = 100.0


def check_epsilon_setting(value: object, *, allow_inf: bool = False) -> float:
    """``privacy.epsilon`` as a float in (0, :data:`MAX_EPSILON`] (or ∞ where ``allow_inf``: the mechanism's
    noiseless setting), else a ConfigError naming the field, the bound and what runs without a guarantee."""
    eps = check_float("privacy.epsilon", value, low=0.0, low_open=True, allow_inf=allow_inf)
    if math.isfinite(eps) and eps > MAX_EPSILON:
        instead = "privacy.epsilon=inf adds no noise" if allow_inf else "privacy=none trains without privacy"
        raise ConfigError(f"privacy.epsilon must be at most {MAX_EPSILON:g}, got {value!r}: e^epsilon bounds how "
                          f"much one person's data may change the odds of any output, and beyond e^{MAX_EPSILON:g} "
                          f"that bound protects nothing; {instead}")
    return eps


_Key = tuple[tuple[float, int], ...]  # canonical history: ((level, count), ...) sorted by level


class PrivacyBudgetExceeded(ValueError):
    """A round was recorded for a client whose total budget it would exceed."""


def _check_delta(delta: float, name: str = "delta") -> float:
    return check_float(name, delta, low=0.0, high=1.0, low_open=True, high_open=True)


# --------------------------------------------------------------------------------------------------------------
# Interface and registry
# --------------------------------------------------------------------------------------------------------------


class Accountant(abc.ABC):
    """A privacy ledger: ``step`` records mechanism runs, ``epsilon(delta)`` reports the ε spent so far (a number,
    or one per client for per-client ledgers), and the state round-trips through ``state_dict``."""

    #: the name the class is registered under (set by :func:`register_accountant`); saved in every state
    kind: ClassVar[str] = ""

    @abc.abstractmethod
    def step(self, level: float | Tensor, count: int | Tensor = 1) -> None:
        """Record ``count`` runs of a mechanism at ``level``: its noise multiplier (Gaussian) or its ε (Laplace).
        A per-client ledger takes a level and a count per client (0 or 1: whether the client took part)."""

    @abc.abstractmethod
    def epsilon(self, delta: float | None = None) -> float | Tensor:
        """The ε spent so far at ``delta`` (``None``: the ledger's own δ)."""

    @abc.abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to restore the ledger exactly."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ledger saved by :meth:`state_dict`."""

    def _check_kind(self, state: dict[str, Any]) -> None:
        """Refuse a state saved by another kind of accountant. A state without a kind (saved before states named
        theirs) is read as this accountant's own kind; the fields each kind checks next still guard it."""
        kind = state.get("kind", self.kind)
        if kind != self.kind:
            raise ConfigError(f"cannot load {self.kind} accountant state: kind is {kind!r} in the checkpoint but "
                              f"{self.kind!r} here; a ledger replays only its own kind's history")


_A = TypeVar("_A", bound=type[Accountant])
_REGISTRY: dict[str, type[Accountant]] = {}


def register_accountant(name: str) -> Callable[[_A], _A]:
    """Class decorator: ``make_accountant(name, **kw)`` builds the decorated :class:`Accountant` subclass."""

    def register(cls: _A) -> _A:
        if not (isinstance(cls, type) and issubclass(cls, Accountant)):
            raise TypeError(f"register_accountant({name!r}) decorates Accountant subclasses, got {cls!r}")
        if _REGISTRY.get(name, cls) is not cls:
            raise ConfigError(f"an accountant named {name!r} is already registered ({_REGISTRY[name].__name__})")
        if cls.__dict__.get("kind", name) != name:
            raise ConfigError(f"{cls.__name__} is already registered as {cls.kind!r}; one class is one kind")
        cls.kind = name
        _REGISTRY[name] = cls
        return cls

    return register


def make_accountant(name: str, **kwargs: Any) -> Accountant:
    """A new accountant of the registered kind ``name``, built with ``kwargs``."""
    return _REGISTRY[check_choice("accountant", name, sorted(_REGISTRY))](**kwargs)


def opacus_accountant(name: str, history: Sequence[tuple[float, float, int]] = ()) -> Any:
    """A fresh Opacus ``RDPAccountant`` / ``PRVAccountant`` holding ``history`` (imported lazily: opacus is slow
    to import and only needed once something is accounted)."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    acc = {"rdp": RDPAccountant, "prv": PRVAccountant}[check_choice("accountant", name, ACCOUNTANTS)]()
    acc.history = [(float(z), float(q), int(n)) for z, q, n in history]
    return acc


@contextlib.contextmanager
def _quiet_opacus() -> Iterator[None]:
    """Opacus's numerics as this module calls them, without their noise: PRV with sample_rate = 1 takes
    log(1 - q) = -inf, and a tiny ε (or a bisection's far-off trial z) is best at the order grid's edge, a valid if
    loose bound Opacus warns about."""
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Optimal order is the")
        yield


def _opacus_epsilon(name: str, history: Sequence[tuple[float, float, int]], delta: float,
                    alphas: Sequence[float] | None) -> float:
    if not history:
        return 0.0
    acc = opacus_accountant(name, history)
    kwargs = {"alphas": list(alphas)} if (alphas is not None and name == "rdp") else {}
    with _quiet_opacus():
        return float(acc.get_epsilon(delta=delta, **kwargs))


def _noise_multiplier(epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str,
                      tolerance: float, alphas: Sequence[float] | None) -> float:
    """Opacus's ``get_noise_multiplier`` (bisection: the z returned spends between ``epsilon - tolerance`` and
    ``epsilon``) on checked arguments; ``alphas`` are the RDP orders."""
    from opacus.accountants.utils import get_noise_multiplier

    kwargs = {"alphas": list(alphas)} if (alphas is not None and accountant == "rdp") else {}
    with _quiet_opacus():
        return float(get_noise_multiplier(
            target_epsilon=epsilon, target_delta=delta, sample_rate=sample_rate, steps=steps,
            accountant=check_choice("accountant", accountant, ACCOUNTANTS), epsilon_tolerance=tolerance, **kwargs,
        ))


def uniform_noise_multiplier(
    epsilon_total: float,
    delta_total: float,
    rounds: int,
    accountant: str = "rdp",
    epsilon_tolerance: float = 0.01,
    alphas: Sequence[float] | None = None,
) -> float:
    """The constant noise multiplier whose ``rounds`` full-participation rounds spend at most ``epsilon_total``.

    Opacus's ``get_noise_multiplier`` with ``sample_rate = 1`` and ``steps = rounds`` (bisection; the returned
    z spends between ``epsilon_total - epsilon_tolerance`` and ``epsilon_total``). The accountant is the same
    one :class:`ClientAccountant` uses, so all ``rounds`` rounds are admissible. See the module docstring for
    how this compares with calibrating every round at ``epsilon_total / rounds``.
    """
    eps = check_float("epsilon_total", epsilon_total, low=0.0, low_open=True)
    delta = check_float("delta_total", delta_total, low=0.0, high=1.0, low_open=True, high_open=True)
    steps = check_int("rounds", rounds, minimum=1)
    tol = check_float("epsilon_tolerance", epsilon_tolerance, low=0.0, low_open=True)
    return _noise_multiplier(eps, delta, 1.0, steps, accountant, tol, alphas)


def sampled_noise_multiplier(
    epsilon: float,
    delta: float,
    sample_rate: float,
    rounds: int,
    accountant: str = "rdp",
    epsilon_tolerance: float = 0.01,
) -> float:
    """The smallest noise multiplier z (to the tolerance) whose ``rounds`` Poisson-subsampled Gaussian rounds at
    ``sample_rate`` spend at most ``epsilon`` at ``delta`` under ``accountant`` (``"rdp"`` | ``"prv"``).

    Opacus's ``get_noise_multiplier`` (bisection: z spends between ``epsilon - epsilon_tolerance`` and
    ``epsilon``), i.e. the calibration that :class:`SampledGaussianAccountant` admits for ``rounds`` rounds.
    """
    eps = check_float("epsilon", epsilon, low=0.0, low_open=True)
    d = _check_delta(delta)
    q = check_float("sample_rate", sample_rate, low=0.0, high=1.0, low_open=True)
    steps = check_int("rounds", rounds, minimum=1)
    tol = check_float("epsilon_tolerance", epsilon_tolerance, low=0.0, low_open=True)
    return _noise_multiplier(eps, d, q, steps, accountant, tol, None)


def scheduled_noise_multiplier(
    epsilon: float,
    delta: float,
    sample_rate: float,
    schedule: Sequence[float],
    accountant: str = "rdp",
    epsilon_tolerance: float = 0.01,
) -> float:
    """The smallest scale z (to the tolerance) whose rounds at noise multipliers ``z · g_t``, one per factor of
    ``schedule``, each Poisson-subsampled at ``sample_rate``, spend at most ``epsilon`` at ``delta`` under
    ``accountant``: bisection on z, which ε decreases in (the spent ε lies in ``[epsilon - epsilon_tolerance,
    epsilon]``). A schedule of ones is :func:`sampled_noise_multiplier`'s calibration."""
    eps = check_float("epsilon", epsilon, low=0.0, low_open=True)
    d = _check_delta(delta)
    q = check_float("sample_rate", sample_rate, low=0.0, high=1.0, low_open=True)
    tol = check_float("epsilon_tolerance", epsilon_tolerance, low=0.0, low_open=True)
    factors = collections.Counter(check_float("schedule", g, low=0.0, low_open=True) for g in schedule)
    if not factors:
        raise ConfigError("schedule: no rounds to calibrate")
    name = check_choice("accountant", accountant, ACCOUNTANTS)

    def spent(z: float) -> float:
        return _sampled_epsilon(name, tuple(sorted((z * g, q, n) for g, n in factors.items())), d, None)

    low, high = 0.0, 1.0
    while spent(high) > eps:
        low, high = high, 2.0 * high
    for _ in range(200):  # the bracket halves each time; high always spends at most eps
        if eps - spent(high) <= tol:
            break
        middle = (low + high) / 2
        low, high = (middle, high) if spent(middle) > eps else (low, middle)
    return high


def uniform_epsilon_per_round(epsilon_total: float, rounds: int) -> float:
    """``epsilon_total / rounds`` for the Laplace mechanism, rounded down until ``rounds`` copies sum to at most
    ``epsilon_total`` exactly, so basic composition admits every round."""
    total = check_float("epsilon_total", epsilon_total, low=0.0, low_open=True)
    n = check_int("rounds", rounds, minimum=1)
    e = total / n
    while Fraction(e) * n > Fraction(total):
        e = math.nextafter(e, 0.0)
    return e


def _ceil_float(x: Fraction) -> float:
    """The smallest float >= x."""
    f = float(x)
    return math.nextafter(f, math.inf) if Fraction(f) < x else f


# --------------------------------------------------------------------------------------------------------------
# Composition of Gaussian (RDP) and Laplace (basic) mechanisms
# --------------------------------------------------------------------------------------------------------------


def gaussian_rdp_epsilon(rho: float, delta: float) -> float:
    """The ε at ``delta`` of the RDP curve α ↦ ρα, i.e. of Gaussian mechanisms with ρ = Σ 1/(2z²).

    Uses the RDP → (ε, δ) conversion of Balle et al. 2020 (Thm. 21, the one Opacus applies),
    ε(α) = ρα + ln((α−1)/α) − (ln δ + ln α)/(α−1), at its exact best order: ε'(α) = ρ + (ln δ + ln α)/(α−1)²,
    so the minimiser is the one root of ρ(α−1)² = ln(1/(δα)) in (1, 1/δ) (no grid of orders).
    """
    r = check_float("rho", rho, low=0.0)
    d = _check_delta(delta)
    if r == 0.0:
        return 0.0
    log_d = math.log(d)
    x = brentq(lambda x: r * x * x + math.log1p(x) + log_d, 0.0, 1.0 / d - 1.0, xtol=1e-300, rtol=8.9e-16)  # α − 1
    eps = r * (1.0 + x) + math.log(x / (1.0 + x)) - (log_d + math.log1p(x)) / x
    return max(eps, 0.0)


def gaussian_rdp_rho(epsilon: float, delta: float) -> float:
    """The largest ρ whose RDP curve α ↦ ρα converts to at most ``epsilon`` at ``delta`` (inverse of
    :func:`gaussian_rdp_epsilon`); k Gaussian mechanisms at noise multiplier z spend it when z = sqrt(k / (2ρ))."""
    eps = check_float("epsilon", epsilon, low=0.0, low_open=True)
    d = _check_delta(delta)
    hi = eps
    while gaussian_rdp_epsilon(hi, d) <= eps:
        hi *= 2.0
    rho = float(brentq(lambda r: gaussian_rdp_epsilon(r, d) - eps, 0.0, hi, xtol=1e-300, rtol=8.9e-16))
    while gaussian_rdp_epsilon(rho, d) > eps:
        rho = math.nextafter(rho, 0.0)
    return rho


@register_accountant("gaussian_rdp")
class GaussianRDPAccountant(Accountant):
    """Gaussian mechanisms without subsampling, composed exactly in RDP (order-α RDP of noise multiplier z is
    α/(2z²)) and converted to (ε, δ) by :func:`gaussian_rdp_epsilon`.

    Args:
        delta: the default δ of :meth:`epsilon`, in (0, 1); ``None``: every call must pass one.
    """

    def __init__(self, delta: float | None = None) -> None:
        self.delta = None if delta is None else _check_delta(delta)
        self._history: dict[float, int] = {}

    def step(self, level: float, count: int = 1) -> None:
        """Record ``count`` Gaussian mechanisms whose noise multiplier is ``level`` (σ = level · sensitivity)."""
        z = check_float("noise_multiplier", level, low=0.0, low_open=True)
        self._history[z] = self._history.get(z, 0) + check_int("count", count, minimum=1)

    @property
    def rho(self) -> float:
        """ρ = Σ count/(2z²): the composition's RDP at order α is ρα."""
        return math.fsum(n / (2.0 * z * z) for z, n in self._history.items())

    def epsilon(self, delta: float | None = None) -> float:
        if delta is None and self.delta is None:
            raise ConfigError("delta must be given (a number in (0, 1)): this accountant has no default delta")
        return gaussian_rdp_epsilon(self.rho, self.delta if delta is None else delta)

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "delta": self.delta, "history": sorted(self._history.items())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replay the saved history; the saved kind and default δ must be this accountant's."""
        self._check_kind(state)
        if state.get("delta") != self.delta:
            raise ConfigError(f"cannot load accountant state: delta is {state.get('delta')!r} in the checkpoint but "
                              f"{self.delta!r} here")
        self._history = {}
        for z, n in state["history"]:
            self.step(z, n)


@register_accountant("laplace_basic")
class LaplaceBasicAccountant(Accountant):
    """Pure ε-DP mechanisms under basic composition: ε = Σ ε_i (exact rational sum, rounded up), δ = 0."""

    def __init__(self) -> None:
        self._history: dict[float, int] = {}

    def step(self, level: float, count: int = 1) -> None:
        """Record ``count`` mechanisms that are each ``level``-DP (pure ε)."""
        e = check_float("epsilon", level, low=0.0, low_open=True)
        self._history[e] = self._history.get(e, 0) + check_int("count", count, minimum=1)

    def epsilon(self, delta: float | None = None) -> float:
        """Σ ε_i; ``delta`` is ignored (pure DP holds at every δ)."""
        return _ceil_float(sum((Fraction(e) * n for e, n in self._history.items()), Fraction(0)))

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "history": sorted(self._history.items())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replay the saved history; the saved kind must be this accountant's."""
        self._check_kind(state)
        self._history = {}
        for e, n in state["history"]:
            self.step(e, n)


# --------------------------------------------------------------------------------------------------------------
# Poisson-subsampled Gaussian: central DP with amplification by sampling
# --------------------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1024)
def _sampled_epsilon(name: str, history: tuple[tuple[float, float, int], ...], delta: float,
                     alphas: tuple[float, ...] | None) -> float:
    """:func:`_opacus_epsilon` memoised on hashable arguments (the PRV accountant takes tens of milliseconds). RDP
    composes by addition, so the RDP path sums each (z, q)'s cached one-round curve times its count and converts
    once: the same floats as Opacus's ``RDPAccountant`` (which multiplies the one-round curve by the steps), without
    re-deriving the subsampled curve, a series per fractional order, every round."""
    if name != "rdp" or not history:
        return _opacus_epsilon(name, history, delta, alphas)
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import get_privacy_spent

    orders = tuple(RDPAccountant.DEFAULT_ALPHAS) if alphas is None else alphas
    rdp = sum([_sampled_rdp(q, z, orders) * n for z, q, n in history])
    with _quiet_opacus():
        eps, _ = get_privacy_spent(orders=list(orders), rdp=rdp, delta=delta)
    return float(eps)


@functools.lru_cache(maxsize=256)
def _sampled_rdp(q: float, z: float, orders: tuple[float, ...]) -> np.ndarray:
    """The RDP curve at ``orders`` of one Poisson-subsampled Gaussian round (Opacus's analysis)."""
    from opacus.accountants.analysis.rdp import compute_rdp

    return np.asarray(compute_rdp(q=q, noise_multiplier=z, steps=1, orders=list(orders)))


@register_accountant("sampled_gaussian")
class SampledGaussianAccountant(Accountant):
    """One ledger for a mechanism whose every round is a Poisson-subsampled Gaussian (DP-FedAvg's central DP).

    Each client takes part in a round independently with the same probability q, so every client has the same
    privacy history: one ledger serves them all, and q < 1 buys amplification by sampling. The history is kept
    merged by (noise multiplier, sample rate), since composition is order free.

    Args:
        delta: the default δ of :meth:`epsilon`, in (0, 1).
        accountant: ``"rdp"`` (default) or ``"prv"``, Opacus's accountants.
        alphas: RDP orders (each > 1) for the RDP accountant; ``None`` keeps Opacus's defaults.
    """

    def __init__(self, delta: float, accountant: str = "rdp", alphas: Sequence[float] | None = None) -> None:
        self.delta = _check_delta(delta)
        self.accountant = check_choice("accountant", accountant, ACCOUNTANTS)
        self.alphas = None if alphas is None else tuple(
            check_float("alphas", a, low=1.0, low_open=True) for a in alphas)
        self._history: dict[tuple[float, float], int] = {}

    @staticmethod
    def _entry(level: float, count: int, sample_rate: float) -> tuple[tuple[float, float], int]:
        z = check_float("noise_multiplier", level, low=0.0, low_open=True)
        q = check_float("sample_rate", sample_rate, low=0.0, high=1.0, low_open=True)
        return (z, q), check_int("count", count, minimum=1)

    def _epsilon(self, history: dict[tuple[float, float], int], delta: float) -> float:
        key = tuple((z, q, n) for (z, q), n in sorted(history.items()))
        return _sampled_epsilon(self.accountant, key, delta, self.alphas)

    def step(self, level: float, count: int = 1, sample_rate: float = 1.0) -> None:
        """Record ``count`` rounds at noise multiplier ``level`` (σ = level · sensitivity), each client taking part
        with probability ``sample_rate`` in (0, 1]."""
        zq, n = self._entry(level, count, sample_rate)
        self._history[zq] = self._history.get(zq, 0) + n

    @property
    def rounds(self) -> int:
        """Number of rounds recorded."""
        return sum(self._history.values())

    def epsilon(self, delta: float | None = None) -> float:
        """The ε spent so far at ``delta`` (``None``: the ledger's δ); 0 before any round."""
        return self._epsilon(self._history, self.delta if delta is None else _check_delta(delta))

    def epsilon_after(self, level: float, count: int = 1, sample_rate: float = 1.0) -> float:
        """The ε at the ledger's δ if ``step(level, count, sample_rate)`` were recorded (nothing is recorded)."""
        zq, n = self._entry(level, count, sample_rate)
        history = dict(self._history)
        history[zq] = history.get(zq, 0) + n
        return self._epsilon(history, self.delta)

    def state_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "accountant": self.accountant,
            "delta": self.delta,
            "history": [(z, q, n) for (z, q), n in sorted(self._history.items())],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved history; its kind, accountant and δ must be this ledger's (nothing changes if not)."""
        self._check_kind(state)
        mine = {"accountant": self.accountant, "delta": self.delta}
        for field, value in mine.items():
            if state.get(field) != value:
                raise ConfigError(f"cannot load sampled-Gaussian accountant state: {field} is {state.get(field)!r} "
                                  f"in the checkpoint but {value!r} here")
        history: dict[tuple[float, float], int] = {}
        for z, q, n in state["history"]:
            zq, count = self._entry(z, n, q)
            history[zq] = history.get(zq, 0) + count
        self._history = history


# --------------------------------------------------------------------------------------------------------------
# Per-client ledger of client-level DP
# --------------------------------------------------------------------------------------------------------------


@register_accountant("client")
class ClientAccountant(Accountant):
    """The privacy ledger of ``num_clients`` clients with heterogeneous per-round noise.

    Args:
        num_clients: number of clients.
        mechanism: ``"gaussian"`` (levels are noise multipliers) or ``"laplace"`` (levels are per-round ε).
        accountant: ``"rdp"`` (default) or ``"prv"``; Gaussian only (Laplace always uses basic composition).
        epsilon_total: each client's total ε, a number or a ``(num_clients,)`` tensor; > 0. ``inf`` records
            without a cap (a ledger that only measures, e.g. the true ε of :class:`~fedrec.privacy.ClientDP`'s
            authors' conventions); ε is then computed only when asked for.
        delta_total: the δ at which a Gaussian client's ε is reported, in (0, 1). Ignored for Laplace (δ = 0).
        alphas: RDP orders for the RDP accountant; ``None`` keeps Opacus's defaults.

    Use per round: ``run = acc.admissible(levels, participating)``, privatise the uploads of ``run``, then
    ``acc.step(levels, run)``. ``step`` refuses a round that would exceed a client's total.

    Levels are accounted at their float64 value: pass Python floats or float64 tensors (a float32 ``0.1`` is
    0.10000000149…, and the noise used that value too, so it is what is accounted).
    """

    def __init__(
        self,
        num_clients: int,
        mechanism: str = "gaussian",
        accountant: str = "rdp",
        epsilon_total: float | Tensor = 10.0,
        delta_total: float | None = 1e-5,
        alphas: Sequence[float] | None = None,
    ) -> None:
        self.num_clients = check_int("num_clients", num_clients, minimum=1)
        self.mechanism = check_choice("mechanism", mechanism, MECHANISMS)
        self.accountant = check_choice("accountant", accountant, ACCOUNTANTS)
        self.level_name = "noise_multiplier" if self.mechanism == "gaussian" else "epsilon"
        tot = torch.as_tensor(epsilon_total, dtype=torch.float64).detach().cpu()
        if tot.dim() == 0:
            check_float("epsilon_total", float(tot), low=0.0, low_open=True, allow_inf=True)
            tot = tot.expand(self.num_clients).clone()
        elif tot.shape != (self.num_clients,):
            raise ConfigError(f"epsilon_total must be a number or a ({self.num_clients},) tensor, "
                              f"got shape {tuple(tot.shape)}")
        elif not bool((tot > 0).all()):  # NaN fails too
            raise ConfigError("epsilon_total must be > 0 for every client (inf: no cap)")
        self.epsilon_total = tot
        if self.mechanism == "gaussian":
            if delta_total is None:
                raise ConfigError("delta_total must be given for the Gaussian mechanism (a number in (0, 1))")
            self.delta_total = check_float("delta_total", delta_total, low=0.0, high=1.0,
                                           low_open=True, high_open=True)
        else:
            self.delta_total = 0.0
        self.alphas = None if alphas is None else [float(a) for a in alphas]
        self._reset()

    # ---- internal state --------------------------------------------------------------------------------------

    def _reset(self) -> None:
        self._record: list[Tensor] = []  # one (num_clients,) float64 per round; NaN = did not take part
        self._keys: list[_Key] = [()]  # canonical histories seen so far; group 0 is the empty history
        self._key_id: dict[_Key, int] = {(): 0}
        self._group = torch.zeros(self.num_clients, dtype=torch.long)  # each client's canonical history
        self._eps_cache: dict[_Key, float] = {(): 0.0}
        self._rdp_curves: dict[float, Any] = {}  # level -> its one-round RDP curve over the orders

    def _intern(self, key: _Key) -> int:
        gid = self._key_id.get(key)
        if gid is None:
            gid = self._key_id[key] = len(self._keys)
            self._keys.append(key)
        return gid

    @staticmethod
    def _extend(key: _Key, level: float) -> _Key:
        d = dict(key)
        d[level] = d.get(level, 0) + 1
        return tuple(sorted(d.items()))

    def _epsilon(self, key: _Key) -> float:
        eps = self._eps_cache.get(key)
        if eps is None:
            if self.mechanism == "laplace":
                eps = _ceil_float(sum((Fraction(e) * n for e, n in key), Fraction(0)))
            else:
                eps = self._gaussian_epsilon(key, self.delta_total)
            self._eps_cache[key] = eps
        return eps

    def _gaussian_epsilon(self, key: _Key, delta: float) -> float:
        if self.accountant == "rdp":
            return self._rdp_epsilon(key, delta)
        return _opacus_epsilon(self.accountant, [(z, 1.0, n) for z, n in key], delta, self.alphas)

    def _rdp_epsilon(self, key: _Key, delta: float) -> float:
        """``RDPAccountant(history=key).get_epsilon(delta)``, step for step as Opacus computes it, with each
        level's RDP curve computed once (Opacus recomputes it per call, ~0.3 ms; this matters when many clients
        have distinct histories)."""
        from opacus.accountants import RDPAccountant
        from opacus.accountants.analysis import rdp as rdp_analysis

        orders = RDPAccountant.DEFAULT_ALPHAS if self.alphas is None else self.alphas
        curves = []
        for z, n in key:
            unit = self._rdp_curves.get(z)
            if unit is None:
                unit = self._rdp_curves[z] = rdp_analysis.compute_rdp(
                    q=1.0, noise_multiplier=z, steps=1, orders=orders)
            curves.append(unit * n)  # == compute_rdp(..., steps=n), bit for bit
        eps, _ = rdp_analysis.get_privacy_spent(orders=orders, rdp=sum(curves), delta=delta)
        return float(eps)

    def _check(self, levels: Tensor | float, participating: Tensor | None, name: str = "participating"
               ) -> tuple[Tensor, Tensor]:
        lv = torch.as_tensor(levels, dtype=torch.float64).detach().cpu()
        if lv.dim() == 0:
            lv = lv.expand(self.num_clients)
        if lv.shape != (self.num_clients,):
            raise ConfigError(f"{self.level_name} must be a number or a ({self.num_clients},) tensor, "
                              f"got shape {tuple(lv.shape)}")
        if participating is None:
            part = torch.ones(self.num_clients, dtype=torch.bool)
        else:
            part = torch.as_tensor(participating).detach().cpu()
            if (part.dtype != torch.bool and not part.dtype.is_floating_point
                    and bool(((part == 0) | (part == 1)).all())):
                part = part.bool()  # per-client counts of 0 or 1
            if part.dtype != torch.bool or part.shape != (self.num_clients,):
                raise ConfigError(f"{name} must be a ({self.num_clients},) bool tensor or counts of 0 and 1, "
                                  f"got {tuple(part.shape)} {part.dtype}")
        sel = lv[part]
        bad = ~(torch.isfinite(sel) & (sel > 0))
        if bool(bad.any()):
            i = int(part.nonzero()[bad.nonzero()[0]])
            raise ConfigError(f"{self.level_name} must be finite and > 0 for every participating client, "
                              f"got {float(lv[i])} for client {i}")
        return lv, part

    def _next_groups(self, lv: Tensor, part: Tensor) -> tuple[Tensor, list[_Key], Tensor]:
        """For the participating clients: (client indices, the distinct extended histories, index into them)."""
        idx = part.nonzero().flatten()
        if idx.numel() == 0:
            return idx, [], idx
        values, vinv = torch.unique(lv[idx], return_inverse=True)
        pair = self._group[idx] * values.numel() + vinv
        pairs, pinv = torch.unique(pair, return_inverse=True)
        vals = values.tolist()
        keys = [self._extend(self._keys[p // len(vals)], vals[p % len(vals)]) for p in pairs.tolist()]
        return idx, keys, pinv

    # ---- public API ------------------------------------------------------------------------------------------

    @property
    def rounds(self) -> int:
        """Number of rounds recorded (whether or not a given client took part)."""
        return len(self._record)

    @property
    def delta(self) -> float:
        """The δ of the reported ε: ``delta_total`` for Gaussian, 0 for Laplace."""
        return self.delta_total

    def spent(self) -> Tensor:
        """Each client's ε spent so far (``(num_clients,)`` float64; 0 for a client that never took part)."""
        eps = torch.tensor([self._epsilon(k) for k in self._keys], dtype=torch.float64)
        return eps[self._group]

    def epsilon(self, delta: float | None = None) -> Tensor:
        """Each client's ε at ``delta`` (``None``: ``delta_total``, i.e. :meth:`spent`). Laplace clients are
        pure ε-DP, so their ε does not depend on δ."""
        if delta is None or self.mechanism == "laplace":
            return self.spent()
        d = _check_delta(delta)
        if d == self.delta_total:
            return self.spent()
        eps = torch.tensor([self._gaussian_epsilon(k, d) if k else 0.0 for k in self._keys], dtype=torch.float64)
        return eps[self._group]

    def epsilon_after(self, proposed: Tensor | float, participating: Tensor | None = None) -> Tensor:
        """Each client's ε if the proposed round were recorded (non-participants keep their current ε)."""
        return self._epsilon_after(*self._check(proposed, participating))

    def would_exceed(self, proposed: Tensor | float, participating: Tensor | None = None) -> Tensor:
        """True for each (participating) client whose ε after the proposed round would exceed its total."""
        return self._exceeding(*self._check(proposed, participating))

    def admissible(self, proposed: Tensor | float, participating: Tensor | None = None) -> Tensor:
        """The clients that may take part in the proposed round: participating and not exceeding their total."""
        lv, part = self._check(proposed, participating)
        return part & ~self._exceeding(lv, part)

    def _epsilon_after(self, lv: Tensor, part: Tensor) -> Tensor:
        out = self.spent()
        idx, keys, inv = self._next_groups(lv, part)
        if keys:
            out[idx] = torch.tensor([self._epsilon(k) for k in keys], dtype=torch.float64)[inv]
        return out

    def _exceeding(self, lv: Tensor, part: Tensor) -> Tensor:
        return part & (self._epsilon_after(lv, part) > self.epsilon_total)

    def step(self, level: Tensor | float, count: Tensor | None = None) -> None:
        """Record one round: each client's level (noise multiplier or ε_t), for the clients whose ``count`` is 1
        or True (they took part; None: all).

        Raises PrivacyBudgetExceeded (recording nothing) if a participating client would exceed its total.
        """
        lv, part = self._check(level, count, "count")
        idx, keys, inv = self._next_groups(lv, part)
        if keys:
            capped = torch.isfinite(self.epsilon_total[idx])
            needed = torch.zeros(len(keys), dtype=torch.bool)
            needed[inv[capped]] = True  # uncapped clients' ε is computed only when asked for
            after = torch.tensor([self._epsilon(k) if need else 0.0 for k, need in zip(keys, needed.tolist())],
                                 dtype=torch.float64)[inv]
            over = capped & (after > self.epsilon_total[idx])
            if bool(over.any()):
                c = int(idx[over.nonzero()[0]])
                raise PrivacyBudgetExceeded(
                    f"client {c} would spend epsilon {float(after[over][0])} > epsilon_total "
                    f"{float(self.epsilon_total[c])}; leave it out of this round (see admissible())")
            gids = torch.tensor([self._intern(k) for k in keys], dtype=torch.long)
            self._group[idx] = gids[inv]
        self._record.append(torch.where(part, lv, torch.full_like(lv, math.nan)))

    def history(self, client: int) -> list[tuple[float, float, int]]:
        """The client's history in Opacus's format ``[(level, sample_rate=1.0, steps), ...]``, in round order
        (consecutive equal levels merged, as Opacus's ``step`` does)."""
        c = check_int("client", client, minimum=0)
        if c >= self.num_clients:
            raise ConfigError(f"client must be < num_clients={self.num_clients}, got {client}")
        out: list[tuple[float, float, int]] = []
        for row in self._record:
            v = float(row[c])
            if math.isnan(v):
                continue
            if out and out[-1][0] == v:
                out[-1] = (v, 1.0, out[-1][2] + 1)
            else:
                out.append((v, 1.0, 1))
        return out

    def summary(self) -> dict[str, Any]:
        """Plain numbers for ``summary.json``: the spent ε over clients and the δ it is reported at."""
        eps = self.spent()
        return {
            "epsilon_spent": float(eps.max()),
            "epsilon_spent_mean": float(eps.mean()),
            "epsilon_spent_min": float(eps.min()),
            "delta": self.delta,
            "epsilon_total": float(self.epsilon_total.max()),
            "privacy_mechanism": self.mechanism,
            "privacy_accountant": self.accountant if self.mechanism == "gaussian" else "basic_composition",
        }

    def state_dict(self) -> dict[str, Any]:
        """The full per-round history (a ``(rounds, num_clients)`` float64 tensor, NaN = did not take part)
        and the configuration it was recorded under."""
        hist = torch.stack(self._record) if self._record else torch.empty(0, self.num_clients, dtype=torch.float64)
        return {
            "kind": self.kind,
            "mechanism": self.mechanism,
            "accountant": self.accountant,
            "num_clients": self.num_clients,
            "epsilon_total": self.epsilon_total.clone(),
            "delta_total": self.delta_total,
            "history": hist.clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore by replaying the recorded rounds; the kind and configuration must match this accountant's."""
        self._check_kind(state)
        for field in ("mechanism", "accountant", "num_clients", "delta_total"):
            if state.get(field) != getattr(self, field):
                raise ConfigError(f"cannot load privacy accountant state: {field} is {state.get(field)!r} in the "
                                  f"checkpoint but {getattr(self, field)!r} here")
        if not torch.equal(torch.as_tensor(state["epsilon_total"], dtype=torch.float64), self.epsilon_total):
            raise ConfigError("cannot load privacy accountant state: epsilon_total differs from the checkpoint's")
        hist = torch.as_tensor(state["history"], dtype=torch.float64)
        if hist.dim() != 2 or hist.shape[1] != self.num_clients:
            raise ConfigError(f"privacy accountant history must have shape (rounds, {self.num_clients}), "
                              f"got {tuple(hist.shape)}")
        self._reset()
        for row in hist:
            part = ~torch.isnan(row)
            self.step(torch.where(part, row, torch.ones_like(row)), part)

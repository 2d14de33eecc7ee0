"""Plain numpy references for Sync-LinUCB and Async-LinUCB-AM, in the style of the authors' code.

Like ``tests/reference/async_linucb.py`` (whose LinUCB arm loop they reuse), they keep that code's costs on purpose:
one object per client, ``np.linalg.inv`` / ``np.linalg.det`` / ``np.linalg.pinv`` per step, Python loops over
clients. They implement the same rules as fedrec with a fixed exploration weight α, so decisions and message
counts can be compared one to one (scripts/bench_bandits.py, case d). Written from the spec (async.md §3.3–3.4,
§7), not copied from any repository.
"""
from __future__ import annotations

import numpy as np

from tests.reference.async_linucb import ucb_argmax


class RefSyncClient:
    """A client's local statistics, upload buffer and steps since the last sync."""

    def __init__(self, dim: int, lam: float, alpha: float) -> None:
        self.dim, self.lam, self.alpha = dim, lam, alpha
        self.A_local = np.zeros((dim, dim))
        self.b_local = np.zeros(dim)
        self.A_uploadbuffer = np.zeros((dim, dim))
        self.b_uploadbuffer = np.zeros(dim)
        self.steps_since_sync = 0
        self.AInv = np.linalg.inv(lam * np.identity(dim))
        self.theta = np.zeros(dim)

    def refresh(self) -> None:
        self.AInv = np.linalg.inv(self.lam * np.identity(self.dim) + self.A_local)
        self.theta = np.dot(self.AInv, self.b_local)

    def local_update(self, x: np.ndarray, reward: float) -> None:
        self.A_local += np.outer(x, x)
        self.b_local += x * reward
        self.A_uploadbuffer += np.outer(x, x)
        self.b_uploadbuffer += x * reward
        self.steps_since_sync += 1
        self.refresh()

    def sync_trigger(self, threshold: float) -> bool:
        """Δt_i · log(det(λI + V_i) / det(λI + V_i − ΔV_i)) > D (Algorithm 4), two determinants per check."""
        eye = self.lam * np.identity(self.dim)
        ratio = np.linalg.det(eye + self.A_local) / np.linalg.det(eye + self.A_local - self.A_uploadbuffer)
        return self.steps_since_sync * np.log(ratio) > threshold


class RefSyncLinUCB:
    """Sync-LinUCB: a sync round makes every registered client upload its buffer and download the aggregate."""

    def __init__(self, dim: int, lam: float = 0.1, alpha: float = 0.3, threshold: float = 10.0) -> None:
        self.dim, self.lam, self.alpha, self.threshold = dim, lam, alpha, threshold
        self.clients: dict[int, RefSyncClient] = {}
        self.A_aggregated = np.zeros((dim, dim))
        self.b_aggregated = np.zeros(dim)
        self.uploads = 0
        self.downloads = 0

    def play(self, clientID: int, arms: np.ndarray, rewards: np.ndarray) -> int:
        if clientID not in self.clients:
            self.clients[clientID] = RefSyncClient(self.dim, self.lam, self.alpha)
        client = self.clients[clientID]
        k = ucb_argmax(client.theta, client.AInv, self.alpha, arms)
        client.local_update(arms[k], rewards[k])
        if client.sync_trigger(self.threshold):
            for other in self.clients.values():
                self.uploads += 1
                self.A_aggregated += other.A_uploadbuffer
                self.b_aggregated += other.b_uploadbuffer
                other.A_uploadbuffer = np.zeros((self.dim, self.dim))
                other.b_uploadbuffer = np.zeros(self.dim)
                other.steps_since_sync = 0
            for other in self.clients.values():
                self.downloads += 1
                other.A_local = self.A_aggregated.copy()
                other.b_local = self.b_aggregated.copy()
                other.refresh()
        return k


def project(theta: np.ndarray) -> np.ndarray:
    """Projection onto the unit ℓ2 ball."""
    norm = np.linalg.norm(theta)
    return theta / norm if norm > 1 else theta


class RefAMClient:
    """An Async-LinUCB-AM client: global statistics (local copy + upload buffer) and private local statistics."""

    def __init__(self, dg: int, dl: int, lam: float) -> None:
        self.dg, self.dl, self.lam = dg, dl, lam
        self.A_g, self.b_g = np.zeros((dg, dg)), np.zeros(dg)
        self.A_l, self.b_l = np.zeros((dl, dl)), np.zeros(dl)
        self.A_uploadbuffer, self.b_uploadbuffer = np.zeros((dg, dg)), np.zeros(dg)

    def decide(self, arms: np.ndarray, alpha: float) -> int:
        """Eq. (8): the sum of the global and the local UCB, arm by arm."""
        inv_g = np.linalg.inv(self.lam * np.identity(self.dg) + self.A_g)
        inv_l = np.linalg.inv(self.lam * np.identity(self.dl) + self.A_l)
        theta_g, theta_l = inv_g @ self.b_g, inv_l @ self.b_l
        best, best_score = 0, -np.inf
        for k in range(len(arms)):
            xg, xl = arms[k, : self.dg], arms[k, self.dg :]
            score = (theta_g @ xg + alpha * np.sqrt(xg @ inv_g @ xg)
                     + theta_l @ xl + alpha * np.sqrt(xl @ inv_l @ xl))
            if score > best_score:
                best, best_score = k, score
        return best

    def update(self, x: np.ndarray, y: float, iterations: int, tol: float) -> None:
        """Eq. (7) on the new point: alternate θ^(l) and θ^(g) from the current ridge θ̂^(g), then add the point
        with its partial rewards."""
        xg, xl = x[: self.dg], x[self.dg :]
        Mg = np.linalg.pinv(self.A_g + np.outer(xg, xg))
        Ml = np.linalg.pinv(self.A_l + np.outer(xl, xl))
        theta_g = np.linalg.solve(self.lam * np.identity(self.dg) + self.A_g, self.b_g)
        y_l = y - xg @ project(theta_g)
        for _ in range(iterations):
            theta_l = project(Ml @ (self.b_l + xl * y_l))
            theta_g = project(Mg @ (self.b_g + xg * (y - theta_l @ xl)))
            y_l_new = y - theta_g @ xg
            done = abs(y_l_new - y_l) <= tol
            y_l = y_l_new
            if done:
                break
        y_g = y - project(Ml @ (self.b_l + xl * y_l)) @ xl
        self.A_g += np.outer(xg, xg)
        self.b_g += xg * y_g
        self.A_uploadbuffer += np.outer(xg, xg)
        self.b_uploadbuffer += xg * y_g
        self.A_l += np.outer(xl, xl)
        self.b_l += xl * y_l


class RefAsyncLinUCBAM:
    """Async-LinUCB-AM (Algorithm 3): Algorithm 1's triggers on the global statistics, determinants per check."""

    def __init__(self, dg: int, dl: int, lam: float = 0.1, alpha: float = 0.3, gamma_u: float = 5.0,
                 gamma_d: float = 5.0, iterations: int = 100, tol: float = 1e-12) -> None:
        self.dg, self.dl, self.lam, self.alpha = dg, dl, lam, alpha
        self.gamma_u, self.gamma_d, self.iterations, self.tol = gamma_u, gamma_d, iterations, tol
        self.clients: dict[int, RefAMClient] = {}
        self.A_aggregated, self.b_aggregated = np.zeros((dg, dg)), np.zeros(dg)
        self.A_downloadbuffer: dict[int, np.ndarray] = {}
        self.b_downloadbuffer: dict[int, np.ndarray] = {}
        self.uploads = 0
        self.downloads = 0

    def _ratio(self, A: np.ndarray, minus: np.ndarray) -> float:
        eye = self.lam * np.identity(self.dg)
        return np.linalg.det(eye + A) / np.linalg.det(eye + A - minus)

    def play(self, clientID: int, arms: np.ndarray, rewards: np.ndarray) -> int:
        if clientID not in self.clients:
            self.clients[clientID] = RefAMClient(self.dg, self.dl, self.lam)
            self.A_downloadbuffer[clientID] = self.A_aggregated.copy()
            self.b_downloadbuffer[clientID] = self.b_aggregated.copy()
        client = self.clients[clientID]
        k = client.decide(arms, self.alpha)
        client.update(arms[k], rewards[k], self.iterations, self.tol)
        if self._ratio(client.A_g, client.A_uploadbuffer) > self.gamma_u:
            self.uploads += 1
            self.A_aggregated += client.A_uploadbuffer
            self.b_aggregated += client.b_uploadbuffer
            for otherID in self.clients:
                if otherID != clientID:
                    self.A_downloadbuffer[otherID] += client.A_uploadbuffer
                    self.b_downloadbuffer[otherID] += client.b_uploadbuffer
            client.A_uploadbuffer = np.zeros((self.dg, self.dg))
            client.b_uploadbuffer = np.zeros(self.dg)
            for otherID, other in self.clients.items():
                if self._ratio(self.A_aggregated, self.A_downloadbuffer[otherID]) > self.gamma_d:
                    self.downloads += 1
                    other.A_g += self.A_downloadbuffer[otherID]
                    other.b_g += self.b_downloadbuffer[otherID]
                    self.A_downloadbuffer[otherID] = np.zeros((self.dg, self.dg))
                    self.b_downloadbuffer[otherID] = np.zeros(self.dg)
        return k

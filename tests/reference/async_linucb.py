"""A plain numpy reference for LinUCB and Async-LinUCB, written in the style of the authors' code.

This mirrors how ``cyrilli/Async-LinUCB`` is organised (see /work/shared/specs/async.md §3 and §7, and
/work/shared/docs/anchors.md §1.2), and it keeps that code's costs on purpose, because it is the baseline for
scripts/bench_bandits.py. It was written from the spec's description, not copied from the repository.

* ``RefLinUCB``: ridge statistics A = λI + Σ x xᵀ and b = Σ x y. Every update calls ``np.linalg.inv(A)``. Arm
  scoring is a Python loop over the K arms computing θᵀx + α·sqrt(xᵀA⁻¹x), and the first maximum wins ties.
* ``RefAsyncLinUCB``: one ``RefClient`` object per client holds (A_local, b_local) and an upload buffer. The
  server holds (A_aggregated, b_aggregated) and one download buffer per registered client. Triggers compare
  ratios of ``np.linalg.det`` values (two determinants per check) with γ, using a strict ">". After each
  upload the server scans every registered client, the uploader included. Clients register lazily: a new
  client starts empty, and its download buffer is the server aggregate at that moment. Each upload and each
  download counts as one message.
* ``refresh_on_download``: ``True`` (default) refreshes a client's A⁻¹ and θ as soon as a download arrives, so the
  downloaded data reaches its next decision (the paper's Algorithm 2). ``False`` is the authors' client: a download
  only adds to A_local, b_local and numObs, and A⁻¹ and θ are refreshed at the client's next ``localUpdate``, so
  its next decision still uses the statistics it had before the download.

The exploration weight α is fixed (it is not the theoretical radius), so decisions can be compared one to one
with fedrec's ``LinUCB(alpha=...)``.
"""
from __future__ import annotations

import numpy as np


def ucb_argmax(theta: np.ndarray, AInv: np.ndarray, alpha: float, arms: np.ndarray) -> int:
    """The authors' arm loop: θᵀx + α·sqrt(xᵀA⁻¹x) arm by arm, the first maximum wins ties."""
    best_score = -np.inf
    best = 0
    for k in range(len(arms)):
        x = arms[k]
        score = np.dot(theta, x) + alpha * np.sqrt(np.dot(np.dot(x, AInv), x))
        if score > best_score:
            best_score = score
            best = k
    return best


class RefLinUCB:
    """Single-agent LinUCB with a fixed α: one ``np.linalg.inv`` per update and a Python loop over the arms."""

    def __init__(self, dim: int, lam: float = 0.1, alpha: float = 0.3) -> None:
        self.dim = dim
        self.lam = lam
        self.alpha = alpha
        self.A = lam * np.identity(dim)  # λI + Σ x xᵀ
        self.b = np.zeros(dim)
        self.AInv = np.linalg.inv(self.A)
        self.theta = np.zeros(dim)

    def decide(self, arms: np.ndarray) -> int:
        """Index of the arm with the largest UCB in ``arms`` (K, d). The first maximum wins ties."""
        return ucb_argmax(self.theta, self.AInv, self.alpha, arms)

    def update(self, x: np.ndarray, reward: float) -> None:
        self.A += np.outer(x, x)
        self.b += x * reward
        self.AInv = np.linalg.inv(self.A)
        self.theta = np.dot(self.AInv, self.b)

    def play(self, arms: np.ndarray, rewards: np.ndarray) -> int:
        """One step: pick an arm, read its reward from ``rewards`` (K,) and learn from it."""
        k = self.decide(arms)
        self.update(arms[k], rewards[k])
        return k


class RefClient:
    """A client's local statistics (unregularised A_local, b_local) and its upload buffer."""

    def __init__(self, dim: int, lam: float, alpha: float, refresh_on_download: bool = True) -> None:
        self.dim = dim
        self.lam = lam
        self.alpha = alpha
        self.refresh_on_download = refresh_on_download
        self.A_local = np.zeros((dim, dim))
        self.b_local = np.zeros(dim)
        self.A_uploadbuffer = np.zeros((dim, dim))
        self.b_uploadbuffer = np.zeros(dim)
        self.numObs = 0
        self.numObs_uploadbuffer = 0
        self.AInv = np.linalg.inv(lam * np.identity(dim) + self.A_local)
        self.theta = np.zeros(dim)

    def decide(self, arms: np.ndarray) -> int:
        return ucb_argmax(self.theta, self.AInv, self.alpha, arms)

    def _refresh(self) -> None:
        self.AInv = np.linalg.inv(self.lam * np.identity(self.dim) + self.A_local)
        self.theta = np.dot(self.AInv, self.b_local)

    def localUpdate(self, x: np.ndarray, reward: float) -> None:
        self.A_local += np.outer(x, x)
        self.b_local += x * reward
        self.A_uploadbuffer += np.outer(x, x)
        self.b_uploadbuffer += x * reward
        self.numObs += 1
        self.numObs_uploadbuffer += 1
        self._refresh()

    def uploadCommTrigger(self, gamma_u: float) -> bool:
        numerator = np.linalg.det(self.lam * np.identity(self.dim) + self.A_local)
        denominator = np.linalg.det(self.lam * np.identity(self.dim) + self.A_local - self.A_uploadbuffer)
        return numerator / denominator > gamma_u

    def receiveDownload(self, A: np.ndarray, b: np.ndarray, numObs: int = 0) -> None:
        self.A_local += A
        self.b_local += b
        self.numObs += numObs
        if self.refresh_on_download:
            self._refresh()
        # otherwise AInv and theta stay as they were until the next localUpdate (authors' client)


class RefAsyncLinUCB:
    """Async-LinUCB (homogeneous clients) with a server object and per-client objects, as in the authors' code."""

    def __init__(self, dim: int, lam: float = 0.1, alpha: float = 0.3, gamma_u: float = 5.0, gamma_d: float = 5.0,
                 refresh_on_download: bool = True) -> None:
        self.dim = dim
        self.lam = lam
        self.alpha = alpha
        self.gamma_u = gamma_u
        self.gamma_d = gamma_d
        self.refresh_on_download = refresh_on_download
        self.clients: dict[int, RefClient] = {}
        # server state
        self.A_aggregated = np.zeros((dim, dim))
        self.b_aggregated = np.zeros(dim)
        self.A_downloadbuffer: dict[int, np.ndarray] = {}
        self.b_downloadbuffer: dict[int, np.ndarray] = {}
        self.numObs_downloadbuffer: dict[int, int] = {}
        self.numObs_aggregated = 0
        # communication cost in messages
        self.uploads = 0
        self.downloads = 0

    @property
    def totalCommCost(self) -> int:
        return self.uploads + self.downloads

    def _register(self, clientID: int) -> None:
        self.clients[clientID] = RefClient(self.dim, self.lam, self.alpha, self.refresh_on_download)
        # the server owes the newcomer everything it has aggregated so far
        self.A_downloadbuffer[clientID] = self.A_aggregated.copy()
        self.b_downloadbuffer[clientID] = self.b_aggregated.copy()
        self.numObs_downloadbuffer[clientID] = self.numObs_aggregated

    def decide(self, arms: np.ndarray, clientID: int) -> int:
        if clientID not in self.clients:
            self._register(clientID)
        return self.clients[clientID].decide(arms)

    def downloadCommTrigger(self, clientID: int) -> bool:
        numerator = np.linalg.det(self.lam * np.identity(self.dim) + self.A_aggregated)
        denominator = np.linalg.det(
            self.lam * np.identity(self.dim) + self.A_aggregated - self.A_downloadbuffer[clientID]
        )
        return numerator / denominator > self.gamma_d

    def updateParameters(self, x: np.ndarray, reward: float, clientID: int) -> None:
        client = self.clients[clientID]
        client.localUpdate(x, reward)

        if not client.uploadCommTrigger(self.gamma_u):
            return
        # upload: client -> server
        self.uploads += 1
        self.A_aggregated += client.A_uploadbuffer
        self.b_aggregated += client.b_uploadbuffer
        self.numObs_aggregated += client.numObs_uploadbuffer
        for otherID in self.clients:
            if otherID != clientID:
                self.A_downloadbuffer[otherID] += client.A_uploadbuffer
                self.b_downloadbuffer[otherID] += client.b_uploadbuffer
                self.numObs_downloadbuffer[otherID] += client.numObs_uploadbuffer
        client.A_uploadbuffer = np.zeros((self.dim, self.dim))
        client.b_uploadbuffer = np.zeros(self.dim)
        client.numObs_uploadbuffer = 0

        # download checks: server -> every registered client, the uploader included
        for otherID, other in self.clients.items():
            if self.downloadCommTrigger(otherID):
                self.downloads += 1
                other.receiveDownload(self.A_downloadbuffer[otherID], self.b_downloadbuffer[otherID],
                                      self.numObs_downloadbuffer[otherID])
                self.A_downloadbuffer[otherID] = np.zeros((self.dim, self.dim))
                self.b_downloadbuffer[otherID] = np.zeros(self.dim)
                self.numObs_downloadbuffer[otherID] = 0

    def play(self, clientID: int, arms: np.ndarray, rewards: np.ndarray) -> int:
        """One step: the client picks an arm, reads its reward from ``rewards`` (K,) and the protocol runs."""
        k = self.decide(arms, clientID)
        self.updateParameters(arms[k], rewards[k], clientID)
        return k


if __name__ == "__main__":  # a tiny smoke run
    rng = np.random.default_rng(0)
    d, K, N, T = 5, 10, 20, 500
    theta = rng.standard_normal(d)
    theta /= np.linalg.norm(theta)
    alg = RefAsyncLinUCB(d, lam=0.1, alpha=0.3, gamma_u=2.0, gamma_d=2.0)
    regret = 0.0
    for _ in range(T):
        arms = rng.standard_normal((K, d))
        arms /= np.linalg.norm(arms, axis=1, keepdims=True)
        mean = arms @ theta
        k = alg.play(int(rng.integers(N)), arms, mean + 0.1 * rng.standard_normal())
        regret += mean.max() - mean[k]
    print(f"T={T} regret={regret:.2f} uploads={alg.uploads} downloads={alg.downloads}")

"""Vertical federation with O3M orthogonal masks (Cao et al., *Vertical Federated Linear Contextual Bandits*,
§3.3 and §4).

The d feature columns of every context are split among M parties by a partition vector [d_1, …, d_M]; party 0 is
the active party (AP), which chooses arms and sees rewards, parties 1 … M − 1 are passive. A mask generator (PMG)
draws one Haar-random orthogonal Q (d × d) per run, sends party j its column block Q^j (d × d_j) and forgets Q.
Every round party j sends the AP its masked share Q^j x^j of each arm (a d-vector), and the AP sums the shares:
Σ_j Q^j x^j = Q x. What the masks hide and what they leak is spelled out in ``docs/threat_model.md``.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from fedrec.errors import ConfigError, check_choice
from fedrec.utils.blocks import near_equal_sizes
from fedrec.utils.seeding import numpy_generator

#: the mask kinds: O3M's orthogonal Q, or a non-orthogonal negative control that breaks lossless recovery (a test
#: control of ours; the other control, a fresh mask every round, is the protocol's ``refresh_mask``)
MASKS = ("o3m", "gaussian")


def check_partition(partition: Sequence[int], dim: int) -> tuple[int, ...]:
    """The partition vector [d_1, …, d_M] as a tuple, checked: M >= 2 positive blocks summing to ``dim``."""
    try:
        dims = tuple(int(p) for p in partition)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"partition must be a list of block widths, got {partition!r}") from e
    if any(int(p) != p for p in partition):
        raise ConfigError(f"partition entries must be integers, got {list(partition)}")
    if len(dims) < 2:
        raise ConfigError(f"partition must give M >= 2 parties (the AP and at least one passive party), got {dims}")
    if any(p < 1 for p in dims):
        raise ConfigError(f"partition blocks must be non-empty (>= 1 column each), got {list(dims)}")
    if sum(dims) != dim:
        raise ConfigError(f"partition must sum to the context dimension d = {dim}, got {list(dims)} "
                          f"(sum {sum(dims)})")
    return dims


def equal_partition(dim: int, parties: int) -> tuple[int, ...]:
    """``parties`` blocks as equal as possible (the first ones one column wider), e.g. [20, 20, 20, 20, 20]."""
    if parties < 2 or parties > dim:
        raise ConfigError(f"parties must be in [2, d = {dim}], got {parties}")
    return near_equal_sizes(dim, parties)


def orthogonal_mask(dim: int, rng: np.random.Generator) -> np.ndarray:
    """A Haar-distributed orthogonal d × d matrix: QR of an i.i.d. N(0, 1) matrix with the signs of R's diagonal
    moved into Q (equal to the paper's Gram–Schmidt construction, and numerically stabler)."""
    q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
    return q * np.sign(np.diag(r))


def draw_mask(dim: int, seed: int, replicate: int, kind: str = "o3m", draw: int = 0) -> np.ndarray:
    """The mask of one replicate run (``draw`` > 0: a later fresh mask, for the negative control). ``gaussian`` is
    the unnormalised N(0, 1/d) matrix, not orthogonal (a negative control)."""
    check_choice("mask", kind, MASKS)
    rng = numpy_generator(seed, "vfl.mask", replicate, draw)
    if kind == "o3m":
        return orthogonal_mask(dim, rng)
    return rng.standard_normal((dim, dim)) / np.sqrt(dim)  # gaussian


class Parties(nn.Module):
    """The M parties' mask blocks for ``replicates`` runs, and their masking of context columns.

    :meth:`block` ``(j)`` (R, d, d_j) is what party j holds; no party holds Q. :meth:`share` computes party j's
    masked shares Q^j x^j from its own columns only.
    """

    def __init__(self, partition: Sequence[int], replicates: int) -> None:
        super().__init__()
        self.partition = tuple(partition)
        self.dim = sum(self.partition)
        self.offsets = tuple(int(o) for o in np.cumsum((0,) + self.partition))
        for j, dj in enumerate(self.partition):
            self.register_buffer(f"block_{j}", torch.zeros(replicates, self.dim, dj, dtype=torch.float64))

    @property
    def num_parties(self) -> int:
        return len(self.partition)

    def block(self, j: int) -> Tensor:
        """Party j's mask block Q^j, (R, d, d_j)."""
        return getattr(self, f"block_{j}")

    def columns(self, j: int) -> slice:
        """The context columns party j holds."""
        return slice(self.offsets[j], self.offsets[j + 1])

    def share(self, j: int, contexts: Tensor) -> Tensor:
        """Party j's masked shares Q^j x^j of ``contexts`` (R, ..., d) (it reads only its columns): (R, ..., d)."""
        x = contexts[..., self.columns(j)]
        R = x.shape[0]
        flat = x.reshape(R, -1, x.shape[-1])
        return torch.bmm(flat, self.block(j).transpose(1, 2)).reshape(*x.shape[:-1], self.dim)

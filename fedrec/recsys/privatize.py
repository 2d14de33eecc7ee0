"""Privatisation (steps ② and ③ of the round): client-level DP applied to a round of federated recommendation.

:class:`fedrec.privacy.ClientDP` is a run's client-level DP in general: its mechanism, every client's accountant,
the budget unit, the level a budget buys, who can afford a round. What is specific to a recommendation round lives
here: the round's per-client budget (a planner's, or the uniform split), the keys of the draws that protect clients
(pseudo items, noise, pseudo rows, upload order), the clipping and noising of an upload laid out as ω and item rows
(:func:`privatize_uploads`), and what the accountant records for it (:func:`record_round`).
"""
from __future__ import annotations

import torch
from torch import Tensor

from fedrec.federation.collective import Collective
from fedrec.privacy.client_dp import ClientDP
from fedrec.recsys.data import RoundData
from fedrec.utils.rng import KeyedRows, rank_within, stream_key


def round_key(privacy: ClientDP | None, seed: int, name: str, round_idx: int, collective: Collective) -> int:
    """The key of draw ``name`` in round ``round_idx`` (every client draws from its own stream under it): derived
    from the run ``seed``, or the privacy setting's (``privacy.rng=secure``: fresh from the operating system's
    cryptographic source, rank 0's in a sharded run)."""
    if privacy is None:
        return int(stream_key(seed, name, round_idx))
    key = privacy.draw_key(seed, name, round_idx)
    return key if privacy.rng == "reproducible" else int(collective.broadcast(key))


def round_budget(privacy: ClientDP, budget: Tensor | None, num_clients: int, rounds: int) -> Tensor:
    """Each client's budget of the round, in :attr:`ClientDP.budget_unit`: the one a callback set (``budget``,
    see :meth:`fedrec.tasks.FedRecTask.set_round_budget`), else the uniform split of the total over ``rounds``."""
    if budget is not None:
        return budget
    return torch.full((num_clients,), privacy.uniform_budget(rounds), dtype=torch.float64)


def privatize_uploads(privacy: ClientDP, shared: Tensor, tensor_sizes: list[int], rows: Tensor, row_client: Tensor,
                      budget: Tensor, clients: Tensor, key: int) -> tuple[Tensor, Tensor]:
    """Clip and noise a round's uploads: ``shared`` (one row per client: its ω tensors of ``tensor_sizes`` values
    each, concatenated) and ``rows`` (real item rows, row ``j`` of client ``row_client[j]``, each client's rows in a
    fixed order), at each client's ``budget``. Paper conventions: each client's whole upload clipped once; authors':
    every tensor clipped alone, all noised at the full level. Client ``clients[c]`` draws its noise from its stream
    under ``key``: ω takes draws 0..P−1, its j-th row the next k."""
    levels = privacy.levels(budget)
    mech = privacy.mechanism
    P, k = shared.shape[1], (rows.shape[1] if rows.dim() > 1 else 1)
    ids, row_owner = clients.cpu().numpy(), row_client.cpu().numpy()
    sources = [KeyedRows(key, ids, 0), KeyedRows(key, ids[row_owner], P + k * rank_within(row_owner))]
    if privacy.conventions == "paper":
        (shared, rows), _ = mech.privatize_parts([shared, rows], [None, row_client], shared.shape[0], levels, sources)
        return shared, rows
    pieces = [mech.clip_rows(p) for p in shared.split(list(tensor_sizes), dim=1) if p.shape[1]]
    shared = torch.cat(pieces, 1) if pieces else shared
    return (mech.add_noise(shared, levels, sources[0]),
            mech.add_noise(mech.clip_rows(rows), levels[row_client.cpu()], sources[1]) if rows.numel() else rows)


def record_round(privacy: ClientDP, budget: Tensor, data: RoundData, num_clients: int, num_tensors: int) -> None:
    """Account the round for the clients of ``data``, at ``budget``; under the authors' conventions each noised
    its ``num_tensors`` ω tensors and every real item row as separate tensors, which the true ε composes."""
    run = torch.zeros(num_clients, dtype=torch.bool)
    run[data.clients] = True
    tensors = torch.zeros(num_clients, dtype=torch.long)  # noised tensors per client
    tensors[data.clients] = num_tensors + data.rows_per_client()
    privacy.record(budget, run, tensors)

"""Central ranking baselines beside a reference library: fedrec's central MF/BPR, NeuMF and
LightGCN and RecBole's BPR, NeuMF and LightGCN, trained on one leave-one-out split of MovieLens-100K and scored by
one full-ranking protocol, side by side (docs/papers/ranking_reference.md has the measured table).

Data. The split is fedrec's own (``data=ml100k_implicit``, :func:`fedrec.data.load_implicit` with the settings of
``conf/data/ml100k_implicit.yaml``): every interaction positive; per user, the latest interaction is the test item
and the one before it the validation item (ties in time broken by item index); the rest train. The reference
library is handed exactly these three sets (written from memory as RecBole's pre-split atomic files
``*.train.inter``/``*.valid.inter``/``*.test.inter`` in a temporary folder, which is how RecBole takes a given
split), so both libraries train on the same positives and select on the same validation items.

Protocol. Each test user ranks every item of the catalogue except its training and validation items (full ranking;
the held-out test item is among the candidates); HR@10 = 1 if the test item is in the first 10, NDCG@10 =
1/log2(rank + 1) if so, averaged over the 943 users. Ties are pessimistic (a tied candidate ranks before the test
item), as in :mod:`fedrec.recsys.ranking`. Both sides select the model on the validation item's NDCG@10: fedrec
reports ``selected_test_*`` (the test metrics of the round with the best ``val_ndcg@10``), RecBole stops early on
``NDCG@10`` of the validation split and its best epoch is reloaded.

* fedrec's numbers are fedrec's own evaluation (the run's ``summary.json``). Each run also writes ``topk.npz``
  (its last round's top-10 lists); :func:`ranking_hr_ndcg` recomputes the last round's HR@10 and NDCG@10 from those
  lists and must match the summary's ``final_test_*`` (a check of this script's metric, printed as
  ``check_fedrec_final``).
* The reference models' numbers come from :func:`ranking_hr_ndcg` on the full (users x items) score matrix of the
  reloaded best model; the same matrix is also scored by fedrec's :func:`fedrec.recsys.ranking.ranking_metrics`
  (must agree) and RecBole's own test evaluation is printed beside them (``recbole_own_hr@10``).

fedrec's runs go through the library's entry point (:func:`fedrec.app.cli.run` on the config ``train.py`` composes for
``+experiment=<model>_ml100k_implicit_tuned``, the central settings chosen beside RecBole), in this process.
RecBole is an optional dependency (``pip install recbole==1.2.1``); without it ``--skip-reference`` still runs
fedrec's side. RecBole 1.2.1 predates NumPy 2 and SciPy 1.12: before importing it the
script gives back the few names it reads that those removed (:func:`recbole_shims`).

    FEDREC_DATA_DIR=/path/to/data .venv/bin/python scripts/bench_reference_ranking.py --seeds 0,1,2 \\
        --out reproductions/ranking_reference
    .venv/bin/python scripts/bench_reference_ranking.py --quick          # a smoke run (3 rounds, 1 epoch)
    .venv/bin/python scripts/bench_reference_ranking.py --combine OUT1 OUT2   # one table of earlier invocations

Prints one JSON line per (side, model, seed) run, then the table (model, fedrec HR@10/NDCG@10, reference
HR@10/NDCG@10, ratio of HR@10 against the 0.95 target), and writes ``results.json`` and ``table.md`` into ``--out``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
K = 10
#: the target: fedrec's HR@10 at least this share of the reference's
TARGET = 0.95
MODELS = ("mf", "neumf", "lightgcn")
NAMES = {"mf": "MF (BPR)", "neumf": "NeuMF", "lightgcn": "LightGCN"}

#: RecBole's model per fedrec model, and its settings beside RecBole's defaults (same widths as fedrec's)
REFERENCE: dict[str, tuple[str, dict[str, Any]]] = {
    "mf": ("BPR", {"embedding_size": 64}),
    "neumf": ("NeuMF", {"mf_embedding_size": 16, "mlp_embedding_size": 16, "mlp_hidden_size": [16, 8]}),
    "lightgcn": ("LightGCN", {"embedding_size": 64}),
}
#: RecBole settings shared by the three models (its defaults otherwise: Adam, one uniform negative per positive);
#: batch 8192 at lr 0.005 instead of 2048 at 0.001, so that LightGCN converges within this machine's budget (page)
REFERENCE_COMMON: dict[str, Any] = {"train_batch_size": 8192, "learning_rate": 0.005, "epochs": 300,
                                    "stopping_step": 10, "eval_step": 1, "eval_batch_size": 1 << 21}


# ------------------------------------------------------------------------------------------------ metric
def ranking_hr_ndcg(scores: np.ndarray, seen: np.ndarray, heldout: np.ndarray, k: int = K) -> tuple[float, float]:
    """HR@k and NDCG@k of full ranking with one held-out item per user, averaged over users.

    ``scores`` (U, I): row u scores every item for user u; ``seen`` (U, I) bool: the items user u may not be
    recommended (training, and validation for the test split), which are no candidates; ``heldout`` (U,): user u's
    held-out item (a candidate: not in ``seen``). The held-out item's rank is 1 + the other candidates scoring at
    least as high (pessimistic ties; NaN counts as -inf); HR@k = 1 if rank <= k, NDCG@k = 1/log2(rank + 1) if so.
    """
    scores = np.asarray(scores, dtype=np.float64)
    seen = np.asarray(seen, dtype=bool)
    heldout = np.asarray(heldout, dtype=np.int64)
    if scores.ndim != 2 or seen.shape != scores.shape or heldout.shape != (scores.shape[0],):
        raise ValueError(f"scores {scores.shape}, seen {seen.shape} and heldout {heldout.shape} must be (U, I), "
                         "(U, I) and (U,)")
    rows = np.arange(len(heldout))
    if seen[rows, heldout].any():
        raise ValueError(f"user {int(np.flatnonzero(seen[rows, heldout])[0])}'s held-out item is among its seen items")
    s = np.where(np.isnan(scores), -np.inf, scores)
    target = s[rows, heldout]
    other = ~seen
    other[rows, heldout] = False
    rank = 1 + np.count_nonzero(other & (s >= target[:, None]), axis=1)
    hit = rank <= k
    return float(hit.mean()), float(np.where(hit, 1.0 / np.log2(rank + 1.0), 0.0).mean())


def seen_mask(num_users: int, num_items: int, *pairs: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """(U, I) bool: True at every (user, item) of the given ``(users, items)`` arrays."""
    mask = np.zeros((num_users, num_items), dtype=bool)
    for u, i in pairs:
        mask[u, i] = True
    return mask


def topk_scores(topk: np.ndarray, num_items: int) -> np.ndarray:
    """Scores that rank each row's listed items first, in list order (``topk`` (U, k), -1 padding) and every other
    item after them, tied at 0: :func:`ranking_hr_ndcg` on these reproduces the lists' HR@k and NDCG@k."""
    scores = np.zeros((len(topk), num_items))
    k = topk.shape[1]
    for pos in range(k):
        listed = topk[:, pos] >= 0
        scores[np.flatnonzero(listed), topk[listed, pos]] = k + 1 - pos
    return scores


# ------------------------------------------------------------------------------------------------ split
@dataclass(frozen=True)
class Split:
    """The leave-one-out split both libraries train and are scored on (fedrec's, one held-out item per user)."""

    num_users: int
    num_items: int
    train: tuple[np.ndarray, np.ndarray]  # (users, items) of the training positives
    val: np.ndarray  # (U,) each user's validation item
    test: np.ndarray  # (U,) each user's test item

    def test_seen(self) -> np.ndarray:
        """(U, I): the items a test ranking excludes (training and validation items)."""
        return seen_mask(self.num_users, self.num_items, self.train, (np.arange(self.num_users), self.val))


def load_split(data_dir: Path) -> Split:
    """fedrec's split of ``data=ml100k_implicit`` (its config file's settings, ``data_dir`` from the caller)."""
    from fedrec.data import load_implicit

    cfg = yaml.safe_load((CONF / "data" / "ml100k_implicit.yaml").read_text())
    kwargs = {k: v for k, v in cfg.items() if k not in ("_target_", "data_dir")}
    data = load_implicit(data_dir=data_dir, **kwargs)
    users = np.arange(data.num_users)
    if not (np.array_equal(data.val.counts(), np.ones_like(users)) and np.array_equal(data.test.counts(),
                                                                                         np.ones_like(users))):
        raise SystemExit("error: the split must hold out one validation and one test item for every user")
    return Split(data.num_users, data.num_items, data.train.pairs(), data.val.indices.copy(), data.test.indices.copy())


# ------------------------------------------------------------------------------------------------ fedrec
def fedrec_overrides(model: str, seed: int, rounds: int | None, data_dir: Path, extra: Sequence[str]) -> list[str]:
    """The ``train.py`` command line of fedrec's central run of ``model``: its tuned experiment (whose config
    holds the chosen settings and rounds), ``rounds`` instead of the config's where given."""
    return [f"+experiment={model}_ml100k_implicit_tuned", *([f"task.rounds={rounds}"] if rounds is not None else []),
            f"seed={seed}", *extra, "task.eval.save_topk=true", "plots=false",
            "logger.tensorboard=false", "trainer.checkpoint_every=0", f"data_dir={data_dir}"]


def run_fedrec(model: str, seed: int, rounds: int | None, data_dir: Path, out: Path, extra: Sequence[str],
               split: Split) -> dict[str, Any]:
    """One central fedrec run in ``out`` (``train.py``'s config and entry point, in this process): fedrec's
    metrics from its summary, and the check of :func:`ranking_hr_ndcg` against its last round."""
    from hydra import compose, initialize_config_dir

    import fedrec.app.resolvers  # noqa: F401  (the configs' ${by_conventions:...})
    from fedrec.app.cli import run
    from fedrec.app.schema import check_command_line
    from fedrec.recsys.ranking import load_topk

    argv = fedrec_overrides(model, seed, rounds, data_dir, extra)
    check_command_line(CONF, argv)
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=argv)
    started = time.perf_counter()
    s = run(cfg, output_dir=out)
    wall = time.perf_counter() - started
    lists = load_topk(out / "topk.npz")
    if not np.array_equal(lists.users, np.arange(split.num_users)) or \
            not np.array_equal(lists.heldout[:, 0], split.test):
        raise SystemExit(f"error: {out}: the run's test items differ from the split this script loaded")
    hr, ndcg = ranking_hr_ndcg(topk_scores(lists.topk, split.num_items), split.test_seen(), split.test)
    check = max(abs(hr - s["final_test_hr@10"]), abs(ndcg - s["final_test_ndcg@10"]))
    if check > 1e-9:
        raise SystemExit(f"error: {out}: the script's metric gives HR@10 {hr}, NDCG@10 {ndcg} on the run's last "
                         f"lists, fedrec's summary {s['final_test_hr@10']}, {s['final_test_ndcg@10']}")
    return {"side": "fedrec", "model": model, "seed": seed, "hr@10": s["selected_test_hr@10"],
            "ndcg@10": s["selected_test_ndcg@10"], "selected_round": s["selected_round"], "rounds": cfg.task.rounds,
            "final_hr@10": s["final_test_hr@10"], "final_ndcg@10": s["final_test_ndcg@10"],
            "check_fedrec_final": check, "wall_s": round(wall, 1),
            "overrides": [f"+experiment={model}_ml100k_implicit_tuned", *extra]}


# ------------------------------------------------------------------------------------------------ RecBole
def recbole_shims() -> None:
    """What RecBole 1.2.1 needs of NumPy and SciPy that their current versions dropped, given back for this process:
    NumPy 2's removed aliases ``float_``, ``complex_`` and ``unicode_`` (RecBole's ``compatibility_settings``
    assigns ``np.float = np.float_`` and the like), and SciPy's private ``dok_matrix._update`` (RecBole's LightGCN
    fills its adjacency matrix with it; the public ``update`` does the same after checking the keys)."""
    import scipy.sparse as sp

    for name, alias in (("float_", np.float64), ("complex_", np.complex128), ("unicode_", np.str_)):
        if name not in np.__dict__:
            setattr(np, name, alias)
    if not hasattr(sp.dok_matrix, "_update"):
        sp.dok_matrix._update = sp.dok_matrix.update


def have_recbole() -> bool:
    import importlib.util

    return importlib.util.find_spec("recbole") is not None


@contextlib.contextmanager
def recbole_sandbox(folder: Path) -> Iterator[None]:
    """RecBole reads ``sys.argv`` as config and writes ``log_tensorboard/`` into the working directory: give it an
    empty command line and ``folder`` while it runs; keep its per-epoch INFO lines (root logger) and the deprecation
    warnings its 2023 code raises under today's pandas and torch (chained assignment, ``torch.sparse.FloatTensor``,
    ``torch.cuda.amp``) off the output."""
    root = logging.getLogger()
    argv, cwd, level = sys.argv, os.getcwd(), root.level
    sys.argv = argv[:1]
    os.chdir(folder)
    root.setLevel(logging.WARNING)  # RecBole logs every epoch at INFO through the root logger
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        sys.argv = argv
        os.chdir(cwd)
        root.setLevel(level)


def write_atomic_files(split: Split, folder: Path, name: str) -> None:
    """RecBole's pre-split atomic files ``folder/name/name.{train,valid,test}.inter`` of ``split`` (tokens are
    fedrec's user and item indices)."""
    users = np.arange(split.num_users)
    (folder / name).mkdir(parents=True)
    for part, (u, i) in (("train", split.train), ("valid", (users, split.val)), ("test", (users, split.test))):
        lines = "".join(f"{a}\t{b}\n" for a, b in zip(u.tolist(), i.tolist()))
        (folder / name / f"{name}.{part}.inter").write_text("user_id:token\titem_id:token\n" + lines)


def recbole_scores(model: Any, dataset: Any, split: Split) -> np.ndarray:
    """(U, I) scores of the trained RecBole ``model`` in fedrec's user and item order (full_sort_predict, or
    ``predict`` over every pair for models without it, as RecBole's own evaluation falls back)."""
    import torch
    from recbole.data.interaction import Interaction

    uid, iid = dataset.uid_field, dataset.iid_field
    users = torch.as_tensor(dataset.token2id(uid, [str(u) for u in range(split.num_users)]))
    items = torch.as_tensor(dataset.token2id(iid, [str(i) for i in range(split.num_items)]))
    n_items = dataset.item_num  # RecBole's internal ids, 0 the padding item
    out = np.empty((split.num_users, split.num_items))
    model.eval()
    with torch.no_grad():
        for a in range(0, split.num_users, 128):
            u = users[a:a + 128]
            try:
                full = model.full_sort_predict(Interaction({uid: u})).view(len(u), n_items)
            except NotImplementedError:
                pairs = Interaction({uid: u.repeat_interleave(n_items), iid: torch.arange(n_items).repeat(len(u))})
                full = model.predict(pairs).view(len(u), n_items)
            out[a:a + len(u)] = full[:, items].double().numpy()
    return out


def run_reference(model: str, seed: int, epochs: int, split: Split, workdir: Path,
                  extra: dict[str, Any]) -> dict[str, Any]:
    """RecBole's model for ``model`` trained on ``split`` (early stopping on the validation NDCG@10, best epoch
    reloaded), scored by :func:`ranking_hr_ndcg`."""
    import torch

    recbole_shims()
    from recbole.config import Config
    from recbole.data import create_dataset, data_preparation
    from recbole.model.general_recommender import BPR, LightGCN, NeuMF
    from recbole.trainer import Trainer
    from recbole.utils import init_seed

    from fedrec.recsys.ranking import UserItems, ranking_metrics

    cls = {"BPR": BPR, "NeuMF": NeuMF, "LightGCN": LightGCN}[REFERENCE[model][0]]
    folder = Path(tempfile.mkdtemp(prefix=f"{model}_s{seed}_", dir=workdir))
    write_atomic_files(split, folder, "fedrec_split")
    settings = {**REFERENCE_COMMON, "epochs": epochs, **REFERENCE[model][1], **extra}
    config_dict = {
        "data_path": str(folder), "dataset": "fedrec_split", "benchmark_filename": ["train", "valid", "test"],
        "load_col": {"inter": ["user_id", "item_id"]}, "eval_args": {"group_by": "user", "order": "RO",
                                                                     "mode": "full"},
        "metrics": ["Hit", "NDCG"], "topk": [K], "valid_metric": f"NDCG@{K}", "seed": seed, "reproducibility": True,
        "use_gpu": False, "show_progress": False, "checkpoint_dir": str(folder / "saved"), "state": "WARNING",
        "worker": 0, **settings,
    }
    started = time.perf_counter()
    with recbole_sandbox(folder):
        config = Config(model=cls, config_dict=config_dict)
        init_seed(config["seed"], config["reproducibility"])
        dataset = create_dataset(config)
        train_data, valid_data, test_data = data_preparation(config, dataset)
        init_seed(config["seed"], config["reproducibility"])
        net = cls(config, train_data.dataset)
        trainer = Trainer(config, net)
        trainer.fit(train_data, valid_data, saved=True, show_progress=False, verbose=False)
        best = torch.load(trainer.saved_model_file, map_location="cpu", weights_only=False)
        net.load_state_dict(best["state_dict"])
        net.load_other_parameter(best.get("other_parameter"))
        if hasattr(net, "restore_user_e"):  # LightGCN caches its propagated embeddings: recompute from the best
            net.restore_user_e = net.restore_item_e = None
        own = trainer.evaluate(test_data, load_best_model=False, show_progress=False)
        if hasattr(net, "restore_user_e"):
            net.restore_user_e = net.restore_item_e = None
        scores = recbole_scores(net, dataset, split)
    wall = time.perf_counter() - started
    seen = split.test_seen()
    hr, ndcg = ranking_hr_ndcg(scores, seen, split.test)
    users = np.arange(split.num_users)
    theirs = ranking_metrics(torch.from_numpy(scores), users,
                             UserItems.from_pairs(*np.nonzero(seen), split.num_users),
                             UserItems.from_pairs(users, split.test, split.num_users), [K])
    check = max(abs(hr - theirs[f"hr@{K}"]), abs(ndcg - theirs[f"ndcg@{K}"]))
    if check > 1e-9:
        raise SystemExit(f"error: {model}: the script's metric ({hr}, {ndcg}) differs from fedrec's ranking_metrics "
                         f"({theirs[f'hr@{K}']}, {theirs[f'ndcg@{K}']}) on the same scores")
    return {"side": "reference", "model": model, "seed": seed, "library": "recbole", "recbole_model": cls.__name__,
            "hr@10": hr, "ndcg@10": ndcg, "best_epoch": int(best["epoch"]),
            "epochs_run": len(trainer.train_loss_dict), "max_epochs": epochs,
            "recbole_own_hr@10": float(own[f"hit@{K}"]), "recbole_own_ndcg@10": float(own[f"ndcg@{K}"]),
            "check_fedrec_metric": check, "wall_s": round(wall, 1), "settings": settings}


def popularity(split: Split) -> dict[str, float]:
    """HR@10 and NDCG@10 of ranking every test user's candidates by training popularity."""
    counts = np.bincount(split.train[1], minlength=split.num_items).astype(np.float64)
    hr, ndcg = ranking_hr_ndcg(np.broadcast_to(counts, (split.num_users, split.num_items)), split.test_seen(),
                               split.test)
    return {"hr@10": hr, "ndcg@10": ndcg}


# ------------------------------------------------------------------------------------------------ table
def mean_std(values: list[float]) -> str:
    if not values:
        return "–"
    spread = f" ± {np.std(values, ddof=1):.4f}" if len(values) > 1 else ""
    return f"{np.mean(values):.4f}{spread}"


def table(results: list[dict[str, Any]], models: Sequence[str], pop: dict[str, float]) -> str:
    """The Markdown table: per model, fedrec's and the reference's HR@10 and NDCG@10 (mean ± sample std over
    seeds) and fedrec's mean HR@10 over the reference's."""
    lines = ["| model | seeds | fedrec HR@10 | fedrec NDCG@10 | RecBole HR@10 | RecBole NDCG@10 | HR@10 ratio "
             f"(target ≥ {TARGET}) |", "|---|---|---|---|---|---|---|"]
    for m in models:
        ours = [r for r in results if r["model"] == m and r["side"] == "fedrec"]
        ref = [r for r in results if r["model"] == m and r["side"] == "reference"]
        ratio = "–"
        if ours and ref:
            value = np.mean([r["hr@10"] for r in ours]) / np.mean([r["hr@10"] for r in ref])
            ratio = f"{value:.3f} ({'met' if value >= TARGET else 'missed'})"
        seeds = sorted({r["seed"] for r in ours + ref})
        lines.append(f"| {NAMES[m]} | {','.join(map(str, seeds))} | {mean_std([r['hr@10'] for r in ours])} | "
                     f"{mean_std([r['ndcg@10'] for r in ours])} | {mean_std([r['hr@10'] for r in ref])} | "
                     f"{mean_std([r['ndcg@10'] for r in ref])} | {ratio} |")
    lines.append(f"| popularity | – | {pop['hr@10']:.4f} | {pop['ndcg@10']:.4f} | – | – | – |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ main
def model_settings(entries: Sequence[str], flag: str) -> dict[str, list[str]]:
    """``MODEL:KEY=VALUE`` entries grouped by model."""
    out: dict[str, list[str]] = {m: [] for m in MODELS}
    for entry in entries:
        model, sep, setting = entry.partition(":")
        if not sep or model not in MODELS or "=" not in setting:
            raise SystemExit(f"error: {flag} takes MODEL:KEY=VALUE with MODEL one of {', '.join(MODELS)}, got "
                             f"{entry!r}")
        out[model].append(setting)
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated, of mf, neumf, lightgcn")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (both libraries)")
    p.add_argument("--rounds", type=int, default=None,
                   help="fedrec's rounds for every model (default: its tuned experiment's)")
    p.add_argument("--epochs", type=int, default=REFERENCE_COMMON["epochs"],
                   help="RecBole's largest number of epochs (it stops early on the validation NDCG@10)")
    p.add_argument("--fedrec-set", action="append", default=[], metavar="MODEL:KEY=VALUE",
                   help="an extra train.py override of one model's fedrec run (repeatable)")
    p.add_argument("--reference-set", action="append", default=[], metavar="MODEL:KEY=VALUE",
                   help="an extra RecBole setting of one model (YAML value; repeatable)")
    p.add_argument("--skip-fedrec", action="store_true")
    p.add_argument("--skip-reference", action="store_true")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: seed 0, 3 fedrec rounds, 1 RecBole epoch, into a temporary folder")
    p.add_argument("--out", type=Path, default=None, help="folder for the fedrec runs, results.json and table.md "
                   "(must be new or empty; default reproductions/ranking_reference, with --quick a temporary one)")
    p.add_argument("--data-dir", type=Path, default=Path(os.environ.get("FEDREC_DATA_DIR", ROOT / "data")))
    p.add_argument("--combine", type=Path, nargs="+", default=None, metavar="DIR",
                   help="train nothing: the table of the results.json files in these --out folders together (e.g. "
                   "one invocation per model or per side)")
    return p.parse_args(argv)


def combine(folders: Sequence[Path]) -> list[dict[str, Any]]:
    """The runs of earlier invocations' ``results.json`` (in ``folders``) in one table; a (side, model, seed) run
    found twice is refused."""
    results: list[dict[str, Any]] = []
    pops = []
    for folder in folders:
        saved = json.loads((folder / "results.json").read_text())
        pops.append(saved["popularity"])
        results.extend(saved["runs"])
    keys = [(r["side"], r["model"], r["seed"]) for r in results]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise SystemExit(f"error: --combine: run {twice[0]} is in more than one folder")
    if any(p != pops[0] for p in pops):
        raise SystemExit("error: --combine: the folders' splits differ (their popularity baselines do)")
    print(table(results, [m for m in MODELS if any(r["model"] == m for r in results)], pops[0]))
    return results


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    if args.combine:
        return combine(args.combine)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models or any(m not in MODELS for m in models):
        raise SystemExit(f"error: --models must list some of {', '.join(MODELS)}, got {args.models!r}")
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    rounds = 3 if args.quick else args.rounds
    epochs = 1 if args.quick else args.epochs
    fedrec_extra = model_settings(args.fedrec_set, "--fedrec-set")
    reference_extra = {m: {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in entries)}
                       for m, entries in model_settings(args.reference_set, "--reference-set").items()}
    if not args.skip_reference and not have_recbole():
        raise SystemExit("error: RecBole is not installed (pip install recbole==1.2.1, see "
                         "docs/papers/ranking_reference.md), or pass --skip-reference")
    out = args.out or (Path(tempfile.mkdtemp(prefix="ranking_reference_")) if args.quick
                       else ROOT / "reproductions" / "ranking_reference")
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"error: --out {out} already holds results; give another folder")
    out.mkdir(parents=True, exist_ok=True)
    split = load_split(args.data_dir)
    pop = popularity(split)
    print(json.dumps({"split": "ml-100k leave-one-out", "users": split.num_users, "items": split.num_items,
                      "train": len(split.train[0]), "popularity": pop}), flush=True)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="recbole_") as workdir:
        for m in models:
            for seed in seeds:
                runs = []
                if not args.skip_fedrec:
                    runs.append(lambda m=m, seed=seed: run_fedrec(
                        m, seed, rounds, args.data_dir, out / "fedrec" / f"{m}_seed{seed}",
                        fedrec_extra[m], split))
                if not args.skip_reference:
                    runs.append(lambda m=m, seed=seed: run_reference(m, seed, epochs, split, Path(workdir),
                                                                     reference_extra[m]))
                for go in runs:
                    r = go()
                    results.append(r)
                    print(json.dumps(r, default=str), flush=True)
    text = table(results, models, pop)
    (out / "results.json").write_text(json.dumps({"popularity": pop, "runs": results}, indent=1, default=str) + "\n")
    (out / "table.md").write_text(text + "\n")
    print(text)
    print(f"written: {out / 'results.json'}, {out / 'table.md'}")
    return results


if __name__ == "__main__":
    main()

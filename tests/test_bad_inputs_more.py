"""Bad inputs of issue 44's battery: each is one ``error:`` line naming the field as typed (exit code 2, no run folder,
no traceback), or runs and says what it does."""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedrec.errors import ConfigError
from fedrec.privacy import TreeGaussian, TreeLaplace

#: a recommendation run of a second on 100 synthetic users, 50 items and 10 clients
SMALL = ("+experiment=fedgnn_synthetic", "task.rounds=2", "data.users=100", "data.items=50", "data.ratings=1000",
         "data.num_clients=10", "task.pseudo_items=5", "plots=false", "logger.tensorboard=false")
EPSILON = ("privacy.epsilon must be at most 100, got 1e+308: e^epsilon bounds how much one person's data may change "
           "the odds of any output, and beyond e^100 that bound protects nothing; ")

REFUSED = [
    (("replicates=0",), "error: replicates must be an integer >= 1, got 0"),
    ((*SMALL, "task.rounds=0"), "error: task.rounds must be an integer >= 1, got 0"),
    ((*SMALL, "privacy=gaussian", "privacy.epsilon=1e308"), f"error: {EPSILON}privacy=none trains without privacy"),
    (("+experiment=fclub_synthetic", "quick=true", "protocol=cdp_fclub_dc", "privacy.epsilon=1e308",
      "plots=false", "logger.tensorboard=false"), f"error: {EPSILON}privacy.epsilon=inf adds no noise"),
    ((*SMALL, "task.eval.ranking=sampled", "task.eval.negatives=49"),
     "error: task.eval.negatives must be below 49 for sampled ranking on the data's 50 items (as many ranks against "
     "every item: task.eval.ranking=full), got 49"),
    ((*SMALL, "task.eval.ranking=sampled", "task.eval.negatives=1e12"),
     "error: task.eval.negatives must be below 49 for sampled ranking on the data's 50 items (as many ranks against "
     "every item: task.eval.ranking=full), got 1000000000000"),
    ((*SMALL, "task.eval.ranking=full", "task.eval.ks=[10,100000]"),
     "error: task.eval.ks must be at most the data's 50 items (a top-K list of that catalogue), got 100000"),
    ((*SMALL, "attack=sign_flip", "attack.fraction=0.0001"),
     "error: attack.fraction=0.0001 makes no malicious client of the data's 10 clients (⌊fraction · clients⌋ = 0); "
     "one takes attack.fraction >= 0.1, and attack=none runs without malicious clients"),
    ((*SMALL, "task.prox_mu=0.1"),
     "error: task.prox_mu=0.1 acts only in local steps after the first, and the clients take one "
     "(strategy.local_steps=1); set strategy.local_steps > 1 (aggregator=fedavg takes 5) or task.prox_mu=0"),
    ((*SMALL, "trainer.enable_progress_bar=maybe"),
     "error: trainer.enable_progress_bar must be true, false or null (on an interactive terminal outside CI), got "
     "'maybe'"),
    ((*SMALL, "task.eval.negatives=20"),  # ignored without sampled ranking
     "error: task.eval.negatives: only sampled ranking reads it, and task.eval.ranking=null (full on implicit data, "
     "none on ratings); set task.eval.ranking=sampled; the value given would change nothing"),
    (("+experiment=fclub_synthetic", "protocol=fclub_dc", "protocol.noise_placement=trigger"),
     "error: protocol.noise_placement: the run adds no noise (no privacy mechanism), so there is none to place; "
     "select one (privacy=tree_gaussian); the value given would change nothing"),
    (("+experiment=mf_ml100k_implicit", "quick=true", "task.train_negatives=100000", "max_memory_gb=64"),
     "error: max_memory_gb=64: the run needs about 2924.1 GiB (model.embed_dim=16, 943 users, 1682 items, 98114 "
     "training ratings, task.pseudo_items=50, task.train_negatives=100000); lower one of them or raise "
     "max_memory_gb"),
    ((*SMALL, "aggregator=fedavg", "task.prox_mu=1e12"),  # diverges in round 0: a run-time failure, same form
     "error: task.prox_mu: round 0: a client's update is not finite (training diverged); lower task.prox_mu (1e+12) "
     "or strategy.local_lr (0.05)"),
    # the groups and fields added since the battery's last rerun, one bad value each
    ((*SMALL, "max_memory_gb=lots"), "error: max_memory_gb must be a positive number of GiB or null, got 'lots'"),
    ((*SMALL, "strategy.participation=poisson", "strategy.sample_rate=2"),
     "error: strategy.sample_rate must lie in (0.0, 1.0], got 2"),
    ((*SMALL, "task.side_graphs.items=0.5"),
     "error: task.side_graphs.items=0.5: data=synthetic has no item graph (the Monti files of flixster, yahoo_music "
     "have one); set it to 0"),
    ((*SMALL, "privacy=laplace", "privacy.placement=server"),
     "error: privacy.placement: privacy=laplace does not declare it, but its class takes it: add it with "
     "+privacy.placement=server"),
    ((*SMALL, "task.expansion.neighbours=-3"), "error: task.expansion.neighbours must be an integer >= 0, got -3"),
]


@pytest.mark.parametrize(("args", "line"), REFUSED, ids=[" ".join(a[-2:]) for a, _ in REFUSED])
def test_a_bad_input_is_one_error_line_with_exit_code_2_and_no_run_folder(
    train_py: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture, args: tuple[str, ...], line: str
) -> None:
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        train_py(*args, f"hydra.run.dir={out}")
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]
    assert not out.exists()


def test_more_pseudo_items_than_the_catalogue_runs_as_the_whole_catalogue_and_says_so(
    train_py: Callable[..., Any], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Each client already draws at most every item it has not rated, so 100000 runs as 50 does; the log says so."""
    summaries = {}
    for pseudo in (50, 100000):
        out = tmp_path / str(pseudo)
        train_py(*SMALL, f"task.pseudo_items={pseudo}", f"hydra.run.dir={out}")
        summaries[pseudo] = {k: v for k, v in json.loads((out / "summary.json").read_text()).items()
                             if k != "wall_seconds"}
        said = capsys.readouterr()
        warned = ("task.pseudo_items=100000 is more than the data's 50 items: each client uploads every item it has "
                  "not rated as a pseudo item, as with task.pseudo_items=50")
        assert (warned in said.out + said.err) == (pseudo == 100000)
    assert summaries[100000] == summaries[50]


def test_epsilon_bound_keeps_inf_for_the_noiseless_trees_and_accepts_100() -> None:
    assert not TreeLaplace(epsilon=math.inf).adds_noise  # Fed_UCB's "no noise" setting
    assert math.isinf(TreeGaussian(epsilon=math.inf).epsilon)
    assert TreeLaplace(epsilon=100.0).epsilon == 100.0
    with pytest.raises(ConfigError, match=r"^privacy\.epsilon must be at most 100, got 100\.5: "):
        TreeLaplace(epsilon=100.5)


def test_the_memory_check_respects_the_address_space_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under ``ulimit -v`` a run may map no more than the limit less what the process has mapped already."""
    import resource

    from fedrec.app import build

    mapped = build.capacity._proc_field("/proc/self/status", "VmSize:")
    limits = {resource.RLIMIT_AS: (mapped + 2**30, resource.RLIM_INFINITY)}
    real = resource.getrlimit
    monkeypatch.setattr(resource, "getrlimit", lambda which: limits.get(which) or real(which))
    assert 0.9 * 2**30 < build.available_memory() <= 2**30

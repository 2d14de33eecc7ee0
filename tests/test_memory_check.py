"""A bandit run too large for the machine's memory is refused before anything is allocated, with the estimate, the
memory available and the sizes to lower."""
from __future__ import annotations

from collections.abc import Callable

import pytest
from omegaconf import DictConfig

from fedrec.app import build
from fedrec.errors import ConfigError

Compose = Callable[..., DictConfig]


@pytest.mark.parametrize("overrides, field", [
    (("replicates=50",), "replicates"),
    (("env.num_clients=20000",), "env.num_clients"),
])
def test_a_run_larger_than_the_memory_is_refused_naming_the_sizes(
    compose_cfg: Compose, monkeypatch: pytest.MonkeyPatch, overrides: tuple[str, ...], field: str
) -> None:
    cfg = compose_cfg(*overrides)
    need = build.bandit_memory_estimate(cfg)
    monkeypatch.setattr(build.capacity, "available_memory", lambda: need - 1)
    with pytest.raises(ConfigError, match=rf"^{field}: the run needs about .* GiB \(replicates=.*\) and .* GiB is "
                                          r"available; lower one of them$"):
        build.build_task(cfg)
    monkeypatch.setattr(build.capacity, "available_memory", lambda: need)  # exactly enough: built
    assert build.build_task(cfg) is not None

"""CriteoReplayEnv on small Criteo-format logs, checked against plain re-computations of the preprocessing."""
from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from fedrec.envs import criteo
from fedrec.envs.criteo import CriteoReplayEnv, cantor_pair, fill_missing, hash_components, item_labels, split_groups
from fedrec.errors import ConfigError, DatasetNotFoundError

ROOT = Path(__file__).resolve().parents[1]
N_ROWS = 300
K = 8
SPARSE = 4  # I5 (0-based integer column 4): missing in 60 % of rows -> dropped
EMPTY = 6  # I7: missing everywhere -> dropped
BORDER = 8  # I9: missing in exactly 40 % of rows -> kept
CONSTANT = 12  # I13: a single value (or empty) -> scaled to 0
KEPT = [j for j in range(13) if j not in (SPARSE, EMPTY)]


def make_rows(n: int = N_ROWS, seed: int = 0) -> list[list[str]]:
    """Rows of 40 text fields: label, I1..I13 (some empty, I2 with negatives), C1..C26 (some empty)."""
    rng = np.random.default_rng(seed)
    vocab = [[f"{int(rng.integers(2**32)):08x}" for _ in range(6)] for _ in range(26)]
    rows = []
    for i in range(n):
        ints = []
        for j in range(13):
            if j in (SPARSE, BORDER, EMPTY):  # missing in exactly 60 %, 40 %, 100 % of rows
                ints.append("" if j == EMPTY or i % 5 < (3 if j == SPARSE else 2) else str(int(rng.integers(50))))
            elif j == 0 and i < 3:  # leading gap: back-filled
                ints.append("")
            elif j == 1:
                ints.append(str(int(rng.integers(-3, 20))))
            elif j == CONSTANT:
                ints.append("" if rng.random() < 0.1 else "7")
            else:
                ints.append("" if rng.random() < 0.1 else str(int(rng.integers(0, 100))))
        cats = ["" if rng.random() < 0.1 else vocab[j][int(rng.integers(6))] for j in range(26)]
        rows.append([str(int(rng.integers(2))), *ints, *cats])
    return rows


def write_log(path: Path, rows: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(r) + "\n" for r in rows))
    return path


def md5_bucket(text: str) -> int:
    return int(hashlib.md5(text.encode()).hexdigest(), 16) % 3


def pair(a: int, b: int) -> int:
    return (a + b) * (a + b + 1) // 2 + b


def expected(rows: list[list[str]], k: int = K) -> dict:
    """The whole preprocessing, done independently with plain Python."""
    n = len(rows)
    columns = []
    for j in KEPT:
        col = [None if r[1 + j] == "" else float(r[1 + j]) for r in rows]
        last = None
        for i in range(n):  # forward fill
            col[i] = last if col[i] is None else col[i]
            last = col[i]
        first = next(v for v in col if v is not None)
        col = [first if v is None else v for v in col]  # back fill (leading gap only)
        if j == 1:
            col = [v + 3 for v in col]
        lo, hi = min(col), max(col)
        columns.append([(v - lo) / (hi - lo) if hi > lo else 0.0 for v in col])
    users = np.array(columns).T
    counts = []
    for r in rows:
        c = [0, 0, 0]
        for v in r[14:]:
            c[md5_bucket(v or "nan")] += 1
        counts.append(c)
    labels = []
    for c0, c1, c2 in counts:
        p1 = pair(c0, c1)
        labels.append(pair(p1, pair(p1, c2)))
    freq = Counter(labels)
    top = sorted(freq, key=lambda lab: (-freq[lab], lab))[:k]
    kept_rows = [i for i in range(n) if labels[i] in top]
    item_counts = np.array([counts[labels.index(lab)] for lab in top], dtype=float)
    lo, span = item_counts.min(0), item_counts.max(0) - item_counts.min(0)
    return {
        "users": users, "kept_rows": kept_rows, "top": top, "distinct": len(freq),
        "items": [top.index(labels[i]) for i in kept_rows],
        "item_features": (item_counts - lo) / np.where(span > 0, span, 1.0),
        "clicks": [float(rows[i][0]) for i in kept_rows],
    }


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[str]], dict]:
    data_dir = tmp_path_factory.mktemp("data")
    rows = make_rows()
    write_log(data_dir / "criteo" / "train.txt", rows)
    return data_dir, rows, expected(rows)


@pytest.fixture(scope="module")
def env(log: tuple[Path, list[list[str]], dict]) -> CriteoReplayEnv:
    return CriteoReplayEnv(log[0], num_arms=K, num_user_groups=4)


def test_user_features_drop_fill_and_scale(env: CriteoReplayEnv, log: tuple) -> None:
    _, _, want = log
    users = env.user_features[:, 1:]
    assert users.shape == (len(want["kept_rows"]), 11)  # I5 (60 % missing) and I7 (all missing) are dropped
    assert users.min() >= 0.0 and users.max() <= 1.0
    np.testing.assert_allclose(users, want["users"][want["kept_rows"]], atol=1e-12)
    np.testing.assert_array_equal(env.user_features[:, 0], 0.0)  # the platform's row of the outer sum
    np.testing.assert_array_equal(users[:, -1], 0.0)  # I13 is constant


def test_fill_missing_rules() -> None:
    frame = pd.DataFrame({
        "I1": [np.nan, 2.0, np.nan, 4.0, 5.0],  # 40 % missing: kept
        "I2": [-3.0, np.nan, 5.0, np.nan, np.nan],  # 60 % missing: dropped
        "I3": [np.nan, np.nan, 7.0, np.nan, 1.0],  # 60 % missing: dropped
        "I4": [np.nan] * 5,
    })
    assert fill_missing(frame).columns.tolist() == ["I1"]
    frame = pd.DataFrame({"I1": [np.nan, 2.0, np.nan, 4.0, 5.0], "I2": [np.nan, -3.0, 5.0, np.nan, -1.0]})
    out = fill_missing(frame)
    assert out["I1"].tolist() == [2.0, 2.0, 2.0, 4.0, 5.0]
    assert out["I2"].tolist() == [0.0, 0.0, 8.0, 8.0, 2.0]  # filled, then shifted by 3


def test_hashing_of_known_values() -> None:
    value = "68fd1e64"
    frame = pd.DataFrame({"C1": [value, ""], "C2": [value, value], "C3": ["", ""]})
    want = np.zeros((2, 3), dtype=int)
    for i, row in enumerate([[value, value, "nan"], ["nan", value, "nan"]]):
        for v in row:
            want[i, int(hashlib.md5(v.encode()).hexdigest(), 16) % 3] += 1
    np.testing.assert_array_equal(hash_components(frame), want)


def test_cantor_pairing() -> None:
    assert cantor_pair(np.array([0, 1, 0, 2, 1, 47]), np.array([0, 0, 1, 0, 1, 32])).tolist() == [0, 1, 2, 3, 4, 3192]
    # (9, 9, 8): p1 = pair(9, 9) = 180, p2 = pair(180, 8) = 17774, label = pair(180, 17774)
    p1 = (9 + 9) * (9 + 9 + 1) // 2 + 9
    p2 = (p1 + 8) * (p1 + 8 + 1) // 2 + 8
    assert (p1, p2) == (180, 17774)
    assert item_labels(np.array([[9, 9, 8]])).tolist() == [(p1 + p2) * (p1 + p2 + 1) // 2 + p2]


def test_items_are_the_top_labels_and_other_events_are_dropped(env: CriteoReplayEnv, log: tuple) -> None:
    _, rows, want = log
    assert 0 < len(want["kept_rows"]) < len(rows)
    assert env.horizon == len(want["kept_rows"]) and env.num_clients == env.horizon
    np.testing.assert_allclose(env.item_features, want["item_features"], atol=1e-12)
    assert env.item_features.min() == 0.0 and env.item_features.max() == 1.0
    items, position = env.candidates(0, 0)
    logged = items[np.arange(len(items)), position]
    assert logged.tolist() == want["items"]


def test_dimensions_and_partition(env: CriteoReplayEnv) -> None:
    d_u, groups = 11, [3, 3, 3, 2]
    assert env.dim == (1 + d_u) * 3
    assert env.partition == [3] + [g * 3 for g in groups]
    assert env.num_arms == K


def test_contexts_rewards_and_logged_position(env: CriteoReplayEnv, log: tuple) -> None:
    _, _, want = log
    chunk = env.chunk(0, 0)
    items, position = env.candidates(0, 0)
    assert chunk.clients.tolist() == list(range(len(want["kept_rows"])))
    np.testing.assert_array_equal(chunk.logged, position)
    for s in (0, 7, len(items) - 1):
        u = np.concatenate([[0.0], want["users"][want["kept_rows"][s]]])
        assert items[s, position[s]] == want["items"][s]
        assert len(set(items[s].tolist())) == K
        for a in range(K):
            g = want["item_features"][items[s, a]]
            np.testing.assert_allclose(chunk.contexts[s, a], (u[:, None] + g[None, :]).ravel(), atol=1e-12)
        reward = np.zeros(K)
        reward[position[s]] = want["clicks"][s]
        np.testing.assert_array_equal(chunk.expected[s], reward)
    assert chunk.expected.sum() == sum(want["clicks"])


def test_blocks_do_not_change_the_result(env: CriteoReplayEnv, log: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(criteo, "_BLOCK_BYTES", 1000)  # lines are ~200 bytes: many blocks, lines split across them
    small = CriteoReplayEnv(log[0], num_arms=K)
    np.testing.assert_array_equal(small.user_features, env.user_features)
    np.testing.assert_array_equal(small.item_features, env.item_features)
    assert small.horizon == env.horizon


def test_absolute_file_and_no_trailing_newline(tmp_path: Path, env: CriteoReplayEnv, log: tuple) -> None:
    path = tmp_path / "elsewhere.tsv"
    path.write_text((log[0] / "criteo" / "train.txt").read_text().rstrip("\n"))
    other = CriteoReplayEnv(tmp_path / "nothing_here", file=str(path), num_arms=K)
    np.testing.assert_array_equal(other.user_features, env.user_features)


def test_windows_line_ends(tmp_path: Path, env: CriteoReplayEnv, log: tuple) -> None:
    text = (log[0] / "criteo" / "train.txt").read_text()
    (tmp_path / "crlf.txt").write_bytes(text.replace("\n", "\r\n").encode())
    other = CriteoReplayEnv(tmp_path, file="crlf.txt", num_arms=K)
    np.testing.assert_array_equal(other.item_features, env.item_features)
    np.testing.assert_array_equal(other.user_features, env.user_features)


def test_max_rows_reads_only_the_first_rows(tmp_path: Path) -> None:
    rows = make_rows(60, seed=1)
    path = write_log(tmp_path / "criteo" / "train.txt", rows)
    with path.open("a") as f:
        f.write("this is not a criteo line\n2\t\t\n")
    with pytest.raises(ConfigError, match="line 61"):
        CriteoReplayEnv(tmp_path, num_arms=3, max_rows=None)
    env = CriteoReplayEnv(tmp_path, num_arms=3, max_rows=60, num_user_groups=2)
    want = expected(rows, k=3)
    assert env.horizon == len(want["kept_rows"])
    env = CriteoReplayEnv(tmp_path, num_arms=3, max_rows=40, num_user_groups=2)
    assert env.horizon == len(expected(rows[:40], k=3)["kept_rows"])


def _bad(rows: list[list[str]], line: int, text: str) -> list[list[str]]:
    out = [list(r) for r in rows]
    out[line - 1] = text.split("\t")
    return out


@pytest.mark.parametrize("line,make", [
    (7, lambda r: "\t".join(r[:39])),  # 39 fields (test.txt style)
    (12, lambda r: "\t".join(r + ["x"])),  # 41 fields
    (5, lambda r: ""),  # blank line
    (9, lambda r: "\t".join(["2"] + r[1:])),  # label not 0/1
    (3, lambda r: "\t".join([""] + r[1:])),  # empty label
    (10, lambda r: "\t".join(r[:3] + ["1.5"] + r[4:])),  # I3 not an integer
    (20, lambda r: "\t".join(r[:1] + ["abc"] + r[2:])),  # I1 not an integer
    (30, lambda r: "\t".join(r[:13] + ["inf"] + r[14:])),  # I13 not finite
])
def test_malformed_lines_name_file_and_line(tmp_path: Path, line: int, make: Callable[[list[str]], str]) -> None:
    rows = make_rows(30, seed=2)
    path = write_log(tmp_path / "criteo" / "train.txt", _bad(rows, line, make(rows[line - 1])))
    with pytest.raises(ConfigError) as err:
        CriteoReplayEnv(tmp_path, num_arms=2, num_user_groups=1)
    message = str(err.value)
    assert str(path) in message and f"line {line}:" in message and "\n" not in message


def test_bad_line_in_a_later_block(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(criteo, "_BLOCK_BYTES", 500)
    rows = make_rows(40, seed=3)
    rows[33][5] = "-x"
    write_log(tmp_path / "criteo" / "train.txt", rows)
    with pytest.raises(ConfigError, match=r"line 34: field 'I5' must be an integer"):
        CriteoReplayEnv(tmp_path, num_arms=2, num_user_groups=1)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "criteo" / "train.txt"
    path.parent.mkdir()
    path.write_text("")
    with pytest.raises(ConfigError, match="line 1: the file is empty") as err:
        CriteoReplayEnv(tmp_path)
    assert str(path) in str(err.value)


def test_missing_file_says_how_to_get_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="Criteo Display Advertising Challenge") as err:
        CriteoReplayEnv(tmp_path)
    assert str(tmp_path / "criteo" / "train.txt") in str(err.value) and "dac.tar.gz" in str(err.value)


def test_too_many_arms(log: tuple) -> None:
    distinct = log[2]["distinct"]
    with pytest.raises(ConfigError, match=rf"num_arms={distinct + 1}.*found {distinct}"):
        CriteoReplayEnv(log[0], num_arms=distinct + 1)


def test_user_groups() -> None:
    assert split_groups(10, 4) == [3, 3, 2, 2]
    assert split_groups(11, 4) == [3, 3, 3, 2]
    assert split_groups(5, 1) == [5]
    assert split_groups(3, 3) == [1, 1, 1]
    for n in (0, 12):
        with pytest.raises(ConfigError, match="num_user_groups"):
            split_groups(11, n)


def test_too_many_user_groups(log: tuple) -> None:
    with pytest.raises(ConfigError, match="num_user_groups"):
        CriteoReplayEnv(log[0], num_arms=K, num_user_groups=12)


def test_config_file_builds_the_env(log: tuple) -> None:
    node = OmegaConf.load(ROOT / "conf" / "env" / "criteo_replay.yaml")
    node.data_dir = str(log[0])
    node.num_arms = K
    env = instantiate(node, replicates=2, seed=3)
    assert isinstance(env, CriteoReplayEnv) and env.replicates == 2 and env.num_arms == K
    assert env.max_rows == 1_000_000 and env.combine == "outer_sum" and env.partition == [3, 9, 9, 9, 6]


def test_vfl_criteo_experiment_runs_end_to_end(log: tuple, tmp_path: Path,
                                               compose_cfg: Callable[..., DictConfig]) -> None:
    """The experiment config on a written log: replay metrics and the parties' traffic in the summary, and
    VFUCB's CTR equal to central LinUCB's (the replay path is the same, spec §6 test 10)."""
    from fedrec.app.cli import run

    events = len(CriteoReplayEnv(log[0], num_arms=K)._clicks)
    summaries = {}
    for protocol in ("vfucb", "central_linucb", "partial_linucb"):
        cfg = compose_cfg("+experiment=vfl_criteo", f"protocol={protocol}", f"data_dir={log[0]}", f"env.num_arms={K}",
                          "replicates=2", "task.steps_per_round=50", "logger.tensorboard=false", "plots=false")
        s = summaries[protocol] = run(cfg, output_dir=tmp_path / protocol)
        assert s["steps"] == events and 0 < s["matched_steps"] <= events and np.isfinite(s["relative_ctr"])
        assert (s.get("comm_party1_sent_scalars", 0.0) > 0) == (protocol == "vfucb")
    assert summaries["vfucb"]["ctr_per_replicate"] == summaries["central_linucb"]["ctr_per_replicate"]

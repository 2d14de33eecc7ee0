"""The UCI diabetes environment (gossip spec §4.3): arm assignment, the text "None", the hospital split, the
record pools and their sampling, bad files, and the real file's counts (SOURCES.md)."""
from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedrec.envs.diabetes import ARM_GROUPS, FILE, FOLDER, MEDICATIONS, DiabetesMAB, diabetes_arms, read_diabetes
from fedrec.errors import ConfigError, DatasetNotFoundError
from fedrec.federation.topology import complete
from fedrec.protocols.gossip import GossipUCB

COLUMNS = ("encounter_id", "max_glu_serum", "A1Cresult", *MEDICATIONS, "change", "readmitted")


def record(readmitted: str = "NO", **meds: str) -> dict[str, str]:
    """One row: every medication "No" unless given (``_`` for ``-`` in names), the measurements "None"."""
    row = {c: "No" for c in COLUMNS}
    row.update(encounter_id="0", max_glu_serum="None", A1Cresult="None", change="No", readmitted=readmitted)
    row.update({k.replace("_", "-"): v for k, v in meds.items()})
    return row


def write(root: Path, rows: list[dict[str, str]], columns: tuple[str, ...] = COLUMNS) -> Path:
    path = root / FOLDER / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [",".join(columns)] + [",".join(r[c] for c in columns) for r in rows]
    path.write_text("\r\n".join(lines) + "\r\n")
    # listed in a SHA256SUMS beside it, as one's own version of the file is (else its line count must be UCI's)
    (root / "SHA256SUMS").write_text(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  ./{FOLDER}/{FILE}\n")
    return path


#: hand-made rows and their arm (0-based; -1 dropped)
CASES = [
    (record(), 4),
    (record(">30", insulin="Steady"), 0),
    (record("<30", metformin="Steady"), 1),
    (record(glipizide="Steady", acarbose="Steady"), 2),
    (record(tolazamide="Steady"), 3),
    (record(citoglipton="Steady"), 3),
    (record(glyburide="Steady", glyburide_metformin="Steady", metformin_pioglitazone="Steady"), 3),
    (record(insulin="Steady", metformin="Steady"), -1),  # two groups
    (record(repaglinide="Steady", nateglinide="Steady"), -1),  # groups 3 and 4
    (record(">30", insulin="Up"), -1),
    (record(metformin="Steady", glyburide="Down"), -1),
    (record(examide="Down"), -1),
]


def test_arm_assignment_and_none_is_text(tmp_path: Path) -> None:
    """Each hand-made row lands in its arm of §4.3; reward 1 iff ">30"; "None" and the other text stay verbatim."""
    rows = [r for r, _ in CASES]
    rows[0]["A1Cresult"] = ">7"
    rows[1]["max_glu_serum"] = "?"
    frame = read_diabetes(write(tmp_path, rows))
    assert not frame.isna().any().any()
    assert list(frame["A1Cresult"]) == [">7"] + ["None"] * (len(rows) - 1)
    assert list(frame["max_glu_serum"][:3]) == ["None", "?", "None"]
    got = diabetes_arms(frame)
    assert got.arm.tolist() == [a for _, a in CASES]
    assert got.reward.tolist() == [float(r["readmitted"] == ">30") for r in rows]
    assert (got.dropped_up_down, got.dropped_multi_group) == (3, 2)
    assert sorted(MEDICATIONS) == sorted({*MEDICATIONS}) and len(MEDICATIONS) == 23
    assert "tolazamide" in ARM_GROUPS[3] and "citoglipton" in ARM_GROUPS[3]


def hospital_rows(rewards: list[list[list[int]]]) -> list[dict[str, str]]:
    """Rows of hospital blocks: block i holds, for every arm k, records with ``rewards[i][k]`` plus one dropped row."""
    arm_meds = [dict(insulin="Steady"), dict(metformin="Steady"), dict(miglitol="Steady"), dict(pioglitazone="Steady"),
                {}]
    rows = []
    for block in rewards:
        for k, values in enumerate(block):
            rows += [record(">30" if v else "NO", **arm_meds[k]) for v in values]
        rows.append(record(">30", insulin="Down"))
    for e, row in enumerate(rows):
        row["encounter_id"] = str(e)
    return rows


#: per hospital and arm, the 0/1 rewards of its records (10 records + 1 dropped row per hospital)
REWARDS = [
    [[1, 0, 0, 0], [1], [0, 1], [1], [0, 0]],
    [[1, 1], [0, 0, 1], [1, 1, 1], [0], [1]],
    [[0], [1, 1], [0], [1, 0, 1, 1, 1], [1]],
]


def test_contiguous_split_pools_and_sampling(tmp_path: Path) -> None:
    """Hospitals are the file's equal thirds; pools hold each hospital's records of the arm; μ_{i,k} is the pool
    mean and μ_k the mean over hospitals; draws come from the pool uniformly with replacement."""
    write(tmp_path, hospital_rows(REWARDS))
    env = DiabetesMAB(tmp_path, replicates=2, seed=3)
    assert env.agent.tolist() == [i for i in range(3) for _ in range(11)]
    assert env.counts.tolist() == [[len(v) for v in block] for block in REWARDS]
    expect = np.array([[np.mean(v) for v in block] for block in REWARDS])
    np.testing.assert_allclose(env.means, np.broadcast_to(expect, (2, 3, 5)))
    np.testing.assert_allclose(env.global_means[0], expect.mean(0))
    print(env.describe())
    T = 20_000
    draws = np.stack([env.rewards(np.full((2, 3), k), t)
                      for k in range(5) for t in range(T)]).reshape(5, T, 2, 3)
    freq = draws.mean(1).transpose(1, 2, 0)  # (R, N, M)
    sd = np.sqrt(expect * (1 - expect) / T)
    assert (np.abs(freq - expect) <= 4.5 * sd + 1e-12).all()
    assert (draws[:, :, 0, 0] != draws[:, :, 1, 0]).any()  # replicates draw independently
    assert env.reward(1, 2, 3, 7) == draws[3, 7, 1, 2]


def test_random_split(tmp_path: Path) -> None:
    """The random split is a seeded partition into equal parts, the same for every run seed."""
    rows = hospital_rows([[[1, 0] * 3, [1] * 3, [0, 1] * 2, [1] * 4, [0] * 5]] * 3)
    write(tmp_path, rows)
    a = DiabetesMAB(tmp_path, seed=0, split="random", split_seed=1)
    b = DiabetesMAB(tmp_path, seed=5, split="random", split_seed=1)
    c = DiabetesMAB(tmp_path, split="random", split_seed=2)
    assert np.bincount(a.agent).tolist() == [len(rows) // 3] * 3
    assert np.array_equal(a.agent, b.agent) and not np.array_equal(a.agent, c.agent)
    assert not np.array_equal(a.agent, DiabetesMAB(tmp_path).agent)
    assert a.counts.sum() == c.counts.sum() == (a.records.arm >= 0).sum()


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match=f"{FOLDER}/{FILE}"):
        DiabetesMAB(tmp_path)
    columns = tuple(c for c in COLUMNS if c not in ("tolazamide", "readmitted"))
    path = write(tmp_path, [record()], columns)
    with pytest.raises(ConfigError, match=rf"{FILE}: missing required columns \['tolazamide', 'readmitted'\]"):
        DiabetesMAB(tmp_path)
    rows = hospital_rows(REWARDS)
    write(tmp_path, [r for r in rows if r["metformin"] != "Steady" or int(r["encounter_id"]) < 11])
    with pytest.raises(ConfigError, match=r"agent 1 has no record of arm 2 \(metformin\)"):
        DiabetesMAB(tmp_path)
    rows[4]["insulin"] = "None"
    write(tmp_path, rows)
    with pytest.raises(ConfigError, match=rf"{FILE}, line 6: column 'insulin' must be one of"):
        DiabetesMAB(tmp_path)
    with pytest.raises(ConfigError, match="env.split"):
        DiabetesMAB(tmp_path, split="by_hospital")
    assert path.exists()


@pytest.mark.parametrize("replicates", [1, 2])
def test_gossip_ucb_plays_the_records_env(tmp_path: Path, replicates: int) -> None:
    """GossipBandit.play runs on the records environment, the same on both backends."""
    write(tmp_path, hospital_rows(REWARDS))
    env = DiabetesMAB(tmp_path, replicates=replicates, seed=1)
    ps = [GossipUCB(complete(3), 5, 200, replicates=replicates, seed=2, backend=b) for b in ("compiled", "torch")]
    arms = [p.play(env, 200, return_arms=True) for p in ps]
    assert torch.equal(*arms)
    assert set(ps[0].x0.unique().tolist()) <= {0.0, 1.0}
    torch.testing.assert_close(ps[0].theta, ps[1].theta, atol=1e-10, rtol=0)


def test_real_file_counts(data_dir: Path) -> None:
    """101,766 records; drops and per-hospital, per-arm counts as SOURCES.md reports; every pool non-empty."""
    env = DiabetesMAB(data_dir)
    print(env.describe())
    assert len(env.records.arm) == 101_766
    assert (env.records.dropped_up_down, env.records.dropped_multi_group) == (27_703, 18_420)
    assert env.counts.tolist() == [[6298, 1367, 2132, 2612, 8928], [4953, 1349, 1756, 2063, 7712],
                                   [5010, 1507, 1423, 1770, 6763]]
    assert env.counts.sum(0).tolist() == [16_261, 4_223, 5_311, 6_445, 23_403]
    pooled = np.bincount(env.records.arm[env.records.arm >= 0], weights=env.records.reward[env.records.arm >= 0])
    np.testing.assert_allclose(pooled / env.counts.sum(0), [0.340, 0.325, 0.392, 0.376, 0.309], atol=6e-4)
    assert (env.means > 0.2).all() and (env.means < 0.5).all()
    assert int(env.best_arm[0]) == 2 and env.local_best[0].tolist() != [2, 2, 2]  # local bias in the thirds
    assert math.isclose(env.global_means[0].sum(), env.means[0].mean(0).sum())


def test_a_truncated_file_is_refused_naming_it(data_dir: Path, tmp_path: Path) -> None:
    """A copy cut short (and listed in no SHA256SUMS) has fewer lines than UCI's 101,766 records and the header."""
    path = tmp_path / FOLDER / FILE
    path.parent.mkdir(parents=True)
    with (data_dir / FOLDER / FILE).open("rb") as src:
        path.write_bytes(b"".join(src.readline() for _ in range(5000)))
    with pytest.raises(ConfigError, match=f"{FILE}: 5000 lines, but the published file has 101767"):
        DiabetesMAB(tmp_path)

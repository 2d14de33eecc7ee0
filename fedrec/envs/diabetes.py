"""UCI Diabetes 130-US hospitals as a multi-agent bandit (Zhu et al. 2021, §5, Fig. 2(c)).

Each record (an inpatient encounter of ``diabetic_data.csv``, 101,766 rows) becomes an arm from its 23 medication
columns, with the five arms of the paper:

1. steady insulin; 2. steady metformin; 3. steady repaglinide, glipizide, rosiglitazone, acarbose, miglitol or
troglitazone; 4. steady nateglinide, chlorpropamide, glyburide, examide, glimepiride, acetohexamide, tolbutamide,
pioglitazone, sitagliptin (the column ``citoglipton``), glyburide-metformin, glipizide-metformin,
glimepiride-pioglitazone, metformin-rosiglitazone, metformin-pioglitazone, and tolazamide (our choice: the
paper lists glyburide twice and tolazamide nowhere); 5. no medication Steady.

Our rule (the paper does not say how records with several Steady medications map to arms): a record with any
Up/Down is dropped; a record goes to arm g if all its Steady medications are in group g, to arm 5 if none is,
and is dropped if they span several groups. The reward is 1 iff
``readmitted == ">30"`` (NO and <30 are 0). The N = 3 hospitals are contiguous equal thirds of the raw rows in
file order (``split="random"``: a seeded uniformly random partition). Agent i pulling arm k draws one of its
records of arm k uniformly with replacement (the ``RECORDS`` reward kind of :mod:`fedrec.envs.rewards`); μ_{i,k}
is the mean of that pool and μ_k = (1/N) Σ_i μ_{i,k}, the paper's global mean (not the pooled mean).

``max_glu_serum`` and ``A1Cresult`` hold the text ``None`` ("not measured"), which a default CSV reader turns
into NaN: every column is read as text with NA detection off (:func:`fedrec.utils.tables.read_table`), so ``None``
stays a string.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from fedrec.data.integrity import checked_file
from fedrec.envs.mab import MultiAgentMAB
from fedrec.envs.rewards import RECORDS
from fedrec.errors import ConfigError, check_choice, check_int
from fedrec.utils.seeding import numpy_generator
from fedrec.utils.tables import read_table

#: the dataset's folder under the data directory and its records file
FOLDER, FILE = "uci-diabetes-130", "diabetic_data.csv"
#: the encounters UCI's page publishes for the file
ENCOUNTERS = 101_766
HOW_TO_GET = (f"Put UCI's 'Diabetes 130-US hospitals for years 1999-2008' {FILE} (doi:10.24432/C5230J) in "
              f"<data_dir>/{FOLDER}/.")

#: the medication groups of arms 1–4 (arm 5: none Steady); together the dataset's 23 medication columns
ARM_GROUPS: tuple[tuple[str, ...], ...] = (
    ("insulin",),
    ("metformin",),
    ("repaglinide", "glipizide", "rosiglitazone", "acarbose", "miglitol", "troglitazone"),
    ("nateglinide", "chlorpropamide", "glyburide", "examide", "glimepiride", "acetohexamide", "tolbutamide",
     "pioglitazone", "citoglipton", "glyburide-metformin", "glipizide-metformin", "glimepiride-pioglitazone",
     "metformin-rosiglitazone", "metformin-pioglitazone", "tolazamide"),
)
ARM_NAMES = ("insulin", "metformin", "group 3", "group 4", "none")
MEDICATIONS = tuple(m for group in ARM_GROUPS for m in group)
MEDICATION_VALUES = ("No", "Steady", "Up", "Down")
READMITTED_VALUES = ("NO", ">30", "<30")
REQUIRED = (*MEDICATIONS, "readmitted")
SPLITS = ("contiguous", "random")


@dataclass
class DiabetesRecords:
    """Every raw record's arm (0–4, or -1 when dropped) and 0/1 reward, and why records were dropped."""

    arm: np.ndarray  # (rows,) int64
    reward: np.ndarray  # (rows,) float64
    dropped_up_down: int
    dropped_multi_group: int


def read_diabetes(path: Path) -> pd.DataFrame:
    """All columns of ``path`` as text (``None`` and ``?`` kept verbatim); the header must name :data:`REQUIRED`."""
    checked_file(path, HOW_TO_GET, ENCOUNTERS + 1)  # a truncated file is refused (the header is a line)
    with path.open(encoding="latin-1") as f:
        header = f.readline().rstrip("\r\n").split(",")
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise ConfigError(f"{path}: missing required columns {missing}")
    return read_table(path, header, sep=",", header=True, text=header)


def diabetes_arms(frame: pd.DataFrame, source: Path | str = "diabetes") -> DiabetesRecords:
    """The arm and reward of every record of ``frame`` by the rule of the module docstring; ``source``
    names the file in errors about values outside {No, Steady, Up, Down} or {NO, >30, <30}."""
    for column, allowed in (*((m, MEDICATION_VALUES) for m in MEDICATIONS), ("readmitted", READMITTED_VALUES)):
        bad = ~frame[column].isin(allowed).to_numpy()
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            check_choice(f"{source}, line {row + 2}: column {column!r}", frame[column].iloc[row], allowed)
    up_down = np.zeros(len(frame), dtype=bool)
    steady = np.zeros((len(frame), len(ARM_GROUPS)), dtype=bool)
    for g, group in enumerate(ARM_GROUPS):
        for m in group:
            values = frame[m].to_numpy()
            up_down |= (values == "Up") | (values == "Down")
            steady[:, g] |= values == "Steady"
    groups = steady.sum(1)
    arm = np.where(groups == 0, len(ARM_GROUPS), steady.argmax(1))
    arm[(groups > 1) | up_down] = -1
    reward = (frame["readmitted"].to_numpy() == ">30").astype(np.float64)
    return DiabetesRecords(arm.astype(np.int64), reward, int(up_down.sum()), int(((groups > 1) & ~up_down).sum()))


class DiabetesMAB(MultiAgentMAB):
    """Fig. 2(c)'s environment: N hospitals × 5 arms, rewards resampled from each hospital's records.

    Args:
        data_dir: the folder holding ``uci-diabetes-130/diabetic_data.csv``.
        replicates, seed: R and the run seed (it keys the reward stream; the pools are the same for all replicates).
        num_agents: N hospitals (the paper: 3).
        split: ``"contiguous"`` (default: equal blocks of raw rows in file order, the split that the paper says
            shows local bias; it also says "randomly divide", so the choice is ours) or ``"random"`` (a uniformly
            random partition into equal parts, drawn from ``split_seed``).
        split_seed: the seed of the random split, kept apart from ``seed`` so that trials share one partition.

    Attributes besides :class:`MultiAgentMAB`'s: ``path``, ``records`` (:class:`DiabetesRecords`), ``agent`` (rows,)
    the hospital of every raw record, ``counts`` (N, M) the pool sizes; ``means`` holds the pool means μ_{i,k}.
    """

    name = "diabetes"
    reward_kind = RECORDS
    dataset = "diabetes"

    def __init__(self, data_dir: str | Path, replicates: int = 1, seed: int = 0, num_agents: int = 3,
                 split: str = "contiguous", split_seed: int = 0) -> None:
        num_agents = check_int("env.num_agents", num_agents, minimum=1)
        self.split = check_choice("env.split", split, SPLITS)
        self.split_seed = check_int("env.split_seed", split_seed, minimum=0)
        self.path = Path(data_dir) / FOLDER / FILE
        self.records = diabetes_arms(read_diabetes(self.path), self.path)
        rows = len(self.records.arm)
        if rows < num_agents:
            raise ConfigError(f"env.num_agents must be <= the {rows} records of {self.path}, got {num_agents}")
        N, M = num_agents, len(ARM_NAMES)
        blocks = np.repeat(np.arange(N), [len(b) for b in np.array_split(np.arange(rows), N)])
        if split == "random":
            self.agent = np.empty(rows, dtype=np.int64)
            self.agent[numpy_generator(self.split_seed, "envs.diabetes.split").permutation(rows)] = blocks
        else:
            self.agent = blocks
        kept = self.records.arm >= 0
        cell = self.agent[kept] * M + self.records.arm[kept]
        self.counts = np.bincount(cell, minlength=N * M).reshape(N, M)
        for i, k in zip(*np.nonzero(self.counts == 0)):
            raise ConfigError(f"{self.path}: agent {i} has no record of arm {k + 1} ({ARM_NAMES[k]}); "
                              f"every (agent, arm) pool must be non-empty")
        means = np.bincount(cell, weights=self.records.reward[kept], minlength=N * M).reshape(N, M) / self.counts
        super().__init__(N, M, replicates, seed, means=means, noise_std=0.0)
        self.noise = "records"
        order = np.argsort(cell, kind="stable")  # pools in file order, (agent, arm) major
        self.pool_values = np.ascontiguousarray(self.records.reward[kept][order])
        self.pool_ptr = np.concatenate([[0], np.cumsum(self.counts.ravel())]).astype(np.int64)

    def describe(self) -> str:
        """The per-(agent, arm) record counts and means μ_{i,k}, the global μ_k and the drops, as a text table."""
        N, M = self.num_agents, self.num_arms
        lines = [f"{self.path} ({self.split} split): {len(self.records.arm)} records, "
                 f"{self.records.dropped_up_down} dropped for Up/Down, {self.records.dropped_multi_group} for "
                 f"several groups, {int(self.counts.sum())} kept",
                 "agent | " + " | ".join(f"arm {k + 1} ({ARM_NAMES[k]})" for k in range(M))]
        for i in range(N):
            lines.append(f"{i} | " + " | ".join(f"{self.counts[i, k]} ({self.means[0, i, k]:.3f})" for k in range(M)))
        lines.append("mu_k | " + " | ".join(f"{self.global_means[0, k]:.3f}" for k in range(M)))
        return "\n".join(lines)


__all__ = ["ARM_GROUPS", "ARM_NAMES", "DiabetesMAB", "DiabetesRecords", "diabetes_arms", "read_diabetes"]

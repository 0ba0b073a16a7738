"""What a target has learned across jobs: a cost model trained on every task measured there, and the PPO policies.

A job's searches start warm from it and give back what they learned:

    knowledge = Knowledge(target_key, cost_model=TargetModel.from_bytes(blob), policies=stored)
    tune(task, budget, knowledge=knowledge)          # searches rank with it, record into it
    knowledge.samples, knowledge.updated_policies    # the caller persists these
    TargetModel.fit(every_batch_of_the_target)       # and refits the target's model

* `TargetModel`: XGBoost on *program* features (MetaSchedule's per-store features pooled by mean and max,
  `features.MSFeatures`: the same length and meaning for every program on a target, unlike the knob features
  that only compare within one space), trained on every batch of measurements any job made on the target.
  Each workload's latencies become `log(best / latency)` with `best` that workload's best over all batches (a
  failure one below its worst), so tasks of different cost train one ranking. A task's own `XGBModel` takes its
  predictions as the base margin (`XGBModel(base=...)`): before the task has measured anything its candidates
  are ranked by what the target learned; its own trees then fit what the target model got wrong. The model is
  refit on the most recent `MAX_ROWS` rows whenever a job ends (a few seconds), so "incremental" means each job's
  trials join the training set, not that trees are appended.
* Policies: each PPO agent's networks (actor and critic) as bytes, by a key naming the target's operator family
  and the agent's dimensions (`tuner.ppo.policy_key`); a search loads the policy of its key when there is one and
  stores what it learned under the same key.

Both are versioned: `FEATURE_VERSION` names the features a `TargetModel` was trained on, and a model of another
version is ignored with a log line (`TargetModel.from_bytes` returns None), never fed features it does not know.

Layering: `tuner` never imports `service`; what is persisted where is the caller's.
"""

from __future__ import annotations

import io
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import xgboost as xgb

from .features import MS_FEATURE_LENGTH
from .version import SPACE_VERSION

log = logging.getLogger(__name__)

PROGRAM_WIDTH = 2 * MS_FEATURE_LENGTH  # the program features: the last columns of every search's feature rows
# what a `TargetModel` reads: bump the last number when the features' computation or the targets change
FEATURE_VERSION = f"ms{MS_FEATURE_LENGTH}-meanmax-space{SPACE_VERSION}-1"
MAX_ROWS = 40_000  # a target model is fit on at most this many of the target's latest rows
_MAGIC = b"altune-target-model\n"


@dataclass
class Samples:
    """One batch of measurements of one workload: its program features and latencies (None: failed)."""

    workload_key: str
    features: np.ndarray  # (n, PROGRAM_WIDTH), float32
    latencies_ms: list[float | None]

    @classmethod
    def joined(cls, batches: Sequence[Samples]) -> Samples:
        """One batch of several batches of one workload."""
        assert len({b.workload_key for b in batches}) == 1, f"{[b.workload_key for b in batches]=}"
        return cls(batches[0].workload_key, np.concatenate([b.features for b in batches]),
                   [v for b in batches for v in b.latencies_ms])

    def to_bytes(self) -> bytes:
        y = np.asarray([np.nan if v is None else v for v in self.latencies_ms], dtype=np.float64)
        buf = io.BytesIO()
        np.savez_compressed(buf, x=np.asarray(self.features, dtype=np.float32), y=y)
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, workload_key: str, data: bytes) -> Samples:
        arrays = np.load(io.BytesIO(data))
        return cls(workload_key, arrays["x"], [None if np.isnan(v) else float(v) for v in arrays["y"]])


def training_set(batches: Sequence[Samples], max_rows: int = MAX_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """(features, targets) of the latest `max_rows` rows of `batches` (oldest first): per workload,
    log(best / latency) with best the workload's best in all of `batches`; a failure one below its worst."""
    best: dict[str, float] = {}
    worst: dict[str, float] = {}
    for b in batches:
        for v in b.latencies_ms:
            if v is not None and v > 0:
                best[b.workload_key] = min(best.get(b.workload_key, math.inf), v)
                worst[b.workload_key] = max(worst.get(b.workload_key, 0.0), v)
    xs, ys = [], []
    for b in batches:
        if len(b.features) == 0:
            continue
        assert b.features.shape[1] == PROGRAM_WIDTH, f"{b.features.shape=} != (n, {PROGRAM_WIDTH})"
        top = best.get(b.workload_key)
        floor = math.log(top / worst[b.workload_key]) - 1.0 if top else -1.0
        xs.append(b.features)
        ys.append([math.log(top / v) if top and v is not None and v > 0 else floor for v in b.latencies_ms])
    if not xs:
        return np.zeros((0, PROGRAM_WIDTH), np.float32), np.zeros(0, np.float32)
    x, y = np.concatenate(xs)[-max_rows:], np.concatenate([np.asarray(v, np.float32) for v in ys])[-max_rows:]
    return x.astype(np.float32), y.astype(np.float32)


class TargetModel:
    """XGBoost on program features, trained on every workload measured on one target (see the module doc)."""

    def __init__(self, booster: xgb.Booster, rows: int, workloads: int, version: str = FEATURE_VERSION):
        self.booster, self.rows, self.workloads, self.version = booster, rows, workloads, version

    @classmethod
    def fit(cls, batches: Sequence[Samples], *, seed: int = 0, rounds: int = 120, threads: int = 1,
            max_rows: int = MAX_ROWS) -> TargetModel | None:
        """A model of `batches` (None: fewer than 16 correct rows, nothing worth ranking with)."""
        if sum(v is not None for b in batches for v in b.latencies_ms) < 16:
            return None
        x, y = training_set(batches, max_rows)
        params = {"objective": "reg:squarederror", "eta": 0.1, "max_depth": 8, "min_child_weight": 2,
                  "subsample": 0.9, "colsample_bytree": 0.8, "tree_method": "hist", "seed": seed,
                  "nthread": threads, "verbosity": 0}
        booster = xgb.train(params, xgb.DMatrix(x, label=y), num_boost_round=rounds)
        return cls(booster, len(y), len({b.workload_key for b in batches}))

    def predict(self, program_features: np.ndarray) -> np.ndarray:
        """Predicted log(best / latency) of each row (higher: faster)."""
        x = np.asarray(program_features, dtype=np.float32)
        assert x.ndim == 2 and x.shape[1] == PROGRAM_WIDTH, f"{x.shape=} != (n, {PROGRAM_WIDTH})"
        return self.booster.predict(xgb.DMatrix(x))

    def to_bytes(self) -> bytes:
        """A header line (JSON: version, rows, workloads), then the booster in XGBoost's UBJSON."""
        header = json.dumps({"version": self.version, "rows": self.rows, "workloads": self.workloads})
        return _MAGIC + header.encode() + b"\n" + bytes(self.booster.save_raw("ubj"))

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "model") -> TargetModel | None:
        """The model `to_bytes` wrote; None (with a log line saying why) when it is of another feature version
        or not a target model at all: it is never read with features it was not trained on."""
        if not data.startswith(_MAGIC):
            log.warning("%s: not an altune target model; starting cold", source)
            return None
        header, _, raw = data[len(_MAGIC):].partition(b"\n")
        try:
            meta = json.loads(header)
        except ValueError:
            log.warning("%s: unreadable target model header; starting cold", source)
            return None
        if meta.get("version") != FEATURE_VERSION:
            log.warning("%s: cost model of feature version %s ignored (this tuner reads %s); starting cold",
                        source, meta.get("version"), FEATURE_VERSION)
            return None
        booster = xgb.Booster()
        booster.load_model(bytearray(raw))
        booster.set_param({"nthread": 1})
        return cls(booster, int(meta.get("rows", 0)), int(meta.get("workloads", 0)))


@dataclass
class Knowledge:
    """What a job's searches start from and give back (see the module doc).

    Attributes:
        cost_model: the target's model (None: cold).
        policies: the stored PPO policies by key (read only).
        updated_policies: what this job's agents learned, by key (the caller persists these).
        samples: every batch of measurements this job's searches made, program features included.
    """

    cost_model: TargetModel | None = None
    policies: Mapping[str, bytes] = field(default_factory=dict)
    updated_policies: dict[str, bytes] = field(default_factory=dict)
    samples: list[Samples] = field(default_factory=list)

    def record(self, workload_key: str, rows: np.ndarray, latencies_ms: Sequence[float | None]) -> None:
        """A search's measured rows (its whole feature rows: their last `PROGRAM_WIDTH` columns are kept)."""
        rows = np.asarray(rows, dtype=np.float32)
        if rows.ndim != 2 or rows.shape[1] < PROGRAM_WIDTH or not len(rows):
            return  # a search without program features teaches the target model nothing
        self.samples.append(Samples(workload_key, rows[:, -PROGRAM_WIDTH:].copy(), list(latencies_ms)))

    def policy(self, key: str) -> bytes | None:
        """The latest policy of `key`: this job's, else the stored one."""
        return self.updated_policies.get(key, self.policies.get(key))

    def keep_policy(self, key: str, data: bytes) -> None:
        self.updated_policies[key] = data

    @property
    def warm(self) -> bool:
        return self.cost_model is not None or bool(self.policies)

    def grown(self, *, fit: bool = True) -> Knowledge:
        """What a next job starts from: this one's samples refit into a cost model (with `fit`; else the same
        model), its policies updated with what its agents learned. The caller that persists knowledge does the
        same from its store (`service.knowledge`); a benchmark or a test chains jobs with this."""
        model = TargetModel.fit(self.samples) if fit else self.cost_model
        return Knowledge(model or self.cost_model, {**self.policies, **self.updated_policies}, {}, list(self.samples))

    def save(self, path: str | Path) -> None:
        """Writes the samples, the policies (stored and updated) and the model to one .npz file."""
        arrays: dict[str, np.ndarray] = {}
        for i, b in enumerate(self.samples):
            arrays[f"sample/{i}/{b.workload_key}"] = np.frombuffer(b.to_bytes(), dtype=np.uint8)
        for key, data in {**self.policies, **self.updated_policies}.items():
            arrays[f"policy/{key}"] = np.frombuffer(data, dtype=np.uint8)
        if self.cost_model is not None:
            arrays["cost_model"] = np.frombuffer(self.cost_model.to_bytes(), dtype=np.uint8)
        with open(path, "wb") as f:
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> Knowledge:
        """What `save` wrote (a cost model of another feature version is left out, with a log line)."""
        data = np.load(path)
        out = cls()
        policies: dict[str, bytes] = {}
        for name in data.files:
            raw = data[name].tobytes()
            if name == "cost_model":
                out.cost_model = TargetModel.from_bytes(raw, source=str(path))
            elif name.startswith("policy/"):
                policies[name[len("policy/"):]] = raw
            elif name.startswith("sample/"):
                out.samples.append(Samples.from_bytes(name.split("/", 2)[2], raw))
        out.policies = policies
        return out

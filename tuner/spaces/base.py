"""The search space interface: a configuration (a dict of named integer knobs) -> a scheduled program.

A configuration is JSON-serializable, so the service stores it as is, and a search walks each knob
up or down over `Knob.choices`. A space validates configurations (`InvalidConfig` for one not in it),
samples them, names their neighbours and applies them (`ScheduleFailed` where TVM refuses).

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tvm

Config = dict[str, int]


class InvalidConfig(ValueError):
    """A configuration that names unknown knobs, misses knobs, or breaks a constraint."""


class ScheduleFailed(RuntimeError):
    """A valid-looking configuration that TVM refused to apply (a schedule error)."""


def tvm_error() -> type[Exception]:
    """The base class of the errors TVM's C++ side raises: `RuntimeError` (TVM 0.27 has no `TVMError`;
    `ScheduleError` and `tvm.error.InternalError`, a failed check, both derive from it)."""
    return RuntimeError


@dataclass(frozen=True)
class Knob:
    """One integer knob of a space and the values it may take (sorted ascending).

    Values of tile knobs are tile factors; a joint constraint (the inner factors'
    product divides the loop extent) is checked by `SearchSpace.validate`.
    """

    name: str
    choices: tuple[int, ...]


class SearchSpace(abc.ABC):
    """A space of configurations for one program."""

    @property
    @abc.abstractmethod
    def knobs(self) -> tuple[Knob, ...]:
        """Every knob, in a fixed order (the order of feature vectors)."""

    @abc.abstractmethod
    def untuned_config(self) -> Config:
        """The configuration nearest the untransformed program (where a search may start)."""

    @abc.abstractmethod
    def sample(self, rng: np.random.Generator, n: int) -> list[Config]:
        """`n` random valid configurations (may repeat)."""

    @abc.abstractmethod
    def validate(self, config: Config) -> Config:
        """The canonical form of `config`; raises `InvalidConfig` if it is not in the space."""

    @abc.abstractmethod
    def apply(self, config: Config) -> tvm.s_tir.Schedule:
        """The schedule of `config`; raises `InvalidConfig` or `ScheduleFailed`."""

    @abc.abstractmethod
    def neighbors(self, config: Config) -> list[Config]:
        """Valid configurations one step away from `config` (one knob changed)."""

    def mutate(self, config: Config, rng: np.random.Generator) -> Config:
        """A random neighbor of `config` (itself if it has none)."""
        near = self.neighbors(config)
        return near[int(rng.integers(len(near)))] if near else dict(config)

    def seed_configs(self) -> list[tuple[Config, str]]:
        """Known configurations a search measures first, with their sources ("untuned", "blocked"); none here."""
        return []

    def knob_features(self, config: Config) -> list[float]:
        """The knob part of a cost model's feature vector (a fixed length within the space): the knobs' values."""
        return [float(config[k.name]) for k in self.knobs]

    @property
    def feature_module(self) -> tvm.IRModule | None:
        """The module whose scheduled forms MetaSchedule's per-store features are read from (its signature); None:
        the space's programs get knob features only."""
        return None


def config_key(config: Config) -> str:
    """A canonical string of a configuration (for de-duplication)."""
    return ",".join(f"{k}={config[k]}" for k in sorted(config))


def known_nests(untuned: Config, blocked: Sequence[Config]) -> list[tuple[Config, str]]:
    """`seed_configs` of a space with an untuned nest and register-blocked ones: the untuned ("untuned": small
    memory-bound programs run fastest so), then each blocked one that differs from those before ("blocked")."""
    seeds = [(untuned, "untuned")]
    for config in blocked:
        if all(config_key(config) != config_key(c) for c, _ in seeds):
            seeds.append((config, "blocked"))
    return seeds


def sample_unique(space: SearchSpace, rng: np.random.Generator, n: int, exclude: Sequence[str] = ()) -> list[Config]:
    """Up to `n` distinct configurations whose keys are not in `exclude` (gives up after 8n draws)."""
    seen = set(exclude)
    out: list[Config] = []
    for _ in range(8):
        for config in space.sample(rng, n):
            key = config_key(config)
            if key not in seen:
                seen.add(key)
                out.append(config)
                if len(out) == n:
                    return out
    return out

"""Feature vectors of candidates for the cost model.

Two parts, concatenated:

* knob features (always): the space's `knob_features` (the loop space's: log2 of
  every tile factor at every level, level 0 included, the other knobs as numbers,
  and derived sizes: log2 of the parallel extent, of the register tile, of the
  level-2+3 tile, of the inner reduction tile, of the vector length, then
  `tensorize`, 0 where the space has no such knob). Cheap and exact, but only
  comparable within one space.
* MetaSchedule's per-store features (`PerStoreFeature`, 164 per buffer store:
  arithmetic, memory access, reuse, loop annotations), pooled over the stores
  of a program by mean and max into a fixed vector. They work in TVM 0.27 with
  a `TuneContext` and a `MeasureCandidate`, are extracted on every core (a
  batch is ranked while nothing is timed), and cost ~10 ms per candidate on
  this machine (a 3x3 conv2d), which is small beside a ~1 s build and run
  (the context is built without `TuneContext.__init__`: see `_bare_tune_context`).
  A program that fails to give them gets zeros (and the model learns from the
  knob features).

Layering: `tuner` never imports `service`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tvm
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule import _ffi_api
from tvm.s_tir.meta_schedule.logging import get_logger, get_logging_func

from compiler.target import host_cores

from .spaces.base import Config, SearchSpace

MS_FEATURE_LENGTH = 164  # PerStoreFeature with its defaults (buffers_per_store=5)


def _bare_tune_context(mod: tvm.IRModule, target: tvm.target.Target, num_threads: int) -> object:
    """A `TuneContext` holding only `mod` and `target` (all `PerStoreFeature` reads).

    `TuneContext.__init__` first imports `tvm.s_tir.tensor_intrin`, which parses
    hundreds of TVMScript intrinsics (CUDA, ARM, ...) through `inspect.stack()`:
    30 s on a quiet machine here and over 100 s on a loaded one, for tables our
    features never use. The FFI constructor it ends with is called directly instead.
    """
    context = ms.TuneContext.__new__(ms.TuneContext)
    context.__init_handle_by_constructor__(
        _ffi_api.TuneContext, mod, target, None, None, "main", num_threads, -1,
        get_logging_func(get_logger(__name__)),
    )
    _ffi_api.TuneContextInitialize(context)
    return context


class MSFeatures:
    """MetaSchedule's per-store features of scheduled programs, pooled per program."""

    def __init__(self, mod: tvm.IRModule, target: tvm.target.Target, num_threads: int | None = None):
        """
        Args:
            mod: the task's module (the programs' signature).
            target: the target the programs are for.
            num_threads: threads extracting a batch (default: the cores this process may use;
                nothing is timed while a search ranks its candidates).
        """
        self._ms = ms
        self._context = _bare_tune_context(mod, target, num_threads if num_threads is not None else host_cores())
        self._extractor = ms.feature_extractor.PerStoreFeature()
        self._args = ms.arg_info.ArgInfo.from_prim_func(mod["main"])

    def extract(self, schedules: Sequence[tvm.s_tir.Schedule | None]) -> np.ndarray:
        """(n, 2 * 164): mean and max over stores; zeros for None or a failure."""
        out = np.zeros((len(schedules), 2 * MS_FEATURE_LENGTH), dtype=np.float32)
        index = [i for i, s in enumerate(schedules) if s is not None]
        if not index:
            return out
        candidates = [self._ms.MeasureCandidate(schedules[i], self._args) for i in index]
        try:
            feats = self._extractor.extract_from(self._context, candidates)
        except Exception:  # a program MetaSchedule cannot analyze: knob features only
            return out
        for i, f in zip(index, feats):
            per_store = f.numpy()
            if per_store.size:
                out[i, :MS_FEATURE_LENGTH] = per_store.mean(axis=0)
                out[i, MS_FEATURE_LENGTH:] = per_store.max(axis=0)
        return out


class Featurizer:
    """Configurations of one space -> feature matrix (knob features, then MS features)."""

    def __init__(self, space: SearchSpace, target: tvm.target.Target | None = None, use_ms: bool = True):
        """
        Args:
            space: the space the configurations belong to.
            target: the target (MS features need it); None disables MS features.
            use_ms: whether to add MetaSchedule's per-store features.
        """
        self.space = space
        self._ms = None
        if use_ms and target is not None and space.feature_module is not None:
            self._ms = MSFeatures(space.feature_module, target)

    @property
    def program_features(self) -> bool:
        """Whether rows end with MetaSchedule's program features (`tuner.knowledge.PROGRAM_WIDTH` columns)."""
        return self._ms is not None

    def __call__(
        self, configs: Sequence[Config], schedules: Sequence[tvm.s_tir.Schedule | None] | None = None
    ) -> np.ndarray:
        """Feature matrix of `configs`; `schedules` (their applied schedules) spare re-applying."""
        knobs = np.asarray([self.space.knob_features(c) for c in configs], dtype=np.float32)
        if self._ms is None:
            return knobs
        if schedules is None:
            schedules = [self._try_apply(c) for c in configs]
        return np.concatenate([knobs, self._ms.extract(schedules)], axis=1)

    def _try_apply(self, config: Config) -> tvm.s_tir.Schedule | None:
        try:
            return self.space.apply(config)
        except Exception:
            return None

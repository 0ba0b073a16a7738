"""The whole-model check: a built model against the exported program's own output, and the schedules it removes.

    expected = reference_outputs(ep, inputs)               # torch: ep.module()(*inputs)
    checked = build_checked(model, target, schedules, inputs, expected)
    checked.built, checked.removed, checked.error          # a correct build (or None), keys of removed schedules

Every task schedule was checked on its own against its untransformed program while it was measured; the
whole-model check catches what that cannot see (a schedule wrong only on the model's real data, a layout
conversion or lowering fault between tasks). When the model with its schedules does not match, the model
without any is built: if that does not match either, the fault is not a schedule's and nothing may be served
(`error`); else the schedules are bisected (halves built on their own) down to the ones whose model does not
match, those are removed (their tasks get the default schedule), and the rest is built and checked again.

Layering: `compiler` never imports `tuner` or `service`. torch is imported inside the functions that run the
exported program: building and running the model needs only TVM.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compiler.arrays import check_close
from compiler.target import host_cores

from .artifact import torch_arguments, torch_outputs
from .build import BuiltModel, build_model, run_model
from .importer import ImportedModel

if TYPE_CHECKING:
    import numpy as np
    import torch


# the model's output against torch's: looser than one task's check (RTOL/ATOL of compiler.arrays), since
# errors of float32 rounding add up over a graph of reductions and polynomial exp/erf
MODEL_RTOL = 1e-3
MODEL_ATOL = 1e-4
# a quantized model's (`ImportedModel.quantized`): its convs sum exactly in int32 where torch's reference sums the
# dequantized values in float32, so a value within float32 rounding of a quantization step can land on the other
# side of it and move what follows by one step (quantized ResNet-18: 0.2% of its largest output); a schedule
# that computes something else is off by far more
QUANTIZED_RTOL = 1 / 256
QUANTIZED_ATOL = 1 / 256


def tolerance(model: ImportedModel) -> dict[str, float]:
    """`compare_outputs`' rtol and atol for `model`: the quantized bound for a quantized model."""
    if model.quantized:
        return {"rtol": QUANTIZED_RTOL, "atol": QUANTIZED_ATOL}
    return {"rtol": MODEL_RTOL, "atol": MODEL_ATOL}


@dataclass(eq=False)
class CheckedBuild:
    """A model built with the schedules that pass the whole-model check.

    Attributes:
        built: the build that matched the reference; None when even the untuned model did not (see `error`).
        schedules: the workload keys -> schedules it was built with.
        removed: workload keys whose schedule was removed because the model with it did not match.
        mismatches: what did not match, in words, in the order found (the first build's mismatch first).
        error: why nothing can be served (the untuned model does not match), else None.
        untuned: the build without schedules, when the check had to make one (it matched).
        builds: how many builds the check took.
    """

    built: BuiltModel | None
    schedules: dict[str, Any]
    removed: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    error: str | None = None
    untuned: BuiltModel | None = None
    builds: int = 0


def reference_outputs(ep: torch.export.ExportedProgram, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The exported program's own outputs on numpy inputs (`ep.module()`, torch eager), flattened, as numpy."""
    return torch_outputs(ep.module(), inputs)


def compare_outputs(outs: Sequence[np.ndarray], expected: Sequence[np.ndarray], *, rtol: float = MODEL_RTOL,
                    atol: float = MODEL_ATOL) -> str | None:
    """None when every output matches, else "output<i>: wrong result: ..." for the first that does not."""
    if len(outs) != len(expected):
        return f"{len(outs)} outputs, expected {len(expected)}"
    for i, (out, ref) in enumerate(zip(outs, expected)):
        problem = check_close(out, ref, rtol=rtol, atol=atol)
        if problem is not None:
            return f"output{i}: {problem}"
    return None


def build_checked(model: ImportedModel, target: Any, schedules: Mapping[str, Any], inputs: Sequence[np.ndarray],
                  expected: Sequence[np.ndarray], *, pipeline: str = "licm",
                  build: Callable[..., BuiltModel] | None = None) -> CheckedBuild:
    """Builds the model with `schedules` and checks it whole against `expected`, removing schedules whose
    model does not match (see the module's docstring).

    Args:
        model: the imported model.
        target: the TVM target.
        schedules: workload key -> scheduled IRModule/PrimFunc, as `build_model` takes them.
        inputs: sample inputs (numpy), in the model's order.
        expected: the reference outputs on them (`reference_outputs`).
        pipeline: the TIR pipeline (`build_model`'s).
        build: `build_model` or a stand-in with its signature (tests).

    Returns:
        The checked build; `built` is None (and `error` says why) when the untuned model does not match.
    """
    make = build or build_model
    result = CheckedBuild(built=None, schedules=dict(schedules))

    def attempt(keys: Sequence[str]) -> tuple[BuiltModel, str | None]:
        built = make(model, target, {k: schedules[k] for k in keys}, pipeline=pipeline)
        result.builds += 1
        return built, compare_outputs(run_model(built, inputs, target), expected, **tolerance(model))

    current = list(schedules)
    built, problem = attempt(current)
    if problem is None:
        result.built = built
        return result
    result.mismatches.append(f"with {len(current)} tuned schedule(s): {problem}")
    untuned, untuned_problem = (built, problem) if not current else attempt([])
    if untuned_problem is not None:
        result.error = f"the untuned model does not match the exported program: {untuned_problem}"
        result.schedules = {}
        if current:
            result.mismatches.append(f"without tuned schedules: {untuned_problem}")
        return result
    result.untuned = untuned
    while current:
        wrong = _bisect(current, lambda keys: attempt(keys)[1] is not None)
        result.removed += wrong
        current = [k for k in current if k not in wrong]
        built, problem = attempt(current) if current else (untuned, None)
        if problem is None:
            break
        result.mismatches.append(f"with {len(current)} tuned schedule(s) after removing {len(result.removed)}: "
                                 f"{problem}")
    result.built = built
    result.schedules = {k: schedules[k] for k in current}
    return result


def _bisect(keys: list[str], wrong: Callable[[list[str]], bool]) -> list[str]:
    """The keys to remove, given that the model with all of `keys` is wrong: halves are built on their own and
    a wrong half searched further; when neither half alone is wrong (only the two together), all of them."""
    if len(keys) == 1:
        return list(keys)
    half = len(keys) // 2
    found = [k for part in (keys[:half], keys[half:]) if wrong(part) for k in _bisect(part, wrong)]
    return found or list(keys)


def time_torch(module: Any, inputs: Sequence[Any], *, repeat: int = 5, min_repeat_ms: float = 50.0,
               warmup_s: float = 0.5, threads: int | None = None) -> float:
    """Median latency (ms) of one eager run of a torch module (no grad), each repeat averaging runs that fill
    at least `min_repeat_ms`, as `time_model` does for the artifact, after `warmup_s` of warm-up runs, on
    `threads` intra-op threads (default: every core this process may use, as the artifact; the setting is
    restored afterwards)."""
    import torch  # heavy: torch only where the exported program runs

    args, kwargs = torch_arguments(module, inputs)  # an exported program's pytree arguments rebuilt
    before = torch.get_num_threads()
    torch.set_num_threads(threads or host_cores())
    try:
        return _time_torch_runs(lambda: module(*args, **kwargs), repeat, min_repeat_ms, warmup_s)
    finally:
        torch.set_num_threads(before)


def _time_torch_runs(call: Callable[[], Any], repeat: int, min_repeat_ms: float, warmup_s: float) -> float:
    import torch  # heavy: torch only where the exported program runs

    with torch.no_grad():
        # warm-up for at least `warmup_s`: lazy initialisation, and TVM's thread pool, which spins for about
        # 0.4 s after a TVM run (docs: "How we measure") and would take a core from torch's threads
        start, runs = time.perf_counter(), 0
        while runs < 2 or time.perf_counter() - start < warmup_s:
            call()
            runs += 1
        once = max((time.perf_counter() - start) / runs, 1e-6)
        number = max(1, int(min_repeat_ms / 1e3 / once))
        results = []
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(number):
                call()
            results.append((time.perf_counter() - start) / number)
    return statistics.median(results) * 1e3

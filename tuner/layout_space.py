"""ALT's joint space (paper sec. 4-5): a layout of the operator's template and the loops of the program in it.

A configuration is one flat JSON dict: `layout.<param>` (the template's split factors; the weight's are
tied to the consumer's: kot = ot, kit = it, or kit = group in the dot-product form of an int8 / bfloat16
operator, `compiler.layout.templates`) plus the loop knobs of `LoopSpace` over the program rewritten
into that layout, data and output kept in the user's layouts (converted inside, as the artifact runs).
A configuration without `layout.*` knobs is the user's own layouts: the untransformed program's loops.

`LayoutSpace` is a `SearchSpace` like `LoopSpace`, so the searches work through one interface; its
`knobs` are the layout knobs, and each layout's loop knobs are `loops_of(config).knobs` (they differ
from layout to layout). `tuner.alt.ALTSearch` walks it with its PPO agents and cost model.

Layering: `tuner` never imports `service`; it imports `compiler`. TVM and numpy are imported inside functions.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from compiler.target import VectorUnit, vector_unit

from .space import Config, InvalidConfig, Knob, LoopSpace, SearchSpace, loop_space
from .task import Task

if TYPE_CHECKING:
    import numpy as np
    import tvm

    from compiler.layout import LayoutProgram

LAYOUT_PREFIX = "layout."
TIED = {"kot": "ot", "kit": "it"}  # weight factors follow the consumer's (contiguous weight vectors)


def split_config(config: Config) -> tuple[dict[str, int], Config]:
    """(layout choice, loop configuration) of a flat configuration."""
    choice = {k[len(LAYOUT_PREFIX):]: int(v) for k, v in config.items() if k.startswith(LAYOUT_PREFIX)}
    loops = {k: v for k, v in config.items() if not k.startswith(LAYOUT_PREFIX)}
    return choice, loops


def join_config(choice: dict[str, int], loops: Config) -> Config:
    return {**{LAYOUT_PREFIX + k: int(v) for k, v in sorted(choice.items())}, **loops}


def has_layout(config: Config) -> bool:
    return any(k.startswith(LAYOUT_PREFIX) for k in config)


def interface_space(prog: LayoutProgram, unit: VectorUnit | None = None) -> LoopSpace:
    """The loop space of a layout program that keeps the user's interface (what the artifact runs), for the
    vector unit `unit` (the task's target's; this machine's when None).

    The output's conversion back to the user's layout is the epilogue (see `align_epilogue`).
    """
    return loop_space(prog.prim_func, unit)


@functools.lru_cache(maxsize=64)
def _program(workload: Any, choice_key: tuple, keep_interface: bool) -> LayoutProgram:
    from compiler.layout import apply_layout

    return apply_layout(workload, dict(choice_key), keep_interface=keep_interface)


def layout_program(workload: Any, choice: dict[str, int], *, keep_interface: bool = False) -> LayoutProgram:
    """The workload rewritten into a template choice (cached)."""
    return _program(workload, tuple(sorted(choice.items())), keep_interface)


class LayoutSpace(SearchSpace):
    """ALT's joint layout and loop space of one task (`task.workload` gives the layout template)."""

    def __init__(self, task: Task, layout_levels: int = 1) -> None:
        """
        Args:
            task: the task; `task.workload` is required.
            layout_levels: 1 (one-level layout tiling, the paper's default) or 2 (its two-level output
                template: a second tile of every output dimension).

        Raises:
            ValueError: the task carries no workload.
        """
        from compiler.layout import dot_template, layout_template

        if task.workload is None:
            raise ValueError("the ALT space needs task.workload (the layout template comes from it)")
        self.task = task
        self.unit = vector_unit(task.target)  # the target's: its loop spaces' register blocks and seeds
        self.layout_levels = layout_levels
        # an int8 / bfloat16 operator on a target with its dot-product instruction: the template's dot form
        self.template = layout_template(task.workload, layout_levels, dot=dot_template(task.workload, task.target))
        self.free = tuple(p for p in self.template.params if p.name not in TIED)  # what a search chooses

    @property
    def knobs(self) -> tuple[Knob, ...]:
        """The layout knobs (`layout.<param>`); a layout's loop knobs are `loops_of(config).knobs`."""
        return tuple(Knob(LAYOUT_PREFIX + p.name, tuple(sorted(p.candidates))) for p in self.free)

    def full_choice(self, choice: dict[str, int]) -> dict[str, int]:
        """The template's defaults filled in and the tied weight factors set from the consumer's."""
        from compiler.layout import GROUP_PARAM

        full = {**self.template.default(), **choice}
        for k, v in TIED.items():
            if k in full and v in full:
                full[k] = full[v]
        if "kit" in full and full.get(GROUP_PARAM, 1) > 1:  # the dot-product form: the weight's input channels
            # in single groups
            full["kit"] = full[GROUP_PARAM]
        return full

    @staticmethod
    def key(choice: dict[str, int]) -> str:
        return ",".join(f"{k}={choice[k]}" for k in sorted(choice))

    def is_identity(self, config: Config) -> bool:
        """The user's own layouts (no `layout.*` knob, where the template has any)."""
        return not has_layout(config) and bool(self.template.params)

    def program(self, choice: dict[str, int]) -> LayoutProgram:
        """The workload rewritten into a layout choice, the user's interface kept (cached).

        Raises:
            LayoutError: the choice does not apply to the workload.
        """
        return layout_program(self.task.workload, self.full_choice(choice), keep_interface=True)

    def loops_of(self, config: Config) -> LoopSpace:
        """The loop space of the layout `config` is in."""
        if self.is_identity(config):
            return loop_space(self.task.prim_func, self.unit)
        return interface_space(self.program(split_config(config)[0]), self.unit)

    def untuned_config(self) -> Config:
        """The user's own layouts with the untransformed program's loops."""
        if self.template.params:
            return self.loops_of({}).untuned_config()
        return join_config(self.full_choice({}), self.loops_of({}).untuned_config())

    def sample(self, rng: np.random.Generator, n: int) -> list[Config]:
        from compiler.layout import LayoutError

        out: list[Config] = []
        for _ in range(8 * n):
            if len(out) == n:
                break
            choice = self.full_choice({p.name: int(p.candidates[int(rng.integers(len(p.candidates)))])
                                       for p in self.free})
            try:
                out.append(join_config(choice, self.loops_of(join_config(choice, {})).sample(rng, 1)[0]))
            except LayoutError:
                continue  # a choice the workload refuses: draw again
        return out

    def validate(self, config: Config) -> Config:
        from compiler.layout import LayoutError

        choice, loops = split_config(config)
        if self.is_identity(config):
            return self.loops_of(config).validate(loops)
        free = {p.name: p for p in self.free}
        for name, value in choice.items():
            if name in free and value not in free[name].candidates:
                raise InvalidConfig(f"{LAYOUT_PREFIX}{name}={value} is not one of {free[name].candidates}")
            if name not in free and name not in TIED:
                raise InvalidConfig(f"unknown layout knob {LAYOUT_PREFIX}{name}")
        choice = self.full_choice(choice)
        try:
            space = self.loops_of(join_config(choice, {}))
        except LayoutError as e:
            raise InvalidConfig(f"layout {self.key(choice)}: {e}") from e
        return join_config(choice, space.validate(loops))

    def apply(self, config: Config) -> tvm.s_tir.Schedule:
        return self.loops_of(config).apply(split_config(config)[1])

    def neighbors(self, config: Config) -> list[Config]:
        """One loop knob changed in the same layout, or one layout factor moved to the next candidate
        (with that layout's untuned loops)."""
        from compiler.layout import LayoutError

        choice, loops = split_config(config)
        if self.is_identity(config):
            return self.loops_of(config).neighbors(loops)
        choice = self.full_choice(choice)
        near = [join_config(choice, c) for c in self.loops_of(config).neighbors(loops)]
        for p in self.free:
            values = sorted(p.candidates)
            i = values.index(choice[p.name]) if choice.get(p.name) in values else 0
            for j in (i - 1, i + 1):
                if 0 <= j < len(values):
                    other = self.full_choice({**choice, p.name: values[j]})
                    try:
                        near.append(join_config(other, self.loops_of(join_config(other, {})).untuned_config()))
                    except LayoutError:
                        continue
        return near

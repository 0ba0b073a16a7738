"""ALT's joint space (paper sec. 4-5): a layout of the operator's template and the loops of the program in it.

A configuration is one flat JSON dict: `layout.<param>` (the template's split factors; the weight's are
tied to the consumer's: kot = ot, kit = it, or kit = group in the dot-product form of an int8 / bfloat16
operator, `compiler.layout.templates`) plus the loop knobs of `LoopSpace` over the program rewritten
into that layout, data and output kept in the user's layouts (converted inside, as the artifact runs).
A configuration without `layout.*` knobs is the user's own layouts: the untransformed program's loops.

`LayoutSpace` is a `SearchSpace` like `LoopSpace`, so the searches work through one interface; its
`knobs` are the layout knobs, and each layout's loop knobs are `loops_of(config).knobs` (they differ
from layout to layout). `tuner.searches.alt.ALTSearch` walks it with its PPO agents and cost model.
`apply_layout_config` gives the module a layout configuration deploys as.

Layering: `tuner` never imports `service`; it imports `compiler`.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import tvm

from compiler.layout import GROUP_PARAM, LayoutError, LayoutProgram, apply_layout, dot_template, layout_template
from compiler.target import VectorUnit, vector_unit

from ..task import Task
from .base import Config, InvalidConfig, Knob, SearchSpace
from .loop import LoopSpace, loop_space
from .loop_knobs import LATER_KNOBS

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


def layout_of_config(task: Task, config: Config) -> LayoutProgram | None:
    """The program (user interface kept: data and output in the user's layouts) of a layout configuration."""
    if not has_layout(config):
        return None
    if task.workload is None:
        raise InvalidConfig("a layout configuration needs task.workload")
    choice, _ = split_config(config)
    return layout_program(task.workload, choice, keep_interface=True)


def apply_layout_config(task: Task, config: Config) -> tvm.IRModule:
    """"main" (data and output in the user's layouts, constants packed) + "pack_constants"."""
    prog = layout_of_config(task, config)
    assert prog is not None
    _, loops = split_config(config)
    space = interface_space(prog, vector_unit(task.target))
    # A configuration searched is one of this space; one stored by an older version (searched in the
    # stored-layout program) may name other producers' knobs or a write_at this space does not
    # offer: fit those to the space's first choice.
    known = {k.name: k for k in space.knobs}
    loops = {k: v for k, v in loops.items() if k in known and v in known[k].choices}
    for name, knob in known.items():
        loops.setdefault(name, LATER_KNOBS.get(name, knob.choices[0]))
    main = space.apply(loops).mod["main"]
    funcs = {"main": main}
    if prog.constants:
        funcs["pack_constants"] = prog.pack_func
    return tvm.IRModule(funcs)

"""ALT layouts: primitives, propagation over a TE graph, and the rewriting pass (paper sec. 4 and 6)."""

from __future__ import annotations

from .primitives import (
    DecoupleAt,
    Fold,
    Fuse,
    LayoutError,
    Pad,
    Primitive,
    Reorder,
    Split,
    StoreAt,
    Unfold,
    Unpad,
)
from .program import (
    ACTIVATIONS,
    DOT_OPERATORS,
    LayoutProgram,
    apply_layout,
    dot_template,
    layout_template,
    subgraph_layout,
    te_graph,
    template_levels,
)
from .propagate import Graph, Plan, propagate
from .rewrite import CONVERT_PREFIX, Rewritten, rewrite
from .templates import GROUP_PARAM, OUTER_SUFFIX, LayoutTemplate, TemplateParam
from .tensor_layout import Layout

__all__ = [
    "ACTIVATIONS",
    "DOT_OPERATORS",
    "LayoutProgram",
    "LayoutTemplate",
    "TemplateParam",
    "apply_layout",
    "dot_template",
    "layout_template",
    "subgraph_layout",
    "te_graph",
    "template_levels",
    "GROUP_PARAM",
    "OUTER_SUFFIX",
    "CONVERT_PREFIX",
    "DecoupleAt",
    "Fold",
    "Fuse",
    "Graph",
    "Layout",
    "LayoutError",
    "Pad",
    "Plan",
    "Primitive",
    "Reorder",
    "Rewritten",
    "Split",
    "StoreAt",
    "Unfold",
    "Unpad",
    "propagate",
    "rewrite",
]

"""TVM's own `HoistExpression` with every kind of conditional and let binding enabled: the comparison
`python -m bench.licm` makes with our LICM (`compiler.passes.licm`), as the last pass of the "hoist-expression"
pipeline (`compiler.pipeline`).

Layering: a pass imports only TVM and `compiler`'s lower modules; `compiler` never imports `tuner` or `service`.
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm.s_tir import transform
from tvm.tirx.transform import HoistedConditionals, HoistedLetBindings

CONFIG = {"s_tir.HoistExpression": {"hoisted_conditionals": HoistedConditionals.All.value,
                                    "hoisted_let_bindings": HoistedLetBindings.All.value}}


def hoist_expression_pass() -> tvm.transform.Pass:
    """`HoistExpression` under a pass context that enables every kind of hoisting."""
    hoist = transform.HoistExpression()

    @tvm.transform.module_pass(opt_level=0, name="altune.HoistExpressionAll")
    def _hoist(mod: tvm.IRModule, _ctx: Any) -> tvm.IRModule:
        with tvm.transform.PassContext(config=CONFIG):
            return hoist(mod)

    return _hoist

"""The operator catalog, so clients can build a form from it."""

from __future__ import annotations

from fastapi import APIRouter

from service.schemas import OperatorPublic, OperatorsPublic, ParamPublic

router = APIRouter(prefix="/operators", tags=["operators"])


@router.get("", response_model=OperatorsPublic)
def read_operators() -> OperatorsPublic:
    """Every operator and subgraph with its parameters and their limits."""
    from compiler.target import available_targets
    from compiler.workloads import DTYPES, EPILOGUES, OPERATORS, SUBGRAPHS

    data = [
        OperatorPublic(
            name=op.name,
            description=op.description,
            params=[
                ParamPublic(
                    name=p.name,
                    minimum=p.minimum,
                    maximum=p.maximum,
                    default=p.default,
                    required=p.default is None,
                    description=p.description,
                )
                for p in op.params
            ],
        )
        for op in (*OPERATORS.values(), *SUBGRAPHS.values())
    ]
    return OperatorsPublic(data=data, dtypes=list(DTYPES), epilogues=list(EPILOGUES), targets=list(available_targets()))

"""Every registered operator's type rule over a symbolic leading dimension.

For each case of tests/ops/op_cases.py, the inputs that share the largest rank and
the same leading size get the dimension variable `n` there instead. The rule must
then either raise IRError (a rule that cannot take the symbolic dimension), or give
canonical dimensions that evaluate, at `n` = the case's size, to the static rule's
result: the symbolic rule agrees with the static one wherever both apply.
"""

from __future__ import annotations

import numpy as np
import pytest
from op_cases import CASES

from kiln.errors import IRError
from kiln.ir.graph import freeze_attrs
from kiln.ir.shape_expr import dim_text, dim_var, eval_dim, is_static, simplify_dim
from kiln.ir.tensor import PrimExpr
from kiln.ir.types import TensorType, TupleType, Type
from kiln.ops.registry import get_op, list_ops


def _fields(t: Type) -> tuple[TensorType, ...]:
    return tuple(f for f in t.fields) if isinstance(t, TupleType) else (t,)  # type: ignore[misc]


def _symbolic_cases() -> list[tuple[str, int]]:
    return [(op, k) for op in list_ops() for k in range(len(CASES.get(op, [])))]


@pytest.mark.parametrize("op,k", _symbolic_cases())
def test_symbolic_rule_agrees_with_the_static_rule(op: str, k: int) -> None:
    case = CASES[op][k]
    rng = np.random.default_rng(0)
    arrays = [np.asarray(gen(rng)) for gen in case.inputs]
    static = [TensorType(a.shape, str(a.dtype)) for a in arrays]
    attrs = freeze_attrs(case.attrs)
    opdef = get_op(op)
    try:
        expected = opdef.infer_type(static, attrs)
    except IRError:
        pytest.skip("the static rule rejects this case")
    if not all(is_static(t.shape) for t in _fields(expected)):
        pytest.skip("a data-dependent size (tests/data_dependent checks symbolic inputs)")
    rank = max(t.ndim for t in static)
    lead = {t.shape[0] for t in static if t.ndim == rank and rank > 0}
    if rank == 0 or len(lead) != 1:
        pytest.skip("no shared leading dimension to make symbolic")
    size = lead.pop()
    n = dim_var("n")
    symbolic = [TensorType((n, *t.shape[1:]), t.dtype) if t.ndim == rank else t
                for t in static]
    try:
        got = opdef.infer_type(symbolic, attrs)
    except IRError as exc:
        assert "Traceback" not in str(exc)
        return
    for want, have in zip(_fields(expected), _fields(got), strict=True):
        assert have.dtype == want.dtype
        assert len(have.shape) == len(want.shape)
        for d in have.shape:
            assert isinstance(d, int) or (isinstance(d, PrimExpr) and not is_static(d))
            assert dim_text(simplify_dim(d)) == dim_text(d)  # canonical
        assert tuple(eval_dim(d, {"n": size}) for d in have.shape) == want.shape

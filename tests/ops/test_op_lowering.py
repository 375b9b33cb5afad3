"""Every registered operator: type inference agrees with the numpy reference, and the
lowered PrimFunc (OpDef.legalize), run by the reference interpreter, computes the
reference."""

from __future__ import annotations

import numpy as np
import pytest
from op_cases import CASES, OpCase

from kiln.errors import IRError
from kiln.ir import IRModule, evaluate
from kiln.ir import graph as g
from kiln.ir.dtype import from_numpy
from kiln.ir.types import TensorType, TupleType
from kiln.ops import call, get_op, list_ops
from kiln.ops.data_dependent import DataDependentOp

PARAMS = [pytest.param(op, k, case, id=f"{op}-{k}")
          for op, cases in sorted(CASES.items()) for k, case in enumerate(cases)]


def _inputs(case: OpCase, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [np.asarray(gen(rng)) for gen in case.inputs]


def _call(op: str, arrays: list[np.ndarray], attrs: dict) -> g.Call:
    args = [g.Var(f"x{k}", TensorType(a.shape, from_numpy(a.dtype))) for k, a in
            enumerate(arrays)]
    return call(op, *args, **attrs)


def _results(value: object) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(v) for v in value) if isinstance(value, tuple) else (
        np.asarray(value),)


def test_every_op_has_a_case() -> None:
    missing = sorted(set(list_ops()) - set(CASES))
    assert not missing, f"operators without a test case in tests/ops/op_cases.py: {missing}"
    unknown = sorted(set(CASES) - set(list_ops()))
    assert not unknown, f"cases for unregistered operators: {unknown}"


@pytest.mark.parametrize(("op", "k", "case"), PARAMS)
def test_op_lowering_matches_reference(op: str, k: int, case: OpCase) -> None:
    arrays = _inputs(case, seed=k)
    expr = _call(op, arrays, case.attrs)
    with np.errstate(all="ignore"):
        want = _results(get_op(op).reference(*arrays, **dict(expr.attrs)))
    if isinstance(get_op(op), DataDependentOp):
        _check_data_dependent(op, expr, arrays, want)
        return
    # type inference agrees with what the reference computes
    types = expr.ret_type.fields if isinstance(expr.ret_type, TupleType) else (expr.ret_type,)
    assert [(t.shape, t.dtype) for t in types] == [
        (w.shape, from_numpy(w.dtype)) for w in want]
    # the lowered function computes the reference
    func, hint = get_op(op).legalize(expr)
    assert hint == op
    outs = [np.zeros(t.static_shape, dtype=w.dtype) for t, w in zip(types, want)]
    evaluate(IRModule({"kernel": func}), "kernel", *arrays, *outs)
    for got, ref in zip(outs, want):
        if ref.dtype.kind == "f":
            np.testing.assert_allclose(got, ref, rtol=max(case.rtol, 1e-5 if ref.dtype.itemsize
                                                          >= 4 else 1e-3),
                                       atol=case.atol if ref.dtype.itemsize >= 4 else 1e-3)
        else:
            np.testing.assert_array_equal(got, ref)


def _check_data_dependent(op: str, expr: g.Call, arrays: list[np.ndarray],
                          want: tuple[np.ndarray, ...]) -> None:
    """A kernel binding a run-time size: flat outputs at the bound and the size's count
    buffer; the first elements of each output are the reference's result."""
    func, hint = get_op(op).legalize(expr)
    assert hint == op
    flats = [np.zeros(p.shape, dtype=w.dtype)
             for p, w in zip(func.params[len(arrays):], want)]
    count = np.zeros(1, np.int64)
    evaluate(IRModule({"kernel": func}), "kernel", *arrays, *flats, count)
    for flat, ref in zip(flats, want):
        np.testing.assert_array_equal(flat[:ref.size].reshape(ref.shape), ref)
    assert int(count[0]) in {d for ref in want for d in ref.shape}


@pytest.mark.parametrize(("op", "args", "attrs", "message"), [
    ("add", [((2, 3), "float32"), ((4,), "float32")], {}, "do not broadcast"),
    ("add", [((2,), "float32"), ((2,), "int32")], {}, "dtypes differ"),
    ("matmul", [((2, 3), "float32"), ((4, 5), "float32")], {}, "inner dimensions differ"),
    ("conv2d", [((1, 3, 5, 5), "float32"), ((4, 2, 3, 3), "float32")], {},
     "with group 1 expects 2"),
    ("conv2d", [((1, 3, 2, 2), "float32"), ((4, 3, 3, 3), "float32")], {},
     "output would be empty"),
    ("max_pool2d", [((1, 3, 5, 5), "float32")], {}, "needs a kernel_shape"),
    ("max_pool2d", [((3, 5), "float32")], {"kernel_shape": (2, 2)}, "1-3 spatial dims"),
    ("reshape", [((2, 3), "float32")], {"shape": (4, 2)}, "cannot view"),
    ("reduce_sum", [((2, 3), "float32")], {"axes": (2,)}, "out of range"),
    ("transpose", [((2, 3), "float32")], {"perm": (0, 0)}, "not a permutation"),
    ("where", [((2,), "float32"), ((2,), "float32"), ((2,), "float32")], {},
     "condition must be bool"),
    ("einsum", [((2, 3), "float32"), ((4, 5), "float32")], {"equation": "ij,jk->ik"},
     "has sizes 3 and 4"),
    ("resize", [((1, 1, 2, 2), "float32")], {"sizes": (1, 1, 4, 4), "scales": (1, 1, 2, 2),
                                             "mode": "area"}, "unknown mode"),
    ("split", [((4,), "float32")], {"sections": (1, 2)}, "do not add up"),
    ("pad", [((2, 2), "float32")], {"pads": (1, 1)}, "needs 4 values"),
])
def test_bad_calls_raise_clear_errors(op: str, args: list, attrs: dict, message: str) -> None:
    exprs = [g.Var(f"x{k}", TensorType(shape, dtype)) for k, (shape, dtype) in enumerate(args)]
    with pytest.raises(IRError, match=message):
        call(op, *exprs, **attrs)


def test_unknown_op_names_the_choices() -> None:
    with pytest.raises(KeyError, match="conv2d"):
        get_op("conv2")

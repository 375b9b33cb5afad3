"""The tensor-expression language: inlining, materialization, reductions, padding,
constant tables, and its errors. Lowered functions run on the reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.errors import IRError
from kiln.ir import IRModule, evaluate
from kiln.ir import tensor as t
from kiln.ops import te


def _run(func: t.PrimFunc, *arrays: np.ndarray, out_shapes, out_dtype="float32"):
    outs = [np.zeros(s, dtype=out_dtype) for s in out_shapes]
    evaluate(IRModule({"f": func}), "f", *arrays, *outs)
    return outs


def _count(stmt: t.Stmt, kind: type) -> int:
    from kiln.ir.visitor import iter_stmts

    return sum(isinstance(s, kind) for s in iter_stmts(stmt))


def test_compute_tensors_inline_into_their_consumer() -> None:
    x = te.placeholder((4,), "float32", "x")
    y = te.compute((4,), lambda i: x[i] * 2.0, "float32", "double")
    z = te.compute((4,), lambda i: y[i] + 1.0, "float32", "inc")
    func = te.lower([x], [z], "chain")
    assert _count(func.body, t.Allocate) == 0          # fused: no temporary
    (out,) = _run(func, np.arange(4, dtype=np.float32), out_shapes=[(4,)])
    np.testing.assert_array_equal(out, np.arange(4) * 2 + 1)


def test_materialized_tensor_is_computed_once_into_a_temporary() -> None:
    x = te.placeholder((3, 5), "float32", "x")
    rowsum = te.compute((3,), lambda r: te.reduce("sum", lambda k: x[r, k], (5,), "float32"),
                        "float32", "rowsum", materialize=True)
    y = te.compute((3, 5), lambda r, c: x[r, c] / rowsum[r], "float32", "normalize")
    func = te.lower([x], [y])
    assert _count(func.body, t.Allocate) >= 1
    data = np.random.default_rng(0).random((3, 5)).astype(np.float32) + 0.1
    (out,) = _run(func, data, out_shapes=[(3, 5)])
    np.testing.assert_allclose(out, data / data.sum(axis=1, keepdims=True), rtol=1e-6)


@pytest.mark.parametrize(("kind", "ref"), [("sum", np.sum), ("prod", np.prod), ("max", np.max),
                                          ("min", np.min)])
def test_reductions(kind: str, ref) -> None:
    x = te.placeholder((2, 3, 4), "float32", "x")
    y = te.compute((2,), lambda i: te.reduce(kind, lambda a, b: x[i, a, b], (3, 4), "float32"),
                   "float32", kind)
    data = np.random.default_rng(1).uniform(0.5, 1.5, (2, 3, 4)).astype(np.float32)
    (out,) = _run(te.lower([x], [y]), data, out_shapes=[(2,)])
    np.testing.assert_allclose(out, ref(data, axis=(1, 2)), rtol=1e-5)


def test_padded_reads_stay_in_bounds_and_fill() -> None:
    x = te.placeholder((3,), "float32", "x")
    y = te.compute((7,), lambda i: te.padded(x, (i - 2,), -1.0), "float32", "pad")
    (out,) = _run(te.lower([x], [y]), np.array([1, 2, 3], np.float32), out_shapes=[(7,)])
    np.testing.assert_array_equal(out, [-1, -1, 1, 2, 3, -1, -1])


def test_const_tensor_becomes_read_only_data_of_the_function() -> None:
    table = te.const_tensor(np.array([2, 0, 1], np.int64), "perm")
    x = te.placeholder((3,), "float32", "x")
    y = te.compute((3,), lambda i: x[table[i]], "float32", "permute")
    func = te.lower([x], [y])
    # The constant is declared first, for the rest of the function body.
    assert isinstance(func.body, t.SeqStmt) and isinstance(func.body.body[0], t.AllocConst)
    assert [p.name for p in func.params] == ["x", "out"]
    (out,) = _run(func, np.array([10, 20, 30], np.float32), out_shapes=[(3,)])
    np.testing.assert_array_equal(out, [30, 10, 20])


def test_several_outputs_and_an_input_passed_through() -> None:
    x = te.placeholder((2,), "int32", "x")
    neg = te.compute((2,), lambda i: -x[i], "int32", "neg")
    func = te.lower([x], [neg, x])
    assert [p.name for p in func.params] == ["x", "out0", "out1"]
    a, b = _run(func, np.array([1, -2], np.int32), out_shapes=[(2,), (2,)], out_dtype="int32")
    np.testing.assert_array_equal(a, [-1, 2])
    np.testing.assert_array_equal(b, [1, -2])


def test_scalar_output() -> None:
    x = te.placeholder((4,), "float32", "x")
    total = te.compute((), lambda: te.reduce("sum", lambda k: x[k], (4,), "float32"),
                       "float32", "total")
    (out,) = _run(te.lower([x], [total]), np.arange(4, dtype=np.float32), out_shapes=[()])
    assert out == 6


def test_errors() -> None:
    x = te.placeholder((2, 2), "float32", "x")
    with pytest.raises(IRError, match="can only be evaluated while lowering"):
        _ = x[0, 0]
    bad = te.compute((2,), lambda i: x[i], "float32", "bad")
    with pytest.raises(IRError, match="tensor x has 2 dims, indexed with 1"):
        te.lower([x], [bad])
    with pytest.raises(IRError, match="unknown reduction 'mean'"):
        te.lower([x], [te.compute((2,), lambda i: te.reduce("mean", lambda k: x[i, k], (2,),
                                                                "float32"), "float32")])
    y = te.compute((2, 2), lambda i, j: x[i, j], "float32", "y")
    with pytest.raises(IRError, match="must be a placeholder"):
        te.lower([y], [y])
    other = te.placeholder((2, 2), "float32", "other")
    with pytest.raises(IRError, match="not an input of this operator"):
        te.lower([x], [te.compute((2, 2), lambda i, j: other[i, j], "float32")])
    with pytest.raises(IRError, match="unknown dtype"):
        te.placeholder((2,), "float31")

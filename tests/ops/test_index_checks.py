"""Out-of-range indices make the call raise, naming the operator, on every backend
(onnxruntime: "indices element out of data bounds"); in-range ones, negative ones
included, still match onnxruntime. Kernels run in a child process: a bad index
must never crash the caller."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from index_check_cases import cases
from onnx import helper, numpy_helper

import kiln
from kiln import evaluate
from kiln.errors import FrontendError, IRError, KilnError
from kiln.frontend import from_onnx
from kiln.ir import verify
from kiln.ir.kernel_errors import op_error_code
from kiln.ir.module import IRModule
from kiln.ir.tensor import (
    CHECK_INTRINSIC,
    Buffer,
    Cast,
    Const,
    Evaluate,
    Intrin,
    PrimFunc,
    Store,
)
from support.graphs import GraphBuilder
from support.processes import run_python
from support.reference import ort_session

# kiln's op behind each ONNX node: what the error message names.
KILN_OP = {"Gather": "gather", "GatherElements": "gather_elements", "GatherND": "gather_nd",
           "ScatterElements": "scatter_elements", "ScatterND": "scatter_nd",
           "ReverseSequence": "reverse_sequence"}


@pytest.fixture(scope="module", params=["llvm", "c", "python"])
def results(request):
    code = ("import json; "
            f"from index_check_cases import run_on; print(json.dumps(run_on({request.param!r})))")
    proc = run_python(code, paths=(Path(__file__).parent,), timeout=900)
    assert proc.returncode == 0, f"exit {proc.returncode} (negative: a signal): {proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", cases(), ids=lambda c: c.name)
def test_in_range_indices_match_onnxruntime(results, case) -> None:
    sess = ort_session(case.model())
    for feed, got in zip(case.good, results[case.name]["good"]):
        want = sess.run(None, feed)[0]
        np.testing.assert_array_equal(np.asarray(got, dtype=want.dtype), want)


@pytest.mark.parametrize("case", [c for c in cases() if c.bad], ids=lambda c: c.name)
def test_out_of_range_indices_raise_naming_the_op(results, case) -> None:
    sess = ort_session(case.model())
    for feed, got in zip(case.bad, results[case.name]["bad"]):
        with pytest.raises(Exception, match=r"out of data bounds|invalid ind|Out of range|"
                                            r"Invalid sequence length"):
            sess.run(None, feed)
        assert got is not None, f"{case.name}: kiln returned for {feed}"
        name, mro, message = got
        assert "KilnError" in mro, (name, message)
        assert f"main: {KILN_OP[case.name]}: " in message and "out of range" in message


@pytest.mark.parametrize("case", [c for c in cases() if c.bad], ids=lambda c: c.name)
def test_constant_out_of_range_indices_fail_at_import_naming_the_node(case) -> None:
    # Folded at import with the numpy reference, which checks like the kernel.
    feed = case.bad[0]
    consts = [n for n, *_ in case.inputs]
    model = case.model()
    graph = model.graph
    for name in consts:
        graph.initializer.append(numpy_helper.from_array(feed[name], name))
    del graph.input[:]
    with pytest.raises(FrontendError, match=rf"node #0 \(output 'y'\) \({case.name}\): "
                                            rf"{KILN_OP[case.name]}: .*out of range"):
        from_onnx(model)


def _elements_model(op: str, indices_shape: list[int]):
    # data [2, 4], indices along axis 1 (values 0 and 1: in range for any data row)
    b = GraphBuilder()
    b.input("x", [2, 4])
    idx = np.indices(indices_shape)[1] % 2
    b.consts({"i": idx.astype(np.int64), "u": np.ones(indices_shape, np.float32)})
    b.add(helper.make_node(op, ["x", "i", "u"][:3 if op == "ScatterElements" else 2], ["y"],
                           axis=1, name="e"))
    b.output("y")
    return b.model(name=op, check=False)  # the output has no shape (onnx checker)


@pytest.mark.parametrize("op", ["GatherElements", "ScatterElements"])
def test_element_indices_longer_than_data_off_the_axis_are_refused(op) -> None:
    # Found by mutating shapes: GatherElements read past the data rows (garbage or a
    # crash), ScatterElements dropped the updates of rows data lacks. onnxruntime
    # refuses both when run; only the indexed axis may be longer.
    model = _elements_model(op, [3, 5])
    x = {"x": np.ones((2, 4), np.float32)}
    with pytest.raises(Exception, match=r"[Ii]ndices"):
        ort_session(model).run(None, x)
    with pytest.raises(FrontendError, match=rf"node 'e' \({op}\): {KILN_OP[op]}: indices "
                                            r"\[3, 5\] are longer than data \[2, 4\] on "
                                            r"axis 0; only axis 1 may be longer"):
        from_onnx(model)


@pytest.mark.parametrize("op", ["GatherElements", "ScatterElements"])
def test_element_indices_shorter_than_data_match_onnxruntime(op) -> None:
    model = _elements_model(op, [1, 6])
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    got = kiln.compile(from_onnx(model), "llvm")["main"](x)
    np.testing.assert_array_equal(got, ort_session(model).run(None, {"x": x})[0])


def _check_func(cond, code) -> IRModule:
    return IRModule({"f": PrimFunc((X,), Evaluate(Intrin(CHECK_INTRINSIC, (cond, code))))})


X = Buffer("x", (1,), "int32")
X_BELOW_3 = X[(Const(0, "int64"),)] < Const(3, "int32")


def test_interpreter_raises_for_a_hand_written_check() -> None:
    mod = _check_func(X_BELOW_3, Const(op_error_code("gather"), "int32"))
    verify(mod)
    evaluate(mod, "f", np.array([2], np.int32))
    with pytest.raises(KilnError, match=r"f: gather: an index is out of range"):
        evaluate(mod, "f", np.array([3], np.int32))


@pytest.mark.parametrize("cond, code, message", [
    (X[(Const(0, "int64"),)], Const(2, "int32"), "needs a bool condition, got int32"),
    (X_BELOW_3, Const(99, "int32"), "needs an int32 constant error code"),
    (X_BELOW_3, Const(2, "int64"), "needs an int32 constant error code"),
    (X_BELOW_3, X[(Const(0, "int64"),)], "needs an int32 constant error code"),
])
def test_verifier_rejects_malformed_checks(cond, code, message) -> None:
    with pytest.raises(IRError, match=message):
        verify(_check_func(cond, code))


def test_verifier_rejects_a_check_inside_an_expression() -> None:
    check = Intrin(CHECK_INTRINSIC, (X_BELOW_3, Const(2, "int32")))
    body = Store(X, Cast("int32", check), (Const(0, "int64"),))
    with pytest.raises(IRError, match="'check' is valid only as the value of an Evaluate"):
        verify(IRModule({"f": PrimFunc((X,), body)}))

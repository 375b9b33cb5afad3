"""Untrusted ONNX files: malformed graphs are rejected like onnxruntime rejects them,
and tiny models cannot make the importer or the folding pass allocate huge constants."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln import evaluate
from kiln.errors import FrontendError
from kiln.frontend import from_onnx
from kiln.ir import graph as g
from support.reference import ort_session


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    # IR version 8: one onnxruntime reads, so its rejections are about the graph.
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _ort_rejects(model: onnx.ModelProto) -> None:
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime raises its own Fail type
        ort_session(model)


def _checker_rejects(model: onnx.ModelProto) -> None:
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)


# ------------------------------------------------------------------ malformed graphs

def _dup_inputs():
    return _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2]), _vi("x", [2])],
                  [_vi("y", [2])])


def _dup_producers():
    return _model([helper.make_node("Relu", ["x"], ["y"], name="first"),
                   helper.make_node("Neg", ["x"], ["y"], name="second")],
                  [_vi("x", [2])], [_vi("y", [2])])


def _dup_initializers():
    inits = [numpy_helper.from_array(np.ones(2, np.float32), "w"),
             numpy_helper.from_array(np.zeros(2, np.float32), "w")]
    return _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [2])],
                  [_vi("y", [2])], inits)


def _negative_initializer_dims():
    w = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    w.dims[0] = -2
    return _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [2])],
                  [_vi("y", [2])], [w])


def _negative_input_dim():
    return _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [-1, 2])],
                  [_vi("y", [2])])


def _node_overwrites_input():
    return _model([helper.make_node("Relu", ["x"], ["x"], name="clobber")],
                  [_vi("x", [2])], [_vi("x", [2])])


# Duplicate initializers: onnxruntime only warns and takes the last one, onnx.checker
# rejects them; kiln refuses to guess.
@pytest.mark.parametrize("make, message", [
    (_dup_inputs, r"input\(s\) 'x' more than once"),
    (_dup_producers, r"'y' is written by node 'second' \(Neg\) and also by node 'first'"),
    (_dup_initializers, r"several initializers named 'w'"),
    (_negative_initializer_dims, r"initializer 'w' has a negative dimension -2"),
    (_node_overwrites_input, r"'x' is written by node 'clobber' \(Relu\) and also by a graph "
                             r"input"),
])
def test_graphs_onnxruntime_rejects_raise_naming_the_value(make, message) -> None:
    model = make()
    (_checker_rejects if make is _dup_initializers else _ort_rejects)(model)
    with pytest.raises(FrontendError, match=message):
        from_onnx(model)


def test_a_cycle_is_rejected_naming_the_value_read_before_it_is_written() -> None:
    nodes = [helper.make_node("Relu", ["b"], ["a"], name="first"),
             helper.make_node("Add", ["x", "a"], ["b"], name="second")]
    model = _model(nodes, [_vi("x", [2])], [_vi("b", [2])])
    _ort_rejects(model)
    with pytest.raises(FrontendError, match=r"(?s)input 'b'.*first.*not output of any previous"):
        from_onnx(model)  # onnx's checker first
    with pytest.raises(FrontendError, match=r"node 'first' \(Relu\): input 'b' is not defined "
                                            r"before use"):
        from_onnx(model, check=False)  # kiln's own guard holds without it


def test_an_input_with_an_empty_name_is_rejected() -> None:
    model = _model([helper.make_node("Relu", [""], ["y"])], [_vi("", [2])], [_vi("y", [2])])
    with pytest.raises(FrontendError, match=r"graph input #0 has an empty name"):
        from_onnx(model)


def test_negative_input_dimension_is_a_frontend_error_naming_the_input() -> None:
    # onnxruntime reads dim_value -1 as an unknown dimension; kiln needs static shapes.
    with pytest.raises(FrontendError, match=r"input 'x' has a negative dimension -1 in shape "
                                            r"\(-1, 2\)"):
        from_onnx(_negative_input_dim())


def _external_model(location: str) -> onnx.ModelProto:
    w = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    w.ClearField("float_data")
    w.data_location = TensorProto.EXTERNAL
    entry = w.external_data.add()
    entry.key, entry.value = "location", location
    return _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [2])],
                  [_vi("y", [2])], [w])


def test_external_data_outside_the_model_directory_quotes_onnx(tmp_path) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(_external_model("../../etc/passwd").SerializeToString())
    with pytest.raises(FrontendError, match=r"external data cannot be loaded: .*tensor name: w.*"
                                            r"points outside the directory"):
        from_onnx(path)


def test_external_data_of_an_in_memory_model_asks_for_the_path() -> None:
    model = _external_model("weights.bin")
    with pytest.raises(FrontendError, match=r"initializer 'w' keeps its data in the external "
                                            r"file 'weights.bin'; pass the model's path"):
        from_onnx(model.SerializeToString())


def test_external_data_next_to_the_model_still_loads(tmp_path) -> None:
    (tmp_path / "weights.bin").write_bytes(np.array([1, 2], np.float32).tobytes())
    path = tmp_path / "m.onnx"
    path.write_bytes(_external_model("weights.bin").SerializeToString())
    x = np.array([3, 4], np.float32)
    want = x + np.array([1, 2], np.float32)
    np.testing.assert_array_equal(evaluate(from_onnx(path), "main", x), want)


def test_shape_dict_too_large_for_any_tensor_fails_at_import_naming_the_input() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["n", 4])],
                   [_vi("y", ["n", 4])])
    with pytest.raises(FrontendError, match=r"shape_dict\['x'\] has shape "
                                            r"\(9223372036854775808, 4\): .* bytes, more than"):
        from_onnx(model, {"x": (2**63, 4)})


# ------------------------------------------------------------------ folding budget

def _const_of_shape(shape, value=1.5):
    shape_init = numpy_helper.from_array(np.array(shape, np.int64), "s")
    node = helper.make_node("ConstantOfShape", ["s"], ["c"],
                            value=helper.make_tensor("v", TensorProto.FLOAT, [1], [value]))
    add = helper.make_node("Add", ["x", "c"], ["y"])
    return _model([node, add], [_vi("x", [1])], [_vi("y", list(shape))], [shape_init])


def _calls(mod) -> list[str]:
    main = mod["main"]
    assert isinstance(main, g.Function)
    return [b.value.op for b in main.bindings if isinstance(b.value, g.Call)]


def _run_isolated(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter capped at 2 GiB of address space."""
    prelude = textwrap.dedent("""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    """)
    proc = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode >= 0, f"killed by signal {-proc.returncode}: {proc.stderr}"
    return proc


def test_constant_of_shape_bomb_stays_in_the_graph() -> None:
    model = _const_of_shape([1_000_000, 1_000_000])
    assert len(model.SerializeToString()) < 400
    proc = _run_isolated(f"""
        from kiln.frontend import from_onnx
        from kiln.ir import graph as g
        mod = from_onnx({model.SerializeToString()!r})
        ops = [b.value.op for b in mod["main"].bindings if isinstance(b.value, g.Call)]
        print(ops)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "'broadcast_to'" in proc.stdout


@pytest.mark.parametrize("op, reps", [("Expand", [1 << 20, 1 << 20]), ("Tile", [1 << 20, 1 << 20])])
def test_expand_and_tile_bombs_stay_in_the_graph(op, reps) -> None:
    inits = [numpy_helper.from_array(np.ones((1, 1), np.float32), "c"),
             numpy_helper.from_array(np.array(reps, np.int64), "r")]
    nodes = [helper.make_node(op, ["c", "r"], ["big"]),
             helper.make_node("Add", ["x", "big"], ["y"])]
    model = _model(nodes, [_vi("x", [1])], [_vi("y", reps)], inits)
    proc = _run_isolated(f"""
        from kiln.frontend import from_onnx
        from kiln.ir import graph as g
        mod = from_onnx({model.SerializeToString()!r})
        print([b.value.op for b in mod["main"].bindings if isinstance(b.value, g.Call)])
    """)
    assert proc.returncode == 0, proc.stderr
    assert ("'broadcast_to'" if op == "Expand" else "'tile'") in proc.stdout


def test_range_bomb_raises_naming_the_node_and_size() -> None:
    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for n, v in (("a", 0), ("b", 10**12), ("d", 1))]
    model = _model([helper.make_node("Range", ["a", "b", "d"], ["r"], name="rng")], [],
                   [_vi("r", [10**12], TensorProto.INT64)], inits)
    proc = _run_isolated(f"""
        from kiln.errors import FrontendError
        from kiln.frontend import from_onnx
        try:
            from_onnx({model.SerializeToString()!r})
        except FrontendError as exc:
            print("FrontendError:", exc)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "FrontendError: node 'rng' (Range): Range(0, 1000000000000, 1) would materialise " \
           "8000000000000 bytes at import, above the fold budget" in proc.stdout


def test_small_constants_still_fold_and_match_onnxruntime() -> None:
    model = _const_of_shape([2, 3], value=2.5)
    mod = from_onnx(model)
    assert _calls(mod) == ["add"]  # the ConstantOfShape became a constant
    x = np.array([1.0], np.float32)
    sess = ort_session(model)
    np.testing.assert_array_equal(evaluate(mod, "main", x), sess.run(None, {"x": x})[0])


def test_max_fold_bytes_keeps_larger_values_as_operators() -> None:
    model = _const_of_shape([2, 3], value=2.5)
    mod = from_onnx(model, max_fold_bytes=8)
    assert _calls(mod) == ["broadcast_to", "add"]
    x = np.array([1.0], np.float32)
    sess = ort_session(model)
    np.testing.assert_array_equal(evaluate(mod, "main", x), sess.run(None, {"x": x})[0])


def test_a_shape_above_the_budget_names_the_node_that_kept_it() -> None:
    # Reshape needs its shape at compile time; a budget of 0 keeps the ConstantOfShape
    # (five int64 ones, 40 bytes, more than 4x its 8-byte value) unfolded.
    one = helper.make_tensor("v", TensorProto.INT64, [1], [1])
    nodes = [helper.make_node("ConstantOfShape", ["n"], ["shape"], name="ones", value=one),
             helper.make_node("Reshape", ["x", "shape"], ["y"], name="rs")]
    model = _model(nodes, [_vi("x", [1])], [_vi("y", [1] * 5)],
                   [numpy_helper.from_array(np.array([5], np.int64), "n")])
    assert len(from_onnx(model)["main"].bindings) == 1  # folded with the default budget
    with pytest.raises(FrontendError, match=r"node 'rs' \(Reshape\): .*must be a compile-time "
                                            r"constant.*node 'ones' \(ConstantOfShape\) "
                                            r"computes it at run time: its value of 40 bytes is "
                                            r"above the fold budget of 0 bytes"):
        from_onnx(model, max_fold_bytes=0)


def test_eye_like_and_dropout_mask_match_onnxruntime_without_folding() -> None:
    nodes = [helper.make_node("EyeLike", ["x"], ["eye"], k=1),
             helper.make_node("Dropout", ["x"], ["d", "mask"]),
             helper.make_node("Add", ["eye", "d"], ["y"])]
    model = _model(nodes, [_vi("x", [3, 4])],
                   [_vi("y", [3, 4]), _vi("mask", [3, 4], TensorProto.BOOL)])
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    sess = ort_session(model)
    want = sess.run(None, {"x": x})
    for budget in (0, 1 << 20):
        got = evaluate(from_onnx(model, max_fold_bytes=budget), "main", x)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


def test_bad_max_fold_bytes_is_rejected() -> None:
    with pytest.raises(FrontendError, match="max_fold_bytes must be a non-negative int"):
        from_onnx(_const_of_shape([2]), max_fold_bytes=-1)


_BROADCAST_GRAPH = """
import kiln
import numpy as np
from kiln.ir import graph as g
from kiln.ir.builder import IRBuilder
from kiln.ops.registry import call
from kiln.transform.fold_constants import FoldConstants

def broadcast_graph(shape):
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", g.Constant(np.zeros(1, np.float32)).type)
        big = ib.emit(call("broadcast_to", g.Constant(np.array(1.0, np.float32)), shape=shape))
        ib.ret(ib.emit(call("add", x, big), "y"))
    return ib.get()

def folded_ops(shape):
    out = FoldConstants()(broadcast_graph(shape))
    return [b.value.op for b in out["main"].bindings if isinstance(b.value, g.Call)]
"""


def test_fold_constants_pass_decides_on_the_type_before_evaluating() -> None:
    proc = _run_isolated(_BROADCAST_GRAPH + "print(folded_ops((1 << 20, 1 << 20)))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['broadcast_to', 'add']"
    # Within the budget, the same pattern folds.
    scope: dict = {}
    exec(_BROADCAST_GRAPH, scope)
    assert scope["folded_ops"]((4, 4)) == ["add"]


def test_a_tiny_model_does_not_compile_into_huge_artifacts() -> None:
    # 115 bytes of ONNX asking for a 64 MiB constant: folding it would put it in the
    # artifacts; kept as an operator, the kernel fills the output at run time.
    model = _const_of_shape([4096, 4096], value=1.5)
    model.graph.node.pop()  # no Add: the ConstantOfShape is the output
    model.graph.output[0].name = "c"
    del model.graph.input[:]
    assert len(model.SerializeToString()) < 200
    ex = kiln.compile(from_onnx(model), "c")
    assert sum(a.size or 0 for a in ex.artifacts) < 1 << 20
    sess = ort_session(model)
    np.testing.assert_array_equal(ex["main"](), sess.run(None, {})[0])


@pytest.mark.parametrize("scales", [[1.0, 1.0, 1e9, 1e9], [1.0, 1.0, float("inf"), 1.0],
                                    [1.0, 1.0, float("nan"), 1.0]])
def test_resize_with_absurd_scales_fails_at_import_naming_the_node(scales) -> None:
    inits = [numpy_helper.from_array(np.array(scales, np.float32), "scales")]
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up")
    model = _model([node], [_vi("x", [1, 1, 2, 2])], [_vi("y", None)], inits)
    proc = _run_isolated(f"""
        from kiln.errors import FrontendError
        from kiln.frontend import from_onnx
        try:
            from_onnx({model.SerializeToString()!r})
        except FrontendError as exc:
            print("FrontendError:", exc)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("FrontendError: node 'up' (Resize): "), proc.stdout

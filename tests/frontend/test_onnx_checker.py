"""from_onnx runs onnx's full checker: what onnxruntime refuses, kiln refuses, naming the node."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.errors import FrontendError
from kiln.frontend import from_onnx
from kiln.frontend.onnx.onnx_checker import KEEP_DATA_BYTES
from support.reference import ort_session


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _ort_refuses(model: onnx.ModelProto) -> None:
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime raises its own types
        ort_session(model)


def _split_with_num_outputs() -> onnx.ModelProto:
    # `num_outputs` exists from opset 18 on; this model declares opset 17.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4, 3]) for n in ("a", "b")]
    node = helper.make_node("Split", ["x"], ["a", "b"], name="split_node", axis=1, num_outputs=2)
    return _model([node], [x], outs)


def test_an_attribute_of_a_later_opset_is_refused_like_onnxruntime() -> None:
    model = _split_with_num_outputs()
    _ort_refuses(model)
    with pytest.raises(FrontendError, match=r"(?s)num_outputs.*split_node.*--no-check"):
        from_onnx(model)


def test_check_false_skips_the_checker() -> None:
    mod = from_onnx(_split_with_num_outputs(), check=False)
    assert "main" in mod


def test_a_type_error_is_refused_like_onnxruntime() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    i = helper.make_tensor_value_info("i", TensorProto.INT64, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    model = _model([helper.make_node("Add", ["x", "i"], ["y"], name="mixed_add")], [x, i], [y])
    _ort_refuses(model)
    with pytest.raises(FrontendError, match="mixed_add"):
        from_onnx(model)


@pytest.mark.parametrize("check", [True, False])
def test_an_output_declared_with_another_type_and_no_shape_is_refused(check: bool) -> None:
    # found by bench/fuzz_onnx.py --quantized (a Cast's `to` mutated): the checker sees no
    # output declared without a shape, and kiln returned int8 for a float output
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = _model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT8)], [x], [y])
    _ort_refuses(model)
    with pytest.raises(FrontendError, match=r"graph output 'y' is declared FLOAT but the "
                                            r"graph computes int8 \(INT8\)"):
        from_onnx(model, check=check)


def test_a_type_error_against_a_large_weight_is_refused() -> None:
    # The weight is larger than what the checked copy keeps: the checker sees it as an
    # input of the same type and shape, so inference still catches the mismatch.
    w = np.ones((64, 512), np.float64)
    assert w.nbytes > KEEP_DATA_BYTES
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 512])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 512])
    model = _model([helper.make_node("Add", ["x", "w"], ["y"], name="add_w")], [x], [y],
                   [numpy_helper.from_array(w, "w")])
    _ort_refuses(model)
    with pytest.raises(FrontendError, match="add_w"):
        from_onnx(model)


def test_small_shape_constants_keep_their_values_for_inference(tmp_path) -> None:
    # The Reshape target is a small initializer: strict inference needs its value to
    # check the declared output shape; a large weight next to it is stripped.
    w = np.arange(64 * 512, dtype=np.float32).reshape(64, 512) / 1e4
    target = np.array([2, 16, 32], np.int64)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16, 32])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Reshape", ["m", "t"], ["y"])]
    model = _model(nodes, [x], [y], [numpy_helper.from_array(w, "w"),
                                     numpy_helper.from_array(target, "t")])
    path = tmp_path / "m.onnx"
    onnx.save(model, path)  # from a file the weights are read outside the message
    for source in (model, str(path)):
        mod = from_onnx(source)
        data = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
        sess = ort_session(model)
        (expected,) = sess.run(None, {"x": data})
        np.testing.assert_allclose(np.asarray(kiln.evaluate(mod, "main", data)), expected,
                                   rtol=1e-5, atol=1e-5)


def test_the_checker_does_not_change_the_callers_model() -> None:
    model = _split_with_num_outputs()
    before = model.SerializeToString()
    with pytest.raises(FrontendError):
        from_onnx(model)
    assert model.SerializeToString() == before


def test_check_must_be_a_bool() -> None:
    with pytest.raises(FrontendError, match="check must be True or False"):
        from_onnx(_split_with_num_outputs(), check="no")


def test_cli_no_check(tmp_path) -> None:
    path = tmp_path / "bad.onnx"
    onnx.save(_split_with_num_outputs(), path)
    cmd = [sys.executable, "-m", "kiln", "compile", str(path), "-t", "llvm",
           "-o", str(tmp_path / "bad.so")]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stderr
    assert "--no-check" in refused.stderr and "split_node" in refused.stderr
    accepted = subprocess.run([*cmd, "--no-check"], capture_output=True, text=True, timeout=300)
    assert accepted.returncode == 0, accepted.stderr
    assert (tmp_path / "bad.so").is_file()


def test_an_intermediate_shape_against_inference_is_ignored_like_onnxruntime() -> None:
    # onnxruntime-genai's builder declares its constant [1] a scalar in value_info;
    # onnxruntime merges the shapes leniently and runs the model, kiln warns and imports.
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    one = helper.make_node("Constant", [], ["one"], name="one_node",
                           value=numpy_helper.from_array(np.ones(1, np.float32)))
    add = helper.make_node("Add", ["x", "one"], ["y"], name="add_node")
    model = _model([one, add], [x], [y])
    model.graph.value_info.append(helper.make_tensor_value_info("one", TensorProto.FLOAT, []))
    feeds = {"x": np.arange(3, dtype=np.float32)}
    want = ort_session(model).run(None, feeds)[0]
    with pytest.warns(UserWarning, match=r"value_info declares .*one_node"):
        mod = from_onnx(model)
    np.testing.assert_array_equal(np.asarray(kiln.compile(mod, "llvm")["main"](**feeds)), want)
    # the same model with the wrong shape on a graph output is still refused
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_value = 4
    with pytest.raises(FrontendError, match="full check"):
        from_onnx(model)

"""The ONNX importer: names, shapes, opsets, constant folding, and its error messages."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from kiln import evaluate
from kiln.errors import FrontendError
from kiln.frontend import from_onnx
from kiln.ir import graph as g
from kiln.ir.types import TensorType
from support.graphs import GraphBuilder


def _model(nodes, inputs, outputs, inits=(), opset=17):
    b = GraphBuilder()
    b.add(*nodes)
    b.consts(inits)
    # Unchecked: some are the malformed models whose import errors are tested.
    return b.model(inputs, outputs, opset=opset, ir_version=None, check=False)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _relu_model(shape=(2, 3), opset=17):
    return _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", shape)],
                  [_vi("y", shape)], opset=opset)


# --------------------------------------------------------------------------- names, shapes

def test_inputs_and_outputs_keep_their_onnx_names_and_order() -> None:
    nodes = [helper.make_node("Add", ["input.1", "bias"], ["sum"]),
             helper.make_node("Relu", ["sum"], ["out:0"]),
             helper.make_node("Neg", ["input.1"], ["second"])]
    bias = numpy_helper.from_array(np.ones(3, np.float32), "bias")
    model = _model(nodes, [_vi("input.1", [2, 3])], [_vi("out:0", [2, 3]), _vi("second", [2, 3])],
                   [bias])
    mod = from_onnx(model)
    main = mod["main"]
    assert [p.name for p in main.params] == ["input.1"]
    assert main.attrs["output_names"] == ("out:0", "second")
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 3
    out, second = evaluate(mod, "main", x)
    np.testing.assert_array_equal(out, np.maximum(x + 1, 0))
    np.testing.assert_array_equal(second, -x)


def test_shape_dict_binds_symbolic_dimensions() -> None:
    model = _relu_model(shape=("batch", 3))
    mod = from_onnx(model, {"x": (5, 3)})
    assert mod["main"].params[0].type == TensorType((5, 3), "float32")
    assert mod["main"].ret_type == TensorType((5, 3), "float32")


def test_unbound_dimension_becomes_a_dimension_variable() -> None:
    # tests/frontend/test_dynamic_import.py covers dynamic models in depth.
    mod = from_onnx(_relu_model(shape=("batch", 3)))
    (batch, three) = mod["main"].params[0].type.shape
    assert batch.name == "batch" and three == 3
    x = np.arange(-6, 6, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(evaluate(mod, "main", x), np.maximum(x, 0))


def test_shape_dict_that_contradicts_the_model() -> None:
    with pytest.raises(FrontendError, match=r"shape_dict gives input 'x' shape \(4, 3\), but the "
                                            r"model declares \(2, 3\)"):
        from_onnx(_relu_model(), {"x": (4, 3)})
    with pytest.raises(FrontendError, match=r"shape \(2, 3, 1\), but the model declares"):
        from_onnx(_relu_model(), {"x": (2, 3, 1)})


def test_shape_dict_with_an_unknown_input_suggests_the_right_one() -> None:
    model = _model([helper.make_node("Relu", ["image"], ["y"])], [_vi("image", [2])],
                   [_vi("y", [2])])
    with pytest.raises(FrontendError, match=r"shape_dict names 'imgae', which is neither an input "
                                            r"nor a dimension of the model\. did you mean "
                                            r"'image'\? Inputs: image"):
        from_onnx(model, {"imgae": (2,)})


@pytest.mark.parametrize("bad", [(2, -1), (2, 3.5), "23", None])
def test_shape_dict_values_must_be_int_sequences(bad) -> None:
    with pytest.raises(FrontendError, match=r"shape_dict\['x'\]"):
        from_onnx(_relu_model(), {"x": bad})


def test_shape_arithmetic_folds_at_import() -> None:
    # the exporter pattern: Shape -> Gather -> Unsqueeze -> Concat -> Reshape
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero_axes"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus_one"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "zero_axes"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one")]
    model = _model(nodes, [_vi("x", [2, 3, 4])], [_vi("y", [2, 12])], inits)
    mod = from_onnx(model)
    ops = [b.value.op for b in mod["main"].bindings if isinstance(b.value, g.Call)]
    assert ops == ["reshape"]
    x = np.random.default_rng(0).random((2, 3, 4), dtype=np.float32)
    np.testing.assert_array_equal(evaluate(mod, "main", x), x.reshape(2, 12))


def test_value_needed_at_compile_time_gets_a_clear_error() -> None:
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape_1")]
    model = _model(nodes, [_vi("x", [2, 3]), _vi("shape", [2], TensorProto.INT64)],
                   [_vi("y", [3, 2])])
    with pytest.raises(FrontendError, match=r"node 'reshape_1' \(Reshape\): Reshape shape must "
                                            r"be a compile-time constant"):
        from_onnx(model)


def test_constant_and_pass_through_outputs_are_computed_by_main() -> None:
    nodes = [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(
        np.array([1.0, 2.0], np.float32))), helper.make_node("Identity", ["x"], ["y"])]
    model = _model(nodes, [_vi("x", [2])], [_vi("c", [2]), _vi("y", [2]), _vi("x", [2])])
    mod = from_onnx(model)
    result = mod["main"].result
    assert isinstance(result, g.Tuple)
    bound = {b.var for b in mod["main"].bindings}
    assert all(f in bound for f in result.fields)
    assert len(set(result.fields)) == 3
    c, y, x = evaluate(mod, "main", np.array([3.0, 4.0], np.float32))
    np.testing.assert_array_equal(c, [1.0, 2.0])
    np.testing.assert_array_equal(y, [3.0, 4.0])
    np.testing.assert_array_equal(x, [3.0, 4.0])


# --------------------------------------------------------------------------- opsets

def test_old_opset_semantics_are_honoured() -> None:
    # opset 7 Upsample with a scales attribute; opset 9 BatchNormalization
    up = helper.make_node("Upsample", ["x"], ["y"], mode="nearest", scales=[1.0, 1.0, 2.0, 3.0])
    model = _model([up], [_vi("x", [1, 1, 2, 2])], [_vi("y", [1, 1, 4, 6])], opset=7)
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 2, 2)
    got = evaluate(from_onnx(model), "main", x)
    np.testing.assert_array_equal(got, x.repeat(2, axis=2).repeat(3, axis=3))
    # Softmax before opset 13 flattens at `axis`
    sm = helper.make_node("Softmax", ["x"], ["y"], axis=1)
    model = _model([sm], [_vi("x", [2, 3, 4])], [_vi("y", [2, 3, 4])], opset=11)
    x = np.random.default_rng(1).random((2, 3, 4), dtype=np.float32)
    flat = x.reshape(2, 12)
    want = (np.exp(flat) / np.exp(flat).sum(axis=1, keepdims=True)).reshape(2, 3, 4)
    np.testing.assert_allclose(evaluate(from_onnx(model), "main", x), want, rtol=1e-5)


def test_models_older_than_opset_7_are_converted() -> None:
    mod = from_onnx(_relu_model(opset=6))
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(evaluate(mod, "main", x), np.maximum(x, 0))


def test_a_model_without_the_default_opset_is_rejected() -> None:
    model = _relu_model()
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(FrontendError, match="does not import the default ONNX opset"):
        from_onnx(model)


# --------------------------------------------------------------------------- bad input

def test_unsupported_ops_are_all_listed_with_counts_and_node_names() -> None:
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("DFT", ["a"], ["nz"], name="find_dft"),
        helper.make_node("StringNormalizer", ["a"], ["u"]),
        helper.make_node("StringNormalizer", ["x"], ["u2"], name="norm_b"),
        helper.make_node("FusedConv", ["x"], ["f"], domain="com.microsoft", name="fc"),
        helper.make_node("ImageDecoder", ["x"], ["d"], name="dec"),
    ]
    model = _model(nodes, [_vi("x", [4]), _vi("k", [1], TensorProto.INT64)], [_vi("a", [4])],
                   opset=17)
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(FrontendError) as info:
        from_onnx(model)
    text = str(info.value)
    assert text.splitlines()[0] == ("the model uses 4 operator type(s) kiln does not support "
                                    "(opset 17):")
    assert "  DFT x1: node 'find_dft'" in text
    assert "  ImageDecoder x1: node 'dec'" in text
    assert "  StringNormalizer x2: nodes #2 (output 'u'), 'norm_b'" in text
    assert "  com.microsoft.FusedConv x1: node 'fc'" in text
    assert "Relu" not in text
    assert 'to add an operator to kiln: docs/ops.md, "Adding an operator"' in text
    assert "com.microsoft.FusedConv: written by onnxruntime's graph optimizer" in text


def test_contrib_ops_of_the_transformer_optimizer_name_the_option_that_avoids_them() -> None:
    """FastGelu and BiasGelu, as onnxruntime.transformers.optimizer writes them for a
    BERT: the refusal names the FusionOptions fields that keep standard ops (its
    SkipLayerNormalization kiln imports: tests/frontend/test_contrib_llm_ops.py)."""
    b = GraphBuilder()
    b.const(np.zeros(8, np.float32), name="bias")
    b.node("BiasGelu", ["x", "bias"], ["n"], domain="com.microsoft", name="bias_gelu")
    b.node("FastGelu", ["n"], ["y"], domain="com.microsoft", name="gelu")
    b.input("x", [1, 4, 8])
    b.output("y", [1, 4, 8])
    with pytest.raises(FrontendError) as info:
        from_onnx(b.model(opset={"": 17, "com.microsoft": 1}), check=False)
    lines = str(info.value).splitlines()
    assert lines[-2] == 'to add an operator to kiln: docs/ops.md, "Adding an operator"'
    assert lines[-1].startswith("com.microsoft.BiasGelu, com.microsoft.FastGelu: "
                                "written by onnxruntime's transformer optimizer "
                                "(onnxruntime.transformers.optimizer.optimize_model)")
    assert ("FusionOptions enable_bias_gelu=False, enable_gelu=False, "
            "enable_gelu_approximation=False") in lines[-1]
    docs = (Path(__file__).resolve().parents[2] / "docs" / "ops.md").read_text()
    assert "\n## Adding an operator\n" in docs  # the section the refusal cites


def test_many_nodes_of_one_unsupported_op_are_summarised() -> None:
    nodes = [helper.make_node("DFT", ["x"], [f"n{k}"], name=f"nz{k}") for k in range(8)]
    model = _model(nodes, [_vi("x", [4, 4])], [_vi("n0", [], TensorProto.FLOAT)])
    with pytest.raises(FrontendError, match=r"DFT x8: nodes 'nz0', 'nz1', 'nz2', 'nz3', "
                                            r"'nz4' and 3 more"):
        from_onnx(model)


def test_missing_file(tmp_path) -> None:
    with pytest.raises(FrontendError, match=r"ONNX model file '.*nope\.onnx' does not exist"):
        from_onnx(tmp_path / "nope.onnx")


def test_directory_instead_of_a_file(tmp_path) -> None:
    with pytest.raises(FrontendError, match="is a directory, not an ONNX model file"):
        from_onnx(tmp_path)


@pytest.mark.parametrize("content", [b"", b"this is not a protobuf \xff\xfe\x00\x01",
                                     b"\x08\x07" * 3])
def test_malformed_file(tmp_path, content: bytes) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(content)
    with pytest.raises(FrontendError, match=r"'.*bad\.onnx' (is not a readable ONNX model|hold "
                                            r"no ONNX graph)"):
        from_onnx(path)


def test_truncated_model_file(tmp_path) -> None:
    data = _relu_model().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(FrontendError, match=r"cut\.onnx"):
        from_onnx(path)


def test_bytes_and_paths_are_accepted(tmp_path) -> None:
    model = _relu_model()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    for source in (path, str(path), model.SerializeToString()):
        assert from_onnx(source)["main"].params[0].name == "x"
    with pytest.raises(FrontendError, match=r"these 4 bytes are not an ONNX model|hold no ONNX"):
        from_onnx(b"\xff\xff\xff\xff")


def test_wrong_argument_type() -> None:
    with pytest.raises(FrontendError, match=r"expects a path, bytes or onnx\.ModelProto, got int"):
        from_onnx(42)


def test_node_using_an_undefined_value() -> None:
    model = _model([helper.make_node("Relu", ["nowhere"], ["y"], name="r")], [_vi("x", [2])],
                   [_vi("y", [2])])
    with pytest.raises(FrontendError, match=r"node 'r' \(Relu\): input 'nowhere' is not defined "
                                            "before use"):
        from_onnx(model, check=False)  # kiln's own guard
    with pytest.raises(FrontendError, match=r"(?s)nowhere.*name: r OpType: Relu"):
        from_onnx(model)  # onnx's checker comes first


def test_graph_output_produced_by_no_node() -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2])], [_vi("z", [2])])
    with pytest.raises(FrontendError, match="graph output 'z' is produced by no node"):
        from_onnx(model, check=False)  # kiln's own guard
    with pytest.raises(FrontendError, match="Graph output 'z' is not an output of any node"):
        from_onnx(model)  # onnx's checker comes first


def test_type_errors_name_the_node() -> None:
    node = helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")
    model = _model([node], [_vi("a", [2, 3]), _vi("b", [4, 5])], [_vi("y", [2, 5])])
    with pytest.raises(FrontendError, match=r"node 'mm' \(MatMul\): matmul: inner dimensions "
                                            r"differ: \(2, 3\) @ \(4, 5\)"):
        from_onnx(model, check=False)  # kiln's own guard
    with pytest.raises(FrontendError, match=r"node name: mm\): \[ShapeInferenceError\] "
                                            "Incompatible dimensions"):
        from_onnx(model)  # onnx's checker comes first


def test_missing_required_attribute_names_it() -> None:
    node = helper.make_node("Concat", ["x", "x"], ["y"], name="cat")
    model = _model([node], [_vi("x", [2])], [_vi("y", [4])])
    with pytest.raises(FrontendError, match=r"node 'cat' \(Concat\): missing attribute or input "
                                            "'axis'"):
        from_onnx(model, check=False)  # kiln's own guard
    with pytest.raises(FrontendError, match=r"(?s)Required attribute 'axis' is missing.*Name: cat"):
        from_onnx(model)  # onnx's checker comes first


def test_sequence_inputs_are_refused() -> None:
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, [2])
    model = _model([helper.make_node("Identity", ["s"], ["y"])], [seq], [seq])
    with pytest.raises(FrontendError, match="input 's' is a sequence; kiln imports tensor inputs"):
        from_onnx(model)


def test_corrupted_models_never_crash() -> None:
    """Random byte flips in a valid model: a FrontendError or a good import, nothing else."""
    data = bytearray(_model(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["y"], ["z"])],
        [_vi("x", [1, 2, 5, 5])], [_vi("z", [1, 3, 5, 5])],
        [numpy_helper.from_array(np.ones((3, 2, 3, 3), np.float32), "w")]).SerializeToString())
    rng = np.random.default_rng(7)
    outcomes = set()
    for _ in range(150):
        mutated = bytearray(data)
        for pos in rng.integers(0, len(mutated), size=3):
            mutated[pos] = int(rng.integers(0, 256))
        try:
            from_onnx(bytes(mutated))
            outcomes.add("ok")
        except FrontendError:
            outcomes.add("error")
    assert "error" in outcomes


# --------------------------------------------------------------------------- printing

def test_imported_model_prints_and_round_trips() -> None:
    from kiln.ir import assert_structural_equal
    from kiln.script import from_source

    w = numpy_helper.from_array(np.random.default_rng(3).random((8, 4, 3, 3), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    mod = from_onnx(_model(nodes, [_vi("x", [1, 4, 6, 6])], [_vi("y", [1, 8, 6, 6])], [w]))
    text = mod.script()
    assert "def main(x:" in text
    assert '"conv2d"' in text and '"relu"' in text
    assert_structural_equal(from_source(text), mod)

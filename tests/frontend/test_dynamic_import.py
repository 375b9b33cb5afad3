"""ONNX models with symbolic dimensions: import, shape_dict, shape subgraphs, errors.

The imported graph functions run in the reference interpreter (`kiln.evaluate`),
which binds the dimension variables from the arguments, and are compared with
onnxruntime at several sizes.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import kiln
from kiln import evaluate
from kiln.errors import FrontendError
from kiln.frontend.onnx import from_onnx
from kiln.ir.attrs import ATTR_DIM_BOUNDS
from kiln.ir.shape_expr import shape_text
from kiln.ir.tensor import Var
from kiln.ir.types import TensorType
from kiln.script import from_source, print_module
from support.dynamic_models import cnn, encoder, feeds
from support.graphs import GraphBuilder
from support.reference import ort_session

ENCODER_SIZES = [(1, 1), (1, 32), (3, 7), (2, 200), (1, 512)]


def _run_both(model: onnx.ModelProto, sizes: dict[str, int], mod=None) -> None:
    mod = mod or from_onnx(model)
    inputs = feeds(model, sizes)
    session = ort_session(model)
    expected = session.run(None, inputs)[0]
    actual = np.asarray(evaluate(mod, "main", *inputs.values()))
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-4)


def _shape(mod, k: int = 0) -> str:
    return shape_text(mod["main"].params[k].type.shape)


def _model(nodes: list, inputs: list, outputs: list, inits=()) -> onnx.ModelProto:
    """A model of `nodes`; inputs and outputs as (name, elem type, shape) triples."""
    b = GraphBuilder()
    b.add(*nodes)
    b.consts(inits)
    for n, e, s in inputs:
        b.input(n, s, e)
    for n, e, s in outputs:
        b.output(n, s, e)
    # Unchecked: outputs of unknown rank, and models whose import errors are tested.
    return b.model(ir_version=None, check=False)


def _single(node: onnx.NodeProto, inputs: list, inits=()) -> onnx.ModelProto:
    return _model([node], inputs, [(node.output[0], TensorProto.FLOAT, None)], inits)


@pytest.fixture(scope="module", params=[False, True], ids=["zero_minus_one", "torch_style"])
def encoder_case(request):
    model = encoder(torch_style=request.param)
    return model, from_onnx(model)


@pytest.mark.parametrize("batch,seq", ENCODER_SIZES)
def test_encoder_matches_onnxruntime_at_every_size(encoder_case, batch: int, seq: int) -> None:
    model, mod = encoder_case
    _run_both(model, {"batch": batch, "seq": seq}, mod)


def test_encoder_types_are_symbolic_and_shared(encoder_case) -> None:
    _, mod = encoder_case
    main = mod["main"]
    assert _shape(mod, 0) == "[batch, seq, 64]" and _shape(mod, 1) == "[batch, seq]"
    features, mask = (p.type.shape for p in main.params)
    assert features[0] is mask[0] and features[1] is mask[1]  # one Var per name
    assert shape_text(main.ret_type.shape) == "[batch, seq, 64]"
    assert main.attrs[ATTR_DIM_BOUNDS] == (("batch", 0, None), ("seq", 0, None))
    # Reshapes got symbolic targets; the shape computations they came from are gone.
    text = mod.script()
    assert "G.Tensor((batch, seq, 4, 16)" in text.replace('"', "")
    assert "shape_of" not in text


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_cnn_with_symbolic_batch_matches_onnxruntime(batch: int) -> None:
    model = cnn()
    mod = from_onnx(model)
    assert _shape(mod) == "[batch, 3, 16, 16]"
    _run_both(model, {"batch": batch}, mod)


@pytest.mark.parametrize("build", [lambda: encoder(), lambda: encoder(torch_style=True),
                                   lambda: cnn()], ids=["encoder", "encoder_torch", "cnn"])
def test_dynamic_modules_round_trip_through_the_script(build) -> None:
    model = build()
    mod = from_onnx(model)
    text = print_module(mod, metadata="reference")
    again = from_source(text, metadata=text.metadata)
    assert print_module(again, metadata="reference") == text
    sizes = {"batch": 2, "seq": 5}
    inputs = list(feeds(model, sizes).values())
    np.testing.assert_array_equal(np.asarray(evaluate(again, "main", *inputs)),
                                  np.asarray(evaluate(mod, "main", *inputs)))


# ------------------------------------------------------------------ shape_dict


def test_shape_dict_pins_by_dimension_name() -> None:
    mod = from_onnx(encoder(), {"batch": 1})
    assert _shape(mod, 0) == "[1, seq, 64]" and _shape(mod, 1) == "[1, seq]"
    assert mod["main"].attrs[ATTR_DIM_BOUNDS] == (("seq", 0, None),)
    _run_both(encoder(), {"batch": 1, "seq": 9}, mod)


def test_shape_dict_pins_by_input_and_none_keeps_a_dimension() -> None:
    mod = from_onnx(encoder(), {"features": (2, None, 64)})
    assert _shape(mod, 0) == "[2, seq, 64]" and _shape(mod, 1) == "[2, seq]"


def test_shape_dict_pinning_everything_gives_a_static_module() -> None:
    mod = from_onnx(encoder(), {"batch": 2, "seq": 6})
    assert mod["main"].params[0].type == TensorType((2, 6, 64), "float32")
    assert ATTR_DIM_BOUNDS not in mod["main"].attrs
    _run_both(encoder(), {"batch": 2, "seq": 6}, mod)


def test_shape_dict_range_bounds_a_dimension() -> None:
    mod = from_onnx(encoder(), {"seq": range(1, 513), "batch": range(0, 9)})
    assert mod["main"].attrs[ATTR_DIM_BOUNDS] == (("batch", 0, 8), ("seq", 1, 512))
    assert _shape(mod) == "[batch, seq, 64]"


def test_unnamed_dynamic_dims_get_fresh_unique_names() -> None:
    f = TensorProto.FLOAT
    # a dim_param spelled like the name made up for x's unnamed dimension
    mod = from_onnx(_model([helper.make_node("Relu", ["x"], ["z"])],
                           [("x", f, [None, 4]), ("y", f, ["x_dim0", 4])], [("z", f, None)]))
    (dx, _), (dy, _) = (p.type.shape for p in mod["main"].params)
    assert isinstance(dx, Var) and isinstance(dy, Var)
    assert dx is not dy and dx.name != dy.name
    assert {dx.name, dy.name} == {"x_dim0", "x_dim0_2"}
    # the made-up names pin like dim_params
    pinned = from_onnx(_model([helper.make_node("Relu", ["x"], ["z"])],
                              [("x", f, [None, 4])], [("z", f, None)]), {"x_dim0": 3})
    assert pinned["main"].params[0].type == TensorType((3, 4), "float32")
    a = np.ones((3, 4), np.float32)
    np.testing.assert_array_equal(evaluate(mod, "main", a, np.ones((5, 4), np.float32)), a)


def test_dim_names_that_are_not_identifiers_are_rewritten() -> None:
    model = _single(helper.make_node("Relu", ["x"], ["y"]),
                    [("x", TensorProto.FLOAT, ["batch size", "2n"])])
    mod = from_onnx(model)
    assert _shape(mod) == "[batch_size, d_2n]"
    # shape_dict still takes the model's spelling
    assert _shape(from_onnx(model, {"batch size": 3})) == "[3, d_2n]"
    assert _shape(from_onnx(model, {"d_2n": 5})) == "[batch_size, 5]"


@pytest.mark.parametrize("shape_dict,message", [
    ({"btach": 1}, r"shape_dict names 'btach', which is neither an input nor a dimension of "
                   r"the model\. did you mean 'batch'\? Inputs: features, mask; dimensions: "
                   r"batch, seq"),
    ({"features": (2, None, 64), "mask": (3, None)},
     r"shape_dict\['mask'\]\[0\] pins dimension 'batch' to 3, but "
     r"shape_dict\['features'\]\[0\] pins it to 2"),
    ({"batch": 4, "features": (2, None, 64)},
     r"pins dimension 'batch' to 2, but shape_dict\['batch'\] pins it to 4"),
    ({"seq": range(1, 10, 2)}, r"shape_dict\['seq'\] = range\(1, 10, 2\): a dimension range "
                               r"must be non-empty, with step 1"),
    ({"seq": -3}, r"shape_dict\['seq'\] must be a non-negative int .* or a range"),
    ({"seq": range(1, 9), "mask": (1, 20)}, r"pins dimension 'seq' to 20, outside its range "
                                            r"1\.\.8"),
    ({"features": (2, None, 32)}, r"shape_dict gives input 'features' shape \(2, None, 32\), "
                                  r"but the model declares \('batch', 'seq', 64\)"),
    ({"features": (2, "x", 64)}, r"must be a non-negative int or None"),
    ({"mask": range(1, 4)}, r"shape_dict\['mask'\] = range\(1, 4\): 'mask' is an input; a range "
                            r"bounds a dimension and is keyed by its name"),
])
def test_bad_shape_dict_entries_are_clear_errors(shape_dict, message: str) -> None:
    with pytest.raises(FrontendError, match=message):
        from_onnx(encoder(), shape_dict)


# ------------------------------------------------------------------ shape rules, errors


def test_symbolic_shape_rules_give_canonical_expressions() -> None:
    f = TensorProto.FLOAT
    concat = _single(helper.make_node("Concat", ["a", "b"], ["y"], axis=1),
                     [("a", f, ["n", "s"]), ("b", f, ["n", "s"])])
    assert shape_text(from_onnx(concat)["main"].ret_type.shape) == "[n, s*2]"
    conv = _single(helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3],
                                    strides=[2, 2], pads=[1, 1, 1, 1]),
                   [("x", f, ["n", 3, "h", "w"])])
    assert shape_text(from_onnx(conv)["main"].ret_type.shape) == \
        "[n, 3, (h - 1)//2 + 1, (w - 1)//2 + 1]"
    flat = _single(helper.make_node("Flatten", ["x"], ["y"], axis=2),
                   [("x", f, ["n", "s", 4, 8])])
    assert shape_text(from_onnx(flat)["main"].ret_type.shape) == "[n*s, 32]"
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 8)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(from_onnx(flat), "main", x), x.reshape(6, 32))


F = TensorProto.FLOAT
ERROR_CASES = {
    # `s + 1` against `t` (two names of one size are made one variable instead)
    "broadcast": (lambda: _model([helper.make_node("Pad", ["a", "pads"], ["p"]),
                                  helper.make_node("Add", ["p", "b"], ["y"])],
                                 [("a", F, ["n", "s"]), ("b", F, ["n", "t"])], [("y", F, None)],
                                 [onnx.numpy_helper.from_array(
                                     np.array([0, 0, 0, 1], np.int64), "pads")]),
                  r"\(Add\): shapes \['\[n, s \+ 1\]', '\[n, t\]'\] do not broadcast "
                  r"\(dimension 1: s \+ 1 vs t\): kiln cannot prove s \+ 1 == t for every "
                  r"value of the symbolic dimensions; pin s, t with "
                  r"shape_dict=\{\"s\": 128, \"t\": 128\}"),
    "data_dependent_reshape": (
        lambda: _single(helper.make_node("Reshape", ["x", "s"], ["y"], name="view"),
                        [("x", F, ["n", 4]), ("s", TensorProto.INT64, [2])]),
        r"node 'view' \(Reshape\): Reshape shape must be a compile-time constant"),
    "fill_to_a_size_no_input_has": (
        lambda: _model([helper.make_node("Shape", ["x"], ["sh"]),
                        helper.make_node("Mul", ["sh", "sh"], ["square"]),
                        helper.make_node("ConstantOfShape", ["square"], ["y"], name="fill")],
                       [("x", F, ["n", 4])], [("y", F, None)]),
        r"node 'fill' \(ConstantOfShape\): the size n\*n is no input's dimension \(nor a "
        r"sum of them\): kiln cannot make a tensor of shape \[n\*n, 16\]; pin n with "
        r"shape_dict=\{\"n\": 1\} \(CLI: kiln compile \.\.\. --shape n=1\)"),
    "rule_without_symbolic_support": (
        lambda: _single(helper.make_node("TopK", ["x", "k"], ["y", "i"], axis=0),
                        [("x", F, ["n", 4])],
                        [onnx.numpy_helper.from_array(np.array([2], np.int64), "k")]),
        r"\(TopK\): .*\[n, 4\]"),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_import_errors_name_the_node_and_the_dimensions(case: str) -> None:
    build, message = ERROR_CASES[case]
    with pytest.raises(FrontendError, match=message):
        from_onnx(build())


def test_shape_value_used_as_data_is_computed_at_run_time() -> None:
    # Shape(x) * 2 as the model's output: the value exists only at run time.
    f = TensorProto.FLOAT
    mod = from_onnx(_model([helper.make_node("Shape", ["x"], ["sh"]),
                            helper.make_node("Mul", ["sh", "two"], ["y"])],
                           [("x", f, ["n", "s"])], [("y", TensorProto.INT64, [2])],
                           [onnx.numpy_helper.from_array(np.array(2, np.int64), "two")]))
    for shape in ((3, 5), (1, 9)):
        np.testing.assert_array_equal(evaluate(mod, "main", np.zeros(shape, np.float32)),
                                      np.array(shape) * 2)


def _i64(name: str, *values: int) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.array(values, np.int64), name)


SLICE_CASES = {
    # (nodes, initializers, the output shape's text)
    "tail": ([helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"])],
             [_i64("st", 1), _i64("en", 2 ** 62), _i64("ax", 1)], "[n, s - min(1, s)]"),
    "from_the_end": ([helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"])],
                     [_i64("st", -3), _i64("en", -1), _i64("ax", 1)],
                     "[n, max(s - 1, 0) - max(s - 3, 0)]"),
    "end_from_shape": ([helper.make_node("Shape", ["x"], ["sh"]),
                        helper.make_node("Gather", ["sh", "one"], ["s1"], axis=0),
                        helper.make_node("Sub", ["s1", "one"], ["e"]),
                        helper.make_node("Unsqueeze", ["e", "zero"], ["e1"]),
                        helper.make_node("Slice", ["x", "st", "e1", "ax"], ["y"])],
                       [_i64("st", 0), _i64("ax", 1), _i64("zero", 0),
                        onnx.numpy_helper.from_array(np.array(1, np.int64), "one")],
                       "[n, max(s - 1, 0)]"),
}


@pytest.mark.parametrize("case", sorted(SLICE_CASES))
def test_slices_along_symbolic_dims_clamp_like_onnxruntime(case: str) -> None:
    nodes, inits, text = SLICE_CASES[case]
    model = _model(nodes, [("x", F, ["n", "s"])], [("y", F, None)], inits)
    mod = from_onnx(model)
    assert shape_text(mod["main"].ret_type.shape) == text
    session = ort_session(model)
    for shape in ((2, 5), (1, 1), (3, 2)):
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(evaluate(mod, "main", x)),
                                      session.run(None, {"x": x})[0])


def test_fills_and_expands_to_symbolic_shapes_read_the_sizes_at_run_time() -> None:
    # ConstantOfShape(Shape(x)) and the attention-mask pattern Expand(mask, Shape(scores))
    fill = onnx.helper.make_tensor("v", TensorProto.FLOAT, [1], [1.5])
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("ConstantOfShape", ["sh"], ["ones"], value=fill),
             helper.make_node("Unsqueeze", ["m", "ax"], ["m4"]),
             helper.make_node("Expand", ["m4", "sh"], ["wide"]),
             helper.make_node("Add", ["ones", "wide"], ["y"])]
    model = _model(nodes, [("x", F, ["b", "h", "s", "s"]), ("m", F, ["b", "s"])],
                   [("y", F, None)], [_i64("ax", 1, 2)])
    mod = from_onnx(model)
    assert shape_text(mod["main"].ret_type.shape) == "[b, h, s, s]"
    session = ort_session(model)
    rng = np.random.default_rng(0)
    for b, h, s in ((1, 2, 1), (3, 2, 5)):
        feed = {"x": rng.standard_normal((b, h, s, s)).astype(np.float32),
                "m": rng.standard_normal((b, s)).astype(np.float32)}
        np.testing.assert_array_equal(np.asarray(evaluate(mod, "main", *feed.values())),
                                      session.run(None, feed)[0])


@pytest.mark.parametrize("target", ["llvm", "c"])
def test_a_fill_of_symbolic_sizes_reads_one_element_per_line(target: str) -> None:
    """ConstantOfShape(Shape(x)): each symbolic size is read from x's axis as a line of
    x's first elements along its other axes (a slice, summed), not x summed whole; an
    empty axis leaves the other lines their length (batch 0, seq 0 as onnxruntime)."""
    fill = onnx.helper.make_tensor("v", TensorProto.FLOAT, [1], [2.5])
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("ConstantOfShape", ["sh"], ["y"], value=fill)]
    model = _model(nodes, [("x", F, ["b", "s", 3])], [("y", F, ["b", "s", 3])])
    mod = from_onnx(model)
    text = print_module(mod)
    assert text.count("strided_slice") >= text.count("reduce_sum") > 0, text
    ex = kiln.compile(mod, target)
    session = ort_session(model)
    for b, s in ((2, 5), (1, 1), (0, 4), (3, 0)):
        x = np.random.default_rng(b).standard_normal((b, s, 3)).astype(np.float32)
        np.testing.assert_array_equal(np.asarray(ex["main"](x)), session.run(None, {"x": x})[0])


@pytest.mark.parametrize("style", ["range", "slice"])
def test_position_ids_up_to_a_symbolic_length(style: str) -> None:
    # BERT-style exports: Range(0, seq) or a constant position_ids[:, :seq], then a lookup
    table = onnx.numpy_helper.from_array(
        np.random.default_rng(1).standard_normal((16, 8)).astype(np.float32), "table")
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Gather", ["sh", "one"], ["seq"], axis=0)]
    inits = [table, onnx.numpy_helper.from_array(np.array(1, np.int64), "one")]
    if style == "range":
        nodes += [helper.make_node("Range", ["zero", "seq", "one"], ["r"]),
                  helper.make_node("Unsqueeze", ["r", "ax0"], ["pos"])]
        inits += [onnx.numpy_helper.from_array(np.array(0, np.int64), "zero"), _i64("ax0", 0)]
    else:
        nodes += [helper.make_node("Unsqueeze", ["seq", "ax0"], ["end"]),
                  helper.make_node("Slice", ["ids", "st", "end", "ax1"], ["pos"])]
        inits += [onnx.numpy_helper.from_array(np.arange(16, dtype=np.int64)[None], "ids"),
                  _i64("ax0", 0), _i64("st", 0), _i64("ax1", 1)]
    nodes += [helper.make_node("Gather", ["table", "pos"], ["emb"], axis=0),
              helper.make_node("Add", ["x", "emb"], ["y"])]
    model = _model(nodes, [("x", F, ["b", "s", 8])], [("y", F, None)], inits)
    mod = from_onnx(model)
    assert shape_text(mod["main"].ret_type.shape) == "[b, s, 8]"
    session = ort_session(model)
    for b, s in ((1, 1), (2, 5), (3, 16)):
        x = np.random.default_rng(s).standard_normal((b, s, 8)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(evaluate(mod, "main", x)),
                                   session.run(None, {"x": x})[0], rtol=1e-6)


SHAPE_VALUE_CASES = {
    # Reshape(x, Cast(Unsqueeze(Size(x)))): x flattened
    "size_cast": ([helper.make_node("Size", ["x"], ["n"]),
                   helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"]),
                   helper.make_node("Cast", ["n1"], ["t"], to=TensorProto.INT64)],
                  "[b*s*4]"),
    # the Where(Equal(t, -1), 1, t) guard of Expand exports, then Slice and Concat
    "where_equal_slice": ([helper.make_node("Shape", ["x"], ["sh"]),
                           helper.make_node("Gather", ["sh", "zero"], ["b"], axis=0),
                           helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
                           helper.make_node("Concat", ["b1", "minus1"], ["t0"], axis=0),
                           helper.make_node("Equal", ["t0", "minus1"], ["is_m1"]),
                           helper.make_node("Where", ["is_m1", "ones", "t0"], ["w"]),
                           helper.make_node("Slice", ["w", "zero1", "one1"], ["w0"]),
                           helper.make_node("Concat", ["w0", "minus1"], ["t"], axis=0)],
                          "[b, s*4]"),
}


@pytest.mark.parametrize("case", sorted(SHAPE_VALUE_CASES))
def test_shape_arithmetic_folds_to_symbolic_reshape_targets(case: str) -> None:
    nodes, text = SHAPE_VALUE_CASES[case]
    inits = [_i64("ax0", 0), _i64("minus1", -1), _i64("ones", 1, 1), _i64("zero1", 0),
             _i64("one1", 1), onnx.numpy_helper.from_array(np.array(0, np.int64), "zero")]
    model = _model([*nodes, helper.make_node("Reshape", ["x", "t"], ["y"])],
                   [("x", F, ["b", "s", 4])], [("y", F, None)], inits)
    mod = from_onnx(model)
    assert shape_text(mod["main"].ret_type.shape) == text
    assert "shape_of" not in mod.script()
    session = ort_session(model)
    x = np.random.default_rng(0).standard_normal((3, 5, 4)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(evaluate(mod, "main", x)),
                                  session.run(None, {"x": x})[0])


def test_conv_transpose_with_a_symbolic_batch() -> None:
    w = onnx.numpy_helper.from_array(
        np.random.default_rng(2).standard_normal((3, 2, 3, 3)).astype(np.float32), "w")
    model = _model([helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2],
                                     pads=[1, 1, 1, 1])],
                   [("x", F, ["n", 3, 5, 5])], [("y", F, None)], [w])
    mod = from_onnx(model)
    assert shape_text(mod["main"].ret_type.shape) == "[n, 2, 9, 9]"
    session = ort_session(model)
    for n in (1, 3):
        x = np.random.default_rng(n).standard_normal((n, 3, 5, 5)).astype(np.float32)
        np.testing.assert_allclose(np.asarray(evaluate(mod, "main", x)),
                                   session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-5)

"""Attribute values a damaged or hostile model may carry (found by mutating valid
models' attributes and comparing with onnxruntime): each is a FrontendError naming the
node, never a hang, a crash in onnx's shape inference, or a result that depends on how
a runtime reads an out-of-range flag. Empty tensors (a static dimension of 0) run
their kernels zero times."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import kiln
from kiln.errors import FrontendError
from kiln.frontend import from_onnx
from support.graphs import GraphBuilder
from support.processes import run_python
from support.reference import onnxruntime_outputs


def _model(node, shape, inits=(), opset=17):
    b = GraphBuilder()
    b.add(node)
    b.consts(inits)
    return b.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                   opset=opset, ir_version=None, check=False)


@pytest.mark.parametrize("node", [
    helper.make_node("ReduceMax", ["x"], ["y"], axes=[1], keepdims=2, name="rm"),
    helper.make_node("ArgMax", ["x"], ["y"], select_last_index=-1, name="rm"),
    helper.make_node("CumSum", ["x", "a"], ["y"], reverse=8, name="rm"),
    helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], ceil_mode=3, name="rm"),
], ids=["keepdims", "select_last_index", "reverse", "ceil_mode"])
def test_a_flag_other_than_0_or_1_is_refused(node) -> None:
    # onnxruntime reads keepdims=2 as false, a `!= 0` reader as true: neither is ONNX
    model = _model(node, [1, 2, 4, 4], [numpy_helper.from_array(np.array(1), "a")])
    with pytest.raises(FrontendError, match=rf"node 'rm' \({node.op_type}\): attribute "
                                            r"\w+ is a flag, 0 or 1; got -?\d"):
        from_onnx(model)


@pytest.mark.parametrize("attrs, message", [
    ({"strides": [2, 1 << 62]}, r"strides \(2, 4611686018427387904\): every value must be "
                                r"in \[1, 1048576\]"),
    ({"pads": [1, 1, 1, 1 << 31]}, r"pads .*every value must be in \[0, 1048576\]"),
    ({"pads": [0, 3, 0, 0]}, r"pads \(3, 0\) of spatial axis 1 must be smaller than the "
                             r"window \(3\)"),
])
def test_window_attributes_out_of_range_are_refused_at_import(attrs, message) -> None:
    # a 2**62 stride used to size a kernel's row buffer: a loop of 2**62 steps
    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], name="mp", **attrs)
    with pytest.raises(FrontendError, match=rf"node 'mp' \(MaxPool\): .*{message}"):
        from_onnx(_model(node, [1, 2, 7, 7]))


@pytest.mark.parametrize("axis", [1 << 62, 5, -5])
def test_a_flatten_axis_out_of_range_is_refused(axis) -> None:
    # found by mutating attributes: onnx's checker let 2**62 through and kiln sliced the
    # shape with it, a (196, 1) result where onnxruntime refuses the model
    model = _model(helper.make_node("Flatten", ["x"], ["y"], axis=axis, name="fl"), [1, 4, 7, 7])
    with pytest.raises(Exception, match="Flatten"):
        onnxruntime_outputs(model, {"x": np.zeros((1, 4, 7, 7), np.float32)})
    with pytest.raises(FrontendError, match=rf"node 'fl' \(Flatten\): Flatten: axis {axis} is "
                                            r"out of range \[-4, 4\] for \[1, 4, 7, 7\]"):
        from_onnx(model, check=False)


@pytest.mark.parametrize("to, message", [
    ((1 << 32) + 1, r"Cast: to 4294967297 is not an ONNX element type"),
    (TensorProto.STRING, r"Cast: to is STRING, an element type kiln does not compute with; "
                         r"known: bool, "),
])
def test_a_cast_to_an_unknown_element_type_is_refused(to, message) -> None:
    # found by mutating attributes: onnx's checker let 2**32 + 1 through (onnxruntime
    # reads it as 1, FLOAT), and the importer reported a KeyError as 'missing attribute
    # or input 4294967297'
    node = helper.make_node("Cast", ["x"], ["y"], to=to, name="c")
    with pytest.raises(FrontendError, match=rf"node 'c' \(Cast\): {message}"):
        from_onnx(_model(node, [2, 3]))


def test_an_lrn_window_out_of_range_is_refused_at_import() -> None:
    # it sums `size` channels per element: 2**31 was a hang
    node = helper.make_node("LRN", ["x"], ["y"], size=1 << 31, name="lrn")
    with pytest.raises(FrontendError, match=r"node 'lrn' \(LRN\): lrn: size must be in "
                                            r"\[1, 1048576\], got 2147483648"):
        from_onnx(_model(node, [1, 2, 7, 7]))


def _vec(name: str, n: int):
    return numpy_helper.from_array(np.linspace(0.5, 1.5, n).astype(np.float32), name)


@pytest.mark.parametrize("node, inits, message", [
    (helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], name="n"),
     [_vec("s", 4), _vec("b", 1)], r"input scale has 4 values for an input of 1 channels"),
    (helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="n"),
     [_vec("s", 1), _vec("b", 1), _vec("m", 3), _vec("v", 1)],
     r"input input_mean has 3 values for an input of 1 channels"),
    (helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=1, name="n"),
     [_vec("s", 2), _vec("b", 1)], r"input scale has 2 values for an input of 1 channels"),
], ids=["instance", "batch", "group"])
def test_per_channel_parameters_of_another_length_are_refused(node, inits, message) -> None:
    # found by mutating shapes: broadcasting made 4 scale values on a 1-channel input 4
    # output channels, where onnxruntime refuses the model (onnx's checker catches some:
    # kiln's converters refuse them without it too)
    with pytest.raises(FrontendError, match=rf"node 'n' \({node.op_type}\): {message}"):
        from_onnx(_model(node, [1, 1, 5, 5], inits, opset=21), check=False)


def test_conv_transpose_output_padding_past_its_stride_is_refused() -> None:
    # ONNX: each output_padding value is less than its stride or dilation
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2],
                            output_padding=[2, 1], name="ct")
    w = numpy_helper.from_array(np.ones((1, 2, 3, 3), np.float32), "w")
    with pytest.raises(FrontendError, match=r"node 'ct' \(ConvTranspose\): output_padding "
                                            r"\[2, 1\]: value 0 must be less than its stride 2"):
        from_onnx(_model(node, [1, 1, 5, 5], [w]))


@pytest.mark.parametrize("mode", ["edge", "wrap", "reflect"])
def test_padding_an_empty_axis_by_its_neighbours_is_refused(mode) -> None:
    # found with empty tensors: edge and wrap read the missing neighbours from past the
    # zero-byte input; onnx's reference refuses the three modes on an empty padded axis
    # (onnxruntime refuses edge and reflect and has no wrap)
    node = helper.make_node("Pad", ["x", "p"], ["y"], mode=mode, name="pad")
    model = _model(node, [0, 4], [numpy_helper.from_array(np.array([1, 0, 1, 0]), "p")],
                   opset=19)
    with pytest.raises(ValueError, match="can't extend empty axis"):
        ReferenceEvaluator(model).run(None, {"x": np.zeros((0, 4), np.float32)})
    with pytest.raises(FrontendError, match=rf"node 'pad' \(Pad\): pad: {mode} mode needs at "
                                            r"least \d elements? along padded dims"):
        from_onnx(model)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
def test_pooling_over_an_empty_spatial_axis_is_refused(op) -> None:
    # found with empty tensors: with pads, windows of padding alone made a MaxPool
    # output of -inf and an AveragePool of 0/0, where onnxruntime refuses the model
    node = helper.make_node(op, ["x"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 1, 1],
                            name="pool")
    model = _model(node, [1, 2, 0, 5])
    with pytest.raises(Exception, match="pool_attributes"):
        onnxruntime_outputs(model, {"x": np.zeros((1, 2, 0, 5), np.float32)})
    with pytest.raises(FrontendError, match=rf"node 'pool' \({op}\): pooling over an empty "
                                            r"spatial axis of \[1, 2, 0, 5\]"):
        from_onnx(model)


def test_grid_sampling_an_empty_image_is_refused() -> None:
    # found with empty tensors: the call failed at run time with a message about
    # gather_elements, an op the model does not have
    node = helper.make_node("GridSample", ["x", "g"], ["y"], name="gs")
    model = _model(node, [1, 1, 0, 4], [numpy_helper.from_array(np.zeros((1, 2, 2, 2),
                                                                         np.float32), "g")],
                   opset=16)
    with pytest.raises(Exception, match="Input spatial dimensions must be non-empty"):
        onnxruntime_outputs(model, {"x": np.zeros((1, 1, 0, 4), np.float32)})
    with pytest.raises(FrontendError, match=r"node 'gs' \(GridSample\): GridSample: X "
                                            r"\(1, 1, 0, 4\) has an empty spatial axis"):
        from_onnx(model)


def test_resizing_an_empty_axis_to_elements_is_refused() -> None:
    # found with empty tensors: the size's ratio to an empty axis divided by zero, a
    # FrontendError that said only "division by zero"
    node = helper.make_node("Resize", ["x", "", "", "s"], ["y"], mode="linear", name="rs")
    x = np.zeros((1, 2, 0, 5), np.float32)
    to = numpy_helper.from_array(np.array([1, 2, 3, 10]), "s")
    with pytest.raises(Exception, match="Input dim is zero but required output dim is non-zero"):
        onnxruntime_outputs(_model(node, list(x.shape), [to]), {"x": x})
    with pytest.raises(FrontendError, match=r"node 'rs' \(Resize\): Resize: axis 2 of "
                                            r"\(1, 2, 0, 5\) is empty and cannot be resized "
                                            r"to 3"):
        from_onnx(_model(node, list(x.shape), [to]))
    # to 0 it stays empty, as onnxruntime runs it
    model = _model(node, list(x.shape), [numpy_helper.from_array(np.array([1, 2, 0, 10]), "s")])
    (want,) = onnxruntime_outputs(model, {"x": x})
    assert kiln.compile(from_onnx(model), "llvm")["main"](x).shape == want.shape == (1, 2, 0, 10)


def _save(tmp_path: Path, name: str, node, inputs, inits=()) -> Path:
    b = GraphBuilder()
    b.add(node)
    b.consts(inits)
    model = b.model(inputs, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                             for o in node.output], opset=17, ir_version=None, check=False)
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(model.SerializeToString())
    return path


REFUSE = """
import sys
import kiln
from kiln.errors import FrontendError
from kiln.frontend import from_onnx

try:
    from_onnx(sys.argv[1])
except FrontendError as exc:
    print("refused:", exc)
"""


def test_negative_batch_dims_never_reach_onnx_shape_inference(tmp_path: Path) -> None:
    # onnx's shape inference indexes with a negative GatherND batch_dims unchecked (a
    # segmentation fault): kiln refuses it before onnx's checker runs
    path = _save(tmp_path, "gnd", helper.make_node("GatherND", ["x", "i"], ["y"],
                                                    batch_dims=-3, name="gnd"),
                 [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                 [numpy_helper.from_array(np.array([[[1 << 62], [2]], [[0], [1]]]), "i")])
    proc = run_python(REFUSE, str(path), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "refused: node 'gnd' (GatherND): attribute batch_dims must not be negative, " \
           "got -3" in proc.stdout


EMPTY = """
import sys
import numpy as np
import kiln

for path in sys.argv[2:]:
    want = np.load(path + ".npz")
    x = np.zeros(want["x"].shape, np.float32)
    got = kiln.compile(kiln.frontend.from_onnx(path), sys.argv[1]).jit()["main"](x)
    assert [g.shape for g in got] == [want["y"].shape, want["s"].shape], (path, got)
    np.testing.assert_array_equal(got[0], want["y"])
    np.testing.assert_array_equal(got[1], want["s"])
    print(path, "ok")
"""

#: (node, input shape): pools, a row kernel, LRN, a product with K = 0.
EMPTY_CASES = [
    (helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 2], pads=[1, 0, 1, 1]),
     [0, 3, 7, 7]),
    (helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 2], pads=[1, 0, 1, 1]),
     [0, 3, 7, 7]),
    (helper.make_node("LayerNormalization", ["x", "g"], ["y"], axis=-1), [2, 0, 8]),
    (helper.make_node("LRN", ["x"], ["y"], size=3), [1, 0, 7, 7]),
    (helper.make_node("MatMul", ["x", "w"], ["y"]), [3, 0]),
]


def test_kernels_on_empty_tensors_compute_nothing(tmp_path: Path) -> None:
    # Kernels assume elements: a pool's loop nest ran one image of a 0-image batch, a
    # layer norm and LRN wrote their workspaces' rows into zero-byte outputs (glibc's
    # MALLOC_CHECK_ makes such heap damage fatal), a GEMM tile divided by K = 0. The
    # kernels are IR both backends print alike, so llvm alone is run.
    inits = [numpy_helper.from_array(np.ones(8, np.float32), "g"),
             numpy_helper.from_array(np.ones((0, 5), np.float32), "w")]
    paths = []
    for k, (node, shape) in enumerate(EMPTY_CASES):
        b = GraphBuilder()
        b.add(node, helper.make_node("ReduceSum", ["y"], ["s"], keepdims=0))
        b.consts([i for i in inits if i.name in node.input])
        model = b.model([helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                         for o in ("y", "s")], opset=17, ir_version=None, check=False)
        path = tmp_path / f"{k}_{node.op_type}.onnx"
        path.write_bytes(model.SerializeToString())
        x = np.zeros(shape, np.float32)
        y, total = onnxruntime_outputs(model, {"x": x})
        np.savez(f"{path}.npz", x=x, y=y, s=total)
        paths.append(str(path))
    proc = run_python(EMPTY, "llvm", *paths, env={"MALLOC_CHECK_": "3"}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.count(" ok") == len(EMPTY_CASES), proc.stdout

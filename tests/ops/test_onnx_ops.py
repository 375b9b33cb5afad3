"""Every ONNX op type kiln converts, as a single-node model, against onnxruntime.

Each case is imported with `from_onnx`, legalized (every op lowered to its
PrimFunc) and run by the reference interpreter; the outputs must equal
onnxruntime's. The variants cover the semantics that are easy to get wrong:
pads and auto_pad, ceil_mode, count_include_pad, negative axes, operator
versions across opsets 7-21, integer division and modulo, Resize modes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from kiln import evaluate
from kiln.frontend import from_onnx
from kiln.frontend.onnx.converters.registry import converters
from kiln.transform.legalize_ops import LegalizeOps
from support.graphs import GraphBuilder
from support.reference import ort_session

R = np.random.default_rng(42)


def f(*shape: int, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return R.uniform(low, high, shape).astype(np.float32)


def i(*shape: int, low: int = -9, high: int = 9, dtype: str = "int64") -> np.ndarray:
    return R.integers(low, high, shape).astype(dtype)


def nz(*shape: int, dtype: str = "int32") -> np.ndarray:
    return (R.integers(1, 7, shape) * R.choice([-1, 1], shape)).astype(dtype)


@dataclass
class C:
    op: str
    feeds: dict[str, np.ndarray]                    # graph inputs, in node input order
    attrs: dict[str, Any] = field(default_factory=dict)
    consts: dict[str, np.ndarray] = field(default_factory=dict)   # initializers
    inputs: list[str] | None = None                 # node inputs (default: feeds, consts)
    outputs: int = 1
    opset: int = 17
    id: str = ""
    domain: str = ""                                # "com.microsoft": onnxruntime's contrib ops

    @property
    def name(self) -> str:
        return f"{self.op}-{self.id or 'opset' + str(self.opset)}"

    @property
    def key(self) -> str:
        """The converter registry's name of the op type."""
        return f"{self.domain}.{self.op}" if self.domain else self.op


def i64(*v: int) -> np.ndarray:
    return np.array(v, dtype=np.int64)


X = f(2, 3, 4)
IMG = f(1, 3, 7, 8)

CASES: list[C] = [
    # ---- elementwise
    *[C(op, {"x": X}) for op in ("Abs", "Neg", "Sign", "Exp", "Erf", "Floor", "Ceil", "Sin",
                                 "Cos", "Atan", "Sinh", "Cosh", "Asinh", "Tanh", "Sigmoid",
                                 "Relu", "Softsign", "Softplus", "HardSwish", "Identity")],
    C("Mish", {"x": X}, opset=18),
    *[C(op, {"x": f(5, low=0.1, high=3)}) for op in ("Sqrt", "Log", "Reciprocal")],
    *[C(op, {"x": f(5, low=-0.9, high=0.9)}) for op in ("Asin", "Acos", "Atanh", "Tan")],
    C("Acosh", {"x": f(5, low=1.0, high=3.0)}),
    C("Round", {"x": np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.4], np.float32)}),
    C("LeakyRelu", {"x": X}, {"alpha": 0.3}), C("Elu", {"x": X}, {"alpha": 0.5}),
    C("Selu", {"x": X}), C("Celu", {"x": X}, {"alpha": 2.0}),
    C("HardSigmoid", {"x": X}, {"alpha": 0.3, "beta": 0.6}),
    C("ThresholdedRelu", {"x": X}, {"alpha": 0.4}), C("Shrink", {"x": X}, {"lambd": 1.0,
                                                                          "bias": 0.3}),
    C("Gelu", {"x": X}, opset=20), C("Gelu", {"x": X}, {"approximate": "tanh"}, opset=20,
                                     id="tanh"),
    C("IsNaN", {"x": np.array([1, np.nan, np.inf], np.float32)}),
    C("IsInf", {"x": np.array([1, np.nan, np.inf, -np.inf], np.float32)},
      {"detect_positive": 0}),
    C("Relu", {"x": i(6, dtype="int32")}, opset=14, id="int"),
    C("Abs", {"x": i(6, dtype="int8")}, id="int8"),
    *[C(op, {"a": X, "b": f(4)}) for op in ("Add", "Sub", "Mul", "Max", "Min")],
    C("Div", {"a": X, "b": f(3, 1, low=0.5, high=2)}),
    C("Div", {"a": i(8, dtype="int32"), "b": nz(8)}, id="int-truncates"),
    C("Pow", {"a": f(4, low=0.2, high=2), "b": f(4)}),
    C("Pow", {"a": f(4, low=0.2, high=2), "b": i(4, low=-2, high=3)}, id="int-exponent"),
    C("PRelu", {"x": f(2, 3, 4), "slope": f(3, 1, low=0, high=0.5)}),
    C("Mod", {"a": i(10, dtype="int32"), "b": nz(10)}, id="int-floor"),
    C("Mod", {"a": i(10, dtype="int32"), "b": nz(10)}, {"fmod": 1}, id="int-fmod"),
    C("Mod", {"a": f(8, low=-5, high=5), "b": f(8, low=0.5, high=2)}, {"fmod": 1},
      id="float-fmod"),
    C("Sum", {"a": X, "b": f(4), "c": f(3, 1)}), C("Mean", {"a": X, "b": f(4)}),
    C("Max", {"a": X}, id="single"),
    C("BitShift", {"a": i(5, low=0, high=200, dtype="uint8"), "b": i(5, low=0, high=7,
                                                                   dtype="uint8")},
      {"direction": "LEFT"}),
    C("BitShift", {"a": i(5, low=0, high=200, dtype="uint32"), "b": i(5, low=0, high=9,
                                                                    dtype="uint32")},
      {"direction": "RIGHT"}, id="right"),
    *[C(op, {"a": i(6, dtype="int32"), "b": i(6, dtype="int32")}, opset=18)
      for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")],
    C("BitwiseNot", {"a": i(6, dtype="int16")}, opset=18),
    *[C(op, {"a": i(3, 4, low=0, high=3), "b": i(4, low=0, high=3)})
      for op in ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual")],
    *[C(op, {"a": R.integers(0, 2, (3, 4)).astype(bool), "b": R.integers(0, 2, 4).astype(bool)})
      for op in ("And", "Or", "Xor")],
    C("Not", {"a": R.integers(0, 2, 5).astype(bool)}),
    C("Where", {"c": R.integers(0, 2, (3, 1)).astype(bool), "a": X, "b": f(4)}),
    C("Clip", {"x": X}, {"min": -0.5, "max": 0.5}, opset=6, id="attrs"),
    C("Clip", {"x": X}, consts={"lo": np.array(-0.3, np.float32)}, inputs=["x", "lo"],
      opset=13, id="min-only"),
    C("Clip", {"x": X}, consts={"hi": np.array(0.3, np.float32)}, inputs=["x", "", "hi"],
      opset=13, id="max-only"),
    C("Cast", {"x": X}, {"to": onnx.TensorProto.INT32}),
    C("Cast", {"x": i(5, dtype="int32")}, {"to": onnx.TensorProto.FLOAT16}, id="fp16"),
    C("CastLike", {"x": X, "like": i(1, dtype="int64")}, opset=15),
    # ---- matmul, conv
    C("MatMul", {"a": f(2, 3, 4), "b": f(4, 5)}),
    C("MatMul", {"a": f(4), "b": f(2, 4, 3)}, id="vector"),
    C("Gemm", {"a": f(4, 3), "b": f(5, 4), "c": f(5)}, {"transA": 1, "transB": 1,
                                                        "alpha": 0.5, "beta": 2.0}),
    C("Gemm", {"a": f(3, 4), "b": f(4, 5)}, id="no-c"),
    C("Einsum", {"a": f(2, 3, 4), "b": f(2, 4, 5)}, {"equation": "bij,bjk->bik"}),
    C("Einsum", {"a": f(3, 4, 5)}, {"equation": "ijk->kji"}, id="transpose"),
    C("Einsum", {"a": f(3, 4), "b": f(3, 4)}, {"equation": "ij,ij->j"}, id="reduce"),
    C("Einsum", {"a": f(2, 3, 4), "b": f(4, 5)}, {"equation": "...j,jk"}, id="implicit"),
    C("Conv", {"x": IMG, "w": f(4, 3, 3, 3), "b": f(4)}, {"pads": [1, 1, 1, 1]}),
    # an empty image row: every window is padding, the output the bias
    C("Conv", {"x": f(1, 3, 0, 5), "w": f(4, 3, 1, 3), "b": f(4)}, {"pads": [1, 1, 1, 1]},
      id="empty-row"),
    C("Conv", {"x": IMG, "w": f(4, 3, 3, 2)}, {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
      id="same-upper"),
    C("Conv", {"x": IMG, "w": f(4, 3, 3, 2)}, {"auto_pad": "SAME_LOWER", "strides": [2, 3]},
      id="same-lower"),
    C("Conv", {"x": IMG, "w": f(2, 3, 2, 3)}, {"auto_pad": "VALID", "dilations": [2, 1]},
      id="valid"),
    C("Conv", {"x": f(1, 4, 6, 6), "w": f(4, 1, 3, 3)}, {"group": 4, "pads": [0, 1, 2, 1]},
      id="depthwise"),
    C("Conv", {"x": f(1, 2, 9), "w": f(3, 2, 3)}, {"strides": [2]}, id="1d"),
    C("Conv", {"x": f(1, 1, 4, 4, 4), "w": f(2, 1, 2, 2, 2)}, {"pads": [1, 0, 0, 0, 1, 1]},
      id="3d"),
    C("ConvTranspose", {"x": f(1, 2, 0, 4), "w": f(2, 3, 3, 3), "b": f(3)}, id="empty-row"),
    C("ConvTranspose", {"x": f(1, 2, 3, 4), "w": f(2, 3, 3, 3), "b": f(3)},
      {"strides": [2, 2], "pads": [1, 0, 1, 1], "output_padding": [1, 0]}),
    C("ConvTranspose", {"x": f(1, 2, 3, 3), "w": f(2, 2, 3, 3)},
      {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, id="same-upper"),
    C("ConvTranspose", {"x": f(1, 1, 3, 3), "w": f(1, 2, 3, 3)},
      {"strides": [3, 2], "output_shape": [10, 8]}, id="output-shape"),
    C("ConvTranspose", {"x": f(1, 4, 3, 3), "w": f(4, 1, 2, 2)}, {"group": 2,
                                                                  "dilations": [2, 2]},
      id="group"),
    C("BatchNormalization", {"x": IMG}, {"epsilon": 1e-3},
      consts={"s": f(3, low=0.5, high=1.5), "b": f(3), "m": f(3), "v": f(3, low=0.5,
                                                                           high=1.5)},
      inputs=["x", "s", "b", "m", "v"], opset=15),
    C("BatchNormalization", {"x": f(4, 3)}, consts={"s": f(3), "b": f(3), "m": f(3),
                                                    "v": f(3, low=0.5, high=1.5)},
      inputs=["x", "s", "b", "m", "v"], opset=9, id="2d-opset9"),
    C("InstanceNormalization", {"x": IMG, "s": f(3), "b": f(3)}, {"epsilon": 1e-4}),
    C("LRN", {"x": f(1, 6, 3, 3)}, {"size": 3, "alpha": 0.01, "beta": 0.75, "bias": 2.0}),
    C("LayerNormalization", {"x": X, "s": f(4), "b": f(4)}),
    C("LayerNormalization", {"x": X, "s": f(3, 4)}, {"axis": -2}, id="axis-2"),
    C("GroupNormalization", {"x": f(2, 4, 3, 3), "s": f(4), "b": f(4)}, {"num_groups": 2},
      opset=21),
    C("MeanVarianceNormalization", {"x": IMG}),
    C("RMSNormalization", {"x": X, "s": f(4)}, {"epsilon": 1e-3}, opset=23),
    C("Swish", {"x": X}, {"alpha": 1.5}, opset=24),
    C("LpNormalization", {"x": X}, {"axis": 1, "p": 1}),
    # ---- pooling
    C("MaxPool", {"x": IMG}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
    C("MaxPool", {"x": IMG}, {"kernel_shape": [3, 2], "strides": [2, 2], "ceil_mode": 1},
      id="ceil"),
    C("MaxPool", {"x": IMG}, {"kernel_shape": [2, 2], "auto_pad": "SAME_UPPER",
                              "strides": [2, 2]}, id="same"),
    C("MaxPool", {"x": IMG}, {"kernel_shape": [2, 2], "dilations": [2, 2]}, opset=12,
      id="dilated"),
    C("MaxPool", {"x": i(1, 1, 5, 5, dtype="uint8", low=0, high=250)},
      {"kernel_shape": [2, 2]}, opset=12, id="uint8"),
    C("MaxPool", {"x": f(1, 2, 9)}, {"kernel_shape": [3], "strides": [2]}, id="1d"),
    C("AveragePool", {"x": IMG}, {"kernel_shape": [3, 3], "strides": [2, 2],
                                  "pads": [1, 1, 1, 1]}),
    C("AveragePool", {"x": IMG}, {"kernel_shape": [3, 3], "strides": [2, 2],
                                  "pads": [1, 1, 1, 1], "count_include_pad": 1},
      id="count-include-pad"),
    C("AveragePool", {"x": IMG}, {"kernel_shape": [3, 3], "strides": [2, 2],
                                  "pads": [1, 1, 1, 1], "ceil_mode": 1,
                                  "count_include_pad": 1}, id="ceil-include-pad"),
    C("AveragePool", {"x": IMG}, {"kernel_shape": [3, 2], "auto_pad": "SAME_LOWER"},
      id="same-lower"),
    C("AveragePool", {"x": f(1, 1, 4, 4, 4)}, {"kernel_shape": [2, 2, 2]}, id="3d"),
    C("LpPool", {"x": IMG}, {"kernel_shape": [2, 2], "p": 3}, opset=18),
    C("GlobalAveragePool", {"x": IMG}), C("GlobalMaxPool", {"x": IMG}),
    # ---- reductions, softmax
    C("ReduceSum", {"x": X}, consts={"axes": i64(-1)}, inputs=["x", "axes"], opset=13),
    C("ReduceSum", {"x": X}, {"axes": [0, -1], "keepdims": 0}, opset=11, id="attr-axes"),
    C("ReduceSum", {"x": X}, {"noop_with_empty_axes": 1}, opset=13, id="noop"),
    C("ReduceMean", {"x": X}, {"axes": [1]}, opset=13),
    C("ReduceMean", {"x": X}, consts={"axes": i64(0, 2)}, inputs=["x", "axes"], opset=18,
      id="axes-input"),
    C("ReduceMax", {"x": X}, {"keepdims": 0}, opset=13),
    C("ReduceMin", {"x": X}, {"axes": [-2]}, opset=13),
    C("ReduceProd", {"x": f(2, 3, low=0.5, high=1.5)}, {"axes": [1]}, opset=13),
    C("ReduceL1", {"x": X}, {"axes": [2]}, opset=13),
    C("ReduceL2", {"x": X}, {"axes": [2]}, opset=13),
    C("ReduceSumSquare", {"x": X}, {"axes": [0]}, opset=13),
    C("ReduceLogSum", {"x": f(2, 3, low=0.1, high=2)}, {"axes": [1]}, opset=13),
    C("ReduceLogSumExp", {"x": X}, {"axes": [1], "keepdims": 0}, opset=13),
    C("ArgMax", {"x": X}, {"axis": -1}), C("ArgMin", {"x": X}, {"axis": 1, "keepdims": 0}),
    C("ArgMax", {"x": np.array([[1, 5, 5], [2, 0, 2]], np.float32)},
      {"axis": 1, "select_last_index": 1}, id="last"),
    C("Hardmax", {"x": X}, {"axis": 1}, opset=13),
    C("Hardmax", {"x": X}, {"axis": 1}, opset=11, id="coerced-2d"),
    C("Softmax", {"x": X}, {"axis": 1}, opset=13),
    C("Softmax", {"x": X}, {"axis": 1}, opset=11, id="coerced-2d"),
    C("LogSoftmax", {"x": X}, {"axis": -1}, opset=13),
    C("CumSum", {"x": X}, {"exclusive": 1, "reverse": 1}, consts={"axis": i64(1)},
      inputs=["x", "axis"]),
    C("CumProd", {"x": f(2, 5, low=0.5, high=1.5)}, {"exclusive": 1},
      consts={"axis": i64(-1)}, inputs=["x", "axis"], opset=26),
    C("TopK", {"x": f(3, 6)}, {"axis": 1}, consts={"k": i64(3)}, inputs=["x", "k"],
      outputs=2, opset=11),
    C("TopK", {"x": np.array([[1, 3, 3, 2], [5, 5, 5, 0]], np.int32)}, {"largest": 0},
      consts={"k": i64(3)}, inputs=["x", "k"], outputs=2, opset=11, id="smallest-ties"),
    C("TopK", {"x": f(4, 3)}, {"k": 2, "axis": 0}, outputs=2, opset=9, id="opset9"),
    C("TopK", {"x": f(3, 6), "k": i64(4)}, {"axis": 1}, outputs=2, opset=11, id="run-time-k"),
    # ---- data-dependent sizes (kiln.ops.data_dependent)
    C("NonZero", {"x": np.array([[0, 1.5, 0], [2, 0, -1]], np.float32)}),
    C("NonZero", {"x": np.zeros((2, 2), np.float32)}, id="none"),
    C("Compress", {"x": X, "c": np.array([True, False, True])}, {"axis": 1}),
    C("Compress", {"x": X, "c": np.array([False, True, True, False, True])}, id="flat"),
    C("Unique", {"x": np.array([2, 1, 2, 0, 1, 2], np.float32)}, outputs=4, opset=11),
    C("Unique", {"x": np.array([[1, 2], [0, 0], [1, 2]], np.float32)}, {"axis": 0, "sorted": 0},
      outputs=4, opset=11, id="axis-unsorted"),
    C("NonMaxSuppression", {"b": np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [2, 2, 3, 3]]],
                                          np.float32),
                            "s": np.array([[[0.9, 0.8, 0.7]]], np.float32)},
      consts={"m": i64(3), "iou": np.array([0.5], np.float32)},
      inputs=["b", "s", "m", "iou"], opset=11),
    # ---- shape manipulation
    C("Reshape", {"x": X}, consts={"s": i64(4, 0, -1)}, inputs=["x", "s"]),
    C("Flatten", {"x": X}, {"axis": -1}),
    C("Transpose", {"x": X}, {"perm": [2, 0, 1]}), C("Transpose", {"x": X}, id="default"),
    C("Concat", {"a": X, "b": f(2, 1, 4)}, {"axis": -2}),
    C("Split", {"x": f(2, 6)}, {"axis": 1}, consts={"s": i64(2, 4)}, inputs=["x", "s"],
      outputs=2, opset=13),
    C("Split", {"x": f(2, 7)}, {"axis": 1, "num_outputs": 3}, outputs=3, opset=18,
      id="num-outputs"),
    C("Split", {"x": f(6, 2)}, outputs=3, opset=11, id="equal"),
    C("Slice", {"x": X}, consts={"s": i64(1, -1), "e": i64(100, -4), "a": i64(1, -1),
                                 "st": i64(1, -2)}, inputs=["x", "s", "e", "a", "st"]),
    C("Slice", {"x": X}, {"starts": [0], "ends": [1], "axes": [0]}, opset=9, id="opset9"),
    C("Squeeze", {"x": f(2, 1, 3, 1)}, consts={"a": i64(-1)}, inputs=["x", "a"]),
    C("Squeeze", {"x": f(2, 1, 3, 1)}, opset=11, id="all"),
    C("Unsqueeze", {"x": f(2, 3)}, consts={"a": i64(-1, 0)}, inputs=["x", "a"]),
    C("Unsqueeze", {"x": f(2, 3)}, {"axes": [1]}, opset=11, id="attr"),
    C("Gather", {"x": X, "i": i64(0, -1, 1)}, {"axis": 1}),
    C("GatherElements", {"x": f(3, 3), "i": np.array([[1, -1, 0]], np.int64)}, {"axis": 0}),
    C("GatherND", {"x": f(2, 3, 4), "i": np.array([[[1], [0]], [[2], [-1]]], np.int64)},
      {"batch_dims": 1}),
    C("ScatterElements", {"x": f(3, 4), "i": np.array([[1, 0, 2], [0, 2, 1]], np.int64),
                          "u": f(2, 3)}, {"axis": 0}),
    C("ScatterElements", {"x": f(3, 4), "i": np.array([[1, 1], [-1, 0]], np.int64),
                          "u": f(2, 2)}, {"axis": 1, "reduction": "add"}, opset=18, id="add"),
    C("Scatter", {"x": f(3, 4), "i": np.array([[1, 0, 2]], np.int64), "u": f(1, 3)},
      {"axis": 0}, opset=9),
    C("ScatterND", {"x": f(4, 3), "i": np.array([[1], [3]], np.int64), "u": f(2, 3)}),
    C("ScatterND", {"x": f(2, 3), "i": np.array([[0, 1], [1, 2]], np.int64), "u": f(2)},
      {"reduction": "max"}, opset=18, id="max"),
    C("ReverseSequence", {"x": f(4, 2, 3), "l": np.array([3, 1], np.int64)},
      {"batch_axis": 1, "time_axis": 0}),
    C("CenterCropPad", {"x": f(5, 4, 3)}, consts={"s": i64(3, 7)}, inputs=["x", "s"],
      attrs={"axes": [0, 1]}, opset=18),
    C("Expand", {"x": f(3, 1)}, consts={"s": i64(2, 1, 4)}, inputs=["x", "s"]),
    C("Tile", {"x": f(2, 3)}, consts={"r": i64(2, 2)}, inputs=["x", "r"]),
    C("Pad", {"x": f(3, 4)}, {"mode": "reflect"}, consts={"p": i64(1, 2, 2, 1)},
      inputs=["x", "p"]),
    C("Pad", {"x": f(3, 4)}, {"mode": "edge"}, consts={"p": i64(2, 0, 1, 3)},
      inputs=["x", "p"], id="edge"),
    C("Pad", {"x": f(3, 4)}, consts={"p": i64(1, 1), "v": np.array(2.5, np.float32),
                                     "ax": i64(-1)}, inputs=["x", "p", "v", "ax"], opset=18,
      id="axes"),
    C("Pad", {"x": f(3, 4)}, {"pads": [0, 1, 1, 0], "value": 1.0}, opset=2, id="opset2"),
    # negative pads crop (sliced off before the other sides are padded)
    C("Pad", {"x": f(3, 5)}, {"mode": "reflect"}, consts={"p": i64(-1, 2, 1, -2)},
      inputs=["x", "p"], id="negative-reflect"),
    # an axis cropped to nothing, then padded with the constant
    C("Pad", {"x": f(2, 3)}, consts={"p": i64(0, -3, 0, 2)}, inputs=["x", "p"],
      id="crop-all"),
    C("Pad", {"x": f(0, 3)}, consts={"p": i64(1, 0, 2, 0)}, inputs=["x", "p"], id="empty"),
    # an empty axis left unpadded: nothing to read, an empty result
    C("Pad", {"x": f(0, 4)}, {"mode": "reflect"}, consts={"p": i64(0, 2, 0, 1)},
      inputs=["x", "p"], id="reflect-empty"),
    C("Trilu", {"x": f(4, 5)}, consts={"k": i64(1)}, inputs=["x", "k"], opset=14),
    C("Trilu", {"x": f(3, 4, 4)}, {"upper": 0}, opset=14, id="lower"),
    C("DepthToSpace", {"x": f(1, 8, 2, 3)}, {"blocksize": 2}),
    C("DepthToSpace", {"x": f(1, 8, 2, 3)}, {"blocksize": 2, "mode": "CRD"}, id="crd"),
    C("SpaceToDepth", {"x": f(1, 2, 4, 6)}, {"blocksize": 2}),
    C("OneHot", {"i": i64(0, 2, -1)}, {"axis": 0}, consts={"d": i64(4), "v": np.array(
        [-1.0, 3.0], np.float32)}, inputs=["i", "d", "v"]),
    C("EyeLike", {"x": f(3, 4)}, {"k": 1}),
    C("Shape", {"x": X}, {"start": 1}, opset=15), C("Size", {"x": X}),
    C("ConstantOfShape", {}, {"value": numpy_helper.from_array(np.array([1.5], np.float32))},
      consts={"s": i64(2, 3)}, inputs=["s"]),
    C("Range", {}, consts={"a": np.array(1.0, np.float32), "b": np.array(3.0, np.float32),
                           "d": np.array(0.5, np.float32)}, inputs=["a", "b", "d"]),
    C("Constant", {}, {"value": numpy_helper.from_array(np.arange(4, dtype=np.int32))},
      inputs=[]),
    C("Dropout", {"x": X}, {"ratio": 0.3}, opset=10),
    C("Dropout", {"x": X}, outputs=2, opset=13, id="mask"),
    # ---- resize
    C("Resize", {"x": f(1, 1, 3, 4)}, {"mode": "linear"},
      consts={"sc": np.array([1, 1, 2.0, 1.5], np.float32)}, inputs=["x", "", "sc"], opset=13),
    C("Resize", {"x": f(1, 1, 4, 4)}, {"mode": "nearest", "nearest_mode": "ceil",
                                       "coordinate_transformation_mode": "asymmetric"},
      consts={"sz": i64(1, 1, 7, 3)}, inputs=["x", "", "", "sz"], opset=13, id="nearest-ceil"),
    C("Resize", {"x": f(1, 1, 4, 4)}, {"mode": "nearest",
                                       "coordinate_transformation_mode": "align_corners",
                                       "nearest_mode": "round_prefer_ceil"},
      consts={"sz": i64(1, 1, 6, 5)}, inputs=["x", "", "", "sz"], opset=13, id="align"),
    C("Resize", {"x": f(1, 1, 3, 5)}, {"mode": "nearest",
                                       "coordinate_transformation_mode": "tf_half_pixel_for_nn"},
      consts={"roi": np.zeros(0, np.float32), "sc": np.array([1, 1, 2.5, 0.6], np.float32)},
      inputs=["x", "roi", "sc"], opset=11, id="tf-half-pixel-nn"),
    C("BatchNormalization", {"x": f(2, 3, 2, 2)}, {"spatial": 0},
      consts={"s": f(3, 2, 2), "b": f(3, 2, 2), "m": f(3, 2, 2), "v": f(3, 2, 2, low=0.5,
                                                                         high=1.5)},
      inputs=["x", "s", "b", "m", "v"], opset=7, id="spatial0-opset7"),
    C("Resize", {"x": f(1, 1, 4, 4)}, {"mode": "cubic",
                                       "coordinate_transformation_mode": "pytorch_half_pixel"},
      consts={"sc": np.array([1, 1, 0.6, 1.7], np.float32)}, inputs=["x", "", "sc"], opset=13,
      id="cubic"),
    C("Resize", {"x": f(1, 1, 4, 4)}, {"mode": "linear",
                                       "coordinate_transformation_mode": "tf_crop_and_resize",
                                       "extrapolation_value": 5.0},
      consts={"roi": np.array([0, 0, 0.1, -0.2, 1, 1, 0.8, 1.1], np.float32),
              "sz": i64(1, 1, 3, 5)}, inputs=["x", "roi", "", "sz"], opset=13, id="crop"),
    C("Resize", {"x": f(1, 1, 8, 8)}, {"mode": "linear", "antialias": 1},
      consts={"sc": np.array([1, 1, 0.5, 0.4], np.float32)}, inputs=["x", "", "sc"],
      opset=18, id="antialias"),
    C("Resize", {"x": f(1, 1, 2, 3)}, {"mode": "nearest"},
      consts={"sc": np.array([1, 1, 2, 3], np.float32)}, inputs=["x", "sc"], opset=10,
      id="opset10"),
    C("Upsample", {"x": f(1, 1, 2, 3)}, {"mode": "nearest"},
      consts={"sc": np.array([1, 1, 2, 3], np.float32)}, inputs=["x", "sc"], opset=9),
    C("Upsample", {"x": f(1, 1, 2, 3)}, {"mode": "linear", "scales": [1.0, 1.0, 2.0, 2.0]},
      opset=7, id="linear-opset7"),
    # Recurrent ops: the full matrix is in tests/frontend/test_recurrent.py.
    C("LSTM", {"x": f(3, 2, 4)}, {"hidden_size": 3},
      consts={"W": f(1, 12, 4), "R": f(1, 12, 3), "B": f(1, 24)}, outputs=3),
    C("GRU", {"x": f(3, 2, 4)}, {"hidden_size": 3, "linear_before_reset": 1},
      consts={"W": f(1, 9, 4), "R": f(1, 9, 3), "B": f(1, 18)}, outputs=2),
    C("RNN", {"x": f(3, 2, 4)}, {"hidden_size": 3, "direction": "bidirectional"},
      consts={"W": f(2, 3, 4), "R": f(2, 3, 3)}, outputs=2),
]


def _u8(*shape: int) -> np.ndarray:
    return R.integers(0, 256, shape).astype(np.uint8)


def _s8(*shape: int) -> np.ndarray:
    return R.integers(-128, 128, shape).astype(np.int8)


def _weights7(*shape: int) -> np.ndarray:
    """int8 weights of a u8 x s8 product within 7 bits (as onnxruntime's quantizer
    writes them with `reduce_range`): onnxruntime's AVX2 kernels add pairs of products
    into a saturating int16 (255 x -128 x 2 does not fit), which these cases of the
    conversion must not depend on; tests/quantization/test_int8_pairs.py covers it."""
    return R.integers(-64, 64, shape).astype(np.int8)


def _qp(scale: float, zp: int, dtype: type = np.uint8) -> tuple[np.ndarray, np.ndarray]:
    return np.array(scale, np.float32), np.array(zp, dtype)


MS = "com.microsoft"
# Quantized operators (docs/quantization.md); models written by onnxruntime's quantizer
# are checked in tests/quantization. Halfway values (x / scale = k + 0.5) check that
# rounding is half to even.
_HALF = (np.arange(-24, 24, dtype=np.float32) * 0.25).reshape(2, 3, 8)
CASES += [
    C("QuantizeLinear", {"x": _HALF}, consts={"s": np.array(0.5, np.float32),
                                              "z": np.array(3, np.uint8)}, opset=13),
    C("QuantizeLinear", {"x": f(2, 3, 4, low=-40, high=40)}, {"axis": 1},
      consts={"s": np.array([0.1, 0.25, 0.3], np.float32), "z": np.array([0, -3, 5], np.int8)},
      opset=13, id="axis"),
    C("QuantizeLinear", {"x": f(2, 3, 4)}, consts={"s": np.array(0.02, np.float32)},
      inputs=["x", "s"], opset=10, id="no-zero-point"),
    C("QuantizeLinear", {"x": f(2, 6, low=-30, high=30)}, {"axis": 1, "block_size": 4},
      consts={"s": np.array([[0.1, 0.2], [0.3, 0.05]], np.float32),
              "z": np.array([[1, -2], [0, 4]], np.int8)}, opset=21, id="blocked"),
    C("DequantizeLinear", {"x": _s8(2, 3, 4)}, {"axis": 1},
      consts={"s": np.array([0.1, 0.25, 0.3], np.float32), "z": np.array([0, -3, 5], np.int8)},
      opset=13, id="axis"),
    C("DequantizeLinear", {"x": R.integers(-9999, 9999, (6,)).astype(np.int32)},
      consts={"s": np.array(0.001, np.float32)}, inputs=["x", "s"], opset=13, id="int32"),
    C("DynamicQuantizeLinear", {"x": f(3, 5)}, outputs=3, opset=11),
    C("MatMulInteger", {"a": _u8(2, 3, 5)},
      consts={"b": _weights7(5, 4), "az": np.array(7, np.uint8),
              "bz": np.array([1, -2, 0, 3], np.int8)}, opset=10),
    C("ConvInteger", {"x": _u8(1, 2, 5, 5)}, {"pads": [1, 1, 1, 1]},
      consts={"w": _u8(3, 2, 3, 3), "xz": np.array(12, np.uint8)}, opset=10),
    C("QLinearConv", {"x": _u8(1, 4, 6, 6)}, {"pads": [1, 0, 1, 2], "strides": [2, 1],
                                              "group": 2},
      consts={"xs": np.array(0.05, np.float32), "xz": np.array(120, np.uint8),
              "w": _weights7(4, 2, 3, 3), "ws": np.array([0.01, 0.02, 0.015, 0.03], np.float32),
              "wz": np.zeros(4, np.int8), "ys": np.array(0.2, np.float32),
              "yz": np.array(100, np.uint8),
              "b": R.integers(-500, 500, (4,)).astype(np.int32)},
      inputs=["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], opset=10),
    C("QLinearMatMul", {"a": _u8(2, 4, 6)},
      consts={"as": np.array(0.03, np.float32), "az": np.array(128, np.uint8),
              "b": _weights7(6, 5), "bs": np.array(0.02, np.float32), "bz": np.array(0, np.int8),
              "ys": np.array(0.05, np.float32), "yz": np.array(10, np.uint8)},
      inputs=["a", "as", "az", "b", "bs", "bz", "ys", "yz"], opset=10),
    C("QGemm", {"a": _u8(3, 6)}, {"transB": 1, "alpha": 0.5}, domain=MS,
      consts={"as": np.array(0.03, np.float32), "az": np.array(128, np.uint8),
              "b": _weights7(5, 6), "bs": np.array([0.02, 0.01, 0.03, 0.02, 0.05], np.float32),
              "bz": np.zeros(5, np.int8), "c": R.integers(-300, 300, (5,)).astype(np.int32),
              "ys": np.array(0.04, np.float32), "yz": np.array(100, np.uint8)},
      inputs=["a", "as", "az", "b", "bs", "bz", "c", "ys", "yz"], opset=13),
    C("QGemm", {"a": _u8(3, 6)}, domain=MS,
      consts={"as": np.array(0.03, np.float32), "az": np.array(128, np.uint8),
              "b": _weights7(6, 5), "bs": np.array(0.02, np.float32), "bz": np.array(0, np.int8)},
      inputs=["a", "as", "az", "b", "bs", "bz"], opset=13, id="float-output"),
    C("QLinearAdd", {"a": _u8(2, 3, 4)}, domain=MS,
      consts={"as": np.array(0.04, np.float32), "az": np.array(120, np.uint8),
              "b": _u8(3, 4), "bs": np.array(0.03, np.float32), "bz": np.array(130, np.uint8),
              "cs": np.array(0.08, np.float32), "cz": np.array(125, np.uint8)},
      inputs=["a", "as", "az", "b", "bs", "bz", "cs", "cz"], opset=13),
    C("QLinearMul", {"a": _s8(2, 3, 4)}, domain=MS,
      consts={"as": np.array(0.04, np.float32), "az": np.array(1, np.int8),
              "b": _s8(4), "bs": np.array(0.03, np.float32), "bz": np.array(-2, np.int8),
              "cs": np.array(0.5, np.float32), "cz": np.array(3, np.int8)},
      inputs=["a", "as", "az", "b", "bs", "bz", "cs", "cz"], opset=13),
    C("QLinearGlobalAveragePool", {"x": _u8(1, 3, 5, 4)}, {"channels_last": 0}, domain=MS,
      consts={"xs": np.array(0.05, np.float32), "xz": np.array(128, np.uint8),
              "ys": np.array(0.02, np.float32), "yz": np.array(100, np.uint8)},
      inputs=["x", "xs", "xz", "ys", "yz"], opset=13),
    C("QLinearAveragePool", {"x": _u8(1, 3, 6, 6)}, {"kernel_shape": [2, 2], "strides": [2, 2]},
      domain=MS, consts={"xs": np.array(0.05, np.float32), "xz": np.array(128, np.uint8),
                         "ys": np.array(0.05, np.float32), "yz": np.array(128, np.uint8)},
      inputs=["x", "xs", "xz", "ys", "yz"], opset=13),
    C("QLinearConcat", {"a": _u8(1, 2, 3), "b": _u8(1, 3, 3)}, {"axis": 1}, domain=MS,
      consts={"ys": np.array(0.1, np.float32), "yz": np.array(128, np.uint8),
              "as": np.array(0.1, np.float32), "az": np.array(128, np.uint8),
              "bs": np.array(0.05, np.float32), "bz": np.array(100, np.uint8)},
      inputs=["ys", "yz", "a", "as", "az", "b", "bs", "bz"], opset=13),
    C("QLinearSoftmax", {"x": _u8(2, 3, 9)}, {"axis": -1, "opset": 13}, domain=MS,
      consts={"xs": np.array(0.173, np.float32), "xz": np.array(97, np.uint8),
              "ys": np.array(1 / 256, np.float32), "yz": np.array(0, np.uint8)},
      inputs=["x", "xs", "xz", "ys", "yz"], opset=13),
    C("QLinearWhere", {"c": R.random((3, 5)) < 0.5, "x": _u8(3, 5), "y": _u8(5)}, domain=MS,
      consts={"xs": np.array(0.05, np.float32), "xz": np.array(120, np.uint8),
              "ys": np.array(0.07, np.float32), "yz": np.array(3, np.uint8),
              "zs": np.array(0.05, np.float32), "zz": np.array(120, np.uint8)},
      inputs=["c", "x", "xs", "xz", "y", "ys", "yz", "zs", "zz"], opset=13),
    C("QLinearSigmoid", {"x": _u8(2, 7)}, domain=MS,
      consts={"xs": np.array(0.05, np.float32), "xz": np.array(128, np.uint8),
              "ys": np.array(1 / 256, np.float32), "yz": np.array(0, np.uint8)},
      inputs=["x", "xs", "xz", "ys", "yz"], opset=13),
    C("QLinearLeakyRelu", {"x": _s8(2, 7)}, {"alpha": 0.1}, domain=MS,
      consts={"xs": np.array(0.05, np.float32), "xz": np.array(-5, np.int8),
              "ys": np.array(0.04, np.float32), "yz": np.array(-20, np.int8)},
      inputs=["x", "xs", "xz", "ys", "yz"], opset=13),
]

# ONNX op types whose semantics onnxruntime does not implement as kiln's node-suite
# reference (checked there instead): none today.
IDS = [c.name for c in CASES]


def _model(case: C) -> onnx.ModelProto:
    node_inputs = case.inputs if case.inputs is not None else [*case.feeds, *case.consts]
    outs = [f"y{k}" for k in range(case.outputs)]
    b = GraphBuilder()
    b.node(case.op, node_inputs, outs, domain=case.domain or None, **case.attrs)
    b.inputs_for(case.feeds)
    b.consts(case.consts)
    for o in outs:
        b.output(o, typed=False)
    opsets = {"": case.opset, **({case.domain: 1} if case.domain else {})}
    # Unchecked: onnx knows no schema of the com.microsoft ops, so their outputs stay untyped.
    return b.model(opset=opsets, infer_outputs=True, check=False)


# Op types compared with onnxruntime on grids of their own cases in
# tests/frontend/test_onnx_composed_ops.py (built from other kiln ops).
COMPARED_ELSEWHERE = {
    "Col2Im", "DeformConv", "Det", "GridSample", "MaxUnpool", "MelWeightMatrix",
    "TensorScatter", "TfIdfVectorizer", "ai.onnx.ml.ArrayFeatureExtractor",
    "ai.onnx.ml.Binarizer", "ai.onnx.ml.TreeEnsemble",
    # models quantized by onnxruntime itself (tests/quantization/test_dynamic_lstm.py)
    "com.microsoft.DynamicQuantizeLSTM",
    # the LLM exporters' ops, compiled for llvm and c (tests/frontend/test_contrib_llm_ops.py)
    "SimplifiedLayerNormalization", "com.microsoft.MatMulNBits",
    "com.microsoft.RotaryEmbedding", "com.microsoft.SkipLayerNormalization",
    "com.microsoft.SkipSimplifiedLayerNormalization", "com.microsoft.GroupQueryAttention",
    "com.microsoft.GatherBlockQuantized", "com.microsoft.MultiHeadAttention"}


def test_every_converted_op_type_has_a_case() -> None:
    covered = {c.key for c in CASES} | COMPARED_ELSEWHERE
    missing = sorted(set(converters().names()) - covered)
    assert not missing, f"ONNX op types without an onnxruntime comparison: {missing}"


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_op_matches_onnxruntime(case: C) -> None:
    model = _model(case)
    session = ort_session(model)
    want = session.run(None, dict(case.feeds))
    mod = LegalizeOps()(from_onnx(model))
    got = evaluate(mod, "main", *case.feeds.values())
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(want)
    for g_, w in zip(got, want):
        assert g_.dtype == w.dtype and g_.shape == w.shape
        if w.dtype.kind == "f":
            tol = 1e-3 if w.dtype.itemsize == 2 else 1e-5
            np.testing.assert_allclose(g_, w, rtol=tol, atol=tol)
        else:
            np.testing.assert_array_equal(g_, w)

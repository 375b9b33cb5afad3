"""Models quantized by onnxruntime's own quantizer, and the comparison the tests use.

`quantize_static_model` runs `onnxruntime.quantization.quant_pre_process` (BatchNorm
folded into the convolutions, as deployments do) and `quantize_static` with a
calibration reader over random inputs; `quantize_dynamic_model` runs
`quantize_dynamic`. `integer_outputs` removes the DequantizeLinear nodes in front of
a QDQ model's outputs, so the model returns its quantized tensors (compared element
by element, in quanta).

`like_onnxruntime(target)` is the kiln target whose integer products equal this host's
onnxruntime: on an x86 host without VNNI, MLAS's u8 x s8 kernels (AVX2 and AVX-512BW:
`vpmaddubsw`) add pairs of products into a saturating int16, so the tests that compare
with onnxruntime there compile with `int8-pairs=saturate` (docs/quantization.md).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)
from onnxruntime.quantization.shape_inference import quant_pre_process

from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

#: Relative L2 error allowed on dequantized (float) outputs vs onnxruntime's int8 run.
MAX_REL_L2 = 1e-2
#: Integer outputs: equal, or one quantum apart on at most this share of the elements.
MAX_OFF_BY_ONE = 1e-3


#: onnxruntime's graph transformer that runs a QDQ model's int8 activations as uint8
#: (shifted by 128) on x86; in the groups it then fuses into its QLinearConv the shifted
#: bytes saturate too, in the others (kept as float Conv) they do not.
S8_TO_U8 = "QDQS8ToU8Transformer"


def onnxruntime_int8_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                             activations: str = "uint8") -> list[np.ndarray]:
    """`model`'s outputs as this host's onnxruntime computes them (its default session),
    for the kiln build `like_onnxruntime` gives. With int8 activations, which groups
    onnxruntime fuses and which of its products saturate follow its `S8_TO_U8`
    transformer, which kiln reproduces (kiln.ops.quant_ort, docs/quantization.md)."""
    del activations  # every activation type: the default session
    return onnxruntime_outputs(model, feeds)


class RandomReader(CalibrationDataReader):
    """`count` batches of standard-normal inputs for `model` (a seeded generator)."""

    def __init__(self, model: onnx.ModelProto, count: int = 4, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        shapes = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
                  for vi in model.graph.input}
        self.batches = iter([{n: rng.standard_normal(s).astype(np.float32)
                              for n, s in shapes.items()} for _ in range(count)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


def quantize_static_model(model: onnx.ModelProto, fmt: str, per_channel: bool = True,
                          activations: str = "uint8") -> onnx.ModelProto:
    """`model` quantized by onnxruntime (`fmt` "QDQ" or "QOperator"; int8 weights,
    `activations` uint8 (asymmetric) or int8 (symmetric))."""
    with tempfile.TemporaryDirectory() as tmp:
        src, pre, out = (Path(tmp) / n for n in ("float.onnx", "pre.onnx", "q.onnx"))
        onnx.save(model, src)
        quant_pre_process(str(src), str(pre))
        signed = activations == "int8"
        quantize_static(str(pre), str(out), RandomReader(model),
                        quant_format=QuantFormat.QDQ if fmt == "QDQ" else QuantFormat.QOperator,
                        per_channel=per_channel,
                        activation_type=QuantType.QInt8 if signed else QuantType.QUInt8,
                        weight_type=QuantType.QInt8,
                        extra_options={"ActivationSymmetric": signed})
        return onnx.load(str(out))


def quantize_dynamic_model(model: onnx.ModelProto, **options: object) -> onnx.ModelProto:
    """`model` with its matrix products (and LSTMs) dynamically quantized by onnxruntime,
    int8 weights unless `options` (quantize_dynamic's keywords) say otherwise."""
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "float.onnx", Path(tmp) / "q.onnx"
        onnx.save(model, src)
        quantize_dynamic(str(src), str(out), **{"weight_type": QuantType.QInt8, **options})
        return onnx.load(str(out))


def integer_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` returning the quantized tensors its final DequantizeLinear nodes read."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    producers = {o: n for n in graph.node for o in n.output}
    for vi in graph.output:
        node = producers[vi.name]
        assert node.op_type == "DequantizeLinear", node.op_type
        zp = next(i for i in graph.initializer if i.name == node.input[2])
        graph.node.remove(node)
        for n in graph.node:
            for k, name in enumerate(n.output):
                if name == node.input[0]:
                    n.output[k] = vi.name
        vi.type.tensor_type.elem_type = zp.data_type
    return out


def check_integer(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Equal, or one quantum apart on at most MAX_OFF_BY_ONE of the elements."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 1, f"{what}: off by {diff.max()} quanta"
    share = float((diff > 0).mean())
    assert share <= MAX_OFF_BY_ONE, f"{what}: {share:.2%} of the elements are one quantum off"


# A dynamically quantized recurrent net against onnxruntime: kiln's float steps (scales,
# gate sums, activations) agree with onnxruntime's to an ulp or two, not bit for bit on
# every ISA (AVX-512 hosts run other MLAS kernels than AVX2 ones), and each step
# requantizes h on its own range, so now and then an ulp moves one element of h across a
# rounding boundary and its row's later outputs move by about a quantum times the gate's
# slope (2.6e-4 seen on a Zen 4). A wrong scale, zero point or row order is 1e-2 or more.
RECURRENT_REL_L2 = 1e-3


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got.astype(np.float64) - want)
                 / max(np.linalg.norm(want.astype(np.float64)), 1e-30))


def qlinear_conv_model(shape: tuple[int, int, int, int], oc: int, k: int, stride: int,
                       pad: int | tuple[int, int, int, int], signed: bool,
                       rng: np.random.Generator, group: int = 1, w_zero: int = 0,
                       dilation: int = 1) -> onnx.ModelProto:
    """One QLinearConv: random int8 weights with per-channel scales (zero point `w_zero`),
    u8 or s8 activations, an int32 bias, `group` groups; `pad` one for every side or ONNX's
    (top, left, bottom, right)."""
    n, c, h, w = shape
    pads = [pad] * 4 if isinstance(pad, int) else list(pad)
    q = np.int8 if signed else np.uint8
    ty = TensorProto.INT8 if signed else TensorProto.UINT8
    consts = {"xs": np.float32(0.02), "xz": q(-3 if signed else 131),
              "w": rng.integers(-128, 128, (oc, c // group, k, k)).astype(np.int8),
              "ws": rng.uniform(0.005, 0.02, oc).astype(np.float32),
              "wz": np.full(oc, w_zero, np.int8),
              "ys": np.float32(0.0002 * np.sqrt(c // group * k * k) * 40),
              "yz": q(5 if signed else 128),
              "b": rng.integers(-5000, 5000, oc).astype(np.int32)}
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                            ["y"], strides=[stride, stride], pads=pads, group=group,
                            dilations=[dilation, dilation])
    span = dilation * (k - 1) + 1
    out = [n, oc, (h + pads[0] + pads[2] - span) // stride + 1,
           (w + pads[1] + pads[3] - span) // stride + 1]
    b = GraphBuilder()
    b.add(node)
    b.input("x", list(shape), ty)
    b.output("y", out, ty)
    b.consts(consts)
    return b.model(opset=13)

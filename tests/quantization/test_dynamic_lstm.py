"""LSTMs quantized by onnxruntime's `quantize_dynamic` (com.microsoft DynamicQuantizeLSTM,
kiln.frontend.onnx.converters.quant_recurrent) against onnxruntime.

`quantize_dynamic` stores W and R as int8 or uint8 with a scale per direction or per
column and runs both products on integers: X of every step quantized once, each step's
h quantized on its own range. kiln unrolls the node like LSTM with those products on
its integer kernels; with the host's onnxruntime products (`like_onnxruntime`: on AVX2
without VNNI, the saturating pairs that full-range int8 weights reach) the outputs agree
to float rounding or a quantum of h now and then (RECURRENT_REL_L2), against a
one-thread session (onnxruntime quantizes the parts of a batch its threads take on
their own ranges). A forward LSTM with its bias, a
bidirectional one with initial states and peepholes, and one with sequence lengths
(onnxruntime's order of rows: kiln.frontend.onnx.converters.recurrent.unroll);
per-tensor and per-column scales, int8 and uint8 weights; llvm and c.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import kiln
from kiln.errors import KilnError
from kiln.frontend import from_onnx
from quantization.quantized_models import RECURRENT_REL_L2, quantize_dynamic_model, rel_l2
from support.graphs import GraphBuilder
from support.reference import like_onnxruntime, onnxruntime_outputs

onnxruntime = pytest.importorskip("onnxruntime")
from onnxruntime.quantization import QuantType  # noqa: E402

SEQ, BATCH, IN, HIDDEN = 4, 3, 6, 8


def _model() -> tuple[object, dict[str, np.ndarray]]:
    rng = np.random.default_rng(11)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.4).astype(np.float32)

    b = GraphBuilder()
    b.consts({"W": weights(1, 4 * HIDDEN, IN), "R": weights(1, 4 * HIDDEN, HIDDEN),
              "B": weights(1, 8 * HIDDEN),
              "W2": weights(2, 4 * HIDDEN, IN), "R2": weights(2, 4 * HIDDEN, HIDDEN),
              "P2": weights(2, 3 * HIDDEN),
              "W3": weights(2, 4 * HIDDEN, IN), "R3": weights(2, 4 * HIDDEN, HIDDEN),
              "W4": weights(1, 4 * HIDDEN, IN), "R4": weights(1, 4 * HIDDEN, HIDDEN),
              "lens": np.asarray([SEQ, 2, 3], np.int32)})
    b.node("LSTM", ["x", "W", "R", "B"], ["y", "yh", "yc"], hidden_size=HIDDEN)
    b.node("LSTM", ["x", "W2", "R2", "", "", "h0", "c0", "P2"], ["y2", "yh2"],
           hidden_size=HIDDEN, direction="bidirectional")
    b.node("LSTM", ["x", "W3", "R3", "", "lens"], ["y3"], hidden_size=HIDDEN,
           direction="bidirectional")
    # Y not read: onnxruntime's finished rows keep their h in the products
    b.node("LSTM", ["x", "W4", "R4", "", "lens"], ["", "yh4"], hidden_size=HIDDEN)
    b.input("x", [SEQ, BATCH, IN])
    b.input("h0", [2, BATCH, HIDDEN])
    b.input("c0", [2, BATCH, HIDDEN])
    for name, shape in (("y", [SEQ, 1, BATCH, HIDDEN]), ("yh", [1, BATCH, HIDDEN]),
                        ("yc", [1, BATCH, HIDDEN]), ("y2", [SEQ, 2, BATCH, HIDDEN]),
                        ("yh2", [2, BATCH, HIDDEN]), ("y3", [SEQ, 2, BATCH, HIDDEN]),
                        ("yh4", [1, BATCH, HIDDEN])):
        b.output(name, shape, TensorProto.FLOAT)
    feeds = {"x": rng.standard_normal((SEQ, BATCH, IN)).astype(np.float32),
             "h0": rng.standard_normal((2, BATCH, HIDDEN)).astype(np.float32) * 0.5,
             "c0": rng.standard_normal((2, BATCH, HIDDEN)).astype(np.float32) * 0.5}
    return b.model(opset=17), feeds


MODEL, FEEDS = _model()


@pytest.mark.parametrize("target", ["llvm", "c"])
@pytest.mark.parametrize("per_channel,weights", [(False, "QInt8"), (True, "QInt8"),
                                                 (True, "QUInt8")])
def test_dynamic_quantize_lstm_matches_onnxruntime(target: str, per_channel: bool,
                                                   weights: str) -> None:
    quantized = quantize_dynamic_model(MODEL, per_channel=per_channel,
                                       weight_type=getattr(QuantType, weights),
                                       op_types_to_quantize=["LSTM"])
    ops = [n.op_type for n in quantized.graph.node]
    assert ops.count("DynamicQuantizeLSTM") == 4, ops
    one_thread = onnxruntime.SessionOptions()
    one_thread.intra_op_num_threads = 1
    want = onnxruntime_outputs(quantized, FEEDS, one_thread)
    got = kiln.compile(from_onnx(quantized), like_onnxruntime(target))(*FEEDS.values())
    for name, g, w in zip(("y", "yh", "yc", "y2", "yh2", "y3", "yh4"), got, want, strict=True):
        assert np.asarray(g).shape == w.shape, name
        assert rel_l2(np.asarray(g), w) < RECURRENT_REL_L2, (name, rel_l2(np.asarray(g), w))


def test_zero_points_that_differ_within_a_direction_are_refused() -> None:
    """Per-column weight zero points that differ: onnxruntime reads one per direction
    (and refuses such a model), kiln's importer refuses it naming the node."""
    quantized = quantize_dynamic_model(MODEL, per_channel=True, weight_type=QuantType.QUInt8,
                                       op_types_to_quantize=["LSTM"])
    init = next(i for i in quantized.graph.initializer if i.name.endswith("W_zero_point"))
    zp = np.frombuffer(init.raw_data, np.uint8).copy() if init.raw_data \
        else np.asarray(init.int32_data, np.uint8)
    zp[1] = zp[0] + 1
    init.ClearField("int32_data")
    init.raw_data = zp.tobytes()
    with pytest.raises(KilnError, match="zero points of a direction differ"):
        from_onnx(quantized)


def _symbolic_model(lens: bool) -> object:
    """A forward and a bidirectional LSTM (states, peepholes) over a symbolic `seq`."""
    rng = np.random.default_rng(12)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.4).astype(np.float32)

    b = GraphBuilder()
    b.consts({"W": weights(1, 4 * HIDDEN, IN), "R": weights(1, 4 * HIDDEN, HIDDEN),
              "B": weights(1, 8 * HIDDEN), "W2": weights(2, 4 * HIDDEN, IN),
              "R2": weights(2, 4 * HIDDEN, HIDDEN), "P2": weights(2, 3 * HIDDEN),
              "lens": np.asarray([2, 1, 2], np.int32)})
    b.node("LSTM", ["x", "W", "R", "B", "lens" if lens else ""], ["y", "yh"],
           hidden_size=HIDDEN)
    b.node("LSTM", ["x", "W2", "R2", "", "", "h0", "c0", "P2"], ["y2", "yh2"],
           hidden_size=HIDDEN, direction="bidirectional")
    b.input("x", ["seq", BATCH, IN])
    b.input("h0", [2, BATCH, HIDDEN])
    b.input("c0", [2, BATCH, HIDDEN])
    for name, shape in (("y", ["seq", 1, BATCH, HIDDEN]), ("yh", [1, BATCH, HIDDEN]),
                        ("y2", ["seq", 2, BATCH, HIDDEN]), ("yh2", [2, BATCH, HIDDEN])):
        b.output(name, shape, TensorProto.FLOAT)
    return quantize_dynamic_model(b.model(opset=17), per_channel=True,
                                  weight_type=QuantType.QInt8, op_types_to_quantize=["LSTM"])


def test_a_symbolic_sequence_length_loops_over_the_steps() -> None:
    """Over a symbolic sequence length each direction is a graph Loop (X quantized once
    before it, h in every step): one library, every length, onnxruntime's results."""
    quantized = _symbolic_model(lens=False)
    one_thread = onnxruntime.SessionOptions()
    one_thread.intra_op_num_threads = 1
    ex = kiln.compile(from_onnx(quantized), like_onnxruntime("llvm"))
    rng = np.random.default_rng(3)
    for steps in (1, 5):
        feeds = {"x": rng.standard_normal((steps, BATCH, IN)).astype(np.float32),
                 "h0": rng.standard_normal((2, BATCH, HIDDEN)).astype(np.float32) * 0.5,
                 "c0": rng.standard_normal((2, BATCH, HIDDEN)).astype(np.float32) * 0.5}
        want = onnxruntime_outputs(quantized, feeds, one_thread)
        for g, w in zip(ex(*feeds.values()), want, strict=True):
            assert np.asarray(g).shape == w.shape
            assert rel_l2(np.asarray(g), w) < RECURRENT_REL_L2, (steps, rel_l2(np.asarray(g), w))


def test_sequence_lengths_over_a_symbolic_length_are_refused() -> None:
    """onnxruntime quantizes a batch's rows with sequence lengths in its own order of
    steps (the unrolled case); over a run-time length kiln refuses it, naming the fix."""
    with pytest.raises(KilnError, match="pin the length"):
        from_onnx(_symbolic_model(lens=True))


def test_the_steps_of_a_direction_share_its_packed_weights() -> None:
    """Each step's integer product has its own scale and bias constants, but reads its
    direction's one packed R: two packed weights (W, R) per direction, six directions."""
    from kiln.ir import graph as g
    from kiln.transform import get_pass

    quantized = quantize_dynamic_model(MODEL, per_channel=False, weight_type=QuantType.QInt8,
                                       op_types_to_quantize=["LSTM"])
    products = [b.value for b in get_pass("quantize-ops")(from_onnx(quantized))["main"].bindings
                if isinstance(b.value, g.Call) and b.value.op.endswith("_packed")]
    assert len(products) > 12
    assert len({id(p.args[1]) for p in products}) == 2 * 6

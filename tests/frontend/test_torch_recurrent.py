"""A PyTorch LSTM exported by both exporters with every axis dynamic (batch and time):
kiln imports the ONNX LSTM over a symbolic sequence length as a graph Loop
(kiln.frontend.onnx.converters.recurrent) and matches the module at several sizes; the same export,
quantized by onnxruntime's `quantize_dynamic` (com.microsoft DynamicQuantizeLSTM),
matches onnxruntime's int8 run."""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.frontend import from_onnx

torch = pytest.importorskip("torch", reason="the exports need torch")
onnx = pytest.importorskip("onnx")

SIZES = ((1, 1), (2, 7), (3, 12))  # (batch, time)
DYNAMIC = {"x": {0: "batch", 1: "time"}}


class Tagger(torch.nn.Module):
    """A bidirectional LSTM over `[batch, time, 8]` and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(8, 8, batch_first=True, bidirectional=True)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x: Any) -> Any:
        return self.head(self.rnn(x)[0])


@pytest.fixture(scope="module")
def tagger() -> Tagger:
    torch.manual_seed(0)
    return Tagger().eval()


def _inputs(batch: int, time: int) -> Any:
    return torch.randn(batch, time, 8, generator=torch.Generator().manual_seed(batch * time))


@pytest.fixture(scope="module")
def torchscript_export(tagger: Tagger) -> Any:
    buffer = io.BytesIO()
    with warnings.catch_warnings():  # its deprecation and the tracer's warnings
        warnings.simplefilter("ignore")
        torch.onnx.export(tagger, (_inputs(2, 5),), buffer, dynamo=False, input_names=["x"],
                          output_names=["y"], dynamic_axes=DYNAMIC)
    return onnx.load_from_string(buffer.getvalue())


@pytest.mark.parametrize("exporter,target", [("dynamo", "c"), ("torchscript", "llvm")])
def test_an_exported_lstm_with_every_axis_dynamic_matches_torch(
        tagger: Tagger, torchscript_export: Any, exporter: str, target: str) -> None:
    if exporter == "dynamo":
        pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
        mod = kiln.from_torch(tagger, (_inputs(2, 5),), DYNAMIC, exporter="dynamo")
    else:
        mod = from_onnx(torchscript_export)
    assert "LSTM" in {n.op_type for n in torchscript_export.graph.node}
    exe = kiln.compile(mod, target)
    for batch, time in SIZES:
        x = _inputs(batch, time)
        with torch.no_grad():
            want = tagger(x).numpy()
        got = exe["main"](x.numpy())
        assert got.shape == want.shape == (batch, time, 5)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_export_quantized_dynamically_matches_onnxruntime(torchscript_export: Any) -> None:
    ort = pytest.importorskip("onnxruntime")
    from onnxruntime.quantization import QuantType

    from quantization.quantized_models import (
        RECURRENT_REL_L2,
        quantize_dynamic_model,
        rel_l2,
    )
    from support.reference import like_onnxruntime, onnxruntime_outputs

    quantized = quantize_dynamic_model(torchscript_export, weight_type=QuantType.QInt8)
    assert [n.op_type for n in quantized.graph.node].count("DynamicQuantizeLSTM") == 1
    exe = kiln.compile(from_onnx(quantized), like_onnxruntime("llvm"))
    one_thread = ort.SessionOptions()
    one_thread.intra_op_num_threads = 1  # its rows' quantization follows its threads
    for batch, time in SIZES:
        x = _inputs(batch, time).numpy()
        (want,) = onnxruntime_outputs(quantized, {"x": x}, one_thread)
        got = np.asarray(exe["main"](x))
        assert got.shape == want.shape and rel_l2(got, want) < RECURRENT_REL_L2, rel_l2(
            got, want)

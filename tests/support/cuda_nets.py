"""The models of the heterogeneous-target tests: bench/nets.py's CNN and a small
2-layer transformer encoder, with inputs."""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx

Net = tuple[onnx.ModelProto, dict[str, np.ndarray]]


@cache
def _nets() -> ModuleType:
    path = Path(__file__).parents[2] / "bench" / "nets.py"
    spec = importlib.util.spec_from_file_location("kiln_bench_nets", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _with_inputs(model: onnx.ModelProto, shapes: dict[str, list[int]]) -> Net:
    rng = np.random.default_rng(0)
    return model, {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}


def cnn() -> Net:
    """Three 3x3 convolutions with ReLU and max pooling, global pooling, a dense layer,
    on a 32 x 32 image (kernels run in the interpreter: the size is the test's time)."""
    return _with_inputs(*_nets().cnn(image=32))


def encoder() -> Net:
    """Two post-norm transformer encoder layers (width 64, 4 heads, FFN 128, 16 tokens)."""
    return _with_inputs(*_nets().transformer_encoder(
        "encoder", 5, layers=2, dim=64, heads=4, ffn=128, seq=16))


NETS = {"cnn": cnn, "encoder": encoder}

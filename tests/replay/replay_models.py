"""The model set of the kernel replay test, and how one model's generated IR is hashed.

The set covers every kernel family kiln picks on a CPU: direct, blocked, depthwise,
NCHWc, Winograd and GEMM convolutions, transposed convolutions, pools, row kernels
(softmax, layer norm), matrix products and matrix-vector products, recurrences, symbolic
batch and sequence dimensions, and int8 (QDQ and QOperator files written by
onnxruntime's quantizer, dynamic quantization). The int8 files are shipped in
`models/` (made by make_goldens.py), so the set does not move with onnxruntime's
quantizer.

`digests(model, target)` lowers a model as `kiln.compile` does for the llvm codegen
(graph and tensor pipelines under the target, terminate checks, outlined parallel
loops) and hashes each function of the result: its DSL text (the one printer) and the
bytes, dtype and shape of every constant it refers to (packed weights included).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx

from kiln.driver.compiler import lower_for_codegen
from kiln.frontend import from_onnx
from kiln.ir.printer import print_func
from kiln.target import Target
from support import dynamic_models, small_models
from support.graphs import GraphBuilder
from support.graphs import value_info as vi

HERE = Path(__file__).resolve().parent
MODELS_DIR = HERE / "models"
GOLDENS = HERE / "goldens.json"

#: The ISAs the kernels are replayed for: name -> target. Explicit CPUs, so no value
#: read from the machine running the test reaches the IR.
TARGETS = {
    "avx2": "llvm -mcpu=haswell",
    "avx2-zen3": "llvm -mcpu=znver3",
    "avx512": "llvm -mcpu=skylake-avx512",
    "avx512-vnni": "llvm -mcpu=znver4",
    "neon": "llvm -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1",
}


def kernels_mix() -> onnx.ModelProto:
    """The families the small model zoo does not reach: a Winograd-sized 3x3 layer, a
    1x1 layer wide enough for the GEMM path, a transposed convolution, an average
    pool, a matrix-vector product, an LSTM over the pooled features."""
    b = GraphBuilder(21)
    h = b.op("Relu", b.conv("image", 16, 64, 3))
    h = b.op("Relu", b.conv(h, 64, 64, 3))
    h = b.op("Relu", b.conv(h, 64, 256, 1))
    h = b.op("AveragePool", h, kernel_shape=[2, 2], strides=[2, 2])
    h = b.op("ConvTranspose", h, b.weight(256, 32, 2, 2), kernel_shape=[2, 2],
             strides=[2, 2])
    pooled = b.op("Flatten", b.op("GlobalAveragePool", h), axis=1)
    gemv = b.op("MatMul", pooled, b.weight(32, 96))
    seq = b.op("Reshape", gemv, b.const(np.array([3, 1, 32], np.int64), "shape"))
    hidden = 24
    b.node("LSTM", [seq, b.weight(1, 4 * hidden, 32), b.weight(1, 4 * hidden, hidden)],
           ["", "state"], hidden_size=hidden)
    return b.model([vi("image", [1, 16, 28, 28])], [vi("state", [1, 1, hidden])], 14,
                   "kernels_mix")


def shipped(name: str) -> Callable[[], onnx.ModelProto]:
    return lambda: onnx.load(str(MODELS_DIR / f"{name}.onnx"))


#: name -> builder of the ONNX model.
MODELS: dict[str, Callable[[], onnx.ModelProto]] = {
    **small_models.MODELS,
    "kernels_mix": kernels_mix,
    "encoder_dynamic": lambda: dynamic_models.encoder(torch_style=True),
    "cnn_dynamic": dynamic_models.cnn,
    "resnet18_qdq": shipped("resnet18_qdq"),
    "mobilenet_v2_qoperator": shipped("mobilenet_v2_qoperator"),
    "transformer_dynamic_int8": shipped("transformer_dynamic_int8"),
}


def _constant_digest(h: hashlib._Hash, key: str, value: np.ndarray) -> None:
    array = np.ascontiguousarray(value)
    h.update(f"{key}:{array.dtype.str}:{array.shape}\n".encode())
    h.update(array.tobytes())


def digests(model: onnx.ModelProto, target: str) -> dict[str, str]:
    """function name -> SHA-256 of that function of `model` lowered for `target`."""
    lowered = lower_for_codegen(from_onnx(model), Target(target))
    out = {}
    for name, func in lowered.items():
        text = print_func(func, name, metadata="reference")
        h = hashlib.sha256(text.encode())
        for key in sorted(text.metadata):
            _constant_digest(h, key, text.metadata[key])
        out[name] = h.hexdigest()
    return dict(sorted(out.items()))

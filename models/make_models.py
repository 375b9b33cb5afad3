"""Generate the small ONNX models shipped in models/ (deterministic weights).

    .venv/bin/python models/make_models.py

- mlp.onnx: x (1, 64) -> Gemm 64x64 -> Relu -> Gemm 64x32 -> Relu -> Gemm 32x10
  -> Softmax; used by `make demo`.
- tiny_cnn.onnx: image (1, 3, 16, 16) -> Conv 3x3 (8) -> BatchNormalization -> Relu ->
  MaxPool -> Conv 3x3 (16) -> Relu -> GlobalAveragePool -> Flatten -> Gemm (10).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).parent


def _init(name: str, value: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(value.astype(np.float32), name)


def _finish(nodes: list, inputs: list, outputs: list, inits: list, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              producer_name="kiln models/make_models.py")
    model.ir_version = 8      # readable by onnxruntime releases of the last years
    onnx.checker.check_model(model)
    return model


def mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(2024)
    sizes = [64, 64, 32, 10]
    nodes, inits = [], []
    h = "x"
    for k, (din, dout) in enumerate(itertools.pairwise(sizes)):
        inits += [_init(f"fc{k}.weight", rng.normal(0, 1 / np.sqrt(din), (dout, din))),
                  _init(f"fc{k}.bias", rng.normal(0, 0.1, dout))]
        out = f"fc{k}"
        nodes.append(helper.make_node("Gemm", [h, f"fc{k}.weight", f"fc{k}.bias"], [out],
                                      name=out, transB=1))
        h = out
        if k < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [h], [f"relu{k}"], name=f"relu{k}"))
            h = f"relu{k}"
    nodes.append(helper.make_node("Softmax", [h], ["probs"], name="softmax", axis=-1))
    return _finish(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                   [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 10])],
                   inits, "mlp")


def tiny_cnn() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    inits = [
        _init("conv1.weight", rng.normal(0, 0.3, (8, 3, 3, 3))),
        _init("bn1.scale", rng.uniform(0.5, 1.5, 8)), _init("bn1.bias", rng.normal(0, 0.1, 8)),
        _init("bn1.mean", rng.normal(0, 0.1, 8)), _init("bn1.var", rng.uniform(0.5, 1.5, 8)),
        _init("conv2.weight", rng.normal(0, 0.2, (16, 8, 3, 3))),
        _init("conv2.bias", rng.normal(0, 0.1, 16)),
        _init("fc.weight", rng.normal(0, 0.25, (10, 16))), _init("fc.bias", rng.normal(0, 0.1, 10)),
    ]
    n = helper.make_node
    nodes = [
        n("Conv", ["image", "conv1.weight"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        n("BatchNormalization", ["c1", "bn1.scale", "bn1.bias", "bn1.mean", "bn1.var"], ["b1"],
          name="bn1"),
        n("Relu", ["b1"], ["r1"], name="relu1"),
        n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], name="pool1"),
        n("Conv", ["p1", "conv2.weight", "conv2.bias"], ["c2"], pads=[1, 1, 1, 1], name="conv2"),
        n("Relu", ["c2"], ["r2"], name="relu2"),
        n("GlobalAveragePool", ["r2"], ["g"], name="gap"),
        n("Flatten", ["g"], ["f"], name="flatten"),
        n("Gemm", ["f", "fc.weight", "fc.bias"], ["logits"], transB=1, name="fc"),
    ]
    return _finish(nodes, [helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                         [1, 3, 16, 16])],
                   [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])],
                   inits, "tiny_cnn")


MODELS = {"mlp.onnx": mlp, "tiny_cnn.onnx": tiny_cnn}


def main() -> None:
    for file_name, build in MODELS.items():
        path = HERE / file_name
        onnx.save(build(), path)
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()

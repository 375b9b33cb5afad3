"""GraphBuilder: ONNX graphs written as calls, with unique value names and
deterministic random weights (the one builder of the test suite)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def value_info(name: str, shape: Sequence[int | str | None] | None,
               elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    """A graph input/output declaration (`shape` None: unknown rank)."""
    return helper.make_tensor_value_info(name, elem, shape)


class GraphBuilder:
    """Accumulates nodes and initializers; names values uniquely."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def const(self, value: np.ndarray, hint: str = "c") -> str:
        name = self.name(hint)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, *shape: int, fan_in: int | None = None, hint: str = "w") -> str:
        fan = fan_in or int(np.prod(shape[1:])) or 1
        w = self.rng.normal(0, 1 / math.sqrt(fan), shape).astype(np.float32)
        return self.const(w, hint)

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs: object) -> str:
        outs = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=outs[0], **attrs))
        return outs[0]

    # ---------------------------------------------------------------- layers

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
             bias: bool = True) -> str:
        w = self.weight(cout, cin // group, k, k)
        args = [x, w] + ([self.const(self.rng.normal(0, 0.1, cout).astype(np.float32), "b")]
                         if bias else [])
        return self.op("Conv", *args, kernel_shape=[k, k], strides=[stride, stride],
                       pads=[k // 2] * 4, group=group)

    def bn(self, x: str, c: int) -> str:
        r = self.rng
        scale = self.const(r.uniform(0.5, 1.5, c).astype(np.float32), "gamma")
        shift = self.const(r.normal(0, 0.1, c).astype(np.float32), "beta")
        mean = self.const(r.normal(0, 0.1, c).astype(np.float32), "mean")
        var = self.const(r.uniform(0.5, 1.5, c).astype(np.float32), "var")
        return self.op("BatchNormalization", x, scale, shift, mean, var, epsilon=1e-5)

    def relu6(self, x: str) -> str:
        return self.op("Clip", x, self.const(np.array(0.0, np.float32), "min"),
                       self.const(np.array(6.0, np.float32), "max"))

    def linear(self, x: str, din: int, dout: int) -> str:
        return self.op("Gemm", x, self.weight(dout, din), self.const(
            self.rng.normal(0, 0.1, dout).astype(np.float32), "b"), transB=1)

    def proj(self, x: str, din: int, dout: int) -> str:
        """A transformer's dense layer: MatMul by a `[din, dout]` weight, then a bias Add."""
        return self.op("Add", self.op("MatMul", x, self.weight(din, dout, fan_in=din)),
                       self.const(self.rng.normal(0, 0.1, dout).astype(np.float32), "b"))

    def layer_norm(self, x: str, dim: int) -> str:
        """LayerNormalization over the last axis (`dim` wide), random scale and bias."""
        return self.op("LayerNormalization", x,
                       self.const(self.rng.uniform(0.8, 1.2, dim).astype(np.float32), "ln_g"),
                       self.const(self.rng.normal(0, 0.1, dim).astype(np.float32), "ln_b"),
                       axis=-1, epsilon=1e-5)

    def gelu_erf(self, x: str) -> str:
        """GELU spelled with Erf, as exporters before the opset-20 Gelu write it."""
        erf = self.op("Erf", self.op("Div", x, self.const(np.array(math.sqrt(2), np.float32),
                                                           "r2")))
        one = self.const(np.array(1.0, np.float32), "one")
        half = self.const(np.array(0.5, np.float32), "half")
        return self.op("Mul", self.op("Mul", x, self.op("Add", erf, one)), half)

    def model(self, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
              opset: int, name: str) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  producer_name="kiln-tests")
        model.ir_version = 8
        onnx.checker.check_model(model)
        return model

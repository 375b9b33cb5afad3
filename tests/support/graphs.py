"""GraphBuilder: the test suite's one way to build ONNX graphs (tests/test_test_support.py
lets only its allow-list of deliberately hostile files call `helper.make_graph`).

Two styles mix freely: `op` names its results itself (`relu_3`) and `weight` draws
deterministic random initializers, for models whose value names do not matter; `node`,
`const(name=...)`, `input` and `output` keep the names a test asserts on. `graph` makes
a subgraph (If/Loop/Scan bodies) from a builder of its own; `model` wraps the graph with
its opset imports and IR version, and runs onnx's checker."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

Shape = Sequence[int | str | None] | None


def value_info(name: str, shape: Shape, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    """A graph input/output declaration; str dims are symbolic, None unknown, and a None
    `shape` an unknown rank."""
    return helper.make_tensor_value_info(name, elem, shape)


def untyped(name: str) -> onnx.ValueInfoProto:
    """An output declared by name alone (no type): the importer infers it."""
    return onnx.ValueInfoProto(name=name)


class GraphBuilder:
    """Accumulates nodes, initializers and the graph's inputs and outputs."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.count = 0

    def name(self, hint: str) -> str:
        """A value name no other `name` call returns (`hint_N`)."""
        self.count += 1
        return f"{hint}_{self.count}"

    # ------------------------------------------------------------- values

    def const(self, value: np.ndarray | onnx.TensorProto, hint: str = "c", *,
              name: str | None = None) -> str:
        """An initializer (named `name`, or uniquely after `hint`); a TensorProto is
        taken as it is (its own name unless `name` is given)."""
        if isinstance(value, onnx.TensorProto):
            tensor = onnx.TensorProto()
            tensor.CopyFrom(value)
            if name is not None:
                tensor.name = name
        else:
            tensor = numpy_helper.from_array(np.asarray(value), name or self.name(hint))
        self.inits.append(tensor)
        return tensor.name

    def consts(self, values: Mapping[str, np.ndarray] | Iterable[onnx.TensorProto]) -> None:
        """Initializers under the given names ({name: array}, or TensorProtos)."""
        if isinstance(values, Mapping):
            for name, value in values.items():
                self.const(value, name=name)
        else:
            for tensor in values:
                self.const(tensor)

    def weight(self, *shape: int, fan_in: int | None = None, hint: str = "w") -> str:
        """A normal(0, 1/sqrt(fan_in)) float32 initializer drawn from the builder's seed."""
        fan = fan_in or int(np.prod(shape[1:])) or 1
        w = self.rng.normal(0, 1 / math.sqrt(fan), shape).astype(np.float32)
        return self.const(w, hint)

    def input(self, name: str, shape: Shape, elem: int = TensorProto.FLOAT) -> str:
        """Declares a graph input."""
        self.inputs.append(value_info(name, shape, elem))
        return name

    def inputs_for(self, feeds: Mapping[str, np.ndarray]) -> None:
        """Declares an input per array of `feeds`, of its element type and shape."""
        for name, value in feeds.items():
            self.input(name, value.shape, helper.np_dtype_to_tensor_dtype(value.dtype))

    def output(self, name: str, shape: Shape = None, elem: int = TensorProto.FLOAT, *,
               typed: bool = True) -> str:
        """Declares a graph output (`typed=False`: by name only, see `untyped`)."""
        self.outputs.append(value_info(name, shape, elem) if typed else untyped(name))
        return name

    # -------------------------------------------------------------- nodes

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs: Any) -> str:
        """A node whose results are named after `op_type`; returns the first."""
        outs = [self.name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=outs[0], **attrs))
        return outs[0]

    def node(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str],
             **attrs: Any) -> onnx.NodeProto:
        """A node with the value names given (attributes as helper.make_node takes them,
        `name=` and `domain=` included); returns it."""
        node = helper.make_node(op_type, list(inputs), list(outputs), **attrs)
        self.nodes.append(node)
        return node

    def add(self, *nodes: onnx.NodeProto) -> None:
        """Appends nodes made elsewhere (as a test's parametrized node)."""
        self.nodes.extend(nodes)

    # ------------------------------------------------------------- layers

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

    # ------------------------------------------------------------- graphs

    def graph(self, name: str = "g", inputs: Sequence[onnx.ValueInfoProto] | None = None,
              outputs: Sequence[onnx.ValueInfoProto] | None = None) -> onnx.GraphProto:
        """The graph of what was built (inputs/outputs: the declared ones unless given);
        also the body of an If, Loop or Scan node."""
        return helper.make_graph(
            self.nodes, name, list(self.inputs if inputs is None else inputs),
            list(self.outputs if outputs is None else outputs), self.inits)

    def model(self, inputs: Sequence[onnx.ValueInfoProto] | None = None,
              outputs: Sequence[onnx.ValueInfoProto] | None = None,
              opset: int | Mapping[str, int] | None = 17, name: str = "g", *,
              ir_version: int | None = 8, infer_outputs: bool = False, check: bool = True,
              full_check: bool = False) -> onnx.ModelProto:
        """A model of `graph(name, inputs, outputs)`. `opset`: the default domain's
        version, or {domain: version} for every import, or None for onnx's newest;
        `ir_version` None keeps onnx's newest (8 is what every onnxruntime reads).
        `infer_outputs` declares every output as onnx's shape inference types it.
        `check` runs onnx.checker (`full_check` with shape inference): models with
        outputs of no type or unknown rank (which the checker refuses, kiln and
        onnxruntime infer), or invalid on purpose, pass False."""
        imports = None if opset is None else [
            helper.make_opsetid(domain, version) for domain, version in
            (opset.items() if isinstance(opset, Mapping) else [("", opset)])]
        kw: dict[str, Any] = {} if imports is None else {"opset_imports": imports}
        model = helper.make_model(self.graph(name, inputs, outputs), producer_name="kiln-tests",
                                  **kw)
        if ir_version is not None:
            model.ir_version = ir_version
        if infer_outputs:
            known = {v.name: v for v in onnx.shape_inference.infer_shapes(model).graph.output}
            typed = [known[v.name] for v in model.graph.output]
            del model.graph.output[:]
            model.graph.output.extend(typed)
        if check:
            onnx.checker.check_model(model, full_check=full_check)
        return model

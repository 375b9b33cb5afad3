"""Import an ONNX model into an IRModule whose graph function `main` takes the
model's inputs by name and holds its initializers as constants.

Constant subgraphs (the Shape -> Gather -> Concat -> Reshape arithmetic that
exporters emit) are folded while importing, with each op's numpy reference, so
shape inputs are known when the converter of their consumer runs.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import numpy as np

from kiln.errors import FrontendError, IRError
from kiln.ir import graph as g
from kiln.ir.builder import IRBuilder
from kiln.ir.dtype import from_numpy
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType, Type
from kiln.ops import registry as op_registry
from kiln.ops.onnx_map import converters

SUPPORTED_OPSETS = range(7, 22)


def from_onnx(model: Any, shape_dict: dict[str, Any] | None = None) -> IRModule:
    """Import `model` (a path, bytes or onnx.ModelProto).

    `shape_dict` binds input shapes (needed for symbolic dimensions): a full
    shape per input name, e.g. `{"input": (1, 3, 224, 224)}`.
    """
    import onnx

    proto = _load(model)
    opset = _default_opset(proto)
    if opset < SUPPORTED_OPSETS.start:
        try:
            from onnx import version_converter

            proto = version_converter.convert_version(proto, 13)
            opset = 13
        except Exception as exc:  # the converter raises many types
            raise FrontendError(
                f"model uses opset {opset}; kiln supports {SUPPORTED_OPSETS.start}-"
                f"{SUPPORTED_OPSETS.stop - 1} and onnx's version converter failed: {exc}"
            ) from exc
    graph = proto.graph
    _check_supported(graph, opset)
    return _Importer(onnx, graph, opset, shape_dict or {}).run()


def _load(model: Any) -> Any:
    import onnx

    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        try:
            return onnx.load_from_string(bytes(model))
        except Exception as exc:
            raise FrontendError(f"these bytes are not an ONNX model: {exc}") from exc
    path = os.fspath(model)
    if not os.path.exists(path):
        raise FrontendError(f"ONNX model file {path!r} does not exist")
    try:
        proto = onnx.load(path)
    except Exception as exc:
        raise FrontendError(f"{path!r} is not a readable ONNX model: {exc}") from exc
    if not proto.graph.node and not proto.graph.output:
        raise FrontendError(f"{path!r} holds no ONNX graph (empty or not an ONNX file)")
    return proto


def _default_opset(proto: Any) -> int:
    for imp in proto.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise FrontendError("the model does not import the default ONNX opset")


def _check_supported(graph: Any, opset: int) -> None:
    table = converters()
    missing: Counter[str] = Counter()
    names: dict[str, list[str]] = {}
    for node in graph.node:
        key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        if key not in table:
            missing[key] += 1
            names.setdefault(key, []).append(node.name or f"<{node.op_type} #{missing[key]}>")
    if missing:
        lines = [f"  {op} x{count}: nodes {', '.join(names[op][:5])}"
                 + (" ..." if len(names[op]) > 5 else "")
                 for op, count in sorted(missing.items())]
        raise FrontendError(
            f"the model uses {len(missing)} operator type(s) kiln does not support "
            f"(opset {opset}):\n" + "\n".join(lines))


def _decode_attr(attr: Any) -> Any:
    from onnx import helper, numpy_helper

    value = helper.get_attribute_value(attr)
    if attr.type == attr.TENSOR:
        return numpy_helper.to_array(value)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list):
        return tuple(v.decode("utf-8") if isinstance(v, bytes) else v for v in value)
    return value


class _Importer:
    def __init__(self, onnx: Any, graph: Any, opset: int, shape_dict: dict[str, Any]) -> None:
        self.onnx = onnx
        self.graph = graph
        self.opset = opset
        self.shape_dict = shape_dict
        self.values: dict[str, g.Expr] = {}
        self.ib = IRBuilder()
        self.counter = 0

    # ---------------------------------------------------------------- GraphContext

    def call(self, op: str, *args: g.Expr, **attrs: Any) -> g.Expr:
        try:
            expr = op_registry.call(op, *args, **attrs)
        except IRError as exc:
            raise FrontendError(f"{self._where}: {exc}") from exc
        if all(isinstance(a, g.Constant) for a in args):
            folded = op_registry.evaluate_call(
                op, [a.data for a in args if isinstance(a, g.Constant)], expr.attrs)
            if isinstance(folded, tuple):
                return g.Tuple(tuple(g.Constant(np.asarray(f)) for f in folded))
            return g.Constant(np.asarray(folded))
        return self.ib.emit(expr, op)

    def const(self, data: np.ndarray | float | int, dtype: str | None = None) -> g.Expr:
        arr = np.asarray(data) if dtype is None else np.asarray(data, dtype=dtype)
        return g.Constant(arr)

    def value(self, expr: g.Expr | None) -> np.ndarray | None:
        return expr.data if isinstance(expr, g.Constant) else None

    def tensor_type(self, expr: g.Expr) -> TensorType:
        t = expr.type
        if not isinstance(t, TensorType):
            raise FrontendError(f"{self._where}: expected a tensor, got {t}")
        return t

    def item(self, expr: g.Expr, index: int) -> g.Expr:
        """Element `index` of a tuple-valued expression (folded when constant)."""
        if isinstance(expr, g.Tuple):
            return expr.fields[index]
        return self.ib.emit(g.TupleGetItem(expr, index), "item")

    # ---------------------------------------------------------------- import

    def run(self) -> IRModule:
        init_names = {t.name for t in self.graph.initializer}
        with self.ib.function("main"):
            for inp in self.graph.input:
                if inp.name in init_names:
                    continue
                self.values[inp.name] = self.ib.param(inp.name, self._input_type(inp))
            from onnx import numpy_helper

            for init in self.graph.initializer:
                self.values[init.name] = g.Constant(numpy_helper.to_array(init), init.name)
            for node in self.graph.node:
                self._convert(node)
            outputs = []
            for out in self.graph.output:
                if out.name not in self.values:
                    raise FrontendError(f"graph output {out.name!r} is produced by no node")
                outputs.append(self._as_result(self.values[out.name], out.name))
            self.ib.func_attr("output_names", tuple(o.name for o in self.graph.output))
            self.ib.ret(outputs[0] if len(outputs) == 1 else g.Tuple(tuple(outputs)))
        return self.ib.get()

    def _as_result(self, expr: g.Expr, name: str) -> g.Expr:
        # A constant output still flows through main's bindings.
        if isinstance(expr, g.Constant):
            return self.ib.emit(op_registry.call("copy", expr), "const_out")
        return expr

    @property
    def _where(self) -> str:
        return getattr(self, "_node_desc", "model")

    def _convert(self, node: Any) -> None:
        self._node_desc = f"node {node.name or '?'} ({node.op_type})"
        conv = converters().get(node.op_type)
        if self.opset < conv.min_opset:
            raise FrontendError(f"{self._where}: needs opset >= {conv.min_opset}")
        inputs: list[g.Expr | None] = []
        for name in node.input:
            if name == "":
                inputs.append(None)
            elif name in self.values:
                inputs.append(self.values[name])
            else:
                raise FrontendError(f"{self._where}: input {name!r} is not defined before use")
        attrs = {a.name: _decode_attr(a) for a in node.attribute}
        try:
            outs = conv.fn(self, inputs, attrs)
        except (IRError, KeyError, ValueError, TypeError) as exc:
            if isinstance(exc, FrontendError):
                raise
            raise FrontendError(f"{self._where}: {exc}") from exc
        for name, value in zip(node.output, outs):
            if name:
                self.values[name] = value

    def _input_type(self, inp: Any) -> Type:
        tt = inp.type.tensor_type
        if not tt.HasField("elem_type"):
            raise FrontendError(f"input {inp.name!r} is not a tensor")
        from onnx import helper

        dtype = from_numpy(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        if inp.name in self.shape_dict:
            shape = tuple(int(d) for d in self.shape_dict[inp.name])
            declared = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
            if tt.HasField("shape") and (len(declared) != len(shape) or any(
                    d is not None and d != s for d, s in zip(declared, shape))):
                raise FrontendError(
                    f"shape_dict gives input {inp.name!r} shape {shape}, but the model "
                    f"declares {tuple(d if d is not None else '?' for d in declared)}")
            return TensorType(shape, dtype)
        dims: list[int] = []
        unbound: list[str] = []
        for k, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            else:
                unbound.append(d.dim_param or f"dim {k}")
        if unbound:
            raise FrontendError(
                f"input {inp.name!r} has unbound dimension(s) {unbound}; pass "
                f"shape_dict={{{inp.name!r}: (...)}} with a full static shape")
        return TensorType(tuple(dims), dtype)


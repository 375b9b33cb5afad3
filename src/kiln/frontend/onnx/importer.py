"""Import an ONNX model into an IRModule whose graph function `main` takes the
model's inputs by name and holds its initializers as constants.

Constant subgraphs (the Shape -> Gather -> Concat -> Reshape arithmetic that
exporters emit) are folded while importing, with each op's numpy reference, so
shape inputs are known when the converter of their consumer runs.

Opsets: kiln's converters implement the semantics of ONNX opsets 7-21, branching
on `ctx.opset` where an operator changed. A model older than opset 7 goes through
ONNX's version converter first. A model newer than 21 is accepted: the opset
22-28 revisions of the operators kiln supports only added element types.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import numpy as np

from kiln._registry import suggest
from kiln.errors import FrontendError, IRError
from kiln.frontend.onnx.raw_data import load_with_views
from kiln.frontend.onnx.validate import check_graph, check_shape, itemsize
from kiln.ir import graph as g
from kiln.ir.attrs import ATTR_GIVEN_OUTPUT_NAMES
from kiln.ir.builder import IRBuilder
from kiln.ir.dtype import from_numpy, to_numpy
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType, Type
from kiln.ops import registry as op_registry
from kiln.ops.onnx_map import converters
from kiln.transform.fold_constants import DEFAULT_FOLD_BUDGET, type_bytes

SUPPORTED_OPSETS = range(7, 22)
# Older models are converted to this opset with onnx.version_converter.
CONVERT_OLD_TO = 13


# Constant folding while importing materialises at most this many bytes per
# value (beyond what the model's own data grows to, see `_Importer.call`).
DEFAULT_MAX_FOLD_BYTES = DEFAULT_FOLD_BUDGET
# A folded value may be this many times larger than the model data it derives from.
FOLD_GROWTH = 4


def from_onnx(model: Any, shape_dict: dict[str, Any] | None = None, *,
              max_fold_bytes: int = DEFAULT_MAX_FOLD_BYTES) -> IRModule:
    """Import `model` (a path, bytes or onnx.ModelProto) as an IRModule.

    `shape_dict` binds input shapes, e.g. `{"input": (1, 3, 224, 224)}`: it is
    required for inputs with symbolic dimensions and must agree with the fixed
    dimensions the model declares. The module's graph function `main` takes the
    inputs in the model's order, under their ONNX names, and returns the
    outputs in the model's order (attribute `output_names`).

    `max_fold_bytes` bounds constant folding (docs/onnx.md, "Limits"): an
    operator whose inputs are all constant is evaluated at import only if its
    value takes at most this many bytes (or at most FOLD_GROWTH times the model
    data it derives from); otherwise it stays in the graph and runs at run time.
    Values kiln must know at import (shapes, Range) that exceed it raise.

    Raises FrontendError for a missing or malformed file, unsupported
    operators (all of them listed, with node names and counts), bad or missing
    shapes, graphs onnxruntime rejects (duplicate names, two producers of one
    value, impossible shapes), and values kiln needs at compile time but cannot
    compute.
    """
    if isinstance(max_fold_bytes, bool) or not isinstance(max_fold_bytes, int) or \
            max_fold_bytes < 0:
        raise FrontendError(f"max_fold_bytes must be a non-negative int, got {max_fold_bytes!r}")
    proto, views = _load(model)
    opset = _default_opset(proto)
    if opset < SUPPORTED_OPSETS.start:
        for i, array in views.items():  # the converter needs the data inside the proto
            proto.graph.initializer[i].raw_data = array.tobytes()
        views = {}
        proto, opset = _upgrade(proto, opset)
    graph = proto.graph
    check_graph(graph, in_memory=not isinstance(model, (str, os.PathLike)))
    _check_supported(graph, opset)
    _check_shape_dict(graph, shape_dict or {})
    return _Importer(graph, opset, dict(shape_dict or {}), max_fold_bytes, views).run()


def _load(model: Any) -> tuple[Any, dict[int, Any]]:
    """The ModelProto and, for a file, its initializers' data as views of the file's
    bytes by initializer index (kiln.frontend.onnx.raw_data); others decode later."""
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(model, onnx.ModelProto):
        return model, {}
    if isinstance(model, (bytes, bytearray)):
        try:
            proto = onnx.load_from_string(bytes(model))
        except (DecodeError, ValueError, RuntimeError) as exc:
            raise FrontendError(f"these {len(model)} bytes are not an ONNX model: {exc}") from exc
        return _check_nonempty(proto, "the bytes"), {}
    if not isinstance(model, (str, os.PathLike)):
        raise FrontendError(f"from_onnx expects a path, bytes or onnx.ModelProto, got "
                            f"{type(model).__name__}")
    from onnx.checker import ValidationError

    path = os.fspath(model)
    if not os.path.exists(path):
        raise FrontendError(f"ONNX model file {path!r} does not exist")
    if os.path.isdir(path):
        raise FrontendError(f"{path!r} is a directory, not an ONNX model file")
    try:
        proto, views = load_with_views(path)
    except ValidationError as exc:  # onnx checks external data locations while loading
        raise FrontendError(f"{path!r}: its external data cannot be loaded: {exc}") from exc
    except (DecodeError, ValueError, RuntimeError, OSError) as exc:
        raise FrontendError(f"{path!r} is not a readable ONNX model: {exc}") from exc
    return _check_nonempty(proto, repr(path)), views


def _check_nonempty(proto: Any, what: str) -> Any:
    # Protobuf parses many random byte strings into an empty message.
    if not proto.graph.node and not proto.graph.output:
        raise FrontendError(f"{what} hold no ONNX graph (empty, truncated or not an ONNX file)")
    return proto


def _default_opset(proto: Any) -> int:
    for imp in proto.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    if not proto.opset_import:
        # IR version < 3 models carry no opset_import: they are opset 1.
        return 1
    raise FrontendError("the model does not import the default ONNX opset (domain '')")


def _upgrade(proto: Any, opset: int) -> tuple[Any, int]:
    try:
        from onnx import version_converter

        return version_converter.convert_version(proto, CONVERT_OLD_TO), CONVERT_OLD_TO
    except Exception as exc:  # the converter raises many types
        raise FrontendError(
            f"model uses opset {opset}; kiln supports {SUPPORTED_OPSETS.start}-"
            f"{SUPPORTED_OPSETS.stop - 1} and onnx's version converter could not "
            f"upgrade it: {exc}") from exc


def _text(value: Any) -> str:
    """A protobuf string field as text (a damaged file may hold invalid UTF-8 bytes)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _op_key(node: Any) -> str:
    op, domain = _text(node.op_type), _text(node.domain)
    return op if domain in ("", "ai.onnx") else f"{domain}.{op}"


def _node_label(node: Any, index: int) -> str:
    if node.name:
        return repr(_text(node.name))
    out = next((_text(o) for o in node.output if o), "")
    return f"#{index} (output {out!r})" if out else f"#{index}"


def _check_supported(graph: Any, opset: int) -> None:
    """Raise one FrontendError listing every unsupported op type, with counts and nodes."""
    table = converters()
    missing: Counter[str] = Counter()
    names: dict[str, list[str]] = {}
    for k, node in enumerate(graph.node):
        key = _op_key(node)
        if key not in table:
            missing[key] += 1
            names.setdefault(key, []).append(_node_label(node, k))
    if missing:
        lines = []
        for op, count in sorted(missing.items()):
            shown = names[op][:5]
            more = f" and {count - len(shown)} more" if count > len(shown) else ""
            lines.append(f"  {op} x{count}: node{'s' if count > 1 else ''} "
                         f"{', '.join(shown)}{more}")
        raise FrontendError(
            f"the model uses {len(missing)} operator type(s) kiln does not support "
            f"(opset {opset}):\n" + "\n".join(lines))


def _graph_inputs(graph: Any) -> list[Any]:
    init_names = {t.name for t in graph.initializer}
    return [i for i in graph.input if i.name not in init_names]


def _check_shape_dict(graph: Any, shape_dict: dict[str, Any]) -> None:
    elem_types = {i.name: i.type.tensor_type.elem_type for i in _graph_inputs(graph)}
    inputs = list(elem_types)
    for name, shape in shape_dict.items():
        if name not in inputs:
            raise FrontendError(
                f"shape_dict names {name!r}, which is not an input of the model."
                f"{suggest(str(name), inputs)} Inputs: {', '.join(inputs) or '(none)'}")
        if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
            raise FrontendError(f"shape_dict[{name!r}] must be a sequence of ints, got {shape!r}")
        for d in shape:
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
                raise FrontendError(
                    f"shape_dict[{name!r}] = {tuple(shape)!r}: every dimension must be a "
                    f"non-negative int, got {d!r}")
        check_shape(f"shape_dict[{name!r}]", shape, itemsize(elem_types[name]))


def _decode_attr(attr: Any) -> Any:
    from onnx import helper, numpy_helper

    if attr.type == attr.GRAPH or attr.type == attr.GRAPHS:
        raise FrontendError(f"attribute {attr.name!r} holds a subgraph; kiln does not "
                            "import control flow")
    value = helper.get_attribute_value(attr)
    if attr.type == attr.TENSOR:
        return numpy_helper.to_array(value)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list):
        return tuple(v.decode("utf-8") if isinstance(v, bytes) else v for v in value)
    return value


class _Importer:
    """Converts the nodes of one graph in order; it is the converters' GraphContext."""

    def __init__(self, graph: Any, opset: int, shape_dict: dict[str, Any],
                 max_fold_bytes: int = DEFAULT_MAX_FOLD_BYTES,
                 views: dict[int, Any] | None = None) -> None:
        self.graph = graph
        self.views = views or {}  # initializer index -> its data, read already
        self.opset = opset
        self.shape_dict = shape_dict
        self.max_fold_bytes = max_fold_bytes
        # Folded constants -> bytes of model data they derive from (others: their own size).
        self._origin: dict[int, tuple[g.Constant, int]] = {}
        # Calls left unfolded for the budget -> why (for "must be a constant" errors).
        self._unfolded: dict[g.Expr, str] = {}
        self.values: dict[str, g.Expr] = {}
        self.ib = IRBuilder()
        self.node_outputs: tuple[str, ...] = ()
        self.params: set[g.Expr] = set()
        self._where = "model"

    # ---------------------------------------------------------------- GraphContext

    def call(self, op: str, *args: g.Expr, **attrs: Any) -> g.Expr:
        """Emit `op(*args, **attrs)`, folded into a Constant when every arg is constant."""
        try:
            expr = op_registry.call(op, *args, **attrs)
        except IRError as exc:
            raise FrontendError(f"{self._where}: {exc}") from exc
        consts = [a for a in args if isinstance(a, g.Constant)]
        if len(consts) == len(args):
            # The size comes from the inferred type, before anything is materialised:
            # a tiny model can ask for terabytes (ConstantOfShape, Expand, Tile...).
            origin = sum(self._origin_bytes(a) for a in consts)
            nbytes = type_bytes(expr.type)
            if nbytes <= max(self.max_fold_bytes, FOLD_GROWTH * origin):
                folded = op_registry.evaluate_call(op, [a.data for a in consts], expr.attrs)
                if isinstance(folded, tuple):
                    return g.Tuple(tuple(self._folded(f, origin) for f in folded))
                return self._folded(folded, origin)
            var = self.ib.emit(expr, op)
            self._unfolded[var] = (f"{self._where} computes it at run time: its value of "
                                   f"{nbytes} bytes is above the fold budget of "
                                   f"{self.max_fold_bytes} bytes (from_onnx max_fold_bytes)")
            return var
        return self.ib.emit(expr, op)

    def _folded(self, value: Any, origin: int) -> g.Constant:
        data = np.asarray(value)
        if data.flags.writeable and data.flags.c_contiguous and data.base is None:
            # A fresh result of the reference that nothing else holds: freeze it in
            # place rather than let Constant copy it (a folded weight can be 400 MB).
            data.flags.writeable = False
        const = g.Constant(data)
        self._origin[id(const)] = (const, origin)
        return const

    def _origin_bytes(self, const: g.Constant) -> int:
        entry = self._origin.get(id(const))
        return entry[1] if entry is not None else int(const.data.nbytes)

    def why_unknown(self, expr: g.Expr | None) -> str:
        """Why `expr` has no compile-time value, when the budget is the reason ("" if not)."""
        return self._unfolded.get(expr, "") if expr is not None else ""

    def check_materialize(self, nbytes: int, what: str) -> None:
        """IRError unless a constant of `nbytes` that the model asks for fits the budget."""
        if nbytes > self.max_fold_bytes:
            raise IRError(f"{what} would materialise {nbytes} bytes at import, above the fold "
                          f"budget of {self.max_fold_bytes} bytes (from_onnx max_fold_bytes)")

    def const(self, data: np.ndarray | float | int, dtype: str | None = None) -> g.Expr:
        arr = np.asarray(data) if dtype is None else np.asarray(data, dtype=to_numpy(dtype))
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
        from onnx import numpy_helper

        with self.ib.function("main"):
            for inp in _graph_inputs(self.graph):
                param = self.ib.param(inp.name, self._input_type(inp))
                self.values[inp.name] = param
                self.params.add(param)
            for i, init in enumerate(self.graph.initializer):
                try:
                    data = self.views[i] if i in self.views else numpy_helper.to_array(init)
                    self.values[init.name] = g.Constant(data, init.name)
                except Exception as exc:  # onnx raises several types for bad tensors
                    raise FrontendError(f"initializer {_text(init.name)!r} cannot be read: "
                                        f"{type(exc).__name__}: {exc}") from exc
            for k, node in enumerate(self.graph.node):
                self._convert(node, k)
            outputs = []
            seen: set[g.Expr] = set()
            for out in self.graph.output:
                if out.name not in self.values:
                    raise FrontendError(f"graph output {out.name!r} is produced by no node")
                outputs.append(self._as_result(self.values[out.name], seen))
            if not outputs:
                raise FrontendError("the model has no outputs")
            self.ib.func_attr(ATTR_GIVEN_OUTPUT_NAMES, tuple(o.name for o in self.graph.output))
            self.ib.ret(outputs[0] if len(outputs) == 1 else g.Tuple(tuple(outputs)))
        return self.ib.get()

    def _as_result(self, expr: g.Expr, seen: set[g.Expr]) -> g.Expr:
        # Every output is a value computed by main's bindings, and a distinct one:
        # constants, inputs passed through and repeated outputs get a copy.
        if isinstance(expr, g.Constant) or expr in seen or expr in self.params:
            expr = self.ib.emit(op_registry.call("copy", expr), "out")
        seen.add(expr)
        return expr

    def _convert(self, node: Any, index: int) -> None:
        self._where = f"node {_node_label(node, index)} ({_text(node.op_type)})"
        conv = converters().get(_op_key(node))
        if self.opset < conv.min_opset:
            raise FrontendError(f"{self._where}: needs opset >= {conv.min_opset}")
        inputs: list[g.Expr | None] = []
        for name in node.input:
            if name == "":
                inputs.append(None)
            elif name in self.values:
                inputs.append(self.values[name])
            else:
                raise FrontendError(f"{self._where}: input {name!r} is not defined before use "
                                    "(the graph is not topologically sorted, or the name is "
                                    "misspelled)")
        self.node_outputs = tuple(node.output)
        try:
            attrs = {a.name: _decode_attr(a) for a in node.attribute}
            outs = conv.fn(self, inputs, attrs)
        except FrontendError as exc:
            if str(exc).startswith("node "):
                raise
            raise FrontendError(f"{self._where}: {exc}") from exc
        except KeyError as exc:
            raise FrontendError(f"{self._where}: missing attribute or input {exc}") from exc
        except (AssertionError, IndexError) as exc:
            raise FrontendError(f"{self._where}: a required input is missing (the node has "
                                f"{len(node.input)} input(s))") from exc
        except (IRError, ValueError, TypeError, ArithmeticError) as exc:
            raise FrontendError(f"{self._where}: {exc}") from exc
        for name, value in zip(node.output, outs):
            if name:
                self.values[name] = value

    def _input_type(self, inp: Any) -> Type:
        if inp.type.WhichOneof("value") != "tensor_type":
            kind = inp.type.WhichOneof("value") or "untyped"
            raise FrontendError(f"input {inp.name!r} is a {kind.replace('_type', '')}; kiln "
                                "imports tensor inputs only")
        tt = inp.type.tensor_type
        from onnx import helper

        try:
            dtype = from_numpy(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except (IRError, KeyError, TypeError, ValueError) as exc:
            raise FrontendError(f"input {inp.name!r}: unsupported element type "
                                f"{tt.elem_type}: {exc}") from exc
        declared: list[int | str | None] = []
        for d in tt.shape.dim:
            if d.HasField("dim_value"):
                declared.append(int(d.dim_value))
            else:
                declared.append(d.dim_param or None)
        if inp.name in self.shape_dict:
            shape = tuple(int(d) for d in self.shape_dict[inp.name])
            if tt.HasField("shape") and (len(declared) != len(shape) or any(
                    isinstance(d, int) and d != s for d, s in zip(declared, shape))):
                shown = tuple(d if d is not None else "?" for d in declared)
                raise FrontendError(
                    f"shape_dict gives input {inp.name!r} shape {shape}, but the model "
                    f"declares {shown}")
            return TensorType(shape, dtype)
        if not tt.HasField("shape"):
            raise FrontendError(f"input {inp.name!r} has no declared shape; pass "
                                f"shape_dict={{{inp.name!r}: (...)}}")
        unbound = [f"{d!r} (dim {k})" if d else f"dim {k}"
                   for k, d in enumerate(declared) if not isinstance(d, int)]
        if unbound:
            raise FrontendError(
                f"input {inp.name!r} has unbound dimension(s) {', '.join(unbound)}; pass "
                f"shape_dict={{{inp.name!r}: (...)}} with a full static shape")
        return TensorType(tuple(int(d) for d in declared), dtype)  # type: ignore[arg-type]

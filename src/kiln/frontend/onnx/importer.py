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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import FrontendError, IRError, missing_dependency
from kiln.frontend.onnx import control_flow
from kiln.frontend.onnx.control_flow import CONTROL_FLOW_OPS
from kiln.frontend.onnx.converters.registry import LoopStep, converters
from kiln.frontend.onnx.dims import Declared, InputDims, declared_dims
from kiln.frontend.onnx.file_limits import check_model_file, external_data_locations
from kiln.frontend.onnx.functions import InputType, function_schema
from kiln.frontend.onnx.functions import expand as expand_function
from kiln.frontend.onnx.onnx_checker import check_onnx_model
from kiln.frontend.onnx.raw_data import load_external_data, read_with_views
from kiln.frontend.onnx.shape_values import evaluate as evaluate_shape
from kiln.frontend.onnx.shape_values import is_constant, shape_value
from kiln.frontend.onnx.unsupported_hints import next_steps
from kiln.frontend.onnx.validate import check_graph, check_shape, itemsize
from kiln.ir import graph as g
from kiln.ir import weight_origin as wo
from kiln.ir.attrs import ATTR_DIM_BOUNDS, ATTR_DIM_NONZERO, ATTR_GIVEN_OUTPUT_NAMES
from kiln.ir.builder import IRBuilder
from kiln.ir.dtype import from_numpy, to_numpy
from kiln.ir.gc_pace import fewer_collections
from kiln.ir.module import IRModule
from kiln.ir.pin_hint import pin_hint, pin_hint_for
from kiln.ir.shape_expr import (
    dim_terms,
    dim_text,
    dims_equal,
    shape_text,
    simplify_dim,
)
from kiln.ir.source_nodes import SourceNode, set_source
from kiln.ir.types import Dim, TensorType, Type
from kiln.ops import registry as op_registry
from kiln.ops.assumptions import assuming_equal
from kiln.ops.reshape_dims import reshape_attr
from kiln.transform.dead_code import remove_dead_bindings
from kiln.transform.fold_constants import DEFAULT_FOLD_BUDGET, type_bytes
from kiln.transform.weight_provenance import derived, fold_call

SUPPORTED_OPSETS = range(7, 22)
# Older models are converted to this opset with onnx.version_converter.
CONVERT_OLD_TO = 13


# Constant folding while importing materialises at most this many bytes per
# value (beyond what the model's own data grows to, see `GraphImporter.call`).
DEFAULT_MAX_FOLD_BYTES = DEFAULT_FOLD_BUDGET
# A folded value may be this many times larger than the model data it derives from.
FOLD_GROWTH = 4
# A run-time tensor of a symbolic size that no input has is built from the sizes it sums
# (`past_seq + seq`), one concatenated piece per term: at most this many.
_MAX_SUM_TERMS = 8


@fewer_collections
def from_onnx(model: Any, shape_dict: dict[str, Any] | None = None, *,
              max_fold_bytes: int = DEFAULT_MAX_FOLD_BYTES, check: bool = True) -> IRModule:
    """Import `model` (a path, bytes, an onnx.ModelProto or a file read by `load_onnx`)
    as an IRModule.

    Symbolic dimensions (`dim_param`s, and dynamic dims without a name) become
    dimension variables, one per name (kiln.frontend.onnx.dims). `shape_dict` may
    pin them by input (`{"x": (1, None, 64)}`, None keeps a dim symbolic) or by
    name (`{"batch": 1}`), or bound them (`{"seq": range(1, 513)}`); it must agree
    with the fixed dimensions the model declares. The bounds of the remaining
    variables are the function attribute `kiln.dim_bounds`. The module's graph
    function `main` takes the inputs in the model's order, under their ONNX names,
    and returns the outputs in the model's order (attribute `output_names`).

    `max_fold_bytes` bounds constant folding (docs/onnx.md, "Limits"): an
    operator whose inputs are all constant is evaluated at import only if its
    value takes at most this many bytes (or at most FOLD_GROWTH times the model
    data it derives from); otherwise it stays in the graph and runs at run time.
    Values kiln must know at import (shapes, Range) that exceed it raise.

    `check` runs onnx's full checker with strict shape inference first
    (kiln.frontend.onnx.onnx_checker), so a model onnxruntime refuses (an
    attribute its opset does not define, a type error) is refused here too, with
    the node named; `check=False` (CLI: `--no-check`) skips it.

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
    check_graph(graph, in_memory=not isinstance(model, (str, os.PathLike, LoadedOnnx)))
    _check_supported(graph, opset)
    if not isinstance(check, bool):
        raise FrontendError(f"check must be True or False, got {check!r}")
    if shape_dict is not None and not isinstance(shape_dict, Mapping):
        raise FrontendError(f"shape_dict must be a dict, got {type(shape_dict).__name__}")
    dims = _input_dims(graph, dict(shape_dict or {}))
    if check:
        shapes = {i.name: dims.shape(i.name) for i in _graph_inputs(graph)}
        check_onnx_model(proto, views, {name: len(shape) for name, shape in shapes.items()
                                        if shape is not None})
    return _import_unifying(graph, opset, dict(shape_dict or {}), dims, max_fold_bytes, views)


def _import_unifying(graph: Any, opset: int, shape_dict: dict[str, Any], dims: InputDims,
                     max_fold_bytes: int, views: dict[int, Any]) -> IRModule:
    """Import `graph`, making one variable of two input dimensions the graph needs equal.

    Exporters may name one size twice (torch's `Dim.AUTO` gives the past keys' length
    `s20` and the past values' `s8`), and an operator that needs them equal cannot prove
    it. onnxruntime checks such sizes when it runs. kiln imports once assuming them
    equal (kiln.ops.assumptions), which finds every such pair, then imports again with
    each pair one variable (`s8` read as `s20`): every call then checks that the inputs
    agree, as for any variable two inputs share (docs/dynamic-shapes.md). A pair that is
    not two of the inputs' variables is refused by a plain import, naming the node.
    An input variable an operator's contract fixes (GroupQueryAttention's past head size,
    which onnxruntime-genai's builder names `kv_cache_dim`: `GraphImporter.size_is`) is
    pinned to that size and the import starts again."""
    aliases: dict[str, str] = {}
    for _ in range(2 * len(dims.names) + 1):  # each pass that goes on removes a variable
        try:
            with assuming_equal() as assumed:
                module = GraphImporter(graph, opset, dims, max_fold_bytes, views).run()
        except ContractPin as pin:  # an operator fixes the size (GraphImporter.size_is)
            shape_dict[pin.name] = pin.size
            dims = _input_dims(graph, shape_dict, aliases)
            continue
        if not assumed:
            return module
        if not _equate(aliases, assumed, dims):
            break
        dims = _input_dims(graph, shape_dict, aliases)
    return GraphImporter(graph, opset, dims, max_fold_bytes, views).run()


class ContractPin(FrontendError):
    """An operator's contract fixes an input dimension's variable (`GraphImporter.size_is`);
    `_import_unifying` imports again with it pinned."""

    def __init__(self, name: str, size: int, where: str) -> None:
        super().__init__(f"{where} fixes dimension {name!r} to {size}; pin it with "
                         f'shape_dict={{"{name}": {size}}}')
        self.name, self.size = name, size


def _equate(aliases: dict[str, str], pairs: Sequence[tuple[str, str]], dims: InputDims
            ) -> bool:
    """Add `pairs` (variables assumed equal) to `aliases` (variable -> the one it is read
    as); False when a pair is not two of the inputs' variables."""
    if not all(x in dims.vars and y in dims.vars for x, y in pairs):
        return False
    for x, y in pairs:
        keep, drop = aliases.get(x, x), aliases.get(y, y)
        keep, drop = min(keep, drop), max(keep, drop)
        if keep != drop:
            aliases.update({k: keep for k, v in aliases.items() if v == drop})
            aliases[drop] = keep
    return True


def _load(model: Any) -> tuple[Any, dict[int, Any]]:
    """The ModelProto and, for a file, its initializers' data as views of the file's
    bytes by initializer index (kiln.frontend.onnx.raw_data); others decode later."""
    import onnx  # optional: onnx (the compiler extra)

    if isinstance(model, LoadedOnnx):
        return model.proto, model.views
    if isinstance(model, onnx.ModelProto):
        return model, {}
    if isinstance(model, (bytes, bytearray)):
        return _parse_bytes(bytes(model)), {}
    if not isinstance(model, (str, os.PathLike)):
        raise FrontendError(f"from_onnx expects a path, bytes or onnx.ModelProto, got "
                            f"{type(model).__name__}")
    loaded = load_onnx(model)
    return loaded.proto, loaded.views


@dataclass(frozen=True)
class LoadedOnnx:
    """An ONNX file read once (`load_onnx`): its proto with the external data loaded,
    its initializers' data as views of the file's bytes (kiln.frontend.onnx.raw_data),
    and the external data files it read, relative to its folder. `from_onnx` takes it
    as it takes the path, once (an import may fill the proto's raw data)."""

    path: str
    proto: Any
    views: dict[int, Any]
    external_data: tuple[str, ...]


def load_onnx(model: str | os.PathLike[str]) -> LoadedOnnx:
    """The ONNX file at `model`, read once (`LoadedOnnx`); FrontendError naming it when it
    is missing, too large, not ONNX, or its external data cannot be loaded, and
    MissingDependencyError naming the compiler extra on a runtime-only install."""
    try:
        from google.protobuf.message import (
            DecodeError,  # optional: google (onnx's protobuf, the compiler extra)
        )
        from onnx.checker import ValidationError  # optional: onnx (the compiler extra)
    except ImportError as exc:  # `pip install kiln-tensor` alone: name the extra
        raise (missing_dependency(exc, "reading an ONNX model") or exc) from exc

    path = _model_file(model)
    try:
        proto, views = read_with_views(path)
        external = tuple(external_data_locations(proto))  # before the data replaces them
        load_external_data(proto, path, views)
    except ValidationError as exc:  # onnx checks external data locations while loading
        raise FrontendError(f"{path!r}: its external data cannot be loaded: {exc}") from exc
    except FrontendError:  # the size limits (file_limits) already name the file
        raise
    except (DecodeError, ValueError, RuntimeError, OSError) as exc:
        raise _unreadable(path, exc) from exc
    return LoadedOnnx(path, _check_nonempty(proto, repr(path), lambda: _head(path)), views,
                      external)


def parse_onnx(source: bytes | bytearray | str | os.PathLike[str]) -> Any:
    """The onnx.ModelProto of serialized model bytes or of the file at a path, its
    external data not loaded: for readers of the model's fields (names, metadata), not
    of its weights as arrays.

    Raises FrontendError naming the file (or the bytes) and what it holds instead when
    it is not an ONNX model: missing, a directory, empty, truncated, another format,
    and MissingDependencyError naming the compiler extra on a runtime-only install.
    """
    try:
        import onnx  # optional: onnx (the compiler extra)
        from google.protobuf.message import (
            DecodeError,  # optional: google (onnx's protobuf, the compiler extra)
        )
    except ImportError as exc:  # `pip install kiln-tensor` alone: name the extra
        raise (missing_dependency(exc, "reading an ONNX model") or exc) from exc

    if isinstance(source, (bytes, bytearray)):
        return _parse_bytes(bytes(source))
    if not isinstance(source, (str, os.PathLike)):
        raise FrontendError(f"expected an ONNX file's path or its bytes, got "
                            f"{type(source).__name__}")
    path = _model_file(source)
    try:
        proto = onnx.load(path, load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError) as exc:
        raise _unreadable(path, exc) from exc
    return _check_nonempty(proto, repr(path), lambda: _head(path))


def _parse_bytes(data: bytes) -> Any:
    import onnx  # optional: onnx (the compiler extra)
    from google.protobuf.message import (
        DecodeError,  # optional: google (onnx's protobuf, the compiler extra)
    )

    try:
        proto = onnx.load_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise FrontendError(f"these {len(data)} bytes are not an ONNX model: "
                            f"{_found(data[:_HEAD_BYTES])} ({exc})") from exc
    return _check_nonempty(proto, f"these {len(data)} model bytes", lambda: data[:_HEAD_BYTES])


def _model_file(model: str | os.PathLike[str]) -> str:
    """`model` as a path to an existing file (FrontendError naming it otherwise)."""
    path = os.fspath(model)
    if not os.path.exists(path):
        raise FrontendError(f"ONNX model file {path!r} does not exist")
    if os.path.isdir(path):
        raise FrontendError(f"{path!r} is a directory, not an ONNX model file")
    check_model_file(path)  # its size, before a byte is read (docs/security.md, "Limits")
    return path


def _unreadable(path: str, exc: Exception) -> FrontendError:
    return FrontendError(f"{path!r} is not a readable ONNX model: {_found(_head(path))} "
                         f"({exc})")


# Enough of a file to tell its format: a tar header's magic is at byte 257.
_HEAD_BYTES = 512
# Formats a file given as an ONNX model may be instead: (magic, its offset, what it is).
_OTHER_FORMATS = (
    (b"\x7fELF", 0, "an ELF file, such as a compiled library, not a model (a kiln library "
                    "loads with kiln.runtime.load_module, `kiln run`, or InferenceSession "
                    "from a .so path)"),
    (b"KILNBLOB", 0, "a kiln blob (kiln.artifact.load reads it)"),
    (b"\x93NUMPY", 0, "a NumPy .npy array, not a model: the model is the .onnx file, and "
                      "an array is an input (`kiln run MODEL.so --input NAME=FILE.npy`)"),
    (b"ustar", 257, "a tar archive, such as a kiln .tar library or an MLF archive"),
    (b"PK\x03\x04", 0, "a zip archive, such as a PyTorch checkpoint (kiln.from_torch "
                        "imports a torch.nn.Module)"),
    (b"\x1f\x8b", 0, "gzip-compressed data (decompress it first)"),
)


def _head(path: str) -> bytes | None:
    """The first bytes of the file at `path`, None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(_HEAD_BYTES)
    except OSError:
        return None


def _found(head: bytes | None) -> str:
    """What a file or bytes that are not an ONNX model hold, by their first bytes."""
    if head is None:
        return "it cannot be read"
    if not head:
        return "it is empty"
    for magic, offset, what in _OTHER_FORMATS:
        if head[offset:offset + len(magic)] == magic:
            return f"it is {what}"
    return f"it starts with {head[:16]!r}"


def _check_nonempty(proto: Any, what: str, head: Callable[[], bytes | None]) -> Any:
    """`proto` when it holds a graph and, as a file cut short may not, its opset imports;
    `head` gives the first bytes of what was parsed, for the message."""
    # Protobuf parses many random byte strings into an empty message.
    if not proto.graph.node and not proto.graph.output:
        raise FrontendError(f"{what} hold no ONNX graph: {_found(head())} (an ONNX model that is "
                            "empty or truncated, or not an ONNX file)")
    # A file cut right after its graph parses too; IR version 3 on requires opset imports.
    if proto.ir_version >= 3 and not proto.opset_import:
        raise FrontendError(f"{what} hold an ONNX model of IR version {proto.ir_version} "
                            "without its opset imports: the file is truncated or damaged")
    return proto


def _default_opset(proto: Any) -> int:
    for imp in proto.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    if not proto.opset_import:
        # IR version < 3 models carry no opset_import: they are opset 1.
        return 1
    if all(_text(imp.domain) == "ai.onnx.ml" for imp in proto.opset_import) and all(
            _text(n.domain) == "ai.onnx.ml" for n in proto.graph.node):
        # A classical-ML model (ai.onnx.ml only) uses no default-domain operator.
        return SUPPORTED_OPSETS.stop - 1
    raise FrontendError("the model does not import the default ONNX opset (domain '')")


def _upgrade(proto: Any, opset: int) -> tuple[Any, int]:
    try:
        from onnx import version_converter  # optional: onnx (the compiler extra)

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


def unsupported_ops(graph: Any, opset: int) -> dict[str, list[str]]:
    """The op types of `graph` (its top level) kiln cannot import, each with the labels
    of its nodes: {"domain.Op" or "Op": ["'name'", "#3 (output 'y')", ...]}."""
    table = converters()
    missing: dict[str, list[str]] = {}
    for k, node in enumerate(graph.node):
        key = _op_key(node)
        if key not in table and key not in CONTROL_FLOW_OPS and function_schema(
                _text(node.op_type), _text(node.domain), opset) is None:
            missing.setdefault(key, []).append(_node_label(node, k))
    return missing


def default_opset(proto: Any) -> int:
    """The model's default-domain opset (FrontendError when it imports none)."""
    return _default_opset(proto)


def _check_supported(graph: Any, opset: int) -> None:
    """Raise one FrontendError listing every unsupported op type, with counts and nodes."""
    missing = unsupported_ops(graph, opset)
    if missing:
        lines = []
        for op, names in sorted(missing.items()):
            count, shown = len(names), names[:5]
            more = f" and {count - len(shown)} more" if count > len(shown) else ""
            lines.append(f"  {op} x{count}: node{'s' if count > 1 else ''} "
                         f"{', '.join(shown)}{more}")
        raise FrontendError(
            f"the model uses {len(missing)} operator type(s) kiln does not support "
            f"(opset {opset}):\n" + "\n".join(lines + next_steps(missing)))


def _onnx_elem_type(dtype: str) -> int:
    from onnx import helper  # optional: onnx (the compiler extra)

    return int(helper.np_dtype_to_tensor_dtype(np.dtype(to_numpy(dtype))))


def _check_declared_type(out: Any, value: g.Expr) -> None:
    """A graph output's declared element type is the one the graph computes. onnx's
    checker cannot see it on an output declared without a shape (`_declare_ranks` drops
    those), and onnxruntime refuses such a model: the caller would get another type."""
    from onnx import TensorProto  # optional: onnx (the compiler extra)

    declared = out.type.tensor_type.elem_type if out.type.HasField("tensor_type") else 0
    if not declared or not isinstance(value.type, TensorType):
        return
    try:
        computed = _onnx_elem_type(value.type.dtype)
    except (IRError, KeyError, TypeError, ValueError):  # a type ONNX has no number for
        return
    if computed != declared:
        name = TensorProto.DataType.Name(declared) if declared in TensorProto.DataType.values() \
            else f"element type {declared}"
        raise FrontendError(f"graph output {_text(out.name)!r} is declared {name} but the "
                            f"graph computes {value.type.dtype} "
                            f"({TensorProto.DataType.Name(computed)})")


def _graph_inputs(graph: Any) -> list[Any]:
    init_names = {t.name for t in graph.initializer}
    return [i for i in graph.input if i.name not in init_names]


def _input_dims(graph: Any, shape_dict: dict[str, Any],
                aliases: Mapping[str, str] | None = None) -> InputDims:
    """The inputs' dimensions resolved against `shape_dict` (pins, bounds, variables),
    the variables named in `aliases` read as the one they map to."""
    declared: dict[str, list[Declared] | None] = {}
    for inp in _graph_inputs(graph):
        tt = inp.type.tensor_type
        declared[inp.name] = declared_dims(tt) if inp.type.HasField("tensor_type") else None
    return InputDims(declared, shape_dict, aliases=dict(aliases or {}))


def _decode_attr(attr: Any) -> Any:
    from onnx import helper, numpy_helper  # optional: onnx (the compiler extra)

    if attr.type == attr.GRAPH or attr.type == attr.GRAPHS:
        raise FrontendError(f"attribute {attr.name!r} holds a subgraph; kiln imports "
                            f"subgraphs of {', '.join(CONTROL_FLOW_OPS)} only")
    value = helper.get_attribute_value(attr)
    if attr.type == attr.TENSOR:
        return numpy_helper.to_array(value)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, list):
        return tuple(v.decode("utf-8") if isinstance(v, bytes) else v for v in value)
    return value


class GraphImporter:
    """Converts the nodes of one graph in order; it is the converters' GraphContext."""

    def __init__(self, graph: Any, opset: int, dims: InputDims,
                 max_fold_bytes: int = DEFAULT_MAX_FOLD_BYTES,
                 views: dict[int, Any] | None = None) -> None:
        self.graph = graph
        self.views = views or {}  # initializer index -> its data, read already
        self.opset = opset
        self.input_dims = dims
        self.max_fold_bytes = max_fold_bytes
        # Folded constants -> bytes of model data they derive from (others: their own size).
        self._origin: dict[int, tuple[g.Constant, int]] = {}
        # Calls left unfolded for the budget -> why (for "must be a constant" errors).
        self._unfolded: dict[g.Expr, str] = {}
        # Initializers whose values the import read into the graph's structure.
        self.baked: set[str] = set()
        self.values: dict[str, g.Expr] = {}
        # Values computed from symbolic dimensions -> their elements as dimensions.
        self.shape_values: dict[g.Expr, np.ndarray] = {}
        self._true_of: dict[str, g.Expr] = {}  # shape text -> true_of_shape(shape)
        self.ib = IRBuilder()
        self.node_outputs: tuple[str, ...] = ()
        self.params: set[g.Expr] = set()
        self._where = "model"
        # The ONNX node being converted (a function body's nodes are their caller's).
        self._source: SourceNode | None = None
        self._expanding = 0  # function bodies being expanded, nested
        self._functions = 0  # function-body expansions so far (their value name prefixes)
        # If branches and Loop bodies (control_flow.py), shared with nested importers
        self.functions: dict[str, g.Function] = {}
        self.function_names: set[str] = {"main"}  # given out, bodies still being imported
        # A body a converter builds (control_flow.converter_loop): the graph whose values
        # `outer` captures, and those values in the order of their parameters
        self.enclosing: GraphImporter | None = None
        self.captured: list[g.Expr] = []
        self._capture_params: dict[g.Expr, g.Var] = {}

    @property
    def where(self) -> str:
        """The node being converted, for messages."""
        return self._where

    @where.setter
    def where(self, text: str) -> None:
        self._where = text

    def _emit(self, expr: g.Expr, name: str) -> g.Var:
        """Bind `expr` in the graph being built, recorded as a value of the ONNX node
        being converted (kiln.ir.source_nodes: what messages about it name)."""
        var = self.ib.emit(expr, name)
        if self._source is not None:
            set_source(var, self._source)
        return var

    def sub_importer(self, graph: Any) -> GraphImporter:
        """An importer for a subgraph of this graph (an If branch, a Loop body)."""
        sub = GraphImporter(graph, self.opset, self.input_dims, self.max_fold_bytes)
        sub.baked = self.baked
        sub.functions = self.functions
        sub.function_names = self.function_names
        return sub

    # ---------------------------------------------------------------- GraphContext

    def outer(self, expr: g.Expr) -> g.Expr:
        """`expr`, a value of the enclosing graph, as this body reads it: a constant in
        place, another value through a parameter the loop passes in (one per value)."""
        if self.enclosing is None or isinstance(expr, g.Constant):
            return expr
        param = self._capture_params.get(expr)
        if param is None:
            param = self.ib.param("captured", expr.type)
            self._capture_params[expr] = param
            self.captured.append(expr)
            self.params.add(param)
            if expr in self.enclosing.shape_values:
                self.shape_values[param] = self.enclosing.shape_values[expr]
        return param

    def loop(self, hint: str, trip: g.Expr, states: Sequence[g.Expr], length: Dim,
             step: LoopStep) -> list[g.Expr]:
        """A Loop whose body `step` builds (control_flow.converter_loop)."""
        return control_flow.converter_loop(self, hint, trip, states, length, step)

    def require_nonzero(self, size: Dim, what: str) -> None:
        """Record that a call must fail when `size` is 0 (the node divides by it, e.g. a
        Reshape's -1); `what` says why. A constant 0 fails the import here."""
        size = simplify_dim(size)
        if isinstance(size, int):
            if size == 0:
                raise FrontendError(f"{self._where}: {what}, which is 0")
            return
        self.input_dims.nonzero.setdefault(dim_text(size), f"{self._where}: {what}")

    def size_is(self, size: Dim, value: int, what: str) -> None:
        """The node's contract says `size` is `value`. A symbolic input dimension the user
        left free (no shape_dict entry) is pinned to it: the import starts again with it
        pinned (ContractPin), as onnxruntime would refuse any other size at run time.
        Anything else is left to the operators that need the sizes equal."""
        size = simplify_dim(size)
        if isinstance(size, int) or dim_text(size) not in self.input_dims.vars:
            return
        name = dim_text(size)
        if self.input_dims.vars[name] == size and name not in self.input_dims.bounds:
            raise ContractPin(name, value, f"{self._where}: {what}")

    def call(self, op: str, *args: g.Expr, **attrs: Any) -> g.Expr:
        """Emit `op(*args, **attrs)`, folded into a Constant when every arg is constant."""
        try:
            expr = op_registry.call(op, *args, **attrs)
        except IRError as exc:
            raise FrontendError(f"{self._where}: {self._with_pin_hint(exc, args)}") from exc
        consts = [a for a in args if isinstance(a, g.Constant)]
        if len(consts) == len(args) and op not in op_registry.KEPT_AT_IMPORT:
            # The size comes from the inferred type, before anything is materialised:
            # a tiny model can ask for terabytes (ConstantOfShape, Expand, Tile...).
            origin = sum(self._origin_bytes(a) for a in consts)
            nbytes = type_bytes(expr.type)
            if nbytes <= max(self.max_fold_bytes, FOLD_GROWTH * origin):
                folded = op_registry.evaluate_call(op, [a.data for a in consts], expr.attrs)
                values = [a.data for a in consts]
                if isinstance(folded, tuple):
                    return fold_call(op, expr.attrs, values,
                                     g.Tuple(tuple(self._folded(f, origin) for f in folded)))
                return fold_call(op, expr.attrs, values, self._folded(folded, origin))
            var = self._emit(expr, op)
            self._unfolded[var] = (f"{self._where} computes it at run time: its value of "
                                   f"{nbytes} bytes is above the fold budget of "
                                   f"{self.max_fold_bytes} bytes (from_onnx max_fold_bytes)")
            return var
        known = self._shape_value(op, args, expr)
        if known is not None and is_constant(known):
            return self._folded(known.astype(to_numpy(self.tensor_type(expr).dtype)),
                                int(known.size) * 8)
        var = self._emit(expr, op)
        if known is not None:
            self.shape_values[var] = known
        return var

    def _shape_value(self, op: str, args: tuple[g.Expr, ...], expr: g.Call) -> Any:
        """The value of `expr` as dimensions (shape_values) when it is shape arithmetic
        on symbolic dimensions, else None."""
        if op == "shape_of":
            x = self.tensor_type(args[0])
            start, end = int(expr.attrs["start"]), int(expr.attrs["end"])  # type: ignore[arg-type]
            return shape_value(x.shape[start:end])
        if not any(a in self.shape_values for a in args) or not isinstance(
                expr.type, TensorType):
            return None
        values = []
        for a in args:
            if a in self.shape_values:
                values.append(self.shape_values[a])
            elif isinstance(a, g.Constant):
                values.append(a.data)
            else:
                return None
        return evaluate_shape(op, values, expr.attrs, expr.type.dtype)

    def true_of_shape(self, shape: Sequence[Dim]) -> g.Expr:
        """An all-true bool tensor of `shape`. A symbolic dimension is read at run time from
        an input of the model that has it; IRError if no input does (`seq*2`)."""
        key = shape_text(shape)
        if key not in self._true_of:
            self._true_of[key] = self._make_true_of_shape(shape)
        return self._true_of[key]

    def _make_true_of_shape(self, shape: Sequence[Dim]) -> g.Expr:
        yes = derived(g.Constant(np.array(True)), wo.LITERAL)
        out: g.Expr | None = None
        for k, d in enumerate(shape):
            if isinstance(d, int):
                continue
            target: list[Dim] = [1] * len(shape)
            target[k] = d
            line = self._true_line(d, shape)
            line = self.call("reshape", line, shape=reshape_attr(
                self.tensor_type(line).shape, target))
            out = line if out is None else self.call("logical_and", out, line)
        static = tuple(d if isinstance(d, int) else 1 for d in shape)
        return self.call("broadcast_to", yes if out is None else out, shape=static)

    def _true_line(self, d: Dim, shape: Sequence[Dim]) -> g.Expr:
        """An all-true 1-D bool tensor of the symbolic size `d`: an axis of a model input
        that has the size (the input's first element along each other axis, summed over
        them: any values do), or for a sum of such sizes and constants (`past_seq + seq`,
        a key/value cache followed by new tokens) the lines of its terms concatenated."""
        yes = derived(g.Constant(np.array(True)), wo.LITERAL)
        found = self._input_axis(d)
        if found is not None:
            param, axis = found
            line = param if self.tensor_type(param).dtype != "bool" else \
                self.call("cast", param, dtype="uint8")
            others = tuple(j for j in range(self.tensor_type(param).ndim) if j != axis)
            if others:
                # one element along the other axes (none where one is empty: the sum is
                # then 0, the line still `d` long): the whole input summed read all of it
                # (an LSTM's `[seq, batch, 128]` x for a line of `batch`, 1% of its call)
                n = len(others)
                line = self.call("strided_slice", line, starts=(0,) * n, ends=(1,) * n,
                                 axes=others, steps=(1,) * n)
                line = self.call("reduce_sum", line, axes=others, keepdims=False)
            return self.call("where", self.call("cast", line, dtype="bool"), yes, yes)
        terms = dim_terms(d)
        if terms is None or len(terms) < 2 or len(terms) > _MAX_SUM_TERMS or any(
                not isinstance(t, int) and self._input_axis(t) is None for t in terms):
            raise IRError(f"the size {dim_text(d)} is no input's dimension (nor a sum of "
                          f"them): kiln cannot make a tensor of shape {shape_text(shape)}; "
                          f"{pin_hint_for([shape])}")
        lines = [self.call("broadcast_to", yes, shape=(t,)) if isinstance(t, int)
                 else self._true_line(t, shape) for t in terms]
        return self.call("concat", *lines, axis=0)

    def _input_axis(self, d: Dim) -> tuple[g.Expr, int] | None:
        """The first model input (in model order) with an axis of size `d`, and the axis."""
        inputs = [self.values[i.name] for i in _graph_inputs(self.graph)]
        return next(((p, j) for p in inputs for j, pd in enumerate(self.tensor_type(p).shape)
                     if not isinstance(pd, int) and dims_equal(pd, d) is True), None)

    def dims(self, expr: g.Expr | None) -> np.ndarray | None:
        if isinstance(expr, g.Constant):
            return self._read(expr)
        return self.shape_values.get(expr) if expr is not None else None

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
        return derived(g.Constant(arr), wo.LITERAL)

    def value(self, expr: g.Expr | None) -> np.ndarray | None:
        return self._read(expr) if isinstance(expr, g.Constant) else None

    def _read(self, const: g.Constant) -> np.ndarray:
        """`const`'s value, read at import into the graph's structure (an axis, a shape):
        the weights it comes from are baked into the code (kiln.ir.weight_origin)."""
        for w in wo.leaves(wo.origin_of(const.data)):
            self.baked.add(w.name)
        return const.data

    def _with_pin_hint(self, exc: Exception, inputs: Sequence[g.Expr | None]) -> str:
        """The text of `exc`, with the pin hint appended when an op rule refused a symbolic
        size without saying how to pin it (op rules do not know about shape_dict or CLI)."""
        text = str(exc)
        if isinstance(exc, IRError) and "symbolic" in text and "shape_dict=" not in text:
            return f"{text}; {self._pin_hint(inputs)}"
        if isinstance(exc, IRError) and "must be a compile-time constant" in text and \
                "shape_dict=" not in text and self.input_dims.vars:
            # A value kiln could not follow, in a model with symbolic dimensions: most often
            # computed from them (a Resize size from the image's); pinning makes it constant.
            return (f"{text}; if it is computed from the input shapes, "
                    f"{pin_hint(self.input_dims.vars)}")
        return text

    def _pin_hint(self, inputs: Sequence[g.Expr | None]) -> str:
        """How to pin the symbolic dimensions of a node's tensor `inputs` (pin_hint)."""
        shapes = [t.shape for t in (x.type for x in inputs if x is not None)
                  if isinstance(t, TensorType)]
        return pin_hint_for(shapes)

    def tensor_type(self, expr: g.Expr) -> TensorType:
        t = expr.type
        if not isinstance(t, TensorType):
            raise FrontendError(f"{self._where}: expected a tensor, got {t}")
        return t

    def item(self, expr: g.Expr, index: int) -> g.Expr:
        """Element `index` of a tuple-valued expression (folded when constant)."""
        if isinstance(expr, g.Tuple):
            return expr.fields[index]
        return self._emit(g.TupleGetItem(expr, index), "item")

    # ---------------------------------------------------------------- import

    def run(self) -> IRModule:
        from onnx import numpy_helper  # optional: onnx (the compiler extra)

        with self.ib.function("main"):
            for inp in _graph_inputs(self.graph):
                param = self.ib.param(inp.name, self._input_type(inp))
                self.values[inp.name] = param
                self.params.add(param)
            for i, init in enumerate(self.graph.initializer):
                try:
                    data = self.views[i] if i in self.views else numpy_helper.to_array(init)
                    const = g.Constant(data, init.name)
                    wo.record(const.data, wo.weight(init.name, const.data))
                    self.values[init.name] = const
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
                _check_declared_type(out, self.values[out.name])
                outputs.append(self._as_result(self.values[out.name], seen))
            if not outputs:
                raise FrontendError("the model has no outputs")
            self.ib.func_attr(ATTR_GIVEN_OUTPUT_NAMES, tuple(o.name for o in self.graph.output))
            if self.input_dims.vars:
                self.ib.func_attr(ATTR_DIM_BOUNDS, self.input_dims.dim_bounds())
            if self.input_dims.nonzero:
                self.ib.func_attr(ATTR_DIM_NONZERO, tuple(self.input_dims.nonzero.items()))
            self.ib.ret(outputs[0] if len(outputs) == 1 else g.Tuple(tuple(outputs)))
        mod = self.ib.get()
        for name, fn in self.functions.items():
            mod = mod.with_function(name, fn)
        if self.shape_values:
            # Shape computations whose values became static attributes are dead.
            main = mod["main"]
            assert isinstance(main, g.Function)
            mod = mod.with_function("main", remove_dead_bindings(main))
        return mod.with_attrs(**{wo.ATTR_WEIGHTS: self._weights_table()})

    def _weights_table(self) -> tuple[tuple[Any, ...], ...]:
        """The model's named weights for the replay record (kiln.ir.weight_origin.table)."""
        rows = []
        for name in dict.fromkeys(i.name for i in self.graph.initializer):
            const = self.values.get(name)
            if isinstance(const, g.Constant):
                rows.append(wo.table_row(name, const.data, name in self.baked))
        return tuple(rows)

    def _as_result(self, expr: g.Expr, seen: set[g.Expr]) -> g.Expr:
        # Every output is a value computed by main's bindings, and a distinct one:
        # constants, inputs passed through and repeated outputs get a copy.
        if isinstance(expr, g.Constant) or expr in seen or expr in self.params:
            expr = self.ib.emit(op_registry.call("copy", expr), "out")
        seen.add(expr)
        return expr

    def _convert(self, node: Any, index: int) -> None:
        self._where = f"node {_node_label(node, index)} ({_text(node.op_type)})"
        if not self._expanding:
            self._source = SourceNode(_text(node.name), _text(node.op_type),
                                      next((_text(o) for o in node.output if o), ""))
        key = _op_key(node)
        if key not in converters() and key not in CONTROL_FLOW_OPS:
            # _check_supported let it through: onnx defines it by a function body
            self._convert_function(node, index)
            return
        conv = None if key in CONTROL_FLOW_OPS else converters().get(key)
        if conv is not None and self.opset < conv.min_opset:
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
        outs: Sequence[g.Expr]
        try:
            if conv is None:
                outs = control_flow.convert(self, node, inputs)
            else:
                attrs = {a.name: _decode_attr(a) for a in node.attribute}
                outs = conv.fn(self, inputs, attrs)
        except FrontendError as exc:
            if str(exc).startswith("node "):
                raise
            raise FrontendError(f"{self._where}: {exc}") from exc
        except KeyError as exc:
            raise FrontendError(f"{self._where}: missing attribute or input {exc}") from exc
        except (AssertionError, IndexError) as exc:
            # converters index their inputs unchecked, but a converter's own bug lands
            # here too: the text says which it may be
            raise FrontendError(f"{self._where}: a required input is missing (the node has "
                                f"{len(node.input)} input(s)), or kiln's converter failed: "
                                f"{type(exc).__name__}: {exc}") from exc
        except (IRError, ValueError, TypeError, ArithmeticError) as exc:
            if isinstance(exc, IRError) and "is not static" in str(exc):
                raise FrontendError(f"{self._where}: kiln does not import this operator over "
                                    f"symbolic dimensions yet ({exc}); "
                                    f"{self._pin_hint(inputs)}") from exc
            raise FrontendError(f"{self._where}: {self._with_pin_hint(exc, inputs)}") from exc
        for name, value in zip(node.output, outs):
            if name:
                self.values[name] = value

    def _convert_function(self, node: Any, index: int) -> None:
        """Import `node` as its ONNX function body (kiln.frontend.onnx.functions)."""
        where = self._where
        types: list[InputType] = []
        for name in node.input:
            t = self.values[name].type if name in self.values else None
            types.append((_onnx_elem_type(t.dtype), tuple(
                d if isinstance(d, int) else dim_text(d) for d in t.shape))
                if isinstance(t, TensorType) else None)
        self._functions += 1
        try:
            body, body_opset = expand_function(node, self.opset, types,
                                               f"{_text(node.op_type)}{self._functions}::")
        except FrontendError as exc:
            raise FrontendError(f"{where}: {exc}") from exc
        outer = self.opset
        self.opset = body_opset
        self._expanding += 1
        try:
            for k, inner in enumerate(body):
                if _op_key(inner) not in converters() and \
                        _op_key(inner) not in CONTROL_FLOW_OPS and function_schema(
                        _text(inner.op_type), _text(inner.domain), body_opset) is None:
                    raise FrontendError(f"its ONNX function body uses {_op_key(inner)}, which "
                                        "kiln does not support")
                self._convert(inner, k)
        except FrontendError as exc:
            raise FrontendError(f"{where}, imported as its ONNX function body: {exc}") from exc
        finally:
            self.opset = outer
            self._expanding -= 1
        self._where = where

    def _input_type(self, inp: Any) -> Type:
        if inp.type.WhichOneof("value") != "tensor_type":
            kind = inp.type.WhichOneof("value") or "untyped"
            raise FrontendError(f"input {inp.name!r} is a {kind.replace('_type', '')}; kiln "
                                "imports tensor inputs only")
        tt = inp.type.tensor_type
        from onnx import helper  # optional: onnx (the compiler extra)

        try:
            dtype = from_numpy(helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except (IRError, KeyError, TypeError, ValueError) as exc:
            raise FrontendError(f"input {inp.name!r}: unsupported element type "
                                f"{tt.elem_type}: {exc}") from exc
        shape = self.input_dims.shape(inp.name)
        if shape is None:
            raise FrontendError(f"input {inp.name!r} has no declared shape; pass "
                                f"shape_dict={{{inp.name!r}: (...)}}")
        elem_size = itemsize(tt.elem_type)
        given = inp.name in self.input_dims.shape_dict
        check_shape(f"shape_dict[{inp.name!r}]" if given else f"input {inp.name!r}",
                    [d if isinstance(d, int) else 1 for d in shape], elem_size)
        return TensorType(shape, dtype)

"""Structural checks of an untrusted ONNX graph, run before anything is converted.

onnxruntime (and `onnx.checker`) reject graphs that break single assignment or
declare impossible tensors; kiln rejects the same ones up front, with a
FrontendError that names the values at fault, instead of importing a graph in
which one name silently wins over another.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from kiln.errors import FrontendError

# Every tensor's byte size must fit the int64 sizes and strides of the ABI
# (docs/abi.md); a larger shape cannot be a real tensor.
MAX_TENSOR_BYTES = (1 << 63) - 1


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _duplicates(names: list[str]) -> list[str]:
    return sorted(n for n, c in Counter(names).items() if c > 1)


def _shown(names: list[str], limit: int = 5) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(repr(n) for n in names[:limit]) + more


def itemsize(elem_type: int) -> int:
    """Bytes per element of ONNX element type `elem_type` (1 when unknown: checked later)."""
    from onnx import helper  # optional: onnx (the compiler extra)

    try:
        return int(np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize)
    except (KeyError, TypeError, ValueError):
        return 1


def check_shape(what: str, dims: Any, elem_size: int) -> None:
    """FrontendError naming `what` if a dimension is negative or the byte size overflows."""
    dims = [int(d) for d in dims]
    bad = [d for d in dims if d < 0]
    if bad:
        raise FrontendError(f"{what} has a negative dimension {bad[0]} in shape {tuple(dims)}")
    nbytes = elem_size
    for d in dims:
        nbytes *= d
    if nbytes > MAX_TENSOR_BYTES:
        raise FrontendError(f"{what} has shape {tuple(dims)}: {nbytes} bytes, more than any "
                            f"tensor can hold (the limit is 2**63 - 1 bytes)")


def check_graph(graph: Any, *, in_memory: bool) -> None:
    """Reject graphs onnxruntime rejects: duplicate inputs, initializers or producers,
    initializers and inputs of impossible shapes, external data kiln cannot locate.

    `in_memory`: the model came as bytes or a ModelProto, so external data files
    have no directory to be found in.
    """
    inputs = [_text(i.name) for i in graph.input]
    inits = [_text(t.name) for t in graph.initializer]
    for kind, names in (("input", inputs), ("initializer", inits)):
        if "" in names:
            raise FrontendError(f"graph {kind} #{names.index('')} has an empty name (an empty "
                                "name marks an omitted optional input in ONNX)")
    dup = _duplicates(inputs)
    if dup:
        raise FrontendError(f"the graph declares input(s) {_shown(dup)} more than once")
    dup = _duplicates(inits)
    if dup:
        raise FrontendError(f"the graph has several initializers named {_shown(dup)}")
    producers: dict[str, str] = {n: "a graph input" for n in inputs}
    producers.update({n: "an initializer" for n in inits})
    for k, node in enumerate(graph.node):
        label = repr(_text(node.name)) if node.name else f"#{k}"
        here = f"node {label} ({_text(node.op_type)})"
        for out in node.output:
            name = _text(out)
            if not name:
                continue
            if name in producers:
                raise FrontendError(f"value {name!r} is written by {here} and also by "
                                    f"{producers[name]}; a value has one producer")
            producers[name] = here
    for t in graph.initializer:
        what = f"initializer {_text(t.name)!r}"
        check_shape(what, t.dims, itemsize(t.data_type))
        if in_memory and t.data_location == t.EXTERNAL:
            location = next((_text(e.value) for e in t.external_data if e.key == "location"),
                            "?")
            raise FrontendError(f"{what} keeps its data in the external file {location!r}; "
                                "pass the model's path to from_onnx so the file can be found "
                                "next to it")
    for inp in graph.input:
        if inp.type.WhichOneof("value") != "tensor_type":
            continue
        tt = inp.type.tensor_type
        fixed = [int(d.dim_value) for d in tt.shape.dim if d.HasField("dim_value")]
        check_shape(f"input {_text(inp.name)!r}", fixed, itemsize(tt.elem_type))
    check_attributes(graph)


#: Integer attributes of the standard operators that are flags: ONNX defines them as
#: 0 or 1 only, and runtimes read other values differently (onnxruntime takes
#: `keepdims == 1` as true, a C reader `keepdims != 0`), so any other value is refused.
FLAGS = frozenset({
    "allowzero", "antialias", "ceil_mode", "center_point_box", "count_include_pad",
    "detect_negative", "detect_positive", "exclude_outside", "exclusive", "fmod",
    "input_forget", "keepdims", "largest", "linear_before_reset", "noop_with_empty_axes",
    "reverse", "saturate", "select_last_index", "sorted", "storage_order", "training_mode",
    "transA", "transB", "upper",
})

#: Integer attributes that must not be negative, by operator: onnx's own shape
#: inference indexes arrays with them unchecked (a negative GatherND batch_dims
#: crashes it, and onnxruntime with it).
NON_NEGATIVE = {"GatherND": ("batch_dims",)}


def check_attributes(graph: Any) -> None:
    """FrontendError for a flag attribute other than 0 or 1, or a negative count, in
    `graph` or any subgraph, checked before onnx's checker reads them."""
    from onnx import AttributeProto  # optional: onnx (the compiler extra)

    for k, node in enumerate(graph.node):
        op = _text(node.op_type)
        here = f"node {_text(node.name)!r}" if node.name else f"node #{k}"
        for attr in node.attribute:
            name = _text(attr.name)
            if attr.type == AttributeProto.INT and node.domain in ("", "ai.onnx"):
                if name in FLAGS and attr.i not in (0, 1):
                    raise FrontendError(f"{here} ({op}): attribute {name} is a flag, 0 or 1; "
                                        f"got {attr.i}")
                if name in NON_NEGATIVE.get(op, ()) and attr.i < 0:
                    raise FrontendError(f"{here} ({op}): attribute {name} must not be "
                                        f"negative, got {attr.i}")
            elif attr.type == AttributeProto.GRAPH:
                check_attributes(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    check_attributes(sub)

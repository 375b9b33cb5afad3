"""ONNX operators that onnx defines by a function body, imported as that body.

Many operators of the standard (Attention, RotaryEmbedding, NegativeLogLikelihoodLoss,
SoftmaxCrossEntropyLoss, HannWindow, ...) come with a FunctionProto of simpler
operators, for some of them built from the node's attributes and input types (a
*context-dependent* function). An operator kiln has no converter for, but that
onnx defines this way, is imported as its body (`expand`): the body's formal
inputs and outputs become the node's actual values, its internal values get a
prefix unique to the node, its attribute references (`ref_attr_name`) take the
node's attribute or the schema's default, and the importer converts each body
node like any other, with the opset the body is written for (a body node may
itself be such a function, expanded in turn).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kiln.errors import FrontendError
from kiln.frontend.onnx import attention_body

# An input's type for a context-dependent function: (ONNX element type, dims),
# a dim being an int or a symbolic name; None for an omitted optional input.
InputType = tuple[int, tuple[int | str, ...]] | None


def function_schema(op_type: str, domain: str, opset: int) -> Any | None:
    """The onnx OpSchema in effect for `op_type` at `opset` when onnx defines it by a
    function body (plain or context-dependent), else None. Default domain only."""
    if domain not in ("", "ai.onnx"):
        return None
    from onnx import defs  # optional: onnx (the compiler extra)

    try:
        schema: Any = defs.get_schema(op_type, opset, "")  # stubs lack the function API
    except defs.SchemaError:
        return None
    if schema.function_opset_versions or schema.context_dependent_function_opset_versions:
        return schema
    return None


def _pick(versions: Sequence[int], opset: int) -> int:
    """The newest function version not newer than the model's opset."""
    older = [v for v in versions if v <= opset]
    return max(older) if older else min(versions)


def _body(schema: Any, node: Any, opset: int, input_types: Sequence[InputType]) -> Any:
    from onnx import FunctionProto, helper  # optional: onnx (the compiler extra)

    proto = FunctionProto()
    if schema.function_opset_versions:
        version = _pick(schema.function_opset_versions, opset)
        proto.ParseFromString(schema.get_function_with_opset_version(version))
        return proto
    types = []
    for t in input_types:
        # An omitted input still takes a position; an undefined type marks it.
        types.append(helper.make_tensor_type_proto(t[0], list(t[1])) if t is not None
                     else helper.make_empty_tensor_value_info("").type)
    version = _pick(schema.context_dependent_function_opset_versions, opset)
    try:
        data = schema.get_context_dependent_function_with_opset_version(
            version, node.SerializeToString(), [t.SerializeToString() for t in types])
    except Exception as exc:  # onnx's builders raise several types for bad contexts
        raise FrontendError(f"onnx could not build the function body of "
                            f"{node.op_type}: {type(exc).__name__}: {exc}") from exc
    proto.ParseFromString(data)
    if not proto.node:
        raise FrontendError(f"onnx defines no function body of {node.op_type} for these "
                            "attributes and input types")
    return proto


def expand(node: Any, opset: int, input_types: Sequence[InputType], prefix: str
           ) -> tuple[list[Any], int]:
    """The nodes of `node`'s function body, renamed into the caller's graph, and the
    default-domain opset the body is written for.

    `input_types` gives the type of each of `node`'s inputs (context-dependent
    bodies depend on them); `prefix` makes the body's internal value names unique.
    FrontendError when onnx defines no body for this node.
    """
    schema = function_schema(node.op_type, node.domain, opset)
    if schema is None:
        raise FrontendError(f"onnx defines no function body for {node.op_type} at opset {opset}")
    proto = _body(schema, node, opset, input_types)
    names: dict[str, str] = {"": ""}
    for k, formal in enumerate(proto.input):
        names[formal] = node.input[k] if k < len(node.input) else ""
    for k, formal in enumerate(proto.output):
        if k < len(node.output) and node.output[k]:
            names[formal] = node.output[k]

    def rename(name: str) -> str:
        return names.get(name, prefix + name)

    attrs = {a.name: a for a in node.attribute}
    for name, spec in schema.attributes.items():
        if name not in attrs and spec.default_value.type != 0:  # 0: UNDEFINED
            attrs[name] = spec.default_value
    body_opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")),
                      opset)
    # onnxruntime's own kernel masks differently from some bodies (attention_body.py)
    nodes = attention_body.rewrite(schema, list(proto.node))
    return [_renamed(n, rename, attrs) for n in nodes], int(body_opset)


def _renamed(node: Any, rename: Callable[[str], str], attrs: dict[str, Any]) -> Any:
    """A copy of body node `node` with its values renamed and attribute references bound."""
    from onnx import NodeProto  # optional: onnx (the compiler extra)

    out = NodeProto()
    out.CopyFrom(node)
    out.input[:] = [rename(n) for n in node.input]
    out.output[:] = [rename(n) for n in node.output]
    del out.attribute[:]
    for attr in node.attribute:
        if attr.ref_attr_name:
            if attr.ref_attr_name not in attrs:
                continue  # the caller omitted it and it has no default: the op's own applies
            bound = type(attr)()
            bound.CopyFrom(attrs[attr.ref_attr_name])
            bound.name = attr.name
            out.attribute.append(bound)
            continue
        copy = type(attr)()
        copy.CopyFrom(attr)
        for graph in ([copy.g] if copy.HasField("g") else []) + list(copy.graphs):
            _rename_graph(graph, rename)
        out.attribute.append(copy)
    return out


def _rename_graph(graph: Any, rename: Callable[[str], str]) -> None:
    """Rename every value of a subgraph in place (bodies of If/Loop/Scan in a function)."""
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        vi.name = rename(vi.name)
    for init in graph.initializer:
        init.name = rename(init.name)
    for inner in graph.node:
        inner.input[:] = [rename(n) for n in inner.input]
        inner.output[:] = [rename(n) for n in inner.output]
        for attr in inner.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                _rename_graph(sub, rename)

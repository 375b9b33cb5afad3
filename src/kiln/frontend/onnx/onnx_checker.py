"""Run onnx's own checker (full check, strict shape inference) on a model to import.

onnxruntime refuses a model that `onnx.checker.check_model(model, full_check=True)`
refuses: an attribute the declared opset does not define (an opset-18 attribute in
an opset-17 model), an input of the wrong element type, an output whose declared
type contradicts inference. kiln refuses the same models, naming the node onnx
names, instead of importing them silently.

The checker serializes the whole model to C++; for a model with hundreds of
megabytes of weights that costs seconds (BERT-base: about 3 s, against a few
tenths for the import itself). The weights do not take part in any check but
their type and shape, so the checked copy declares every large initializer as a
graph input of the same type and shape instead (legal since IR version 4, and
what onnx's own shape inference sees for an input without data). Small
initializers keep their data: shape inference propagates the values of small
integer tensors (Reshape targets, Slice bounds, Resize scales) and must see them.

Where onnx's checker is stricter than onnxruntime, the checked copy is amended and the
model accepted with a warning: IR versions before 4 require every initializer to be a
graph input too, which files quantized by onnxruntime's own quantizer break (it adds
scales and zero points as initializers only and keeps the IR version); onnxruntime runs
them, so an initializer a node reads is declared as an input of the copy
(`ir3_undeclared`). One that no node reads stays undeclared: onnxruntime refuses it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from kiln.errors import FrontendError

# Initializers of at most this many bytes keep their data in the checked copy.
KEEP_DATA_BYTES = 64 * 1024


def check_onnx_model(proto: Any, views: dict[int, np.ndarray],
                     input_ranks: Mapping[str, int]) -> None:
    """Raise FrontendError if onnx's full check refuses `proto`.

    `views` holds the data of initializers whose `raw_data` was read outside the
    message (kiln.frontend.onnx.raw_data), by initializer index. `input_ranks`
    gives the rank of every graph input as kiln resolved it (a shape_dict may give
    an input the shape the model omits).
    """
    from onnx.checker import ValidationError  # optional: onnx (the compiler extra)
    from onnx.shape_inference import InferenceError  # optional: onnx (the compiler extra)

    try:
        copy = _weightless_copy(proto, views)
        _declare_ir3_initializers(proto, copy)
        _declare_ranks(copy, input_ranks)
        _contrib_default_domain_ops(copy)
        _check_lenient_value_info(copy)
    except UnicodeDecodeError:  # onnx quotes the model's bytes in its message
        raise FrontendError(
            "the ONNX model is invalid (onnx.checker, full check): its error message "
            "quotes bytes that are not UTF-8 (a damaged model?)") from None
    except (ValidationError, InferenceError, ValueError) as exc:
        text = " ".join(str(exc).split())
        if isinstance(exc, InferenceError) and text.count("Inference error(s)") > 1:
            # The error is inside the function body onnx expands to infer a standard
            # op (onnx 1.23's MeanVarianceNormalization body fails onnx's own
            # check): a defect of onnx, not of the model; onnxruntime runs it.
            return
        raise FrontendError(
            f"the ONNX model is invalid (onnx.checker, full check): {text}. "
            "Fix the model, or skip this check with from_onnx(..., check=False) "
            "(CLI: kiln compile --no-check)") from exc


def _check_lenient_value_info(copy: Any) -> None:
    """onnx's full check of `copy`; where it fails only because the graph's `value_info`
    declares an intermediate value's shape against inference (onnxruntime-genai's builder
    declares its constant `[1]` a scalar), check again without those shapes, and warn.

    onnxruntime merges a declared intermediate shape with the inferred one leniently (it
    logs "Falling back to lenient merge" and runs the model); kiln infers every
    intermediate shape itself and never reads them. The graph's inputs and outputs keep
    their declared shapes, checked as before."""
    import onnx  # optional: onnx (the compiler extra)
    from onnx.shape_inference import InferenceError  # optional: onnx (the compiler extra)

    try:
        onnx.checker.check_model(copy, full_check=True)
        return
    except InferenceError as exc:
        if "existing shape differ" not in str(exc) or not len(copy.graph.value_info):
            raise
        first = " ".join(str(exc).split())
    for info in copy.graph.value_info:
        if info.type.HasField("tensor_type"):
            info.type.tensor_type.ClearField("shape")
    onnx.checker.check_model(copy, full_check=True)
    warnings.warn(f"the model's value_info declares intermediate shapes onnx's inference "
                  f"contradicts ({first[:300]}); ignored, as onnxruntime ignores them",
                  UserWarning, stacklevel=5)


#: Operators onnxruntime registers as contrib ops in the default ONNX domain, which onnx's
#: checker does not know (onnxruntime-genai's builder writes SimplifiedLayerNormalization).
ONNXRUNTIME_DEFAULT_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization"})


def _contrib_default_domain_ops(copy: Any) -> None:
    """Move the main graph's `ONNXRUNTIME_DEFAULT_DOMAIN_OPS` nodes of the checked copy to
    onnxruntime's com.microsoft domain, which the checker leaves to onnxruntime (their
    outputs then have no inferred type; kiln's converters check them)."""
    moved = False
    for node in copy.graph.node:
        if node.op_type in ONNXRUNTIME_DEFAULT_DOMAIN_OPS and node.domain in ("", "ai.onnx"):
            node.domain = "com.microsoft"
            moved = True
    if moved and all(o.domain != "com.microsoft" for o in copy.opset_import):
        copy.opset_import.add(domain="com.microsoft", version=1)


def _weightless_copy(proto: Any, views: dict[int, np.ndarray]) -> Any:
    """`proto` with its large initializers turned into inputs of the same type and shape."""
    from onnx import TensorProto, helper  # optional: onnx (the compiler extra)

    src = proto.graph
    copy = type(proto)()
    _copy_fields(proto, copy, skip="graph")
    graph = copy.graph
    _copy_fields(src, graph, skip="initializer")
    declared = {i.name for i in src.input}
    for index, init in enumerate(src.initializer):
        view = views.get(index)
        if _nbytes(init, view) <= KEEP_DATA_BYTES or init.data_type == TensorProto.UNDEFINED:
            if view is None:
                graph.initializer.append(init)
            else:  # its data lives outside the message
                kept = graph.initializer.add()
                kept.CopyFrom(init)
                kept.raw_data = view.tobytes()
        elif init.name not in declared:
            graph.input.append(helper.make_tensor_value_info(init.name, init.data_type,
                                                             list(init.dims)))
    return copy


#: The first IR version whose initializers need not be graph inputs.
INITIALIZERS_AS_INPUTS_UNTIL = 4


def ir3_undeclared(model: Any) -> list[str]:
    """The initializers of an IR version < 4 `model` that a node of its main graph (or of
    a subgraph) reads but that are not listed as graph inputs, as that IR version
    requires: onnx's checker refuses them, onnxruntime runs the file."""
    if model.ir_version >= INITIALIZERS_AS_INPUTS_UNTIL:
        return []
    graph = model.graph
    declared = {i.name for i in graph.input}
    read = set(_names_read(graph))
    return [t.name for t in graph.initializer if t.name not in declared and t.name in read]


def _names_read(graph: Any) -> Any:
    """Every value name a node of `graph` or of its subgraphs reads."""
    from onnx import AttributeProto  # optional: onnx (the compiler extra)

    for node in graph.node:
        yield from node.input
        for attr in node.attribute:
            if attr.type == AttributeProto.GRAPH:
                yield from _names_read(attr.g)
            elif attr.type == AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from _names_read(sub)


def _declare_ir3_initializers(model: Any, copy: Any) -> None:
    """Declare `model`'s `ir3_undeclared` initializers as graph inputs of the checked
    `copy` (of their type and shape; large ones already are), with a warning naming them."""
    from onnx import helper  # optional: onnx (the compiler extra)

    names = ir3_undeclared(model)
    if not names:
        return
    shown = ", ".join(repr(n) for n in names[:5]) + (
        f" and {len(names) - 5} more" if len(names) > 5 else "")
    warnings.warn(
        f"initializer(s) {shown} of this IR version {model.ir_version} model are not listed "
        f"as graph inputs, which IR versions before {INITIALIZERS_AS_INPUTS_UNTIL} require "
        "(onnx.checker refuses the file); accepted as constants, as onnxruntime runs them",
        UserWarning, stacklevel=4)
    graph = copy.graph
    declared = {i.name for i in graph.input}
    by_name = {t.name: t for t in model.graph.initializer}
    for name in names:
        if name not in declared:
            t = by_name[name]
            graph.input.append(helper.make_tensor_value_info(name, t.data_type, list(t.dims)))


def _declare_ranks(model: Any, input_ranks: Mapping[str, int]) -> None:
    """Give main-graph inputs and outputs declared without a shape one of unknown dims.

    onnx's checker requires the shape field there; onnxruntime does not (it
    infers output shapes, and kiln takes an input's shape from `shape_dict`).
    Only the rank is declared, from kiln's resolved inputs and from onnx's own
    (lenient) inference for outputs, so nothing is asserted that the model
    does not say.
    """
    import onnx  # optional: onnx (the compiler extra)

    graph = model.graph
    missing = [v for v in (*graph.input, *graph.output)
               if v.type.HasField("tensor_type") and not v.type.tensor_type.HasField("shape")]
    if not missing and all(v.type.WhichOneof("value") is not None for v in graph.output):
        return
    ranks = dict(input_ranks)
    if any(v.name not in ranks for v in missing):
        try:
            inferred = onnx.shape_inference.infer_shapes(model).graph.value_info
        except Exception:  # the full check below reports the model's error
            inferred = []
        for info in inferred:
            tensor = info.type.tensor_type
            if tensor.HasField("shape"):
                ranks.setdefault(info.name, len(tensor.shape.dim))
    for value in missing:
        if value.name in ranks:
            shape = value.type.tensor_type.shape
            for _ in range(ranks[value.name]):
                shape.dim.add()
    # An output of unknown type or rank is not declared at all (onnxruntime infers it):
    # the nodes computing it are still checked, and kiln's import reports what it
    # cannot infer.
    kept = [v for v in graph.output if v.type.WhichOneof("value") is not None and (
        not v.type.HasField("tensor_type") or v.type.tensor_type.HasField("shape"))]
    if len(kept) < len(graph.output):
        del graph.output[:]
        graph.output.extend(kept)


def _copy_fields(src: Any, dst: Any, skip: str) -> None:
    """Copy every set field of message `src` but `skip` into the empty `dst`."""
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        target = getattr(dst, field.name)
        if hasattr(target, "extend"):  # a repeated field
            target.extend(value)
        elif hasattr(target, "CopyFrom"):  # a message
            target.CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def _nbytes(init: Any, view: np.ndarray | None) -> int:
    if view is not None:
        return int(view.nbytes)
    return init.ByteSize()

"""`kiln inspect model.onnx`: what an ONNX model takes and gives, before compiling it.

Inputs and outputs with their dtypes and dimensions (symbolic ones by name), the
opsets, a histogram of the op types and the op types kiln cannot import, which a
compile would refuse.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

from kiln.errors import MissingFileError


def _dtype(elem_type: int) -> str:
    from onnx import helper  # optional: onnx (the compiler extra)

    try:
        return str(helper.tensor_dtype_to_np_dtype(elem_type).name)
    except (KeyError, ValueError, TypeError):
        return "?" if elem_type == 0 else f"onnx-type-{elem_type}"


def _value(info: Any) -> dict[str, Any]:
    """name, dtype and shape (ints; symbolic dimensions by name; None if unknown)."""
    tensor = info.type.tensor_type
    if not info.type.HasField("tensor_type"):
        return {"name": info.name, "dtype": "non-tensor", "shape": None}
    shape = None
    if tensor.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") else
                 (d.dim_param if d.HasField("dim_param") else None) for d in tensor.shape.dim]
    return {"name": info.name, "dtype": _dtype(tensor.elem_type), "shape": shape}


def describe_onnx(path: str) -> dict[str, Any]:
    """The facts `kiln inspect` prints about the ONNX model at `path` (weights not read)."""
    from kiln.frontend.onnx.importer import (  # heavy: kept off the cli's startup (kiln --help)
        default_opset,
        parse_onnx,
        unsupported_ops,
    )

    if not os.path.exists(path):
        raise MissingFileError(f"no ONNX model at {path}")
    model = parse_onnx(path)  # FrontendError for a directory, an empty or damaged file
    graph = model.graph
    weights = {t.name for t in graph.initializer}
    ops = Counter(n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
                  for n in graph.node)
    return {
        "file": path,
        "producer": " ".join(p for p in (model.producer_name, model.producer_version) if p),
        "ir_version": model.ir_version,
        "opsets": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        "inputs": [_value(i) for i in graph.input if i.name not in weights],
        "outputs": [_value(o) for o in graph.output],
        "weights": len(weights),
        "nodes": len(graph.node),
        "ops": dict(ops.most_common()),
        "unsupported": unsupported_ops(graph, default_opset(model)),
    }


def _shape(shape: list[Any] | None) -> str:
    if shape is None:
        return " (shape unknown)"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def inspect_onnx(path: str, fmt: str | None) -> str:
    """The text (default) or JSON report of `kiln inspect model.onnx`."""
    facts = describe_onnx(path)
    if fmt == "json":
        return json.dumps(facts, indent=2)
    lines = [f"ONNX model {path}" + (f" (from {facts['producer']})" if facts["producer"] else ""),
             "  opsets: " + ", ".join(f"{d} {v}" for d, v in facts["opsets"].items()),
             "  inputs:"]
    lines += [f"    {v['name']}: {v['dtype']}{_shape(v['shape'])}" for v in facts["inputs"]]
    lines.append("  outputs:")
    lines += [f"    {v['name']}: {v['dtype']}{_shape(v['shape'])}" for v in facts["outputs"]]
    lines.append(f"  {facts['nodes']} nodes, {len(facts['ops'])} op types, "
                 f"{facts['weights']} weights:")
    lines += [f"    {op:<24} {n:>6}" for op, n in facts["ops"].items()]
    missing = facts["unsupported"]
    if missing:
        lines.append(f"  not supported by kiln ({len(missing)} op types; compiling will fail):")
        lines += [f"    {op} x{len(nodes)}: {', '.join(nodes[:3])}"
                  + (f" and {len(nodes) - 3} more" if len(nodes) > 3 else "")
                  for op, nodes in sorted(missing.items())]
    else:
        lines.append("  every op type is supported by kiln")
    return "\n".join(lines)

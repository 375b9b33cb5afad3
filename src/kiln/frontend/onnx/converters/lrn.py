"""ONNX LRN onto kiln.ops.lrn's `lrn`, with the standard's attribute defaults."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kiln.frontend.onnx.converters.registry import GraphContext, onnx_op
from kiln.ir import graph as g


@onnx_op("LRN")
def _lrn_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
              attrs: Mapping[str, Any]) -> list[g.Expr]:
    x = inputs[0]
    assert x is not None
    return [ctx.call("lrn", x, size=int(attrs["size"]), alpha=float(attrs.get("alpha", 1e-4)),
                     beta=float(attrs.get("beta", 0.75)), bias=float(attrs.get("bias", 1.0)))]

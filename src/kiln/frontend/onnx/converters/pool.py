"""ONNX MaxPool, AveragePool, LpPool, GlobalAveragePool and GlobalMaxPool onto
kiln.ops.pool's operators (MaxPool's indices output: `composed.max_pool_indices`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kiln.errors import IRError
from kiln.frontend.onnx.converters.composed import max_pool_indices
from kiln.frontend.onnx.converters.registry import GraphContext, onnx_op
from kiln.frontend.onnx.converters.spatial import onnx_pads
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir.shape_expr import dim_product, dim_text
from kiln.ops import spatial


def _pool_converter(kind: str) -> Any:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        x = inputs[0]
        assert x is not None
        t = ctx.tensor_type(x)
        if kind == "max" and not (dt.is_float(t.dtype) or t.dtype in ("int8", "uint8")):
            raise IRError(f"MaxPool of {t.dtype} is not supported (ONNX allows float, int8, "
                          "uint8)")
        rank = spatial.spatial_rank(t.shape, kind.capitalize() + "Pool")
        if "kernel_shape" not in attrs:
            raise IRError("the kernel_shape attribute is required")
        kernel = spatial.ints(attrs, "kernel_shape", rank, 1)
        strides = spatial.ints(attrs, "strides", rank, 1)
        dilations = spatial.ints(attrs, "dilations", rank, 1)
        pads = onnx_pads(attrs, t.shape[2:], kernel, strides, dilations)
        extra: dict[str, Any] = {}
        if kind == "avg":
            extra["count_include_pad"] = bool(attrs.get("count_include_pad", 0))
        if kind == "lp":
            extra["p"] = int(attrs.get("p", 2))
        out = ctx.call(f"{kind}_pool{spatial.SUFFIX[rank]}", x, kernel_shape=kernel,
                       strides=strides, dilations=dilations, pads=pads,
                       ceil_mode=bool(attrs.get("ceil_mode", 0)), **extra)
        if kind == "max" and len(ctx.node_outputs) > 1 and ctx.node_outputs[1]:
            # values and indices from one scan (onnxruntime's pool with indices)
            return list(max_pool_indices(ctx, x, out, kernel, strides, dilations, pads,
                                         int(attrs.get("storage_order", 0))))
        return [out]
    return convert


onnx_op("MaxPool")(_pool_converter("max"))


onnx_op("AveragePool")(_pool_converter("avg"))


onnx_op("LpPool")(_pool_converter("lp"))


def _global_converter(op: str) -> Any:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        x = inputs[0]
        assert x is not None
        # onnxruntime refuses a global pool over an empty image: the window has no element
        window = dim_product(ctx.tensor_type(x).shape[2:])
        ctx.require_nonzero(window, f"a global pool's window is the whole image, of "
                                    f"{dim_text(window)} elements")
        return [ctx.call(op, x)]
    return convert


onnx_op("GlobalAveragePool")(_global_converter("global_avg_pool"))


onnx_op("GlobalMaxPool")(_global_converter("global_max_pool"))

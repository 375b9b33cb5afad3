"""ONNX converters of the contrib operators decoder-LLM exporters write (onnxruntime-genai's
model builder, onnxruntime's `MatMulNBitsQuantizer`), as compositions of kiln operators:

- `SimplifiedLayerNormalization` (RMSNorm; onnxruntime registers it in the default
  domain) and com.microsoft `SkipSimplifiedLayerNormalization` and
  `SkipLayerNormalization` (a residual add fused with the norm), with onnxruntime's
  arithmetic order: `(input + skip) + bias`, then `x / sqrt(mean(x^2) + eps) * gamma`;

Not imported yet: `RotaryEmbedding`, `GroupQueryAttention`, `MultiHeadAttention`,
`GatherBlockQuantized`, `MatMulNBits`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kiln.errors import IRError
from kiln.frontend.onnx.converters.registry import GraphContext, onnx_op
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ops.reduce import norm_axes

MS = "com.microsoft."


# ----------------------------------------------------------------------- RMSNorm family

def _wanted(ctx: GraphContext, index: int) -> bool:
    """Whether the node names its output `index` (an omitted one is not computed)."""
    return len(ctx.node_outputs) > index and bool(ctx.node_outputs[index])


def _rms(ctx: GraphContext, x: g.Expr, axis: int, eps: float) -> tuple[g.Expr, g.Expr]:
    """(x / sqrt(mean(x^2) + eps), that denominator) over the axes from `axis`, in
    onnxruntime's order (it divides by the root rather than multiplying by its inverse).
    The mean is a reduction over trailing axes, which the row kernels take at any
    (symbolic) row count."""
    t = ctx.tensor_type(x)
    ms = ctx.call("reduce_mean", ctx.call("multiply", x, x), axes=tuple(range(axis, t.ndim)),
                  keepdims=True)
    root = ctx.call("sqrt", ctx.call("add", ms, ctx.const(eps, t.dtype)))
    return ctx.call("divide", x, root), root


def _check_float(ctx: GraphContext, x: g.Expr, what: str) -> None:
    dtype = ctx.tensor_type(x).dtype
    if not dt.is_float(dtype):
        raise IRError(f"{what} of type {dtype}: it must be a float tensor")


@onnx_op("SimplifiedLayerNormalization")
def _simplified_layer_norm(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                           attrs: dict[str, Any]) -> list[g.Expr]:
    """RMSNorm over the axes from `axis` (outputs Y and the optional inv_std_var, of the
    stash type, shaped like X with those axes 1)."""
    x, scale = inputs[0], inputs[1]
    assert x is not None and scale is not None
    _check_float(ctx, x, "SimplifiedLayerNormalization input X")
    t = ctx.tensor_type(x)
    axis = norm_axes(int(attrs.get("axis", -1)), t.ndim)[0]
    stash = "float32" if int(attrs.get("stash_type", 1)) == 1 else t.dtype
    if stash == "float32" and t.dtype == "float64":
        stash = "float64"  # onnxruntime computes a double input in double
    xs = x if stash == t.dtype else ctx.call("cast", x, dtype=stash)
    y, root = _rms(ctx, xs, axis, float(attrs.get("epsilon", 1e-5)))
    if stash != t.dtype:
        y = ctx.call("cast", y, dtype=t.dtype)
    outs = [ctx.call("multiply", y, scale)]
    if _wanted(ctx, 1):
        outs.append(ctx.call("reciprocal", root))
    return outs


def _skip_sum(ctx: GraphContext, x: g.Expr, skip: g.Expr, bias: g.Expr | None,
              op: str) -> g.Expr:
    """`(input + skip) + bias`, onnxruntime's order; skip may be (batch, seq, hidden),
    (1, seq, hidden) or (seq, hidden), which broadcasting covers."""
    _check_float(ctx, x, f"{op} input")
    xt, st = ctx.tensor_type(x), ctx.tensor_type(skip)
    if xt.ndim not in (2, 3) or st.ndim not in (2, 3) or st.ndim > xt.ndim:
        raise IRError(f"{op}: input of rank {xt.ndim} and skip of rank {st.ndim}; the input "
                      "must be (batch, seq, hidden) or (tokens, hidden), the skip the same "
                      "or (seq, hidden)")
    total = ctx.call("add", x, skip)
    return total if bias is None else ctx.call("add", total, bias)


def _skip_outputs(ctx: GraphContext, y: g.Expr, mean: g.Expr | None, inv: g.Expr | None,
                  total: g.Expr) -> list[g.Expr]:
    """The four outputs (output, mean, inv_std_var, input_skip_bias_sum); an omitted one
    is `y` as a placeholder the importer drops (it binds only named outputs)."""
    return [y, mean if mean is not None else y, inv if inv is not None else y, total]


@onnx_op(MS + "SkipSimplifiedLayerNormalization")
def _skip_simplified_layer_norm(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                                attrs: dict[str, Any]) -> list[g.Expr]:
    x, skip, gamma = inputs[0], inputs[1], inputs[2]
    assert x is not None and skip is not None and gamma is not None
    bias = inputs[3] if len(inputs) > 3 else None
    total = _skip_sum(ctx, x, skip, bias, "SkipSimplifiedLayerNormalization")
    ndim = ctx.tensor_type(total).ndim
    y, root = _rms(ctx, total, ndim - 1, float(attrs.get("epsilon", 1e-12)))
    y = ctx.call("multiply", y, gamma)
    mean = inv = None
    if _wanted(ctx, 1):
        # onnxruntime writes 0 there: a simplified norm computes no mean
        mean = ctx.call("multiply", root, ctx.const(0.0, ctx.tensor_type(root).dtype))
    if _wanted(ctx, 2):
        inv = ctx.call("reciprocal", root)
    return _skip_outputs(ctx, y, mean, inv, total)


@onnx_op(MS + "SkipLayerNormalization")
def _skip_layer_norm(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                     attrs: dict[str, Any]) -> list[g.Expr]:
    """LayerNorm of `(input + skip) + bias` with gamma and the optional beta: kiln's
    layer_norm (its row kernel); the mean and inv_std_var outputs, when named, from the
    mean and the squared deviations from it."""
    x, skip, gamma = inputs[0], inputs[1], inputs[2]
    assert x is not None and skip is not None and gamma is not None
    beta = inputs[3] if len(inputs) > 3 else None
    bias = inputs[4] if len(inputs) > 4 else None
    total = _skip_sum(ctx, x, skip, bias, "SkipLayerNormalization")
    t = ctx.tensor_type(total)
    eps = float(attrs.get("epsilon", 1e-12))
    args = [total, gamma] if beta is None else [total, gamma, beta]
    y = ctx.call("layer_norm", *args, axis=t.ndim - 1, epsilon=eps)
    mean = inv = None
    if _wanted(ctx, 1) or _wanted(ctx, 2):
        mean = ctx.call("reduce_mean", total, axes=(t.ndim - 1,), keepdims=True)
        centred = ctx.call("subtract", total, mean)
        var = ctx.call("reduce_mean", ctx.call("multiply", centred, centred),
                       axes=(t.ndim - 1,), keepdims=True)
        inv = ctx.call("reciprocal", ctx.call("sqrt", ctx.call(
            "add", var, ctx.const(eps, t.dtype))))
    return _skip_outputs(ctx, y, mean, inv, total)


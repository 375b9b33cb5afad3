"""ONNX converters of the contrib operators decoder-LLM exporters write (onnxruntime-genai's
model builder, onnxruntime's `MatMulNBitsQuantizer`), as compositions of kiln operators:

- `SimplifiedLayerNormalization` (RMSNorm; onnxruntime registers it in the default
  domain) and com.microsoft `SkipSimplifiedLayerNormalization` and
  `SkipLayerNormalization` (a residual add fused with the norm), with onnxruntime's
  arithmetic order: `(input + skip) + bias`, then `x / sqrt(mean(x^2) + eps) * gamma`;
- com.microsoft `MatMulNBits` (block-quantized 2/4/8-bit weights): the constant weight is
  dequantized at import to a float32 [K, N] matrix and the node becomes a float MatMul
  (+ bias). This is correct, not fast: the weight takes 8x the memory of its int4 form and
  the product runs on the float GEMM kernels. A GEMV that reads the packed nibbles is
  later work (issue 61).

Not imported yet: `RotaryEmbedding`, `GroupQueryAttention`, `MultiHeadAttention`,
`GatherBlockQuantized` (docs/onnx.md says what they need).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.frontend.onnx.converters.registry import GraphContext, need_constant, onnx_op
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


# ------------------------------------------------------------------------- MatMulNBits

def _unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first `count` `bits`-wide codes of each row of uint8 `packed` ([rows, bytes]),
    low bits first within each byte (MatMulNBits' packing of B and of its zero points)."""
    per_byte = 8 // bits
    shifts = np.arange(per_byte, dtype=np.uint8) * bits
    codes = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(packed.shape[0], -1)[:, :count]


def _nbits_attrs(attrs: dict[str, Any]) -> tuple[int, int, int, int]:
    """(K, N, bits, block_size), checked against the contrib op's spec."""
    k, n = int(attrs["K"]), int(attrs["N"])
    bits, block = int(attrs.get("bits", 4)), int(attrs["block_size"])
    if bits not in (2, 4, 8):
        raise IRError(f"bits {bits}: MatMulNBits packs 2, 4 or 8 bits a weight")
    if block < 16 or block & (block - 1):
        raise IRError(f"block_size {block}: it must be a power of two of at least 16")
    if k < 1 or n < 1:
        raise IRError(f"K {k} and N {n} must be positive")
    if int(attrs.get("weight_prepacked", 0)):
        raise IRError("weight_prepacked: B is in a GPU execution provider's layout, which "
                      "kiln does not read")
    return k, n, bits, block


def _block_params(ctx: GraphContext, expr: g.Expr, rows: int, cols: int,
                  what: str) -> np.ndarray:
    """A constant per-block parameter (scales, or float zero points) as [N, k_blocks]:
    onnxruntime takes it so or flattened."""
    value = need_constant(ctx, expr, f"MatMulNBits {what}")
    if value.size != rows * cols:
        raise IRError(f"MatMulNBits {what} of shape {list(value.shape)}: expected "
                      f"[{rows}, {cols}] (N, k_blocks) values")
    return value.reshape(rows, cols)


def _zero_points(ctx: GraphContext, zp: g.Expr | None, n: int, blocks: int,
                 bits: int) -> np.ndarray:
    """The zero point of each block as float32 [N, k_blocks]: 2^(bits-1) when omitted,
    unpacked from uint8 codes (packed per row of N, low bits first, the last byte padded),
    or the float values as given."""
    if zp is None:
        return np.full((n, blocks), float(1 << (bits - 1)), np.float32)
    dtype = ctx.tensor_type(zp).dtype
    if dtype == "uint8":
        value = need_constant(ctx, zp, "MatMulNBits zero_points")
        per_row = -(-blocks * bits // 8)
        if value.size != n * per_row:
            raise IRError(f"MatMulNBits zero_points of shape {list(value.shape)}: packed "
                          f"uint8 zero points take [{n}, {per_row}] bytes")
        return _unpack(value.reshape(n, per_row), bits, blocks).astype(np.float32)
    if not dt.is_float(dtype):
        raise IRError(f"MatMulNBits zero_points of type {dtype}: uint8 (packed) or the "
                      "scales' float type")
    return _block_params(ctx, zp, n, blocks, "zero_points").astype(np.float32)


def _block_of_k(ctx: GraphContext, g_idx: g.Expr | None, zp: g.Expr | None, k: int,
                block: int, blocks: int) -> np.ndarray:
    """The block of each of the K rows: `k // block_size`, or g_idx's (act-order: the
    spec calls the input deprecated, GPTQ exports write it). With g_idx, packed uint8 zero
    points are refused: onnxruntime's CPU kernel reads them as the default 2^(bits-1)
    there, against the spec, so no result would be agreed."""
    if g_idx is None:
        return np.arange(k) // block
    if zp is not None and ctx.tensor_type(zp).dtype == "uint8":
        raise IRError("MatMulNBits with g_idx and packed uint8 zero_points is not "
                      "supported (onnxruntime ignores such zero points); float zero points "
                      "or none are")
    value = need_constant(ctx, g_idx, "MatMulNBits g_idx").reshape(-1).astype(np.int64)
    if value.size != k or value.min(initial=0) < 0 or value.max(initial=0) >= blocks:
        raise IRError(f"MatMulNBits g_idx must hold {k} block indices in [0, {blocks})")
    return value


def dequantize_nbits(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                     attrs: dict[str, Any]) -> np.ndarray:
    """MatMulNBits' weight as float32 [K, N]: `(code - zero_point) * scale` per block
    along K, the codes of B ([N, k_blocks, blob]) unpacked low bits first and the padding
    of the last block dropped."""
    k, n, bits, block = _nbits_attrs(attrs)
    blocks = -(-k // block)
    blob = block * bits // 8
    b = need_constant(ctx, inputs[1], "MatMulNBits B (the packed weight)")
    if b.dtype != np.uint8 or b.size != n * blocks * blob:
        raise IRError(f"MatMulNBits B of type {b.dtype} and shape {list(b.shape)}: expected "
                      f"uint8 [{n}, {blocks}, {blob}] (N, k_blocks, blob_size)")
    assert inputs[2] is not None
    scales = _block_params(ctx, inputs[2], n, blocks, "scales").astype(np.float32)
    zp_input = inputs[3] if len(inputs) > 3 else None
    zp = _zero_points(ctx, zp_input, n, blocks, bits)
    codes = _unpack(b.reshape(n, blocks * blob), bits, k).astype(np.float32)
    at = _block_of_k(ctx, inputs[4] if len(inputs) > 4 else None, zp_input, k, block, blocks)
    weight = (codes - zp[:, at]) * scales[:, at]
    return np.ascontiguousarray(weight.T)


@onnx_op(MS + "MatMulNBits")
def _matmul_nbits(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr]:
    """`A @ dequantize(B) (+ bias)` on the float GEMM: the weight is dequantized at import
    (`dequantize_nbits`), so `accuracy_level` (how far onnxruntime may quantize A) does not
    apply: kiln computes in the weight's float32."""
    a = inputs[0]
    assert a is not None
    at = ctx.tensor_type(a)
    if at.dtype != "float32":
        raise IRError(f"MatMulNBits input A of type {at.dtype}: kiln imports float32 models "
                      "of MatMulNBits (float16 and bfloat16 ones are not supported yet)")
    weight = dequantize_nbits(ctx, inputs, attrs)
    last = at.shape[-1] if at.ndim else None
    if at.ndim < 2 or (isinstance(last, int) and last != weight.shape[0]):
        raise IRError(f"MatMulNBits input A of shape {list(at.shape)}: it must have rank 2 "
                      f"or more and a last dimension K = {weight.shape[0]}")
    y = ctx.call("matmul", a, ctx.const(weight))
    bias = inputs[5] if len(inputs) > 5 else None
    return [y if bias is None else ctx.call("add", y, bias)]

"""ONNX converters of the contrib operators decoder-LLM exporters write (onnxruntime-genai's
model builder, onnxruntime's `MatMulNBitsQuantizer`), as compositions of kiln operators:

- `SimplifiedLayerNormalization` (RMSNorm; onnxruntime registers it in the default
  domain) and com.microsoft `SkipSimplifiedLayerNormalization` and
  `SkipLayerNormalization` (a residual add fused with the norm), with onnxruntime's
  arithmetic order: `(input + skip) + bias`, then `x / sqrt(mean(x^2) + eps) * gamma`;
- com.microsoft `MatMulNBits` (block-quantized 2/4/8-bit weights): 4- and 8-bit weights
  become kiln's `matmul_nbits` (kiln.ops.quant_nbits), which keeps B's packed bytes and
  unpacks them in its kernel (kiln.kernels.gemm.nbits: a GEMV for one row, the float
  register tile over K blocks dequantized on the stack for more); 2-bit weights and g_idx
  (act-order) are dequantized at import to a float32 [K, N] matrix and the node becomes
  a float MatMul (+ bias), at 8x the memory of the int4 form.

- com.microsoft `RotaryEmbedding` (RoPE from cos/sin caches, half-split or interleaved,
  partial rotation): `x * C + partner(x) * S`, where `partner` permutes the lanes of each
  head (a constant gather) and C, S are the caches' rows at the positions, spread over
  the lanes with the rotation's signs.

- com.microsoft `GatherBlockQuantized` (block-quantized embedding tables): the constant
  table is dequantized at import, as MatMulNBits' weight is, and the node becomes a
  Gather whose out-of-range indices give zeros (onnxruntime's kernel).

The attention operators are contrib_attention.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.frontend.onnx.converters.manip import reshape_to
from kiln.frontend.onnx.converters.registry import GraphContext, need_constant, onnx_op
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir.types import TensorType
from kiln.ops.quant_nbits import A_INT8_LEVEL, MATMUL_NBITS, NBITS_WIDTHS
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
    if stash != ctx.tensor_type(scale).dtype:
        scale = ctx.call("cast", scale, dtype=stash)
    y = ctx.call("multiply", y, scale)  # in the stash type, rounded once to X's (onnxruntime)
    outs = [y if stash == t.dtype else ctx.call("cast", y, dtype=t.dtype)]
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
    b, scales = _nbits_b_and_scales(ctx, inputs, n, blocks, blob)
    zp_input = inputs[3] if len(inputs) > 3 else None
    zp = _zero_points(ctx, zp_input, n, blocks, bits)
    codes = _unpack(b.reshape(n, blocks * blob), bits, k).astype(np.float32)
    at = _block_of_k(ctx, inputs[4] if len(inputs) > 4 else None, zp_input, k, block, blocks)
    weight = (codes - zp[:, at]) * scales[:, at]
    return np.ascontiguousarray(weight.T)


def _nbits_b_and_scales(ctx: GraphContext, inputs: Sequence[g.Expr | None], n: int,
                        blocks: int, blob: int) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits' packed B (uint8, N * k_blocks * blob bytes, checked) and its scales as
    float32 [N, k_blocks]: the constants both the packed and the float path read."""
    b = need_constant(ctx, inputs[1], "MatMulNBits B (the packed weight)")
    if b.dtype != np.uint8 or b.size != n * blocks * blob:
        raise IRError(f"MatMulNBits B of type {b.dtype} and shape {list(b.shape)}: expected "
                      f"uint8 [{n}, {blocks}, {blob}] (N, k_blocks, blob_size)")
    assert inputs[2] is not None
    return b, _block_params(ctx, inputs[2], n, blocks, "scales").astype(np.float32)


def float32_input(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  what: str) -> tuple[g.Expr, TensorType]:
    """The node's first input and its type, which must be float32 (`what` names it)."""
    a = inputs[0]
    assert a is not None
    at = ctx.tensor_type(a)
    if at.dtype != "float32":
        raise IRError(f"{what} of type {at.dtype}: kiln imports it in float32 (float16 and "
                      "bfloat16 ones are not supported yet)")
    return a, at


def _packed_nbits(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr] | None:
    """The constant operands of kiln's `matmul_nbits` (kiln.ops.quant_nbits: B as given,
    scales and zero points as float32 [N, k_blocks]), or None where only the float path
    takes the node: 2-bit codes, or g_idx (act-order: K's rows out of block order)."""
    k, n, bits, block = _nbits_attrs(attrs)
    if bits not in NBITS_WIDTHS or block > 256 or (len(inputs) > 4 and inputs[4] is not None):
        return None
    blocks, blob = -(-k // block), block * bits // 8
    b, scales = _nbits_b_and_scales(ctx, inputs, n, blocks, blob)
    operands = [ctx.const(np.ascontiguousarray(b.reshape(n, blocks, blob))), ctx.const(scales)]
    zp = inputs[3] if len(inputs) > 3 else None
    if zp is not None:
        operands.append(ctx.const(_zero_points(ctx, zp, n, blocks, bits)))
    return operands


def _int8_a(ctx: GraphContext, inputs: Sequence[g.Expr | None],
            attrs: dict[str, Any]) -> bool:
    """Whether onnxruntime quantizes this node's A to int8 (CompInt8): accuracy_level 4,
    4-bit codes, zero points absent or packed uint8 (float ones keep it in float32)."""
    zp = inputs[3] if len(inputs) > 3 else None
    return (int(attrs.get("accuracy_level", 0)) == A_INT8_LEVEL
            and int(attrs.get("bits", 4)) == 4
            and (zp is None or ctx.tensor_type(zp).dtype == "uint8"))


@onnx_op(MS + "MatMulNBits")
def _matmul_nbits(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr]:
    """`A @ dequantize(B) (+ bias)`: 4- and 8-bit weights in blocks along K become kiln's
    `matmul_nbits`, which keeps them packed (kiln.kernels.gemm.nbits unpacks them in the
    kernel); 2-bit weights and g_idx (act-order) are dequantized at import
    (`dequantize_nbits`) onto the float GEMM. `accuracy_level` 4 (A may be quantized to
    int8 per block, onnxruntime's CompInt8) is kept on 4-bit `matmul_nbits`, whose GEMV
    then takes int8 dot products where the target has them; other levels compute in
    float32, as onnxruntime's CompFp32."""
    a, at = float32_input(ctx, inputs, "MatMulNBits input A")
    packed = _packed_nbits(ctx, inputs, attrs)  # B checked first, then A against it
    weight = None if packed is not None else dequantize_nbits(ctx, inputs, attrs)
    k = int(attrs["K"])
    last = at.shape[-1] if at.ndim else None
    if at.ndim < 2 or (isinstance(last, int) and last != k):
        raise IRError(f"MatMulNBits input A of shape {list(at.shape)}: it must have rank 2 "
                      f"or more and a last dimension K = {k}")
    if packed is not None:
        bits = int(attrs.get("bits", 4))
        extra = {"accuracy_level": A_INT8_LEVEL} if _int8_a(ctx, inputs, attrs) else {}
        y = ctx.call(MATMUL_NBITS, a, *packed, k=k, n=int(attrs["N"]), bits=bits,
                     block=int(attrs["block_size"]), **extra)
    else:
        assert weight is not None
        y = ctx.call("matmul", a, ctx.const(weight))
    bias = inputs[5] if len(inputs) > 5 else None
    return [y if bias is None else ctx.call("add", y, bias)]


# ---------------------------------------------------------------- GatherBlockQuantized

def _block_codes(data: np.ndarray, dtype: str, bits: int) -> tuple[np.ndarray, int]:
    """The codes of a GatherBlockQuantized `data` as int32 of its logical shape, and the
    default zero point: uint8 packs 8 / bits codes a byte along the last axis (low bits
    first, default zero point 2^(bits-1)); int4/uint4 tensors hold one code an element
    (default zero point 0)."""
    if dtype == "uint8":
        if bits not in (2, 4, 8):
            raise IRError(f"bits {bits}: uint8 data packs 2, 4 or 8 bits a code")
        rows = data.reshape(-1, data.shape[-1])
        codes = _unpack(rows, bits, rows.shape[1] * 8 // bits) if bits < 8 else rows
        return (codes.astype(np.int32).reshape(*data.shape[:-1], -1), 1 << (bits - 1))
    if dtype in ("int4", "uint4"):
        if bits != 4:
            raise IRError(f"bits {bits}: {dtype} data holds 4-bit codes")
        return data.astype(np.int32), 0
    raise IRError(f"GatherBlockQuantized data of type {dtype}: uint8, int4 or uint4 (the "
                  "float8/float4 forms are not supported yet)")


def _gbq_zero_points(ctx: GraphContext, zp: g.Expr | None, dtype: str, bits: int,
                     shape: tuple[int, ...], default: int) -> np.ndarray:
    """Each block's zero point, of the scales' `shape`: packed like the data (uint8 along
    the last axis), or the default."""
    if zp is None:
        return np.full(shape, default, np.int32)
    value = need_constant(ctx, zp, "GatherBlockQuantized zero_points")
    if value.dtype.name != dtype:
        raise IRError(f"GatherBlockQuantized zero_points of type {value.dtype.name}: they "
                      f"must have the data's type {dtype}")
    codes, _ = _block_codes(value, dtype, bits)
    if codes.ndim != len(shape) or codes.shape[:-1] != shape[:-1] or \
            codes.shape[-1] < shape[-1]:
        raise IRError(f"GatherBlockQuantized zero_points of shape {list(value.shape)} do not "
                      f"match scales of shape {list(shape)}")
    return codes[..., :shape[-1]]


def dequantize_gather_data(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                           attrs: dict[str, Any]) -> np.ndarray:
    """GatherBlockQuantized's `data` as a float array of its logical shape:
    `(code - zero_point) * scale` per block of `block_size` along `quantize_axis`."""
    data_expr, scales_expr = inputs[0], inputs[2]
    assert data_expr is not None and scales_expr is not None
    data = need_constant(ctx, data_expr, "GatherBlockQuantized data")
    dtype = data.dtype.name  # int4/uint4 (ml_dtypes) have no kiln tensor type
    bits, block = int(attrs.get("bits", 4)), int(attrs.get("block_size", 128))
    if block < 16 or block & (block - 1):
        raise IRError(f"block_size {block}: it must be a power of two of at least 16")
    codes, default = _block_codes(data, dtype, bits)
    qaxis = norm_axes(int(attrs.get("quantize_axis", 1)), codes.ndim)[0]
    if dtype == "uint8" and qaxis != codes.ndim - 1:
        raise IRError("GatherBlockQuantized with uint8 data quantizes along the last axis")
    scales = need_constant(ctx, scales_expr, "GatherBlockQuantized scales")
    want = list(codes.shape)
    want[qaxis] = -(-want[qaxis] // block)
    if list(scales.shape) != want:
        raise IRError(f"GatherBlockQuantized scales of shape {list(scales.shape)}: expected "
                      f"{want} (a scale a block of {block} along axis {qaxis})")
    zp = _gbq_zero_points(ctx, inputs[3] if len(inputs) > 3 else None, dtype, bits,
                          tuple(want), default)
    at = np.arange(codes.shape[qaxis]) // block
    value = (codes - np.take(zp, at, axis=qaxis)).astype(np.float32) * \
        np.take(scales.astype(np.float32), at, axis=qaxis)
    return value.astype(scales.dtype)


@onnx_op(MS + "GatherBlockQuantized")
def _gather_block_quantized(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                            attrs: dict[str, Any]) -> list[g.Expr]:
    """A Gather from the data dequantized at import (`dequantize_gather_data`, like
    MatMulNBits' weight); an index outside [-n, n) gives zeros, as onnxruntime's kernel
    does (ONNX Gather would fail)."""
    indices = inputs[1]
    assert indices is not None
    table = dequantize_gather_data(ctx, inputs, attrs)
    axis = norm_axes(int(attrs.get("gather_axis", 0)), table.ndim)[0]
    data = ctx.value(inputs[0])
    if data is not None and data.dtype == np.uint8 and axis != 0:
        raise IRError("GatherBlockQuantized with uint8 data gathers along axis 0")
    it = ctx.tensor_type(indices)
    n = table.shape[axis]
    index_type = dt.to_numpy(it.dtype)
    inside = ctx.call("logical_and",
                      ctx.call("greater_equal", indices, ctx.const(np.array(-n, index_type))),
                      ctx.call("less", indices, ctx.const(np.array(n, index_type))))
    safe = ctx.call("where", inside, indices, ctx.const(np.array(0, index_type)))
    out = ctx.call("gather", ctx.const(table), safe, axis=axis)
    shape = [1] * axis + list(it.shape) + [1] * (table.ndim - axis - 1)
    mask = reshape_to(ctx, inside, shape)
    return [ctx.call("where", mask, out, ctx.const(np.array(0, table.dtype)))]


# --------------------------------------------------------------------- RotaryEmbedding

def _rotary_lanes(lanes: int, head: int, rot: int, interleaved: bool
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each of `lanes` (heads of `head` lanes side by side): the cache column it
    reads, its rotation partner lane, and the sign of the partner's sine term (0: a lane
    past `rot`, which passes through)."""
    j = np.arange(lanes)
    within = j % head
    half = rot // 2
    if interleaved:  # pairs (2i, 2i + 1)
        col, partner, sign = within // 2, j ^ 1, np.where(within % 2 == 0, -1.0, 1.0)
    else:  # halves (i, i + rot / 2)
        first = within < half
        col = within % half
        partner = np.where(first, j + half, j - half)
        sign = np.where(first, -1.0, 1.0)
    rotated = within < rot
    return (np.where(rotated, col, 0), np.where(rotated, partner, j),
            np.where(rotated, sign, 0.0))


def _positions(ctx: GraphContext, position_ids: g.Expr, seq: Any) -> g.Expr:
    """The position of each token: position_ids (batch, seq) as given, or a 1-element
    position_ids as the first position of `seq` consecutive ones."""
    pt = ctx.tensor_type(position_ids)
    if pt.ndim == 2:
        return position_ids
    if pt.ndim != 1 or pt.shape[0] != 1:
        raise IRError(f"RotaryEmbedding position_ids of shape {list(pt.shape)}: (1) or "
                      "(batch, seq)")
    one = ctx.const(np.array(1, dt.to_numpy(pt.dtype)))
    iota = ctx.call("cumsum", ctx.call("where", ctx.true_of_shape([seq]), one, one), axis=0,
                    exclusive=1)
    return ctx.call("add", iota, ctx.call("reshape", position_ids, shape=()))


def _rotary_geometry(ctx: GraphContext, x: g.Expr, cos: g.Expr,
                     attrs: dict[str, Any]) -> tuple[int, int, int]:
    """(lanes of the last axis, head size, rotated lanes of a head), checked."""
    t = ctx.tensor_type(x)
    lanes = t.shape[-1]
    half = ctx.tensor_type(cos).shape[-1]
    if t.ndim not in (3, 4) or not isinstance(lanes, int) or not isinstance(half, int):
        raise IRError(f"RotaryEmbedding input of shape {list(t.shape)}: (batch, seq, hidden) "
                      "or (batch, heads, seq, head_size) with a static last dimension")
    heads = int(attrs.get("num_heads", 0))
    head = lanes if t.ndim == 4 else lanes // heads if heads else 2 * half
    rot = int(attrs.get("rotary_embedding_dim", 0)) or head
    if head < 1 or lanes % head or rot != 2 * half or rot > head:
        raise IRError(f"RotaryEmbedding: {lanes} lanes, head size {head}, rotary dimension "
                      f"{rot} and caches of {half} columns do not agree (the caches hold "
                      "rotary_embedding_dim / 2 columns, a head at least that dimension)")
    return lanes, head, rot


@onnx_op(MS + "RotaryEmbedding")
def _rotary_embedding(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                      attrs: dict[str, Any]) -> list[g.Expr]:
    """onnxruntime's formula lane by lane: `x[i] * cos - x[partner] * sin` for the first
    lane of a pair, `x[i] * cos + x[partner] * sin` for the second."""
    x, position_ids, cos, sin = inputs[:4]
    assert x is not None and position_ids is not None and cos is not None and sin is not None
    if int(attrs.get("is_packed_batching", 0)):
        raise IRError("RotaryEmbedding is_packed_batching (ragged batches) is not supported")
    if float(attrs.get("scale", 1.0)) != 1.0:
        raise IRError("RotaryEmbedding scale other than 1 is not supported")
    _check_float(ctx, x, "RotaryEmbedding input")
    t = ctx.tensor_type(x)
    _, head, rot = _rotary_geometry(ctx, x, cos, attrs)
    seq = t.shape[-2] if t.ndim == 4 else t.shape[1]
    pos = _positions(ctx, position_ids, seq)
    return [rotate(ctx, x, pos, cos, sin, head, rot, bool(attrs.get("interleaved", 0)))]


def rotate(ctx: GraphContext, x: g.Expr, pos: g.Expr, cos: g.Expr, sin: g.Expr, head: int,
           rot: int, interleaved: bool) -> g.Expr:
    """RoPE of `x` ((batch, seq, heads * head) or (batch, heads, seq, head)) at the
    positions `pos` (batch, seq) from the cos/sin caches (positions, rot / 2), the first
    `rot` lanes of each head rotated: onnxruntime's formula lane by lane (RotaryEmbedding,
    and GroupQueryAttention's do_rotary)."""
    t = ctx.tensor_type(x)
    lanes = t.shape[-1]
    assert isinstance(lanes, int)
    col, partner, sign = _rotary_lanes(lanes, head, rot, interleaved)
    where_col = ctx.const(col.astype(np.int64))
    last = ctx.tensor_type(pos).ndim  # the cache rows at `pos` add its axes before columns
    c = ctx.call("gather", ctx.call("gather", cos, pos, axis=0), where_col, axis=last)
    s = ctx.call("gather", ctx.call("gather", sin, pos, axis=0), where_col, axis=last)
    rotated = ctx.const((sign != 0).astype(dt.to_numpy(t.dtype)))
    c = ctx.call("add", ctx.call("multiply", c, rotated),
                 ctx.const((sign == 0).astype(dt.to_numpy(t.dtype))))
    s = ctx.call("multiply", s, ctx.const(sign.astype(dt.to_numpy(t.dtype))))
    ct = ctx.tensor_type(c)
    if t.ndim == 4 and ct.ndim == 3:  # (batch, seq, lanes) -> (batch, 1, seq, lanes)
        c = reshape_to(ctx, c, (ct.shape[0], 1, *ct.shape[1:]))
        s = reshape_to(ctx, s, (ct.shape[0], 1, *ct.shape[1:]))
    moved = ctx.call("gather", x, ctx.const(partner.astype(np.int64)), axis=t.ndim - 1)
    return ctx.call("add", ctx.call("multiply", x, c), ctx.call("multiply", moved, s))

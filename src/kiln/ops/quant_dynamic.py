"""Dynamically quantized matrix products with a float epilogue (docs/quantization.md).

`onnxruntime.quantization.quantize_dynamic` turns each float MatMul with a constant
weight into

    a_q, a_scale, a_zp = DynamicQuantizeLinear(a)
    y = float32(MatMulInteger(a_q, b_q, a_zp, b_zp)) * (a_scale * b_scale)  [+ bias]

(onnxruntime's optimizer then runs the chain as one MatMulIntegerToFloat kernel).
kiln.transform.quantize_ops fuses it into one op:

- `dynamic_quant_matmul(a, b, b_zp, b_scale, bias)`: a float32 `[..., K]`; b int8 or
  uint8 `[K][N]` with its zero point (a scalar or one per column); b_scale float32
  (a scalar or one per column); bias float32 `(N,)` (zeros when the model has none).
  A is quantized as DynamicQuantizeLinear does (one scale and uint8 zero point for the
  whole tensor), the int32 product is corrected for both zero points, and the output
  is `float32(acc) * (a_scale * b_scale) + bias`: the model's own float32 operations
  in its order (two roundings, no fused multiply-add).
- `dynamic_quant_matmul_packed(a, bp, colsum, b_scale, bias)` (attributes `n`,
  `k_group`): the same with B shifted by its zero point and stored in the panels of
  `matmul_integer_packed` (kiln.ops.quant_kernels), `colsum` its column sums.

The packed op's kernel finds A's range (one pass, a vector of running minima and
maxima), quantizes A once into a uint8 buffer, runs the integer register tiles of
`quant_kernels.build_matmul_tiles` and applies the float epilogue (and any fused
elementwise tail: a residual add) as it stores, so neither the quantized A nor the
int32 product is a tensor of the graph.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.attrs import ATTR_GEMM_KERNEL
from kiln.ir.shape_expr import is_static
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    Cast,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    as_expr,
    max_,
    min_,
    seq,
)
from kiln.ir.types import TensorType, Type
from kiln.kernels.int8 import dot as quant_dot
from kiln.kernels.int8 import packing as quant_kernels
from kiln.ops import te
from kiln.ops.epilogue import fused_store
from kiln.ops.kernels.parallel_work import worth_parallel
from kiln.ops.kernels.tiles import const
from kiln.ops.kernels.tiles import loop as tile_loop
from kiln.ops.nan_order import max_keep_first, min_keep_first
from kiln.ops.quant import (
    as_float32,
    channel,
    dynamic_scale,
    dynamic_zero_point,
    quantize_value,
)
from kiln.ops.registry import OPS, HandBuiltOp, get_op, register_op
from kiln.ops.registry import call as op_call
from kiln.target.isa import ISA

Attrs = Mapping[str, Any]
DYNAMIC = "dynamic_quant_matmul"
PACKED = "dynamic_quant_matmul_packed"


def _quantized_type(a: TensorType) -> TensorType:
    return TensorType(a.shape, "uint8")


def _check_epilogue(op: str, a: TensorType, n: int, b_scale: TensorType,
                    bias: TensorType) -> None:
    if a.dtype != "float32":
        raise IRError(f"{op}: A must be float32, got {a.dtype}")
    if b_scale.dtype != "float32" or tuple(b_scale.shape) not in ((), (n,)):
        raise IRError(f"{op}: B's scale must be float32 of shape () or ({n},), got "
                      f"{b_scale.dtype}{tuple(b_scale.shape)}")
    if bias.dtype != "float32" or tuple(bias.shape) != (n,):
        raise IRError(f"{op}: the bias must be float32 of shape ({n},), got "
                      f"{bias.dtype}{tuple(bias.shape)}")


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    a, b, b_zp, b_scale, bias = types
    if b.ndim != 2 or attrs.get("transpose_b"):
        raise IRError(f"{DYNAMIC}: B must be a 2-D [K][N] matrix, got {tuple(b.shape)}")
    out = get_op("matmul_integer").infer(
        [_quantized_type(a), b, TensorType((), "uint8"), b_zp], {})
    assert isinstance(out, TensorType)
    _check_epilogue(DYNAMIC, a, int(b.static_shape[1]), b_scale, bias)
    return TensorType(out.shape, "float32")


def _packed_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    a, bp, colsum, b_scale, bias = types
    out = get_op(quant_kernels.INTEGER).infer(
        [_quantized_type(a), bp, colsum, TensorType((), "uint8")], attrs)
    assert isinstance(out, TensorType)
    _check_epilogue(PACKED, a, int(attrs["n"]), b_scale, bias)
    return TensorType(out.shape, "float32")


def _quantized(a: te.Tensor) -> tuple[te.Tensor, te.Tensor, te.Tensor]:
    """DynamicQuantizeLinear of `a` (its te definition): y (materialized), scale, zp."""
    y, scale, zp = get_op("dynamic_quantize_linear").compute([a], {})  # type: ignore[misc]
    return te.compute(y.shape, lambda *i: y[i], "uint8", "a_q", materialize=True), scale, zp


def _to_float(acc: te.Tensor, scale: te.Tensor, b_scale: te.Tensor, bias: te.Tensor,
              name: str) -> te.Tensor:
    def value(*i: PrimExpr) -> PrimExpr:
        return as_float32(acc[i]) * (scale[()] * channel(b_scale, i[-1])) + bias[i[-1]]

    return te.compute(acc.shape, value, "float32", name)


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    a, b, b_zp, b_scale, bias = inputs
    y, scale, zp = _quantized(a)
    acc = get_op("matmul_integer").compute([y, b, zp, b_zp], {})
    assert isinstance(acc, te.Tensor)
    return _to_float(acc, scale, b_scale, bias, DYNAMIC)


def _packed_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    a, bp, colsum, b_scale, bias = inputs
    y, scale, zp = _quantized(a)
    acc = quant_kernels.build_integer([y, bp, colsum, zp], attrs)
    return _to_float(acc, scale, b_scale, bias, PACKED)


def _float_ref(acc: np.ndarray, scale: np.ndarray, b_scale: np.ndarray,
               bias: np.ndarray) -> np.ndarray:
    multiplier = (np.float32(scale) * np.asarray(b_scale, np.float32)).astype(np.float32)
    return (acc.astype(np.float32) * multiplier).astype(np.float32) + bias.astype(np.float32)


def _ref(a: np.ndarray, b: np.ndarray, b_zp: np.ndarray, b_scale: np.ndarray,
         bias: np.ndarray, **attrs: Any) -> np.ndarray:
    y, scale, zp = get_op("dynamic_quantize_linear").reference(a)
    return _float_ref(get_op("matmul_integer").reference(y, b, zp, b_zp), scale, b_scale, bias)


def _packed_ref(a: np.ndarray, bp: np.ndarray, colsum: np.ndarray, b_scale: np.ndarray,
                bias: np.ndarray, **attrs: Any) -> np.ndarray:
    y, scale, zp = get_op("dynamic_quantize_linear").reference(a)
    acc = get_op(quant_kernels.INTEGER).reference(y, bp, colsum, zp, **attrs)
    return _float_ref(acc, scale, b_scale, bias)


def pack(call: g.Call, isa: ISA) -> g.Call | None:
    """`dynamic_quant_matmul` with a constant B and zero point as its packed form for
    `isa` (B packed as `matmul_integer_packed` packs it), else None."""
    if call.op != DYNAMIC:
        return None
    a, b, b_zp, b_scale, bias = call.args
    at = a.type
    assert isinstance(at, TensorType)
    a_q = g.Var("a_q", _quantized_type(at))
    integer = quant_kernels.pack(op_call("matmul_integer", a_q, b, g.Var(
        "a_zp", TensorType((), "uint8")), b_zp), isa)
    if integer is None:
        return None
    return op_call(PACKED, a, integer.args[1], integer.args[2], b_scale, bias,
                   **integer.attrs)


# --------------------------------------------------------------------------- the kernel

def range_lanes(isa: ISA) -> int:
    """Running minima (and as many maxima) kept while scanning A for its range: a
    quarter of the vector registers each, at most 8 vectors, so the scan runs that many
    independent min/max chains instead of waiting on one (with a NaN-propagating min, a
    compare and a blend, a 128 x 3072 x 768 product took 1.95 ms with one AVX-512
    vector of them, 1.5 ms with 8; one core, loaded host)."""
    return max(1, min(8, isa.vector_registers // 4)) * isa.lanes("float32")


def quantize_tensor(a: Buffer, a_q: Buffer, params: Buffer, zp: Buffer,
                    parallel: bool, isa: ISA) -> Stmt:
    """DynamicQuantizeLinear of `a` into `a_q` (uint8, `a`'s shape), its scale into
    `params[2]` and zero point into `zp[0]` (`params[0:2]`: A's range with 0). A's
    rows are its leading dims flattened; the range is scanned `range_lanes(isa)` columns
    at a time (a column past K rereads the last one, which leaves a minimum unchanged)."""
    lead = tuple(int(d) for d in a.shape[:-1])
    m, k = int(np.prod(lead, dtype=np.int64)), int(a.shape[-1])
    lanes = min(range_lanes(isa), k)
    chunks = -(-k // lanes)
    lo = Buffer("a_lo", (lanes,), "float32", "local")
    hi = Buffer("a_hi", (lanes,), "float32", "local")

    def at(row: PrimExpr, c: PrimExpr, v: PrimExpr) -> tuple[PrimExpr, ...]:
        col = c * lanes + v
        return (*te.unflatten_index(row, lead), col if k % lanes == 0 else min_(col, k - 1))

    zero = as_expr(0.0, "float32")
    # starting from 0: the range DynamicQuantizeLinear takes includes 0
    init = tile_loop("v", lanes, lambda v: seq(Store(lo, zero, (v,)), Store(hi, zero, (v,))),
                     "vectorized")
    # a NaN never replaces the extreme so far (onnxruntime's range skips NaN): one
    # `minps` / `maxps` each
    scan = tile_loop("r", m, lambda r: tile_loop("c", chunks, lambda c: tile_loop(
        "v", lanes, lambda v: seq(Store(lo, min_keep_first(lo[v], a[at(r, c, v)]), (v,)),
                                  Store(hi, max_keep_first(hi[v], a[at(r, c, v)]), (v,))),
        "vectorized")))
    fold = seq(Store(params, zero, (const(0),)), Store(params, zero, (const(1),)), tile_loop(
        "v", lanes, lambda v: seq(Store(params, min_(params[0], lo[v]), (const(0),)),
                                  Store(params, max_(params[1], hi[v]), (const(1),)))))
    scale = Store(params, dynamic_scale(params[0], params[1]), (const(2),))
    zero_point = Store(zp, dynamic_zero_point(params[0], params[2]), (const(0),))
    quantize = tile_loop("r", m, lambda r: tile_loop("c", chunks, lambda c: tile_loop(
        "v", lanes, lambda v: Store(a_q, quantize_value(
            a[at(r, c, v)], params[2], zp[0], 0, 255, "uint8"), at(r, c, v)), "vectorized")),
        "parallel" if parallel and m > 1 else "serial")
    return seq(Allocate(lo), Allocate(hi), init, scan, fold, scale, zero_point, quantize)


@dataclass(frozen=True)
class _DynamicTiledMatmul(HandBuiltOp):
    """The packed op on the integer register tiles, for a static A of rank >= 2 (the te
    definition otherwise), with a fused elementwise tail applied as it stores."""

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                    anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        if args[0].ndim < 2 or not is_static((*args[0].shape, *args[1].shape)):
            return None
        group = int(attrs.get("k_group", 1))
        tiles = quant_kernels.tile_isa(attrs, isa)
        if group > 1 and tiles is None:
            return None  # words packed for another target: the te definition reads them
        n = int(attrs["n"])
        store = fused_store(params, anchor, result, (*args[0].shape[:-1], n))
        if store is None:
            return None
        a, bp, colsum, b_scale, bias = (store.buffers[t] for t in args)
        a_q = Buffer("a_q", a.shape, "uint8", "global")
        scalars = Buffer("a_params", (3,), "float32", "global")
        zp = Buffer("a_zero_point", (1,), "uint8", "global")
        work = int(np.prod(a.shape, dtype=np.int64)) * n
        prologue = seq(Allocate(a_q), Allocate(scalars), Allocate(zp),
                       quantize_tensor(a, a_q, scalars, zp,
                                       worth_parallel(work, "madd", dtype="int8", isa=isa),
                                       isa))

        def epilogue(acc: PrimExpr, j: PrimExpr, at: tuple[PrimExpr, ...]) -> PrimExpr:
            exact = acc - Cast("int32", zp[0]) * colsum[j]
            mult = scalars[2] * (b_scale[()] if b_scale.ndim == 0 else b_scale[j])
            return store.epilogue(Cast("float32", exact) * mult + bias[j], at)

        body = quant_kernels.build_matmul_tiles(a_q, bp, n, store.out, epilogue, tiles,
                                                quant_dot.dot_intrinsic(attrs), target=isa)
        return PrimFunc((*(store.buffers[t] for t in params), store.out), seq(prologue, body),
                        {ATTR_GEMM_KERNEL: self.name})


register_op(DYNAMIC, pattern="anchor", infer=_infer, compute=_compute, reference=_ref)
OPS.register(PACKED, _DynamicTiledMatmul(PACKED, "anchor", _packed_infer, _packed_compute,
                                         _packed_ref))

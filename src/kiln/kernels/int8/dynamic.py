"""The kernel of `dynamic_quant_matmul_packed` (kiln.ops.quant_dynamic): it finds A's
range (one pass, a vector of running minima and maxima), quantizes A once into a uint8
buffer (`quantize_tensor`), runs the integer register tiles of
kiln.kernels.int8.matmul.build_matmul_tiles and applies the float epilogue (and any fused
elementwise tail: a residual add) as it stores, so neither the quantized A nor the int32
product is a tensor of the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.ir.attrs import ATTR_GEMM_KERNEL
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.graph import Call
from kiln.ir.shape_expr import dim_product, is_static
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    Cast,
    DeclBuffer,
    IfThenElse,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    as_expr,
    compare,
    max_,
    min_,
    seq,
)
from kiln.kernels.epilogue import fused_store
from kiln.kernels.int8 import dot
from kiln.kernels.int8.matmul import build_matmul_tiles, tile_isa
from kiln.kernels.parallel_work import min_parallel_work, worth_parallel
from kiln.kernels.tiles import Epilogue, bound, const
from kiln.kernels.tiles import loop as tile_loop
from kiln.ops import te
from kiln.ops.nan_order import max_keep_first, min_keep_first
from kiln.ops.quant import dynamic_scale, dynamic_zero_point, quantize_value
from kiln.ops.quant_dynamic import PACKED
from kiln.target.isa import ISA

Attrs = Mapping[str, Any]

def range_lanes(isa: ISA) -> int:
    """Running minima (and as many maxima) kept while scanning A for its range: a
    quarter of the vector registers each, at most 8 vectors, so the scan runs that many
    independent min/max chains instead of waiting on one (each a compare and a blend:
    a NaN-propagating min)."""
    return max(1, min(8, isa.vector_registers // 4)) * isa.lanes("float32")


def quantize_tensor(a: Buffer, a_q: Buffer, params: Buffer, zp: Buffer,
                    parallel: bool, isa: ISA) -> Stmt:
    """DynamicQuantizeLinear of `a` into `a_q` (uint8, `a`'s shape), its scale into
    `params[2]` and zero point into `zp[0]` (`params[0:2]`: A's range with 0). A's
    rows are its leading dims flattened; the range is scanned `range_lanes(isa)` columns
    at a time (a column past K rereads the last one, which leaves a minimum unchanged)."""
    symbolic = not is_static(tuple(a.shape))  # then A is 2-D: rows of a symbolic count
    lead = tuple(int(d) for d in a.shape[:-1]) if not symbolic else ()
    m = int(np.prod(lead, dtype=np.int64)) if not symbolic else a.shape[0]
    k = int(a.shape[-1])
    lanes = min(range_lanes(isa), k)
    chunks = -(-k // lanes)
    lo = Buffer("a_lo", (lanes,), "float32", "local")
    hi = Buffer("a_hi", (lanes,), "float32", "local")

    def at(row: PrimExpr, c: PrimExpr, v: PrimExpr) -> tuple[PrimExpr, ...]:
        col = c * lanes + v
        rows = te.unflatten_index(row, lead) if not symbolic else (row,)
        return (*rows, col if k % lanes == 0 else min_(col, k - 1))

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
        "parallel" if parallel and (symbolic or m > 1) else "serial")
    return seq(Allocate(lo), Allocate(hi), init, scan, fold, scale, zero_point, quantize)


def _quantize_rows(a: Buffer, scalars: Buffer, zp: Buffer, n: int, isa: ISA
                   ) -> tuple[Buffer, Stmt]:
    """A of symbolic rows (leading dims: batch, seq) quantized as `quantize_tensor` does,
    read as rows (a 2-D view: no division per element), into a uint8 buffer of rows;
    its quantizing loop parallel where the product's work (rows x K x `n`) pays for it,
    as a static A's is, decided at run time (a recurrent step's few rows stay serial)."""
    lets: list[Stmt] = []
    rows = bound("rows", dim_product(a.shape[:-1]), lets)
    k = int(a.shape[-1])
    a_rows = Buffer("a_rows", (rows, k), a.dtype)
    a_q = Buffer("a_q", (rows, k), "uint8", "global")
    work = as_expr(rows, INDEX_DTYPE) * (k * n) >= min_parallel_work("madd", isa, "int8")
    choose = IfThenElse(work, quantize_tensor(a_rows, a_q, scalars, zp, True, isa),
                        quantize_tensor(a_rows, a_q, scalars, zp, False, isa))
    return a_q, seq(*lets, DeclBuffer(a_rows, a, 0), Allocate(a_q), Allocate(scalars),
                    Allocate(zp), choose)


@dataclass(frozen=True)
class DynamicTiledMatmul:
    """The packed op on the integer register tiles, for A of rank >= 2 whose rows
    (leading dims) are static or symbolic (K static; the te definition otherwise), with
    a fused elementwise tail applied as it stores."""

    supports_symbolic = True  # A's rows (batch, seq); K and B static
    fuses_producers = False

    def builds(self, call: Call) -> bool:
        """Whether the kernel applies to `call`: the tiles take it, and a fused tail."""
        return True

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Attrs, anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        """The tiled kernel computing `result` (None: the product alone)."""
        if args[0].ndim < 2 or not is_static((args[0].shape[-1], *args[1].shape)):
            return None
        group = int(attrs.get("k_group", 1))
        tiles = tile_isa(attrs, isa)
        if group > 1 and tiles is None:
            return None  # words packed for another target: the te definition reads them
        n = int(attrs["n"])
        store = fused_store(params, anchor, result, (*args[0].shape[:-1], n))
        if store is None:
            return None
        a, bp, colsum, b_scale, bias = (store.buffers[t] for t in args)
        product = _Product(bp, colsum, b_scale, bias, n, store.epilogue, tiles,
                           dot.dot_intrinsic(attrs), isa)
        if is_static(a.shape):
            body = product.body(a, store.out, lambda at: at)
        else:
            body = _one_row_or_any(a, store.out, product)
        return PrimFunc((*(store.buffers[t] for t in params), store.out), body,
                        {ATTR_GEMM_KERNEL: PACKED})


@dataclass(frozen=True)
class _Product:
    """What a product's kernel reads besides A and writes besides the output: B's packed
    panels, its column sums and scale, the bias, the fused store's epilogue, the dot form
    (`tiles`, `intrinsic`) and the target's ISA."""

    bp: Buffer
    colsum: Buffer
    b_scale: Buffer
    bias: Buffer
    n: int
    store_epilogue: Epilogue
    tiles: ISA | None
    intrinsic: str
    isa: ISA

    def body(self, a: Buffer, out: Buffer,
             out_index: Callable[[tuple[PrimExpr, ...]], tuple[PrimExpr, ...]]) -> Stmt:
        """A quantized (its own scalars), then the integer tiles over it into `out`, their
        epilogue reading the fused tail at `out_index(at)` (the fused store's index of
        the tile's output index `at`)."""
        scalars = Buffer("a_params", (3,), "float32", "global")
        zp = Buffer("a_zero_point", (1,), "uint8", "global")
        if is_static(a.shape):
            a_q = Buffer("a_q", a.shape, "uint8", "global")
            work = int(np.prod(a.shape, dtype=np.int64)) * self.n
            prologue = seq(Allocate(a_q), Allocate(scalars), Allocate(zp), quantize_tensor(
                a, a_q, scalars, zp, worth_parallel(work, "madd", dtype="int8", isa=self.isa),
                self.isa))
        else:
            a_q, prologue = _quantize_rows(a, scalars, zp, self.n, self.isa)
        colsum, b_scale, bias = self.colsum, self.b_scale, self.bias

        def epilogue(acc: PrimExpr, j: PrimExpr, at: tuple[PrimExpr, ...]) -> PrimExpr:
            exact = acc - Cast("int32", zp[0]) * colsum[j]
            mult = scalars[2] * (b_scale[()] if b_scale.ndim == 0 else b_scale[j])
            return self.store_epilogue(Cast("float32", exact) * mult + bias[j], out_index(at))

        tiles = build_matmul_tiles(a_q, self.bp, self.n, out, epilogue, self.tiles,
                                   self.intrinsic, target=self.isa)
        return seq(prologue, tiles)


def _one_row_or_any(a: Buffer, out: Buffer, product: _Product) -> Stmt:
    """The product over A's symbolic rows, chosen at run time: one row (a recurrent step
    at batch 1, a decoder's token) runs the kernel a pinned build of one row has, on a
    view of A as `[1, ..., 1, K]` (a one-row register tile, the quantizing loops without
    a row loop); any other count the tiles over a run-time row count, whose full-height
    tile would compute its surplus rows for nothing. The one-row kernel stores into
    `out` itself at `(0, ..., 0, j)`: a view of the output would make it reachable
    through two buffers, and its stores would then not run as kiln's vector code
    (kiln.ir.analysis.vector_loops: only a buffer nothing else reaches is written so)."""
    lead = len(a.shape) - 1
    k = int(a.shape[-1])
    a_one = Buffer("a_one", (*(1,) * lead, k), a.dtype)
    # every leading dim is 1 when their product is: the output index is (0, ..., j)
    one_row = seq(DeclBuffer(a_one, a, 0), product.body(a_one, out, lambda at: at))
    rows = as_expr(dim_product(a.shape[:-1]), INDEX_DTYPE)
    return IfThenElse(compare("eq", rows, const(1)), one_row,
                      product.body(a, out, lambda at: at))


#: The lowering of `dynamic_quant_matmul_packed` (kiln.kernels.lowering).
DYNAMIC_TILED_MATMUL = DynamicTiledMatmul()

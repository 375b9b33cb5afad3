"""B packed into panels at run time: the GEMM of two activations (`matmul_tiled`).

A B that is an activation (attention's Q @ K^T and P @ V) is copied into a workspace
of the micro-kernel's panels `[ceil(N / nr)][K][nr]` (kiln.kernels.gemm.micro_kernel)
once per call, a copy of K x N elements against M x N x K multiply-adds.
"""

from __future__ import annotations

from typing import cast

from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.shape_expr import dim_product
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    Const,
    For,
    IfThenElse,
    PrimExpr,
    Stmt,
    Store,
    Var,
    as_expr,
    compare,
    min_,
    seq,
)
from kiln.kernels.gemm.micro_kernel import BReader, unflatten
from kiln.kernels.tiles import const, parallel_tiles, parallel_when
from kiln.ops.broadcast import broadcast_index
from kiln.target.isa import ISA


def pack_b_at_run_time(b: Buffer, b_batch: tuple[int, ...], k: int, n: int, nr: int,
                       transposed: bool, *, isa: ISA
                       ) -> tuple[list[Stmt], BReader]:
    """Statements packing the activation `b` (`[*b_batch, k, n]`, or `[*b_batch, n, k]`
    when `transposed`) into a workspace `[prod(b_batch)][panels][k][nr]` (zero past n),
    and the reader of it (indexed by the output's batch index, broadcast to B's)."""
    panels = (n + nr - 1) // nr
    whole_panels = isinstance(n, int) and n % nr == 0
    bb = cast(int, dim_product(b_batch))
    ws = Buffer("b_packed", (bb, panels, k, nr), b.dtype)
    zero = as_expr(0.0, b.dtype)

    def panel_copy(bf: PrimExpr, p: PrimExpr) -> Stmt:
        lets: list[Stmt] = []
        bidx = unflatten(bf, b_batch, "j", lets)
        n0 = p * nr if not isinstance(panels, int) or panels > 1 else const(0)
        kx = as_expr(k, INDEX_DTYPE)

        def copy(width: PrimExpr) -> Stmt:
            kk, v = Var("k", INDEX_DTYPE), Var("v", INDEX_DTYPE)
            src = b[(*bidx, n0 + v, kk)] if transposed else b[(*bidx, kk, n0 + v)]
            put = Store(ws, src, (bf, p, kk, v))
            # transposed: B's rows run along k, so k is the inner loop of the copy
            body: Stmt = (For(v, const(0), width, "serial", For(kk, const(0), kx, "serial", put))
                          if transposed else
                          For(kk, const(0), kx, "serial", For(v, const(0), width, "serial", put)))
            if isinstance(width, Const):
                return body
            # the last panel's columns past n are zero
            kz, z = Var("k", INDEX_DTYPE), Var("z", INDEX_DTYPE)
            return seq(body, For(kz, const(0), kx, "serial", For(
                z, width, const(nr) - width, "serial", Store(ws, zero, (bf, p, kz, z)))))

        if whole_panels:
            return seq(*lets, copy(const(nr)))
        partial = copy(min_(nr, n - n0))
        if isinstance(n, int) and n < nr:  # one partial panel
            return seq(*lets, partial)
        # whole panels copy `nr` columns (a constant extent the backend vectorizes)
        return seq(*lets, IfThenElse(compare("ge", n - n0, const(nr)), copy(const(nr)), partial))

    pack = parallel_when(lambda: parallel_tiles((bb, panels), panel_copy),
                         dim_product((bb, panels, k, nr)), "element", isa=isa)

    def read(oidx: tuple[PrimExpr, ...], p: PrimExpr, kk: PrimExpr, v: PrimExpr) -> PrimExpr:
        flat: PrimExpr = const(0)
        for i, d in zip(broadcast_index(oidx, b_batch), b_batch):
            if not isinstance(d, int) or d > 1:
                flat = flat * d + as_expr(i, INDEX_DTYPE)
        return ws[flat, p, kk, v]

    return [Allocate(ws), pack], read

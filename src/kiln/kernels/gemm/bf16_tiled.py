"""The bfloat16 product of two activations (`matmul_tiled_bf16`, kiln.ops.gemm_bf16:
attention's Q @ K^T and P @ V) on `precision=bf16` targets.

B is converted once per call into the bfloat16 words of the constant-weight kernel's
panels (kiln.ops.gemm_bf16.pack_b_bf16's layout, one set per batch entry:
`[entries][ceil(N / nr)][padded K / 2][nr]`, zero past K and N; `pack_b_bf16_at_run_time`),
a conversion of K x N elements against M x N x K multiply-adds; then each parallel tile
(batch entry, panel group, row tile) runs the bf16 GEMM's loop nest
(kiln.kernels.gemm.bf16: A's rows converted on the stack, `vdpbf16ps` sums in float32,
the fused epilogue in float32). K and N must be static; A's and B's batch dims equal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from kiln.ir import graph as g
from kiln.ir.attrs import ATTR_GEMM_KERNEL
from kiln.ir.shape_expr import dim_product
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    IfThenElse,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    as_expr,
    compare,
    min_,
    select,
    seq,
)
from kiln.ir.types import TensorType
from kiln.kernels.epilogue import fused_store
from kiln.kernels.gemm.bf16 import Bf16Nest, BWords, bf16_body, bf16_word, panel_group
from kiln.kernels.gemm.families import choose_tile
from kiln.kernels.gemm.micro_kernel import unflatten
from kiln.kernels.registry import Family
from kiln.kernels.tiles import const, parallel_tiles, parallel_when, tile_lanes
from kiln.kernels.tiles import loop as _loop
from kiln.ops.gemm_bf16 import PAIR_BLOCK, PAIR_STRIDE, TILED_BF16, padded_k
from kiln.ops.nn import b_shape
from kiln.ops.packed_attrs import TILE, recorded_tile
from kiln.target.isa import ISA


@dataclass(frozen=True)
class ActivationB:
    """B as the run-time conversion reads it: logical `[*batch, k, n]`, stored
    transposed (`[*batch, n, k]`) or not."""

    buf: Buffer
    batch: tuple[Any, ...]
    k: int
    n: int
    transposed: bool

    def at(self, bidx: tuple[PrimExpr, ...], kk: PrimExpr, col: PrimExpr,
           inside: tuple[bool, bool] = (False, False)) -> PrimExpr:
        """B[kk, col] of batch entry `bidx` (zero past K and N); `inside` says that `kk`
        is under K and `col` under N, so that either is read unclamped."""
        k_inside, col_inside = inside
        ki = kk if k_inside else min_(kk, self.k - 1)
        ci = col if col_inside else min_(col, self.n - 1)
        value: PrimExpr = (self.buf[(*bidx, ci, ki)] if self.transposed
                           else self.buf[(*bidx, ki, ci)])
        zero = as_expr(0.0, "float32")
        if self.k % PAIR_BLOCK and not k_inside:
            value = select(compare("lt", kk, const(self.k)), value, zero)
        if col_inside:
            return value
        return select(compare("lt", col, const(self.n)), value, zero)


def pack_b_bf16_at_run_time(b: ActivationB, nr: int, *, isa: ISA, compact_tail: bool = False
                            ) -> tuple[list[Stmt], BWords, int, int]:
    """The statements converting B into a workspace of bfloat16 words (see the module
    docstring), its reader, and its words and panels per batch entry. A transposed B
    (K^T) is read along K (the inner loop over one word's 16 K values), otherwise along
    N. The loops are serial, LLVM's to vectorize: where K or N ends inside a block their
    reads are clamped, which has no vector form that a vectorized loop could require.
    With `compact_tail` a partial last block of K is paired at half its length
    (`compact_words`), not padded to a whole block: the nest reading the words must
    convert A's rows alike (kiln.kernels.gemm.bf16 derives the pairing from the
    words)."""
    words = compact_words(b.k) if compact_tail else padded_k(b.k) // 2
    panels = -(-b.n // nr)
    tail = words - b.k // PAIR_BLOCK * PAIR_STRIDE  # the last block's pair distance
    entries = cast(int, dim_product(b.batch)) if b.batch else 1
    ws = Buffer("b_bf16", (entries, panels, words, nr), "int32")

    def convert(bf: PrimExpr, p: PrimExpr) -> Stmt:
        lets: list[Stmt] = []
        bidx = unflatten(bf, b.batch, "bj", lets)

        def panel(col_inside: bool) -> Stmt:
            def word(q: PrimExpr, j: PrimExpr, v: PrimExpr, k_inside: bool) -> Stmt:
                kk, col = q * PAIR_BLOCK + j, p * nr + v
                inside = (k_inside, col_inside)
                stride = PAIR_STRIDE if k_inside else tail
                return Store(ws, bf16_word(b.at(bidx, kk, col, inside),
                                           b.at(bidx, kk + stride, col, inside)),
                             (bf, p, q * PAIR_STRIDE + j, v))

            def block(q: PrimExpr, v: PrimExpr | None, k_inside: bool) -> Stmt:
                pairs = PAIR_STRIDE if k_inside else tail
                if v is not None:  # transposed: along K within one column
                    return _loop("j", pairs, lambda j: word(q, j, v, k_inside))
                return _loop("j", pairs, lambda j: _loop(
                    "v", nr, lambda v: word(q, j, v, k_inside)))

            def blocks(v: PrimExpr | None) -> Stmt:
                # only the block K ends inside reads clamped (no vector form)
                whole = b.k // PAIR_BLOCK
                last = [block(const(whole), v, False)] if b.k % PAIR_BLOCK else []
                return seq(_loop("q", whole, lambda q: block(q, v, True)), *last)

            if b.transposed:
                return _loop("v", nr, blocks)
            return blocks(None)

        # only the panel N ends inside reads its columns clamped
        body = panel(True) if b.n % nr == 0 else IfThenElse(
            compare("lt", p, const(b.n // nr)), panel(True), panel(False))
        return seq(*lets, body)

    work = dim_product((entries, panels, words * 2, nr))
    pack = parallel_when(lambda: parallel_tiles((entries, panels), convert), work, "element",
                         isa=isa)
    return [Allocate(ws), pack], (lambda bf, p, w, v: ws[bf, p, w, v]), words, panels


def compact_words(k: int) -> int:
    """The words of K pairs when a partial last block of `t` values pairs value `j` with
    `j + ceil(t / 2)` (`ceil(t / 2)` words, the odd one's high half zero) rather than
    with `j + PAIR_STRIDE` in a block padded to `PAIR_BLOCK`: K = 40 makes 20 words,
    not 32, so no `vdpbf16ps` multiplies the padding's zero words."""
    whole, t = divmod(k, PAIR_BLOCK)
    return whole * PAIR_STRIDE + -(-t // 2)


def _static_kn(call: g.Call) -> tuple[int, int] | None:
    a, b = (x.type for x in call.args)
    if not (isinstance(a, TensorType) and isinstance(b, TensorType)):
        return None
    logical = b_shape(cast(Sequence[int], b.shape), call.attrs)
    k, n = a.shape[-1], logical[-1]
    if not (isinstance(k, int) and isinstance(n, int)) or tuple(a.shape[:-2]) != \
            tuple(logical[:-2]):
        return None
    return k, n


@dataclass(frozen=True)
class Bf16TiledGemm(Family):
    """`matmul(a, b)` of two float32 activations of rank >= 2 with static K and N and
    equal batch dims, on a `precision=bf16` target of 16 float32 lanes ->
    `matmul_tiled_bf16(a, b)`, tile `(mr, nr)`."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        return (isa.precision == "bf16" and tile_lanes(isa) == 16 and call.op == "matmul"
                and len(call.args) == 2 and all(
                    isinstance(x.type, TensorType) and x.type.dtype == "float32"
                    and x.type.ndim >= 2 and not isinstance(x, g.Constant) for x in call.args)
                and _static_kn(call) is not None)

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        kn = _static_kn(call)
        assert kn is not None
        a = call.args[0].type
        assert isinstance(a, TensorType)
        t = choose_tile(a.shape[-2], kn[1], isa)
        return g.Call(self.op, call.args, g.freeze_attrs({**call.attrs, TILE: (t.mr, t.nr)}),
                      call.ret_type)

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        a, b = args[0], args[1]
        logical = b_shape(b.shape, attrs)
        k, n = a.shape[-1], logical[-1]
        batch = tuple(a.shape[:-2])
        if not (isinstance(k, int) and isinstance(n, int)) or batch != tuple(logical[:-2]):
            return None
        m = a.shape[-2]
        store = fused_store(params, anchor, result, (*batch, m, n))
        if store is None:
            return None
        tile = recorded_tile(attrs, 2, self.op)
        mr, nr = tile if tile else (choose_tile(m, n, isa).mr, choose_tile(m, n, isa).nr)
        mr = min(mr, m) if isinstance(m, int) else mr
        rb = ActivationB(store.buffers[b], batch, k, n, bool(attrs.get("transpose_b")))
        prologue, words_at, words, panels = pack_b_bf16_at_run_time(rb, nr, isa=isa)
        nest = Bf16Nest(store.buffers[a], words_at, store.out, store.epilogue, (m,), m, n, k,
                        mr, nr, panel_group(words, nr, panels, isa), words, panels, isa,
                        batch)
        return PrimFunc((*(store.buffers[t] for t in params), store.out),
                        seq(*prologue, bf16_body(nest)), {ATTR_GEMM_KERNEL: self.op})


GEMM_TILED_BF16 = Bf16TiledGemm("gemm_tiled_bf16", TILED_BF16, ("matmul",), 1)

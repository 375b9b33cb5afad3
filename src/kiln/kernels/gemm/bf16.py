"""The bfloat16 GEMM (`matmul_packed_bf16`, kiln.ops.gemm_bf16): float32 A by bfloat16
weights packed at compile time, float32 sums, for targets with `precision=bf16`
(kiln.target.precision).

A parallel tile is one row tile of `mr` rows of A by a group of B's panels (as many
as fill half of L2, `PANEL_GROUP_L2_SHARE`, so that a thread's consecutive tiles reuse
them from L2; all of them where A is larger than L2 and B a few L2s: `panel_group`).
Its rows of A are bfloat16 words (two contiguous runs of each row paired lane by lane,
the pairing `pack_b_bf16` gave B; K zero-padded to whole blocks):
converted by the tile on the stack where B is one group, else once per call into a
buffer of every row tile that all groups read (per group, the conversion cost about a
quarter of the tile's time). The tile runs each panel's register tile over them: per
word of K, one broadcast A word per row and `mr * nr` float32 lanes of `dot2_bf16`
(one `vdpbf16ps` per 16 lanes: two multiply-adds each), the accumulators held at
constant rows so they stay in registers, as the float32 micro-kernel's
(kiln.kernels.gemm.micro_kernel). Each output then goes through the fused epilogue in
float32. Rows past M read the last row (symbolic M: a tile count of the kernel's dim
scalars), columns past N multiply zero weights and are not stored. On a target with
AMX-BF16 the register tile is a block of AMX tiles instead (kiln.kernels.gemm.amx_bf16:
the same packing, the same converted rows, tiles of 16 or 32 rows and columns).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from kiln.ir import graph as g
from kiln.ir.attrs import ATTR_GEMM_KERNEL
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.shape_expr import dim_product
from kiln.ir.tensor import (
    BF16_PAIR,
    DOT2_BF16,
    Allocate,
    Buffer,
    Const,
    For,
    Intrin,
    LetStmt,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    Var,
    as_expr,
    compare,
    min_,
    select,
    seq,
)
from kiln.ir.verify import STACK_LIMIT_BYTES
from kiln.kernels.epilogue import fused_store
from kiln.kernels.gemm.amx_bf16 import (
    amx_begin,
    amx_end,
    amx_stage,
    amx_tile,
    is_amx_tile,
    uses_amx,
)
from kiln.kernels.gemm.families import PackedGemm, choose_tile, constant_b
from kiln.kernels.gemm.micro_kernel import unflatten
from kiln.kernels.tiles import Epilogue, const, lanes_loop, parallel_tiles, parallel_when
from kiln.ops.gemm_bf16 import PAIR_BLOCK, PAIR_STRIDE, pack_b_bf16, packed_bf16_kn
from kiln.ops.packed_attrs import TILE, recorded_tile
from kiln.target.isa import ISA

#: The share of L2 one parallel tile's group of packed panels may fill.
PANEL_GROUP_L2_SHARE = 0.5
#: The most L2s of packed B that one parallel tile streams whole (`panel_group`).
STREAMED_B_L2S = 2


def bf16_word(lo: PrimExpr, hi: PrimExpr) -> PrimExpr:
    """The int32 word of two bfloat16 values: `lo` rounded in its low half, `hi` in its
    high half (the `bf16_pair` intrinsic: one `vcvtne2ps2bf16` per 16 words on
    AVX512-BF16)."""
    return Intrin(BF16_PAIR, (lo, hi))


#: A reader of packed B: (flat batch index, panel, word, lane) -> the int32 word.
BWords = Callable[[PrimExpr, PrimExpr, PrimExpr, PrimExpr], PrimExpr]


@dataclass(frozen=True)
class Bf16Nest:
    """The sizes and operands of one bf16 GEMM kernel: B's `panels` of `words` words
    read through `b_words`; `batch` the output's batch dims (A's and B's, equal; none
    for B a constant), `rows` A's row dims within one batch entry."""

    a: Buffer
    b_words: BWords
    out: Buffer
    epilogue: Epilogue
    rows: tuple[Any, ...]
    m: Any  # an int, or an expression of the kernel's dim scalars
    n: int
    k: int
    mr: int
    nr: int
    group: int
    words: int
    panels: int
    isa: ISA
    batch: tuple[Any, ...] = ()
    #: The packed B buffer `[panels][words][nr]` when AMX tiles compute each register
    #: tile (kiln.kernels.gemm.amx_bf16); None: `dot2_bf16` vectors.
    amx: Buffer | None = None
    #: Where `out` holds the output at an index (the epilogue's): None, at that index.
    store_at: Callable[[tuple[PrimExpr, ...]], tuple[PrimExpr, ...]] | None = None


#: Where a parallel tile is: the flat batch index and the batch index (both 0 and ()
#: without a batch), and the row tile.
_At = tuple[PrimExpr, tuple[PrimExpr, ...], PrimExpr]


def _convert_rows(nest: Bf16Nest, at_: _At, abuf: Buffer, row0: PrimExpr | None = None
                  ) -> Stmt:
    """`abuf[r, w]` (`abuf[row0 + r, w]` given `row0`): the bfloat16 words of the tile's
    rows of A (rows past M read the last row; K past its end reads zero). One loop over
    the rows: the conversion is in the IR once, not once per row."""
    k, whole = nest.k, nest.k // PAIR_BLOCK
    _, bi, mt = at_
    r, q, j = (Var(v, INDEX_DTYPE) for v in ("cr", "q", "j"))
    at_row = r if row0 is None else row0 + r
    lets: list[Stmt] = []
    row = Var("crow", INDEX_DTYPE)
    lets.append(LetStmt(row, min_(mt * nest.mr + r, nest.m - 1)))
    pre = unflatten(row, nest.rows, "cr_", lets)

    def at(kk: PrimExpr) -> PrimExpr:
        return nest.a[(*bi, *pre, kk)]

    def pair(jj: PrimExpr) -> Stmt:
        return Store(abuf, bf16_word(at(q * PAIR_BLOCK + jj),
                                     at(q * PAIR_BLOCK + PAIR_STRIDE + jj)),
                     (at_row, q * PAIR_STRIDE + jj))

    body: list[Stmt] = list(lets)
    if whole:
        body.append(For(q, const(0), const(whole), "serial",
                        lanes_loop("j", PAIR_STRIDE, pair)))
    if k % PAIR_BLOCK:  # the last, partial block: K's end read as zero
        # its pair distance: PAIR_STRIDE in a padded block, less in B's compact tail
        # (kiln.kernels.gemm.bf16_tiled.compact_words), as B's words were paired
        stride = nest.words - whole * PAIR_STRIDE

        def tail(kk: PrimExpr) -> PrimExpr:
            return select(compare("lt", kk, const(k)), at(min_(kk, k - 1)),
                          as_expr(0.0, "float32"))

        lo = const(whole * PAIR_BLOCK) + j
        body.append(For(j, const(0), const(stride), "serial", Store(
            abuf, bf16_word(tail(lo), tail(lo + stride)),
            (at_row, const(whole * PAIR_STRIDE) + j))))
    return For(r, const(0), const(nest.mr), "serial", seq(*body))


def _panel(nest: Bf16Nest, at_: _At, panel: PrimExpr, abuf: Buffer,
           a_row: PrimExpr) -> Stmt:
    """One register tile: the rows' words (from row `a_row` of `abuf`) by panel
    `panel`, stored through the epilogue."""
    mr, nr = nest.mr, nest.nr
    if nest.amx is not None:
        stage = Buffer("stage", (mr, nr), "float32", "local")
        return seq(Allocate(stage), amx_stage(stage, abuf, a_row * nest.words, nest.amx,
                                              panel * (nest.words * nr), nest.words, mr, nr),
                   _stores(nest, at_, panel, stage))
    acc = Buffer("acc", (mr, nr), "float32", "local")
    zero = as_expr(0.0, "float32")
    init = lanes_loop("v", nr, lambda v: seq(*(Store(acc, zero, (const(r), v))
                                               for r in range(mr))))
    w = Var("w", INDEX_DTYPE)
    xs = [Var(f"a{r}", "int32") for r in range(mr)]

    def lane(v: PrimExpr) -> Stmt:
        bv = Var("b", "int32")
        return seq(LetStmt(bv, nest.b_words(at_[0], panel, w, v)), *(
            Store(acc, Intrin(DOT2_BF16, (acc[const(r), v], xs[r], bv)), (const(r), v))
            for r in range(mr)))

    step = seq(*(LetStmt(x, abuf[a_row + r, w]) for r, x in enumerate(xs)),
               lanes_loop("v", nr, lane))
    reduce = For(w, const(0), const(nest.words), "serial", step)
    stage = Buffer("stage", (mr, nr), "float32", "local")
    copy = lanes_loop("v", nr, lambda v: seq(*(Store(stage, acc[const(r), v], (const(r), v))
                                              for r in range(mr))))
    return seq(Allocate(acc), init, reduce, Allocate(stage), copy,
               _stores(nest, at_, panel, stage))


def _stores(nest: Bf16Nest, at_: _At, panel: PrimExpr, stage: Buffer) -> Stmt:
    """The tile's rows (those before M) and columns (those before N) stored."""
    mr, nr, n = nest.mr, nest.nr, nest.n
    _, bi, mt = at_
    n0 = panel * nr
    static_rows = isinstance(nest.m, int) and nest.m % mr == 0
    rows_here: PrimExpr = const(mr) if static_rows else min_(mr, nest.m - mt * mr)

    def store_loops(cols: PrimExpr) -> Stmt:
        r, v, rv = Var("r", INDEX_DTYPE), Var("v", INDEX_DTYPE), Var("row", INDEX_DTYPE)
        lets: list[Stmt] = [LetStmt(rv, mt * mr + r)]
        idx = (*bi, *unflatten(rv, nest.rows, "o", lets), n0 + v)
        kind = "vectorized" if isinstance(cols, Const) else "serial"
        row = For(v, const(0), cols, kind,
                  Store(nest.out, nest.epilogue(stage[r, v], idx),
                        idx if nest.store_at is None else nest.store_at(idx)))
        return For(r, const(0), rows_here, "serial", seq(*lets, row))

    if n % nr == 0:
        return store_loops(const(nr))
    if n < nr:
        return store_loops(const(n))
    return store_loops(min_(nr, n - n0))


def bf16_body(nest: Bf16Nest) -> Stmt:
    """The kernel's loop nest: parallel tiles over (batch entry, panel group, row
    tile)."""
    mtiles = (nest.m + nest.mr - 1) // nest.mr
    groups = -(-nest.panels // nest.group)
    over_stack = nest.amx is not None and nest.mr * nest.words * 4 > STACK_LIMIT_BYTES
    if not nest.batch and (groups > 1 or over_stack):
        return _heap_body(nest, mtiles, groups)

    def tile(bf: PrimExpr, gi: PrimExpr, mt: PrimExpr) -> Stmt:
        lets: list[Stmt] = []
        bi = unflatten(bf, nest.batch, "bi", lets)
        at_ = (bf, bi, mt)
        abuf = Buffer("a_bf16", (nest.mr, nest.words), "int32", "local")
        convert = _convert_rows(nest, at_, abuf)
        return seq(*lets, Allocate(abuf), convert, _group(nest, at_, gi, abuf, const(0)))

    if not nest.batch:
        return parallel_when(lambda: parallel_tiles(
            (groups, mtiles), lambda gi, mt: tile(const(0), gi, mt)),
            nest.m * nest.n * nest.k, isa=nest.isa)
    entries = cast(int, dim_product(nest.batch))  # symbolic: a dim scalar's expression
    return parallel_when(lambda: parallel_tiles((entries, groups, mtiles), tile),
                         entries * nest.m * nest.n * nest.k, isa=nest.isa)


def _group(nest: Bf16Nest, at_: _At, gi: PrimExpr, abuf: Buffer, a_row: PrimExpr
           ) -> Stmt:
    """The register tiles of the tile's rows by panel group `gi`."""
    pj = Var("pj", INDEX_DTYPE)
    here: PrimExpr = (const(nest.group) if nest.panels % nest.group == 0
                      else min_(nest.group, nest.panels - gi * nest.group))
    panels: Stmt = For(pj, const(0), here, "serial",
                       _panel(nest, at_, gi * nest.group + pj, abuf, a_row))
    if nest.amx is not None:  # the tiles configured once per parallel tile
        panels = seq(amx_begin(), panels, amx_end())
    return panels


def _heap_body(nest: Bf16Nest, mtiles: Any, groups: int) -> Stmt:
    """The nest where a row tile's words would be converted once per panel group (more
    than one group), or would not fit the stack (AMX: K over 1024 on 32 rows): A
    converted once, in parallel over its row tiles, into a heap buffer of whole row
    tiles, which the parallel tiles then read at their rows' offset."""
    abuf = Buffer("a_bf16", (mtiles * nest.mr, nest.words), "int32", "global")

    def rows(mt: PrimExpr) -> Stmt:
        return _convert_rows(nest, (const(0), (), mt), abuf, mt * nest.mr)

    def tile(gi: PrimExpr, mt: PrimExpr) -> Stmt:
        return _group(nest, (const(0), (), mt), gi, abuf, mt * nest.mr)

    convert = parallel_when(lambda: parallel_tiles((mtiles,), rows), nest.m * nest.k,
                            "element", isa=nest.isa)
    tiles = parallel_when(lambda: parallel_tiles((groups, mtiles), tile),
                          nest.m * nest.n * nest.k, isa=nest.isa)
    return seq(Allocate(abuf), convert, tiles)


def panel_group(words: int, nr: int, panels: int, isa: ISA, rows: Any = None) -> int:
    """The panels of B one parallel tile runs (`PANEL_GROUP_L2_SHARE` of L2), or all of
    them where A has a static count of `rows` whose words would not stay in L2 and B is
    at most `STREAMED_B_L2S` L2s: several groups would convert A into a heap buffer
    in a pass of its own and read it back from memory once per group, where one group
    converts each row tile on the stack as it goes and reads B again per row tile, from
    the L3 it stays in."""
    b_bytes = panels * words * nr * 4
    if isinstance(rows, int) and rows * words * 4 > isa.l2_bytes \
            and b_bytes <= STREAMED_B_L2S * isa.l2_bytes:
        return panels
    return max(1, min(panels, int(PANEL_GROUP_L2_SHARE * isa.l2_bytes) // (words * nr * 4)))


@dataclass(frozen=True)
class Bf16Gemm(PackedGemm):
    """`matmul(a, B)` with B constant on a `precision=bf16` target ->
    `matmul_packed_bf16(a, bp)`, tile `(mr, nr)`."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        return isa.precision == "bf16" and constant_b(call)

    def candidates(self, call: g.Call, isa: ISA) -> list[tuple[int, ...]]:
        return []

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        if not uses_amx(isa):
            return super().pack(call, isa)
        m, n = self._mn(call)
        return self.pack_tile(call, isa, amx_tile(m, n))

    def pack_tile(self, call: g.Call, isa: ISA, tile: tuple[int, ...]) -> g.Call:
        a, b = call.args
        assert isinstance(b, g.Constant)
        data = b.data.T if call.attrs.get("transpose_b") else b.data
        mr, nr = tile
        packed = g.Constant(pack_b_bf16(data, nr), b.name)
        attrs = {"n": data.shape[1], "k": data.shape[0], TILE: (mr, nr)}
        return g.Call(self.op, (a, packed), g.freeze_attrs(attrs), call.ret_type)

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        a, bp = args[0], args[1]
        k, n = packed_bf16_kn(args, attrs)
        rows = tuple(a.shape[:-1])
        store = fused_store(params, anchor, result, (*rows, n))
        if store is None or a.dtype != "float32":
            return None
        m = dim_product(rows)
        tile = recorded_tile(attrs, 2, self.op)
        panels, words, nr = (int(d) for d in bp.shape)
        bb = store.buffers[bp]
        amx = uses_amx(isa) and tile is not None and is_amx_tile(tile)
        mr = tile[0] if tile else choose_tile(m, n, isa).mr
        mr = min(mr, m) if isinstance(m, int) and not amx else mr
        nest = Bf16Nest(store.buffers[a], lambda bf, p, w, v: bb[p, w, v], store.out,
                     store.epilogue, rows, m, n, k, mr, nr,
                     panel_group(words, nr, panels, isa, None if amx else m), words,
                     panels, isa, amx=bb if amx else None)
        body = bf16_body(nest)
        return PrimFunc((*(store.buffers[t] for t in params), store.out), body,
                        {ATTR_GEMM_KERNEL: self.op})


GEMM_BF16 = Bf16Gemm("gemm_bf16", "matmul_packed_bf16", ("matmul",), -1)

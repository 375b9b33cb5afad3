"""The kernels of block-quantized 4-/8-bit weights (`matmul_nbits`, kiln.ops.quant_nbits).

The `nbits` family repacks `matmul_nbits`' constant operands at compile time into
`matmul_nbits_packed`'s panels of `nr` columns (`pack_nbits`: two vectors of float32
lanes), each byte of a panel's columns contiguous, and builds one kernel with two
paths, chosen by the row count M (a run-time test where M is symbolic: a generation
loop's prefill and decode steps call the same kernel):

- **M = 1, the GEMV of a decode step** (memory-bound: every weight byte read once). A
  is copied once, zero-padded to whole blocks, and each block's sum of A taken. A
  parallel tile is `GEMV_PANELS` panels; for each byte row of a block it loads the
  panels' `nr` codes of each field with one vector load, unpacks the fields in registers
  (shift and mask), converts them to float and multiply-adds them with the broadcast A
  value of their k into per-field block sums. At the block's end the sums are scaled:
  `acc += scale * (sum(code * a) - zero_point * sum(a))`, so the zero point costs one
  multiply-add a block, not one subtraction a weight.
- **M > 1, prefill**: a parallel tile is one panel by a chunk of `GEMM_CHUNK_TILES`
  row tiles. For each block of K it dequantizes the panel's block,
  `(code - zero_point) * scale`, into a float tile on the stack once, then runs every
  row tile of the chunk over it with the float32 micro-kernel's register tile (`mr`
  broadcasts of A by `nr` lanes a step, kiln.kernels.gemm.micro_kernel), adding into
  the chunk's partial sums, which the epilogue stores after the last block. The
  dequantization is O(K N) a chunk against O(mc K N) multiply-adds. Over a symbolic M
  the tiles always run in parallel (a prompt's product is large; a serial twin chosen at
  run time would double the kernel's code and compile time for rare small products).

At accuracy level 4 (4-bit codes, an ISA with an integer dot product) B is packed in
`pack_nbits_words`' words and A is quantized to int8 per block: the GEMV of
kiln.kernels.gemm.nbits_int8 for M = 1, the GEMM of kiln.kernels.gemm.nbits_int8_gemm
for M > 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from kiln.ir import graph as g
from kiln.ir.attrs import ATTR_GEMM_KERNEL, ATTR_PARALLEL_DECIDED
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.shape_expr import dim_product
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    Cast,
    Const,
    For,
    IfThenElse,
    LetStmt,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    Var,
    as_expr,
    compare,
    min_,
    seq,
)
from kiln.ir.types import TensorType
from kiln.kernels.epilogue import fused_store
from kiln.kernels.gemm.families import choose_tile
from kiln.kernels.gemm.micro_kernel import unflatten
from kiln.kernels.gemm.nbits_int8 import gemv_nbits_int8, tile_panels_of
from kiln.kernels.gemm.nbits_int8_gemm import gemm_nbits_int8
from kiln.kernels.registry import Family
from kiln.kernels.tiles import (
    Epilogue,
    const,
    lanes_loop,
    madd,
    parallel_tiles,
    parallel_when,
    tile_lanes,
)
from kiln.ops import te
from kiln.ops.packed_attrs import TILE, recorded_tile
from kiln.ops.quant_nbits import (
    A_INT8_LEVEL,
    MATMUL_NBITS,
    PACKED_NBITS,
    WORDS,
    nbits_layout,
    pack_nbits,
    pack_nbits_words,
    word_code,
)
from kiln.target.isa import ISA

#: Panels of one GEMV register tile: with two vectors a panel, 4 vector accumulators and
#: 4 per field of the byte (8 for 4-bit codes) hide the multiply-add latency.
GEMV_PANELS = 2
#: Row tiles of one prefill chunk: each dequantized block serves that many (a chunk's
#: partial sums, `mr * GEMM_CHUNK_TILES` rows by `nr`, stay on the stack).
GEMM_CHUNK_TILES = 8


@dataclass(frozen=True)
class NbitsNest:
    """The sizes and buffers of one `matmul_nbits_packed` kernel."""

    a: Buffer
    bp: Buffer
    scales: Buffer
    zps: Buffer | None
    out: Buffer
    epilogue: Epilogue
    rows: tuple[Any, ...]
    k: int
    n: int
    bits: int
    block: int
    isa: ISA
    #: B in `pack_nbits_words`' int32 words (accuracy level 4: the int8 GEMV)
    words: bool = False

    @property
    def panels(self) -> int:
        return int(self.bp.shape[0])

    @property
    def blocks(self) -> int:
        return int(self.bp.shape[1])

    @property
    def blob(self) -> int:
        return int(self.bp.shape[2])

    @property
    def nr(self) -> int:
        return int(self.bp.shape[3])

    @property
    def fields(self) -> int:
        """Codes a byte."""
        return 8 // self.bits

    def zero_point(self, p: PrimExpr, blk: PrimExpr, v: PrimExpr) -> PrimExpr:
        if self.zps is None:
            return Const(float(1 << (self.bits - 1)), "float32")
        return self.zps[p, blk, v]

    def code(self, p: PrimExpr, blk: PrimExpr, j: PrimExpr, v: PrimExpr,
             field: PrimExpr | int) -> PrimExpr:
        """Field `field` of byte `j` of block `blk`, column `v` of panel `p`, as float32."""
        byte = Cast("int32", self.bp[p, blk, j, v])
        if self.fields == 1:
            return Cast("float32", byte)
        mask = Const((1 << self.bits) - 1, "int32")
        if isinstance(field, int):  # the GEMV's: the low field needs no shift, the high no mask
            if field == 0:
                return Cast("float32", byte & mask)
            shifted = byte >> Const(field * self.bits, "int32")
            return Cast("float32", shifted if field == self.fields - 1 else shifted & mask)
        shift = as_expr(field, INDEX_DTYPE) * self.bits
        return Cast("float32", (byte >> Cast("int32", shift)) & mask)

    def weight(self, p: PrimExpr, kk: PrimExpr, v: PrimExpr) -> PrimExpr:
        """The dequantized weight of row `kk`, column `v` of panel `p`."""
        blk = kk // self.block
        within = kk % self.block
        code: PrimExpr
        if self.words:
            code = Cast("float32", word_code(self.bp, p, blk, within, v, self.block))
        else:
            code = self.code(p, blk, within // self.fields, v, within % self.fields)
        return (code - self.zero_point(p, blk, v)) * self.scales[p, blk, v]


# ----------------------------------------------------------------------------- GEMV

def _padded_a(nest: NbitsNest, apad: Buffer, asum: Buffer) -> Stmt:
    """`apad`: A's one row zero-padded to whole blocks; `asum[b]`: each block's sum."""
    lead = (const(0),) * (nest.a.ndim - 1)
    kk, blk, i = (Var(v, INDEX_DTYPE) for v in ("kk", "blk", "i"))
    copy = For(kk, const(0), const(nest.k), "serial",
               Store(apad, nest.a[(*lead, kk)], (kk,)))
    kpad = nest.blocks * nest.block
    zero = as_expr(0.0, "float32")
    pad = For(kk, const(nest.k), const(kpad - nest.k), "serial", Store(apad, zero, (kk,)))
    sums = For(blk, const(0), const(nest.blocks), "serial", seq(
        Store(asum, zero, (blk,)),
        For(i, const(0), const(nest.block), "serial", Store(
            asum, asum[blk] + apad[blk * nest.block + i], (blk,)))))
    return seq(copy, pad, sums) if kpad > nest.k else seq(copy, sums)


def _gemv_block(nest: NbitsNest, panels: list[Var], blk: PrimExpr, apad: Buffer,
                asum: Buffer, acc: Buffer) -> Stmt:
    """One block of K into the accumulators `acc[r, v]` of panels `panels`."""
    nr, fields, rows = nest.nr, nest.fields, len(panels)
    part = Buffer("part", (fields, rows, nr), "float32", "local")
    zero = as_expr(0.0, "float32")
    init = lanes_loop("v", nr, lambda v: seq(*(
        Store(part, zero, (const(f), const(r), v)) for f in range(fields)
        for r in range(rows))))
    j = Var("j", INDEX_DTYPE)
    avs = [Var(f"a{f}", "float32") for f in range(fields)]

    def lane(v: PrimExpr) -> Stmt:
        return seq(*(Store(part, madd(part[const(f), const(r), v], nest.code(
            panels[r], blk, j, v, f), avs[f], nest.isa.fma), (const(f), const(r), v))
                     for r in range(rows) for f in range(fields)))

    step = seq(*(LetStmt(avs[f], apad[blk * nest.block + j * fields + f])
                 for f in range(fields)), lanes_loop("v", nr, lane))
    sums = For(j, const(0), const(nest.blob), "serial", step)
    total = Var("asum", "float32")

    def scale(v: PrimExpr) -> Stmt:
        out: list[Stmt] = []
        for r in range(rows):
            dot: PrimExpr = part[const(0), const(r), v]
            for f in range(1, fields):
                dot = dot + part[const(f), const(r), v]
            zp = nest.zero_point(panels[r], blk, v)
            out.append(Store(acc, acc[const(r), v] + nest.scales[panels[r], blk, v]
                             * (dot - zp * total), (const(r), v)))
        return seq(*out)

    return seq(Allocate(part), init, sums, LetStmt(total, asum[blk]),
               lanes_loop("v", nr, scale))


def _gemv_tile(nest: NbitsNest, t: PrimExpr, apad: Buffer, asum: Buffer) -> Stmt:
    """Parallel tile `t`: panels `t * GEMV_PANELS ...` (the last tile's surplus panels
    reread the last panel and store nothing), stored through the epilogue."""
    rows = min(GEMV_PANELS, nest.panels)
    nr = nest.nr
    lets, panels = tile_panels_of(t, rows, nest.panels)
    acc = Buffer("acc", (rows, nr), "float32", "local")
    zero = as_expr(0.0, "float32")
    init = lanes_loop("v", nr, lambda v: seq(*(Store(acc, zero, (const(r), v))
                                               for r in range(rows))))
    blk = Var("blk", INDEX_DTYPE)
    blocks = For(blk, const(0), const(nest.blocks), "serial",
                 _gemv_block(nest, panels, blk, apad, asum, acc))
    return seq(*lets, Allocate(acc), init, blocks, store_tile(nest, t, rows, acc))


def store_tile(nest: NbitsNest, t: PrimExpr, rows: int, acc: Buffer) -> Stmt:
    """The accumulators `acc[r, v]` of GEMV tile `t` (panels `t * rows ...`) stored
    through the epilogue: the tile's panels before the last, their columns before N."""
    nr = nest.nr
    stage = Buffer("stage", (rows, nr), "float32", "local")
    copy = lanes_loop("v", nr, lambda v: seq(*(Store(stage, acc[const(r), v], (const(r), v))
                                              for r in range(rows))))
    lead = (const(0),) * (nest.out.ndim - 1)
    rv, vv = Var("r", INDEX_DTYPE), Var("v", INDEX_DTYPE)
    col = (t * rows + rv) * nr + vv
    idx = (*lead, col)
    here = min_(rows, nest.panels - t * rows)
    store = For(rv, const(0), here, "serial", For(vv, const(0), const(nr), "serial", IfThenElse(
        compare("lt", col, const(nest.n)), Store(nest.out, nest.epilogue(stage[rv, vv], idx),
                                                 idx))))
    return seq(Allocate(stage), copy, store)


def gemv_nbits(nest: NbitsNest) -> Stmt:
    """M = 1: A padded and its block sums taken once, then parallel tiles of panels (at
    accuracy level 4, B in words: A quantized to int8, kiln.kernels.gemm.nbits_int8)."""
    if nest.words:
        return gemv_nbits_int8(nest, lambda t, rows, acc: store_tile(nest, t, rows, acc))
    kpad = nest.blocks * nest.block
    apad = Buffer("a_padded", (kpad,), "float32")
    asum = Buffer("a_block_sums", (nest.blocks,), "float32")
    tiles = -(-nest.panels // min(GEMV_PANELS, nest.panels))
    loop = parallel_when(lambda: parallel_tiles(
        (tiles,), lambda t: _gemv_tile(nest, t, apad, asum)),
        nest.k * nest.panels * nest.nr, isa=nest.isa)
    return seq(Allocate(apad), Allocate(asum), _padded_a(nest, apad, asum), loop)


# ----------------------------------------------------------------------------- GEMM

def _row_tile(nest: NbitsNest, chunk_row0: PrimExpr, rt: PrimExpr, mr: int, m: Any,
              k0: PrimExpr, klen: int, wbuf: Buffer, psum: Buffer) -> Stmt:
    """Row tile `rt` of a chunk over one block's `klen` rows of K from `k0`: the partial
    sums `psum` read into registers, `klen` steps of `mr` broadcasts of A by a row of the
    dequantized block, written back. Rows past M read the last row."""
    nr = nest.nr
    lets: list[Stmt] = []
    a_rows = []
    for r in range(mr):
        row = Var(f"row{r}", INDEX_DTYPE)
        lets.append(LetStmt(row, min_(chunk_row0 + rt * mr + r, m - 1)))
        a_rows.append(unflatten(row, nest.rows, f"r{r}_", lets))
    acc = Buffer("acc", (mr, nr), "float32", "local")
    load = lanes_loop("v", nr, lambda v: seq(*(
        Store(acc, psum[rt * mr + r, v], (const(r), v)) for r in range(mr))))
    kk = Var("kk", INDEX_DTYPE)
    avs = [Var(f"a{r}", "float32") for r in range(mr)]
    step = seq(*(LetStmt(avs[r], nest.a[(*a_rows[r], k0 + kk)]) for r in range(mr)),
               lanes_loop("v", nr, lambda v: seq(*(Store(acc, madd(
                   acc[const(r), v], avs[r], wbuf[kk, v], nest.isa.fma), (const(r), v))
                   for r in range(mr)))))
    save = lanes_loop("v", nr, lambda v: seq(*(
        Store(psum, acc[const(r), v], (rt * mr + r, v)) for r in range(mr))))
    return seq(*lets, Allocate(acc), load, For(kk, const(0), const(klen), "serial", step),
               save)


def _chunk_block(nest: NbitsNest, p: PrimExpr, chunk_row0: PrimExpr, rtiles: PrimExpr,
                 mr: int, m: Any, blk: PrimExpr, klen: int, wbuf: Buffer,
                 psum: Buffer) -> Stmt:
    """One block of K for a chunk of rows: its `klen` rows of panel `p` dequantized into
    `wbuf` once, then every row tile of the chunk over them."""
    kk, rt = Var("kk", INDEX_DTYPE), Var("rt", INDEX_DTYPE)
    k0 = blk * nest.block
    fill = For(kk, const(0), const(klen), "serial", lanes_loop("v", nest.nr, lambda v: Store(
        wbuf, nest.weight(p, k0 + kk, v), (kk, v))))
    tiles = For(rt, const(0), as_expr(rtiles, INDEX_DTYPE), "serial",
                _row_tile(nest, chunk_row0, rt, mr, m, k0, klen, wbuf, psum))
    return seq(fill, tiles)


def _chunk_stores(nest: NbitsNest, p: PrimExpr, chunk_row0: PrimExpr, rows_here: PrimExpr,
                  psum: Buffer) -> Stmt:
    """The chunk's rows (those before M) and the panel's columns (before N) stored
    through the epilogue."""
    nr, n = nest.nr, nest.n
    r, v, row = Var("r", INDEX_DTYPE), Var("v", INDEX_DTYPE), Var("row", INDEX_DTYPE)
    lets: list[Stmt] = [LetStmt(row, chunk_row0 + r)]
    idx = (*unflatten(row, nest.rows, "o", lets), p * nr + v)
    cols: PrimExpr = const(nr) if n % nr == 0 else min_(nr, n - p * nr)
    kind = "vectorized" if isinstance(cols, Const) else "serial"
    inner = For(v, const(0), cols, kind, Store(nest.out, nest.epilogue(psum[r, v], idx), idx))
    return For(r, const(0), rows_here, "serial", seq(*lets, inner))


def gemm_nbits(nest: NbitsNest, mr: int) -> Stmt:
    """M > 1: parallel tiles of (panel, chunk of `GEMM_CHUNK_TILES` row tiles); each K
    block of the panel is dequantized once into a float tile on the stack, which every
    row tile of the chunk multiplies into its partial sums (the float32 micro-kernel's
    register tile: `mr` broadcasts of A by `nr` lanes a step). At accuracy level 4 (B in
    words) A is quantized to int8 instead (kiln.kernels.gemm.nbits_int8_gemm)."""
    if nest.words:
        return gemm_nbits_int8(nest, mr, GEMM_CHUNK_TILES, lambda p, row0, here, psum:
                               _chunk_stores(nest, p, row0, here, psum))
    m = dim_product(nest.rows)
    mc = mr * GEMM_CHUNK_TILES
    chunks = cast(int, (m + mc - 1) // mc)  # symbolic where M is
    whole, tail = divmod(nest.k, nest.block)

    def tile(p: PrimExpr, c: PrimExpr) -> Stmt:
        psum = Buffer("psum", (mc, nest.nr), "float32", "local")
        wbuf = Buffer("wblock", (nest.block, nest.nr), "float32", "local")
        row0 = Var("row0", INDEX_DTYPE)
        here = Var("rows_here", INDEX_DTYPE)
        static = isinstance(m, int) and m % mc == 0
        rtiles = (here + (mr - 1)) // mr
        zero = as_expr(0.0, "float32")
        i = Var("i", INDEX_DTYPE)
        init = For(i, const(0), const(mc), "serial",
                   lanes_loop("v", nest.nr, lambda v: Store(psum, zero, (i, v))))
        blk = Var("blk", INDEX_DTYPE)
        body: list[Stmt] = [LetStmt(row0, c * mc),
                            LetStmt(here, const(mc) if static else min_(mc, m - c * mc)),
                            Allocate(psum), Allocate(wbuf), init]
        if whole:
            body.append(For(blk, const(0), const(whole), "serial", _chunk_block(
                nest, p, row0, rtiles, mr, m, blk, nest.block, wbuf, psum)))
        if tail:
            body.append(_chunk_block(nest, p, row0, rtiles, mr, m, const(whole), tail,
                                     wbuf, psum))
        body.append(_chunk_stores(nest, p, row0, here, psum))
        return seq(*body)

    if not isinstance(m, int):  # one parallel nest: a serial twin would double the kernel
        return parallel_tiles((nest.panels, chunks), tile)
    return parallel_when(lambda: parallel_tiles((nest.panels, chunks), tile),
                         m * nest.n * nest.k, isa=nest.isa)


# --------------------------------------------------------------------------- family

def _constant(x: g.Expr) -> bool:
    return isinstance(x, g.Constant)


def int8_a(attrs: Mapping[str, Any], isa: ISA) -> bool:
    """Whether a `matmul_nbits` call with `attrs` takes the int8 GEMV on `isa`: 4-bit
    codes at accuracy level 4 (onnxruntime's CompInt8) where the ISA has an integer dot
    product (elsewhere the bytes would be multiplied one by one: the float path wins)."""
    return (int(attrs.get("accuracy_level", 0)) == A_INT8_LEVEL and int(attrs["bits"]) == 4
            and isa.int8_dot is not None)


@dataclass(frozen=True)
class NbitsGemm(Family):
    """`matmul_nbits(a, b, scales[, zero_points])` with constant weights ->
    `matmul_nbits_packed`, panels of two vectors of float32 lanes."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        a = call.args[0].type
        return (all(_constant(x) for x in call.args[1:]) and isinstance(a, TensorType)
                and a.dtype == "float32" and isinstance(a.shape[-1], int))

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        nr = 2 * tile_lanes(isa)
        consts = [x for x in call.args[1:] if isinstance(x, g.Constant)]
        datas = [np.asarray(c.data) for c in consts]
        words = int8_a(call.attrs, isa)
        packer = pack_nbits_words if words else pack_nbits
        packed = packer(datas[0], datas[1], datas[2] if len(datas) > 2 else None, nr)
        args = (call.args[0], *(g.Constant(p, c.name) for p, c in zip(packed, consts)))
        m = 1
        a = call.args[0].type
        assert isinstance(a, TensorType)
        for d in a.shape[:-1]:
            m *= d if isinstance(d, int) else 64
        mr = choose_tile(m, nr, isa).mr
        extra = {WORDS: True} if words else {}
        return g.Call(self.op, args, g.freeze_attrs({**call.attrs, TILE: (mr, nr), **extra}),
                      call.ret_type)

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        k, n, bits, block, _, _ = nbits_layout(attrs)
        a = args[0]
        rows = tuple(a.shape[:-1])
        store = fused_store(params, anchor, result, (*rows, n))
        if store is None:
            return None
        buf = store.buffers
        nest = NbitsNest(buf[a], buf[args[1]], buf[args[2]],
                         buf[args[3]] if len(args) > 3 else None, store.out, store.epilogue,
                         rows, k, n, bits, block, isa, bool(attrs.get(WORDS)))
        m = dim_product(rows)
        tile = recorded_tile(attrs, 2, self.op)
        mr = tile[0] if tile else choose_tile(m, nest.nr, isa).mr
        if isinstance(m, int):
            body = gemv_nbits(nest) if m == 1 else gemm_nbits(nest, min(mr, m))
        else:
            body = IfThenElse(compare("eq", as_expr(m, INDEX_DTYPE), const(1)),
                              gemv_nbits(nest), gemm_nbits(nest, mr))
        return PrimFunc((*(buf[t] for t in params), store.out), body,
                        {ATTR_GEMM_KERNEL: self.op, ATTR_PARALLEL_DECIDED: True})


NBITS = NbitsGemm("nbits", PACKED_NBITS, (MATMUL_NBITS,), 0)


@dataclass(frozen=True)
class NbitsLowering:
    """The lowering of `matmul_nbits_packed` (kiln.kernels.lowering.Lowering): the
    family's kernel, symbolic M included; None where the fused chain's result is not
    float32."""

    supports_symbolic: bool = True
    fuses_producers: bool = False

    def builds(self, call: g.Call) -> bool:
        return True

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Mapping[str, Any], anchor: te.Tensor | None,
                    result: te.Tensor | None, name: str, isa: ISA) -> PrimFunc | None:
        if args[0].dtype != "float32" or (result is not None and result.dtype != "float32"):
            return None
        return NBITS.build(params, args, attrs, anchor, result, isa)


MATMUL_NBITS_PACKED = NbitsLowering()

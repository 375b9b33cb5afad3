"""The row-tiled family: an ungrouped `conv2d` whose output rows are at least one
vector wide and that is 1x1 with stride 1 (a matrix-product tile: MobileNet's
expansions and projections; from `PARTIAL_ROWS_MIN_CHANNELS` input channels on, only
with rows that fill the vectors) or sums over few inputs (`ci * kh * kw <
ROWS_MAX_TAPS`: a first layer on 3 channels, a 3x3 layer on 32) -> `conv2d_rows`,
the weight packed into `[co_block][ci][kh][kw][rows]`; tile `(rows, tile_w,
lanes)`: `rows` output channels x `tile_w` columns of one output row
(`rows_conv_body`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir import weight_origin as wo
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    IfThenElse,
    LetStmt,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    Var,
    as_expr,
    seq,
)
from kiln.kernels.conv.bands import banded_rows
from kiln.kernels.conv.blocked import choose_tiling
from kiln.kernels.conv.family import build_conv, packed_call, vector_widths
from kiln.kernels.conv.gemm import MIN_LANE_USE
from kiln.kernels.conv.padding import PhaseReader, image_rows, kernel_taps, padded_input
from kiln.kernels.conv.row_tiles import row_tiles, rows_tile_width
from kiln.kernels.registry import Family, fits_registers
from kiln.kernels.tiles import (
    Epilogue,
    lanes_loop,
    madd,
    narrow_rows,
    parallel_tiles,
    tile_lanes,
    tile_registers,
)
from kiln.kernels.tiles import const as _c
from kiln.kernels.tiles import nest as _nest
from kiln.ops import pack_memory
from kiln.ops.conv_geometry import ConvShape, conv_call_shape
from kiln.ops.packed_attrs import recorded_tile
from kiln.target.isa import ISA

# Below this many multiply-adds per output the row-tiled kernel beats the blocked one
# on AVX-512 (its tile's epilogue is cheaper; a 64-channel 3x3 layer's 576 taps are
# the blocked kernel's).
ROWS_MAX_TAPS = 320
# A 1x1 layer of this many input channels or more whose output rows leave vector lanes
# empty (`row_lane_use` below conv_gemm's MIN_LANE_USE: 14 columns in 2 vectors of 8)
# goes to the blocked kernel, which wastes no lanes there (docs/performance.md). Fewer
# channels stay on rows (short sums cost the blocked kernel's channel-strided stores
# more).
PARTIAL_ROWS_MIN_CHANNELS = 64
#: Output channels per tile that tuning tries (kiln.tuning).
TUNED_ROWS = (2, 3, 4, 6, 8, 10, 12)


def row_lane_use(out_w: int, isa: ISA) -> float:
    """The share of the row tiles' vector lanes that hold output columns."""
    lanes = tile_lanes(isa)
    return out_w / (-(-out_w // lanes) * lanes)


#: A stride-1 layer wider than 1x1 on at least `BLOCKED_MIN_CHANNELS` input channels
#: whose sums are short enough for the row tiles (`ROWS_MAX_TAPS`) goes to the blocked
#: kernel where the row tiles leave more lanes empty than the blocked tiles lose: the
#: blocked tile's scalar stores and epilogue cost about as much as this many taps
#: (input channel x kernel position) of its sums, per vector width, so per computed
#: lane it runs at `taps / (taps + overhead)` of the row kernel's speed (fitted to
#: 512-bit and 256-bit code). Other vector widths keep the row tiles.
BLOCKED_TILE_OVERHEAD_TAPS = {256: 12, 512: 36}
BLOCKED_MIN_CHANNELS = 16


def rows_lane_use(shape: ConvShape, isa: ISA) -> float:
    """The share of the row tiles' multiply-adds that compute an output: columns in
    the vectors times output channels in the rule's tiles of rows."""
    rows = RowsConv._rule_for(shape, isa)[0]
    return row_lane_use(shape.out_w, isa) * shape.c_out / (-(-shape.c_out // rows) * rows)


def blocked_lane_use(shape: ConvShape, isa: ISA) -> float:
    """The same share for the blocked kernel's rule tiles (kiln.kernels.conv.direct):
    output channels in blocks of `cb`, positions in tiles of `tile_w`."""
    tiling = choose_tiling(shape, tile_lanes(isa), tile_registers(isa))
    positions = shape.out_h * shape.out_w
    tile_w = min(tiling.tile_w, positions)
    return (shape.co_group / (-(-shape.co_group // tiling.cb) * tiling.cb)
            * positions / (-(-positions // tile_w) * tile_w))


def blocked_computes_less(shape: ConvShape, isa: ISA) -> bool:
    """Whether a few-tap layer goes to the blocked kernel (`BLOCKED_TILE_OVERHEAD_TAPS`)."""
    overhead = BLOCKED_TILE_OVERHEAD_TAPS.get(isa.vector_bits)
    if overhead is None or shape.stride != (1, 1) or shape.ci_group < BLOCKED_MIN_CHANNELS:
        return False
    taps = shape.ci_group * shape.kh * shape.kw
    speed = taps / (taps + overhead)
    return rows_lane_use(shape, isa) < speed * blocked_lane_use(shape, isa)


@dataclass(frozen=True)
class RowsConv(Family):
    """See the module docstring."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        shape = conv_call_shape(call)
        if shape is None or shape.groups != 1 or shape.out_w < tile_lanes(isa):
            return False
        # A strided 1x1 layer (ResNet's projection shortcuts) goes to the blocked kernel,
        # which reads the input in place: the row-tiled one would first copy the whole
        # input split by stride phase, most of it never read.
        pointwise = (shape.kh, shape.kw) == (1, 1)
        strided_pointwise = pointwise and shape.stride != (1, 1) and not any(shape.pads)
        few_taps = shape.ci_group * shape.kh * shape.kw < ROWS_MAX_TAPS
        if (pointwise and shape.ci_group >= PARTIAL_ROWS_MIN_CHANNELS
                and row_lane_use(shape.out_w, isa) < MIN_LANE_USE):
            return False
        if not pointwise and few_taps and blocked_computes_less(shape, isa):
            return False
        return (pointwise or few_taps) and not strided_pointwise

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        return self.pack_tile(call, isa, self._rule(call, isa))

    def candidates(self, call: g.Call, isa: ISA) -> list[tuple[int, ...]]:
        """`rows` channels x `tile_w` columns (whole vectors) whose `rows * tile_w /
        lanes` accumulators fit the registers."""
        shape = conv_call_shape(call)
        assert shape is not None
        lanes = tile_lanes(isa)
        rule = self._rule(call, isa)
        out = [(rows, tw, lanes) for tw in vector_widths(shape.out_w, lanes)
               for rows in TUNED_ROWS if rows <= shape.c_out
               and fits_registers(rows * -(-tw // lanes), -(-tw // lanes), isa)]
        return sorted((t for t in out if t != rule),
                      key=lambda t: (abs(t[0] - rule[0]) + 4 * abs(t[1] - rule[1]) // lanes, t))

    def pack_tile(self, call: g.Call, isa: ISA, tile: tuple[int, ...]) -> g.Call:
        shape = conv_call_shape(call)
        w = call.args[1]
        assert shape is not None and isinstance(w, g.Constant)
        return packed_call(self.op, call, pack_rows_weight(w.data, tile[0]), tuple(tile),
                           shape.c_out, lambda o: pack_rows_origin(o, w.data.shape, tile[0]))

    @staticmethod
    def _rule(call: g.Call, isa: ISA) -> tuple[int, int, int]:
        shape = conv_call_shape(call)
        assert shape is not None
        return RowsConv._rule_for(shape, isa)

    @staticmethod
    def _rule_for(shape: ConvShape, isa: ISA) -> tuple[int, int, int]:
        lanes = tile_lanes(isa)
        width = rows_tile_width(shape.out_w, lanes)
        rows = ROW_TILE_CHANNELS
        rows = narrow_rows(isa, shape.c_out, rows, -(-width // lanes),
                           isa.profile.narrow_conv_rows)
        return (rows, width, lanes)

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        tile = recorded_tile(attrs, 3, self.op)

        def body(shape: ConvShape, x: Buffer, w: Buffer, out: Buffer, t: tuple[int, ...],
                 epilogue: Epilogue, fused: bool, block: int) -> Stmt:
            lanes = t[2] if t else tile_lanes(isa)
            tw = t[1] if t else rows_tile_width(shape.out_w, lanes)
            return rows_conv_body(shape, x, w, out, tw, epilogue, fused, lanes)

        return build_conv(self.op, params, args, attrs, anchor, result, isa, tile or (), body)


#: Output channels per row tile the rule takes (`RowsConv`).
ROW_TILE_CHANNELS = 6


def pack_rows_weight(w: np.ndarray, rows: int = ROW_TILE_CHANNELS) -> np.ndarray:
    """OIHW weight -> `[co_block][ci][kh][kw][rows]`, output channels padded with zeros."""
    co, ci, kh, kw = w.shape
    blocks = -(-co // rows)
    padded = pack_memory.zeros((blocks * rows, ci, kh, kw), w.dtype)
    padded[:co] = w
    return pack_memory.copy_of(
        padded.reshape(blocks, rows, ci, kh, kw).transpose(0, 2, 3, 4, 1))


def pack_rows_origin(source: wo.Origin | None, shape: Sequence[int], rows: int
                     ) -> wo.Origin | None:
    """The replay of `pack_rows_weight` on a weight of `shape`."""
    co, ci, kh, kw = (int(d) for d in shape)
    blocks = -(-co // rows)
    padded = wo.padded(source, shape, 0, blocks * rows)
    return wo.step("transpose", wo.step("reshape", padded, shape=(blocks, rows, ci, kh, kw)),
                   perm=(0, 2, 3, 4, 1))


def rows_conv_body(shape: ConvShape, x: Buffer, wp: Buffer, out: Buffer, tile_w: int,
                   epilogue: Epilogue, fused: bool, lanes: int) -> Stmt:
    """An ungrouped convolution tiled along output rows: a tile is `rows` output
    channels x `tile_w` consecutive columns of one output row, vectors along the
    columns (contiguous in the input, split by stride phase as in the depthwise kernel,
    and in the output); each (ci, kh, kw) step broadcasts `rows` weights (contiguous in
    the `pack_rows_weight` layout) against one input row segment. For a 1x1 stride-1
    convolution this is a matrix-product tile; it suits layers with few input channels
    (the blocked kernel's tile would spend more on its epilogue than on the sums). A
    tile's sums leave out the kernel rows reading the zero border (`image_rows`)."""
    if shape.groups != 1:
        raise IRError(f"row-tiled conv kernel needs an ungrouped convolution: {shape}")
    blocks, ci_n, _, _, rows = (int(d) for d in wp.shape)
    sh, sw = shape.stride
    dh, dw = shape.dilation
    acc_t = x.dtype  # accumulate in the input dtype (float32); the epilogue may cast
    xp, prologue = padded_input(x, shape, phases=sw)

    def tile(n: PrimExpr, ob: PrimExpr, oh: PrimExpr, ow0: PrimExpr, width: int,
             xp: PhaseReader = xp) -> Stmt:
        acc = Buffer("acc", (rows, width), acc_t, "local")
        head: list[Stmt] = [Allocate(acc), lanes_loop("j", width, lambda j: seq(*(
            Store(acc, as_expr(0.0, acc_t), (_c(r), j)) for r in range(rows))))]

        def step(ci: PrimExpr, kh: PrimExpr, kw: PrimExpr) -> Stmt:
            tap = kw * dw
            phase, shift = (tap % sw, tap // sw) if sw > 1 else (_c(0), tap)
            stmts: list[Stmt] = []
            ws = []
            for r in range(rows):
                wv = Var(f"w{r}", acc_t)
                stmts.append(LetStmt(wv, wp[ob, ci, kh, kw, _c(r)]))
                ws.append(wv)

            def lanes(j: PrimExpr) -> Stmt:
                xv = Var("x", acc_t)
                return seq(LetStmt(xv, xp(n, ci, oh * sh + kh * dh, phase, ow0 + j + shift)),
                           *(Store(acc, madd(acc[_c(r), j], xv, ws[r], fused), (_c(r), j))
                             for r in range(rows)))

            return seq(*stmts, lanes_loop("j", width, lanes))

        taps = image_rows(shape, oh, oh)
        sums = _nest(("ci",), (ci_n,), lambda ci: kernel_taps(
            shape, taps, lambda kh, kw: step(ci, kh, kw)))
        body: list[Stmt] = [*head, sums]
        for r in range(rows):
            co = ob * rows + r
            def value(j: PrimExpr, r: int = r) -> PrimExpr:
                return acc[_c(r), j]

            def index(j: PrimExpr, co: PrimExpr = co) -> tuple[PrimExpr, ...]:
                return (n, co, oh, ow0 + j)

            stores = seq(*_store_row(acc_t, width, value, index, out, epilogue))
            if shape.c_out % rows and r >= shape.c_out % rows:
                stores = IfThenElse(co < shape.c_out, stores)
            body.append(stores)
        return seq(*body)

    runs = row_tiles(shape.out_w, tile_w, lanes)
    per_row = sum(count for _, count, _ in runs)

    def run(n: PrimExpr, ob: PrimExpr, oh: PrimExpr, t: PrimExpr,
            read: PhaseReader = xp) -> Stmt:
        # tile t of the row: the full tiles first, then the remainders
        start, count, width = runs[0]
        stmt = tile(n, ob, oh, t * width + start if count > 1 else _c(start), width, read)
        first = count
        for rs, _, rw in runs[1:]:
            stmt = IfThenElse(t < first, stmt, tile(n, ob, oh, _c(rs), rw, read))
            first += 1
        return stmt

    if prologue:
        return banded_rows(shape, x, blocks, per_row, run)
    return parallel_tiles((shape.n, blocks, shape.out_h, per_row), run)


def _store_row(acc_t: str, width: int, value: Callable[[PrimExpr], PrimExpr],
               index: Callable[[PrimExpr], tuple[PrimExpr, ...]], out: Buffer,
               epilogue: Epilogue) -> list[Stmt]:
    """Store `width` accumulators `value(j)` through the epilogue at `index(j)` (consecutive
    in the output). They are copied to a stack row first: the accumulators themselves are
    then only read as whole vectors and stay in registers, whatever the epilogue holds
    (an epilogue the backend cannot vectorize reads the row one element at a time)."""
    row = Buffer("row", (width,), acc_t, "local")
    return [Allocate(row), lanes_loop("j", width, lambda j: Store(row, value(j), (j,))),
            lanes_loop("j", width, lambda j: Store(out, epilogue(row[j], index(j)), index(j)))]


CONV_ROWS = RowsConv("conv_rows", "conv2d_rows", ("conv2d",), 2)

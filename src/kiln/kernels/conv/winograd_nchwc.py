"""The Winograd family on NCHW{b}c activations: a `conv2d_winograd` inside a blocked
region (kiln.transform.nchwc_layout) -> `conv2d_winograd_nchwc` (kiln.ops.winograd),
tile `(m, mr, nr)`: F(m x m, 3 x 3) with the GEMM micro-kernel's `mr x nr` register
tile, here over the products' transposes.

In NCHW (kiln.kernels.conv.winograd) a product is `M[p] = U[p] @ V[p]`, output
channels x tiles, with vectors across a tile row's tiles. In NCHW{b}c a position's `b`
channels are one vector, so every step runs across channels instead. Per image, with
`a = m + 2` and `T` output tiles:

1. the input transform `V^T[p][t][c] = (B^T d B)[p]`, one vector of `b` channels per
   tile and position, read from the (zero-bordered, kiln.kernels.conv.padding.
   padded_blocked_buffer) blocked input, stored contiguous along the channels;
2. `a * a` products `M^T[p] = V^T[p] @ U^T[p]` (`[T x C] @ [C x O]`) on the GEMM
   kernel: a tile's rows are output tiles (a broadcast value each), its lanes output
   channels read from the weight packed in panels (`pack_panels`);
3. the output transform `Y = A^T M A`, a vector of `b` output channels per position,
   stored through the fused epilogue into the NCHW{b}c output (a tile's positions past
   the image's bottom or right edge are not stored).

Nothing is reordered between the region's other convolutions and this one, so
Winograd layers and the blocked kernel's 1x1 layers share a region (ResNet's
bottlenecks).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from kiln.ir import graph as g
from kiln.ir import weight_origin as wo
from kiln.ir.attrs import ATTR_CONV_KERNEL, ATTR_NO_SLP
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    IfThenElse,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    Var,
    as_expr,
    min_,
    seq,
)
from kiln.ir.types import TensorType
from kiln.kernels.conv.family import blocked_bias
from kiln.kernels.conv.padding import padded_blocked_buffer
from kiln.kernels.conv.winograd import (
    band_rows,
    banded,
    skewed_rows,
    takes,
    tiles,
    transform_2d,
)
from kiln.kernels.epilogue import fused_store
from kiln.kernels.gemm.knobs import GemmTiling
from kiln.kernels.gemm.loop_nest import gemm_body
from kiln.kernels.gemm.micro_kernel import GemmShape, choose_gemm_tiling
from kiln.kernels.gemm.schedule import GemmSchedule
from kiln.kernels.registry import Family
from kiln.kernels.tiles import (
    Epilogue,
    const,
    lanes_loop,
    loop,
    parallel_split,
    parallel_tiles,
    parallel_when,
    tile_lanes,
    tile_registers,
    tuned_split,
)
from kiln.ops import layout, pack_memory
from kiln.ops.conv_geometry import ConvShape, conv_shape
from kiln.ops.packed_attrs import TILE, recorded_tile
from kiln.ops.registry import call as make_call
from kiln.ops.winograd import WINOGRAD_NCHWC as OP
from kiln.ops.winograd import matrices, tile_of
from kiln.target.isa import ISA


def pack_panels(u: np.ndarray, nr: int, dtype: str | None = None) -> np.ndarray:
    """`u[a*a][O][C]` -> `[a*a][ceil(O / nr)][C][nr]`: each position's `U^T` (`[C][O]`) as
    the GEMM kernel's B panels (kiln.ops.gemm.pack_b), output channels
    zero-padded (a fresh read-only array, as `pack_b`'s: written in place, one copy), in
    `dtype` (rounded to nearest even as it is written) or `u`'s."""
    a2, o, c = u.shape
    panels, full = -(-o // nr), o // nr
    out = pack_memory.empty((a2, panels, c, nr), dtype or u.dtype)
    out[:, :full] = u[:, :full * nr].reshape(a2, full, nr, c).transpose(0, 1, 3, 2)
    if full < panels:
        out[:, full] = 0
        out[:, full, :, :o - full * nr] = u[:, full * nr:].transpose(0, 2, 1)
    out.flags.writeable = False
    return out


def pack_panels_origin(source: wo.Origin | None, shape: Sequence[int], nr: int
                       ) -> wo.Origin | None:
    """The replay of `pack_panels` on a `u` of `shape` `[a*a][O][C]`."""
    a2, o, c = (int(d) for d in shape)
    panels = -(-o // nr)
    moved = wo.padded(wo.step("transpose", source, perm=(0, 2, 1)), (a2, c, o), 2, panels * nr)
    return wo.step("transpose", wo.step("reshape", moved, shape=(a2, c, panels, nr)),
                   perm=(0, 2, 1, 3))


#: The most output tiles of an image whose layer a `precision=bf16` target packs in
#: float16 (`weight_dtype`).
MAX_F16_TILES = 16


def weight_dtype(shape: ConvShape, m: int, isa: ISA) -> str:
    """The dtype of the packed weight: float16 on a `precision=bf16` target for an image
    of MAX_F16_TILES output tiles or fewer (each weight value used by as few tiles: the
    products are bound by reading the weight, and float16 halves its bytes; each B
    vector widened as it is loaded, as kiln.kernels.gemm.f16's), float32 elsewhere (on
    larger images the widening costs more than the bytes save). float16's error, a
    relative 2^-11 per weight grown by the output transform, stays below the bfloat16
    direct kernel's (which rounds the input too); bfloat16's 2^-8 would grow to several
    times it."""
    th, tw = tiles(shape, m)
    return "float16" if isa.precision == "bf16" and th * tw <= MAX_F16_TILES else "float32"


def gemm_tile(shape: ConvShape, m: int, isa: ISA) -> tuple[int, int]:
    """The GEMM rule's register tile of one position's `T x O` product."""
    th, tw = tiles(shape, m)
    t = choose_gemm_tiling(th * tw, shape.c_out, tile_lanes(isa), tile_registers(isa))
    return (t.mr, t.nr)


def winograd_nchwc_body(shape: ConvShape, x: Buffer, up: Buffer, out: Buffer,
                        tile: tuple[int, int, int], epilogue: Epilogue, fused: bool,
                        block: int, *, isa: ISA) -> Stmt:
    """The loop nest (module docstring): `x` `[N][C/b][H][W][b]`, `up` the weight packed
    `[a*a][O/nr][C][nr]`, `out` `[N][O/b][OH][OW][b]`, `epilogue` over its 5-D index.
    An image whose products are parallel work is split into bands of tile rows
    (kiln.kernels.conv.winograd.band_rows, in register tiles of `mr` tiles), each band
    all three steps on one thread with workspaces of its own; else each step's tiles are
    split over the threads."""
    m = tile[0]
    th, tw = tiles(shape, m)
    rows = None if tuned_split() is not None else band_rows(shape, m, tile[1], isa)
    top, left, bottom, right = shape.pads
    # zero rows and columns past the image's padding up to the last tile's window (the
    # last band's: every band transforms `rows` tile rows)
    covered = th if rows is None else -(-th // rows) * rows
    extra_h = max(0, covered * m + 2 - (shape.h + top + bottom))
    extra_w = max(0, tw * m + 2 - (shape.w + left + right))
    xp, prologue = padded_blocked_buffer(
        x, replace(shape, pads=(top, left, bottom + extra_h, right + extra_w)), block)
    nest = _Nest(shape, xp, up, out, tile, epilogue, fused, block, isa,
                 th if rows is None else rows)
    if rows is None:
        batch = (nest.band(const(0), 0) if isinstance(shape.n, int) and shape.n == 1
                 else loop("n", as_expr(shape.n), lambda n: nest.band(n, 0)))
        return seq(*prologue, *nest.allocations(), batch)

    def image(n: PrimExpr) -> Stmt:
        band = Var("band", INDEX_DTYPE)
        with parallel_split("serial"):  # each band's steps on one thread
            body = nest.band(n, band * rows)
        return banded(nest.workspaces, -(-th // rows), band, body)

    batch = (image(const(0)) if isinstance(shape.n, int) and shape.n == 1
             else loop("n", as_expr(shape.n), image))
    return seq(*prologue, batch)


@dataclass(frozen=True)
class _Nest:
    """The steps of one band of `rows` tile rows (every tile row: the whole image) on the
    zero-bordered blocked input `xp`, and the workspaces they share."""

    shape: ConvShape
    xp: Buffer
    up: Buffer
    out: Buffer
    tile: tuple[int, int, int]
    epilogue: Epilogue
    fused: bool
    block: int
    isa: ISA
    rows: int

    @functools.cached_property
    def workspaces(self) -> tuple[Buffer, Buffer]:
        """The transformed input `V^T` and the products `M^T` of a band (made once: a
        buffer is its identity): positions skewed apart (the transforms touch all a*a
        at once: skewed_rows)."""
        m, _, nr = self.tile
        a, t_band = m + 2, self.rows * tiles(self.shape, m)[1]
        panels = int(self.up.shape[1])
        dt = self.xp.dtype
        return (Buffer("wino_vt", (a * a, skewed_rows(t_band, self.shape.c_in),
                                   self.shape.c_in), dt),
                Buffer("wino_mt", (a * a, skewed_rows(t_band, panels * nr), panels * nr), dt))

    def allocations(self) -> list[Stmt]:
        return [Allocate(b) for b in self.workspaces]

    def band(self, n: PrimExpr, ty0: int | PrimExpr) -> Stmt:
        """The three steps on the band of image `n` from tile row `ty0`."""
        return seq(self.transform_in(n, ty0), self.products(), self.transform_out(n, ty0))

    def _rows(self, extents: tuple[int, ...], body: Callable[[PrimExpr, PrimExpr], Stmt],
              own: int | PrimExpr, work: int) -> Stmt:
        """`body(block, tile row)` over the blocks of `extents[0]` and the band's `own`
        tile rows: split over the threads when whole, serial in a band."""
        if self.rows == tiles(self.shape, self.tile[0])[0]:
            return parallel_when(lambda: parallel_tiles((extents[0], self.rows), body),
                                 work, "element", isa=self.isa)
        return loop("cb", extents[0], lambda cb: loop("ty", own, lambda ty: body(cb, ty)))

    def transform_in(self, n: PrimExpr, ty0: int | PrimExpr) -> Stmt:
        """Step 1 (module docstring), every tile row of the band (below the image: zero)."""
        m, b, dt = self.tile[0], self.block, self.xp.dtype
        bt, _, _ = matrices(m)
        a, tw = m + 2, tiles(self.shape, m)[1]
        vt = self.workspaces[0]

        def transform_in(cb: PrimExpr, ty: PrimExpr) -> Stmt:
            half = Buffer("wino_vh", (a, a, b), dt, "local")
            row = _shifted(ty0, ty) * m

            def at_tile(tx: PrimExpr) -> Stmt:
                return transform_2d(
                    bt, lambda k, j, v: self.xp[n, cb, row + k, tx * m + j, v],
                    lambda i, j, value, v: Store(vt, value, (i * a + j, ty * tw + tx, cb * b + v)),
                    half, lambda body: lanes_loop("v", b, body), "v")

            return seq(Allocate(half), loop("tx", tw, at_tile))

        return self._rows((self.shape.c_in // b,), transform_in, self.rows,
                          self.shape.c_in * self.rows * tw * a * a * 4)

    def products(self) -> Stmt:
        """Step 2: `M^T[p] = V^T[p] @ U^T[p]` on the GEMM kernel."""
        m, mr, nr = self.tile
        a, t_band = m + 2, self.rows * tiles(self.shape, m)[1]
        vt, mt = self.workspaces
        up = self.up

        def b_at(bidx: tuple[PrimExpr, ...], panel: PrimExpr, kk: PrimExpr,
                 lane: PrimExpr) -> PrimExpr:
            value = up[bidx[0], panel, kk, lane]
            return value if up.dtype == vt.dtype else value.astype(vt.dtype)

        product = GemmShape((a * a,), (a * a,), (t_band,), int(up.shape[1]) * nr,
                            self.shape.c_in)
        return gemm_body(product, GemmSchedule(GemmTiling(mr, nr), self.fused), vt, b_at,
                         mt, lambda value, idx: value, isa=self.isa)

    def transform_out(self, n: PrimExpr, ty0: int | PrimExpr) -> Stmt:
        """Step 3: the band's own tile rows (fewer in the last band), through the
        epilogue; a tile's positions past the image's edges not stored."""
        shape, m, b, dt = self.shape, self.tile[0], self.block, self.xp.dtype
        _, _, at = matrices(m)
        a, (th, tw) = m + 2, tiles(shape, m)
        mt = self.workspaces[1]
        out, epilogue = self.out, self.epilogue

        def transform_out(ob: PrimExpr, ty: PrimExpr) -> Stmt:
            ys = Buffer("wino_y", (m, m, b), dt, "local")
            half = Buffer("wino_yh", (m, a, b), dt, "local")

            def at_tile(tx: PrimExpr) -> Stmt:
                transform = transform_2d(
                    at, lambda k, j, v: mt[k * a + j, ty * tw + tx, ob * b + v],
                    lambda i, j, value, v: Store(ys, value, (i, const(j), v)),
                    half, lambda body: lanes_loop("v", b, body), "y")

                def store(i: Var, j: Var) -> Stmt:
                    # one loop over the tile's positions: one copy of the epilogue's code
                    oh, ow = _shifted(ty0, ty) * m + i, tx * m + j
                    st: Stmt = lanes_loop("v", b, lambda v: Store(
                        out, epilogue(ys[i, j, v], (n, ob, oh, ow, v)), (n, ob, oh, ow, v)))
                    edges = [c for c, cut in ((oh < shape.out_h, shape.out_h % m),
                                              (ow < shape.out_w, shape.out_w % m)) if cut]
                    for cond in edges:  # a partial tile at the bottom or right edge
                        st = IfThenElse(cond, st)
                    return st

                stores = [loop("i", m, lambda i: loop("j", m, lambda j: store(i, j)))]
                return seq(transform, *stores)

            return seq(Allocate(ys), Allocate(half), loop("tx", tw, at_tile))

        own = self.rows if th % self.rows == 0 else min_(self.rows, th - ty0)
        return self._rows((shape.c_out // b,), transform_out, own,
                          shape.c_out * self.rows * tw * a * a * 4)


def _shifted(ty0: int | PrimExpr, ty: PrimExpr) -> PrimExpr:
    """The image's tile row of a band's tile row `ty` (the band from `ty0`)."""
    return ty if isinstance(ty0, int) and ty0 == 0 else ty0 + ty


@dataclass(frozen=True)
class WinogradNchwc(Family):
    """See the module docstring. `pack` takes a `conv2d_winograd` call (weight
    `[a*a][O][C]`) whose input the layout pass has blocked; `build` lowers
    `conv2d_winograd_nchwc`."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        x, u = call.args[0].type, call.args[1]
        if call.op != "conv2d_winograd" or not isinstance(u, g.Constant) or \
                not isinstance(x, TensorType) or x.ndim != 5 or x.dtype != "float32":
            return False
        return self._shape(call) is not None

    def _shape(self, call: g.Call) -> ConvShape | None:
        x, u = call.args[0].type, call.args[1]
        assert isinstance(u, g.Constant) and isinstance(x, TensorType)
        b, blocks = x.shape[4], x.shape[1]
        plain = (x.shape[0], int(u.data.shape[2]), x.shape[2], x.shape[3])
        if not all(isinstance(d, int) for d in (b, blocks, *plain[1:])) or \
                cast(int, blocks) * cast(int, b) != plain[1]:
            return None
        b = cast(int, b)
        shape = conv_shape(plain, int(u.data.shape[1]), (3, 3), call.attrs)
        return shape if takes(shape.c_in, shape.c_out, b) else None

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        u = call.args[1]
        assert isinstance(u, g.Constant)
        shape = self._shape(call)
        assert shape is not None
        m = tile_of(u.data.shape)
        mr, nr = gemm_tile(shape, m, isa)
        attrs: dict[str, Any] = {**dict(call.attrs), TILE: (m, mr, nr),
                                 "channels": shape.c_out}

        dtype = weight_dtype(shape, m, isa)
        packed = g.Constant(pack_panels(np.asarray(u.data), nr, dtype), u.name)
        source = wo.origin_of(u.data)
        if dtype != u.data.dtype:
            source = wo.step("astype", source, dtype=dtype)
        wo.record(packed.data, pack_panels_origin(source, u.data.shape, nr))
        return make_call(self.op, call.args[0], packed, *call.args[2:], **attrs)

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:

        x, up = args[0], args[1]
        if not all(isinstance(d, int) for d in (*x.shape[1:], *up.shape)):
            return None  # only the batch may be symbolic
        b = int(x.shape[4])
        m = tile_of((up.shape[0], attrs["channels"], up.shape[2]))
        shape = conv_shape((x.shape[0], int(up.shape[2]), x.shape[2], x.shape[3]),
                           int(attrs["channels"]), (3, 3), attrs)
        tile = recorded_tile(attrs, 3, self.op) or (m, *gemm_tile(shape, m, isa))
        if tile[2] != int(up.shape[3]):
            return None  # a tile whose panels the weight is not packed in
        bias = args[2] if len(args) > 2 else None
        out_shape = layout.block_shape((shape.n, shape.c_out, shape.out_h, shape.out_w), b)
        store = fused_store(params, anchor, result, out_shape, bias=None)
        if store is None:  # an epilogue needing statements (a reduction, a table)
            return None
        epilogue = store.epilogue
        if bias is not None:
            epilogue = blocked_bias(epilogue, store.buffers[bias], b)
        stmt = winograd_nchwc_body(shape, store.buffers[x], store.buffers[up], store.out,
                                   (tile[0], tile[1], tile[2]), epilogue, isa.fma, b, isa=isa)
        return PrimFunc((*(store.buffers[t] for t in params), store.out), stmt,
                        # float16 panels: LLVM's vectorizer widens their loads
                        {ATTR_CONV_KERNEL: self.op, ATTR_NO_SLP: up.dtype == "float32"})


WINOGRAD_NCHWC = WinogradNchwc("winograd_nchwc", OP, ("conv2d_winograd",), 0)

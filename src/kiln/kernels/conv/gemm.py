"""The GEMM convolution family: an ungrouped 1x1 `conv2d` (any stride; `takes`) ->
`conv2d_gemm` (weight OIHW as it is), run on the GEMM micro-kernel
(kiln.kernels.gemm.loop_nest.gemm_body): per image `out[co, p] = W[co, k] @ X[k, p]` with
`k` over `(ci, kh, kw)` and `p` over the flattened output positions `oh * OW + ow`;
tile `(mr, nr)`: `mr` output channels (weights broadcast) x `nr` consecutive
positions (whole vectors, contiguous in the NCHW output).

`X` is the input itself, viewed as `[n][ci][h*w]`, for a 1x1 stride-1 unpadded layer
with at least one panel of positions (a partial last panel computes the last `nr`
positions and stores those the previous panel left: gemm_body's `shifted_tail`, no
copy to pad it); any other layer first copies its columns once per
call into a workspace `[n][ci*kh*kw][panels*nr]` (im2col: padding and the last
panel's surplus positions zero), a copy of `k * p` values against `co * k * p`
multiply-adds. The fused epilogue sees the 4-D output index; its loads of tensors
shaped like the output (a residual) read flat views along the positions, so the
stores and those loads stay vector operations (`FlatEpilogue`).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, cast

from kiln.ir import graph as g
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    DeclBuffer,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    Var,
    as_expr,
    max_,
    min_,
    seq,
)
from kiln.kernels.conv.family import UnpackedConv, build_conv, static_call_shape
from kiln.kernels.conv.run_time_width import RunTimeWidth
from kiln.kernels.flat_epilogue import FlatEpilogue
from kiln.kernels.gemm.families import tile_candidates
from kiln.kernels.gemm.knobs import GemmTiling, k_block_caches, k_unroll
from kiln.kernels.gemm.loop_nest import gemm_body
from kiln.kernels.gemm.micro_kernel import GemmShape, choose_gemm_tiling
from kiln.kernels.gemm.schedule import GemmSchedule
from kiln.kernels.registry import fits_registers
from kiln.kernels.tiles import (
    Epilogue,
    bound,
    loop,
    narrow_rows,
    parallel_over_images,
    parallel_tiles,
    parallel_when,
    tile_lanes,
    tile_registers,
)
from kiln.ops.conv_geometry import ConvShape, conv_call_shape
from kiln.ops.packed_attrs import recorded_tile
from kiln.target.isa import ISA

# The share of a tile's lanes that must hold real output positions: the last panel's
# surplus lanes are multiply-adds thrown away (a 7x7 image fills 49 of 64 lanes at 16
# lanes; the blocked kernel, vectors along output channels, wastes none there).
MIN_LANE_USE = 0.95
# The share where the panels are copied (`copies_panels`, AVX2): a 14x14 image fills 196
# of 208 lanes at 16, and its 1x1 layers run faster on the GEMM kernel with their panels
# copied than on the blocked kernel (docs/performance.md, "AVX2 round four"); read in
# place they do not.
COPIED_LANE_USE = 0.93
# Fewer panels (a tiny image) leave the layer to the blocked kernel as well: its tiles
# waste no lanes there.
MIN_PANELS = 2


#: The output positions per image assumed when choosing the tile of a layer over a
#: symbolic image size (`choose_tile`): a 28x28 output, mid-network in a 224x224 CNN.
TYPICAL_POSITIONS = 28 * 28


def panel_count(shape: ConvShape, nr: int) -> int:
    """How many panels of `nr` output positions cover one image's output (the last one
    partial where `nr` does not divide it); symbolic for a symbolic image size."""
    return (shape.out_h * shape.out_w + nr - 1) // nr


def takes(shape: ConvShape, isa: ISA) -> bool:
    """Whether the registry gives a convolution to the GEMM kernel: an ungrouped 1x1 (any
    stride) with enough output positions to fill its panels (`MIN_LANE_USE`, or
    `COPIED_LANE_USE` for a stride-1 layer whose panels are copied; `MIN_PANELS`).

    Strided KxK layers are left to the blocked kernel, which reads them in place
    (docs/performance.md): the GEMM's `ci*kh*kw`-deep panel is not blocked along `k` and
    streams from L2. `conv2d_gemm` still computes any ungrouped convolution."""
    if shape.groups != 1 or (shape.kh, shape.kw) != (1, 1):
        return False
    positions = shape.out_h * shape.out_w
    tile = choose_tile(shape, isa)
    nr = tile[1]
    panels = panel_count(shape, nr)
    copied = (shape.stride == (1, 1) and not any(shape.pads)
              and copies_panels(shape, tile, isa))
    lane_use = COPIED_LANE_USE if copied else MIN_LANE_USE
    return panels >= MIN_PANELS and positions >= lane_use * panels * nr


# An image's output larger than this many times the L2 gets the wide tile (`WIDE_TILE`):
# its longer runs through memory pay only for an output far past the L2.
WIDE_OUTPUT_L2_MULTIPLE = 2
#: The wide tile: rows x vectors (24 accumulators: a 32-register file's).
WIDE_TILE = (6, 4)


def choose_tile(shape: ConvShape, isa: ISA) -> tuple[int, int]:
    """The GEMM tile of the `co` x `oh * ow` product (kiln.kernels.gemm.micro_kernel): the GEMM
    rule's, or for an output far larger than the L2 (`WIDE_OUTPUT_L2_MULTIPLE`) the
    wider `WIDE_TILE` where it fits the registers and fills its panels (each row of a
    tile then stores, and its residual loads, 4 vectors in a row: fewer, longer runs
    through memory, and fewer operand loads per multiply-add). On 256-bit vectors
    (AVX2) a narrow output takes `narrow_rows`."""
    lanes, positions = tile_lanes(isa), shape.out_h * shape.out_w
    if shape.symbolic_image:
        positions = TYPICAL_POSITIONS
    t = choose_gemm_tiling(shape.c_out, positions, lanes, tile_registers(isa))
    t = GemmTiling(narrow_rows(isa, shape.c_out, t.mr, t.nr // lanes,
                               isa.profile.avx2_conv_rules), t.nr)
    if shape.symbolic_image:
        return (t.mr, t.nr)
    rows, vectors = WIDE_TILE
    nr = vectors * lanes
    panels = panel_count(shape, nr)
    if (shape.c_out * positions * 4 > WIDE_OUTPUT_L2_MULTIPLE * isa.l2_bytes
            and shape.c_out >= rows and fits_registers(rows * vectors, vectors, isa)
            and positions >= MIN_LANE_USE * panels * nr):
        return (rows, nr)
    return (t.mr, t.nr)


def _span(offset: int, stride: int, pad: int, size: int, out: int) -> tuple[int, int]:
    """The outputs `o` (first, last) whose input `o * stride + offset - pad` lies in
    `[0, size)`; last < first when none does. `first` is static; `last` is symbolic
    for a symbolic `size`."""
    first = max(0, -(-(pad - offset) // stride))
    return first, _min(out - 1, (size - 1 + pad - offset) // stride)


def _min(a: int, b: int) -> int:
    # ints fold; a symbolic operand makes a `min` expression
    return min(a, b) if isinstance(a, int) and isinstance(b, int) else cast(int, min_(a, b))


def _max(a: int, b: int) -> int:
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else cast(int, max_(a, b))


def _runs(start: int, stop: int) -> bool:
    """Whether the range `start .. stop` may hold indices (always, when symbolic)."""
    return not (isinstance(start, int) and isinstance(stop, int)) or stop > start


def _plane_copy(col: Buffer, plane: Buffer, n: PrimExpr, ci: PrimExpr, k: PrimExpr,
                offset: int, r0: int, rows: int, w: int) -> Stmt:
    """Output rows `r0 .. r0 + rows` of a stride-1 tap reading whole input rows (row
    `oh + offset`, the same columns) as one run of `col[n][k]`."""
    return loop("p", rows * w, lambda p: Store(col, plane[n, ci, (r0 + offset) * w + p],
                                               (n, k, r0 * w + p)))


def im2col(x: Buffer, shape: ConvShape, width: int, *, isa: ISA) -> tuple[Buffer, list[Stmt]]:
    """The workspace `col[n][(ci, kh, kw)][width]` holding at `oh * OW + ow` the input
    the tap `(kh, kw)` of output `(oh, ow)` reads (zero in the padding and past the
    positions), and the statements filling it (one parallel loop over images and input
    channels; each row a contiguous run of positions). The image size may be symbolic
    (`width` too): the runs' bounds are then clamped expressions."""
    taps = shape.kh * shape.kw
    col = Buffer("col", (shape.n, shape.c_in * taps, width), x.dtype)
    zero = as_expr(0.0, x.dtype)
    (sh, sw), (dh, dw) = shape.stride, shape.dilation
    top, left = shape.pads[0], shape.pads[1]
    # a static stride-1 layer whose output rows are as wide as the input's: a tap that
    # reads whole input rows copies its rows as one run (a 1x1 layer: the channel's
    # plane), not row by row (14-value rows at 14x14: most of each a scalar tail)
    plane = None
    if all(isinstance(d, int) for d in (shape.h, shape.w, shape.out_w)) \
            and (sh, sw) == (1, 1) and shape.out_w == shape.w:
        plane = Buffer(f"{x.name}_planes", (shape.n, shape.c_in, shape.h * shape.w), x.dtype)

    def fill(n: PrimExpr, ci: PrimExpr) -> Stmt:
        parts: list[Stmt] = []  # a symbolic size's bounds computed once (`bound`)
        oh_n, ow_n = bound("out_h", shape.out_h, parts), bound("out_w", shape.out_w, parts)
        h, w = bound("height", shape.h, parts), bound("width", shape.w, parts)
        cols_n = bound("cols", width, parts)

        def zeros(k: PrimExpr, start: int, stop: int) -> None:
            if _runs(start, stop):
                parts.append(loop("j", stop - start, lambda j: Store(col, zero, (n, k, j)),
                                  start=start))

        for kh in range(shape.kh):
            r0, r1 = _span(kh * dh, sh, top, h, oh_n)
            rows = bound(f"rows{kh}", _max(0, r1 - r0 + 1), parts)
            for kw in range(shape.kw):
                c0, c1 = _span(kw * dw, sw, left, w, ow_n)
                cols = bound(f"cols{kh}_{kw}", _max(0, c1 - c0 + 1), parts)
                k = ci * taps + (kh * shape.kw + kw)
                if rows == 0 or cols == 0:  # static: the tap reads padding only
                    zeros(k, 0, cols_n)
                    continue
                # a symbolic image: the first rows and columns read may lie past a tiny one
                head = _min(r0 * ow_n, cols_n) if r0 else 0
                edge = _min(c0, ow_n) if c0 else 0
                zeros(k, 0, head)

                if plane is not None and c0 == 0 and cols == shape.w:
                    parts.append(_plane_copy(col, plane, n, ci, k, kh * dh - top, r0, rows,
                                             shape.w))
                    zeros(k, (r0 + rows) * shape.w, cols_n)
                    continue

                def row(oh: Var, k: PrimExpr = k, kh: int = kh, kw: int = kw,
                        c0: int = c0, cols: int = cols, edge: int = edge) -> Stmt:
                    base = oh * ow_n
                    ih = oh * sh + (kh * dh - top)
                    edges = [loop("j", _max(0, hi - lo), lambda j: Store(
                        col, zero, (n, k, base + j)), start=lo)
                        for lo, hi in ((0, edge), (c0 + cols, ow_n)) if _runs(lo, hi)]
                    copy = loop("ow", cols, lambda ow: Store(
                        col, x[n, ci, ih, ow * sw + (kw * dw - left)], (n, k, base + ow)),
                        start=c0)
                    return seq(*edges, copy)

                parts.append(loop("oh", rows, row, start=r0))
                zeros(k, _min((r0 + rows) * ow_n, cols_n), cols_n)
        return seq(*parts)

    work = shape.n * shape.c_in * taps * width
    fill_loop = parallel_when(lambda: parallel_tiles((shape.n, shape.c_in), fill), work,
                              "element", isa=isa)
    decls = [] if plane is None else [DeclBuffer(plane, x, 0)]
    return col, [Allocate(col), *decls, fill_loop]


# A panel copied to the stack (`copies_panels`) is at most this many bytes: 1024 input
# channels at 16 lanes (twice K-blocked partial sums' bound, gemm_knobs.
# PARTIAL_SUM_BYTES), so that the 768- and 1024-deep layers are copied too.
PANEL_COPY_BYTES = 64 * 1024


def copies_panels(shape: ConvShape, tile: tuple[int, int], isa: ISA) -> bool:
    """Whether a 1x1 layer read in place copies each panel of positions to the stack
    before its row tiles read it (gemm_body's `copy_panels`), where the ISA's profile
    has `panel_copy_readers` (kiln.target.kernel_profile): where at least that many row
    tiles read the panel and the copy fits `PANEL_COPY_BYTES`.

    In place, a panel is `ci` runs of `nr` positions one input plane apart: at 56x56 a
    plane is 12544 bytes (196 cache lines), so the runs fall into 16 of the L1's 64 sets
    and a 256-deep panel (256 lines) cannot stay in L1 between row tiles; at 28x28 each
    run is on another 4 KiB page. Copied, the row tiles read one contiguous block."""
    mr, nr = tile
    readers = isa.profile.panel_copy_readers
    return (readers is not None and -(-shape.c_out // mr) >= readers
            and shape.c_in * nr * 4 <= PANEL_COPY_BYTES)


# A group of panels copied together (`panel_group`) is at most this many bytes: 16 panels
# of 64 input channels, 8 of 128 (groups of 4 are too short to pay).
PANEL_GROUP_BYTES = 64 * 1024


def panel_group(shape: ConvShape, tile: tuple[int, int], flat: FlatEpilogue) -> int:
    """How many consecutive panels a parallel tile of a panel-copying layer
    (`copies_panels`) copies and runs together, each row tile over all of them in turn:
    for a 1x1 layer whose epilogue reads a residual (`FlatEpilogue.reads_output_shaped`),
    as many as
    `PANEL_GROUP_BYTES` holds, else one.

    Panel by panel, a tile of `co` rows stores one `nr`-wide run in each of `co` output
    planes and reads one from each of the residual's: at 56x56 a 256-channel residual is
    256 streams advancing 64 bytes per panel, more than the hardware prefetchers follow,
    so every residual line is a demand miss. Grouped, each row reads and writes
    `group * nr` positions in a row."""
    if (shape.kh, shape.kw) != (1, 1) or not flat.reads_output_shaped():
        return 1
    fitting = PANEL_GROUP_BYTES // (shape.c_in * tile[1] * 4)
    return max(1, min(panel_count(shape, tile[1]), fitting))


def gemm_conv_body(shape: ConvShape, x: Buffer, w: Buffer, out: Buffer,
                   tile: tuple[int, int], epilogue: Epilogue, fused: bool,
                   copy_panels: bool = False, *, isa: ISA) -> Stmt:
    """The loop nest of an ungrouped convolution as one GEMM per image (module
    docstring): `x` NCHW, `w` OIHW, `out` NCHW, `epilogue` over the 4-D output index;
    `copy_panels`: a 1x1 layer read in place copies each panel first (`copies_panels`)."""
    mr, nr = tile
    k = shape.c_in * shape.kh * shape.kw
    positions = shape.out_h * shape.out_w
    panels = panel_count(shape, nr)
    decls: list[Stmt] = []

    def view(buf: Buffer, dims: tuple[Any, ...]) -> Buffer:
        flat = Buffer(f"{buf.name}_flat", dims, buf.dtype)
        decls.append(DeclBuffer(flat, buf, 0))
        return flat

    a = view(w, (shape.c_out, k))
    o = view(out, (shape.n, shape.c_out, positions))
    # a symbolic image is copied: a partial last panel read in place would read past it
    in_place = ((shape.kh, shape.kw) == (1, 1) and shape.stride == (1, 1)
                and not any(shape.pads) and isinstance(positions, int) and positions >= nr)
    # read in place, a partial last panel is the last `nr` positions (gemm_body's
    # `shifted_tail`): no copy of the input to pad it
    shifted = in_place and positions % nr != 0
    prologue: list[Stmt] = []
    if in_place:
        b = view(x, (shape.n, shape.c_in, positions))
    else:
        b, prologue = im2col(x, shape, panels * nr, isa=isa)

    def b_at(bidx: tuple[PrimExpr, ...], panel: PrimExpr, kk: PrimExpr,
             v: PrimExpr) -> PrimExpr:
        start = min_(panel * nr, positions - nr) if shifted else panel * nr
        return b[bidx[0], kk, start + v]

    flat = FlatEpilogue(epilogue, shape.out_h, shape.out_w)
    group = panel_group(shape, tile, flat) if copy_panels and not shape.symbolic_image else 1
    product = GemmShape((shape.n,), (), (shape.c_out,), positions, k)
    schedule = GemmSchedule(GemmTiling(mr, nr), fused, shifted_tail=shifted,
                            copy_panels=copy_panels and (in_place or group > 1),
                            panel_group=group)
    body = gemm_body(product, schedule, a, b_at, o, flat, prologue, isa=isa)
    return seq(*decls, *flat.decls, body)


def gemm_run_time_width(shape: ConvShape, tile: tuple[int, int], isa: ISA) -> bool:
    """Whether the kernel of a layer of `shape` with `tile` takes its input channel count
    at run time (kiln.kernels.conv.run_time_width): a static ungrouped 1x1 layer at
    stride 1, unpadded, read in place (at least one panel of positions) without its
    panels copied (`copies_panels`, sized by the count), built without a tuning knob
    that needs a static depth (`k_unroll`, `k_blocking`). The count is then only the
    depth of the product: the tile, the panels and the stores do not depend on it."""
    if k_unroll() not in (None, 1) or k_block_caches() is not None:
        return False
    return (not shape.symbolic_image and shape.groups == 1 and (shape.kh, shape.kw) == (1, 1)
            and shape.stride == (1, 1) and not any(shape.pads)
            and shape.out_h * shape.out_w >= tile[1] and not copies_panels(shape, tile, isa))


@dataclass(frozen=True)
class GemmConv(UnpackedConv):
    """See the module docstring."""

    symbolic_image: ClassVar[bool] = True

    def width_key(self, call: g.Call, isa: ISA) -> Hashable | None:
        """What a kernel of `call` over a run-time input channel count
        (`gemm_run_time_width`) is built from besides that count: the geometry without
        it and the tile; None: a kernel of its own. Calls with the same key, fused ops
        and other operands share one kernel (kiln.transform.fuse_ops)."""
        static = static_call_shape(self.op, call, 4)
        tile = recorded_tile(call.attrs, 2, self.op)
        if static is None or tile is None or not gemm_run_time_width(
                static[1], (tile[0], tile[1]), isa):
            return None
        return "gemm", replace(static[1], c_in=0), tile

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        tile = recorded_tile(attrs, 2, self.op)

        def body(shape: ConvShape, x: Buffer, w: Buffer, out: Buffer, t: tuple[int, ...],
                 epilogue: Epilogue, fused: bool, block: int) -> Stmt | RunTimeWidth:
            a, b = t or choose_tile(shape, isa)
            if not gemm_run_time_width(shape, (a, b), isa):
                return self.loop_nest(shape, x, w, out, (a, b), epilogue, fused, isa)

            def nest(shape: ConvShape, x: Buffer, w: Buffer) -> Stmt:
                return gemm_conv_body(shape, x, w, out, (a, b), epilogue, fused, isa=isa)

            return RunTimeWidth(shape, nest, w_axis=1)

        return build_conv(self.op, params, args, attrs, anchor, result, isa, tile or (), body,
                          self.symbolic_image)

    def applies(self, call: g.Call, isa: ISA) -> bool:
        shape = conv_call_shape(call, symbolic_image=True)
        if shape is None or not shape.symbolic_image:
            return shape is not None and takes(shape, isa)
        # any ungrouped layer over a symbolic image: the tiled families need static sizes
        return shape.groups == 1

    def choose_tile(self, shape: ConvShape, isa: ISA) -> tuple[int, int]:
        return choose_tile(shape, isa)

    def candidates(self, call: g.Call, isa: ISA) -> list[tuple[int, ...]]:
        """The GEMM family's tiles of the `co` x `oh * ow` product (kiln.tuning; none
        over a symbolic image size, which tuning cannot measure)."""
        shape = conv_call_shape(call, symbolic_image=True)
        assert shape is not None
        if shape.symbolic_image:
            return []
        positions = shape.out_h * shape.out_w
        gemm = choose_gemm_tiling(shape.c_out, positions, tile_lanes(isa),
                                     tile_registers(isa))
        rule = choose_tile(shape, isa)
        # the GEMM rule's tile too where this family's rule is the wide one
        tiles = [(gemm.mr, gemm.nr), *tile_candidates(shape.c_out, positions, isa)]
        return [t for t in tiles if t != rule]

    def loop_nest(self, shape: ConvShape, x: Buffer, w: Buffer, out: Buffer,
                  tile: tuple[int, int], epilogue: Epilogue, fused: bool, isa: ISA) -> Stmt:
        if shape.symbolic_image:
            with parallel_over_images():
                return gemm_conv_body(shape, x, w, out, tile, epilogue, fused, isa=isa)
        return gemm_conv_body(shape, x, w, out, tile, epilogue, fused,
                              copies_panels(shape, tile, isa), isa=isa)


CONV_GEMM = GemmConv("conv_gemm", "conv2d_gemm", ("conv2d",), 1)

"""The grouped GEMM convolution family: a grouped (not depthwise) 1x1 `conv2d` ->
`conv2d_group_gemm` (weight OIHW as it is), one GEMM per image and group on the GEMM
micro-kernel (kiln.kernels.gemm.loop_nest.gemm_body): `out[g][co, p] = W[g][co, k] @ X[g][k, p]`
with `co` over the group's output channels, `k` over its input channels and `p` over
the flattened output positions; tile `(mr, nr)`: `mr` output channels (weights
broadcast) x `nr` consecutive positions (whole vectors, contiguous in the NCHW output).

ShuffleNet's pointwise layers are such convolutions (3 groups of 20-160 channels).
The blocked kernel, vectors along output channels, stores each output one lane at a
time into the NCHW planes; here every store is a vector along an output row.

`X` is the input itself, viewed as `[n][group][ci][h*w]`, for a stride-1 layer
without padding: where the positions fill no whole last panel, that panel is the last
`nr` positions (gemm_body's `shifted_tail`). A strided or padded layer's input is
first copied once per call into a workspace whose rows are padded to whole panels
(kiln.kernels.conv.gemm.im2col). Over a symbolic image size any grouped layer that
is not depthwise, any kernel size, is copied so and run here. (The copy is serial:
a layer that can be read in place is.) On a `precision=bf16` target of 16 lanes a
stride-1 unpadded layer of one image runs the bfloat16 products of
kiln.kernels.conv.grouped_bf16 instead, with the bf16 GEMM's tile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from kiln.ir import graph as g
from kiln.ir.tensor import Buffer, DeclBuffer, PrimExpr, PrimFunc, Stmt, min_, seq
from kiln.kernels.conv.family import UnpackedConv
from kiln.kernels.conv.gemm import TYPICAL_POSITIONS, im2col, panel_count
from kiln.kernels.conv.grouped_bf16 import bf16_tile, group_gemm_bf16_body, takes_bf16
from kiln.kernels.flat_epilogue import FlatEpilogue
from kiln.kernels.gemm.families import tile_candidates
from kiln.kernels.gemm.knobs import GemmTiling
from kiln.kernels.gemm.loop_nest import gemm_body
from kiln.kernels.gemm.micro_kernel import GemmShape, choose_gemm_tiling
from kiln.kernels.gemm.schedule import GemmSchedule
from kiln.kernels.tiles import (
    Epilogue,
    parallel_over_images,
    tile_lanes,
    tile_registers,
)
from kiln.ops import conv_direct as cd
from kiln.ops.conv_geometry import ConvShape, conv_call_shape
from kiln.target.isa import ISA

# The share of a tile's lanes that must hold real output positions (the last panel's
# surplus lanes are thrown away). Lower than the ungrouped GEMM's: the blocked kernel
# left for the others stores a grouped layer's NCHW output one lane at a time.
MIN_GROUP_LANE_USE = 0.9


def takes(shape: ConvShape, isa: ISA) -> bool:
    """Whether the registry gives a convolution to this family: a grouped 1x1 layer (any
    stride) whose groups are not single channels, its positions filling the panels (any
    count of them on the bfloat16 nest: `vdpbf16ps`'s two multiply-adds per lane pay
    for ShuffleNet's 7x7 layers, 49 positions in 64 lanes, which the float32 blocked
    kernel ran slower; docs/performance.md, bf16 round nine)."""
    if shape.groups == 1 or shape.depthwise or (shape.kh, shape.kw) != (1, 1):
        return False
    if takes_bf16(shape, isa):
        return True
    positions = shape.out_h * shape.out_w
    nr = choose_tile(shape, isa)[1]
    panels = panel_count(shape, nr)
    return positions >= MIN_GROUP_LANE_USE * panels * nr


def group_product(shape: ConvShape) -> tuple[int, int]:
    """(M, N) of one group's product: its output channels x the output positions."""
    return shape.c_out // shape.groups, shape.out_h * shape.out_w


#: Where no width divides the positions (the last panel overlaps the one before), the
#: share of computed positions the GEMM rule's width may waste before a narrower one is
#: taken: on AVX2 14x14 layers keep 2 vectors (208 of 196 positions; 6 x 8 leaves 6 of
#: 16 registers busy), on AVX-512 1 (2 would compute 224).
MAX_COPY_WASTE = 0.1


def choose_tile(shape: ConvShape, isa: ISA) -> tuple[int, int]:
    """The GEMM tile of one group's `co` x `oh * ow` product (kiln.kernels.gemm.micro_kernel),
    its width narrowed to whole vectors that divide the positions where some do (no
    overlapping last panel: 28x28, 8 x 16 instead of 8 x 32), else kept where it wastes
    at most `MAX_COPY_WASTE`, else narrowed to the one that wastes the fewest lanes."""
    lanes = tile_lanes(isa)
    rows, positions = group_product(shape)
    if shape.symbolic_image:  # the GEMM rule's tile for a typical image
        t = choose_gemm_tiling(rows, TYPICAL_POSITIONS, lanes, tile_registers(isa))
        return (t.mr, t.nr)
    t = choose_gemm_tiling(rows, positions, lanes, tile_registers(isa))

    def computed(w: int) -> int:
        return -(-positions // w) * w

    widths = range(t.nr, 0, -lanes)
    dividing = [w for w in widths if positions % w == 0]
    if dividing:
        return (t.mr, max(dividing))
    if computed(t.nr) - positions <= MAX_COPY_WASTE * positions:
        return (t.mr, t.nr)
    return (t.mr, min(widths, key=lambda w: (computed(w), -w)))


def group_gemm_body(shape: ConvShape, x: Buffer, w: Buffer, out: Buffer,
                    tile: tuple[int, int], epilogue: Epilogue, fused: bool, *, isa: ISA) -> Stmt:
    """The loop nest of a grouped convolution as one GEMM per image and group (module
    docstring): `x` NCHW, `w` OIHW, `out` NCHW, `epilogue` over the 4-D output index."""
    mr, nr = tile
    groups = shape.groups
    cog, cig = shape.c_out // groups, shape.c_in // groups
    k = cig * shape.kh * shape.kw
    positions = shape.out_h * shape.out_w
    panels = panel_count(shape, nr)
    decls: list[Stmt] = []

    def view(buf: Buffer, dims: tuple[object, ...]) -> Buffer:
        flat = Buffer(f"{buf.name}_grouped", dims, buf.dtype)
        decls.append(DeclBuffer(flat, buf, 0))
        return flat

    a = view(w, (groups, cog, k))
    o = view(out, (shape.n, groups, cog, positions))
    in_place = (shape.stride == (1, 1) and not any(shape.pads) and isinstance(positions, int)
                and positions >= nr)
    # read in place, a partial last panel is the last `nr` positions (gemm_body's
    # `shifted_tail`), as the ungrouped GEMM convolution's: no copy to pad it
    shifted = in_place and positions % nr != 0
    prologue: list[Stmt] = []
    if in_place:
        b = view(x, (shape.n, groups, k, positions))

        def b_at(bidx: tuple[PrimExpr, ...], panel: PrimExpr, kk: PrimExpr,
                 v: PrimExpr) -> PrimExpr:
            start = min_(panel * nr, positions - nr) if shifted else panel * nr
            return b[bidx[0], bidx[1], kk, start + v]
    else:
        col, prologue = im2col(x, shape, panels * nr, isa=isa)

        def b_at(bidx: tuple[PrimExpr, ...], panel: PrimExpr, kk: PrimExpr,
                 v: PrimExpr) -> PrimExpr:
            return col[bidx[0], bidx[1] * k + kk, panel * nr + v]

    flat = FlatEpilogue(epilogue, shape.out_h, shape.out_w)

    def grouped(value: PrimExpr, idx: tuple[PrimExpr, ...]) -> PrimExpr:
        n, grp, co, p = idx
        return flat(value, (n, grp * cog + co, p))

    product = GemmShape((shape.n, groups), (groups,), (cog,), positions, k)
    body = gemm_body(product, GemmSchedule(GemmTiling(mr, nr), fused, shifted_tail=shifted),
                     a, b_at, o, grouped, prologue, isa=isa)
    return seq(*decls, *flat.decls, body)


@dataclass(frozen=True)
class GroupGemmConv(UnpackedConv):
    """See the module docstring. `shuffled`: the family of a call whose output is
    channel-shuffled (kiln.ops.conv_direct.SHUFFLED; the bfloat16 nest only)."""

    symbolic_image: ClassVar[bool] = True
    shuffled: bool = False

    def for_call(self, attrs: Mapping[str, Any]) -> UnpackedConv:
        return replace(self, shuffled=bool(attrs.get(cd.SHUFFLED)))

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        shape = cd.call_conv_shape(self.op, args, attrs)
        if attrs.get(cd.SHUFFLED) and (shape is None or not takes_bf16(shape, isa)):
            return None  # the op's tensor expression (kiln.ops.conv_direct)
        return super().build(params, args, attrs, anchor, result, isa)

    def applies(self, call: g.Call, isa: ISA) -> bool:
        shape = conv_call_shape(call, symbolic_image=True)
        if shape is None or not shape.symbolic_image:
            return shape is not None and takes(shape, isa)
        # any grouped layer over a symbolic image (depthwise ones: their own family)
        return shape.groups > 1 and not shape.depthwise

    def candidates(self, call: g.Call, isa: ISA) -> list[tuple[int, ...]]:
        """The GEMM family's tiles of one group's product (kiln.tuning; none over a
        symbolic image size)."""
        shape = conv_call_shape(call, symbolic_image=True)
        assert shape is not None
        if shape.symbolic_image:
            return []
        return list(tile_candidates(*group_product(shape), isa))

    def choose_tile(self, shape: ConvShape, isa: ISA) -> tuple[int, int]:
        return bf16_tile(shape, isa) if takes_bf16(shape, isa) else choose_tile(shape, isa)

    def loop_nest(self, shape: ConvShape, x: Buffer, w: Buffer, out: Buffer,
                  tile: tuple[int, int], epilogue: Epilogue, fused: bool, isa: ISA) -> Stmt:
        if takes_bf16(shape, isa):
            return group_gemm_bf16_body(shape, x, w, out, tile, epilogue, isa=isa,
                                        shuffled=self.shuffled)
        if shape.symbolic_image:
            with parallel_over_images():
                return group_gemm_body(shape, x, w, out, tile, epilogue, fused, isa=isa)
        return group_gemm_body(shape, x, w, out, tile, epilogue, fused, isa=isa)


CONV_GROUPED = GroupGemmConv("conv_grouped", "conv2d_group_gemm", ("conv2d",), 1)

"""The bfloat16 loop nest of `conv2d_group_gemm` (kiln.kernels.conv.grouped) on
`precision=bf16` targets of 16 float32 lanes: one product per group,
`out[g][co, p] = W[g][co, k] @ X[g][k, p]`, on the bf16 GEMM of two activations
(kiln.kernels.gemm.bf16_tiled): each group's input planes `X[g]` (K x positions) are
converted once per call into bfloat16 word panels (a partial last block of K paired
at half its length, not padded: kiln.kernels.gemm.bf16_tiled.compact_words), the weight
rows into words on the stack per row tile, and `vdpbf16ps` sums in float32 go through
the fused epilogue.

ShuffleNet's pointwise layers (3 groups of 20-160 output channels over 80-320 input
channels) are such products, at the float32 FMA rate on the float32 GEMM: the two
bfloat16 multiply-adds per lane of `vdpbf16ps` pay for the input's conversion there.
Taken only where the float32 kernel reads its input in place (stride 1, no padding,
static sizes) and for one image (the product's batch is the groups).
"""

from __future__ import annotations

from kiln.ir.tensor import Buffer, DeclBuffer, PrimExpr, Stmt, seq
from kiln.kernels.flat_epilogue import FlatEpilogue
from kiln.kernels.gemm.bf16 import Bf16Nest, bf16_body, panel_group
from kiln.kernels.gemm.bf16_tiled import ActivationB, pack_b_bf16_at_run_time
from kiln.kernels.gemm.families import choose_tile
from kiln.kernels.tiles import Epilogue, const, tile_lanes
from kiln.ops.conv_geometry import ConvShape
from kiln.target.isa import ISA


def takes_bf16(shape: ConvShape, isa: ISA) -> bool:
    """Whether a grouped 1x1 layer runs the bfloat16 nest: a `precision=bf16` target
    of 16 lanes, one image of static size, stride 1 and no padding."""
    return (isa.precision == "bf16" and tile_lanes(isa) == 16 and shape.n == 1
            and not shape.symbolic_image and shape.stride == (1, 1) and not any(shape.pads))


def bf16_tile(shape: ConvShape, isa: ISA) -> tuple[int, int]:
    """The bf16 GEMM's tile of one group's `co` x `oh * ow` product, its rows evened
    out over the row tiles it makes (20 channels: 3 tiles of 7 rows, not 8, 8 and 4
    computed as 8)."""
    cog = shape.c_out // shape.groups
    t = choose_tile(cog, shape.out_h * shape.out_w, isa)
    tiles = -(-cog // t.mr)
    return (-(-cog // tiles), t.nr)


def group_gemm_bf16_body(shape: ConvShape, x: Buffer, w: Buffer, out: Buffer,
                         tile: tuple[int, int], epilogue: Epilogue, *, isa: ISA,
                         shuffled: bool = False) -> Stmt:
    """The loop nest (module docstring): `x` NCHW, `w` OIHW, `out` NCHW, `epilogue`
    over the 4-D output index. `shuffled`: group `g`'s row `co` is output channel
    `co * groups + g` (a channel shuffle in the stores: kiln.ops.conv_direct.SHUFFLED),
    still a vector along the positions per row."""
    mr, nr = tile
    groups = shape.groups
    cog, cig = shape.c_out // groups, shape.c_in // groups
    positions = shape.out_h * shape.out_w
    # per-group views: the weight [g][co][k], the input [g][k][p], the output [g][co][p]
    # (shuffled: [co][g][p])
    out_dims = (cog, groups, positions) if shuffled else (groups, cog, positions)
    sources = ((w, (groups, cog, cig)), (x, (groups, cig, positions)), (out, out_dims))
    a, xg, o = (Buffer(f"{buf.name}_grouped", dims, buf.dtype) for buf, dims in sources)
    decls = [DeclBuffer(v, buf, 0) for v, (buf, _) in zip((a, xg, o), sources, strict=True)]
    b = ActivationB(xg, (groups,), cig, positions, False)
    flat = FlatEpilogue(epilogue, shape.out_h, shape.out_w)

    def channel(grp: PrimExpr, co: PrimExpr) -> PrimExpr:
        return co * groups + grp if shuffled else grp * cog + co

    def grouped(value: PrimExpr, idx: tuple[PrimExpr, ...]) -> PrimExpr:
        grp, co, p = idx
        return flat(value, (const(0), channel(grp, co), p))

    def shuffled_at(idx: tuple[PrimExpr, ...]) -> tuple[PrimExpr, ...]:
        grp, co, p = idx
        return (co, grp, p)

    mr = min(mr, cog)
    prologue, words_at, words, panels = pack_b_bf16_at_run_time(b, nr, isa=isa,
                                                                compact_tail=True)
    nest = Bf16Nest(a, words_at, o, grouped, (cog,), cog, positions, cig, mr, nr,
                    panel_group(words, nr, panels, isa), words, panels, isa, (groups,),
                    store_at=shuffled_at if shuffled else None)
    body = bf16_body(nest)  # first: building it declares the epilogue's flat views
    return seq(*decls, *flat.decls, *prologue, body)

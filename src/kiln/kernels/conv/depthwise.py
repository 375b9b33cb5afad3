"""The depthwise family: `conv2d` with one input and one output channel per group ->
`conv2d_depthwise` (weight unchanged), tile `(tile_w, lanes)`: `tile_w` output
columns of as many output rows as the ISA's registers hold accumulators for
(`depthwise_conv_body`, kiln.kernels.conv.window.depthwise_tile_rows); a stride-1 layer
with rows of at most half a vector runs on the flattened plane instead
(kiln.kernels.conv.flat_plane: a 7 x 7 plane is 4 vectors of 16 lanes, not 7). A padded
stride-1 input larger than the ISA's L2 is padded channel by channel on the stack
(`window_body`). Over an image of symbolic height and width, the run-time split
kernel of kiln.kernels.window_symbolic (the tile unused)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.tensor import Buffer, PrimExpr, Stmt, as_expr
from kiln.kernels.conv.family import UnpackedConv, vector_widths
from kiln.kernels.conv.flat_plane import flat_plane_body, flat_plane_vectors
from kiln.kernels.conv.window import (
    compacted_columns,
    depthwise_tile_width,
    whole_vector_rows,
    window_body,
)
from kiln.kernels.registry import fits_registers
from kiln.kernels.tiles import (
    Epilogue,
    madd,
    parallel_over_images,
    tile_lanes,
    tile_registers,
)
from kiln.kernels.tiles import const as _c
from kiln.kernels.window_symbolic import symbolic_window_body
from kiln.ops.conv_geometry import ConvShape, conv_call_shape
from kiln.target.isa import ISA


def choose_tile(shape: ConvShape, isa: ISA) -> tuple[int, int]:
    lanes = tile_lanes(isa)
    if shape.symbolic_image:
        return (lanes, lanes)
    return (depthwise_tile_width(shape, lanes), lanes)


@dataclass(frozen=True)
class DepthwiseConv(UnpackedConv):
    """See the module docstring."""

    symbolic_image: ClassVar[bool] = True

    def applies(self, call: g.Call, isa: ISA) -> bool:
        shape = conv_call_shape(call, symbolic_image=True)
        w = call.args[1] if shape else None
        return shape is not None and shape.depthwise and isinstance(w, g.Constant) \
            and w.data.shape[1] == 1

    def choose_tile(self, shape: ConvShape, isa: ISA) -> tuple[int, int]:
        return choose_tile(shape, isa)

    def candidates(self, call: g.Call, isa: ISA) -> list[tuple[int, ...]]:
        """`tile_w` columns of whole vectors (1 to 4) that fit the registers (none where
        each row is one tile: `compacted_columns`, `whole_vector_rows`)."""
        shape = conv_call_shape(call, symbolic_image=True)
        assert shape is not None
        lanes = tile_lanes(isa)
        if shape.symbolic_image or compacted_columns(shape, lanes) \
                or whole_vector_rows(shape, lanes) is not None \
                or flat_plane_vectors(shape, lanes, tile_registers(isa)):
            return []
        rule = choose_tile(shape, isa)
        return [(tw, lanes) for tw in vector_widths(shape.out_w, lanes)
                if (tw, lanes) != rule and fits_registers(-(-tw // lanes), 2, isa)]

    def loop_nest(self, shape: ConvShape, x: Buffer, w: Buffer, out: Buffer,
                  tile: tuple[int, int], epilogue: Epilogue, fused: bool, isa: ISA) -> Stmt:
        tw, lanes = tile
        if shape.symbolic_image:
            def tap(acc: PrimExpr, v: PrimExpr, c: PrimExpr, kh: int, kw: int) -> PrimExpr:
                return madd(acc, v, w[c, 0, kh, kw], fused)

            zero = as_expr(0.0, x.dtype)
            with parallel_over_images():
                return symbolic_window_body(shape, x, out, lanes, tap, zero, zero, epilogue,
                                            isa=isa)
        return depthwise_conv_body(shape, x, w, out, tw, epilogue, fused, lanes,
                                   tile_registers(isa), isa.l2_bytes)


def depthwise_conv_body(shape: ConvShape, x: Buffer, w: Buffer, out: Buffer, tile_w: int,
                        epilogue: Epilogue, fused: bool, lanes: int, registers: int,
                        l2_bytes: int = 0) -> Stmt:
    """The loop nest of a depthwise convolution (`groups == c_in == c_out`); `w` is the
    OIHW weight (C, 1, kh, kw). See `window_body`."""
    if not shape.depthwise:
        raise IRError(f"depthwise kernel needs groups == channels, got {shape}")

    def tap(acc: PrimExpr, xv: PrimExpr, c: PrimExpr, kh: PrimExpr, kw: PrimExpr) -> PrimExpr:
        return madd(acc, xv, w[c, _c(0), kh, kw], fused)

    vectors = flat_plane_vectors(shape, lanes, registers)
    if vectors:
        return flat_plane_body(shape, x, w, out, vectors, lanes, epilogue, fused)
    return window_body(shape, x, out, tile_w, lanes, registers, tap, as_expr(0.0, x.dtype),
                       epilogue, l2_bytes, channel_blocks=True)


CONV_DEPTHWISE = DepthwiseConv("conv_depthwise", "conv2d_depthwise", ("conv2d",), 0)

"""1x1 convolution kernels that take their input channel count at run time.

A network whose 1x1 layers read many channel counts at one image size (DenseNet-121's
bottlenecks: 58 widths, 64 to 992 channels, into 128 outputs) compiled one kernel per
width, each its own LLVM work, though they differ only in the bound of the loop over
input channels. Where the family's schedule does not depend on that count beyond it
(`RunTimeWidth` is built only for such schedules), the kernel is built over a
dimension variable `WIDTH_NAME` instead: its input `[n][ci][h][w]` and packed weight
`[g][co/cb][ci][1][1][cb]` take `ci` from it, and the sums loop to it. Calls of one
such kernel share it (kiln.transform.fuse_ops keys them by `width_key`, not by the
channel count), and each passes its count as a scalar argument (`ATTR_ARG_DIMS`,
kiln.transform.lower_graph). The sums run in the same order as the static kernel's,
so the outputs are the same bit for bit.

On NCHW{b}c activations (the NCHWc family, kiln.kernels.conv.nchwc) the variable counts
the input's channel blocks instead (`[n][ci/b][h][w][b]`, whole blocks only) and the
weight's `ci` is `b` times it: there any kernel size, stride and padding qualifies (a
padded input's workspace is allocated at the run-time size), so ResNet's 3x3 layers
of one output count and image size share a kernel whatever their input width.

The GEMM family's 1x1 layers read in place (kiln.kernels.conv.gemm, its OIHW weight's
`ci` at axis 1) take the count the same way: it is the depth of their products.

`pointwise_body` at stride 1 over whole tiles of output channels may take its output
channel tiles (`TILES_NAME`, the packed weight's axis 1) and its image's height and
width (`HEIGHT_NAME`, `IMAGE_WIDTH_NAME`, the input's axes 2 and 3) at run time too
(`RunTimeTiles`): its output, the bias and every operand of its fused ops shaped like
the output are then over those counts (its tiles find their positions' rows and
columns from their first one's, kiln.kernels.conv.pointwise).
ResNet-50's 1x1 layers of one epilogue at 56x56, 28x28 and 14x14 (whose positions
leave the same remainder in the last tile) share a kernel whatever their widths. The
blocked kernel (`blocked_conv_body`) does the same for a layer at stride 1 whose output
is as large as its input (kiln.kernels.conv.direct.blocked_run_time_tiles): Inception's
5x5 layers with pads 2 at 28x28, 14x14 and 7x7, of 32 to 128 output channels, share
kernels by the positions of their last tile and their weight prefetch.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from typing import cast

from kiln.ir.analysis.tensor_queries import read_buffers
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.shape_expr import simplify_dim
from kiln.ir.tensor import Buffer, PrimExpr, Stmt, Var
from kiln.ir.visitor import substitute
from kiln.kernels.tiles import Epilogue
from kiln.ops.conv_geometry import ConvShape

#: The dimension scalar a run-time-width kernel takes (its input channel count).
WIDTH_NAME = "kiln_conv_ci"
#: The dimension scalars of a kernel over run-time output channel tiles and image size
#: (`RunTimeTiles`): its packed weight's channel tiles, its input's height and width.
TILES_NAME = "kiln_conv_co_tiles"
HEIGHT_NAME = "kiln_conv_h"
IMAGE_WIDTH_NAME = "kiln_conv_w"
#: The axis of the input (NCHW: its channels, NCHW{b}c: its channel blocks) and of the
#: packed weight that counts the input channels.
X_AXIS = 1
W_AXIS = 2
#: The packed weight's axis of output channel tiles, the input's of height and width.
TILES_AXIS = 1
HEIGHT_AXIS = 2
IMAGE_WIDTH_AXIS = 3


@dataclass(frozen=True)
class Widened:
    """The kernel's buffers over run-time sizes: `buffers` maps each static buffer
    parameter (the output included) to its run-time one; `dims` is `(name, buffer,
    axis)` for each size the kernel takes of its argument `buffer`'s axis
    (kiln.ir.attrs.ATTR_ARG_DIMS)."""

    buffers: dict[Buffer, Buffer]
    dims: tuple[tuple[str, Buffer, int], ...]


@dataclass(frozen=True)
class RunTimeTiles:
    """How `pointwise_body` is built over run-time output channel tiles and image size
    too: `nest(shape, x, w, out, epilogue)` with the output, the epilogue and the
    packed weight's `cb` output channels per tile (the output's channels whole tiles)."""

    cb: int
    out: Buffer
    epilogue: Epilogue
    nest: Callable[[ConvShape, Buffer, Buffer, Buffer, Epilogue], Stmt]


@dataclass(frozen=True)
class RunTimeWidth:
    """A family's loop nest `nest(shape, x, w)` for a layer of the static geometry
    `shape` whose schedule holds for any input channel count (what a body returns to
    kiln.kernels.conv.family.build_conv in place of its statement); with `tiles`, one
    that holds for any output channel tiles and image size as well."""

    shape: ConvShape
    nest: Callable[[ConvShape, Buffer, Buffer], Stmt]
    block: int = 0  # the NCHW{b}c input's block: the variable counts blocks; 0: NCHW
    tiles: RunTimeTiles | None = None
    w_axis: int = W_AXIS  # the weight's input channel axis (an OIHW weight's: 1)

    def build(self, x: Buffer, w: Buffer, others: tuple[Buffer, ...] = (),
              bias: Buffer | None = None) -> tuple[Stmt, Widened | None]:
        """The nest over the run-time sizes and its buffers; the static nest and None
        where the rest of the kernel (a fused op) reads a buffer at its static size.
        `others`: the kernel's other parameters, `bias` the convolution's."""
        var = Var(WIDTH_NAME, INDEX_DTYPE)
        ci = var * self.block if self.block else var
        x2 = Buffer(x.name, (*x.shape[:X_AXIS], var, *x.shape[X_AXIS + 1:]), x.dtype, x.scope)
        axis = self.w_axis
        w2 = Buffer(w.name, (*w.shape[:axis], ci, *w.shape[axis + 1:]), w.dtype, w.scope)
        buffers = {x: x2, w: w2}
        dims: tuple[tuple[str, Buffer, int], ...] = ((WIDTH_NAME, x, X_AXIS),)
        if self.tiles is None:
            # ConvShape types its symbolic sizes as ints (kiln.ops.conv_geometry)
            stmt = self.nest(replace(self.shape, c_in=cast(int, ci)), x2, w2)
        else:
            stmt = self._tiled(ci, x, w, buffers, others, bias)
            dims += ((TILES_NAME, w, TILES_AXIS), (HEIGHT_NAME, x, HEIGHT_AXIS),
                     (IMAGE_WIDTH_NAME, x, IMAGE_WIDTH_AXIS))
        if any(b in buffers for b in read_buffers(stmt)):
            return self.nest(self.shape, x, w), None
        return stmt, Widened(buffers, dims)

    def _tiled(self, ci: PrimExpr, x: Buffer, w: Buffer, buffers: dict[Buffer, Buffer],
               others: tuple[Buffer, ...], bias: Buffer | None) -> Stmt:
        """The nest of `tiles` over run-time output channel tiles and image size, the
        run-time buffers added to `buffers`: the output, the bias and the operands shaped
        like the output (`run_time_operand`)."""
        tiles = self.tiles
        assert tiles is not None and self.block
        ct, h, wd = (Var(name, INDEX_DTYPE) for name in (TILES_NAME, HEIGHT_NAME,
                                                           IMAGE_WIDTH_NAME))
        cout = ct * tiles.cb
        buffers[x] = Buffer(x.name, (x.shape[0], buffers[x].shape[X_AXIS], h, wd, self.block),
                            x.dtype, x.scope)
        w2 = buffers[w]
        buffers[w] = Buffer(w.name, (*w.shape[:TILES_AXIS], ct, *w2.shape[TILES_AXIS + 1:]),
                            w.dtype, w.scope)
        out_shape = (tiles.out.shape[0], simplify_dim(cout // self.block), h, wd, self.block)
        for b in (tiles.out, *others):
            if b not in buffers and run_time_operand(b.shape, tiles.out.shape, None):
                buffers[b] = Buffer(b.name, out_shape, b.dtype, b.scope)
        if bias is not None and run_time_operand(bias.shape, tiles.out.shape, self.shape.c_out):
            buffers[bias] = Buffer(bias.name, (cout,), bias.dtype, bias.scope)
        shape = replace(self.shape, c_in=cast(int, ci), c_out=cast(int, cout), h=cast(int, h),
                        w=cast(int, wd))
        def epilogue(v: PrimExpr, idx: tuple[PrimExpr, ...]) -> PrimExpr:
            return substitute(tiles.epilogue(v, idx), {}, buffers)

        return tiles.nest(shape, buffers[x], buffers[w], buffers[tiles.out], epilogue)


@dataclass(frozen=True)
class TilesKey:
    """The `width_key` of a kernel over run-time output channel tiles and image size
    (`RunTimeTiles`): `key` as a width key, and the static output shape `out` and output
    channels of the call asked (not compared): kiln.transform.fuse_ops keys the
    operands the kernel takes over the run-time sizes (`takes`) by their dtype alone."""

    key: Hashable
    out: tuple[object, ...] = field(compare=False)
    channels: int = field(compare=False)

    def takes(self, shape: tuple[object, ...], bias: bool) -> bool:
        """Whether the kernel takes an operand of `shape` (the convolution's bias:
        `bias`) over the run-time sizes (`run_time_operand`)."""
        return run_time_operand(shape, self.out, self.channels if bias else None)


def run_time_operand(shape: tuple[object, ...], out: tuple[object, ...],
                     channels: int | None) -> bool:
    """Whether a kernel over run-time output channel tiles and image size (`RunTimeTiles`)
    takes an operand of `shape` over those sizes: one shaped like its output `out`, or
    with `channels` (the bias) a vector of the output's channels. kiln.transform.fuse_ops
    keys such operands by their dtype alone."""
    if channels is not None:
        return tuple(shape) == (channels,)
    return tuple(shape) == tuple(out)


__all__ = ["HEIGHT_AXIS", "HEIGHT_NAME", "IMAGE_WIDTH_AXIS", "IMAGE_WIDTH_NAME", "TILES_AXIS",
           "TILES_NAME", "WIDTH_NAME", "W_AXIS", "X_AXIS", "RunTimeTiles", "RunTimeWidth",
           "TilesKey", "Widened", "run_time_operand"]

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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import cast

from kiln.ir.analysis.tensor_queries import read_buffers
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import Buffer, Stmt, Var
from kiln.ops.conv_geometry import ConvShape

#: The dimension scalar a run-time-width kernel takes (its input channel count).
WIDTH_NAME = "kiln_conv_ci"
#: The axis of the input (NCHW: its channels, NCHW{b}c: its channel blocks) and of the
#: packed weight that counts the input channels.
X_AXIS = 1
W_AXIS = 2


@dataclass(frozen=True)
class Widened:
    """The kernel's input and packed weight over the run-time channel count `width`."""

    x: Buffer
    w: Buffer
    width: Var


@dataclass(frozen=True)
class RunTimeWidth:
    """A family's loop nest `nest(shape, x, w)` for a layer of the static geometry
    `shape` whose schedule holds for any input channel count (what a body returns to
    kiln.kernels.conv.family.build_conv in place of its statement)."""

    shape: ConvShape
    nest: Callable[[ConvShape, Buffer, Buffer], Stmt]
    block: int = 0  # the NCHW{b}c input's block: the variable counts blocks; 0: NCHW

    def build(self, x: Buffer, w: Buffer) -> tuple[Stmt, Widened | None]:
        """The nest over the run-time width and its buffers; the static nest and None
        where the rest of the kernel (a fused op) reads `x` or `w` at the static count."""
        var = Var(WIDTH_NAME, INDEX_DTYPE)
        ci = var * self.block if self.block else var
        x2 = Buffer(x.name, (*x.shape[:X_AXIS], var, *x.shape[X_AXIS + 1:]), x.dtype, x.scope)
        w2 = Buffer(w.name, (*w.shape[:W_AXIS], ci, *w.shape[W_AXIS + 1:]), w.dtype, w.scope)
        # ConvShape types its symbolic sizes as ints (kiln.ops.conv_geometry)
        stmt = self.nest(replace(self.shape, c_in=cast(int, ci)), x2, w2)
        if any(b is x or b is w for b in read_buffers(stmt)):
            return self.nest(self.shape, x, w), None
        return stmt, Widened(x2, w2, var)


__all__ = ["WIDTH_NAME", "W_AXIS", "X_AXIS", "RunTimeWidth", "Widened"]

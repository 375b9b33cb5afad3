"""The geometry of a 2-D convolution: `ConvShape` (NCHW input, OIHW weight, ONNX pads)
and the output sizes it implies, of a call's attributes (`conv_shape`) and of a
float32 `conv2d` graph call the hand-built kernels may take (`conv_call_shape`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from kiln.ir import graph as g
from kiln.ir.shape_expr import simplify_dim
from kiln.ir.tensor import PrimExpr
from kiln.ir.types import TensorType
from kiln.ops import spatial
from kiln.ops.spatial import conv_out


@dataclass(frozen=True)
class ConvShape:
    """A 2-D convolution's geometry (NCHW input, OIHW weight, ONNX pads). The batch
    may be symbolic, and for the families that take one (`symbolic_image`) the image
    height and width: int64 expressions over dimension variables (kiln.ops.te.dims),
    typed as ints like those."""

    n: int
    c_in: int
    h: int
    w: int
    c_out: int
    kh: int
    kw: int
    stride: tuple[int, int]
    dilation: tuple[int, int]
    pads: tuple[int, int, int, int]   # top, left, bottom, right
    groups: int = 1

    @property
    def out_h(self) -> int:
        return _out_size(self.h, self.kh, self.stride[0], self.dilation[0], self.pads[0],
                         self.pads[2])

    @property
    def out_w(self) -> int:
        return _out_size(self.w, self.kw, self.stride[1], self.dilation[1], self.pads[1],
                         self.pads[3])

    @property
    def symbolic_image(self) -> bool:
        """Whether the image height or width is symbolic (known at run time)."""
        return not (isinstance(self.h, int) and isinstance(self.w, int))

    @property
    def ci_group(self) -> int:
        return self.c_in // self.groups

    @property
    def co_group(self) -> int:
        return self.c_out // self.groups

    @property
    def depthwise(self) -> bool:
        return self.groups == self.c_in == self.c_out and self.groups > 1


def _out_size(size: int, k: int, stride: int, dilation: int, lo: int, hi: int) -> int:
    """A convolution's output length along one axis: an int, or for a symbolic `size`
    the canonical expression (the one the type rule gives its result's dimension)."""
    out = conv_out(size, k, stride, dilation, lo, hi)
    return out if isinstance(out, int) else cast(int, simplify_dim(out))


def conv_shape(x: Sequence[int | PrimExpr], c_out: int, kernel: Sequence[int],
               attrs: Mapping[str, Any]) -> ConvShape:
    """The `ConvShape` of a 2-D convolution call (NCHW input shape `x`)."""
    strides = spatial.ints(attrs, "strides", 2, 1)
    dilations = spatial.ints(attrs, "dilations", 2, 1)
    begins, ends = spatial.pads(attrs, 2)
    # the batch may be symbolic (an int64 expression): only the kernels' batch loops see
    # it; a symbolic image height or width only the families taking one (ConvShape)
    batch, h, w = (cast(int, d) if isinstance(d, PrimExpr) else int(d)
                   for d in (x[0], x[2], x[3]))
    c = int(cast(int, x[1]))
    return ConvShape(batch, c, h, w, int(c_out),
                     int(kernel[0]), int(kernel[1]), (strides[0], strides[1]),
                     (dilations[0], dilations[1]),
                     (begins[0], begins[1], ends[0], ends[1]), int(attrs.get("group", 1)))


def conv_call_shape(call: g.Call, symbolic_image: bool = False) -> ConvShape | None:
    """The geometry of a float32 `conv2d` with a constant weight (and constant or no
    bias), static channels and image sizes (with `symbolic_image`, image sizes that may
    be symbolic) and non-negative pads; None for any other call (no hand-built kernel
    takes it)."""
    if call.op != "conv2d" or len(call.args) not in (2, 3):
        return None
    x, w = call.args[0], call.args[1]
    bias = call.args[2] if len(call.args) == 3 else None
    if not isinstance(w, g.Constant) or (bias is not None and not isinstance(bias, g.Constant)):
        return None
    xt = x.type
    # the batch may be symbolic; the kernels' tiles need static channels and, but in the
    # families taking a symbolic image, image sizes
    if not (isinstance(xt, TensorType) and xt.dtype == "float32" and w.type.dtype == "float32"
            and xt.ndim == 4 and isinstance(xt.shape[1], int)
            and (symbolic_image or all(isinstance(d, int) for d in xt.shape[2:]))):
        return None
    shape = conv_shape(xt.shape, w.data.shape[0], w.data.shape[2:], call.attrs)
    return None if min(shape.pads) < 0 else shape

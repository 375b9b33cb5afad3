"""Hand-built 2-D max and average pooling (NCHW, static shapes).

`max_pool2d` (float32, int8, uint8) runs the row-by-row max kernel of
kiln.kernels.pool.max_rows: no padded copy of the input. `avg_pool2d` (float32) takes
the depthwise convolution's window kernel (kiln.kernels.conv.window.window_body):
vectors along the output columns, tiles of several output rows that load each input
row segment once, the input copied once into a workspace padded with 0 and split by
column phase for stride 2; each sum is divided by its window's count, a compile-time
table (ONNX's `count_include_pad` and `ceil_mode` make it vary at the borders).
Elementwise ops FuseOps groups after a float32 pool are applied as each output is
stored. A max or average pool over an image of symbolic height and width runs
kiln.kernels.window_symbolic's kernel (`symbolic_image_pool`). Other dtypes,
ranks and symbolic shapes keep the tensor-expression definitions of kiln.ops.pool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.ir.attrs import ATTR_PARALLEL_DECIDED, ATTR_POOL_KERNEL
from kiln.ir.tensor import (
    Allocate,
    AllocConst,
    Buffer,
    Cast,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    as_expr,
    max_,
    min_,
    seq,
)
from kiln.kernels import conv as ck
from kiln.kernels.epilogue import fused_store
from kiln.kernels.pool.max_rows import MAX_ELEMENTS, max_pool_body
from kiln.kernels.tiles import (
    Epilogue,
    loop,
    parallel_over_images,
    tile_lanes,
    tile_registers,
)
from kiln.kernels.window_symbolic import symbolic_window_body
from kiln.ops import nan_order, spatial, te
from kiln.ops.pool import first_tap, max_floor, window_max
from kiln.target.isa import ISA

POOLS = ("max", "avg")


@dataclass(frozen=True)
class PoolGeometry:
    """A 2-D pooling window on an NCHW input (ONNX pads: begins, ends per spatial dim)
    and its output size (after `ceil_mode`)."""

    shape: tuple[int, int, int, int]
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    begins: tuple[int, int]
    ends: tuple[int, int]
    out: tuple[int, int]

    def conv_shape(self) -> ck.ConvShape:
        """The window as a depthwise convolution's geometry: the end pads widened where
        `ceil_mode` adds a last window that runs past them (the kernel reads the border
        value there)."""
        n, c, h, w = self.shape
        ends = tuple(max(self.ends[j], (self.out[j] - 1) * self.strides[j]
                         + (self.kernel[j] - 1) * self.dilations[j] + 1
                         - (h, w)[j] - self.begins[j]) for j in range(2))
        return ck.ConvShape(n, c, h, w, c, self.kernel[0], self.kernel[1], self.strides,
                            self.dilations, (self.begins[0], self.begins[1], ends[0], ends[1]),
                            c)

    def counts(self, include_pad: bool) -> np.ndarray:
        """The number of values each average divides by, `(out_h, out_w)`: the window's
        taps inside the input (or inside the padded input with `include_pad`)."""
        per_dim = []
        for j in range(2):
            size = self.shape[2 + j]
            lo, hi = (-self.begins[j], size + self.ends[j]) if include_pad else (0, size)
            pos = (np.arange(self.out[j])[:, None] * self.strides[j]
                   + np.arange(self.kernel[j])[None, :] * self.dilations[j] - self.begins[j])
            per_dim.append(((pos >= lo) & (pos < hi)).sum(axis=1))
        return np.outer(per_dim[0], per_dim[1]).astype(np.float32)


def pool2d_kernel(kind: str, geometry: PoolGeometry, include_pad: bool,
                  params: Sequence[te.Tensor], x: te.Tensor, anchor: te.Tensor | None,
                  result: te.Tensor | None, name: str, scan: bool = False, *, isa: ISA
                  ) -> PrimFunc | None:
    """The kernel for `isa` of a `kind` ("max" or "avg") pool of the parameter `x` with the fused
    elementwise chain `result` over `anchor` (None: the pool alone), or None when the
    chain cannot be applied as a store. `scan`: a max scanned from each window's first
    element (kiln.kernels.pool.max_rows's `max_pool_body`)."""
    shape = geometry.conv_shape()
    out_shape = (shape.n, shape.c_in, shape.out_h, shape.out_w)
    if kind == "max":
        return _stored_pool(params, x, anchor, result, out_shape, name, lambda xb, out, ep:
                            max_pool_body(shape, xb, out, tile_lanes(isa, x.dtype), ep,
                                          isa.l1d_bytes, scan, isa=isa))
    if x.dtype != "float32":
        return None
    store = fused_store(params, anchor, result, out_shape)
    if store is None:
        return None
    # an average: the window kernel sums in onnxruntime's window order (row-major), which
    # a quantized QLinearAveragePool's rounding needs (docs/performance.md, "Max pooling")
    lanes = tile_lanes(isa)
    tile_w = ck.depthwise_tile_width(shape, lanes)
    counts = Buffer("window_count", (shape.out_h, shape.out_w), "float32")

    def tap(acc: PrimExpr, xv: PrimExpr, c: PrimExpr, kh: PrimExpr, kw: PrimExpr) -> PrimExpr:
        return acc + xv

    def finish(v: PrimExpr, idx: tuple[PrimExpr, ...]) -> PrimExpr:
        return store.epilogue(v / counts[idx[2], idx[3]], idx)

    body = ck.window_body(shape, store.buffers[x], store.out, tile_w, lanes,
                          tile_registers(isa), tap, as_expr(0.0, "float32"), finish)
    return PrimFunc((*(store.buffers[t] for t in params), store.out),
                    seq(AllocConst(counts, geometry.counts(include_pad)), body),
                    {ATTR_POOL_KERNEL: name})


def _stored_pool(params: Sequence[te.Tensor], x: te.Tensor, anchor: te.Tensor | None,
                 result: te.Tensor | None, out_shape: tuple[Any, ...], name: str,
                 body: Callable[[Buffer, Buffer, Epilogue], Stmt]) -> PrimFunc | None:
    """The pool kernel whose loop nest `body(input, output, epilogue)` builds: a float32
    pool stores through the fused chain `result` over `anchor` (None when it cannot be
    applied as a store), an integer one (a max) only its values (fused_store's chains
    are float32)."""
    if x.dtype != "float32":
        if not (result is None or result is anchor):
            return None
        buffers = {t: Buffer(t.name, t.shape, t.dtype) for t in params}
        out = Buffer("out", out_shape, x.dtype)
        return PrimFunc((*buffers.values(), out), body(buffers[x], out, lambda v, idx: v),
                        _max_pool_attrs(name))
    store = fused_store(params, anchor, result, out_shape)
    if store is None:
        return None
    return PrimFunc((*(store.buffers[t] for t in params), store.out),
                    body(store.buffers[x], store.out, store.epilogue), _max_pool_attrs(name))


def _max_pool_attrs(name: str) -> dict[str, Any]:
    """The attributes of a kernel that chose its parallel loop itself (a max pool by the
    work threshold, kiln.kernels.pool.max_rows; a pool over a symbolic image size always
    parallel), which `parallelize` keeps."""
    return {ATTR_POOL_KERNEL: name, ATTR_PARALLEL_DECIDED: True}


MAX_DTYPES = ("float32", "int8", "uint8")


def static_4d(t: Any, dtypes: Sequence[str]) -> bool:
    """Whether `t` (a type or te tensor) is an NCHW tensor of static shape of one of
    `dtypes`."""
    shape = tuple(getattr(t, "shape", ()))
    return (getattr(t, "dtype", None) in dtypes and len(shape) == 4
            and all(isinstance(d, int) for d in shape))


def static_image_4d(t: Any, dtypes: Sequence[str]) -> bool:
    """Whether `t` (a type or te tensor) is an NCHW tensor of one of `dtypes` whose
    channels and image size are static (the batch may be symbolic: the window kernel's
    outer loop runs over it at run time, the rows inside planned as for a pinned one)."""
    shape = tuple(getattr(t, "shape", ()))
    return (getattr(t, "dtype", None) in dtypes and len(shape) == 4
            and all(isinstance(d, int) for d in shape[1:]))


def symbolic_image_pool(kind: str, t: Any, attrs: Any) -> ck.ConvShape | None:
    """The window of a `kind` ("max" or "avg") pool over `t` (a type or te tensor: NCHW,
    static channels, symbolic height or width; a max of one of `MAX_DTYPES`, an average
    of float32 without dilation) as a convolution's geometry, when
    kiln.kernels.window_symbolic's kernel takes it (no `ceil_mode`); None otherwise."""
    shape = tuple(getattr(t, "shape", ()))
    dtypes = MAX_DTYPES if kind == "max" else ("float32",)
    if (getattr(t, "dtype", None) not in dtypes or len(shape) != 4
            or not isinstance(shape[1], int) or all(isinstance(d, int) for d in shape[2:])
            or attrs.get("ceil_mode", False) or "kernel_shape" not in attrs):
        return None
    kernel = spatial.ints(attrs, "kernel_shape", 2, 1)
    strides = spatial.ints(attrs, "strides", 2, 1)
    dilations = spatial.ints(attrs, "dilations", 2, 1)
    if kind != "max" and tuple(dilations) != (1, 1):
        return None
    begins, ends = spatial.pads(attrs, 2)
    return ck.ConvShape(shape[0], shape[1], shape[2], shape[3], shape[1], kernel[0],
                        kernel[1], (strides[0], strides[1]), (dilations[0], dilations[1]),
                        (begins[0], begins[1], ends[0], ends[1]), shape[1])


def _leading_nan(shape: ck.ConvShape, x: Buffer, epilogue: Epilogue) -> Epilogue:
    """`epilogue` of a max whose window's first element inside the input, when NaN, is
    the result (a scan from it, kiln.kernels.pool.max_rows's `max_pool_body`)."""
    (sh, sw), (dh, dw) = shape.stride, shape.dilation

    def apply(v: PrimExpr, idx: tuple[PrimExpr, ...]) -> PrimExpr:
        first = x[idx[0], idx[1], first_tap(idx[2], sh, shape.pads[0], dh),
                  first_tap(idx[3], sw, shape.pads[1], dw)]
        return epilogue(nan_order.with_leading_nan(first, v), idx)
    return apply


def _inside(o: PrimExpr, stride: int, pad: int, k: int, size: int) -> PrimExpr:
    """How many of the `k` taps of output `o`'s window (no dilation) lie inside `size`."""
    start = o * stride - pad
    return min_(start + k, size) - max_(start, 0)


def symbolic_pool_kernel(kind: str, shape: ck.ConvShape, include_pad: bool,
                         params: Sequence[te.Tensor], x: te.Tensor, anchor: te.Tensor | None,
                         result: te.Tensor | None, name: str, scan: bool = False, *, isa: ISA
                         ) -> PrimFunc | None:
    """The `kind` pool of `shape` (`symbolic_image_pool`) over the parameter `x` with the
    fused elementwise chain `result` over `anchor` (float32 only; None when it cannot be
    applied as a store): kiln.kernels.window_symbolic's kernel. An average sums its
    window in row-major order (onnxruntime's) and divides by its count: the window's
    taps inside the image (its padded size with `include_pad`), a run-time table of
    each column's and an expression of each row's. `scan`: a max scanned from each
    window's first element (kiln.kernels.pool.max_rows's `max_pool_body`)."""
    out_shape = (shape.n, shape.c_in, shape.out_h, shape.out_w)
    lanes = tile_lanes(isa, x.dtype)

    def body(xb: Buffer, out: Buffer, epilogue: Epilogue) -> Stmt:
        with parallel_over_images():
            if kind == "max":
                floor = te.lowest_value(x.dtype) if scan else max_floor(x.dtype)
                # the kernel nests its taps in one expression, which reads `acc` once
                # here: the tap's NaN made the floor, then the IR's max
                return symbolic_window_body(shape, xb, out, lanes, lambda acc, v, c, kh, kw:
                                            max_(acc, window_max(floor, v)), floor, floor,
                                            _leading_nan(shape, xb, epilogue) if scan
                                            else epilogue, MAX_ELEMENTS, isa=isa)
            zero = as_expr(0.0, "float32")
            if include_pad:
                count: Any = as_expr(float(shape.kh * shape.kw), "float32")
                return symbolic_window_body(
                    shape, xb, out, lanes, lambda acc, v, c, kh, kw: acc + v, zero, zero,
                    lambda v, idx: epilogue(v / count, idx), isa=isa)
            # per column, the taps inside the image: filled once per call
            columns = Buffer("column_taps", (shape.out_w,), "float32")
            fill = loop("ow", shape.out_w, lambda ow: Store(columns, Cast(
                "float32", _inside(ow, shape.stride[1], shape.pads[1], shape.kw, shape.w)),
                (ow,)))

            def finish(v: PrimExpr, idx: tuple[PrimExpr, ...]) -> PrimExpr:
                rows = Cast("float32", _inside(idx[2], shape.stride[0], shape.pads[0],
                                               shape.kh, shape.h))
                return epilogue(v / (rows * columns[idx[3]]), idx)

            return seq(Allocate(columns), fill, symbolic_window_body(
                shape, xb, out, lanes, lambda acc, v, c, kh, kw: acc + v, zero, zero,
                finish, isa=isa))

    return _stored_pool(params, x, anchor, result, out_shape, name, body)

"""The lowerings of the 2-D pools: `max_pool2d` and `avg_pool2d` on NCHW
(kiln.kernels.pool.window) and `pool2d_nchwc` on NCHW{b}c (kiln.kernels.pool.nchwc).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from kiln.ir import graph as g
from kiln.ir.attrs import ATTR_ARG_DIMS, ATTR_PARALLEL_DECIDED, ATTR_POOL_KERNEL
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.shape_expr import is_static
from kiln.ir.tensor import Buffer, PrimFunc, Var
from kiln.ir.types import TensorType
from kiln.kernels.conv.bf16_words import words_output
from kiln.kernels.pool import window as pk
from kiln.kernels.pool.nchwc import pool_nchwc_body
from kiln.ops import layout, te
from kiln.ops.conv_bf16 import WORDS_INPUT
from kiln.ops.pool import Window, scans_from_first
from kiln.ops.pool_nchwc import POOL_NCHWC as POOL2D_NCHWC_OP
from kiln.ops.pool_nchwc import input_shape, merged_shape, split_attrs
from kiln.target.isa import ISA

Attrs = Mapping[str, Any]


def window_geometry(shape: Sequence[Any], attrs: Attrs) -> pk.PoolGeometry:
    """The checked window of a 2-D pool (its attributes `attrs`) on an NCHW input of
    `shape` (static but for, perhaps, the batch)."""
    win = Window(shape, attrs)
    pair = tuple[int, int]
    n = shape[0] if not isinstance(shape[0], int) else int(shape[0])
    return pk.PoolGeometry(
        cast(tuple[int, int, int, int], (n, *(int(d) for d in shape[1:]))),
        cast(pair, win.kernel), cast(pair, win.strides),
        cast(pair, win.dilations), cast(pair, win.begins), cast(pair, win.ends),
        cast(pair, tuple(int(d) for d in win.out)))


@dataclass(frozen=True)
class WindowPoolLowering:
    """`max_pool2d` / `avg_pool2d` (`kind` "max" or "avg"): NCHW inputs of static shape
    (float32; a max also int8 and uint8; the batch may be symbolic), or of a symbolic
    image size, take the hand-built window kernel (kiln.kernels.pool.window); the
    tensor-expression definition stays the fallback."""

    kind: str

    fuses_producers = False
    supports_symbolic = True  # a pool over a symbolic image size

    def dtypes(self) -> tuple[str, ...]:
        """The input dtypes the hand-built kernel takes (a max also int8 and uint8)."""
        return pk.MAX_DTYPES if self.kind == "max" else ("float32",)

    def builds(self, call: g.Call) -> bool:
        return bool(call.args) and (
            pk.static_image_4d(call.args[0].type, self.dtypes())
            or pk.symbolic_image_pool(self.kind, call.args[0].type, call.attrs) is not None)

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                    anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        x = args[0]
        if x not in params or (result is not None and result.dtype != x.dtype):
            return None
        if not pk.static_image_4d(x, self.dtypes()):
            shape = pk.symbolic_image_pool(self.kind, x, attrs)
            return None if shape is None else pk.symbolic_pool_kernel(
                self.kind, shape, bool(attrs.get("count_include_pad", False)), params, x,
                anchor, result, name, self.kind == "max" and scans_from_first(attrs, x.dtype),
                isa=isa)
        return pk.pool2d_kernel(self.kind, window_geometry(x.shape, attrs),
                                bool(attrs.get("count_include_pad", False)),
                                params, x, anchor, result, name,
                                self.kind == "max" and scans_from_first(attrs, x.dtype), isa=isa)


#: The dimension scalars of a `pool2d_nchwc` kernel over run-time sizes (`run_time_pool`):
#: its input's channel blocks, height and width (axes 1, 2 and 3).
BLOCKS_NAME, HEIGHT_NAME, WIDTH_NAME = "kiln_pool_blocks", "kiln_pool_h", "kiln_pool_w"


def run_time_pool(x: TensorType | te.Tensor, attrs: Attrs) -> bool:
    """Whether the `pool2d_nchwc` kernel of a float32 input `x` (NCHW{b}c, static but
    for the batch) with `attrs` takes its input's channel blocks, height and width at
    run time: a max pool at stride 1 whose output is as large as its input (a 3x3
    window with pads 1: Inception's pools beside its branches, at 28x28, 14x14 and 7x7
    over 256 to 832 channels), not scanning from the first tap, its image at least a
    window. The window, pads and dilations stay in the kernel's key (the call's
    attributes), so the taps and the max are the static kernel's."""
    if attrs.get(WORDS_INPUT) or len(x.shape) != 5 or x.dtype != "float32" \
            or not is_static(tuple(x.shape[1:])):
        return False
    pool, rest = split_attrs(attrs)
    if pool != "max_pool2d" or scans_from_first(rest, x.dtype):
        return False
    win = Window(merged_shape(tuple(x.shape)), rest)
    h, w = cast(int, x.shape[2]), cast(int, x.shape[3])  # static (above)
    return (tuple(win.strides) == (1, 1) and tuple(win.out) == (h, w)
            and h >= win.kernel[0] and w >= win.kernel[1])


@dataclass(frozen=True)
class PoolNchwcLowering:
    """`pool2d_nchwc`: float32 inputs of static shape (the batch may be symbolic) take
    the vector kernel of kiln.kernels.pool.nchwc; where `run_time_pool` holds, over
    run-time channel blocks and image size (one kernel for the calls of every size,
    `width_key`)."""

    fuses_producers = False
    supports_symbolic = True  # a symbolic batch: the kernel's outer loop
    #: kiln.transform.fuse_ops: the kernel's run-time sizes are those of its one operand
    width_operands = 1

    def width_key(self, call: g.Call, isa: ISA) -> Hashable | None:
        """What a kernel of `call` over run-time sizes (`run_time_pool`) is built from
        besides them (kiln.transform.fuse_ops keys the call's input by it): the input's
        block (the window is in the call's attributes); None: a kernel of its own."""
        x = call.args[0].type if call.args else None
        if call.op != POOL2D_NCHWC_OP or not isinstance(x, TensorType) \
                or not run_time_pool(x, call.attrs):
            return None
        return "pool blocks", x.shape[4]

    def builds(self, call: g.Call) -> bool:
        x = call.args[0].type if call.args else None
        if isinstance(x, TensorType) and call.attrs.get(WORDS_INPUT):
            return x.ndim == 4 and x.dtype == "int32" and is_static(tuple(x.shape[1:]))
        return (isinstance(x, TensorType) and x.ndim == 5 and x.dtype == "float32"
                and is_static(tuple(x.shape[1:])))

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                    anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        """The vector kernel (see `kiln.kernels.lowering.Lowering.lower_fused`)."""
        x = args[0]
        # float32 blocks, or (`words_input`) the words of pairs of them
        dtype = "int32" if attrs.get(WORDS_INPUT) else "float32"
        if x not in params or x.dtype != dtype or len(x.shape) != (
                4 if attrs.get(WORDS_INPUT) else 5) or not is_static(tuple(x.shape[1:])):
            return None
        pool, rest = split_attrs(attrs)
        shape = input_shape(x, attrs)
        geometry = window_geometry(merged_shape(shape), rest)
        block = int(shape[4])
        pooled = layout.block_shape((*geometry.shape[:2], *geometry.out), block)
        # Stores the readers' words where they round it (kiln.transform.bf16_words).
        output = words_output(params, anchor, result, pooled)
        if output is None or output.store.out.dtype != "float32":
            return None
        store, out, source = output.store, output.out, output.source
        maximum = pool == "max_pool2d"
        attrs_out: dict[str, Any] = {ATTR_POOL_KERNEL: name, ATTR_PARALLEL_DECIDED: True}
        xb, buffers = store.buffers[x], [store.buffers[t] for t in params]
        # a pool alone (kiln.transform.fuse_ops keys no other group by `width_key`)
        alone = len(params) == 1 and result in (None, anchor) and source is None
        if alone and run_time_pool(x, attrs):
            blocks, h, w = (Var(v, INDEX_DTYPE) for v in (BLOCKS_NAME, HEIGHT_NAME, WIDTH_NAME))
            xb = Buffer(xb.name, (xb.shape[0], blocks, h, w, block), xb.dtype, xb.scope)
            out = Buffer(out.name, (out.shape[0], blocks, h, w, block), out.dtype, out.scope)
            buffers = [xb]
            attrs_out[ATTR_ARG_DIMS] = ((BLOCKS_NAME, 0, 1), (HEIGHT_NAME, 0, 2),
                                        (WIDTH_NAME, 0, 3))
        body = pool_nchwc_body("max" if maximum else "avg", geometry,
                               bool(rest.get("count_include_pad", False)), xb,
                               out, store.epilogue,
                               maximum and scans_from_first(rest, x.dtype), isa=isa,
                               words=None if source is None else (source.pads, source.flat))
        return PrimFunc((*buffers, out), body, attrs_out)


MAX_POOL2D = WindowPoolLowering("max")
AVG_POOL2D = WindowPoolLowering("avg")
POOL2D_NCHWC = PoolNchwcLowering()

"""The kernels of `qlinear_add` and `qlinear_concat` (kiln.ops.quant_elementwise).

`qlinear_add` of two operands of the output's static shape (a residual add) runs on a
hand-built kernel: the tensors read as flat arrays, in tiles of `ADD_TILE_VECTORS`
float32 vectors (whole vectors whatever the rows' width, which the tensor-expression
nest vectorizes only in vectors that divide a row: 8 lanes for 56 or 14 columns), the
tiles split over threads, the last partial tile a shorter vector loop. The formula and
its roundings are the tensor-expression definition's, so the outputs are identical; its
saturation clamps before it rounds, by the magic number (`saturate_magic`: the same
values, fewer instructions).

`qlinear_concat` of static shapes copies or requantizes each input's contiguous runs of
the output in vector tiles (`concat_body`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.ir.attrs import ATTR_QLINEAR_ADD, ATTR_QLINEAR_CONCAT
from kiln.ir.graph import Call
from kiln.ir.tensor import (
    Buffer,
    Cast,
    DeclBuffer,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    as_expr,
    compare,
    reinterpret,
    select,
    seq,
)
from kiln.ir.types import TensorType
from kiln.kernels.int8.per_sample import PerSample
from kiln.kernels.parallel_work import worth_parallel
from kiln.kernels.tiles import const, lanes_loop, loop, tile_lanes
from kiln.ops import te
from kiln.ops.quant import MAGIC_BITS, ROUNDING_MAGIC, qrange
from kiln.ops.quant_elementwise import (
    CONCAT,
    add_value,
    concat_params,
    copies_input,
    requantize_element,
    swaps_operands,
    uint8_shift,
)
from kiln.ops.registry import get_op
from kiln.target.isa import ISA

Attrs = Mapping[str, Any]

def saturate_magic(v: PrimExpr, dtype: str, shift: int = 0) -> PrimExpr:
    """The saturation of kiln.ops.quant_elementwise (`saturate(round_half_even(v) -
    shift)` in `dtype`) as the flat kernels compute it: `v` clamped to the type's
    range first (a select on one ordered compare per bound: a `vmaxps` / `vminps`, or for
    a bound of 0 a compare and a mask; a NaN fails the lower compare and takes the lower
    bound), then rounded half to even and converted by adding ROUNDING_MAGIC and reading
    the sum's bits (|v| <= 255 after the clamp: the sum's ulp is 1). Clamping before
    rounding gives the same values, the bounds being integers. It replaces a rounding, a
    NaN-passing max (a compare and a mask), a NaN clear (a compare and a mask) and a
    conversion per vector with an add and an integer subtract."""
    lo, hi = qrange(dtype)
    lo_, hi_ = (as_expr(float(b + shift), "float32") for b in (lo, hi))
    v = select(compare("gt", v, lo_), v, lo_)
    v = select(compare("gt", v, hi_), hi_, v)
    bits = reinterpret(v + as_expr(ROUNDING_MAGIC, "float32"), "int32")
    return Cast(dtype, bits - as_expr(MAGIC_BITS + shift, "int32"))


#: float32 vectors of one tile of the flat `qlinear_add` kernel (four: the loads, the
#: widening and the two FMAs of one vector overlap those of the next).
ADD_TILE_VECTORS = 4


def flat_add_body(buffers: Sequence[Buffer], out: Buffer, lanes: int, shift: int = 0, *,
                  isa: ISA) -> Stmt:
    """The flat kernel of the module docstring: `buffers` are qlinear_add's operands, `a`
    and `b` of `out`'s shape; `lanes` the float32 lanes of a vector; `shift` that of
    `as_uint8`."""
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = buffers
    size = out.numel()
    views = [Buffer(t.name + "_flat", (size,), t.dtype) for t in (a, b, out)]
    fa, fb, fout = views
    value = add_value(swaps_operands(a.shape, b.shape), shift)
    params = [t[()] for t in (a_scale, a_zp, b_scale, b_zp, y_scale, y_zp)]
    width = ADD_TILE_VECTORS * lanes

    def run(start: PrimExpr, extent: int) -> Stmt:
        return lanes_loop("v", extent, lambda v: Store(fout, saturate_magic(
            value(fa[start + v], fb[start + v], params), y_zp.dtype, shift), (start + v,)))

    tiles, rest = divmod(size, width)
    kind = "parallel" if tiles > 1 and worth_parallel(size, "element", isa=isa) else "serial"
    body = [loop("t", tiles, lambda t: run(t * width, width), kind)] if tiles else []
    if rest:
        body.append(run(const(tiles * width), rest))
    return seq(*(DeclBuffer(view, t, 0) for view, t in zip(views, (a, b, out))), *body)


def flat_operands(types: Sequence[Any]) -> bool:
    """Whether qlinear_add of operands of these types (or te tensors) takes the flat
    kernel: `a` and `b` both of the output's static shape."""
    a, b = types[0], types[3]
    return tuple(a.shape) == tuple(b.shape) and all(isinstance(d, int) for d in a.shape)


def concat_body(inputs: Sequence[Buffer], out: Buffer, attrs: Attrs, lanes: int, *,
                isa: ISA) -> Stmt:
    """qlinear_concat's hand-built kernel: per input, the tiles of each of its contiguous
    runs of the output (the axis and all after it) copied or requantized (the te
    definition selects among every input for each element); `lanes` the float32 lanes
    of a vector."""
    scales, zps, y_scale, y_zp, dtype = concat_params(len(inputs), attrs)
    axis = int(attrs.get("axis", 0)) % out.ndim
    outer = int(np.prod(out.shape[:axis], dtype=np.int64))
    row = int(np.prod(out.shape[axis:], dtype=np.int64))
    fout = Buffer(out.name + "_flat", (outer, row), out.dtype)
    width = ADD_TILE_VECTORS * lanes
    body: list[Stmt] = [DeclBuffer(fout, out, 0)]
    offset = 0
    for x, s, z in zip(inputs, scales, zps):
        run_len = x.numel() // max(outer, 1)
        fx = Buffer(x.name + "_flat", (outer, run_len), x.dtype)
        copies = copies_input(x, s, z, y_scale, y_zp, dtype)

        def tile(o: PrimExpr, start: PrimExpr, extent: int, fx: Buffer = fx, at: int = offset,
                 copies: bool = copies, s: float = s, z: int = z) -> Stmt:
            def store(v: PrimExpr) -> Stmt:
                value: PrimExpr = fx[o, start + v]
                if not copies:
                    value = requantize_element(value, s, z, y_scale, y_zp, dtype)
                return Store(fout, value, (o, start + v + at))
            return lanes_loop("v", extent, store)

        tiles, rest = divmod(run_len, width)
        kind = "parallel" if outer * tiles > 1 and worth_parallel(x.numel(), "element", isa=isa) \
            else "serial"

        def per_row(o: PrimExpr, tiles: int = tiles, rest: int = rest, tile: Any = tile,
                    kind: str = kind) -> Stmt:
            parts = [loop("t", tiles, lambda t: tile(o, t * width, width), kind)] \
                if tiles else []
            if rest:
                parts.append(tile(o, const(tiles * width), rest))
            return seq(*parts)

        body += [DeclBuffer(fx, x, 0), loop("o", outer, per_row) if outer > 1
                 else per_row(const(0))]
        offset += run_len
    return seq(*body)



@dataclass(frozen=True)
class FlatAdd:
    """qlinear_add: the flat kernel where it applies, the te definition else."""

    supports_symbolic = False
    fuses_producers = False

    def builds(self, call: Call) -> bool:
        """False: the flat kernel takes no fused elementwise chain (FuseOps must not count
        on it)."""
        return False

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Attrs, anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        """The flat kernel of the add alone, where its operands have the output's shape."""
        if result is not None or len(args) != len(params) or \
                any(a is not p for a, p in zip(args, params)) or not flat_operands(params):
            return None
        buffers = [Buffer(t.name, t.shape, t.dtype) for t in params]
        out = Buffer("out", tuple(params[0].shape), params[7].dtype)
        body = flat_add_body(buffers, out, tile_lanes(isa, "float32"),
                             uint8_shift(attrs), isa=isa)
        return PrimFunc((*buffers, out), body, {ATTR_QLINEAR_ADD: "flat"})


@dataclass(frozen=True)
class ConcatRuns:
    """qlinear_concat: the hand-built kernel for static shapes, the te definition else."""

    supports_symbolic = False
    fuses_producers = False

    def builds(self, call: Call) -> bool:
        """False: the kernel takes no fused elementwise chain."""
        return False

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Attrs, anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        """The kernel of the concat alone, for static shapes."""
        if result is not None or len(args) != len(params) or \
                any(a is not p for a, p in zip(args, params)) or \
                not all(isinstance(d, int) for t in params for d in t.shape):
            return None
        buffers = [Buffer(t.name, t.shape, t.dtype) for t in params]
        out_type = get_op(CONCAT).infer([TensorType(t.shape, t.dtype) for t in params], attrs)
        assert isinstance(out_type, TensorType)
        out = Buffer("out", tuple(out_type.shape), out_type.dtype)
        body = concat_body(buffers, out, attrs, tile_lanes(isa, "float32"), isa=isa)
        return PrimFunc((*buffers, out), body, {ATTR_QLINEAR_CONCAT: "runs"})


#: The lowerings of `qlinear_add` and `qlinear_concat` (kiln.kernels.lowering); over a
#: symbolic batch, chunk by chunk (kiln.kernels.int8.per_sample).
FLAT_ADD = PerSample(FlatAdd())
CONCAT_RUNS = PerSample(ConcatRuns())

"""What the convolution families share: the lowering around their loop nests (shape,
fused epilogue, bias of a blocked output) and the packed call. Each family supplies
the tile and the loop nest (`Body`); which `conv2d` calls any of them takes is
kiln.ops.conv_geometry.conv_call_shape.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from kiln.ir import graph as g
from kiln.ir import weight_origin as wo
from kiln.ir.attrs import ATTR_ARG_DIMS, ATTR_CONV_KERNEL, ATTR_NO_SLP
from kiln.ir.shape_expr import is_static
from kiln.ir.tensor import Buffer, PrimExpr, PrimFunc, Stmt
from kiln.ir.types import TensorType
from kiln.kernels.conv.run_time_width import RunTimeWidth
from kiln.kernels.epilogue import fused_store
from kiln.kernels.registry import Family
from kiln.kernels.tiles import Epilogue
from kiln.ops import conv_direct as cd
from kiln.ops import layout
from kiln.ops.conv_geometry import ConvShape, conv_call_shape
from kiln.ops.packed_attrs import TILE, recorded_tile
from kiln.target.isa import ISA

#: The loop nest of one family: (shape, input, weight, output, tile, epilogue, fma,
#: NCHW{b}c block or 0) -> statement, or one over a run-time input channel count.
Body = Callable[[ConvShape, Buffer, Buffer, Buffer, tuple[int, ...], Epilogue, bool, int],
                Stmt | RunTimeWidth]


#: Output columns per tile that tuning tries (kiln.tuning), where the registers hold them.
TUNED_WIDTHS = (2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)


def vector_widths(out_w: int, lanes: int, most: int = 4) -> list[int]:
    """Tile widths of whole vectors (1 to `most`) that an output row of `out_w` fills
    (just `out_w` for a row narrower than one vector): the row-tiled and depthwise
    kernels' search space."""
    return [v * lanes for v in range(1, most + 1) if v * lanes <= out_w] or [out_w]


def packed_call(op: str, call: g.Call, packed: Any, tile: tuple[int, ...],
                channels: int | None, origin: Any = None) -> g.Call:
    """`call` as a call of `op` on the weight `packed` (None: the weight as it is), the
    tile (and the real output channel count) recorded in its attributes. `origin` maps
    the weight's replay (kiln.ir.weight_origin) to the packed one's: `origin(source)`."""
    args = list(call.args)
    if packed is not None:
        w = call.args[1]
        assert isinstance(w, g.Constant)
        packed_w = g.Constant(packed, w.name)
        if origin is not None:
            wo.record(packed_w.data, origin(wo.origin_of(w.data)))
        args[1] = packed_w
    attrs: dict[str, Any] = {**dict(call.attrs), TILE: tile}
    if channels is not None:
        attrs["channels"] = channels
    return g.Call(op, tuple(args), g.freeze_attrs(attrs), call.ret_type)


def static_call_shape(op: str, call: g.Call, ndim: int
                      ) -> tuple[list[TensorType], ConvShape] | None:
    """The operand types and geometry of a call of `op` whose operands are all static
    tensors, its input of `ndim` dims (what a family's `width_key` starts from); None
    for any other call."""
    if call.op != op:
        return None
    types = [a.type for a in call.args]
    tensors = [t for t in types if isinstance(t, TensorType) and is_static(t.shape)]
    if len(tensors) != len(types) or tensors[0].ndim != ndim:
        return None
    shape = cd.call_conv_shape(op, tensors, call.attrs)
    return None if shape is None else (tensors, shape)


def build_conv(op: str, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
               anchor: Any, result: Any, isa: ISA, tile: tuple[int, ...],
               body: Body, symbolic_image: bool = False, no_slp: bool = False
               ) -> PrimFunc | None:
    """The kernel of a call of `op` (one of kiln.ops.conv_direct's ops) with its fused
    elementwise tail, the loop nest from `body` (which, with `symbolic_image`, takes a
    symbolic image height and width). With `no_slp` the kernel carries `ATTR_NO_SLP`:
    its register tile's vectors are all explicit, and LLVM's SLP vectorizer, left on
    it, regrouped the tile's scalar input addresses into vectors of i64 on the critical
    path of the sums (docs/codegen-llvm.md, "Kernels LLVM must not regroup")."""

    x, w = args[0], args[1]
    if not all(isinstance(d, int) for t in args for d in (t.shape[1:2] if t is x else t.shape)):
        return None  # only the batch and image sizes may be symbolic
    shape = cd.call_conv_shape(op, args, attrs)
    if shape is None or (shape.symbolic_image and not symbolic_image):
        return None
    block = cd.nchwc_block(x.shape, attrs) if op == cd.NCHWC else 0
    conv_out: tuple[Any, ...] = (shape.n, shape.c_out, shape.out_h, shape.out_w)
    bias = args[2] if len(args) > 2 else None
    if block:
        conv_out = layout.block_shape(conv_out, block)
    store = fused_store(params, anchor, result, conv_out, bias=None if block else bias)
    if store is None:  # an epilogue needing statements (a reduction, a table)
        return None
    epilogue = store.epilogue
    if block and bias is not None:
        epilogue = blocked_bias(epilogue, store.buffers[bias], block)
    built = body(shape, store.buffers[x], store.buffers[w], store.out, tile, epilogue,
                 isa.fma, block)
    fattrs: dict[str, Any] = {ATTR_CONV_KERNEL: op}
    if no_slp:
        fattrs[ATTR_NO_SLP] = True
    buffers = [store.buffers[t] for t in params]
    out = store.out
    if isinstance(built, RunTimeWidth):
        built, wide = built.build(store.buffers[x], store.buffers[w], (*buffers, out),
                                  store.buffers.get(bias) if bias is not None else None)
        if wide is not None:  # the buffers over the run-time sizes
            index = {id(b): i for i, b in enumerate(buffers)}
            fattrs[ATTR_ARG_DIMS] = tuple((name, index[id(b)], axis)
                                          for name, b, axis in wide.dims)
            buffers = [wide.buffers.get(b, b) for b in buffers]
            out = wide.buffers.get(out, out)
    return PrimFunc((*buffers, out), built, fattrs)


def blocked_bias(epilogue: Epilogue, bias: Buffer, block: int) -> Epilogue:
    """`epilogue` after adding the bias of the NCHW{block}c output index's channel (a
    real one: kiln.kernels.conv.blocked.blocked_tile_stores stores the padding lanes' zeros
    without the epilogue)."""
    def with_bias(v: PrimExpr, idx: tuple[PrimExpr, ...]) -> PrimExpr:
        return epilogue(v + bias[idx[1] * block + idx[4]], idx)

    return with_bias


@dataclass(frozen=True)
class UnpackedConv(Family, ABC):
    """A family whose op takes the OIHW weight as it is and a 2-int tile: subclasses
    give `applies`, `choose_tile(shape, isa)` and `loop_nest(shape, x, w, out, tile,
    epilogue, fused, isa)`; one whose loop nest takes a symbolic image height and width
    sets `symbolic_image`."""

    symbolic_image: ClassVar[bool] = False

    @abstractmethod
    def choose_tile(self, shape: ConvShape, isa: ISA) -> tuple[int, int]:
        """The tile the rule picks for `shape` on `isa`."""

    @abstractmethod
    def loop_nest(self, shape: ConvShape, x: Buffer, w: Buffer, out: Buffer,
                  tile: tuple[int, int], epilogue: Epilogue, fused: bool, isa: ISA) -> Stmt:
        """The kernel's loops with `tile` and the fused `epilogue`."""

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        shape = conv_call_shape(call, self.symbolic_image)
        assert shape is not None
        return self.pack_tile(call, isa, self.choose_tile(shape, isa))

    def pack_tile(self, call: g.Call, isa: ISA, tile: tuple[int, ...]) -> g.Call:
        """`call` packed with `tile` (the weight stays OIHW)."""
        return packed_call(self.op, call, None, tuple(tile), None)

    def for_call(self, attrs: Mapping[str, Any]) -> UnpackedConv:
        """The family that builds a call with `attrs` (this one, unless an attribute of
        the call changes the loop nest)."""
        return self

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        tile = recorded_tile(attrs, 2, self.op)
        family = self.for_call(attrs)

        def body(shape: ConvShape, x: Buffer, w: Buffer, out: Buffer, t: tuple[int, ...],
                 epilogue: Epilogue, fused: bool, block: int) -> Stmt:
            a, b = t or family.choose_tile(shape, isa)
            return family.loop_nest(shape, x, w, out, (a, b), epilogue, fused, isa)

        return build_conv(self.op, params, args, attrs, anchor, result, isa, tile or (), body,
                          self.symbolic_image)

"""2-D convolution operators lowered by the hand-scheduled kernels of `kiln.ops.conv_kernels`.

The `block-convolutions` graph pass (kiln.transform.conv_blocking) rewrites a
float32 `conv2d` with a constant weight into one of these, so the rewrite is
visible in the graph (and in its kiln.script text):

- `conv2d_blocked(x, wp[, bias])`: `wp` is the weight packed at compile time into
  `[group][co_block][ci][kh][kw][cb]` (`pack_blocked_weight`; `cb` output channels
  side by side, zero-padded), attribute `channels` the real output channel count;
- `conv2d_depthwise(x, w[, bias])`: one input and one output channel per group
  (`group == channels`); same attributes as `conv2d`;
- `conv2d_rows(x, wp[, bias])`: an ungrouped convolution tiled along output rows
  (1x1 convolutions and layers with few input channels), `wp` packed into
  `[co_block][ci][kh][kw][rows]` (`pack_rows_weight`), attribute `channels`;
- `conv2d_nchwc(x, wp[, bias])`: `conv2d_blocked` (ungrouped) on activations in the
  blocked NCHW{b}c layout (kiln.ops.layout): `x` is `[N][ceil(ci/b)][H][W][b]`, the
  result `[N][ceil(co/b)][OH][OW][b]` with its padding channels zero; with attribute
  `block` = b, `x` is NCHW instead (a region's first convolution reading its NCHW
  input in place: `NCHW_INPUT_BLOCK`); the `nchwc-layout` pass
  (kiln.transform.nchwc_layout) introduces it;
- `conv2d_group_gemm(x, w[, bias])`: a grouped (not depthwise) 1x1 convolution as
  one GEMM per group (kiln.ops.kernels.conv_grouped); same attributes as `conv2d`.

Both keep `conv2d`'s meaning (NCHW in and out, ONNX pads), type rule and numpy
reference; their tensor-expression definitions (used when a kernel cannot be
built, e.g. for another dtype) unpack the weight on the fly. `legalize` builds
the kernel; `lower_fused` builds it with an elementwise epilogue that FuseOps
grouped after the convolution (bias, BatchNorm folded into the weights,
ReLU/Clip/Sigmoid/SiLU, a residual add), applied as each output is stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np

from kiln.errors import IRError
from kiln.ir.tensor import PrimExpr, PrimFunc, as_expr, min_, select
from kiln.ir.types import TensorType, Type
from kiln.ops import conv_kernels as ck
from kiln.ops import layout, spatial, te
from kiln.ops.kernels.registry import checking_tile, recorded_tile
from kiln.ops.nn import conv_compute, conv_infer, conv_ref
from kiln.ops.registry import OPS, HandBuiltOp
from kiln.target.isa import ISA

BLOCKED = "conv2d_blocked"
DEPTHWISE = "conv2d_depthwise"
ROWS = "conv2d_rows"
NCHWC = "conv2d_nchwc"
GEMM = "conv2d_gemm"
GROUP_GEMM = "conv2d_group_gemm"
WINOGRAD = "conv2d_winograd"  # kiln.ops.winograd, which builds on this module
Attrs = Mapping[str, Any]

def conv_shape(x: Sequence[int | PrimExpr], c_out: int, kernel: Sequence[int],
               attrs: Attrs) -> ck.ConvShape:
    """The `ConvShape` of a 2-D convolution call (NCHW input shape `x`)."""
    strides = spatial.ints(attrs, "strides", 2, 1)
    dilations = spatial.ints(attrs, "dilations", 2, 1)
    begins, ends = spatial.pads(attrs, 2)
    # the batch may be symbolic (an int64 expression): only the kernels' batch loops see
    # it; a symbolic image height or width only the families taking one (ConvShape)
    batch, h, w = (cast(int, d) if isinstance(d, PrimExpr) else int(d)
                   for d in (x[0], x[2], x[3]))
    c = int(cast(int, x[1]))
    return ck.ConvShape(batch, c, h, w, int(c_out),
                        int(kernel[0]), int(kernel[1]), (strides[0], strides[1]),
                        (dilations[0], dilations[1]),
                        (begins[0], begins[1], ends[0], ends[1]), int(attrs.get("group", 1)))


# --------------------------------------------------------------------------- blocked op

def _blocked_oihw(types: Sequence[Any], attrs: Attrs) -> tuple[int, ...]:
    """The OIHW weight shape a packed `wp` stands for (checked)."""
    wp = tuple(int(d) for d in types[1].shape)
    if len(wp) != 6:
        raise IRError(f"{BLOCKED}: packed weight must be 6-D [group][block][ci][kh][kw][cb], "
                      f"got {wp}")
    groups, blocks, ci, kh, kw, cb = wp
    channels = int(attrs["channels"])
    if int(attrs.get("group", 1)) != groups or channels % groups or \
            not (blocks - 1) * cb < channels // groups <= blocks * cb:
        raise IRError(f"{BLOCKED}: packed weight {wp} does not hold {channels} output channels "
                      f"in {attrs.get('group', 1)} group(s)")
    tile = recorded_tile(attrs, 2, BLOCKED)
    if tile is not None and tile[0] != cb:
        raise IRError(f"{BLOCKED}: tile {tile} does not match the packed channel tile {cb}")
    return (channels, ci, kh, kw)


def _blocked_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    oihw = TensorType(_blocked_oihw(types, attrs), types[1].dtype)
    return conv_infer([types[0], oihw, *types[2:]], attrs)


def _unpacked(wp: te.Tensor, oihw: tuple[int, ...], groups: int) -> te.Tensor:
    cb = wp.shape[5]
    cog = oihw[0] // groups

    def element(o: PrimExpr, i: PrimExpr, a: PrimExpr, b: PrimExpr) -> PrimExpr:
        local = o % cog if groups > 1 else o
        grp = o // cog if groups > 1 else 0
        return wp[grp, local // cb, i, a, b, local % cb]

    return te.compute(oihw, element, wp.dtype, "weight")


def _blocked_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    oihw = _blocked_oihw(inputs, attrs)
    w = _unpacked(inputs[1], oihw, int(attrs.get("group", 1)))
    return conv_compute([inputs[0], w, *inputs[2:]], attrs)


def _blocked_ref(x: np.ndarray, wp: np.ndarray, b: np.ndarray | None = None,
                 **attrs: Any) -> np.ndarray:
    w = ck.unpack_blocked_weight(wp, int(attrs["channels"]))
    return conv_ref(x, w, b, **attrs)


# --------------------------------------------------------------------------- NCHWc op

#: The attribute of a `conv2d_nchwc` call on an NCHW input: its output's block `b`.
NCHW_INPUT_BLOCK = "block"


def nchwc_block(x: Sequence[Any], attrs: Attrs) -> int:
    """The block `b` of a `conv2d_nchwc` call's NCHW{b}c output: its input's (5-D), or
    the `NCHW_INPUT_BLOCK` attribute of an NCHW (4-D) input."""
    return int(x[4]) if len(x) == 5 else int(attrs.get(NCHW_INPUT_BLOCK, 0))


def nchwc_channel_tile(cb: int, blocks: int, block: int) -> bool:
    """Whether `blocks` tiles of `cb` output channels suit an NCHW{block}c output: whole
    blocks, or one tile ending in half a block (kiln.ops.kernels.nchwc.half_vector;
    its block's upper half stored as zeros)."""
    return cb % block == 0 or (blocks == 1 and 2 * (cb % block) == block)


def _nchwc_oihw(types: Sequence[Any], attrs: Attrs) -> tuple[int, ...]:
    """The OIHW weight of a `conv2d_nchwc` call (checked against its input)."""
    oihw = _blocked_oihw(types, attrs)
    x = tuple(types[0].shape)
    b = nchwc_block(x, attrs)
    blocked = len(x) == 5 and NCHW_INPUT_BLOCK not in attrs
    plain = len(x) == 4 and b > 0
    if int(attrs.get("group", 1)) != 1 or not (blocked or plain) or \
            int(x[1]) != (-(-oihw[1] // b) if blocked else oihw[1]) or \
            not nchwc_channel_tile(int(types[1].shape[5]), int(types[1].shape[1]), b):
        raise IRError(f"{NCHWC}: input {x} must be NCHW<b>c (or NCHW with attribute "
                      f"{NCHW_INPUT_BLOCK}=b) holding the weight's {oihw[1]} input channels, "
                      f"ungrouped, with a packed channel tile a multiple of b (or one tile "
                      f"ending in half a block)")
    return oihw


def _nchw_of(x: Sequence[Any], channels: int) -> tuple[Any, ...]:
    return (x[0], channels, x[2], x[3])


def _nchwc_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    oihw = _nchwc_oihw(types, attrs)
    x = types[0]
    out = conv_infer([TensorType(_nchw_of(x.shape, oihw[1]), x.dtype),
                       TensorType(oihw, types[1].dtype), *types[2:]], attrs)
    assert isinstance(out, TensorType)
    return TensorType(layout.block_shape(out.shape, nchwc_block(x.shape, attrs)), out.dtype)


def _nchwc_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    oihw = _nchwc_oihw(inputs, attrs)
    x = inputs[0]
    b = nchwc_block(x.shape, attrs)
    plain = x if len(x.shape) == 4 else te.compute(
        _nchw_of(x.shape, oihw[1]), lambda n, c, h, w: x[n, c // b, h, w, c % b], x.dtype,
        "x_nchw")
    out = _blocked_compute([plain, *inputs[1:]], attrs)
    co = oihw[0]

    def blocked(n: PrimExpr, cb: PrimExpr, h: PrimExpr, w: PrimExpr, v: PrimExpr) -> PrimExpr:
        ch = cb * b + v
        return select(ch < co, out[n, min_(ch, co - 1), h, w], as_expr(0.0, out.dtype))

    return te.compute(layout.block_shape(out.shape, b), blocked, out.dtype, "conv_nchwc")


def _nchwc_ref(x: np.ndarray, wp: np.ndarray, b: np.ndarray | None = None,
               **attrs: Any) -> np.ndarray:
    plain = x if x.ndim == 4 else layout.from_blocked(x, int(wp.shape[2]))
    block = nchwc_block(x.shape, attrs)
    attrs = {k: v for k, v in attrs.items() if k != NCHW_INPUT_BLOCK}
    return layout.to_blocked(_blocked_ref(plain, wp, b, **attrs), block)


# --------------------------------------------------------------------------- row-tiled op

def _rows_oihw(types: Sequence[Any], attrs: Attrs) -> tuple[int, ...]:
    wp = tuple(int(d) for d in types[1].shape)
    channels = int(attrs["channels"])
    if len(wp) != 5 or int(attrs.get("group", 1)) != 1 or \
            not (wp[0] - 1) * wp[4] < channels <= wp[0] * wp[4]:
        raise IRError(f"{ROWS}: packed weight {wp} must be [block][ci][kh][kw][rows] holding "
                      f"{channels} output channels, ungrouped")
    tile = recorded_tile(attrs, 3, ROWS)
    if tile is not None and tile[0] != wp[4]:
        raise IRError(f"{ROWS}: tile {tile} does not match the packed channel rows {wp[4]}")
    return (channels, wp[1], wp[2], wp[3])


def _rows_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    oihw = TensorType(_rows_oihw(types, attrs), types[1].dtype)
    return conv_infer([types[0], oihw, *types[2:]], attrs)


def _rows_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    oihw = _rows_oihw(inputs, attrs)
    wp = inputs[1]
    rows = wp.shape[4]
    w = te.compute(oihw, lambda o, i, a, b: wp[o // rows, i, a, b, o % rows], wp.dtype,
                   "weight")
    return conv_compute([inputs[0], w, *inputs[2:]], attrs)


def _rows_ref(x: np.ndarray, wp: np.ndarray, b: np.ndarray | None = None,
              **attrs: Any) -> np.ndarray:
    return conv_ref(x, ck.unpack_rows_weight(wp, int(attrs["channels"])), b, **attrs)


# --------------------------------------------------------------------------- lowering

def call_conv_shape(op: str, args: Sequence[Any], attrs: Attrs) -> ck.ConvShape | None:
    """The geometry of a call of `op` (one of this module's ops, or `conv2d_winograd`) on
    `args` (tensors with shapes), or None when a `conv2d_depthwise` call is not
    depthwise."""
    x, w = args[0], args[1]
    if op == NCHWC:
        oihw = _nchwc_oihw(args, attrs)
        return conv_shape(_nchw_of(x.shape, oihw[1]), oihw[0], oihw[2:], attrs)
    if op in (BLOCKED, ROWS):
        oihw = (_blocked_oihw if op == BLOCKED else _rows_oihw)(args, attrs)
        return conv_shape(x.shape, oihw[0], oihw[2:], attrs)
    if op == WINOGRAD:  # the transformed weight [a*a][O][C] (kiln.ops.winograd)
        return conv_shape(x.shape, w.shape[1], (3, 3), attrs)
    shape = conv_shape(x.shape, w.shape[0], w.shape[2:], attrs)
    if op == GEMM:
        return shape if shape.groups == 1 else None
    if op == GROUP_GEMM:
        return shape
    return shape if shape.depthwise else None


@dataclass(frozen=True)
class DirectConvOp(HandBuiltOp):
    """A convolution op whose kernel its family (kiln.ops.kernels: `conv_direct`,
    `conv_rows`, `conv_depthwise`, `nchwc`) builds (`legalize`, `lower_fused`); the
    batch may be symbolic (channels and image sizes static)."""

    supports_symbolic: ClassVar[bool] = True

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                    anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        """The convolution kernel (see `HandBuiltOp.lower_fused`)."""
        if any(t.dtype != "float32" for t in (args[0], args[1], *params)):
            return None
        from kiln.ops.kernels.registry import build_call, family_of

        return build_call(family_of(self.name), params, args, attrs, anchor, result,
                          isa)


def _register(name: str, infer: Any, compute: Any, reference: Any) -> None:
    OPS.register(name, DirectConvOp(name, "anchor", infer, compute, reference))


_register(BLOCKED, _blocked_infer, _blocked_compute, _blocked_ref)
_register(DEPTHWISE, checking_tile(conv_infer, DEPTHWISE, 2), conv_compute, conv_ref)
_register(ROWS, _rows_infer, _rows_compute, _rows_ref)
_register(NCHWC, _nchwc_infer, _nchwc_compute, _nchwc_ref)
_register(GEMM, checking_tile(conv_infer, GEMM, 2), conv_compute, conv_ref)
_register(GROUP_GEMM, checking_tile(conv_infer, GROUP_GEMM, 2), conv_compute, conv_ref)

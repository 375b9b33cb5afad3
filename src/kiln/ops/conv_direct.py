"""2-D convolution operators lowered by the hand-scheduled kernels of kiln.kernels.conv.

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
  one GEMM per group (kiln.kernels.conv.grouped); same attributes as `conv2d`, and
  `shuffled`: the output's channels in the order of a channel shuffle of its groups,
  group `g`'s channel `co` at `co * group + g`, the bias in that order
  (kiln.transform.channel_shuffles).

Both keep `conv2d`'s meaning (NCHW in and out, ONNX pads), type rule and numpy
reference; their tensor-expression definitions (used when a kernel cannot be
built, e.g. for another dtype) unpack the weight on the fly (`unpack_blocked_weight`,
`unpack_rows_weight`). Their kernels are their families' (kiln.kernels.conv), built
alone or with an elementwise epilogue that FuseOps grouped after the convolution
(bias, BatchNorm folded into the weights, ReLU/Clip/Sigmoid/SiLU, a residual add),
applied as each output is stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import weight_origin as wo
from kiln.ir.tensor import PrimExpr, as_expr, min_, select
from kiln.ir.types import TensorType, Type
from kiln.ops import layout, te
from kiln.ops.conv_geometry import ConvShape, conv_shape
from kiln.ops.nn import conv_compute, conv_infer, conv_ref
from kiln.ops.packed_attrs import checking_tile, recorded_tile
from kiln.ops.registry import register_op

BLOCKED = "conv2d_blocked"
DEPTHWISE = "conv2d_depthwise"
ROWS = "conv2d_rows"
NCHWC = "conv2d_nchwc"
GEMM = "conv2d_gemm"
GROUP_GEMM = "conv2d_group_gemm"
WINOGRAD = "conv2d_winograd"  # kiln.ops.winograd, which builds on this module
Attrs = Mapping[str, Any]


# --------------------------------------------------------------------------- blocked op

def unpack_blocked_weight(wp: np.ndarray, c_out: int) -> np.ndarray:
    """The OIHW weight with `c_out` output channels of a weight packed
    `[group][co_block][ci][kh][kw][cb]` (kiln.kernels.conv.blocked.pack_blocked_weight)."""
    groups, blocks, ci, kh, kw, cb = wp.shape
    cog = c_out // groups
    w = wp.transpose(0, 1, 5, 2, 3, 4).reshape(groups, blocks * cb, ci, kh, kw)[:, :cog]
    return np.ascontiguousarray(w.reshape(c_out, ci, kh, kw))


def unpack_blocked_origin(source: wo.Origin | None, shape: Sequence[int], c_out: int
                          ) -> wo.Origin | None:
    """The replay of `unpack_blocked_weight` on a weight of packed `shape`."""
    groups, blocks, ci, kh, kw, cb = (int(d) for d in shape)
    moved = wo.step("transpose", source, perm=(0, 1, 5, 2, 3, 4))
    grouped = wo.step("reshape", moved, shape=(groups, blocks * cb, ci, kh, kw))
    cut = wo.first(grouped, (groups, c_out // groups, ci, kh, kw))
    return wo.step("reshape", cut, shape=(c_out, ci, kh, kw))


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
    w = unpack_blocked_weight(wp, int(attrs["channels"]))
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
    blocks, or one tile ending in half a block (kiln.kernels.conv.nchwc.half_vector;
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

def unpack_rows_weight(wp: np.ndarray, c_out: int) -> np.ndarray:
    """The OIHW weight with `c_out` output channels of a weight packed
    `[co_block][ci][kh][kw][rows]` (kiln.kernels.conv.rows.pack_rows_weight)."""
    blocks, ci, kh, kw, rows = wp.shape
    w = wp.transpose(0, 4, 1, 2, 3).reshape(blocks * rows, ci, kh, kw)[:c_out]
    return np.ascontiguousarray(w)


def unpack_rows_origin(source: wo.Origin | None, shape: Sequence[int], c_out: int
                       ) -> wo.Origin | None:
    """The replay of `unpack_rows_weight` on a weight of packed `shape`."""
    blocks, ci, kh, kw, rows = (int(d) for d in shape)
    moved = wo.step("transpose", source, perm=(0, 4, 1, 2, 3))
    merged = wo.step("reshape", moved, shape=(blocks * rows, ci, kh, kw))
    return wo.first(merged, (c_out, ci, kh, kw))


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
    return conv_ref(x, unpack_rows_weight(wp, int(attrs["channels"])), b, **attrs)


# --------------------------------------------------------------------- grouped GEMM op

#: The `conv2d_group_gemm` attribute of a channel-shuffled output (module docstring).
SHUFFLED = "shuffled"


def shuffled_channel(oc: Any, groups: int, per_group: int) -> Any:
    """The convolution's channel (`g * per_group + co`) stored at output channel `oc`
    (`co * groups + g`) of a shuffled output."""
    return (oc % groups) * per_group + oc // groups


def _group_gemm_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    if not attrs.get(SHUFFLED):
        return conv_compute(inputs, attrs)
    conv = conv_compute(inputs[:2], attrs)
    groups = int(attrs["group"])
    per_group = conv.shape[1] // groups
    bias = inputs[2] if len(inputs) == 3 else None

    def element(n: PrimExpr, oc: PrimExpr, h: PrimExpr, w: PrimExpr) -> PrimExpr:
        v = conv[n, shuffled_channel(oc, groups, per_group), h, w]
        return v if bias is None else v + bias[oc]

    return te.compute(tuple(conv.shape), element, conv.dtype, "shuffled")


def _group_gemm_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None,
                    **attrs: Any) -> np.ndarray:
    if not attrs.get(SHUFFLED):
        return conv_ref(x, w, b, **attrs)
    out = conv_ref(x, w, None, **attrs)
    n, c, *image = out.shape
    groups = int(attrs["group"])
    out = out.reshape(n, groups, c // groups, *image).swapaxes(1, 2).reshape(out.shape)
    return out if b is None else (out + b.reshape(1, c, 1, 1)).astype(out.dtype)


# --------------------------------------------------------------------------- kernel calls

def call_conv_shape(op: str, args: Sequence[Any], attrs: Attrs) -> ConvShape | None:
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


#: The attribute a tuned `conv2d_blocked` call records its K-blocking in: input
#: channels per segment, 0 for unblocked (absent: the rule's,
#: kiln.kernels.conv.direct.choose_k_blocking).
KSEGMENT = "ksegment"
#: The segment sizes tuning offers (kiln.kernels.search), where they divide the
#: group's input channels into at least two segments.
TUNED_SEGMENTS = (0, 16, 32, 64)


def legal_segments(shape: ConvShape) -> list[int]:
    """The `TUNED_SEGMENTS` the blocked kernel computes `shape` with: 0, and sizes
    dividing the group's input channels in at least two segments."""
    return [k for k in TUNED_SEGMENTS
            if k == 0 or (shape.ci_group % k == 0 and shape.ci_group >= 2 * k)]


def _register(name: str, infer: Any, compute: Any, reference: Any) -> None:
    register_op(name, pattern="anchor", infer=infer, compute=compute, reference=reference)


_register(BLOCKED, _blocked_infer, _blocked_compute, _blocked_ref)
_register(DEPTHWISE, checking_tile(conv_infer, DEPTHWISE, 2), conv_compute, conv_ref)
_register(ROWS, _rows_infer, _rows_compute, _rows_ref)
_register(NCHWC, _nchwc_infer, _nchwc_compute, _nchwc_ref)
_register(GEMM, checking_tile(conv_infer, GEMM, 2), conv_compute, conv_ref)
_register(GROUP_GEMM, checking_tile(conv_infer, GROUP_GEMM, 2), _group_gemm_compute,
          _group_gemm_ref)

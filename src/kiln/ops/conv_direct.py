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
  result `[N][ceil(co/b)][OH][OW][b]` with its padding channels zero; the
  `nchwc-layout` pass (kiln.transform.nchwc_layout) introduces it.

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
from kiln.ir.tensor import Buffer, PrimExpr, PrimFunc, as_expr, min_, select
from kiln.ir.types import TensorType, Type
from kiln.ops import conv_kernels as ck
from kiln.ops import layout, spatial, te
from kiln.ops.epilogue import fused_store
from kiln.ops.nn import _conv_compute, _conv_infer, _conv_ref
from kiln.ops.registry import OPS, HandBuiltOp

BLOCKED = "conv2d_blocked"
DEPTHWISE = "conv2d_depthwise"
ROWS = "conv2d_rows"
NCHWC = "conv2d_nchwc"
Attrs = Mapping[str, Any]

# mcpu names (prefixes) whose widest float unit is 512 / 256 bits, when a target
# names a CPU but lists no features.
_AVX512_CPUS = ("skylake-avx512", "cascadelake", "cooperlake", "icelake", "tigerlake",
                "sapphirerapids", "graniterapids", "emeraldrapids", "znver4", "znver5",
                "x86-64-v4", "rocketlake", "cannonlake")
_AVX2_CPUS = ("haswell", "broadwell", "skylake", "znver1", "znver2", "znver3", "alderlake",
              "raptorlake", "meteorlake", "x86-64-v3", "bdver4", "arrowlake", "lunarlake")


def target_lanes(target: Any = None) -> int:
    """float32 lanes of the widest vector unit of `target` (default: the current one):
    16 with AVX-512F, 8 with AVX/AVX2, else 4 (SSE, NEON, unknown)."""
    if target is None:
        from kiln.target import Target

        target = Target.current()
    if target is None:
        return 4
    attrs = target.attrs  # kinds without mattr/mcpu/mtriple (python, c) simply lack them
    feats = [str(f) for f in (attrs.get("mattr") or ())]
    if "-avx512f" in feats:
        feats = [f for f in feats if f != "+avx512f"]
    mcpu = str(attrs.get("mcpu") or "")
    if not any(f.startswith("+avx") for f in feats):
        if mcpu.startswith(_AVX512_CPUS) and "-avx512f" not in feats:
            feats.append("+avx512f")
        elif mcpu.startswith(_AVX2_CPUS) or mcpu.startswith(_AVX512_CPUS):
            feats.append("+avx2")
    return ck.vector_lanes(feats, str(attrs.get("mtriple") or ""))


def target_has_fma(target: Any = None) -> bool:
    """Whether `target` (default: the current one) has fused multiply-add instructions:
    AArch64, or x86 with `+fma` or a CPU from Haswell / Zen on. Without them the
    kernels multiply and add separately (an `fma` would be a libm call)."""
    if target is None:
        from kiln.target import Target

        target = Target.current()
    if target is None:
        return False
    attrs = target.attrs
    triple = str(attrs.get("mtriple") or "")
    if triple.startswith(("aarch64", "arm64")):
        return True
    feats = [str(f) for f in (attrs.get("mattr") or ())]
    if "-fma" in feats:
        return False
    mcpu = str(attrs.get("mcpu") or "")
    return "+fma" in feats or mcpu.startswith(_AVX512_CPUS + _AVX2_CPUS)


def conv_shape(x: Sequence[int | PrimExpr], c_out: int, kernel: Sequence[int],
               attrs: Attrs) -> ck.ConvShape:
    """The `ConvShape` of a 2-D convolution call (NCHW input shape `x`)."""
    strides = spatial.ints(attrs, "strides", 2, 1)
    dilations = spatial.ints(attrs, "dilations", 2, 1)
    begins, ends = spatial.pads(attrs, 2)
    # the batch may be symbolic (an int64 expression): only the kernels' batch loops see it
    batch = cast(int, x[0]) if isinstance(x[0], PrimExpr) else int(x[0])
    c, h, w = (int(cast(int, d)) for d in x[1:4])
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
    return (channels, ci, kh, kw)


def _blocked_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    oihw = TensorType(_blocked_oihw(types, attrs), types[1].dtype)
    return _conv_infer([types[0], oihw, *types[2:]], attrs)


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
    return _conv_compute([inputs[0], w, *inputs[2:]], attrs)


def _blocked_ref(x: np.ndarray, wp: np.ndarray, b: np.ndarray | None = None,
                 **attrs: Any) -> np.ndarray:
    w = ck.unpack_blocked_weight(wp, int(attrs["channels"]))
    return _conv_ref(x, w, b, **attrs)


# --------------------------------------------------------------------------- NCHWc op

def _nchwc_oihw(types: Sequence[Any], attrs: Attrs) -> tuple[int, ...]:
    """The OIHW weight of a `conv2d_nchwc` call (checked against its blocked input)."""
    oihw = _blocked_oihw(types, attrs)
    x = tuple(types[0].shape)
    if int(attrs.get("group", 1)) != 1 or len(x) != 5 or \
            int(x[1]) != -(-oihw[1] // int(x[4])) or int(types[1].shape[5]) % int(x[4]):
        raise IRError(f"{NCHWC}: input {x} must be NCHW<b>c holding the weight's {oihw[1]} "
                      f"input channels, ungrouped, with a packed channel tile a multiple of b")
    return oihw


def _nchw_of(x: Sequence[Any], channels: int) -> tuple[Any, ...]:
    return (x[0], channels, x[2], x[3])


def _nchwc_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    oihw = _nchwc_oihw(types, attrs)
    x = types[0]
    out = _conv_infer([TensorType(_nchw_of(x.shape, oihw[1]), x.dtype),
                       TensorType(oihw, types[1].dtype), *types[2:]], attrs)
    assert isinstance(out, TensorType)
    return TensorType(layout.block_shape(out.shape, cast(int, x.shape[4])), out.dtype)


def _nchwc_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    oihw = _nchwc_oihw(inputs, attrs)
    x = inputs[0]
    b = int(x.shape[4])
    plain = te.compute(_nchw_of(x.shape, oihw[1]),
                       lambda n, c, h, w: x[n, c // b, h, w, c % b], x.dtype, "x_nchw")
    out = _blocked_compute([plain, *inputs[1:]], attrs)
    co = oihw[0]

    def blocked(n: PrimExpr, cb: PrimExpr, h: PrimExpr, w: PrimExpr, v: PrimExpr) -> PrimExpr:
        ch = cb * b + v
        return select(ch < co, out[n, min_(ch, co - 1), h, w], as_expr(0.0, out.dtype))

    return te.compute(layout.block_shape(out.shape, b), blocked, out.dtype, "conv_nchwc")


def _nchwc_ref(x: np.ndarray, wp: np.ndarray, b: np.ndarray | None = None,
               **attrs: Any) -> np.ndarray:
    plain = layout.from_blocked(x, int(wp.shape[2]))
    return layout.to_blocked(_blocked_ref(plain, wp, b, **attrs), int(x.shape[4]))


# --------------------------------------------------------------------------- row-tiled op

def _rows_oihw(types: Sequence[Any], attrs: Attrs) -> tuple[int, ...]:
    wp = tuple(int(d) for d in types[1].shape)
    channels = int(attrs["channels"])
    if len(wp) != 5 or int(attrs.get("group", 1)) != 1 or \
            not (wp[0] - 1) * wp[4] < channels <= wp[0] * wp[4]:
        raise IRError(f"{ROWS}: packed weight {wp} must be [block][ci][kh][kw][rows] holding "
                      f"{channels} output channels, ungrouped")
    return (channels, wp[1], wp[2], wp[3])


def _rows_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    oihw = TensorType(_rows_oihw(types, attrs), types[1].dtype)
    return _conv_infer([types[0], oihw, *types[2:]], attrs)


def _rows_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    oihw = _rows_oihw(inputs, attrs)
    wp = inputs[1]
    rows = wp.shape[4]
    w = te.compute(oihw, lambda o, i, a, b: wp[o // rows, i, a, b, o % rows], wp.dtype,
                   "weight")
    return _conv_compute([inputs[0], w, *inputs[2:]], attrs)


def _rows_ref(x: np.ndarray, wp: np.ndarray, b: np.ndarray | None = None,
              **attrs: Any) -> np.ndarray:
    return _conv_ref(x, ck.unpack_rows_weight(wp, int(attrs["channels"])), b, **attrs)


# --------------------------------------------------------------------------- lowering

@dataclass(frozen=True)
class DirectConvOp(HandBuiltOp):
    """A convolution op whose kernel is built by hand (`legalize`, `lower_fused`); the
    batch may be symbolic (channels and image sizes static)."""

    supports_symbolic: ClassVar[bool] = True

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                    anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str) -> PrimFunc | None:
        """The convolution kernel (see `HandBuiltOp.lower_fused`)."""
        x, w = args[0], args[1]
        if x.dtype != "float32" or w.dtype != "float32" or any(
                t.dtype != "float32" for t in params):
            return None
        if not all(isinstance(d, int) for t in args for d in (t.shape[1:] if t is x
                                                              else t.shape)):
            return None  # only the batch may be symbolic
        block = int(x.shape[4]) if self.name == NCHWC else 0
        if self.name == NCHWC:
            oihw = _nchwc_oihw(args, attrs)
            shape = conv_shape(_nchw_of(x.shape, oihw[1]), oihw[0], oihw[2:], attrs)
        elif self.name == BLOCKED:
            oihw = _blocked_oihw(args, attrs)
            shape = conv_shape(x.shape, oihw[0], oihw[2:], attrs)
        elif self.name == ROWS:
            oihw = _rows_oihw(args, attrs)
            shape = conv_shape(x.shape, oihw[0], oihw[2:], attrs)
        else:
            shape = conv_shape(x.shape, w.shape[0], w.shape[2:], attrs)
            if not shape.depthwise:
                return None
        conv_out: tuple[Any, ...] = (shape.n, shape.c_out, shape.out_h, shape.out_w)
        bias = args[2] if len(args) > 2 else None
        if block:
            conv_out = layout.block_shape(conv_out, block)
        store = fused_store(params, anchor, result, conv_out,
                            bias=None if block else bias)
        if store is None:  # an epilogue needing statements (a reduction, a table)
            return None
        buffers, out, epilogue = store.buffers, store.out, store.epilogue
        if block and bias is not None:
            epilogue = _blocked_bias(epilogue, buffers[bias], block, shape.c_out)
        lanes, fused = target_lanes(), target_has_fma()
        xb, wb = buffers[x], buffers[w]
        if block or self.name == BLOCKED:
            tiling = ck.Tiling(cb=w.shape[5], tile_w=ck.choose_tiling(shape, lanes).tile_w)
            body = ck.blocked_conv_body(shape, xb, wb, out, tiling, epilogue, fused, block)
        elif self.name == ROWS:
            body = ck.rows_conv_body(shape, xb, wb, out, ck.rows_tile_width(shape.out_w, lanes),
                                     epilogue, fused, lanes)
        else:
            body = ck.depthwise_conv_body(shape, xb, wb, out,
                                          ck.depthwise_tile_width(shape, lanes), epilogue,
                                          fused, lanes)
        return PrimFunc((*(buffers[t] for t in params), out), body,
                        {"kiln.conv_kernel": self.name})


def _blocked_bias(epilogue: ck.Epilogue, bias: Buffer, block: int,
                  channels: int) -> ck.Epilogue:
    """`epilogue` after adding the bias of the NCHW{block}c output index's channel (a
    padding lane reads the last channel's: its value is replaced by zero)."""
    def with_bias(v: PrimExpr, idx: tuple[PrimExpr, ...]) -> PrimExpr:
        ch = idx[1] * block + idx[4]
        return epilogue(v + bias[min_(ch, channels - 1) if channels % block else ch], idx)

    return with_bias


def _register(name: str, infer: Any, compute: Any, reference: Any) -> None:
    OPS.register(name, DirectConvOp(name, "anchor", infer, compute, reference))


_register(BLOCKED, _blocked_infer, _blocked_compute, _blocked_ref)
_register(DEPTHWISE, _conv_infer, _conv_compute, _conv_ref)
_register(ROWS, _rows_infer, _rows_compute, _rows_ref)
_register(NCHWC, _nchwc_infer, _nchwc_compute, _nchwc_ref)

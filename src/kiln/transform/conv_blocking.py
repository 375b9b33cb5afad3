"""BlockConvolutions: pick the hand-scheduled kernel of each float32 2-D convolution.

A `conv2d` with a constant weight (and constant or no bias), non-negative pads
and float32 operands becomes

- `conv2d_depthwise` when every group has one input and one output channel
  (MobileNet's depthwise layers): same operands and attributes;
- `conv2d_rows` for an ungrouped convolution with output rows at least one vector
  wide that is 1x1 with stride 1 (MobileNet's expansions and projections: a
  matrix-product tile)
  or sums over few inputs (`ci * kh * kw < ROWS_MAX_TAPS`, e.g. a first layer on
  3 channels, a 3x3 layer on 32): the weight packed into `[co_block][ci][kh][kw][6]`, tiles of 6
  channels x 2 vectors of one output row;
- `conv2d_blocked` otherwise: the weight is packed here, at compile time, into
  `[group][co_block][ci][kh][kw][cb]` with `cb` = one or two vectors of the
  target's float32 lanes (AVX-512 16, AVX2 8, NEON/SSE 4), so the kernel reads
  one contiguous weight row per (ci, kh, kw) and the run time never repacks.

The kernels themselves are in kiln.ops.conv_kernels; docs/performance.md,
"Convolution", describes them. The pass runs after fold-batchnorm (which
folds into `conv2d` weights) and before fuse-ops (which fuses the elementwise
tail into the new op's kernel). Activations stay NCHW here; the `nchwc-layout`
pass (kiln.transform.nchwc_layout) may then move chains of `conv2d_blocked` to
the blocked NCHW{b}c layout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.ir import graph as g
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType
from kiln.transform.functor import rewrite_calls
from kiln.transform.pass_base import FunctionPass

# Below this many multiply-adds per output the row-tiled kernel beat the blocked one
# on AVX-512 (its tile's epilogue is cheaper; measured on 16-32 channel 3x3 layers,
# while 64-channel 3x3 layers, 576 taps, ran faster blocked).
ROWS_MAX_TAPS = 320


@dataclass(frozen=True)
class BlockConvolutions(FunctionPass):
    """Rewrite float32 `conv2d` calls to `conv2d_blocked` / `conv2d_rows` /
    `conv2d_depthwise`.

    `lanes` (0: from the current target) sets the vector width the weights are packed for.
    """

    name = "block-convolutions"
    level = "graph"
    lanes: int = 0

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> g.Function:
        assert isinstance(func, g.Function)
        lanes = self.lanes or _target_lanes()
        return rewrite_calls(func, lambda call: _rewrite(call, lanes))


def _target_lanes() -> int:
    from kiln.ops.conv_direct import target_lanes

    return target_lanes()


def _rewrite(call: g.Call, lanes: int) -> g.Call | None:
    from kiln.ops import conv_kernels as ck
    from kiln.ops.conv_direct import BLOCKED, DEPTHWISE, ROWS, conv_shape

    if call.op != "conv2d" or len(call.args) not in (2, 3):
        return None
    x, w = call.args[0], call.args[1]
    bias = call.args[2] if len(call.args) == 3 else None
    if not isinstance(w, g.Constant) or (bias is not None and not isinstance(bias, g.Constant)):
        return None
    xt = x.type
    # the batch may be symbolic; the kernels' tiles need static channels and image sizes
    if not (isinstance(xt, TensorType) and xt.dtype == "float32" and w.type.dtype == "float32"
            and xt.ndim == 4 and all(isinstance(d, int) for d in xt.shape[1:])):
        return None
    wd = w.data
    shape = conv_shape(xt.shape, wd.shape[0], wd.shape[2:], call.attrs)
    if min(shape.pads) < 0:
        return None
    if shape.depthwise and wd.shape[1] == 1:
        return g.Call(DEPTHWISE, call.args, call.attrs, call.ret_type)
    attrs = {**dict(call.attrs), "channels": shape.c_out}
    # A strided 1x1 layer (ResNet's projection shortcuts) goes to the blocked kernel,
    # which reads the input in place: the row-tiled one would first copy the whole input
    # split by stride phase, most of it never read.
    pointwise = (shape.kh, shape.kw) == (1, 1)
    strided_pointwise = pointwise and shape.stride != (1, 1) and not any(shape.pads)
    few_taps = shape.ci_group * shape.kh * shape.kw < ROWS_MAX_TAPS
    if (shape.groups == 1 and shape.out_w >= lanes and (pointwise or few_taps)
            and not strided_pointwise):
        packed = g.Constant(ck.pack_rows_weight(wd), w.name)
        args = (x, packed) if bias is None else (x, packed, bias)
        return g.Call(ROWS, args, attrs, call.ret_type)
    cb = ck.choose_tiling(shape, lanes).cb
    packed = g.Constant(ck.pack_blocked_weight(wd, shape.groups, cb), w.name)
    args = (x, packed) if bias is None else (x, packed, bias)
    return g.Call(BLOCKED, args, attrs, call.ret_type)

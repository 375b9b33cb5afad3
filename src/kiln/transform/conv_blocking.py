"""BlockConvolutions: pick the hand-scheduled kernel of each float32 2-D convolution.

A `conv2d` with a constant weight (and constant or no bias), non-negative pads
and float32 operands becomes

- `conv2d_depthwise` when every group has one input and one output channel
  (MobileNet's depthwise layers): same operands and attributes;
- `conv2d_rows` for an ungrouped convolution with output rows at least one vector
  wide that is 1x1 with stride 1 (MobileNet's expansions and projections: a
  matrix-product tile)
  or sums over few inputs (`ci * kh * kw < ROWS_MAX_TAPS` of kiln.ops.kernels.conv_rows,
  e.g. a first layer on 3 channels, a 3x3 layer on 32, unless its rows leave more
  vector lanes empty than the blocked tiles lose: `blocked_computes_less`): the weight
  packed into `[co_block][ci][kh][kw][6]`, tiles of 6 channels x 2 vectors of one
  output row;
- `conv2d_blocked` otherwise: the weight is packed here, at compile time, into
  `[group][co_block][ci][kh][kw][cb]` with `cb` = one or two vectors of the
  target's float32 lanes (AVX-512 16, AVX2 8, NEON/SSE 4), so the kernel reads
  one contiguous weight row per (ci, kh, kw) and the run time never repacks.

The choice is kiln.ops.kernels.registry's (`select`, over the ISA of the current
target); each rewritten call records its register tile in its `tile` attribute: the
rule's, or a tuning database's (kiln.ops.kernels.search).

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
from kiln.transform.functor import SharedPacking, rewrite_calls
from kiln.transform.pass_base import FunctionPass


@dataclass(frozen=True)
class BlockConvolutions(FunctionPass):
    """Rewrite float32 `conv2d` calls to `conv2d_blocked` / `conv2d_rows` /
    `conv2d_depthwise`, the family chosen by kiln.ops.kernels.registry.

    `lanes` (0: from the current target's ISA) sets the vector width the weights are
    packed for.
    """

    name = "block-convolutions"
    level = "graph"
    lanes: int = 0

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> g.Function:
        assert isinstance(func, g.Function)
        from kiln.ops.kernels.registry import select
        from kiln.ops.kernels.search import pack
        from kiln.ops.kernels.tiles import with_lanes
        from kiln.target.isa import isa_for

        isa = isa_for(None)
        if self.lanes:
            isa = with_lanes(isa, self.lanes)

        def rewrite(call: g.Call) -> g.Call | None:
            family = select(call, isa) if call.op == "conv2d" else None
            return pack(family, call, isa) if family is not None else None

        return rewrite_calls(func, SharedPacking(rewrite))

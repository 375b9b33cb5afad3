"""BlockConvolutions: pick the hand-scheduled kernel of each float32 2-D convolution.

A `conv2d` with a constant weight (and constant or no bias), non-negative pads
and float32 operands becomes

- `conv2d_depthwise` when every group has one input and one output channel
  (MobileNet's depthwise layers): same operands and attributes;
- `conv2d_rows` for an ungrouped convolution with output rows at least one vector
  wide that is 1x1 with stride 1 (MobileNet's expansions and projections: a
  matrix-product tile)
  or sums over few inputs (`ci * kh * kw < ROWS_MAX_TAPS` of kiln.kernels.conv.rows,
  e.g. a first layer on 3 channels, a 3x3 layer on 32, unless its rows leave more
  vector lanes empty than the blocked tiles lose: `blocked_computes_less`): the weight
  packed into `[co_block][ci][kh][kw][6]`, tiles of 6 channels x 2 vectors of one
  output row;
- `conv2d_blocked` otherwise: the weight is packed here, at compile time, into
  `[group][co_block][ci][kh][kw][cb]` with `cb` = one or two vectors of the
  target's float32 lanes (AVX-512 16, AVX2 8, NEON/SSE 4), so the kernel reads
  one contiguous weight row per (ci, kh, kw) and the run time never repacks.

Over an image of symbolic height or width (a model exported with dynamic H and W) only
the families that take one apply: `conv2d_gemm` for any ungrouped layer,
`conv2d_group_gemm` for any grouped one, `conv2d_depthwise`
(kiln.kernels.window_symbolic) for depthwise ones; a convolution left on its generic loops there (a
computed weight) is warned about (`warn_generic_convolutions`).

The choice is kiln.kernels.registry's (`select`, over the ISA of the current
target); each rewritten call records its register tile in its `tile` attribute: the
rule's, or a tuning database's (kiln.kernels.search).

The kernels themselves are in kiln.kernels.conv; docs/performance.md,
"Convolution", describes them. The pass runs after fold-batchnorm (which
folds into `conv2d` weights) and before fuse-ops (which fuses the elementwise
tail into the new op's kernel). Activations stay NCHW here; the `nchwc-layout`
pass (kiln.transform.nchwc_layout) may then move chains of `conv2d_blocked` to
the blocked NCHW{b}c layout.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kiln.errors import PerformanceWarning
from kiln.ir import graph as g
from kiln.ir.module import IRModule
from kiln.ir.shape_expr import dim_vars
from kiln.ir.types import TensorType
from kiln.kernels.registry import select
from kiln.kernels.search import pack
from kiln.kernels.specialisation import current_node
from kiln.kernels.tiles import with_lanes
from kiln.transform.functor import SharedPacking, rewrite_calls
from kiln.transform.kernel_isa import kernel_isa
from kiln.transform.pass_base import FunctionPass
from kiln.tuning.apply import current

# The warning names at most this many nodes (a CNN over a symbolic image has dozens).
_LISTED_NODES = 6


@dataclass(frozen=True)
class BlockConvolutions(FunctionPass):
    """Rewrite float32 `conv2d` calls to `conv2d_blocked` / `conv2d_rows` /
    `conv2d_depthwise`, the family chosen by kiln.kernels.registry.

    `lanes` (0: from the current target's ISA) sets the vector width the weights are
    packed for.
    """

    name = "block-convolutions"
    level = "graph"
    lanes: int = 0

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> g.Function:
        assert isinstance(func, g.Function)

        isa, session = kernel_isa(), current()
        if self.lanes:
            isa = with_lanes(isa, self.lanes)

        generic: list[g.Call] = []
        nodes: list[str] = []  # the ONNX nodes of `generic`, for the warning

        def rewrite(call: g.Call) -> g.Call | None:
            family = select(call, isa) if call.op == "conv2d" else None
            if family is None and call.op == "conv2d" and symbolic_image(call):
                generic.append(call)
                nodes.append(current_node())
            return pack(family, call, isa, session) if family is not None else None

        out = rewrite_calls(func, SharedPacking(rewrite))
        if generic:
            warn_generic_convolutions(name, generic, nodes)
        return out


def symbolic_image(call: g.Call) -> bool:
    """Whether a `conv2d`'s input has a symbolic height or width (only the GEMM, grouped
    GEMM and depthwise families take one; kiln.ops.conv_geometry.conv_call_shape)."""
    t = call.args[0].type
    return isinstance(t, TensorType) and t.ndim == 4 and \
        not all(isinstance(d, int) for d in t.shape[2:])


def warn_generic_convolutions(func: str, calls: list[g.Call],
                              nodes: Sequence[str] = ()) -> None:
    """One PerformanceWarning for the convolutions of `func` left on their generic
    loops because their image size is symbolic, naming the variables to pin and the
    ONNX `nodes` of the calls (kiln.kernels.specialisation.current_node; the first
    _LISTED_NODES of them)."""
    names = sorted({v.name for c in calls for t in (c.args[0].type,)
                    if isinstance(t, TensorType) for v in dim_vars(t.shape[2:])})
    pins = ", ".join(f"{n!r}: ..." for n in names)
    known = [n for n in nodes if n]
    which = ""
    if known:
        more = len(known) - _LISTED_NODES
        which = f" ({', '.join(known[:_LISTED_NODES])}{f' and {more} more' if more > 0 else ''})"
    warnings.warn(
        f"{func}: {len(calls)} convolution(s) over a symbolic image size (in {', '.join(names)}) "
        "run their generic loops (kiln's kernels for run-time image sizes take layers with "
        "constant weights), several to tens of times slower than "
        f"with the size pinned; pin it for full speed: shape_dict={{{pins}}} (CLI: "
        f"--shape {names[0]}=...) "
        f"(docs/dynamic-shapes.md){which}", PerformanceWarning, stacklevel=2)

"""NchwcLayout: keep activations in the blocked NCHW{b}c layout through convolution chains.

After `block-convolutions`, an ungrouped `conv2d_blocked` becomes a
`conv2d_nchwc` whose input and output are NCHW{b}c (kiln.ops.layout; `b` = the
target's float32 vector lanes, the kernel's output-channel vector), and the
layout-agnostic ops between such convolutions follow it:

- unary elementwise ops (Relu, Clip, Sigmoid, ...) and binary elementwise ops
  whose two operands are blocked tensors of one shape (a residual Add): the same
  op on the 5-D tensor;
- 2-D max and average pooling: `pool2d_nchwc` (kiln.ops.pool_nchwc);
- a Winograd convolution (`conv2d_winograd`) of whole channel blocks:
  `conv2d_winograd_nchwc` (kiln.kernels.conv.winograd_nchwc), counted as a convolution;
- on a `precision=bf16` AVX-512 target, a row-tiled convolution (`conv2d_rows`, whose
  vectors run along the output rows) as the blocked kernel's, `conv2d_nchwc_bf16`;
- a channel concat of blocked tensors whose channel counts are multiples of `b`:
  `concat` along the block axis;
- on a `precision=bf16` AVX-512 target, LRN: `lrn_nchwc` (kiln.ops.lrn).

A region is entered with one `layout_transform(x, src="NCHW", dst="NCHW{b}c")`
per NCHW tensor it reads, but for a convolution on fewer input channels than a block
(a network's first layer on an RGB image; a row-tiled `conv2d_rows` one becomes the
blocked kernel's): that one reads its NCHW input in place and writes NCHW{b}c
(`conv2d_nchwc` with attribute `block`, `_reads_nchw`). A tensor a region produces is
reordered back (one `layout_transform(..., dst="NCHW")`, bound to the original
variable) just before its first other consumer (a depthwise or row-tiled convolution,
a concat of partial blocks, a global pooling, a Flatten, ...) or the function's
result. Padding channels (up to a multiple of `b`) are zeros at the region's entry and
at each convolution's output; every blocked consumer ignores them (the convolutions
sum over the real input channels only; the way back drops them).

A region (blocked values connected through these ops) is kept only when it holds
at least `min_convs` convolutions and more convolutions than reorders (as many, on the
bfloat16 kernel's targets: `_Rewriter.small_regions`); the
convolutions of the others stay `conv2d_blocked` and the pass runs again without
them.

Tuning (docs/tuning.md, "Model-level knobs"): under a tuning session
(kiln.tuning.apply.current) the pass asks the session for every region it forms,
kept by the rule or not (`Session.knob` with the pseudo-kernel `nchwc_region`, signed
by the region's convolutions in graph order, `region_signature`), with params
`{"layout": "NCHWc"}` or `{"layout": "NCHW"}`; the rule's decision is the default. A
region forced NCHWc keeps the invariants above (it is the same rewrite, only not
left out).

The pass runs after block-convolutions (whose packed weights it keeps) and
before fuse-ops, which fuses each `conv2d_nchwc` with its elementwise tail as
for `conv2d_blocked`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import UsageError
from kiln.ir import graph as g
from kiln.ir import weight_origin as wo
from kiln.ir.analysis.graph_uses import graph_vars_used
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType
from kiln.kernels.conv.blocked import choose_tiling
from kiln.kernels.registry import KERNELS
from kiln.kernels.tiles import tile_lanes, tile_registers, with_lanes
from kiln.ops import conv_nchwc_depthwise as dw
from kiln.ops.channel_scale_nchwc import CHANNEL_SCALE
from kiln.ops.conv_direct import (
    NCHW_INPUT_BLOCK,
    call_conv_shape,
    unpack_rows_origin,
    unpack_rows_weight,
)
from kiln.ops.layout import blocked_layout
from kiln.ops.lrn import LRN_NCHWC, lrn_params
from kiln.ops.packed_attrs import TILE
from kiln.ops.pool_nchwc import POOL_NCHWC, POOLS
from kiln.ops.registry import call, get_op
from kiln.target.isa import ISA
from kiln.transform.kernel_isa import kernel_isa
from kiln.transform.pass_base import FunctionPass
from kiln.tuning.apply import NCHWC_REGION, current

# A region must hold this many convolutions, and more than it has reorders: lone
# convolutions and pairs between reorders (as between MobileNetV2's depthwise layers)
# cost more in reorders than the layout saves.
MIN_REGION_CONVS = 2
#: The fewest vector registers and float32 lanes `depthwise_only` blocks regions with:
#: AVX2 (16 x 8) and AVX-512 (32 x 16), where it was measured (see NchwcLayout); NEON
#: and SSE (4 lanes) are not measured and stay NCHW.
DEPTHWISE_REGISTERS = 16
DEPTHWISE_LANES = 8


@dataclass(frozen=True)
class NchwcLayout(FunctionPass):
    """Convert chains of `conv2d_blocked` + elementwise ops + pooling to NCHW{b}c.

    `lanes` (0: from the current target) is the channel block `b`; `min_convs` the fewest
    convolutions a region keeps its layout with; `depthwise_only` keeps only regions holding
    a depthwise convolution (where the layout pays most: MobileNet-style networks), leaving
    the others NCHW, and only on ISAs with at least 16 vector registers of 8 float32 lanes
    (AVX2, AVX-512; NEON is not measured). On AVX2 the 1x1 layers of a region run on the
    NCHWc pointwise kernel (kiln.kernels.conv.nchwc): the blocked kernel runs them slower
    than NCHW. Without `depthwise_only`, on AVX2 the layers the blocked kernel K-blocks on
    small images stay NCHW (`k_blocked_small_images`). `pointwise_regions`: with
    `depthwise_only`, on ISAs whose unpadded 1x1 layers take the pointwise kernel
    (`pointwise_body_isa`: AVX2, and AVX-512 with `pointwise_tile`'s tiles) every region
    that pays is kept, as without `depthwise_only`. On AVX-512, where the conv kernels are
    out of LLVM's SLP vectorizer (kiln.ir.attrs.ATTR_NO_SLP) and `pool2d_nchwc` has its own
    kernel, the regions pay on the CNNs of the bench (docs/performance.md, "NCHW16c regions
    on AVX-512 (Zen 4)"); with that kernel, regions holding pools whose windows are clipped
    (GoogLeNet's branch pools, ResNet's stem pool) are kept too, and so are first layers
    reading NCHW in place outside depthwise regions ("First layers and clipped pools in
    NCHW{b}c regions").
    """

    name = "nchwc-layout"
    level = "graph"
    lanes: int = 0
    min_convs: int = MIN_REGION_CONVS
    depthwise_only: bool = False
    pointwise_regions: bool = False

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> g.Function:
        assert isinstance(func, g.Function)

        isa = kernel_isa()
        if self.lanes:
            isa = with_lanes(isa, self.lanes)
        from kiln.kernels.conv.nchwc import (
            pointwise_body_isa,  # lazy: kiln.kernels.registry loads it on first use
        )

        depthwise_only = self.depthwise_only and not (self.pointwise_regions
                                                      and pointwise_body_isa(isa))
        if depthwise_only and (tile_registers(isa) < DEPTHWISE_REGISTERS
                                    or tile_lanes(isa) < DEPTHWISE_LANES):
            return func

        session = current()
        skip: set[g.Var] = set()
        packs: dict[g.Var, g.Call] = {}  # the Winograd convolutions packed, for every round
        if not depthwise_only:  # the small K-blocked layers, unless in a depthwise region
            skip = k_blocked_small_images(func, isa)
            if skip:
                first = _Rewriter(tile_lanes(isa), set(), isa, packs)
                first.run(func)
                skip -= {c for group in first.regions() if first.depthwise & set(group)
                         for c in group}
        layouts: dict[frozenset[g.Var], str] = {}  # a region's layout, once decided
        while True:  # each round leaves out the convolutions of regions too small to pay
            rewriter = _Rewriter(tile_lanes(isa), skip, isa, packs)
            new = rewriter.run(func)
            small = rewriter.small_regions(self.min_convs, depthwise_only)
            if session is not None:
                small = rewriter.tuned_small(session, small, layouts)
            if not small:
                return new
            skip |= small


class _Rewriter:
    def __init__(self, block: int, skip: set[g.Var], isa: ISA,
                 packs: dict[g.Var, g.Call] | None = None, gemm: bool = True) -> None:

        self.block = block
        self.isa = isa
        self.family = KERNELS.get("nchwc")
        self.bf16 = KERNELS.get("nchwc_bf16")
        self.skip = skip                          # convolutions (by result) to leave NCHW
        self.gemm = gemm                          # also block conv2d_gemm (1x1) calls
        self.packs = {} if packs is None else packs  # conv var -> its packed Winograd call
        self.layout = blocked_layout(block)
        self.bindings: list[g.Binding] = []
        self.blocked: dict[g.Var, g.Var] = {}     # NCHW var -> its NCHW{b}c value
        self.plain: set[g.Var] = set()            # vars bound (or params) in NCHW
        self.region: dict[g.Var, g.Var] = {}      # blocked (original) var -> a conv of its region
        self.parent: dict[g.Var, g.Var] = {}      # union-find over the blocked convs
        self.reorders: list[g.Var] = []           # a conv of the region of each reorder
        self.depthwise: set[g.Var] = set()        # the depthwise convs (by result)
        self.convs: dict[g.Var, g.Call] = {}      # each blocked conv's original call

    def small_regions(self, min_convs: int, depthwise_only: bool = False) -> set[g.Var]:
        """The convolutions (original result vars) of regions that do not pay: fewer than
        `min_convs` convolutions, or no more convolutions than reorders in and out (or,
        with `depthwise_only`, no depthwise convolution). On the bfloat16 kernel's
        targets (`_rows_join_regions`) as many convolutions as reorders pay: each layer
        then runs in bfloat16 instead of float32 NCHW, which saves more than a reorder
        costs (Whisper's two Conv1d layers, one reorder in and one out)."""
        members: dict[g.Var, list[g.Var]] = {}
        for conv in self.parent:
            members.setdefault(self._root(conv), []).append(conv)
        reorders = Counter(self._root(c) for c in self.reorders)
        ties = 0 if self._rows_join_regions() else 1
        return {c for root, group in members.items()
                if len(group) < max(min_convs, reorders[root] + ties)
                or (depthwise_only and not self.depthwise & set(group))
                for c in group}

    def regions(self) -> list[list[g.Var]]:
        """The regions formed (their convolutions' original result vars), each in graph
        order, in the order of their first convolution."""
        members: dict[g.Var, list[g.Var]] = {}
        for conv in self.parent:
            members.setdefault(self._root(conv), []).append(conv)
        return list(members.values())

    def tuned_small(self, session: Any, small: set[g.Var],
                    layouts: dict[frozenset[g.Var], str]) -> set[g.Var]:
        """The convolutions of the regions left NCHW as `session` says (the
        `nchwc_region` knob, asked once per region; the rule's decision, `small`, is
        the default), `layouts` remembering each region's layout."""

        out: set[g.Var] = set()
        for group in self.regions():
            key = frozenset(group)
            if key not in layouts:
                rule = "NCHW" if key <= small else "NCHWc"
                params = session.knob(NCHWC_REGION, region_signature(
                    [self.convs[c] for c in group]), self.isa, {"layout": rule})
                layout = rule if params is None else params.get("layout")
                if layout not in LAYOUTS:
                    raise UsageError(f"{NCHWC_REGION}: layout must be one of "
                                     f"{', '.join(LAYOUTS)}, got {layout!r}")
                layouts[key] = layout
            if layouts[key] == "NCHW":
                out |= key
        return out

    def _root(self, conv: g.Var) -> g.Var:
        while self.parent[conv] is not conv:
            conv = self.parent[conv]
        return conv

    def _join_binding(self, b: g.Binding) -> None:
        """Record the region of `b` (now blocked): its blocked arguments' regions, merged,
        plus the binding itself when it is a convolution."""
        assert isinstance(b.value, g.Call)
        roots = list(dict.fromkeys(self._root(self.region[a]) for a in b.value.args
                                   if isinstance(a, g.Var) and a in self.region))
        if b.value.op in CONVS:
            self.parent[b.var] = b.var
            self.convs[b.var] = b.value
            if b.value.op == "conv2d_depthwise":
                self.depthwise.add(b.var)
            roots.append(b.var)
        for r in roots[1:]:
            self.parent[r] = roots[0]
        self.region[b.var] = roots[0]

    def run(self, fn: g.Function) -> g.Function:
        self.plain.update(fn.params)
        changed = False
        for b in fn.bindings:
            new = self._blocked_call(b) if isinstance(b.value, g.Call) else None
            if new is None:
                for arg in _vars_in(b.value):
                    self._materialize(arg)
                self.bindings.append(b)
                self.plain.add(b.var)
            else:
                changed = True
                var = g.Var(b.var.name + "_c", new.ret_type)
                self._join_binding(b)
                self.bindings.append(g.Binding(var, new))
                self.blocked[b.var] = var
        if not changed:
            return fn
        for arg in _vars_in(fn.result):
            self._materialize(arg)
        return g.Function(fn.params, tuple(self.bindings), fn.result, dict(fn.attrs))

    # ------------------------------------------------------------------ reorders

    def _materialize(self, var: g.Var) -> None:
        """Bind `var` (NCHW) from its blocked value before its first NCHW reader."""

        if var in self.plain or var not in self.blocked:
            return
        t = var.type
        assert isinstance(t, TensorType)
        value = call("layout_transform", self.blocked[var], src=self.layout, dst="NCHW",
                     channels=t.shape[1])
        if tuple(t.shape[2:]) != (1, 1):  # one value per channel (a pooled tensor) is free
            self.reorders.append(self.region[var])
        self.bindings.append(g.Binding(var, value))
        self.plain.add(var)

    def _to_blocked(self, x: g.Expr, conv: g.Var) -> g.Expr:
        """The NCHW{b}c value of `x` (reordered once per variable) for `conv`'s input."""

        if isinstance(x, g.Var) and x in self.blocked:
            return self.blocked[x]
        value = call("layout_transform", x, src="NCHW", dst=self.layout)
        self.reorders.append(conv)
        if not isinstance(x, g.Var):
            return value
        var = g.Var(x.name + "_c", value.ret_type)
        self.bindings.append(g.Binding(var, value))
        self.blocked[x] = var
        return var

    # ------------------------------------------------------------------ ops

    def _blocked_call(self, b: g.Binding) -> g.Call | None:
        c = b.value
        assert isinstance(c, g.Call)
        if c.op == "conv2d_blocked":
            return None if b.var in self.skip else self._conv(c, b.var)
        if c.op == "conv2d_gemm" and self.gemm:
            return None if b.var in self.skip else self._gemm(c, b.var)
        if c.op == "conv2d_rows" and (self._reads_nchw(c) or self._rows_join_regions()):
            return None if b.var in self.skip else self._rows(c, b.var)
        if c.op == "conv2d_depthwise":
            return None if b.var in self.skip else self._depthwise(c, b.var)
        if c.op == WINOGRAD:
            return None if b.var in self.skip else self._winograd(c, b.var)
        if not c.args or not _is_plain_4d(c.ret_type) or not any(
                isinstance(a, g.Var) and a in self.region for a in c.args):
            return None  # not fed by a region (an input only reordered for a convolution)
        pattern = get_op(c.op).pattern
        if c.op in CHANNEL_CONSTANT_OPS and self.isa.precision == "bf16" \
                and any(isinstance(a, g.Constant) for a in c.args):
            return self._channel_constants(c)
        if pattern in ("elemwise", "broadcast") and all(
                isinstance(a, g.Var) and a in self.blocked and _same_or_per_channel(
                    a.type, c.ret_type) for a in c.args):
            args = [self.blocked[a] for a in c.args if isinstance(a, g.Var)]
            if c.op == "multiply" and len(args) == 2 and c.args[0].type != c.args[1].type:
                # a per-channel scale (an SE block): one vector multiply per position
                x, s = args if c.args[0].type == c.ret_type else args[::-1]
                return call(CHANNEL_SCALE, x, s)
            return call(c.op, *args, **c.attrs)
        if c.op == "concat" and self._whole_blocks(c):
            # channel blocks are whole, so the blocked tensors concatenate block-wise
            return call("concat", *(self.blocked[a] for a in c.args if isinstance(a, g.Var)),
                        axis=1)
        if c.op == "global_avg_pool" and isinstance(c.args[0], g.Var) \
                and c.args[0] in self.blocked:
            # the mean of each lane over the image: [N][C/b][1][1][b]
            return call("reduce_mean", self.blocked[c.args[0]], axes=(2, 3), keepdims=True)
        if c.op in POOLS and isinstance(c.args[0], g.Var) and c.args[0] in self.blocked:
            return call(POOL_NCHWC, self.blocked[c.args[0]], pool=c.op, **c.attrs)
        if c.op == "lrn" and isinstance(c.args[0], g.Var) and self._lrn_blocks(c.args[0], c):
            return call(LRN_NCHWC, self.blocked[c.args[0]], **c.attrs,
                        roots=lrn_params(c.attrs)[1] == 0.75)
        return None

    def _lrn_blocks(self, x: g.Var, c: g.Call) -> bool:
        """Whether the `lrn` call `c` of `x` runs on its blocked input (`lrn_nchwc`): on the
        bfloat16 kernel's targets (`_rows_join_regions`), where it was measured, whose
        LRN already takes `s ** -0.75` by square roots (kiln.kernels.lrn). GoogLeNet's
        two LRN layers cut its stem (the first layer, a pool, a 1x1 and a 3x3 layer)
        into regions too small to pay, so those layers ran float32 NCHW between
        reorders. The padding channels stay zero through it where `bias` is positive
        (a zero scale would make them NaN, which the bfloat16 kernel's zero weights
        would spread)."""
        return self._rows_join_regions() and x in self.blocked \
            and isinstance(x.type, TensorType) and x.type.dtype == "float32" \
            and (lrn_params(c.attrs)[2] > 0 or x.type.shape[1] % self.block == 0)

    def _channel_constants(self, c: g.Call) -> g.Call | None:
        """`c` (elementwise) of blocked tensors of its result's type and constants of one
        value per channel (`[C][1][1]` or `[1][C][1][1]`: DenseNet's pre-activation
        BatchNorm, which no convolution folds) on NCHW{b}c, the constants reordered to
        `[1][C/b][1][1][b]` (padding channels zero), or None. Only on `precision=bf16`
        targets, where it was measured: there it keeps DenseNet-121 in NCHW{b}c regions
        (each dense layer's BatchNorm + ReLU read NCHW, so every layer cost a reorder and
        no region paid) and its convolutions on the bfloat16 kernel. Only ops that keep
        zero padding channels finite (`CHANNEL_CONSTANT_OPS`): the bfloat16 kernel
        multiplies the padding channels of a pair by zero weights, a NaN would spread."""
        out = c.ret_type
        if not (isinstance(out, TensorType) and out.ndim == 4
                and isinstance(out.shape[1], int)):
            return None
        channels = int(out.shape[1])
        args: list[g.Expr] = []
        for a in c.args:
            if isinstance(a, g.Var) and a in self.blocked and a.type == out:
                args.append(self.blocked[a])
            elif isinstance(a, g.Constant) and a.data.dtype == np.float32 and tuple(
                    a.data.shape) in ((channels, 1, 1), (1, channels, 1, 1)):
                flat = a.data.reshape(channels)
                blocked = dw.pack_bias(flat, self.block).reshape(1, -1, 1, 1, self.block)
                args.append(g.Constant(wo.record(blocked, wo.step(
                    "reshape", dw.pack_bias_origin(wo.step("reshape", wo.origin_of(a.data),
                                                        shape=(channels,)),
                                                channels, self.block),
                    shape=blocked.shape)), a.name))
            else:
                return None
        if not any(isinstance(a, g.Var) for a in args):
            return None
        if c.op == "multiply" and len(args) == 2 and isinstance(args[0], g.Var) != isinstance(
                args[1], g.Var):
            # the hand-built vector kernel: the generic 5-D broadcast runs one element at
            # a time (kiln.ops.channel_scale_nchwc); the Add and ReLU fuse into its store
            x, scale = args if isinstance(args[0], g.Var) else args[::-1]
            return call(CHANNEL_SCALE, x, scale)
        return call(c.op, *args, **c.attrs)

    def _whole_blocks(self, c: g.Call) -> bool:
        """Whether `c` (a concat) joins blocked tensors along channels that fill whole
        blocks (no padding channels between its parts)."""
        axis = c.attrs.get("axis", 0)
        return isinstance(axis, int) and axis % 4 == 1 and all(
            isinstance(a, g.Var) and a in self.blocked and isinstance(a.type, TensorType)
            and a.type.shape[1] % self.block == 0 for a in c.args)

    def _conv(self, c: g.Call, var: g.Var) -> g.Call | None:
        if not self.family.applies(c, self.isa):
            return None
        if self._reads_nchw(c):
            blocked = g.Call(c.op, c.args, g.freeze_attrs(
                {**c.attrs, NCHW_INPUT_BLOCK: self.block}), c.ret_type)
        else:
            blocked = g.Call(c.op, (self._to_blocked(c.args[0], var), *c.args[1:]), c.attrs,
                             c.ret_type)
        if self.bf16.applies(blocked, self.isa):  # a precision=bf16 target's NCHW{b}c layers
            return self.bf16.pack(blocked, self.isa)
        return self.family.pack(blocked, self.isa)

    def _reads_nchw(self, c: g.Call) -> bool:
        """Whether the convolution `c` reads its NCHW input in place: an input not
        blocked yet, of fewer channels than a block. Its NCHW{b}c copy would pad each
        position's channels to a whole block (3 to 16 for an RGB image), and a blocked
        tile's step reads one input value per position either way: the blocked kernel
        writing NCHW{b}c directly costs about what the first layer alone costs, the
        reorder after it is saved (docs/performance.md, "First layers and clipped pools
        in NCHW{b}c regions")."""
        x = c.args[0]
        t = x.type
        return not (isinstance(x, g.Var) and x in self.blocked) and _is_plain_4d(t) \
            and isinstance(t, TensorType) and isinstance(t.shape[1], int) \
            and t.shape[1] < self.block

    def _rows_join_regions(self) -> bool:
        """Whether every row-tiled convolution (ungrouped) joins the regions, as the
        bfloat16 NCHW{b}c kernel: on a `precision=bf16` AVX-512 target, where the
        reorders around a layer left NCHW and the float32 layers beside it cost more
        than its row tiles save (SqueezeNet's 3x3 expansions of 16 channels split its
        regions; docs/performance.md, "Reduced precision")."""
        return self.isa.precision == "bf16" and tile_lanes(self.isa) == 16

    def _rows(self, c: g.Call, var: g.Var) -> g.Call | None:
        """`c` (a `conv2d_rows`, `[co_block][ci][kh][kw][rows]` weight) as the blocked
        kernel's `conv2d_nchwc`."""

        w, channels = c.args[1], c.attrs.get("channels")
        if not isinstance(w, g.Constant) or not isinstance(channels, int):
            return None
        oihw = g.Constant(unpack_rows_weight(w.data, channels), w.name)
        wo.record(oihw.data, unpack_rows_origin(wo.origin_of(w.data), w.data.shape, channels))
        plain = g.Call("conv2d", (c.args[0], oihw, *c.args[2:]),
                       g.freeze_attrs({k: v for k, v in c.attrs.items()
                                       if k not in (TILE, "channels")}), c.ret_type)
        return self._plain_conv(plain, var)

    def _gemm(self, c: g.Call, var: g.Var) -> g.Call | None:
        """`c` (a `conv2d_gemm`, OIHW weight) as the blocked kernel's `conv2d_nchwc`."""

        plain = g.Call("conv2d", c.args, g.freeze_attrs(
            {k: v for k, v in c.attrs.items() if k != TILE}), c.ret_type)
        return self._plain_conv(plain, var)

    def _plain_conv(self, plain: g.Call, var: g.Var) -> g.Call | None:
        """`plain` (a `conv2d`, OIHW weight) as the blocked kernel's `conv2d_nchwc`."""

        direct = KERNELS.get("conv_direct")
        if not direct.applies(plain, self.isa):
            return None
        return self._conv(direct.pack(plain, self.isa), var)

    def _winograd(self, c: g.Call, var: g.Var) -> g.Call | None:
        """`c` (a `conv2d_winograd` of whole channel blocks) as `conv2d_winograd_nchwc`:
        the weight packed in panels (kiln.kernels.conv.winograd_nchwc)."""
        from kiln.kernels.conv.winograd import (
            takes,  # lazy: kiln.kernels.registry loads it on first use
        )

        x, u = c.args[0], c.args[1]
        if not (_is_plain_4d(x.type) and isinstance(u, g.Constant) and u.data.ndim == 3
                and takes(int(u.data.shape[2]), int(u.data.shape[1]), self.block)):
            return None  # checked before the input's reorder is recorded
        family = KERNELS.get("winograd_nchwc")
        blocked = g.Call(c.op, (self._to_blocked(x, var), *c.args[1:]), c.attrs, c.ret_type)
        if var in self.packs:  # packed in an earlier round (its weight is megabytes)
            done = self.packs[var]
            return g.Call(done.op, (blocked.args[0], *done.args[1:]), done.attrs, done.ret_type)
        if not family.applies(blocked, self.isa):
            return None
        self.packs[var] = family.pack(blocked, self.isa)
        return self.packs[var]

    def _depthwise(self, c: g.Call, var: g.Var) -> g.Call | None:
        """`c` (a `conv2d_depthwise`) as `conv2d_nchwc_depthwise`: weight and bias packed
        into whole channel blocks (kiln.ops.conv_nchwc_depthwise)."""
        from kiln.kernels.conv.nchwc_depthwise import (  # lazy: kiln.kernels.lowering loads it
            choose_tile_width,
            conv_geometry,
        )

        w = c.args[1]
        bias = c.args[2] if len(c.args) > 2 else None
        if not (_is_plain_4d(c.args[0].type) and isinstance(w, g.Constant)
                and (bias is None or isinstance(bias, g.Constant))):
            return None
        xt = c.args[0].type
        assert isinstance(xt, TensorType)
        x = self._to_blocked(c.args[0], var)
        channels = int(w.data.shape[0])
        attrs = {k: v for k, v in c.attrs.items() if k != "tile"}
        attrs["channels"] = channels
        shape = conv_geometry(xt.shape, attrs, tuple(w.data.shape[2:]))
        attrs["tile"] = (choose_tile_width(shape, self.isa),)
        args = [g.Constant(dw.pack_weight(w.data, self.block), w.name)]
        wo.record(args[0].data, dw.pack_weight_origin(wo.origin_of(w.data), w.data.shape,
                                                      self.block))
        if bias is not None:
            args.append(g.Constant(dw.pack_bias(bias.data, self.block), bias.name))
            wo.record(args[1].data, dw.pack_bias_origin(wo.origin_of(bias.data),
                                                        int(bias.data.shape[0]), self.block))
        return call(dw.NCHWC_DEPTHWISE, x, *args, **attrs)


#: The elementwise ops `_Rewriter._channel_constants` blocks with per-channel constants.
CHANNEL_CONSTANT_OPS = ("multiply", "add", "subtract")
#: The convolutions a blocked region counts (their original ops).
WINOGRAD = "conv2d_winograd"  # kiln.ops.winograd.WINOGRAD
CONVS = ("conv2d_blocked", "conv2d_depthwise", "conv2d_gemm", "conv2d_rows", WINOGRAD)
def k_blocked_small_images(func: g.Function, isa: ISA) -> set[g.Var]:
    """On ISAs whose 1x1 NCHWc layers take the pointwise kernel (AVX2:
    kiln.kernels.conv.nchwc.pointwise_kernel), the ungrouped convolutions
    (`conv2d_blocked`, `conv2d_gemm`) on images of at most `SMALL_IMAGE_POSITIONS` output
    positions whose sums the blocked kernel K-blocks (kiln.kernels.conv.direct.
    choose_k_blocking: ResNet-50's and DenseNet-121's 7x7 stages); none elsewhere. The
    pass leaves them NCHW outside regions holding a depthwise convolution. In NCHW{b}c
    the blocked kernel's K-blocked loop divides every input channel index by the block,
    and a strided 1x1 layer reads half of each cache line in place where NCHW subsamples
    it first, so these layers run slower in NCHW{b}c (docs/performance.md, "AVX2 round
    six (Zen 3)"). The stride-1 1x1 layers go
    with them, so that the stage is one NCHW run rather than reorders around each 3x3
    layer (which made DenseNet-121's whole region fail `small_regions`)."""
    from kiln.kernels.conv.direct import (  # lazy: kiln.kernels.registry loads it on first use
        SMALL_IMAGE_POSITIONS,
        choose_k_blocking,
    )
    from kiln.kernels.conv.nchwc import (
        pointwise_kernel,  # lazy: kiln.kernels.registry loads it on first use
    )

    if not pointwise_kernel(isa):
        return set()
    out: set[g.Var] = set()
    for b in func.bindings:
        c = b.value
        if not (isinstance(c, g.Call) and c.op in ("conv2d_blocked", "conv2d_gemm")
                and _is_plain_4d(c.args[0].type)):
            continue
        shape = call_conv_shape(c.op, [a.type for a in c.args], c.attrs)
        if shape is None or shape.groups != 1 \
                or shape.out_h * shape.out_w > SMALL_IMAGE_POSITIONS:
            continue
        if choose_k_blocking(shape, choose_tiling(shape, tile_lanes(isa),
                                                  tile_registers(isa)), isa) is not None:
            out.add(b.var)
    return out


#: A region's layouts (the `nchwc_region` knob's params).
LAYOUTS = ("NCHWc", "NCHW")


def region_signature(convs: list[g.Call]) -> str:
    """The `nchwc_region` signature of a region of `convs` (in graph order): each one's
    source convolution as its geometry (input shape, output channels, kernel, strides,
    dilations, pads, groups, bias), whatever kernel family packed it, so equal regions
    in one or two models share a record."""

    parts = []
    for c in convs:
        s = call_conv_shape(c.op, [a.type for a in c.args], c.attrs)
        assert s is not None
        parts.append(f"conv2d(float32[{s.n},{s.c_in},{s.h},{s.w}];{s.c_out}x{s.kh}x{s.kw})"
                     f"{{s={s.stride[0]},{s.stride[1]};d={s.dilation[0]},{s.dilation[1]};"
                     f"p={','.join(map(str, s.pads))};g={s.groups}"
                     f"{';bias' if len(c.args) > 2 else ''}}}")
    return "|".join(parts)


def _same_or_per_channel(t: Any, out: Any) -> bool:
    """Whether operand type `t` of an elementwise op with result type `out` is `out`
    itself or one value per channel (`[N][C][1][1]`, an SE block's scale): blocked,
    both broadcast as their NCHW forms do."""
    if t == out:
        return True
    return isinstance(t, TensorType) and isinstance(out, TensorType) and t.ndim == 4 \
        and t.shape[:2] == out.shape[:2] and t.shape[2:] == (1, 1) and t.dtype == out.dtype


def _is_plain_4d(t: Any) -> bool:
    return isinstance(t, TensorType) and t.ndim == 4 and t.dtype == "float32" and all(
        isinstance(d, int) for d in t.shape[1:])


def _vars_in(expr: g.Expr) -> list[g.Var]:
    return list(dict.fromkeys(graph_vars_used(expr)))

"""Elementwise kernels that take their channel count at run time.

A network whose elementwise chains run over many channel counts at one image size
(DenseNet-121's BatchNorm and ReLU after each concatenation: 61 widths, 64 to 1024
channels at four sizes) compiled one kernel per width, each its own LLVM work, though
they differ only in the bound of their outer loop. kiln.transform.fuse_ops builds such a
group's kernel over a dimension variable `CHANNELS_NAME` in place of the output's axis 1
(NCHW's channels, NCHW{b}c's channel blocks) wherever two groups of the module differ
only in that extent: every operand's aligned axis of that extent takes the variable (a
per-channel scale `[C][1][1]` as much as the activation), and each call passes its
extent as a scalar argument (`ATTR_ARG_DIMS`, kiln.transform.lower_graph). The
elements are computed as in the static kernel, one at a time: the outputs are the same
bit for bit. The inner axes stay static, so the loops over an image keep their static
extents (flattened and vectorized as before).

Only elementwise and broadcast chains qualify (none whose attributes name a shape or an
axis: `broadcast_to`, `prelu`, the quantizers' per-axis scales), and ops built by hand
where their lowering says `run_time_channels` (the NCHW and NCHW{b}c channel scales,
kiln.kernels.conv.channel_scale: EfficientNet-B0's squeeze-and-excitation scales), of
static shapes of three dims or more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kiln.ir import graph as g
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.shape_expr import is_static
from kiln.ir.tensor import Var
from kiln.ir.types import TensorType
from kiln.kernels.lowering import lowering_for
from kiln.transform.fuse_rule import FUSABLE_TAIL, pattern

#: The dimension scalar such a kernel takes: the extent of its output's axis `AXIS`.
CHANNELS_NAME = "kiln_ew_channels"
AXIS = 1
#: Elementwise/broadcast ops whose attributes name a shape or an axis.
_SHAPED = frozenset({"broadcast_to", "prelu", "quantize_linear", "dequantize_linear"})
#: Marks the run-time extent in a group's operand key.
_MARK = "run-time channels"


@dataclass(frozen=True)
class RunTimeChannels:
    """A group's operands over the run-time channel count: `types` the externals' types
    with the variable in place of the extent, `key` those types as the group's operand
    key, `dims` the kernel's `ATTR_ARG_DIMS` (the variable read from an operand's axis)."""

    types: tuple[TensorType, ...]
    key: tuple[object, ...]
    dims: tuple[tuple[str, int, int], ...]


def run_time_channels(group: Sequence[g.Binding], externals: Sequence[g.Expr]
                      ) -> RunTimeChannels | None:
    """The operands of `group`'s kernel over a run-time channel count (module
    docstring), or None where the group does not qualify."""
    out = group[-1].var.type
    if not isinstance(out, TensorType) or out.ndim <= AXIS + 1 or not is_static(out.shape):
        return None
    extent = out.shape[AXIS]
    if not isinstance(extent, int) or extent < 2:
        return None
    for b in group:
        call = b.value
        if not isinstance(call, g.Call):
            return None
        lowering = lowering_for(call.op)
        if lowering is not None:  # a kernel built by hand: where it says it may
            if not getattr(lowering, "run_time_channels", False):
                return None
        elif pattern(call.op) not in FUSABLE_TAIL or call.op in _SHAPED:
            return None
    var = Var(CHANNELS_NAME, INDEX_DTYPE)
    types: list[TensorType] = []
    key: list[object] = []
    dims: tuple[tuple[str, int, int], ...] = ()
    for k, e in enumerate(externals):
        t = e.type
        if not isinstance(t, TensorType) or t.ndim > out.ndim or not is_static(t.shape):
            return None
        axis = AXIS - (out.ndim - t.ndim)  # broadcasting aligns the trailing axes
        if axis < 0 or t.shape[axis] == 1:
            types.append(t)
            key.append(t)
            continue
        if t.shape[axis] != extent:
            return None
        shape = list(t.shape)
        shape[axis] = var
        types.append(TensorType(tuple(shape), t.dtype))
        key.append((_MARK, axis, tuple(shape[:axis]), tuple(shape[axis + 1:]), t.dtype))
        if not dims:
            dims = ((CHANNELS_NAME, k, axis),)
    if not dims:
        return None
    return RunTimeChannels(tuple(types), tuple(key), dims)


__all__ = ["AXIS", "CHANNELS_NAME", "RunTimeChannels", "run_time_channels"]

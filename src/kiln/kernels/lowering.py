"""The one door to hand-built kernels: `lowering_for(op)`.

A `Lowering` builds the kernel of calls of one op for a given ISA, alone (`legalize_call`)
or with the elementwise chain FuseOps grouped around it (`lower_fused`). `LOWERINGS`
maps op names to them, lazily ("module:attr"), so that only the families a model uses
are imported; each family's section of `_LAZY` lists its ops.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from kiln._registry import Registry
from kiln.ir import graph as g
from kiln.ir.shape_expr import is_static
from kiln.ir.tensor import PrimFunc
from kiln.ir.types import TensorType
from kiln.kernels import specialisation
from kiln.ops import te
from kiln.ops.registry import get_op
from kiln.target.isa import ISA


@runtime_checkable
class Lowering(Protocol):
    """The hand-built kernel of one op (see the module docstring)."""

    #: Whether `lower_fused` accepts symbolic dims (it may still return None for them).
    supports_symbolic: bool
    #: Whether FuseOps may fuse an elementwise chain producing the op's first input into
    #: the kernel, not only one consuming its result (the row ops).
    fuses_producers: bool

    def builds(self, call: g.Call) -> bool:
        """Whether the kernel applies to `call` (decided from its types and attributes,
        without building it); `lower_fused` may still decline a fused chain."""
        ...

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Mapping[str, Any], anchor: te.Tensor | None,
                    result: te.Tensor | None, name: str, isa: ISA) -> PrimFunc | None:
        """The kernel for `isa` computing `result` (an elementwise chain over `anchor`,
        the op applied to `args`; None: the op alone) with buffer parameters `params` +
        the output, or None when it does not apply."""
        ...


LOWERINGS: Registry[Lowering] = Registry("hand-built lowering")

# op name -> "module:attr" of its lowering, by family.
_LAZY: dict[str, str] = {
    # gemm (kiln.kernels.gemm)
    "matmul_packed": "kiln.kernels.gemm.lowering:MATMUL_PACKED",
    "matmul_packed_bf16": "kiln.kernels.gemm.lowering:MATMUL_PACKED_BF16",
    "matmul_packed_f16": "kiln.kernels.gemm.lowering:MATMUL_PACKED_F16",
    "matmul_tiled_bf16": "kiln.kernels.gemm.lowering:MATMUL_TILED_BF16",
    "matmul_tiled": "kiln.kernels.gemm.lowering:MATMUL_TILED",
    "matmul_gemv": "kiln.kernels.gemm.lowering:MATMUL_GEMV",
    "cblas_matmul": "kiln.kernels.gemm.cblas:CBLAS_MATMUL",
    "matmul_nbits_packed": "kiln.kernels.gemm.nbits:MATMUL_NBITS_PACKED",
    "attention_tiled": "kiln.kernels.gemm.attention_blocks:ATTENTION_TILED",
    "attention_tiled_bf16": "kiln.kernels.gemm.attention_blocks:ATTENTION_TILED_BF16",

    # conv (kiln.kernels.conv)
    "conv2d_blocked": "kiln.kernels.conv.lowering:BLOCKED",
    "conv2d_depthwise": "kiln.kernels.conv.lowering:DEPTHWISE",
    "conv2d_rows": "kiln.kernels.conv.lowering:ROWS",
    "conv2d_nchwc": "kiln.kernels.conv.lowering:NCHWC",
    "conv2d_gemm": "kiln.kernels.conv.lowering:GEMM",
    "conv2d_group_gemm": "kiln.kernels.conv.lowering:GROUP_GEMM",
    "conv2d_winograd": "kiln.kernels.conv.lowering:WINOGRAD",
    "conv2d_winograd_nchwc": "kiln.kernels.conv.lowering:WINOGRAD_NCHWC",
    "conv2d_nchwc_depthwise": "kiln.kernels.conv.nchwc_depthwise:NCHWC_DEPTHWISE",
    "conv2d_nchwc_bf16": "kiln.kernels.conv.bf16:LOWERING",
    "multiply": "kiln.kernels.conv.channel_scale:CHANNEL_SCALE",
    "channel_scale_nchwc": "kiln.kernels.conv.channel_scale:CHANNEL_SCALE_NCHWC",

    # int8 (kiln.kernels.int8)
    "qlinear_matmul_packed": "kiln.kernels.int8.matmul:TILED_MATMUL",
    "matmul_integer_packed": "kiln.kernels.int8.matmul:TILED_INTEGER",
    "dynamic_quant_matmul_packed": "kiln.kernels.int8.dynamic:DYNAMIC_TILED_MATMUL",
    "qlinear_conv_dot": "kiln.kernels.int8.conv_dot:TILED_CONV",
    "qlinear_conv_grouped": "kiln.kernels.int8.grouped:GROUPED_CONV",
    "qlinear_add": "kiln.kernels.int8.elementwise:FLAT_ADD",
    "qlinear_global_average_pool": "kiln.kernels.int8.pool_words:WORDS_AVERAGE",
    "qlinear_concat": "kiln.kernels.int8.elementwise:CONCAT_RUNS",
    "conv2d_mlas": "kiln.kernels.int8.mlas_conv:MLAS_CONV",

    # rows (kiln.kernels.rows)
    "softmax": "kiln.kernels.rows.lowering:SOFTMAX",
    "log_softmax": "kiln.kernels.rows.lowering:LOG_SOFTMAX",
    "layer_norm": "kiln.kernels.rows.lowering:LAYER_NORM",
    "reduce_sum": "kiln.kernels.rows.reduce:REDUCE_SUM",
    "reduce_mean": "kiln.kernels.rows.reduce:REDUCE_MEAN",
    "reduce_max": "kiln.kernels.rows.reduce:REDUCE_MAX",
    "reduce_min": "kiln.kernels.rows.reduce:REDUCE_MIN",
    "reduce_prod": "kiln.kernels.rows.reduce:REDUCE_PROD",
    "reduce_l1": "kiln.kernels.rows.reduce:REDUCE_L1",
    "reduce_l2": "kiln.kernels.rows.reduce:REDUCE_L2",
    "reduce_sum_square": "kiln.kernels.rows.reduce:REDUCE_SUM_SQUARE",
    "reduce_log_sum": "kiln.kernels.rows.reduce:REDUCE_LOG_SUM",
    "global_avg_pool": "kiln.kernels.rows.reduce:GLOBAL_AVG_POOL",
    "global_max_pool": "kiln.kernels.rows.reduce:GLOBAL_MAX_POOL",

    # lrn (kiln.kernels.lrn)
    "lrn": "kiln.kernels.lrn:LRN",
    "lrn_nchwc": "kiln.kernels.lrn:LRN_NCHWC",

    # pool (kiln.kernels.pool)
    "max_pool2d": "kiln.kernels.pool.lowering:MAX_POOL2D",
    "avg_pool2d": "kiln.kernels.pool.lowering:AVG_POOL2D",
    "pool2d_nchwc": "kiln.kernels.pool.lowering:POOL2D_NCHWC",

    # layout (kiln.kernels.layout_reorder)
    "layout_transform": "kiln.kernels.layout_reorder:LAYOUT_REORDER",
}
for _op, _where in _LAZY.items():
    LOWERINGS.register(_op, lazy=_where)


def lowering_for(op: str) -> Lowering | None:
    """The hand-built lowering of `op`, or None (its tensor-expression definition)."""
    return LOWERINGS.get(op) if op in LOWERINGS else None


def legalize_call(call: g.Call, lowering: Lowering, isa: ISA) -> tuple[PrimFunc, str]:
    """The kernel of `call` alone: `lowering`'s for `isa` where it builds one (static
    shapes unless it `supports_symbolic`), else the op's tensor-expression definition."""
    opdef = get_op(call.op)
    types = [a.type for a in call.args]
    assert all(isinstance(t, TensorType) for t in types), call.op
    if lowering.supports_symbolic or all(is_static(t.shape) for t in types):  # type: ignore[union-attr]
        inputs = [te.placeholder(t.shape, t.dtype, f"x{k}")  # type: ignore[union-attr]
                  for k, t in enumerate(types)]
        prim = lowering.lower_fused(inputs, inputs, call.attrs, None, None, opdef.name, isa)
        if prim is not None:
            return prim, opdef.name
    if specialisation.active():
        specialisation.note_lowering(call, lowering)
    return opdef.legalize(call)

"""The int8 kernel families of the kernel registry (kiln.kernels.registry, `select`):
which packed op a quantized product becomes on a target, and its packing
(kiln.kernels.int8.packing).

- `qlinear_matmul` -> `qlinear_matmul_packed` (INT8_MATMUL);
- `qlinear_conv` -> `qlinear_conv_dot` (the dot form: one group, int8 weights, a target
  with a dot product; INT8_CONV_DOT), else `qlinear_conv_grouped` (more than one group;
  INT8_CONV_GROUPED), else `qlinear_conv_packed` (INT8_CONV);
- `matmul_integer` -> `matmul_integer_packed` (INT8_MATMUL_INTEGER);
- `dynamic_quant_matmul` -> `dynamic_quant_matmul_packed` (INT8_DYNAMIC_MATMUL).

The quantize-ops pass (kiln.transform.quantize_ops) asks `select(call, isa)` for the
family of each such call and packs it with the family's `pack`. A family's `build` is
its op's lowering (kiln.kernels.lowering.lowering_for), None where the op has none
(`qlinear_conv_packed`: its tensor-expression definition).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.ir import graph as g
from kiln.ir.tensor import PrimFunc
from kiln.kernels.int8.packing import (
    applies,
    dynamic_applies,
    pack_dynamic,
    pack_matmul_integer,
    pack_product,
    plan,
)
from kiln.kernels.lowering import lowering_for
from kiln.kernels.registry import Family
from kiln.ops.quant_conv_words import CONV_DOT
from kiln.ops.quant_dynamic import DYNAMIC, PACKED
from kiln.ops.quant_packed import CONV, GROUPED, INTEGER, MATMUL
from kiln.target.isa import ISA


@dataclass(frozen=True)
class Int8Family(Family):
    """A family whose `build` is its op's lowering."""

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        """The kernel of a call of `op` (its lowering's), or None (no lowering: the te
        definition)."""
        lowering = lowering_for(self.op)
        if lowering is None:
            return None
        return lowering.lower_fused(params, args, attrs, anchor, result, self.op, isa)


@dataclass(frozen=True)
class ProductFamily(Int8Family):
    """A `qlinear_conv` / `qlinear_matmul` packed as `op` (`plan` picks the op)."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        """Whether `call` is packed on `isa`, as this family's op."""
        p = plan(call, isa)
        return p is not None and p.op == self.op

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        """`call` as its packed op."""
        p = plan(call, isa)
        assert p is not None and p.op == self.op, call.op
        return pack_product(p)


@dataclass(frozen=True)
class MatmulIntegerFamily(Int8Family):
    """`matmul_integer` with a constant B: `matmul_integer_packed`."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        """Whether B and its zero point are constants (B 2-D)."""
        return call.op == "matmul_integer" and applies(call)

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        """`call` as `matmul_integer_packed`."""
        return pack_matmul_integer(call, isa)


@dataclass(frozen=True)
class DynamicMatmulFamily(Int8Family):
    """`dynamic_quant_matmul` with a constant B: `dynamic_quant_matmul_packed`."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        """Whether B and its zero point are constants (B 2-D)."""
        return dynamic_applies(call)

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        """`call` as `dynamic_quant_matmul_packed`."""
        return pack_dynamic(call, isa)


INT8_MATMUL = ProductFamily("int8_matmul", MATMUL, ("qlinear_matmul",), 0)
INT8_CONV_DOT = ProductFamily("int8_conv_dot", CONV_DOT, ("qlinear_conv",), 0)
INT8_CONV_GROUPED = ProductFamily("int8_conv_grouped", GROUPED, ("qlinear_conv",), 1)
INT8_CONV = ProductFamily("int8_conv", CONV, ("qlinear_conv",), 2)
INT8_MATMUL_INTEGER = MatmulIntegerFamily("int8_matmul_integer", INTEGER, ("matmul_integer",),
                                          0)
INT8_DYNAMIC_MATMUL = DynamicMatmulFamily("int8_dynamic_matmul", PACKED, (DYNAMIC,), 0)

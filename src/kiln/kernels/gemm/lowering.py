"""The lowering of the float32 matrix products (`matmul_packed`, `matmul_tiled`,
`matmul_gemv`, kiln.ops.gemm): each is built by its kernel family (kiln.kernels.gemm
.families: `gemm`, `gemm_tiled`; kiln.kernels.gemm.gemv_family: `gemv`), alone or with
the elementwise tail FuseOps grouped after the product applied as each output is
stored.

`matmul_packed` also takes symbolic rows (M = batch*seq): static tiles, a symbolic
tile count, and a last tile clamped to the rows there are.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.ir import graph as g
from kiln.ir.tensor import PrimFunc
from kiln.kernels.epilogue import float32_operands
from kiln.kernels.registry import build_call, family_of
from kiln.ops import te
from kiln.ops.gemm import GEMV, PACKED, TILED
from kiln.ops.gemm_bf16 import PACKED_BF16, TILED_BF16
from kiln.ops.gemm_f16 import PACKED_F16
from kiln.target.isa import ISA


@dataclass(frozen=True)
class GemmLowering:
    """The kernel of calls of `op` (a kiln.kernels.lowering.Lowering): its family's
    (kiln.kernels.registry.family_of), with the parallel split, K blocking and K
    unroll the call records (build_call)."""

    op: str
    supports_symbolic: bool = True
    fuses_producers: bool = False

    def builds(self, call: g.Call) -> bool:
        """Every call: `lower_fused` declines what the kernel does not take."""
        return True

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Mapping[str, Any], anchor: te.Tensor | None,
                    result: te.Tensor | None, name: str, isa: ISA) -> PrimFunc | None:
        """The GEMM kernel (see kiln.kernels.lowering.Lowering.lower_fused); None for
        operands or a result other than float32."""
        # The packed weights of the reduced-precision forms are not float32.
        if not float32_operands(args[:1 if self.op in (PACKED_BF16, PACKED_F16) else 2], result):
            return None
        return build_call(family_of(self.op), params, args, attrs, anchor, result, isa)


MATMUL_PACKED = GemmLowering(PACKED)
MATMUL_TILED = GemmLowering(TILED)
MATMUL_GEMV = GemmLowering(GEMV)
MATMUL_PACKED_BF16 = GemmLowering(PACKED_BF16)
MATMUL_PACKED_F16 = GemmLowering(PACKED_F16)
MATMUL_TILED_BF16 = GemmLowering(TILED_BF16)

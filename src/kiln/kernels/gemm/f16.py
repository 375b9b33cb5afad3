"""The float16-weight GEMM (`matmul_packed_f16`, kiln.ops.gemm_f16): float32 A by float16
weights packed at compile time, for targets with `precision=f16`
(kiln.target.precision).

The float32 GEMM's kernel (kiln.kernels.gemm.families), its register tiles and
schedule unchanged, on panels of float16: each B vector is widened to float32 as it is
loaded (kiln.kernels.gemm.families reads any packed B through `astype("float32")`;
the llvm backend emits F16C's `vcvtph2ps` where the target has it), then multiplied and
summed in float32. The weights take half the bytes of float32 ones, which is what a
product bound by reading its weights (a dense layer at batch 1, a decoder's GEMVs)
gains; products bound by the multiply-adds run at about the float32 kernel's speed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.ir import graph as g
from kiln.ir import weight_origin as wo
from kiln.kernels.gemm.families import PackedGemm, constant_b
from kiln.ops.gemm_f16 import pack_b_f16
from kiln.target.isa import ISA


@dataclass(frozen=True)
class F16Gemm(PackedGemm):
    """`matmul(a, B)` with B constant on a `precision=f16` target ->
    `matmul_packed_f16(a, bp)`, tile `(mr, nr)` chosen as the float32 GEMM's."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        return isa.precision == "f16" and constant_b(call)

    def pack_weights(self, data: Any, source: wo.Origin | None, nr: int) -> Any:
        half = wo.step("astype", source, dtype="float16")
        return wo.record(pack_b_f16(data, nr), wo.pack_panels(half, data.shape, nr))


GEMM_F16 = F16Gemm("gemm_f16", "matmul_packed_f16", ("matmul",), -1)

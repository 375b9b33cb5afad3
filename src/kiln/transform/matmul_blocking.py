"""BlockMatmuls: put float32 matrix products on the GEMM micro-kernel.

A `matmul` with float32 operands becomes

- `matmul_packed(a, bp)` when B is one constant matrix (a dense layer's weight,
  with Gemm's `transpose_b` applied): B is packed here, at compile time, into
  panels `[ceil(N / nr)][K][nr]` for the register tile the target and the
  product's row count call for (kiln.kernels.gemm.families.choose_tile), so
  the run time never repacks;
- `matmul_gemv(a, b)` when B is one constant matrix stored `[N][K]` (Gemm's
  `transB`) and A has one row (a dense layer at batch 1): the kernel reads B in
  place, so the weight stays the importer's array (no packed copy);
- `matmul_nbits_packed(a, bp, ...)` for a `matmul_nbits` (block-quantized 4-/8-bit
  weights): its operands repacked into panels of the target's vectors
  (kiln.kernels.gemm.nbits);
- `matmul_tiled(a, b)` when both operands have rank >= 2 and B is not one
  constant matrix (attention's batched products): its kernel packs B at run
  time.

Each rewritten call records its register tile in its `tile` attribute, which
lowering reads (kiln.kernels): the rule's, or a tuning database's
(kiln.tuning.apply). The kernels are in kiln.kernels.gemm;
docs/performance.md, "Matrix products", describes them. The pass runs before
fuse-ops, which fuses the elementwise tail (Gemm's alpha and bias, activations,
a residual add) into the new op's kernel, and after use-cblas (a target that asks
for CBLAS keeps it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.ir import graph as g
from kiln.ir.module import IRModule
from kiln.kernels.registry import select
from kiln.kernels.search import pack
from kiln.ops.quant_nbits import MATMUL_NBITS
from kiln.target.isa import ISA
from kiln.transform.functor import SharedPacking, rewrite_calls
from kiln.transform.kernel_isa import kernel_isa
from kiln.transform.pass_base import FunctionPass
from kiln.tuning.apply import Session, current


@dataclass(frozen=True)
class BlockMatmuls(FunctionPass):
    """Rewrite float32 `matmul` calls to `matmul_packed` / `matmul_gemv` /
    `matmul_tiled`, the family chosen by kiln.kernels.registry for the current
    target's ISA."""

    name = "block-matmuls"
    level = "graph"

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> g.Function:
        assert isinstance(func, g.Function)

        isa, session = kernel_isa(), current()
        return rewrite_calls(func, SharedPacking(lambda call: _rewrite(call, isa, session)))


def _rewrite(call: g.Call, isa: ISA, session: Session | None) -> g.Call | None:
    family = select(call, isa) if call.op in ("matmul", MATMUL_NBITS) else None
    return pack(family, call, isa, session) if family is not None else None

"""BlockMatmuls: put float32 matrix products on the GEMM micro-kernel.

A `matmul` with float32 operands becomes

- `matmul_packed(a, bp)` when B is one constant matrix (a dense layer's weight,
  with Gemm's `transpose_b` applied): B is packed here, at compile time, into
  panels `[ceil(N / nr)][K][nr]` for the register tile the target and the
  product's row count call for (kiln.ops.gemm_kernels.choose_gemm_tiling), so
  the run time never repacks;
- `matmul_gemv(a, b)` when B is one constant matrix stored `[N][K]` (Gemm's
  `transB`) and A has one row (a dense layer at batch 1): the kernel reads B in
  place, so the weight stays the importer's array (no packed copy);
- `matmul_tiled(a, b)` when both operands have rank >= 2 and B is not one
  constant matrix (attention's batched products): its kernel packs B at run
  time.

The kernels are in kiln.ops.gemm_kernels; docs/performance.md, "Matrix
products", describes them. The pass runs before fuse-ops, which fuses the
elementwise tail (Gemm's alpha and bias, activations, a residual add) into the
new op's kernel, and after use-cblas (a target that asks for CBLAS keeps it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.ir import graph as g
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType
from kiln.transform.functor import rewrite_calls
from kiln.transform.pass_base import FunctionPass


@dataclass(frozen=True)
class BlockMatmuls(FunctionPass):
    """Rewrite float32 `matmul` calls to `matmul_packed` / `matmul_tiled`."""

    name = "block-matmuls"
    level = "graph"

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> g.Function:
        assert isinstance(func, g.Function)
        return rewrite_calls(func, _rewrite)


def _f32(t: Any) -> bool:
    return isinstance(t, TensorType) and t.dtype == "float32"


def _rank(t: Any) -> int:
    return t.ndim if isinstance(t, TensorType) else 0


def _rewrite(call: g.Call) -> g.Call | None:
    from kiln.ops import gemm
    from kiln.ops import gemm_kernels as gk

    if call.op != "matmul" or len(call.args) != 2:
        return None
    a, b = call.args
    if (isinstance(b, g.Constant) and b.data.ndim == 2 and isinstance(a.type, TensorType)
            and a.type.dtype == "float32" == b.type.dtype and a.type.ndim >= 1
            and isinstance(a.type.shape[-1], int)):
        # Constant B: A's rows may be symbolic (M = batch*seq); the tile is static.
        m = 1
        for d in a.type.shape[:-1]:
            m *= d if isinstance(d, int) else gemm.TYPICAL_ROWS
        static_rows = all(isinstance(d, int) for d in a.type.shape)
        if static_rows and m == 1 and call.attrs.get("transpose_b") \
                and b.data.flags.c_contiguous:
            return g.Call(gemm.GEMV, call.args, call.attrs, call.ret_type)
        data = b.data.T if call.attrs.get("transpose_b") else b.data
        n = data.shape[1]
        tiling = gemm.target_tiling(m, n)
        packed = g.Constant(gk.pack_b(data, tiling.nr), b.name)
        return g.Call(gemm.PACKED, (a, packed), g.freeze_attrs({"n": n}), call.ret_type)
    # Both operands activations (attention): dims may be symbolic (batch, seq); the
    # kernel keeps static tiles over symbolic rows, panels and depth.
    if _f32(a.type) and _f32(b.type) and min(_rank(a.type), _rank(b.type)) >= 2:
        return g.Call(gemm.TILED, call.args, call.attrs, call.ret_type)
    return None

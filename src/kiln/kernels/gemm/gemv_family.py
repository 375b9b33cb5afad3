"""The GEMV family: `matmul(a, B^T)` with one row of A and B a constant stored
`[N][K]` -> `matmul_gemv(a, b)`, read in place by kiln.kernels.gemm.gemv.

Its tile `(rows, width)` is `GEMV_ROWS` rows of B by `GEMV_VECTORS` vectors of K.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.attrs import ATTR_GEMM_KERNEL, ATTR_PARALLEL_DECIDED
from kiln.ir.shape_expr import is_static
from kiln.ir.tensor import PrimFunc
from kiln.ir.types import TensorType
from kiln.kernels.epilogue import fused_store
from kiln.kernels.gemm import gemv as gv
from kiln.kernels.gemm.families import constant_b
from kiln.kernels.registry import Family
from kiln.kernels.tiles import tile_lanes
from kiln.ops.packed_attrs import TILE, recorded_tile
from kiln.target.isa import ISA


@dataclass(frozen=True)
class Gemv(Family):
    """See the module docstring."""

    def applies(self, call: g.Call, isa: ISA) -> bool:
        if not constant_b(call) or not call.attrs.get("transpose_b"):
            return False
        a, b = call.args
        assert isinstance(a.type, TensorType) and isinstance(b, g.Constant)
        return (is_static(tuple(a.type.shape)) and all(d == 1 for d in a.type.shape[:-1])
                and bool(b.data.flags.c_contiguous))

    def pack(self, call: g.Call, isa: ISA) -> g.Call:
        tile = (gv.GEMV_ROWS, gv.GEMV_VECTORS * tile_lanes(isa))
        return g.Call(self.op, call.args, g.freeze_attrs({**call.attrs, TILE: tile}),
                      call.ret_type)

    def build(self, params: Sequence[Any], args: Sequence[Any], attrs: Mapping[str, Any],
              anchor: Any, result: Any, isa: ISA) -> PrimFunc | None:
        a, b = args[0], args[1]
        if not is_static((*a.shape, *b.shape)) or not attrs.get("transpose_b") \
                or b.ndim != 2 or any(d != 1 for d in a.shape[:-1]):
            return None
        n, k = (int(d) for d in b.shape)
        store = fused_store(params, anchor, result, (*a.shape[:-1], n))
        if store is None:
            return None
        tile = recorded_tile(attrs, 2, self.op)
        if tile and (tile[0] != gv.GEMV_ROWS or tile[1] % gv.GEMV_VECTORS):
            raise IRError(f"{self.op}: tile {tile} must be ({gv.GEMV_ROWS}, a multiple of "
                          f"{gv.GEMV_VECTORS} lanes)")
        lanes = tile[1] // gv.GEMV_VECTORS if tile else tile_lanes(isa)
        body = gv.gemv_body(k, n, store.buffers[a], store.buffers[b], store.out,
                            store.epilogue, lanes, isa.fma, isa=isa)
        return PrimFunc((*(store.buffers[t] for t in params), store.out), body,
                        {ATTR_GEMM_KERNEL: self.op, ATTR_PARALLEL_DECIDED: True})


GEMV = Gemv("gemv", "matmul_gemv", ("matmul",), 0)

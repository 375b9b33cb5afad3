"""Matrix-product operators lowered by the GEMM micro-kernel of `kiln.ops.gemm_kernels`.

The `block-matmuls` graph pass (kiln.transform.matmul_blocking) rewrites float32
`matmul` calls into these, so the choice is visible in the graph (and in its
kiln.script text):

- `matmul_packed(a, bp)`: B is a constant packed at compile time into panels
  `[ceil(N / nr)][K][nr]` (`gemm_kernels.pack_b`, zero-padded), attribute `n`
  the real column count; `a` is `[..., K]` (all leading dims are rows), the
  result `[..., n]`. Gemm's `transB` is applied while packing.
- `matmul_gemv(a, b)`: a matrix-vector product (A has one row) with B a constant
  stored `[N][K]` (Gemm's `transB`, attribute `transpose_b`), read in place by
  `gemv_kernels.gemv_body`: the weight is not packed, so it is not copied;
- `matmul_tiled(a, b)`: both operands are activations of rank >= 2 (attention's
  Q @ K^T and P @ V, batch dims broadcast); same attributes and meaning as
  `matmul`; the kernel packs B into a workspace at run time.

Both keep `matmul`'s numpy reference and tensor-expression definition (used when
the kernel does not apply, e.g. for another dtype). `legalize` builds the
kernel; `lower_fused` builds it with the elementwise tail FuseOps grouped after
the product (Gemm's alpha and bias, ReLU/Clip/Sigmoid/..., a residual add)
applied as each output is stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from kiln.errors import IRError
from kiln.ir.tensor import PrimExpr, PrimFunc
from kiln.ir.types import TensorType, Type
from kiln.kernels.gemm import micro_kernel as gk
from kiln.ops import te
from kiln.ops.epilogue import float32_operands
from kiln.ops.kernels.registry import checking_tile, recorded_tile
from kiln.ops.nn import matmul_compute, matmul_infer, matmul_ref
from kiln.ops.registry import OPS, HandBuiltOp
from kiln.target.isa import ISA

PACKED = "matmul_packed"
TILED = "matmul_tiled"
GEMV = "matmul_gemv"
Attrs = Mapping[str, Any]


# --------------------------------------------------------------------------- packed op

def packed_kn(types: Sequence[Any], attrs: Attrs) -> tuple[int, int]:
    """(K, N) of a `matmul_packed` call (checked)."""
    a = tuple(types[0].shape)
    bp = tuple(int(d) for d in types[1].shape)
    n = int(attrs["n"])
    if len(bp) != 3 or not (bp[0] - 1) * bp[2] < n <= bp[0] * bp[2]:
        raise IRError(f"{PACKED}: packed B must be [panels][K][nr] holding {n} columns, "
                      f"got {bp}")
    if not a or a[-1] != bp[1]:
        raise IRError(f"{PACKED}: inner dimensions differ: {a} @ [{bp[1]}, {n}]")
    tile = recorded_tile(attrs, 2, PACKED)
    if tile is not None and tile[1] != bp[2]:
        raise IRError(f"{PACKED}: tile {tile} does not match the packed panels' width {bp[2]}")
    return bp[1], n


def _packed_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    k, n = packed_kn(types, attrs)
    return matmul_infer([types[0], TensorType((k, n), types[1].dtype)], {})


def _packed_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    k, n = packed_kn(inputs, attrs)
    bp = inputs[1]
    nr = bp.shape[2]

    def element(kk: PrimExpr, j: PrimExpr) -> PrimExpr:
        return bp[j // nr, kk, j % nr]

    return matmul_compute([inputs[0], te.compute((k, n), element, bp.dtype, "b")], {})


def _packed_ref(a: np.ndarray, bp: np.ndarray, **attrs: Any) -> np.ndarray:
    return matmul_ref(a, gk.unpack_b(bp, int(attrs["n"])))


# --------------------------------------------------------------------------- lowering

@dataclass(frozen=True)
class GemmOp(HandBuiltOp):
    """A matrix product built by its kernel family (kiln.ops.kernels: `gemm`,
    `gemm_tiled`, `gemv`) at `legalize` / `lower_fused`. `matmul_packed` also takes
    symbolic rows (M = batch*seq): static tiles, a symbolic tile count, and a last
    tile clamped to the rows there are."""

    supports_symbolic: ClassVar[bool] = True

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                    anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        """The GEMM kernel (see `HandBuiltOp.lower_fused`)."""
        if not float32_operands(args[:2], result):
            return None
        from kiln.ops.kernels.registry import build_call, family_of

        return build_call(family_of(self.name), params, args, attrs, anchor, result,
                          isa)


OPS.register(PACKED, GemmOp(PACKED, "anchor", _packed_infer, _packed_compute, _packed_ref))
OPS.register(TILED, GemmOp(TILED, "anchor", checking_tile(matmul_infer, TILED, 2),
                          matmul_compute, matmul_ref))
OPS.register(GEMV, GemmOp(GEMV, "anchor", checking_tile(matmul_infer, GEMV, 2),
                         matmul_compute, matmul_ref))

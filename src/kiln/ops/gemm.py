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
from kiln.ir.shape_expr import is_static
from kiln.ir.tensor import PrimExpr, PrimFunc
from kiln.ir.types import TensorType, Type
from kiln.ops import gemm_kernels as gk
from kiln.ops import gemv_kernels as gv
from kiln.ops import te
from kiln.ops.broadcast import broadcast_shapes
from kiln.ops.conv_direct import target_has_fma, target_lanes
from kiln.ops.epilogue import fused_store
from kiln.ops.nn import _b_shape, _matmul_compute, _matmul_infer, _matmul_ref
from kiln.ops.registry import OPS, HandBuiltOp

PACKED = "matmul_packed"
#: The row count M assumed when choosing a tile for symbolic M (a full-height tile).
TYPICAL_ROWS = 64
TILED = "matmul_tiled"
GEMV = "matmul_gemv"
Attrs = Mapping[str, Any]


def target_tiling(m: int, n: int, target: Any = None) -> gk.GemmTiling:
    """The register tile for an `m` x `n` product on `target` (default: the current one)."""
    if target is None:
        from kiln.target import Target

        target = Target.current()
    lanes = target_lanes(target)
    triple = str(target.attrs.get("mtriple") or "") if target is not None else ""
    return gk.choose_gemm_tiling(m, n, lanes, gk.vector_registers(lanes, triple))


# --------------------------------------------------------------------------- packed op

def _packed_kn(types: Sequence[Any], attrs: Attrs) -> tuple[int, int]:
    """(K, N) of a `matmul_packed` call (checked)."""
    a = tuple(types[0].shape)
    bp = tuple(int(d) for d in types[1].shape)
    n = int(attrs["n"])
    if len(bp) != 3 or not (bp[0] - 1) * bp[2] < n <= bp[0] * bp[2]:
        raise IRError(f"{PACKED}: packed B must be [panels][K][nr] holding {n} columns, "
                      f"got {bp}")
    if not a or a[-1] != bp[1]:
        raise IRError(f"{PACKED}: inner dimensions differ: {a} @ [{bp[1]}, {n}]")
    return bp[1], n


def _packed_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    k, n = _packed_kn(types, attrs)
    return _matmul_infer([types[0], TensorType((k, n), types[1].dtype)], {})


def _packed_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    k, n = _packed_kn(inputs, attrs)
    bp = inputs[1]
    nr = bp.shape[2]

    def element(kk: PrimExpr, j: PrimExpr) -> PrimExpr:
        return bp[j // nr, kk, j % nr]

    return _matmul_compute([inputs[0], te.compute((k, n), element, bp.dtype, "b")], {})


def _packed_ref(a: np.ndarray, bp: np.ndarray, **attrs: Any) -> np.ndarray:
    return _matmul_ref(a, gk.unpack_b(bp, int(attrs["n"])))


# --------------------------------------------------------------------------- lowering

@dataclass(frozen=True)
class GemmOp(HandBuiltOp):
    """A matrix product built on the GEMM micro-kernel (`legalize`, `lower_fused`).
    `matmul_packed` also takes symbolic rows (M = batch*seq): static tiles, a
    symbolic tile count, and a last tile clamped to the rows there are."""

    supports_symbolic: ClassVar[bool] = True

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                    anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str) -> PrimFunc | None:
        """The GEMM kernel (see `HandBuiltOp.lower_fused`)."""
        a, b = args[0], args[1]
        if any(t.dtype != "float32" for t in (a, b, *params)):
            return None
        if self.name == GEMV and not is_static((*a.shape, *b.shape)):
            return None
        if self.name == GEMV:
            return _lower_gemv(params, args, attrs, anchor, result)
        if self.name == PACKED:
            k, n = _packed_kn(args, attrs)
            shape = gk.GemmShape((), (), tuple(a.shape[:-1]), n, k)
            out_shape = (*a.shape[:-1], n)
        else:
            logical = _b_shape(b.shape, attrs)
            if a.ndim < 2 or len(logical) < 2:
                return None
            batch = broadcast_shapes(a.shape[:-2], logical[:-2])
            shape = gk.GemmShape(batch, tuple(a.shape[:-2]), (a.shape[-2],), logical[-1],
                                 a.shape[-1])
            out_shape = (*batch, a.shape[-2], logical[-1])
        store = fused_store(params, anchor, result, out_shape)
        if store is None:
            return None
        ab, bb = store.buffers[a], store.buffers[b]
        tiling = target_tiling(shape.m if isinstance(shape.m, int) else TYPICAL_ROWS,
                               shape.n if isinstance(shape.n, int) else TYPICAL_ROWS)
        prologue: list[Any] = []
        b_at: gk.BReader
        if self.name == PACKED:
            tiling = gk.GemmTiling(tiling.mr, b.shape[2])
            b_at = lambda bidx, p, kk, v: bb[p, kk, v]  # noqa: E731  (packed at compile time)
        else:
            prologue, b_at = gk.pack_b_at_run_time(
                bb, tuple(logical[:-2]), shape.k, shape.n, tiling.nr,
                bool(attrs.get("transpose_b")))
        body = gk.gemm_body(shape, tiling, ab, b_at, store.out, store.epilogue,
                            target_has_fma(), prologue)
        return PrimFunc((*(store.buffers[t] for t in params), store.out), body,
                        {"kiln.gemm_kernel": self.name})


def _lower_gemv(params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                anchor: te.Tensor | None, result: te.Tensor | None) -> PrimFunc | None:
    """The matrix-vector kernel, B `[N][K]` read in place (None: not one row of A)."""
    a, b = args[0], args[1]
    if not attrs.get("transpose_b") or b.ndim != 2 or any(d != 1 for d in a.shape[:-1]):
        return None
    n, k = (int(d) for d in b.shape)
    store = fused_store(params, anchor, result, (*a.shape[:-1], n))
    if store is None:
        return None
    body = gv.gemv_body(k, n, store.buffers[a], store.buffers[b], store.out, store.epilogue,
                        target_lanes(), target_has_fma())
    return PrimFunc((*(store.buffers[t] for t in params), store.out), body,
                    {"kiln.gemm_kernel": GEMV})


OPS.register(PACKED, GemmOp(PACKED, "anchor", _packed_infer, _packed_compute, _packed_ref))
OPS.register(TILED, GemmOp(TILED, "anchor", _matmul_infer, _matmul_compute, _matmul_ref))
OPS.register(GEMV, GemmOp(GEMV, "anchor", _matmul_infer, _matmul_compute, _matmul_ref))

"""Matrix-product operators run by the GEMM kernels of kiln.kernels.gemm.

The `block-matmuls` graph pass (kiln.transform.matmul_blocking) rewrites float32
`matmul` calls into these, so the choice is visible in the graph (and in its
kiln.script text):

- `matmul_packed(a, bp)`: B is a constant packed at compile time into panels
  `[ceil(N / nr)][K][nr]` (`pack_b`, zero-padded), attribute `n` the real column
  count; `a` is `[..., K]` (all leading dims are rows), the result `[..., n]`.
  Gemm's `transB` is applied while packing.
- `matmul_gemv(a, b)`: a matrix-vector product (A has one row) with B a constant
  stored `[N][K]` (Gemm's `transB`, attribute `transpose_b`), read in place by
  its kernel (kiln.kernels.gemm.gemv): the weight is not packed, so it is not copied;
- `matmul_tiled(a, b)`: both operands are activations of rank >= 2 (attention's
  Q @ K^T and P @ V, batch dims broadcast); same attributes and meaning as
  `matmul`; the kernel packs B into a workspace at run time.

Each keeps `matmul`'s numpy reference and tensor-expression definition (used when
the kernel does not apply, e.g. for another dtype); the `tile` attribute a call
records is checked by the type rule. The kernels, alone or with the elementwise
tail FuseOps grouped after the product (Gemm's alpha and bias, ReLU/Clip/Sigmoid/...,
a residual add) applied as each output is stored, are their lowerings
(kiln.kernels.gemm.lowering).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.tensor import PrimExpr
from kiln.ir.types import TensorType, Type
from kiln.ops import pack_memory, te
from kiln.ops.nn import matmul_compute, matmul_infer, matmul_ref
from kiln.ops.packed_attrs import checking_tile, recorded_tile
from kiln.ops.registry import OPS, OpDef

PACKED = "matmul_packed"
TILED = "matmul_tiled"
GEMV = "matmul_gemv"
Attrs = Mapping[str, Any]


# --------------------------------------------------------------------------- packed B

def pack_b(b: np.ndarray, nr: int) -> np.ndarray:
    """B `[K, N]` -> panels `[ceil(N / nr)][K][nr]`, the columns past N zero (a fresh
    read-only array: a graph constant takes it as it is, without a defensive copy)."""
    k, n = b.shape
    panels, full = -(-n // nr), n // nr
    # Written in place: one array the size of the result, no padded or transposed
    # temporary (a multi-GiB weight costs one extra copy while compiling, not two).
    out = pack_memory.empty((panels, k, nr), b.dtype)
    out[:full] = b[:, :full * nr].reshape(k, full, nr).transpose(1, 0, 2)
    if full < panels:
        out[full] = 0
        out[full, :, :n - full * nr] = b[:, full * nr:]
    out.flags.writeable = False
    return out


def unpack_b(bp: np.ndarray, n: int) -> np.ndarray:
    """`pack_b` undone: B `[K, n]`."""
    panels, k, nr = bp.shape
    return np.ascontiguousarray(bp.transpose(1, 0, 2).reshape(k, panels * nr)[:, :n])


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


def packed_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    """The te compute of a product by panels `[ceil(N / nr)][K][nr]` (float16 panels,
    `matmul_packed_f16`'s, widened to float32)."""
    k, n = packed_kn(inputs, attrs)
    bp = inputs[1]
    nr = bp.shape[2]
    dtype = "float32" if bp.dtype == "float16" else bp.dtype

    def element(kk: PrimExpr, j: PrimExpr) -> PrimExpr:
        return bp[j // nr, kk, j % nr].astype(dtype)

    return matmul_compute([inputs[0], te.compute((k, n), element, dtype, "b")], {})


def _packed_ref(a: np.ndarray, bp: np.ndarray, **attrs: Any) -> np.ndarray:
    return matmul_ref(a, unpack_b(bp, int(attrs["n"])))


OPS.register(PACKED, OpDef(PACKED, "anchor", _packed_infer, packed_compute, _packed_ref))
OPS.register(TILED, OpDef(TILED, "anchor", checking_tile(matmul_infer, TILED, 2),
                          matmul_compute, matmul_ref))
OPS.register(GEMV, OpDef(GEMV, "anchor", checking_tile(matmul_infer, GEMV, 2),
                         matmul_compute, matmul_ref))

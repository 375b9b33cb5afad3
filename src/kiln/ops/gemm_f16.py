"""`matmul_packed_f16`: a float32 product on float16 weights (the target attribute
`precision=f16`, kiln.target.precision).

The `block-matmuls` pass rewrites a float32 `matmul` by a constant B into
`matmul_packed_f16(a, bp)` where the target asks for it: B rounded to float16 (to
nearest, ties to even, as numpy's `astype` rounds) and packed at compile time into the
panels `[ceil(N / nr)][K][nr]` of `matmul_packed` (kiln.ops.gemm.pack_b), attribute `n`
the real column count. The kernel widens each weight to float32 as it reads it (F16C's
`vcvtph2ps`) and multiplies and sums in float32, with float32 A, so the only rounding
beyond float32's is the weights'. Half the bytes of the float32 weights.

The reference is `matmul` of A by the float16 weights widened to float32; the te compute
(the fallback where the kernel is not built) reads the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.types import TensorType, Type
from kiln.ops.gemm import pack_b, packed_compute, packed_kn, unpack_b
from kiln.ops.nn import matmul_infer, matmul_ref
from kiln.ops.registry import OPS, OpDef

PACKED_F16 = "matmul_packed_f16"
Attrs = Mapping[str, Any]


def pack_b_f16(b: np.ndarray, nr: int) -> np.ndarray:
    """B `[K, N]` float32 -> float16 panels `[ceil(N / nr)][K][nr]` (columns past N zero)."""
    return pack_b(np.asarray(b).astype(np.float16), nr)


def packed_f16_kn(types: Sequence[Any], attrs: Attrs) -> tuple[int, int]:
    """(K, N) of a `matmul_packed_f16` call (checked)."""
    if types[1].dtype != "float16":
        raise IRError(f"{PACKED_F16}: packed B must be float16, got {types[1].dtype}")
    return packed_kn(types, attrs)


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    k, n = packed_f16_kn(types, attrs)
    return matmul_infer([types[0], TensorType((k, n), "float32")], {})


def _ref(a: np.ndarray, bp: np.ndarray, **attrs: Any) -> np.ndarray:
    return matmul_ref(a, unpack_b(bp, int(attrs["n"])).astype(np.float32))


OPS.register(PACKED_F16, OpDef(PACKED_F16, "anchor", _infer, packed_compute, _ref))

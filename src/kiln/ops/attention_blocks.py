"""`attention_tiled(q, k, v)`: softmax(Q @ K^T * scale) @ V computed by blocks of query
rows (kiln.kernels.gemm.attention_blocks), written by the `block-attention` graph pass
(kiln.transform.attention_blocks) in place of `matmul_tiled` -> [`multiply` by a
scalar] -> `softmax` over the last axis -> `matmul_tiled`.

Operands: `q` `[*batch, m, d]`, `k` `[*batch, n, d]` (attribute `transpose_b`, the
keys as exporters leave them after merge-copies) or `[*batch, d, n]`, `v`
`[*batch, n, dv]`, the batch dims equal; result `[*batch, m, dv]`. Attribute `scale`:
the scores' scalar factor (float32, 1.0 when there was none). The te compute (the
fallback of targets without the kernel) and the reference are the three ops it stands
for, each product summed as `matmul`'s.

`attention_tiled_bf16(q, k, v)`, the same on `precision=bf16` targets in place of two
`matmul_tiled_bf16`: each product's operands rounded to bfloat16 (the reference rounds
them as `matmul_tiled_bf16`'s does), sums and softmax in float32; its te compute is the
float32 one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.gemm_bf16 import bf16_round
from kiln.ops.nn import matmul_compute, matmul_ref
from kiln.ops.reduce import softmax_compute, softmax_ref
from kiln.ops.registry import OPS, OpDef

ATTENTION = "attention_tiled"
ATTENTION_BF16 = "attention_tiled_bf16"
Attrs = Mapping[str, Any]


def attention_dims(shapes: Sequence[Sequence[Any]], attrs: Attrs
                   ) -> tuple[tuple[int, ...], int, int, int, int]:
    """(batch, m, n, d, dv) of an `attention_tiled` call's operand shapes (checked)."""
    q, k, v = (tuple(s) for s in shapes)
    if not len(q) == len(k) == len(v) >= 2:
        raise IRError(f"{ATTENTION}: q, k and v need one rank >= 2, got {q}, {k}, {v}")
    n, d = (k[-2], k[-1]) if attrs.get("transpose_b") else (k[-1], k[-2])
    batch = q[:-2]
    if k[:-2] != batch or v[:-2] != batch:
        raise IRError(f"{ATTENTION}: batch dims differ: {q}, {k}, {v}")
    if q[-1] != d or v[-2] != n:
        raise IRError(f"{ATTENTION}: inner dimensions differ: q {q}, k {k} "
                      f"(transpose_b={bool(attrs.get('transpose_b'))}), v {v}")
    return batch, q[-2], n, d, v[-1]


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    if any(t.dtype != "float32" for t in types):
        raise IRError(f"{ATTENTION}: float32 operands only, got "
                      f"{', '.join(t.dtype for t in types)}")
    batch, m, _, _, dv = attention_dims([t.shape for t in types], attrs)
    return TensorType((*batch, m, dv), "float32")


def _materialized(t: te.Tensor, name: str, factor: float | None = None) -> te.Tensor:
    """`t` (times `factor`) as a buffer: a product or softmax read many times per element
    would otherwise be recomputed at each read."""
    assert t.fcompute is not None
    f = t.fcompute
    if factor is None:
        return te.compute(t.shape, f, t.dtype, name, materialize=True)
    c = float(np.float32(factor))
    return te.compute(t.shape, lambda *i: f(*i) * c, t.dtype, name, materialize=True)


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    q, k, v = inputs
    scores = _materialized(matmul_compute([q, k], {"transpose_b": attrs.get("transpose_b")}),
                           "scores", float(attrs.get("scale", 1.0)))
    probs = _materialized(softmax_compute([scores], {"axis": -1}), "probs")
    return matmul_compute([probs, v], {})


def _reference(rounded: Callable[[np.ndarray], np.ndarray]) -> Callable[..., np.ndarray]:
    def ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, **attrs: Any) -> np.ndarray:
        scores = matmul_ref(rounded(q), rounded(k), transpose_b=attrs.get("transpose_b", False))
        scores = scores * np.float32(attrs.get("scale", 1.0))
        return matmul_ref(rounded(softmax_ref(scores, axis=-1)), rounded(v))
    return ref


OPS.register(ATTENTION, OpDef(ATTENTION, "opaque", _infer, _compute, _reference(lambda x: x)))
OPS.register(ATTENTION_BF16, OpDef(ATTENTION_BF16, "opaque", _infer, _compute,
                                   _reference(bf16_round)))

"""`attention_tiled(q, k, v[, bias])`: softmax(Q @ K^T * scale [+ bias]) @ V computed by
blocks of query rows (kiln.kernels.gemm.attention_blocks), written by the
`block-attention` graph pass (kiln.transform.attention_blocks) in place of
`matmul_tiled` -> [`multiply` by a scalar] -> [a mask] -> `softmax` over the last axis
-> `matmul_tiled`.

Operands: `q` `[*batch, m, d]`, `k` `[*batch, n, d]` (attribute `transpose_b`, the
keys as exporters leave them after merge-copies) or `[*batch, d, n]`, `v`
`[*batch, n, dv]`, each batch dim of `k` and `v` 1 or `q`'s (broadcast: grouped-query
attention's `[b, groups, 1, n, d]` keys read by the `[b, groups, rep, m, d]` query heads
of each group, kiln.transform.grouped_heads); result `[*batch, m, dv]`. Attribute `scale`:
the scores' scalar factor (float32, 1.0 when there was none). `bias` (optional): a
float32 tensor added to the scaled (and causally masked) scores, of their rank, each
dim 1 (broadcast) or theirs: an attention mask computed from the graph's inputs (a
padding mask `[b, 1, 1, n]`, a decoder's 4-D mask `[b, 1, m, n]`). Attribute
`zero_nan` (bool, default false): NaN probabilities count as 0 (torch's SDPA export,
`where(isnan(p), 0, p)`: a row masked whole with `-inf` gives zeros, not NaN). Attribute
`key_counts` (bool, default false): the last operand is an int64 `[batch[0]]` count of
the keys each row of the first batch axis attends, the keys from it on masked out
(GroupQueryAttention's `seqlens_k + 1` over a cache buffer of fixed capacity), each count
taken clamped to [1, n]; the kernel runs its key loops to that run-time bound, not over
all `n`. Attribute `softcap` (float, default 0: none): a positive `c` caps each scaled
score as `c * tanh(score / c)` before any mask or bias joins it (GroupQueryAttention's
`softcap`, Gemma-2's attention logit capping, in onnxruntime's order: scale, softcap,
mask, softmax). Attribute `merge_heads` (bool, default false): the result is
`[*batch[:-1], m, batch[-1] * dv]`, each row's heads (the last batch axis) side by
side, as `reshape_transpose` merges them before an output projection: the kernel
stores them there, so the copy goes (`block-attention` takes such a copy in). The te
compute (the fallback of targets without the kernel) and the reference are the three ops
it stands for, each product summed as `matmul`'s (then the heads merged).

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
from kiln.ir.shape_expr import dims_equal
from kiln.ir.tensor import PrimExpr, as_expr, intrin, max_, min_, select
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.gemm_bf16 import bf16_round
from kiln.ops.nn import matmul_compute, matmul_ref
from kiln.ops.reduce import softmax_compute, softmax_ref
from kiln.ops.registry import OPS, OpDef

ATTENTION = "attention_tiled"
ATTENTION_BF16 = "attention_tiled_bf16"
Attrs = Mapping[str, Any]
#: The score a causal attention gives the keys after a query's position (float32's
#: lowest, as transformers' masks: its exp is 0, and a row is never all masked).
MASKED_SCORE = float(np.finfo(np.float32).min)


def attention_dims(shapes: Sequence[Sequence[Any]], attrs: Attrs
                   ) -> tuple[tuple[int, ...], int, int, int, int]:
    """(batch, m, n, d, dv) of an `attention_tiled` call's operand shapes (checked)."""
    q, k, v = (tuple(s) for s in shapes)
    if not len(q) == len(k) == len(v) >= 2:
        raise IRError(f"{ATTENTION}: q, k and v need one rank >= 2, got {q}, {k}, {v}")
    n, d = (k[-2], k[-1]) if attrs.get("transpose_b") else (k[-1], k[-2])
    batch = q[:-2]
    if not (_broadcasts(k[:-2], batch) and _broadcasts(v[:-2], batch)):
        raise IRError(f"{ATTENTION}: batch dims differ: {q}, {k}, {v}")
    if dims_equal(q[-1], d) is not True or dims_equal(v[-2], n) is not True:
        raise IRError(f"{ATTENTION}: inner dimensions differ: q {q}, k {k} "
                      f"(transpose_b={bool(attrs.get('transpose_b'))}), v {v}")
    if attrs.get("causal") and isinstance(n, int) and isinstance(q[-2], int) and n < q[-2]:
        raise IRError(f"{ATTENTION}: causal attention needs keys >= query rows, got {q}, {k}")
    return batch, q[-2], n, d, v[-1]


def _broadcasts(dims: Sequence[Any], batch: Sequence[Any]) -> bool:
    """Whether `dims` (a key or value operand's batch dims) are each 1 or `batch`'s."""
    return len(dims) == len(batch) and all(
        (isinstance(x, int) and x == 1) or dims_equal(x, b) is True
        for x, b in zip(dims, batch))


def sees(row: Any, key: Any, m: int, n: int) -> Any:
    """Whether query `row` of `m` sees `key` of `n` in a causal attention (numpy arrays
    or PrimExprs): the rows are the last `m` positions."""
    return key <= row + (n - m)


def key_count(counts: Any, n: Any) -> Any:
    """A batch row's attended keys (numpy arrays or PrimExprs): its count clamped to
    [1, n]."""
    if isinstance(counts, np.ndarray):
        return np.clip(counts, 1, n)
    return min_(max_(counts, as_expr(1, "int64")), as_expr(n, "int64"))


def result_shape(batch: Sequence[Any], m: Any, dv: Any, attrs: Attrs) -> tuple[Any, ...]:
    """The result's shape: `[*batch, m, dv]`, or with `merge_heads` the last batch axis
    (the heads) merged into the values' axis, `[*batch[:-1], m, batch[-1] * dv]`."""
    if not attrs.get("merge_heads"):
        return (*batch, m, dv)
    if not batch or not (isinstance(batch[-1], int) and isinstance(dv, int)):
        raise IRError(f"{ATTENTION}: merge_heads needs a static heads axis and head "
                      f"width, got batch {tuple(batch)}, dv {dv}")
    return (*batch[:-1], m, batch[-1] * dv)


def _infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    if attrs.get("key_counts"):
        counts, types = types[-1], types[:-1]
        if counts.dtype != "int64" or counts.ndim != 1 or not types or \
                dims_equal(counts.shape[0], types[0].shape[0]) is not True:
            raise IRError(f"{ATTENTION}: key_counts takes an int64 count per row of the "
                          f"first batch axis, got {counts.dtype}{list(counts.shape)}")
    if any(t.dtype != "float32" for t in types):
        raise IRError(f"{ATTENTION}: float32 operands only, got "
                      f"{', '.join(t.dtype for t in types)}")
    if len(types) not in (3, 4):
        raise IRError(f"{ATTENTION}: takes q, k, v and an optional bias, got {len(types)}")
    batch, m, n, _, dv = attention_dims([t.shape for t in types[:3]], attrs)
    if len(types) == 4:
        scores = (*batch, m, n)
        bias = tuple(types[3].shape)
        if not _broadcasts(bias, scores):
            raise IRError(f"{ATTENTION}: bias {bias} does not broadcast to the scores {scores}")
    return TensorType(result_shape(batch, m, dv, attrs), "float32")


def capped(x: PrimExpr, softcap: float) -> PrimExpr:
    """The scaled score `x` under attribute `softcap` (`x` itself when it is 0)."""
    if softcap <= 0:
        return x
    cap = as_expr(float(np.float32(softcap)), "float32")
    return intrin("tanh", x / cap) * cap


def zero_nan(p: PrimExpr) -> PrimExpr:
    """`p`, or 0 where it is NaN (attribute `zero_nan`)."""
    return select(intrin("isnan", p), 0.0, p)


def bias_index(idx: Sequence[Any], shape: Sequence[Any]) -> tuple[Any, ...]:
    """The bias element of the scores' element `idx`: index 0 along its dims of 1."""
    return tuple(0 if isinstance(d, int) and d == 1 else i for i, d in zip(idx, shape))


def _materialized(t: te.Tensor, name: str) -> te.Tensor:
    """`t` as a buffer: a product or softmax read many times per element would otherwise
    be recomputed at each read."""
    assert t.fcompute is not None
    return te.compute(t.shape, t.fcompute, t.dtype, name, materialize=True)


def _scores(q: te.Tensor, k: te.Tensor, bias: te.Tensor | None, counts: te.Tensor | None,
            attrs: Attrs) -> te.Tensor:
    """The scaled (and causally masked, and biased) scores as a buffer."""
    product = matmul_compute([q, k], {"transpose_b": attrs.get("transpose_b")})
    assert product.fcompute is not None
    f, c = product.fcompute, float(np.float32(attrs.get("scale", 1.0)))
    m, n = product.shape[-2:]

    def scaled(*i: PrimExpr) -> PrimExpr:
        x = capped(f(*i) * c, float(attrs.get("softcap", 0.0)))
        if attrs.get("causal"):
            x = select(sees(i[-2], i[-1], int(m), int(n)), x, MASKED_SCORE)
        x = x if bias is None else x + bias[bias_index(i, bias.shape)]
        if counts is not None:
            x = select(i[-1] < key_count(counts[(i[0],)], n), x, MASKED_SCORE)
        return x

    return te.compute(product.shape, scaled, product.dtype, "scores", materialize=True)


def _compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    q, k, v = inputs[:3]
    counts = inputs[-1] if attrs.get("key_counts") else None
    rest = inputs[3:-1] if counts is not None else inputs[3:]
    bias = rest[0] if rest else None
    probs = softmax_compute([_scores(q, k, bias, counts, attrs)], {"axis": -1})
    if attrs.get("zero_nan"):
        f = probs.fcompute
        assert f is not None
        probs = te.compute(probs.shape, lambda *i: zero_nan(f(*i)), probs.dtype, "probs")
    probs = _materialized(probs, "probs")
    out = matmul_compute([probs, v], {})
    if not attrs.get("merge_heads"):
        return out
    out = _materialized(out, "heads")
    dv = int(out.shape[-1])
    return te.compute(result_shape(out.shape[:-2], out.shape[-2], dv, attrs),
                      lambda *i: out[(*i[:-2], i[-1] // dv, i[-2], i[-1] % dv)],
                      out.dtype, "merged")


def _reference(rounded: Callable[[np.ndarray], np.ndarray]) -> Callable[..., np.ndarray]:
    def ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, *rest: np.ndarray,
            **attrs: Any) -> np.ndarray:
        counts = rest[-1] if attrs.get("key_counts") else None
        bias = (rest[:-1] if counts is not None else rest) or (None,)
        scores = matmul_ref(rounded(q), rounded(k), transpose_b=attrs.get("transpose_b", False))
        scores = scores * np.float32(attrs.get("scale", 1.0))
        cap = np.float32(attrs.get("softcap", 0.0))
        if cap > 0:
            scores = np.tanh(scores / cap) * cap
        if attrs.get("causal"):
            m, n = scores.shape[-2:]
            seen = sees(np.arange(m)[:, None], np.arange(n)[None, :], m, n)
            scores = np.where(seen, scores, np.float32(MASKED_SCORE))
        if bias[0] is not None:
            scores = scores + bias[0]
        if counts is not None:
            n = scores.shape[-1]
            limit = key_count(counts, n).reshape(-1, *[1] * (scores.ndim - 1))
            scores = np.where(np.arange(n) < limit, scores, np.float32(MASKED_SCORE))
        probs = softmax_ref(scores, axis=-1)
        if attrs.get("zero_nan"):
            probs = np.where(np.isnan(probs), np.float32(0), probs)
        out = matmul_ref(rounded(probs), rounded(v))
        if attrs.get("merge_heads"):
            out = np.swapaxes(out, -2, -3)
            out = out.reshape(*out.shape[:-2], -1).copy()
        return out
    return ref


OPS.register(ATTENTION, OpDef(ATTENTION, "opaque", _infer, _compute, _reference(lambda x: x)))
OPS.register(ATTENTION_BF16, OpDef(ATTENTION_BF16, "opaque", _infer, _compute,
                                   _reference(bf16_round)))

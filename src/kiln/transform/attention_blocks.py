"""BlockAttention: attention's products and softmax as one kernel over blocks of query
rows, where the scores would not stay in cache.

After `block-matmuls`, a float32 attention is the chain

    s = matmul_tiled(q, k[, transpose_b]); x = multiply(s, c)   (c a scalar, optional;
                                                                 or divide by a power of 2)
    x = <a causal mask of x>   (optional: kiln.transform.attention_masks)
    x = add(x, bias)           (optional: a mask computed from the inputs)
    p = softmax(x, axis=-1); [p = cast(p, float32) or where(isnan(p), 0, p)]
    out = matmul_tiled(p, v)

(both products `matmul_tiled_bf16` on `precision=bf16` targets), whose kernels write
the `[*batch, m, n]` scores, read them back and write them again, then read them once
more. The pass rewrites it to `attention_tiled(q, k, v)` (`attention_tiled_bf16`;
kiln.ops.attention_blocks; `causal` when a causal mask was taken: the kernel then does
no work above the diagonal; the operand `bias` for an added mask; `zero_nan` for NaN
probabilities as zeros) when each link is
read only by the next, the keys' and values' batch dims are the queries' or 1
(grouped-query attention's heads, between the reshapes of
kiln.transform.attention_heads), and either the scores are static, of more than one
query row, and exceed an eighth of the target's L2 cache (`ISA.l2_bytes`,
`SCORES_L2_FRACTION`), or they are float32 of symbolic shape (an export's dynamic
batch, sequence and cache axes: the sizes are not known, and the kernel's blocks of one
register tile of rows keep them in cache at any length): the kernel then computes a
block of query rows at a time with its scores in cache
(kiln.kernels.gemm.attention_blocks). Scores within L2 stay in
cache in the three kernels too, but those run five parallel loops (the run-time
packing of K and V, both products' tiles, the softmax) where the blocked kernel runs
three, and each is a hand-off to the thread
pool and a wait for its last thread: at two threads the blocked kernel is the faster
for BERT-base's 12 x 128 x 128 scores (786 KB; docs/performance.md). A static decode
step's one query row, and scores of a few microseconds' work (short sequences), keep
the three kernels, whose loops go parallel only when worth it. The pass runs after
`block-matmuls` (whose `matmul_tiled` it reads: targets without the GEMM kernels keep
`matmul`) and before `fuse-ops`. A `reshape_transpose` that merges an attention's heads
beside each row (`[*batch[:-1], m, heads * dv]`, before an output projection), its only
reader, becomes the attention's `merge_heads` result: the kernel stores each head's
values there, and the copy goes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.analysis.graph_uses import var_use_counts
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType
from kiln.ops import call
from kiln.ops.attention_blocks import ATTENTION, ATTENTION_BF16
from kiln.ops.gemm import TILED
from kiln.ops.gemm_bf16 import TILED_BF16
from kiln.ops.reshape_dims import reshape_target
from kiln.target.isa import ISA
from kiln.transform.attention_heads import grouped_bias, merged_heads, split_heads
from kiln.transform.attention_masks import attention_bias, causal_scores
from kiln.transform.kernel_isa import kernel_isa
from kiln.transform.pass_base import FunctionPass

Defs = dict[g.Var, Any]
#: Scores from this fraction of L2 on take the blocked kernel (module docstring).
SCORES_L2_FRACTION = 8
#: The products' op -> the op of the blocked attention over them.
_FUSED = {TILED: ATTENTION, TILED_BF16: ATTENTION_BF16}


@dataclass(frozen=True)
class BlockAttention(FunctionPass):
    """Rewrite `matmul_tiled -> [multiply by a scalar] -> [a causal mask] -> softmax ->
    matmul_tiled` chains whose scores exceed the L2 cache to `attention_tiled` (module
    docstring)."""

    name = "block-attention"
    level = "graph"

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> g.Function:
        assert isinstance(func, g.Function)
        isa = kernel_isa()
        items = list(func.bindings)
        uses = var_use_counts(func)
        defs: Defs = {b.var: b.value for b in items}
        replaced: dict[g.Var, list[g.Binding]] = {}
        dropped: set[g.Var] = set()
        for b in items:
            found = _attention(b, defs, uses, isa)
            if found is not None:
                replaced[b.var], chain = found
                dropped.update(chain)
        if not replaced:
            return func
        bindings = tuple(x for b in items if b.var not in dropped
                         for x in replaced.get(b.var, [b]))
        return g.Function(func.params, _heads_merged(bindings, uses), func.result,
                          dict(func.attrs))


def _heads_merged(bindings: tuple[g.Binding, ...], uses: Any) -> tuple[g.Binding, ...]:
    """`bindings` with each static attention read only by the copy that merges its
    heads beside each row (`reshape_transpose` to `[*batch[:-1], m, heads * dv]`, before
    an output projection) computing that result itself (`merge_heads`): the kernel
    stores each head's values there, and the copy goes."""
    attention = {b.var: b.value for b in bindings if isinstance(b.value, g.Call)
                 and b.value.op in _FUSED.values() and uses[b.var] == 1}
    merged: dict[g.Var, g.Binding] = {}  # a copy's var -> its binding to the attention
    gone: set[g.Var] = set()  # the attentions merged
    for b in bindings:
        value = b.value
        if not (isinstance(value, g.Call) and value.op == "reshape_transpose"
                and isinstance(value.args[0], g.Var) and value.args[0] in attention):
            continue
        att = attention[value.args[0]]
        t = att.ret_type
        if not (isinstance(t, TensorType) and t.ndim >= 3
                and all(isinstance(d, int) for d in t.shape)):
            continue
        r = t.ndim
        try:
            inner = reshape_target(t.shape, cast(Any, value.attrs["inner"]))
            out = call(att.op, *att.args, **att.attrs, merge_heads=True)
        except IRError:
            continue
        perm = tuple(cast(Any, value.attrs.get("perm")) or ())
        if tuple(inner) == tuple(t.shape) and out.ret_type == value.ret_type \
                and perm == (*range(r - 3), r - 2, r - 3, r - 1):
            merged[b.var] = g.Binding(b.var, out)
            gone.add(value.args[0])
    # each merged attention moves down to its copy's place (its operands come before it)
    return tuple(merged.get(b.var, b) for b in bindings if b.var not in gone)


def _read_once(x: g.Expr, defs: Defs, uses: Any, op: str) -> g.Call | None:
    """The call defining `x` when it is a call of `op` read only once."""
    value = defs.get(x) if isinstance(x, g.Var) else None
    if isinstance(value, g.Call) and value.op == op and uses[x] == 1:
        return value
    return None


def _scale(x: g.Expr, defs: Defs, uses: Any) -> tuple[g.Expr, float, list[g.Var]] | None:
    """(the product under `x`, its scalar factor, the vars read through) when `x` is
    `multiply(s, c)` with `c` a float32 scalar constant, or `divide(s, c)` with `c` a
    power of two (dividing by it is multiplying by `1 / c`, both exact to the same
    rounding), or `x` itself (factor 1)."""
    for op in ("multiply", "divide"):
        value = _read_once(x, defs, uses, op)
        if value is not None:
            break
    else:
        return x, 1.0, []
    s, c = value.args
    if not (isinstance(c, g.Constant) and c.data.size == 1 and c.data.dtype == np.float32):
        return None
    factor = float(c.data.reshape(()))
    if op == "divide":
        if abs(math.frexp(factor)[0]) != 0.5 or not 2.0 ** -126 <= abs(factor) <= 2.0 ** 126:
            return None  # 1 / c would round, or leave float32's normal range
        factor = 1.0 / factor
    assert isinstance(x, g.Var)
    return s, factor, [x]


def _attention(binding: g.Binding, defs: Defs, uses: Any, isa: ISA
               ) -> tuple[list[g.Binding], list[g.Var]] | None:
    """The bindings replacing the product `binding` (an `attention_tiled` call, after a
    view of its bias) and the vars of the chain it takes over, or None when the product
    ends no chain the kernel takes."""
    value = binding.value
    if not (isinstance(value, g.Call) and value.op in _FUSED and len(value.args) == 2
            and not value.attrs.get("transpose_b")):
        return None
    probs, v = value.args
    through: list[g.Var] = []
    grouped = split_heads(probs, defs, uses)  # grouped-query heads (attention_heads)
    if grouped is not None:
        assert isinstance(probs, g.Var)
        through, probs = [probs], grouped
    while (same := _read_once(probs, defs, uses, "cast")) is not None \
            and same.attrs.get("dtype") == "float32":
        # torch's exports cast the probabilities to their own dtype (Llama's twice)
        assert isinstance(probs, g.Var)
        through, probs = [*through, probs], same.args[0]
    softmax: g.Call | None
    nan_zeroed = _nan_zeroed(probs, defs, uses)
    if nan_zeroed is not None:
        probs, softmax, more = nan_zeroed
        through = [*through, *more]
    else:
        softmax = _read_once(probs, defs, uses, "softmax")
    if softmax is None:
        return None
    st = softmax.args[0].type
    if not (isinstance(st, TensorType) and softmax.attrs.get("axis", -1) in (-1, st.ndim - 1)):
        return None
    x: g.Expr = softmax.args[0]
    bias: g.Expr | None = None
    masked = causal_scores(x, defs, uses)
    biased = attention_bias(x, defs, uses) if masked is None else None
    if biased is not None:  # a mask from the inputs, over any causal one
        x, bias, read = biased
        through = [*through, *read]
        masked = causal_scores(x, defs, uses)
    if masked is not None:
        x, through = masked[0], [*through, *masked[1]]
    scaled = _scale(x, defs, uses)
    if scaled is None:
        return None
    scores, factor, scaled_through = scaled
    through = [*through, *scaled_through]
    if grouped is not None:
        s5 = merged_heads(scores, defs, uses)
        if s5 is None:
            return None
        assert isinstance(scores, g.Var)
        through, scores = [*through, scores], s5
    product = _read_once(scores, defs, uses, value.op)
    if product is None or not _worth_blocking(st, value.op, isa):
        return None
    views: list[g.Binding] = []
    if grouped is not None and bias is not None:
        st5 = scores.type
        assert isinstance(st5, TensorType)
        view = grouped_bias(bias, st5, f"{binding.var.name}_bias")
        if view is None:
            return None
        bias, views = view[0], [view[1]]
    q, k = product.args
    if not _head_widths_static(q, v, st):
        return None
    attrs: dict[str, Any] = {"scale": factor}
    if product.attrs.get("transpose_b"):
        attrs["transpose_b"] = True
    if masked is not None:
        attrs["causal"] = True
    if nan_zeroed is not None:
        attrs["zero_nan"] = True
    try:
        out = call(_FUSED[value.op], q, k, v, *([] if bias is None else [bias]), **attrs)
    except IRError:
        return None  # broadcast batch dims, or an operand other than float32
    if out.ret_type != value.ret_type:
        return None
    assert isinstance(probs, g.Var) and isinstance(scores, g.Var)
    return [*views, g.Binding(binding.var, out)], [probs, scores, *through]


def _nan_zeroed(x: g.Expr, defs: Defs, uses: Any
                ) -> tuple[g.Expr, g.Call, list[g.Var]] | None:
    """(p, the softmax defining it, the vars read through) when `x` is torch's SDPA
    export of NaN probabilities as zeros, `where(isnan(p), 0, p)`, read once, with `p` a
    softmax read only by the two."""
    value = _read_once(x, defs, uses, "where")
    if value is None:
        return None
    cond, zero, p = value.args
    test = _read_once(cond, defs, uses, "isnan")
    softmax: g.Call | None = None
    if isinstance(p, g.Var) and isinstance(defs.get(p), g.Call):
        softmax = defs[p]
    if test is None or test.args[0] is not p or not isinstance(zero, g.Constant) \
            or zero.data.size != 1 or float(zero.data.reshape(())) != 0.0 \
            or softmax is None or softmax.op != "softmax" or uses[p] != 2:
        return None
    assert isinstance(x, g.Var) and isinstance(cond, g.Var)
    return p, softmax, [x, cond]


def _head_widths_static(q: g.Expr, v: g.Expr, scores: TensorType) -> bool:
    """Whether the kernel takes these operands: static head widths where the scores
    are symbolic (its register tiles run over them)."""
    if all(isinstance(d, int) for d in scores.shape):
        return True
    widths = [getattr(x.type, "shape", (None,))[-1] for x in (q, v)]
    return all(isinstance(w, int) for w in widths)


def _worth_blocking(scores: TensorType, op: str, isa: ISA) -> bool:
    """Whether float32 scores of this type take the blocked kernel of the products'
    `op`: static ones of more than one query row exceeding `1 / SCORES_L2_FRACTION` of
    the L2 cache; symbolic ones (an export's dynamic axes) on the float32 kernel."""
    if scores.dtype != "float32":
        return False
    if not all(isinstance(d, int) for d in scores.shape):
        return op == TILED and isa.l2_bytes > 0
    shape = [int(cast(int, d)) for d in scores.shape]
    return 0 < isa.l2_bytes < SCORES_L2_FRACTION * 4 * math.prod(shape) and shape[-2] > 1

"""Causal masks on attention scores, as exporters leave them after `fold-constants`.

A decoder's prompt (GPT-2, Llama-style models) masks its scores `[*batch, m, n]` so that
query row `i`, the position `i + n - m`, sees keys `j <= i + n - m` only. Exporters build
the mask from a lower-triangular buffer sliced to the sequence, `Trilu`, or `Range`
and a comparison; with static shapes `fold-constants` leaves one constant, applied as

- `where(mask, scores, low)`: `mask` true where seen (torch's GPT-2 export);
- `where(mask, low, scores)`: `mask` true where masked (`masked_fill`);
- `add(scores, bias)` (either order): `bias` 0 where seen and `low` elsewhere
  (transformers' 4-D causal mask for Llama-style decoders, torch's SDPA export);

with `low` at most `LOWEST_MASK` (float32's lowest or `-inf` in transformers, `-1e4` in
older exports): the softmax gives those scores probability 0 (`exp` of `-1e4` less the
row's maximum is 0 in float32), so a kernel may skip them (`attention_tiled`'s
`causal`). No row of such a mask is all masked (`n >= m`).

A mask computed from the graph's inputs (a padding mask, a decoder's 4-D mask from its
`attention_mask` input), added to the scores, is `attention_bias`: the kernel adds it
as its softmax reads the scores (`attention_tiled`'s `bias`), after any causal mask
under it (transformers' GPT-2: `where(tril, x, low) + padding`). A row it masks whole
gives what the softmax gives the unfused scores: the mean of V's rows under a finite
mask value, NaN under `-inf` (as onnxruntime).
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from kiln.ir import graph as g
from kiln.ir.shape_expr import dims_equal
from kiln.ir.types import TensorType
from kiln.ops.attention_blocks import sees

#: Masked scores at or below this value count as masked out (module docstring).
LOWEST_MASK = -1.0e4


def causal_scores(x: g.Expr, defs: dict[g.Var, Any], uses: Any
                  ) -> tuple[g.Expr, list[g.Var]] | None:
    """(the scores under a causal mask, [x]) when `x`, read once, is one of the module's
    mask forms over float32 scores of static shape; None otherwise."""
    value = defs.get(x) if isinstance(x, g.Var) else None
    if not (isinstance(value, g.Call) and uses[x] == 1 and value.op in ("where", "add")):
        return None
    t = value.ret_type
    if not (isinstance(t, TensorType) and t.dtype == "float32" and t.ndim >= 2
            and all(isinstance(d, int) for d in t.shape)):
        return None
    m, n = (int(cast(int, d)) for d in t.shape[-2:])
    if n < m:
        return None
    seen = sees(np.arange(m)[:, None], np.arange(n)[None, :], m, n)
    assert isinstance(x, g.Var)
    args = value.args
    if value.op == "add":
        for scores, bias in ((args[0], args[1]), (args[1], args[0])):
            if _typed(scores, t) and _masks(_constant(bias), seen, lambda b: b == 0,
                                            lambda b: b <= LOWEST_MASK):
                return scores, [x]
        return None
    cond, a, b = args
    mask = _constant(cond)
    if mask is None or mask.dtype != np.bool_:
        return None
    if _typed(a, t) and _lowest(_constant(b)) and _masks(mask, seen, _same, np.logical_not):
        return a, [x]  # where(mask, scores, low)
    if _typed(b, t) and _lowest(_constant(a)) and _masks(mask, seen, np.logical_not, _same):
        return b, [x]  # where(mask, low, scores)
    return None


def _typed(scores: g.Expr, t: TensorType) -> bool:
    """Whether `scores` is a computed tensor of type `t`."""
    return not isinstance(scores, g.Constant) and getattr(scores, "type", None) == t


def _constant(x: g.Expr) -> np.ndarray | None:
    return np.asarray(x.data) if isinstance(x, g.Constant) else None


def _same(mask: np.ndarray) -> np.ndarray:
    return mask


def _lowest(low: np.ndarray | None) -> bool:
    """Whether the masked scores' value is float32 at most `LOWEST_MASK` everywhere."""
    return low is not None and low.dtype == np.float32 and bool(np.all(low <= LOWEST_MASK))


def _masks(mask: np.ndarray | None, seen: np.ndarray, keeps: Any, drops: Any) -> bool:
    """Whether `mask` (broadcast over the leading dims, last two `seen`'s) `keeps` the
    scores `seen` and `drops` the others, in every leading slice."""
    if mask is None or mask.ndim < 2 or mask.shape[-2:] != seen.shape:
        return False
    if mask.dtype != np.bool_ and mask.dtype != np.float32:
        return False
    for plane in mask.reshape(-1, *seen.shape):
        if not (np.all(keeps(plane[seen])) and np.all(drops(plane[~seen]))):
            return False
    return True


def attention_bias(x: g.Expr, defs: dict[g.Var, Any], uses: Any
                   ) -> tuple[g.Expr, g.Expr, list[g.Var]] | None:
    """(the scores, the bias, [x]) when `x`, read once, is `add` of float32 scores of
    static or symbolic shape and a float32 tensor of their rank broadcast to them (each
    dim 1 or theirs); None otherwise."""
    value = defs.get(x) if isinstance(x, g.Var) else None
    if not (isinstance(value, g.Call) and uses[x] == 1 and value.op == "add"):
        return None
    t = value.ret_type
    if not (isinstance(t, TensorType) and t.dtype == "float32"):
        return None
    assert isinstance(x, g.Var)
    for scores, bias in (value.args, value.args[::-1]):
        bt = getattr(bias, "type", None)
        if _typed(scores, t) and isinstance(bt, TensorType) and bt.dtype == "float32" \
                and bt.ndim == t.ndim and all((isinstance(b, int) and b == 1)
                                              or dims_equal(b, s) is True
                                              for b, s in zip(bt.shape, t.shape)):
            return scores, bias, [x]
    return None

"""ONNX converters of com.microsoft's attention operators as LLM exporters write them,
composed from kiln operators (docs/onnx.md, "LLM contrib operators"):

- `GroupQueryAttention` as onnxruntime's CPU kernel computes it: the new key/value rows
  written into the cache at each batch row's past length (`cache_rows`, one pass over
  the past and the new rows), every key/value head serving `num_heads / kv_num_heads` query heads (a
  broadcast matrix product, never a repeated cache), the causal, padding and local-window
  mask read from `seqlens_k`, RoPE from the cos/sin caches, softcap, softmax. The
  present outputs' length `max(past, total_sequence_length)` is a symbolic size when
  `total_sequence_length` comes from a Shape subgraph (onnxruntime-genai's builder reads
  it from the attention mask's shape), else a run-time dimension bound by its value
  (kiln.ops.data_dependent).

The attention is one `attention_tiled` call (kiln.ops.attention_blocks), softcap
included (its `softcap`), whose key loops run to each batch row's `seqlens_k + 1` keys
(`key_counts`): a step on a cache buffer of fixed capacity (the shared-buffer layout)
reads only the cached rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.frontend.onnx.converters.contrib_llm import MS, float32_input, rotate
from kiln.frontend.onnx.converters.data_dependent import fresh_dim_name
from kiln.frontend.onnx.converters.manip import reshape_to
from kiln.frontend.onnx.converters.registry import GraphContext, onnx_op
from kiln.ir import graph as g
from kiln.ir.shape_expr import dim_text, dims_equal
from kiln.ir.types import Dim
from kiln.ops.attention_blocks import ATTENTION
from kiln.ops.data_dependent import GQA_TOTAL_ERROR

I64 = "int64"

#: GroupQueryAttention inputs past the ones kiln reads: (index, name, why refused).
_GQA_REFUSED = ((9, "position_ids"), (10, "attention_bias"), (11, "head_sink"),
                (12, "k_scale"), (13, "v_scale"), (14, "q_norm_weight"),
                (15, "k_norm_weight"), (16, "query_seqlens"))
#: attributes kiln refuses at a value other than their default: (name, default)
_GQA_ATTR_DEFAULTS = (("smooth_softmax", 0), ("qk_output", 0), ("sliding_window_cache", 0),
                      ("causal", 1), ("k_quant_type", "NONE"), ("v_quant_type", "NONE"))


@dataclass(frozen=True)
class _Heads:
    """The head geometry of one attention node."""

    heads: int
    kv_heads: int
    head: int

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads


# ----------------------------------------------------------------------- small helpers

def _iota(ctx: GraphContext, length: Dim) -> g.Expr:
    """0, 1, ..., length - 1 (int64)."""
    one = ctx.const(np.array(1, np.int64))
    return ctx.call("cumsum", ctx.call("where", ctx.true_of_shape([length]), one, one),
                    axis=0, exclusive=1)


def _shaped(ctx: GraphContext, x: g.Expr, rank: int, axis: int) -> g.Expr:
    """The vector `x` as a tensor of `rank` whose only axis of its length is `axis`."""
    n = ctx.tensor_type(x).shape[0]
    return reshape_to(ctx, x, [n if k == axis else 1 for k in range(rank)])


def _i64(ctx: GraphContext, x: g.Expr) -> g.Expr:
    return x if ctx.tensor_type(x).dtype == I64 else ctx.call("cast", x, dtype=I64)


def _to_heads(ctx: GraphContext, x: g.Expr, n: int, head: int) -> g.Expr:
    """(batch, seq, n * head) -> (batch, n, seq, head)."""
    xt = ctx.tensor_type(x)
    return ctx.call("transpose", reshape_to(ctx, x, (xt.shape[0], xt.shape[1], n, head)),
                    perm=(0, 2, 1, 3))


# ------------------------------------------------------------------ GroupQueryAttention

def _gqa_heads(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> _Heads:
    """The head geometry, checked as onnxruntime checks it; unsupported forms refused."""
    heads, kv_heads = int(attrs["num_heads"]), int(attrs["kv_num_heads"])
    for index, name in _GQA_REFUSED:
        if len(inputs) > index and inputs[index] is not None:
            raise IRError(f"GroupQueryAttention input {name} is not supported yet")
    for name, default in _GQA_ATTR_DEFAULTS:
        if attrs.get(name, default) != default:
            raise IRError(f"GroupQueryAttention {name}={attrs[name]!r} is not supported (only "
                          f"{default!r})")
    if heads < 1 or kv_heads < 1 or heads % kv_heads:
        raise IRError(f"GroupQueryAttention num_heads {heads} must be a positive multiple of "
                      f"kv_num_heads {kv_heads}")
    _, qt = float32_input(ctx, inputs, "GroupQueryAttention query")
    hidden = qt.shape[-1] if qt.ndim == 3 else None
    packed = len(inputs) < 2 or inputs[1] is None
    per_token = heads + 2 * kv_heads if packed else heads
    if not isinstance(hidden, int) or hidden % per_token:
        raise IRError(f"GroupQueryAttention query of shape {list(qt.shape)}: (batch, seq, "
                      f"{'(num_heads + 2 * kv_num_heads)' if packed else 'num_heads'} * "
                      "head_size) with a static last dimension")
    return _Heads(heads, kv_heads, hidden // per_token)


def _gqa_qkv(ctx: GraphContext, inputs: Sequence[g.Expr | None],
             h: _Heads) -> tuple[g.Expr, g.Expr, g.Expr]:
    """query, key, value as (batch, seq, n * head), split from a packed QKV."""
    q, k, v = inputs[0], inputs[1], inputs[2]
    assert q is not None
    if k is None:
        if v is not None:
            raise IRError("GroupQueryAttention: key and value are both given, or both "
                          "absent (packed QKV)")
        cuts = np.cumsum([0, h.heads * h.head, h.kv_heads * h.head, h.kv_heads * h.head])
        q, k, v = (ctx.call("strided_slice", q, starts=(int(a),), ends=(int(b),), axes=(2,))
                   for a, b in itertools.pairwise(cuts))
        return q, k, v
    if v is None:
        raise IRError("GroupQueryAttention: value is missing where key is given")
    for name, x in (("key", k), ("value", v)):
        shape = ctx.tensor_type(x).shape
        if len(shape) != 3 or shape[-1] != h.kv_heads * h.head:
            raise IRError(f"GroupQueryAttention {name} of shape {list(shape)}: (batch, seq, "
                          f"kv_num_heads * head_size = {h.kv_heads * h.head})")
    return q, k, v


def _present_iota(ctx: GraphContext, total: g.Expr, past: g.Expr, new: g.Expr) -> g.Expr:
    """The cache positions 0 .. L - 1 of the present outputs, L = max(past length,
    total_sequence_length): a run-time dimension read from total_sequence_length's value
    (even where a Shape subgraph gives it, as onnxruntime-genai's builder writes it: the
    attention mask's length, which kiln cannot prove to be past + seq), bound by the
    length past + seq of past and new rows (batch, kv, rows, head) side by side and
    checked against it (onnxruntime refuses any other total: past + seq for a growing
    cache, at most past for a shared buffer)."""
    length = ctx.call("maximum", ctx.call("shape_of", past, start=2, end=3),
                      ctx.call("reshape", _i64(ctx, total), shape=(1,)))
    # the bound's rows from one lane of one head of one batch row: past + seq values
    # (topk_k reads none of them), not the cache
    lanes = (ctx.call("strided_slice", x, starts=(0, 0, 0), ends=(1, 1, 1), axes=(0, 1, 3))
             for x in (past, new))
    name = fresh_dim_name("present", next((o for o in ctx.node_outputs[1:] if o), "length"))
    return ctx.call("topk_k", length, ctx.call("concat", *lanes, axis=2), axis=2, dim=name,
                    error=GQA_TOTAL_ERROR)


@dataclass(frozen=True)
class _Rows:
    """Each batch row's place in the cache (int64 tensors): `start` (batch,) the past
    rows kept, `totals` (batch,) the keys after this step (seqlens_k + 1), `pos_t` (L,)
    the present's positions, `steps` (seq,) 0 .. seq - 1."""

    start: g.Expr
    totals: g.Expr
    pos_t: g.Expr
    steps: g.Expr


def _checked(ctx: GraphContext, rows: _Rows) -> g.Expr:
    """`rows.totals`, failing the call (gather's index check) unless every batch row has
    1 <= seqlens_k + 1 <= L: onnxruntime refuses those calls, and kiln would read other
    rows as the past's. (Then a row keeps at most L - seq <= past rows of the past, as
    L is past + seq or at most past.) The check is a gather of position 0 (which adds 0)
    or of L (out of range) where a row is wrong."""
    length = ctx.call("shape_of", rows.pos_t, start=0, end=1)
    ok = ctx.call("logical_and", ctx.call("greater", rows.totals, ctx.const(
        np.array(0, np.int64))), ctx.call("less_equal", rows.totals, length))
    index = ctx.call("where", ok, ctx.const(np.array(0, np.int64)), length)
    return ctx.call("add", rows.totals, ctx.call("gather", rows.pos_t, index, axis=0))


def _scores_mask(ctx: GraphContext, rows: _Rows, window: int) -> g.Expr:
    """Which keys (batch, 1, 1, seq, L) each query sees: key t of row b from query s when
    t < seqlens_k[b] + 1 (padding), t <= start[b] + s (causal) and, with a local
    window w, t > start[b] + s - w (onnxruntime's window: w keys, the query's own
    included)."""
    t5 = _shaped(ctx, rows.pos_t, 5, 4)
    at = ctx.call("add", ctx.call("reshape", rows.start, shape=(-1, 1, 1, 1, 1)),
                  _shaped(ctx, rows.steps, 5, 3))  # a query's position (b, 1, 1, s, 1)
    seen = ctx.call("logical_and", ctx.call("less_equal", t5, at), ctx.call(
        "less", t5, ctx.call("reshape", rows.totals, shape=(-1, 1, 1, 1, 1))))
    if window > 0:
        low = ctx.call("subtract", at, ctx.const(np.array(window, np.int64)))
        seen = ctx.call("logical_and", seen, ctx.call("greater", t5, low))
    return seen


def _attend(ctx: GraphContext, q: g.Expr, k: g.Expr, v: g.Expr, seen: g.Expr,
            totals: g.Expr, h: _Heads, scale: float, softcap: float) -> g.Expr:
    """softmax(mask(softcap(Q K^T * scale))) V with each K/V head shared by `group`
    query heads: q (batch, seq, heads * head), k/v (batch, kv, L, head); the result
    (batch, seq, heads * head). A K/V head's group of query heads are the rows (group *
    seq) of one product, so both products read the cache as it is (K^T as the product's
    transposed B): no copy of the keys or values each step. One `attention_tiled` call
    bound to `totals` (batch,) keys per batch row (its `key_counts`): a cache buffer's
    rows past them are not read (a step reads the cached rows, not the buffer's
    capacity)."""
    qt = ctx.tensor_type(q)
    batch, seq = qt.shape[0], qt.shape[1]
    q5 = ctx.call("transpose", reshape_to(ctx, q, (batch, seq, h.kv_heads, h.group, h.head)),
                  perm=(0, 2, 3, 1, 4))  # (batch, kv, group, seq, head)
    q4 = reshape_to(ctx, q5, (batch, h.kv_heads, h.group * seq, h.head))
    lowest = ctx.const(np.array(np.finfo(np.float32).min, np.float32))
    bias = ctx.call("where", _group_rows(ctx, seen, h),
                    ctx.const(np.array(0.0, np.float32)), lowest)
    capped = {"softcap": float(np.float32(softcap))} if softcap > 0 else {}
    out = ctx.call(ATTENTION, q4, k, v, bias, totals, scale=float(np.float32(scale)),
                   transpose_b=True, key_counts=True, **capped)
    out = reshape_to(ctx, out, (batch, h.kv_heads, h.group, seq, h.head))
    out = ctx.call("transpose", out, perm=(0, 3, 1, 2, 4))
    return reshape_to(ctx, out, (batch, seq, h.heads * h.head))


def _group_rows(ctx: GraphContext, seen: g.Expr, h: _Heads) -> g.Expr:
    """The mask (batch, 1, 1, seq, L) for the products' rows (batch, 1, group * seq, L):
    row g * seq + s is query s's (a few bools a step, not the cache)."""
    batch, _, _, seq, length = ctx.tensor_type(seen).shape
    every = ctx.const(np.ones((1, 1, h.group, 1, 1), bool))
    rows = ctx.call("logical_and", seen, every) if h.group > 1 else seen
    return reshape_to(ctx, rows, (batch, 1, h.group * seq, length))


def _gqa_rotary(ctx: GraphContext, inputs: Sequence[g.Expr | None], q: g.Expr, k: g.Expr,
                start: g.Expr, steps: g.Expr, h: _Heads, attrs: dict[str, Any]
                ) -> tuple[g.Expr, g.Expr]:
    """Q and the new K rotated at their positions start[b] + s (do_rotary)."""
    cos, sin = (inputs[k] if len(inputs) > k else None for k in (7, 8))
    if cos is None or sin is None:
        raise IRError("GroupQueryAttention do_rotary needs cos_cache and sin_cache")
    shape = ctx.tensor_type(cos).shape
    half = shape[-1]
    if not isinstance(half, int) or 2 * half > h.head or len(shape) != 2:
        raise IRError(f"GroupQueryAttention cos_cache of shape {list(shape)}: (max_sequence_"
                      f"length, rotary_dim / 2) with rotary_dim <= head_size {h.head}")
    pos = ctx.call("add", ctx.call("reshape", start, shape=(-1, 1)),
                   _shaped(ctx, steps, 2, 1))
    interleaved = bool(attrs.get("rotary_interleaved", 0))
    return (rotate(ctx, q, pos, cos, sin, h.head, 2 * half, interleaved),
            rotate(ctx, k, pos, cos, sin, h.head, 2 * half, interleaved))


def _gqa_past(ctx: GraphContext, inputs: Sequence[g.Expr | None], k: g.Expr,
              h: _Heads) -> tuple[g.Expr, g.Expr]:
    """past_key and past_value, or empty (batch, kv, 0, head) ones when both are absent.
    A head count or size that is a free input dimension (onnxruntime-genai's builder
    names the head size `kv_cache_dim`) is pinned to the attributes' (`ctx.size_is`);
    any other symbolic one is left to the concatenation with the new rows, whose error
    says to pin it (shape_dict)."""
    past_k, past_v = (inputs[i] if len(inputs) > i else None for i in (3, 4))
    if past_k is not None and past_v is not None:
        for name, x in (("past_key", past_k), ("past_value", past_v)):
            shape = ctx.tensor_type(x).shape
            if len(shape) == 4:
                ctx.size_is(shape[1], h.kv_heads, f"{name}'s axis 1 is kv_num_heads")
                ctx.size_is(shape[3], h.head, f"{name}'s axis 3 is the head size")
            if len(shape) != 4 or any(isinstance(d, int) and d != want for d, want in
                                      ((shape[1], h.kv_heads), (shape[3], h.head))):
                raise IRError(f"GroupQueryAttention {name} of shape {list(shape)}: (batch, "
                              f"kv_num_heads = {h.kv_heads}, past, head_size = {h.head})")
        return past_k, past_v
    if past_k is not None or past_v is not None:
        raise IRError("GroupQueryAttention: past_key and past_value are both given or both "
                      "absent")
    empty = ctx.call("strided_slice", _to_heads(ctx, k, h.kv_heads, h.head),
                     starts=(0,), ends=(0,), axes=(2,))
    return empty, empty


@onnx_op(MS + "GroupQueryAttention")
def _group_query_attention(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                           attrs: dict[str, Any]) -> list[g.Expr]:
    """Per batch row b: T = seqlens_k[b] + 1 keys after this step, Q = min(seq, T) new
    rows, P = T - Q rows of the past kept (onnxruntime's rule without query_seqlens);
    query s sits at position P + s."""
    h = _gqa_heads(ctx, inputs, attrs)
    q, k, v = _gqa_qkv(ctx, inputs, h)
    past_k, past_v = _gqa_past(ctx, inputs, k, h)
    seqlens, total = (inputs[i] if len(inputs) > i else None for i in (5, 6))
    if seqlens is None or total is None:
        raise IRError("GroupQueryAttention needs seqlens_k and total_sequence_length")
    steps = _iota(ctx, ctx.tensor_type(q).shape[1])
    totals = ctx.call("add", _i64(ctx, seqlens), ctx.const(np.array(1, np.int64)))
    count = ctx.call("minimum", totals, ctx.call("shape_of", steps, start=0, end=1))
    start = ctx.call("subtract", totals, count)
    if int(attrs.get("do_rotary", 0)):
        q, k = _gqa_rotary(ctx, inputs, q, k, start, steps, h, attrs)
    new_k, new_v = (_to_heads(ctx, x, h.kv_heads, h.head) for x in (k, v))
    rows = _Rows(start, totals, _present_iota(ctx, total, past_k, new_k), steps)
    rows = _Rows(start, _checked(ctx, rows), rows.pos_t, steps)
    # each batch row's past rows, then its new rows at its own length (a padded prompt's
    # padding rows too, as onnxruntime writes them), zero after: onnxruntime's present
    # when it is not the past's buffer
    present_k, present_v = (ctx.call("cache_rows", past, new, rows.start, rows.pos_t)
                            for past, new in ((past_k, new_k), (past_v, new_v)))
    seen = _scores_mask(ctx, rows, int(attrs.get("local_window_size", -1)))
    scale = float(attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(h.head))
    out = _attend(ctx, q, present_k, present_v, seen, rows.totals, h, scale,
                  float(attrs.get("softcap", 0.0)))
    return [out, present_k, present_v]


# ------------------------------------------------------------------- MultiHeadAttention

#: MultiHeadAttention inputs kiln refuses: (index, name)
_MHA_REFUSED = ((8, "past_sequence_length (a shared buffer)"),
                (9, "cache_indirection (beam search)"))


def _opt(inputs: Sequence[g.Expr | None], k: int) -> g.Expr | None:
    return inputs[k] if len(inputs) > k else None


def _mha_split(ctx: GraphContext, inputs: Sequence[g.Expr | None], heads: int
               ) -> tuple[g.Expr, g.Expr, g.Expr, bool]:
    """query, key, value as (batch, heads, seq, head) before the bias, and whether the
    bias applies to key and value (not to a key/value given per head, BNSH). The packed
    forms (QKV (batch, seq, heads, 3, head), KV (batch, kv_seq, heads, 2, head)) are
    refused: onnxruntime's CPU kernel does not compute them either."""
    q, k, v = inputs[0], _opt(inputs, 1), _opt(inputs, 2)
    assert q is not None
    qt = ctx.tensor_type(q)
    kt = ctx.tensor_type(k) if k is not None else None
    if qt.ndim == 5 or (kt is not None and kt.ndim == 5):
        raise IRError("MultiHeadAttention with packed QKV or packed KV is not supported "
                      "(nor by onnxruntime's CPU kernel)")
    if qt.ndim != 3 or k is None or kt is None or v is None:
        raise IRError(f"MultiHeadAttention query of shape {list(qt.shape)}: (batch, seq, "
                      "hidden), with key and value")
    qh = _to_heads(ctx, q, heads, _split_width(qt.shape[2], heads, "query"))
    vt = ctx.tensor_type(v)
    if kt.ndim == 4 and vt.ndim == 4:  # per head already (cross attention's cache)
        return qh, k, v, False
    if kt.ndim != 3 or vt.ndim != 3:
        raise IRError(f"MultiHeadAttention key {list(kt.shape)} and value {list(vt.shape)}: "
                      "both (batch, kv_seq, hidden) or both (batch, heads, kv_seq, head)")
    return (qh, _to_heads(ctx, k, heads, _split_width(kt.shape[2], heads, "key")),
            _to_heads(ctx, v, heads, _split_width(vt.shape[2], heads, "value")), True)


def _split_width(width: Dim, heads: int, what: str) -> int:
    if not isinstance(width, int) or width % heads:
        raise IRError(f"MultiHeadAttention {what} width {width}: a static multiple of "
                      f"num_heads {heads}")
    return width // heads


def _with_bias(ctx: GraphContext, qkv: tuple[g.Expr, g.Expr, g.Expr], bias: g.Expr | None,
               on_kv: bool) -> tuple[g.Expr, ...]:
    """query, key, value plus their parts of `bias` (hidden + hidden + v_hidden), each
    part as (heads, 1, head)."""
    if bias is None:
        return qkv
    if not on_kv:
        raise IRError("MultiHeadAttention bias with key and value given per head (BNSH) is "
                      "not supported")
    out, at = [], 0
    for x in qkv:
        heads, _, head = ctx.tensor_type(x).shape[1:]
        assert isinstance(heads, int) and isinstance(head, int)
        part = ctx.call("strided_slice", bias, starts=(at,), ends=(at + heads * head,),
                        axes=(0,))
        out.append(ctx.call("add", x, reshape_to(ctx, part, (heads, 1, head))))
        at += heads * head
    if ctx.tensor_type(bias).shape != (at,):
        raise IRError(f"MultiHeadAttention bias of shape {list(ctx.tensor_type(bias).shape)}: "
                      f"({at},), the query's, key's and value's widths")
    return tuple(out)


def _mha_mask(ctx: GraphContext, mask: g.Expr | None, causal: bool, shape: Sequence[Dim],
              total: Dim, fill: float) -> g.Expr | None:
    """The additive mask (batch or 1, 1, seq or 1, total): `fill` (mask_filter_value)
    where key_padding_mask hides a key (a length per batch row (batch,), 0/1 over the
    keys (batch, total), or per query (batch, seq, total)) and, unidirectional, after
    the query's position total - seq + s. `shape`: the query's (batch, heads, seq, head)."""
    batch, seq = shape[0], shape[2]
    seen: g.Expr | None = None
    t4 = _shaped(ctx, _iota(ctx, total), 4, 3)  # (1, 1, 1, total)
    if mask is not None:
        mt = ctx.tensor_type(mask)
        if mt.ndim == 1:
            if dims_equal(mt.shape[0], batch) is not True:
                raise IRError(f"MultiHeadAttention key_padding_mask of shape {list(mt.shape)}: "
                              f"a 1-D mask holds one length per batch row ({dim_text(batch)}); "
                              "the (3 * batch + 2) form is not supported")
            lengths = ctx.call("reshape", _i64(ctx, mask), shape=(-1, 1, 1, 1))
            seen = ctx.call("less", t4, lengths)
        elif mt.ndim in (2, 3):
            # its columns read at the keys' positions: exporters name its last size apart
            # from past + kv_seq, so kiln cannot prove them equal (the gather checks that
            # each key has a column)
            keys = ctx.call("gather", mask, _iota(ctx, total), axis=mt.ndim - 1)
            nonzero = ctx.call("not_equal", keys, ctx.const(np.array(0, np.int32)))
            shape = (mt.shape[0], 1, 1, total) if mt.ndim == 2 else \
                (mt.shape[0], 1, mt.shape[1], total)
            seen = reshape_to(ctx, nonzero, shape)
        else:
            raise IRError(f"MultiHeadAttention key_padding_mask of shape {list(mt.shape)}: "
                          "(batch), (batch, total) or (batch, seq, total)")
    if causal:
        s4 = _shaped(ctx, _iota(ctx, seq), 4, 2)
        offset = ctx.call("subtract", ctx.call("shape_of", t4, start=3, end=4),
                          ctx.call("shape_of", s4, start=2, end=3))
        ok = ctx.call("less_equal", t4, ctx.call("add", s4, offset))
        seen = ok if seen is None else ctx.call("logical_and", seen, ok)
    if seen is None:
        return None
    return ctx.call("where", seen, ctx.const(np.array(0, np.float32)),
                    ctx.const(np.array(fill, np.float32)))


@onnx_op(MS + "MultiHeadAttention")
def _multi_head_attention(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                          attrs: dict[str, Any]) -> list[g.Expr]:
    """softmax(Q K^T * scale + mask + attention_bias) V per head, the past's rows before
    the new keys and values (present), as onnxruntime's CPU kernel computes it."""
    heads = int(attrs["num_heads"])
    for index, name in _MHA_REFUSED:
        if _opt(inputs, index) is not None:
            raise IRError(f"MultiHeadAttention input {name} is not supported yet")
    if len(ctx.node_outputs) > 3 and ctx.node_outputs[3]:
        raise IRError("MultiHeadAttention output qk is not supported yet")
    float32_input(ctx, inputs, "MultiHeadAttention query")
    q, k, v = _with_bias(ctx, *_mha_split_biased(ctx, inputs, heads))
    past_k, past_v = _opt(inputs, 6), _opt(inputs, 7)
    if (past_k is None) != (past_v is None):
        raise IRError("MultiHeadAttention: past_key and past_value are both given or both "
                      "absent")
    if past_k is not None and past_v is not None:
        k = ctx.call("concat", past_k, k, axis=2)
        v = ctx.call("concat", past_v, v, axis=2)
    qt, kt = ctx.tensor_type(q), ctx.tensor_type(k)
    head = qt.shape[3]
    assert isinstance(head, int)
    scale = float(attrs.get("scale", 0.0)) or 1.0 / float(np.sqrt(head))
    scores = ctx.call("multiply", ctx.call("matmul", q, ctx.call("transpose", k,
                                                                 perm=(0, 1, 3, 2))),
                      ctx.const(np.array(scale, np.float32)))
    mask = _mha_mask(ctx, _opt(inputs, 4), bool(attrs.get("unidirectional", 0)), qt.shape,
                     kt.shape[2], float(attrs.get("mask_filter_value", -10000.0)))
    for extra in (mask, _opt(inputs, 5)):
        if extra is not None:
            scores = ctx.call("add", scores, extra)
    out = ctx.call("transpose", ctx.call("matmul", ctx.call("softmax", scores, axis=3), v),
                   perm=(0, 2, 1, 3))
    ot = ctx.tensor_type(out)
    out = reshape_to(ctx, out, (ot.shape[0], ot.shape[1], heads * ot.shape[3]))
    return [out, k, v]


def _mha_split_biased(ctx: GraphContext, inputs: Sequence[g.Expr | None], heads: int
                      ) -> tuple[tuple[g.Expr, g.Expr, g.Expr], g.Expr | None, bool]:
    q, k, v, on_kv = _mha_split(ctx, inputs, heads)
    return (q, k, v), _opt(inputs, 3), on_kv

"""ONNX operators imported as compositions of kiln operators (no kernel of their own).

- TensorScatter (opset 24): a KV-cache update, `scatter_elements` along `axis` at
  `write_indices[b] + s` (modulo the cache length in `circular` mode).
- Col2Im (opset 18): its attributes checked, then kiln.ops.nn's `col2im`, which sums
  for each image element the column entries landing on it (those landing in the
  padding are dropped).
- MaxUnpool: `scatter_elements` of X into zeros of the output shape at the flat
  indices MaxPool returns (with `output_shape`, they address that shape, as in
  onnxruntime; onnx's reference implementation pads the default shape instead).
- TfIdfVectorizer over integer tokens: per pool n-gram and skip, `equal` of gathered
  token columns, `logical_and`, `reduce_sum`; then TF / IDF / TFIDF weighting.
- Det of matrices up to 4x4 (Leibniz formula over gathered elements).
- MelWeightMatrix: a constant computed at import from its constant inputs.
- ai.onnx.ml TreeEnsemble (SUM / AVERAGE, no post transform): per leaf, its weight
  times the conjunction of the branch conditions on its path, summed per target.
- ai.onnx.ml Binarizer (`X > threshold`, as X's type) and ArrayFeatureExtractor
  (`gather` along the last axis).

Semantics follow the ONNX standard's operator definitions. Shapes must be static.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.frontend.onnx.converters.registry import (
    GraphContext,
    first_input,
    need_static,
    onnx_dtype,
    onnx_op,
)
from kiln.frontend.onnx.converters.sampling import chain
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir.dtype import to_numpy
from kiln.ir.types import TensorType


def _static(t: TensorType, op: str) -> tuple[int, ...]:
    if not all(isinstance(d, int) for d in t.shape):
        raise IRError(f"{op} needs static shapes, got {t.shape}")
    return tuple(int(d) for d in t.shape)  # type: ignore[arg-type]


def _required(inputs: Sequence[g.Expr | None], k: int, op: str, what: str) -> g.Expr:
    x = inputs[k] if k < len(inputs) else None
    if x is None:
        raise IRError(f"{op} needs its {what} input")
    return x


@onnx_op("TensorScatter", min_opset=24)
def _tensor_scatter_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                         attrs: dict[str, Any]) -> list[g.Expr]:
    cache = first_input(inputs)
    update = _required(inputs, 1, "TensorScatter", "update")
    shape = _static(ctx.tensor_type(cache), "TensorScatter")
    ushape = _static(ctx.tensor_type(update), "TensorScatter")
    rank = len(shape)
    axis = int(attrs.get("axis", -2))
    if not -rank <= axis < rank or axis % rank == 0:
        raise IRError(f"TensorScatter: axis {axis} must name a non-batch axis of rank {rank}")
    axis %= rank
    mode = str(attrs.get("mode", "linear"))
    if mode not in ("linear", "circular"):
        raise IRError(f"TensorScatter: unknown mode {mode!r}; known: linear, circular")
    if len(ushape) != rank or any(u != s for k, (u, s) in enumerate(zip(ushape, shape))
                                  if k != axis) or ushape[axis] > shape[axis]:
        raise IRError(f"TensorScatter: update {ushape} does not fit cache {shape} along "
                      f"axis {axis}")
    batch = shape[0]
    writes = inputs[2] if len(inputs) > 2 else None
    if writes is None:
        writes = ctx.const(np.zeros(batch, np.int64))
    elif ctx.tensor_type(writes).dtype != "int64":
        writes = ctx.call("cast", writes, dtype="int64")
    # [B, 1.., 1, 1..] + [1, 1.., S_new, 1..]: the cache position of every update row
    starts = ctx.call("reshape", writes, shape=(batch,) + (1,) * (rank - 1))
    steps = np.arange(ushape[axis], dtype=np.int64).reshape(
        [ushape[axis] if k == axis else 1 for k in range(rank)])
    index = ctx.call("add", starts, ctx.const(steps))
    if mode == "circular":
        index = ctx.call("mod", index, ctx.const(np.array(shape[axis], np.int64)))
    index = ctx.call("broadcast_to", index, shape=ushape)
    return [ctx.call("scatter_elements", cache, index, update, axis=axis)]


@onnx_op("Col2Im", min_opset=18)
def _col2im_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                 attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    image = [int(v) for v in need_static(ctx, _required(inputs, 1, "Col2Im", "image_shape"),
                                         "Col2Im image_shape")]
    block = [int(v) for v in need_static(ctx, _required(inputs, 2, "Col2Im", "block_shape"),
                                         "Col2Im block_shape")]
    k = len(image)
    if len(block) != k or k < 1:
        raise IRError(f"Col2Im: image_shape {image} and block_shape {block} differ in length")
    dilations = [int(v) for v in attrs.get("dilations", [1] * k)]
    strides = [int(v) for v in attrs.get("strides", [1] * k)]
    pads = [int(v) for v in attrs.get("pads", [0] * 2 * k)]
    _, cb, length = _static(ctx.tensor_type(x), "Col2Im")
    blocks = int(np.prod(block))
    if cb % blocks:
        raise IRError(f"Col2Im: input dimension 1 ({cb}) is not a multiple of the block "
                      f"size {blocks}")
    counts = [(image[i] + pads[i] + pads[i + k] - dilations[i] * (block[i] - 1) - 1)
              // strides[i] + 1 for i in range(k)]
    if any(c < 1 for c in counts):
        raise IRError(f"Col2Im: no block position fits image {tuple(image)} with block "
                      f"{tuple(block)}, dilations {tuple(dilations)}, pads {tuple(pads)}")
    if int(np.prod(counts)) != length:
        raise IRError(f"Col2Im: input has {length} block positions, the attributes give "
                      f"{int(np.prod(counts))}")
    # nn.col2im: each image element sums the column entries that land on it, and only
    # those (a NaN or an infinity spreads nowhere else, as in onnxruntime)
    return [ctx.call("col2im", x, image_shape=image, block_shape=block, strides=strides,
                     dilations=dilations, pads=pads)]


@onnx_op("MaxUnpool", min_opset=9)
def _max_unpool_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                     attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    indices = _required(inputs, 1, "MaxUnpool", "indices")
    shape = _static(ctx.tensor_type(x), "MaxUnpool")
    kernel = [int(v) for v in attrs["kernel_shape"]]
    k = len(kernel)
    strides = [int(v) for v in attrs.get("strides", [1] * k)]
    pads = [int(v) for v in attrs.get("pads", [0] * 2 * k)]
    inferred = (*shape[:2], *((shape[2 + i] - 1) * strides[i] - pads[i] - pads[i + k]
                              + kernel[i] for i in range(k)))
    given = inputs[2] if len(inputs) > 2 else None
    out_shape = tuple(int(v) for v in need_static(ctx, given, "MaxUnpool output_shape")) \
        if given is not None else inferred
    if len(out_shape) != len(inferred) or any(o < i for o, i in zip(out_shape, inferred)):
        raise IRError(f"MaxUnpool: output_shape {out_shape} is smaller than the unpooled "
                      f"shape {inferred}")
    # The indices address the output_shape tensor (they index MaxPool's input), as in
    # onnxruntime and PyTorch's max_unpool; onnx's reference pads the unpooled tensor.
    total = int(np.prod(out_shape))
    dtype = ctx.tensor_type(x).dtype
    zeros = ctx.call("broadcast_to", ctx.const(np.zeros(1, to_numpy(dtype))), shape=(total,))
    flat_idx = ctx.call("reshape", indices, shape=(int(np.prod(shape)),))
    if ctx.tensor_type(flat_idx).dtype != "int64":
        flat_idx = ctx.call("cast", flat_idx, dtype="int64")
    y = ctx.call("scatter_elements", zeros, flat_idx,
                 ctx.call("reshape", x, shape=(int(np.prod(shape)),)), axis=0)
    return [ctx.call("reshape", y, shape=out_shape)]


@onnx_op("ai.onnx.ml.Binarizer")
def _binarizer_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                    attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    dtype = ctx.tensor_type(x).dtype
    above = ctx.call("greater", x, ctx.const(np.array(attrs.get("threshold", 0.0),
                                                      to_numpy(dtype))))
    return [ctx.call("cast", above, dtype=dtype)]


@onnx_op("ai.onnx.ml.ArrayFeatureExtractor")
def _array_feature_extractor_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                                  attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    picks = _required(inputs, 1, "ArrayFeatureExtractor", "Y")
    xt = ctx.tensor_type(x)
    flat = ctx.call("reshape", picks, shape=(-1,))
    out = ctx.call("gather", x, flat, axis=xt.ndim - 1)
    if xt.ndim == 1:  # onnxruntime and the ONNX-ML spec give [1, len(Y)] for a vector
        out = ctx.call("reshape", out, shape=(1, -1))
    return [out]


def _pool_grams(attrs: dict[str, Any]) -> list[tuple[tuple[int, ...], int]]:
    """TfIdfVectorizer's pool as (n-gram tokens, output index) for the lengths it counts
    (min_gram_length..max_gram_length), from pool_int64s, ngram_counts, ngram_indexes."""
    if "pool_strings" in attrs:
        raise IRError("TfIdfVectorizer over strings (pool_strings): string tensors are not "
                      "supported by kiln")
    pool = [int(v) for v in attrs.get("pool_int64s", ())]
    starts = [int(v) for v in attrs["ngram_counts"]]
    indexes = [int(v) for v in attrs["ngram_indexes"]]
    lo, hi = int(attrs["min_gram_length"]), int(attrs["max_gram_length"])
    grams = []
    gram_id = 0
    for k, start in enumerate(starts):
        n = k + 1
        end = starts[k + 1] if k + 1 < len(starts) else len(pool)
        for first in range(start, end - n + 1, n):
            if lo <= n <= hi:
                if gram_id >= len(indexes):
                    raise IRError(f"TfIdfVectorizer: ngram_indexes has {len(indexes)} entries, "
                                  "fewer than the pool's n-grams")
                grams.append((tuple(pool[first:first + n]), indexes[gram_id]))
            gram_id += 1
    return grams


@onnx_op("TfIdfVectorizer", min_opset=9)
def _tfidf_vectorizer_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                           attrs: dict[str, Any]) -> list[g.Expr]:
    """Counts of each pool n-gram in each row of X (tokens `skip + 1` apart for every skip
    up to max_skip_count; unigrams once), then TF, IDF or TFIDF weighting."""
    x = first_input(inputs)
    xt = ctx.tensor_type(x)
    shape = _static(xt, "TfIdfVectorizer")
    if xt.ndim not in (1, 2):
        raise IRError(f"TfIdfVectorizer: X must be [C] or [N, C], got {shape}")
    mode = str(attrs.get("mode", "TF"))
    if mode not in ("TF", "IDF", "TFIDF"):
        raise IRError(f"TfIdfVectorizer: unknown mode {mode!r}; known: TF, IDF, TFIDF")
    width = shape[-1]
    size = max(int(v) for v in attrs["ngram_indexes"]) + 1
    max_skip = int(attrs.get("max_skip_count", 0))
    ints = ctx.call("cast", x, dtype="int64") if xt.dtype != "int64" else x
    counts: dict[int, g.Expr] = {}
    for tokens, out in _pool_grams(attrs):
        n = len(tokens)
        for skip in range(1 if n == 1 else max_skip + 1):
            span = (n - 1) * (skip + 1)
            if span >= width:
                break
            hits: g.Expr | None = None
            for k, token in enumerate(tokens):
                at = ctx.const(np.arange(k * (skip + 1), k * (skip + 1) + width - span,
                                         dtype=np.int64))
                eq = ctx.call("equal", ctx.call("gather", ints, at, axis=xt.ndim - 1),
                              ctx.const(np.array(token, np.int64)))
                hits = eq if hits is None else ctx.call("logical_and", hits, eq)
            assert hits is not None
            found = ctx.call("reduce_sum", ctx.call("cast", hits, dtype="float32"),
                             axes=(xt.ndim - 1,), keepdims=True)
            counts[out] = found if out not in counts else ctx.call("add", counts[out], found)
    rows = shape[:-1]
    zero = ctx.const(np.zeros((*rows, 1), np.float32))
    y = ctx.call("concat", *[counts.get(i, zero) for i in range(size)], axis=xt.ndim - 1)
    given = np.asarray(attrs.get("weights", ()), np.float32)
    indexes = [int(v) for v in attrs["ngram_indexes"]]
    weights = np.zeros(size, np.float32)
    if mode != "TF" and given.size:
        if given.size != len(indexes):
            raise IRError(f"TfIdfVectorizer: {given.size} weights for {len(indexes)} n-grams "
                          "(ngram_indexes)")
        # weight j belongs to pool n-gram j, which counts into output ngram_indexes[j]
        # (the standard's text, and onnxruntime)
        weights[indexes] = given
    if mode == "IDF":
        present = ctx.call("cast", ctx.call("greater", y, ctx.const(np.array(0, np.float32))),
                           dtype="float32")
        y = ctx.call("multiply", present, ctx.const(weights)) if given.size else present
    elif mode == "TFIDF" and given.size:
        y = ctx.call("multiply", y, ctx.const(weights))
    return [y]


MAX_DET_SIZE = 4


@onnx_op("Det", min_opset=11)
def _det_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
              attrs: dict[str, Any]) -> list[g.Expr]:
    """The determinant of each trailing [n, n] matrix by the Leibniz formula (n <= 4)."""
    x = first_input(inputs)
    xt = ctx.tensor_type(x)
    if xt.ndim < 2 or not isinstance(xt.shape[-1], int) or xt.shape[-1] != xt.shape[-2]:
        raise IRError(f"Det needs square matrices in the last two axes, got {xt.shape}")
    n = int(xt.shape[-1])
    if n > MAX_DET_SIZE:
        raise IRError(f"Det: kiln computes determinants of matrices up to {MAX_DET_SIZE}x"
                      f"{MAX_DET_SIZE} (Leibniz formula), got {n}x{n}")
    flat = ctx.call("reshape", x, shape=(*(-2 - k for k in range(xt.ndim - 2)), n * n))
    total: g.Expr | None = None
    for perm in itertools.permutations(range(n)):
        inversions = sum(perm[i] > perm[j] for i in range(n) for j in range(i + 1, n))
        term = ctx.call("gather", flat, ctx.const(np.array(perm[0], np.int64)), axis=xt.ndim - 2)
        for i in range(1, n):
            term = ctx.call("multiply", term, ctx.call(
                "gather", flat, ctx.const(np.array(i * n + perm[i], np.int64)),
                axis=xt.ndim - 2))
        if total is None:
            total = term if inversions % 2 == 0 else ctx.call("neg", term)
        else:
            total = ctx.call("subtract" if inversions % 2 else "add", total, term)
    assert total is not None
    return [total]


def max_pool_indices(ctx: GraphContext, x: g.Expr, values: g.Expr, kernel: Sequence[int],
                     strides: Sequence[int], dilations: Sequence[int], pads: Sequence[int],
                     storage_order: int) -> tuple[g.Expr, g.Expr]:
    """MaxPool's two outputs as onnxruntime computes them when the indices are asked for:
    each window's maximum and its flat index into X (`((n*C + c)*H + h)*W + w`, or
    `w*H + h` within a plane for storage_order 1), the window read in row-major order
    from its first element inside X, replaced only by a strictly greater one (a leading
    NaN stays, a later one is skipped: kiln.ops.nan_order.max_keep_first); `values`
    (MaxPool's first output) gives the shape. Each window position is a `gather` of X
    with constant indices; a running `greater` keeps the first maximum."""
    xt, vt = ctx.tensor_type(x), ctx.tensor_type(values)
    shape, out_shape = _static(xt, "MaxPool"), _static(vt, "MaxPool")
    n, c, spatial, out_spatial = shape[0], shape[1], shape[2:], out_shape[2:]
    rank = len(spatial)
    plane = int(np.prod(spatial))
    points = int(np.prod(out_spatial))
    flat = ctx.call("reshape", x, shape=(n, c, plane))
    np_dtype = np.dtype(to_numpy(xt.dtype))
    lowest = ctx.const(np.array(-np.inf if np_dtype.kind == "f" else np.iinfo(np_dtype).min,
                                np_dtype))
    order = list(reversed(range(rank))) if storage_order else list(range(rank))
    out_pos = np.stack(np.meshgrid(*[np.arange(o) for o in out_spatial], indexing="ij"))
    best: g.Expr | None = None
    arg: g.Expr | None = None
    seen = np.zeros(points, bool)  # windows that met an element inside X already
    for offset in itertools.product(*map(range, kernel)):
        at = [out_pos[i] * strides[i] - pads[i] + offset[i] * dilations[i] for i in range(rank)]
        inside = np.logical_and.reduce([(a >= 0) & (a < s) for a, s in zip(at, spatial)])
        clipped = [np.clip(a, 0, s - 1) for a, s in zip(at, spatial)]
        read = np.ravel_multi_index(clipped, spatial).reshape(-1).astype(np.int64)
        stored = np.ravel_multi_index([clipped[i] for i in order],
                                      [spatial[i] for i in order]).reshape(-1).astype(np.int64)
        v = ctx.call("gather", flat, ctx.const(read), axis=2)
        v = ctx.call("where", ctx.const(inside.reshape(-1)), v, lowest)
        here = ctx.const(stored)
        first = inside.reshape(-1) & ~seen  # a window's first element inside X starts it
        seen |= inside.reshape(-1)
        if best is None or arg is None:
            best, arg = v, ctx.call("broadcast_to", here, shape=(n, c, points))
            continue
        better = ctx.call("greater", v, best)
        if first.any():
            better = ctx.call("logical_or", better, ctx.const(first))
        best = ctx.call("where", better, v, best)
        arg = ctx.call("where", better, here, arg)
    assert arg is not None and best is not None
    base = (np.arange(n * c, dtype=np.int64) * plane).reshape(n, c, 1)
    return (ctx.call("reshape", best, shape=out_shape),
            ctx.call("reshape", ctx.call("add", arg, ctx.const(base)), shape=out_shape))


@onnx_op("MelWeightMatrix", min_opset=17)
def _mel_weight_matrix_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                            attrs: dict[str, Any]) -> list[g.Expr]:
    """The [dft_length // 2 + 1, num_mel_bins] triangular filter bank, computed at import
    from its constant inputs (the standard's formula, as in onnx's reference)."""
    names = ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz",
             "upper_edge_hertz")
    args = [need_static(ctx, _required(inputs, k, "MelWeightMatrix", name),
                        f"MelWeightMatrix {name}")[0] for k, name in enumerate(names)]
    bins, dft, rate = int(args[0]), int(args[1]), int(args[2])
    low, high = float(args[3]), float(args[4])
    if bins < 1 or dft < 1 or rate < 1:
        raise IRError(f"MelWeightMatrix: num_mel_bins {bins}, dft_length {dft} and "
                      f"sample_rate {rate} must be positive")
    rows = dft // 2 + 1
    ctx.check_materialize(rows * bins * 8, "MelWeightMatrix")
    low_mel = 2595 * np.log1p(low / 700) / np.log(10)
    high_mel = 2595 * np.log1p(high / 700) / np.log(10)
    mels = np.arange(bins + 2) * ((high_mel - low_mel) / (bins + 2)) + low_mel
    hertz = 700 * np.expm1(mels / 2595 * np.log(10))
    edges = (((dft + 1) * hertz) // rate).astype(int)
    if edges.min() < 0 or edges[:-1].max() >= rows or edges[-1] > rows:
        raise IRError(f"MelWeightMatrix: the band edges {low}..{high} Hz fall outside the "
                      f"{rows} spectrogram bins")
    out = np.zeros((rows, bins))
    for i in range(bins):
        left, center, right = edges[i], edges[i + 1], edges[i + 2]
        if center == left:
            out[center, i] = 1
        else:
            out[left:center + 1, i] = (np.arange(left, center + 1) - left) / (center - left)
        if right > center:
            out[center:right, i] = (right - np.arange(center, right)) / (right - center)
    dtype = onnx_dtype(int(attrs.get("output_datatype", 1)), "MelWeightMatrix: output_datatype")
    return [ctx.const(out.astype(dt.to_numpy(dtype)))]


TREE_MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ",
              "BRANCH_MEMBER")
_TREE_COMPARE = ("less_equal", "less", "greater_equal", "greater", "equal", "not_equal")


@onnx_op("ai.onnx.ml.TreeEnsemble")
def _tree_ensemble_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                        attrs: dict[str, Any]) -> list[g.Expr]:
    """ai.onnx.ml TreeEnsemble with SUM or AVERAGE aggregation and no post transform:
    each leaf's weight times the `logical_and` of the branch conditions on its path
    (one column `gather` and comparison per tree node), summed per target."""
    x = first_input(inputs)
    xt = ctx.tensor_type(x)
    n, _features = _static(xt, "TreeEnsemble")
    aggregate = int(attrs.get("aggregate_function", 1))
    if aggregate not in (0, 1) or int(attrs.get("post_transform", 0)) != 0:
        raise IRError("TreeEnsemble: kiln imports aggregate_function SUM or AVERAGE without "
                      "post_transform")
    np_dtype = to_numpy(xt.dtype)
    modes = [int(m) for m in np.asarray(attrs["nodes_modes"]).reshape(-1)]
    splits = np.asarray(attrs["nodes_splits"]).reshape(-1)
    features = [int(f) for f in attrs["nodes_featureids"]]
    true_ids, false_ids = attrs["nodes_truenodeids"], attrs["nodes_falsenodeids"]
    true_leaf, false_leaf = attrs["nodes_trueleafs"], attrs["nodes_falseleafs"]
    missing = attrs.get("nodes_missing_value_tracks_true", [0] * len(modes))
    leaf_targets = [int(t) for t in attrs["leaf_targetids"]]
    leaf_weights = np.asarray(attrs["leaf_weights"]).reshape(-1)
    members = iter(np.asarray(attrs.get("membership_values", np.zeros(0))).reshape(-1))
    if any(m >= len(TREE_MODES) for m in modes):
        raise IRError(f"TreeEnsemble: unknown node mode in {modes}; known: "
                      f"{', '.join(TREE_MODES)}")

    def condition(node: int) -> g.Expr:
        column = ctx.call("gather", x, ctx.const(np.array(features[node], np.int64)), axis=1)
        if modes[node] < len(_TREE_COMPARE):
            cond = ctx.call(_TREE_COMPARE[modes[node]], column,
                            ctx.const(np.array(splits[node], np_dtype)))
        else:  # set membership: the next NaN-terminated run of membership_values
            values = []
            for v in members:
                if np.isnan(v):
                    break
                values.append(v)
            if not values:
                raise IRError(f"TreeEnsemble: node {node} tests membership of an empty set")
            cond = chain(ctx, "logical_or", [
                ctx.call("equal", column, ctx.const(np.array(v, np_dtype))) for v in values])
        if missing[node]:
            cond = ctx.call("logical_or", cond, ctx.call("isnan", column))
        return cond

    # leaves of every tree with their path conditions, visiting nodes in onnx's order
    # (node, true branch, false branch: the order membership sets are consumed in)
    per_target: dict[int, list[g.Expr]] = {}

    def visit(node: int, path: g.Expr | None, depth: int) -> None:
        if depth > len(modes):
            raise IRError("TreeEnsemble: the nodes form a cycle")
        cond = condition(node)
        for branch, ids, leafs in ((cond, true_ids, true_leaf),
                                   (ctx.call("logical_not", cond), false_ids, false_leaf)):
            here = branch if path is None else ctx.call("logical_and", path, branch)
            if leafs[node]:
                add_leaf(int(ids[node]), here)
            else:
                visit(int(ids[node]), here, depth + 1)

    def add_leaf(leaf: int, path: g.Expr | None) -> None:
        weight = ctx.const(np.array(leaf_weights[leaf], np_dtype))
        value = weight if path is None else ctx.call(
            "multiply", ctx.call("cast", path, dtype=xt.dtype), weight)
        per_target.setdefault(leaf_targets[leaf], []).append(value)

    roots = [int(r) for r in attrs["tree_roots"]]
    for root in roots:
        if true_leaf[root] and false_leaf[root] and true_ids[root] == false_ids[root]:
            add_leaf(int(true_ids[root]), None)
        else:
            visit(root, None, 0)
    targets = int(attrs.get("n_targets", max(leaf_targets) + 1))
    zero = ctx.const(np.zeros((n,), np_dtype))
    columns = []
    for t in range(targets):
        total = chain(ctx, "add", [ctx.call("broadcast_to", v, shape=(n,))
                                   for v in per_target.get(t, [])] or [zero])
        if aggregate == 0:
            total = ctx.call("divide", total, ctx.const(np.array(len(roots), np_dtype)))
        columns.append(ctx.call("reshape", total, shape=(n, 1)))
    return [ctx.call("concat", *columns, axis=1)]


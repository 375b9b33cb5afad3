"""ONNX converters onto kiln.ops.manip's shape and layout operators (Reshape, Flatten,
Squeeze, Unsqueeze, Transpose, DepthToSpace, SpaceToDepth, Concat, Slice, Split,
Expand, Tile, Pad, CenterCropPad, Trilu, ReverseSequence), and the ONNX ops that need
no op of their own (Identity, Dropout, Shape, Size, Constant, ConstantOfShape, Range,
EyeLike)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.frontend.onnx.converters.registry import (
    GraphContext,
    first_input,
    need_constant,
    need_dims,
    onnx_dtype,
    onnx_op,
)
from kiln.ir import graph as g
from kiln.ir.shape_expr import (
    dim_product,
    dim_text,
    dims_equal,
    is_static,
    shape_text,
    simplify_dim,
)
from kiln.ir.tensor import (
    PrimExpr,
)
from kiln.ir.types import Dim
from kiln.ops.reduce import norm_axes
from kiln.ops.reshape_dims import fill_rest, reshape_attr


@onnx_op("Reshape")
def _reshape_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    shape_in = (attrs.get("shape") if ctx.opset < 5
                else need_dims(ctx, inputs[1], "Reshape shape"))
    assert shape_in is not None
    src = ctx.tensor_type(x).shape
    shape: list[Dim] = list(np.asarray(shape_in, dtype=object).reshape(-1))
    allow_zero = bool(attrs.get("allowzero", 0))
    for k, d in enumerate(shape):
        if isinstance(d, (int, np.integer)) and d == 0 and not allow_zero:
            shape[k] = src[k]
    return [reshape_to(ctx, x, shape)]


def reshape_to(ctx: GraphContext, x: g.Expr, target: Sequence[Dim]) -> g.Expr:
    """`x` viewed as `target` (dimensions, at most one -1): the reshape converters' one path,
    shared with the recurrent ops' converters."""
    src = ctx.tensor_type(x).shape
    shape: list[Dim] = [int(d) if isinstance(d, (int, np.integer)) else d for d in target]
    if any(isinstance(d, int) and d == -1 for d in shape):
        # the -1 is the element count divided by the other sizes: onnxruntime refuses
        # the reshape when they are 0 (an empty batch before a head merge), and so do we
        known = dim_product(d for d in shape if not (isinstance(d, int) and d == -1))
        ctx.require_nonzero(known, f"the -1 of shape {shape_text(shape)} divides the element "
                                   f"count by {dim_text(known)}")
    if is_static(shape) and is_static(src):
        ints = [int(d) for d in shape]  # type: ignore[arg-type]
        if -1 in ints:
            known = int(np.prod([d for d in ints if d != -1]))
            ints[ints.index(-1)] = int(np.prod(src)) // max(known, 1)  # type: ignore[arg-type]
        return ctx.call("reshape", x, shape=tuple(ints))
    return ctx.call("reshape", x, shape=reshape_attr(src, fill_rest(src, shape)))


@onnx_op("Flatten")
def _flatten_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    shape = ctx.tensor_type(x).shape
    axis = int(attrs.get("axis", 1))
    # [-r, r]: r too, the split after the last dim (slicing would take any axis past it)
    if not -len(shape) <= axis <= len(shape):
        raise IRError(f"Flatten: axis {axis} is out of range [-{len(shape)}, {len(shape)}] "
                      f"for {shape_text(shape)}")
    axis = axis + len(shape) if axis < 0 else axis
    return [reshape_to(ctx, x, (dim_product(shape[:axis]), dim_product(shape[axis:])))]


@onnx_op("Squeeze")
def _squeeze_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    shape = ctx.tensor_type(x).shape
    if ctx.opset >= 13:
        axes_v = ctx.value(inputs[1]) if len(inputs) > 1 else None
        axes_raw = None if axes_v is None else tuple(int(a) for a in axes_v.reshape(-1))
        if len(inputs) > 1 and inputs[1] is not None and axes_v is None:
            raise IRError("Squeeze axes must be a compile-time constant")
    else:
        axes_raw = attrs.get("axes")
    axes = norm_axes(axes_raw, len(shape)) if axes_raw is not None else tuple(
        k for k, d in enumerate(shape) if isinstance(d, int) and d == 1)
    for a in axes:
        if not (isinstance(shape[a], int) and shape[a] == 1):
            raise IRError(f"Squeeze: dimension {a} has size {dim_text(shape[a])}, not 1")
    return [reshape_to(ctx, x, tuple(d for k, d in enumerate(shape) if k not in axes))]


@onnx_op("Unsqueeze")
def _unsqueeze_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                    attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    shape: list[Dim] = list(ctx.tensor_type(x).shape)
    raw = (need_constant(ctx, inputs[1], "Unsqueeze axes").reshape(-1) if ctx.opset >= 13
           else attrs["axes"])
    axes = norm_axes(tuple(int(a) for a in raw), len(shape) + len(raw))
    for a in sorted(axes):
        shape.insert(a, 1)
    return [reshape_to(ctx, x, tuple(shape))]


@onnx_op("Transpose")
def _transpose_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                    attrs: dict[str, Any]) -> list[g.Expr]:
    perm = attrs.get("perm")
    return [ctx.call("transpose", first_input(inputs), perm=None if perm is None else tuple(perm))]


@onnx_op("DepthToSpace")
def _depth_to_space_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                         attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    n, c, h, w = ctx.tensor_type(x).static_shape
    b = int(attrs["blocksize"])
    if c % (b * b):
        raise IRError(f"DepthToSpace: {c} channels are not divisible by blocksize^2 = {b * b}")
    if attrs.get("mode", "DCR") == "DCR":
        y = ctx.call("reshape", x, shape=(n, b, b, c // (b * b), h, w))
        y = ctx.call("transpose", y, perm=(0, 3, 4, 1, 5, 2))
    else:  # CRD
        y = ctx.call("reshape", x, shape=(n, c // (b * b), b, b, h, w))
        y = ctx.call("transpose", y, perm=(0, 1, 4, 2, 5, 3))
    return [ctx.call("reshape", y, shape=(n, c // (b * b), h * b, w * b))]


@onnx_op("SpaceToDepth")
def _space_to_depth_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                         attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    n, c, h, w = ctx.tensor_type(x).static_shape
    b = int(attrs["blocksize"])
    if h % b or w % b:
        raise IRError(f"SpaceToDepth: spatial dims {h}x{w} are not divisible by blocksize {b}")
    y = ctx.call("reshape", x, shape=(n, c, h // b, b, w // b, b))
    # DCR: output channel = (row in block, column in block, c); CRD: (c, row, column)
    perm = (0, 1, 3, 5, 2, 4) if attrs.get("mode", "DCR") == "CRD" else (0, 3, 5, 1, 2, 4)
    y = ctx.call("transpose", y, perm=perm)
    return [ctx.call("reshape", y, shape=(n, c * b * b, h // b, w // b))]


@onnx_op("Concat")
def _concat_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                 attrs: dict[str, Any]) -> list[g.Expr]:
    # Inputs of size 0 drop out (a symbolic dimension is taken to be non-zero).
    args = [x for x in inputs if x is not None and not any(
        isinstance(d, int) and d == 0 for d in ctx.tensor_type(x).shape)]
    if not args:
        raise IRError("Concat of only empty tensors")
    axis = norm_axes(attrs["axis"], ctx.tensor_type(args[0]).ndim)[0]
    if len(args) == 1:
        return [ctx.call("copy", args[0])]
    return [ctx.call("concat", *args, axis=axis)]


@onnx_op("Slice")
def _slice_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    ndim = ctx.tensor_type(x).ndim
    if ctx.opset >= 10:
        starts = need_dims(ctx, inputs[1], "Slice starts").reshape(-1).tolist()
        ends = need_dims(ctx, inputs[2], "Slice ends").reshape(-1).tolist()
        axes_v = ctx.value(inputs[3]) if len(inputs) > 3 else None
        steps_v = ctx.value(inputs[4]) if len(inputs) > 4 else None
        axes = axes_v.reshape(-1).tolist() if axes_v is not None else list(range(len(starts)))
        steps = steps_v.reshape(-1).tolist() if steps_v is not None else [1] * len(starts)
        x, starts, ends, axes, steps = _gather_symbolic_ends(ctx, x, starts, ends, axes, steps)
        shape = ctx.tensor_type(x).shape
        starts = [_bound_from_end(b, shape[norm_axes(a, ndim)[0]], "start")
                  for b, a in zip(starts, axes)]
        ends = [_bound_from_end(b, shape[norm_axes(a, ndim)[0]], "end")
                for b, a in zip(ends, axes)]
    else:
        starts, ends = list(attrs["starts"]), list(attrs["ends"])
        axes = list(attrs.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    big = 2 ** 62
    ends = [max(min(int(e), big), -big) for e in ends]
    starts = [max(min(int(s), big), -big) for s in starts]
    return [ctx.call("strided_slice", x, starts=tuple(starts), ends=tuple(ends),
                     axes=tuple(norm_axes(a, ndim)[0] for a in axes),
                     steps=tuple(int(s) for s in steps))]


def _gather_symbolic_ends(ctx: GraphContext, x: g.Expr, starts: list[Any], ends: list[Any],
                          axes: list[Any], steps: list[Any]) -> tuple[g.Expr, list[Any],
                                                                      list[Any], list[Any],
                                                                      list[Any]]:
    """Axes sliced `[s:e]` (step 1, s >= 0 static) up to a symbolic `e` that is not the
    axis' size minus a constant (`pos_ids[:, :seq]`): gathered with the indices
    s..e-1, counted at run time (past the axis' end the gather's index check fails).
    Returns `x` and the remaining slice parameters."""
    shape = ctx.tensor_type(x).shape
    keep: list[int] = []
    for k, (b, e, a, st) in enumerate(zip(starts, ends, axes, steps)):
        axis = norm_axes(a, len(shape))[0]
        simple = isinstance(e, (int, np.integer)) or (
            isinstance(simplify_dim(e - shape[axis]), int))
        if simple or not isinstance(b, (int, np.integer)) or b < 0 or st != 1:
            keep.append(k)
            continue
        idx = _iota(ctx, simplify_dim(e - int(b)), int(b), 1, "int64")
        x = ctx.call("gather", x, idx, axis=axis)
    return (x, [starts[k] for k in keep], [ends[k] for k in keep], [axes[k] for k in keep],
            [steps[k] for k in keep])


def _iota(ctx: GraphContext, length: Dim, start: int | float, delta: int | float,
          dtype: str) -> g.Expr:
    """`start + delta * [0, 1, .., length - 1]` for a symbolic `length`, counted at run
    time (an exclusive cumulative sum of ones of that length)."""
    one = ctx.const(np.array(1, dtype=dtype))
    idx = ctx.call("cumsum", ctx.call("where", ctx.true_of_shape([length]), one, one),
                   axis=0, exclusive=1)
    if delta != 1:
        idx = ctx.call("multiply", idx, ctx.const(np.array(delta, dtype=dtype)))
    if start != 0:
        idx = ctx.call("add", idx, ctx.const(np.array(start, dtype=dtype)))
    return idx


def _bound_from_end(b: Any, n: Dim, what: str) -> int:
    """A Slice bound as an int: a symbolic one must be `n - k` for the axis' size `n`
    (it becomes `-k`, or the end of the axis for `k = 0`)."""
    if isinstance(b, (int, np.integer)):
        return int(b)
    k = simplify_dim(b - n)
    if isinstance(k, int) and k <= 0:
        return k if k < 0 else 2 ** 62
    raise IRError(f"Slice {what} {dim_text(b)} along a dimension of size {dim_text(n)}: a "
                  "symbolic bound must be the size minus a constant")


@onnx_op("Split")
def _split_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    t = ctx.tensor_type(x)
    axis = norm_axes(attrs.get("axis", 0), t.ndim)[0]
    n = t.shape[axis]
    if not isinstance(n, int):
        raise IRError(f"Split along the symbolic dimension {dim_text(n)} is not supported")
    if ctx.opset >= 13 and len(inputs) > 1 and inputs[1] is not None:
        sizes = [int(s) for s in need_constant(ctx, inputs[1], "Split sizes").reshape(-1)]
    elif "split" in attrs:
        sizes = [int(s) for s in attrs["split"]]
    else:
        # opset 18: num_outputs, the last part may be smaller; before: equal parts
        parts = int(attrs.get("num_outputs", 0)) or len(ctx.node_outputs)
        if "num_outputs" not in attrs and n % parts:
            raise IRError(f"Split: {n} elements do not split into {parts} equal parts")
        step = -(-n // parts)
        sizes = [max(0, min(step, n - k * step)) for k in range(parts)]
    out = ctx.call("split", x, axis=axis, sections=tuple(sizes))
    return [ctx.item(out, k) for k in range(len(sizes))]


@onnx_op("Expand")
def _expand_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                 attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    target = list(need_dims(ctx, inputs[1], "Expand shape").reshape(-1))
    src = ctx.tensor_type(x).shape
    # A symbolic target dimension is the input's own (aligned right): 1 keeps it.
    shape: list[int] = []
    for k, d in enumerate(target):
        pos = k - (len(target) - len(src))
        if isinstance(d, (int, np.integer)):
            shape.append(int(d))
        elif pos >= 0 and dims_equal(src[pos], d) is True:
            shape.append(1)
        else:  # a new symbolic size: broadcast against a tensor that has it
            return [ctx.call("where", ctx.true_of_shape(target), x, x)]
    return [ctx.call("broadcast_to", x, shape=tuple(shape))]


@onnx_op("Tile")
def _tile_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    reps = list(need_dims(ctx, inputs[1], "Tile repeats").reshape(-1))
    if all(isinstance(r, (int, np.integer)) for r in reps):
        return [ctx.call("tile", x, repeats=tuple(int(r) for r in reps))]
    # A symbolic repeat count (exporters tile position ids by `[batch, 1]`) repeats an
    # axis of size 1: a broadcast to that size; the static counts tile as usual.
    src = ctx.tensor_type(x).shape
    if len(reps) != len(src):
        raise IRError(f"tile: repeats {reps} must have one entry per dim of {shape_text(src)}")
    static: list[int] = []
    target: list[Dim] = []
    for k, (d, r) in enumerate(zip(src, reps)):
        if isinstance(r, (int, np.integer)):
            static.append(int(r))
            target.append(simplify_dim(d * int(r)))
        elif isinstance(d, int) and d == 1:
            static.append(1)
            target.append(r)
        else:
            raise IRError(f"tile: repeat count {dim_text(r)} of axis {k} is symbolic and the "
                          f"axis has size {dim_text(d)}, not 1")
    y = ctx.call("tile", x, repeats=tuple(static)) if any(r != 1 for r in static) else x
    return [ctx.call("where", ctx.true_of_shape(target), y, y)]


@onnx_op("Pad")
def _pad_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
              attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    ndim = ctx.tensor_type(x).ndim
    if ctx.opset >= 11:
        pads = [int(p) for p in need_constant(ctx, inputs[1], "Pad pads").reshape(-1)]
        cval = ctx.value(inputs[2]) if len(inputs) > 2 else None
        value = float(cval.reshape(-1)[0]) if cval is not None and cval.size else 0.0
        axes_v = ctx.value(inputs[3]) if len(inputs) > 3 else None
        if axes_v is not None:
            axes = [norm_axes(int(a), ndim)[0] for a in axes_v.reshape(-1)]
            full = [0] * (2 * ndim)
            for k, a in enumerate(axes):
                full[a], full[a + ndim] = pads[k], pads[k + len(axes)]
            pads = full
    else:
        pads = [int(p) for p in attrs["pads"]]
        value = float(attrs.get("value", 0.0))
    mode = attrs.get("mode", "constant")
    if any(p < 0 for p in pads):  # a negative pad removes elements: sliced off first
        shape = ctx.tensor_type(x).shape
        crop = [a for a in range(ndim) if pads[a] < 0 or pads[a + ndim] < 0]
        sizes = [d for d in (shape[a] for a in crop) if isinstance(d, int)]
        if len(sizes) < len(crop):
            raise IRError(f"Pad: negative pads {pads} on a symbolic axis of {shape}")
        starts = [max(0, -pads[a]) for a in crop]
        ends = [d + min(0, pads[a + ndim]) for a, d in zip(crop, sizes)]
        if any(e < s for s, e in zip(starts, ends)):
            raise IRError(f"Pad: pads {pads} remove more elements than an axis of {shape} "
                          "has")
        x = ctx.call("strided_slice", x, starts=tuple(starts), ends=tuple(ends),
                     axes=tuple(crop), steps=(1,) * len(crop))
        pads = [max(0, p) for p in pads]
        if not any(pads):
            return [x]
    return [ctx.call("pad", x, pads=tuple(pads), mode=mode, value=value)]


@onnx_op("CenterCropPad")
def _center_crop_pad_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                          attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    shape = ctx.tensor_type(x).static_shape
    target = [int(d) for d in need_constant(ctx, inputs[1], "CenterCropPad shape").reshape(-1)]
    axes = [norm_axes(int(a), len(shape))[0] for a in attrs.get("axes", range(len(shape)))]
    if len(axes) != len(target):
        raise IRError(f"CenterCropPad: shape {target} needs one entry per axis {axes}")
    starts, ends, crop_axes = [], [], []
    pads = [0] * (2 * len(shape))
    for a, want in zip(axes, target):
        have = shape[a]
        if want < have:        # crop, the extra element on the end side
            start = (have - want) // 2
            starts.append(start)
            ends.append(start + want)
            crop_axes.append(a)
        elif want > have:      # pad with zeros, the extra element on the end side
            pads[a] = (want - have) // 2
            pads[a + len(shape)] = want - have - pads[a]
    y = x
    if crop_axes:
        y = ctx.call("strided_slice", y, starts=tuple(starts), ends=tuple(ends),
                     axes=tuple(crop_axes), steps=(1,) * len(crop_axes))
    if any(pads):
        y = ctx.call("pad", y, pads=tuple(pads), mode="constant", value=0.0)
    return [y if y is not x else ctx.call("copy", x)]


@onnx_op("Trilu")
def _trilu_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
    k = 0
    if len(inputs) > 1 and inputs[1] is not None:
        k = int(need_constant(ctx, inputs[1], "Trilu k").reshape(-1)[0])
    return [ctx.call("trilu", first_input(inputs), k=k, upper=bool(attrs.get("upper", 1)))]


@onnx_op("ReverseSequence")
def _reverse_sequence_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                           attrs: dict[str, Any]) -> list[g.Expr]:
    lens = inputs[1]
    assert lens is not None
    return [ctx.call("reverse_sequence", first_input(inputs), lens,
                     batch_axis=int(attrs.get("batch_axis", 1)),
                     time_axis=int(attrs.get("time_axis", 0)))]


# ---------------------------------------------- ONNX ops that need no kiln op

@onnx_op("Identity")
def _identity_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                   attrs: dict[str, Any]) -> list[g.Expr]:
    return [first_input(inputs)]


@onnx_op("Dropout")
def _dropout_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    training = bool(attrs.get("is_test", 1) == 0) if ctx.opset < 7 else False
    if len(inputs) > 2 and inputs[2] is not None:
        training = bool(need_constant(ctx, inputs[2], "Dropout training_mode").reshape(-1)[0])
    ratio = float(attrs.get("ratio", 0.5))
    if len(inputs) > 1 and inputs[1] is not None:
        ratio = float(need_constant(ctx, inputs[1], "Dropout ratio").reshape(-1)[0])
    if training and ratio > 0:
        raise IRError("training-mode Dropout is random; kiln compiles inference graphs")
    # Inference: the identity, and an all-true mask (folded only within the budget).
    shape = ctx.tensor_type(x).shape
    if len(ctx.node_outputs) < 2 or not ctx.node_outputs[1]:
        return [x]
    if not is_static(shape):  # true everywhere, of x's symbolic shape
        yes = ctx.const(np.array(True))
        return [x, ctx.call("where", ctx.call("isnan", x), yes, yes)]
    return [x, ctx.call("broadcast_to", ctx.const(np.array(True)),
                        shape=ctx.tensor_type(x).static_shape)]


@onnx_op("Shape")
def _shape_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    shape = ctx.tensor_type(x).shape
    start = int(attrs.get("start", 0))
    end = attrs.get("end")
    part = shape[start:None if end is None else int(end)]
    if is_static(part):
        return [ctx.const(np.array(part, dtype=np.int64))]
    # Symbolic: computed at run time; the importer follows its value as dimensions.
    lo, hi, _ = slice(start, None if end is None else int(end)).indices(len(shape))
    return [ctx.call("shape_of", x, start=lo, end=max(lo, hi))]


@onnx_op("Size")
def _size_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> list[g.Expr]:
    x = first_input(inputs)
    shape = ctx.tensor_type(x).shape
    if is_static(shape):
        return [ctx.const(np.array(ctx.tensor_type(x).numel(), dtype=np.int64))]
    return [ctx.call("reduce_prod", ctx.call("shape_of", x, start=0, end=len(shape)),
                     axes=(0,), keepdims=False)]


@onnx_op("Constant")
def _constant_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                   attrs: dict[str, Any]) -> list[g.Expr]:
    for key, dtype in (("value_float", np.float32), ("value_int", np.int64),
                       ("value_floats", np.float32), ("value_ints", np.int64)):
        if key in attrs:
            return [ctx.const(np.array(attrs[key], dtype=dtype))]
    if "value" not in attrs:
        raise IRError(f"Constant without a supported value attribute (has {sorted(attrs)})")
    return [ctx.const(np.asarray(attrs["value"]))]


@onnx_op("ConstantOfShape")
def _const_of_shape_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                         attrs: dict[str, Any]) -> list[g.Expr]:
    dims = [int(d) if isinstance(d, (int, np.integer)) else d
            for d in need_dims(ctx, inputs[0], "ConstantOfShape shape").reshape(-1)]
    value = np.asarray(attrs.get("value", np.zeros(1, np.float32))).reshape(-1)
    if value.size != 1:
        raise IRError(f"ConstantOfShape value must hold one element, got {value.size}")
    if not is_static(dims):
        fill = ctx.const(value.reshape(()))
        return [ctx.call("where", ctx.true_of_shape(dims), fill, fill)]
    shape = tuple(int(d) for d in dims)
    if any(d < 0 for d in shape):
        raise IRError(f"ConstantOfShape shape {shape} has a negative dimension")
    # A broadcast: folded when it fits the fold budget, else filled at run time.
    return [ctx.call("broadcast_to", ctx.const(value.reshape(())), shape=shape)]


@onnx_op("Range")
def _range_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
    bounds = [need_dims(ctx, x, "Range bounds").reshape(-1) for x in inputs[:3]]
    if any(v.dtype == object for v in bounds):
        return [_symbolic_range(ctx, inputs, bounds,
                                ctx.tensor_type(first_input(inputs)).dtype)]
    start, limit, delta = bounds
    a, b, d = (v.reshape(-1)[0].item() if v.size == 1 else None for v in (start, limit, delta))
    if a is None or b is None or d is None:
        raise IRError("Range start, limit and delta must be scalars")
    if d == 0 or not all(math.isfinite(v) for v in (a, b, d)):
        raise IRError(f"Range({a}, {b}, {d}): delta must be non-zero and the bounds finite")
    exact = all(isinstance(v, int) for v in (a, b, d))
    count = max(-((a - b) // d) if exact else math.ceil((b - a) / d), 0)
    ctx.check_materialize(count * start.dtype.itemsize, f"Range({a}, {b}, {d})")
    return [ctx.const(np.arange(a, b, d, dtype=start.dtype))]


def _symbolic_range(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                    bounds: list[np.ndarray], dtype: str) -> g.Expr:
    """Range over symbolic sizes: `Range(0, seq, 1)` (position ids) or
    `Range(past, past + seq, 1)` (position ids after a key/value cache). The delta must
    be a positive constant; the length `ceil((limit - start) / delta)` must be a size
    some input has (the run-time iota is shaped from it). A symbolic start is added at
    run time from the Range's own start input, which holds its value."""
    if any(v.size != 1 for v in bounds):
        raise IRError("Range start, limit and delta must be scalars")
    a, b, d = (x if isinstance(x, PrimExpr) else x.item() for x in (v[0] for v in bounds))
    if isinstance(d, PrimExpr) or d <= 0 or not isinstance(d, int):
        raise IRError(f"Range({dim_text(a)}, {dim_text(b)}, {dim_text(d)}): over a "
                      "symbolic dimension the delta must be a positive integer constant")
    if not isinstance(a, (int, PrimExpr)) or not isinstance(b, (int, PrimExpr)):
        raise IRError(f"Range({a}, {b}, {d}): symbolic bounds must be integers")
    length = simplify_dim((b - a + (d - 1)) // d)
    if not isinstance(a, PrimExpr):
        return _iota(ctx, length, a, d, dtype)
    start = inputs[0]
    assert start is not None
    return ctx.call("add", _iota(ctx, length, 0, d, dtype), ctx.call("reshape", start, shape=()))


@onnx_op("EyeLike")
def _eye_like_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                   attrs: dict[str, Any]) -> list[g.Expr]:
    t = ctx.tensor_type(first_input(inputs))
    if t.ndim != 2:
        raise IRError(f"EyeLike needs a 2-D input, got {t}")
    dtype = t.dtype if "dtype" not in attrs else onnx_dtype(int(attrs["dtype"]),
                                                            "EyeLike: dtype")
    rows, cols = t.static_shape
    k = int(attrs.get("k", 0))
    # (i + k == j) from a column and a row of indices: folded within the budget.
    col = ctx.const(np.arange(rows, dtype=np.int64).reshape(rows, 1) + k)
    row = ctx.const(np.arange(cols, dtype=np.int64).reshape(1, cols))
    return [ctx.call("cast", ctx.call("equal", col, row), dtype=dtype)]

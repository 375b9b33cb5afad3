"""Shape and layout ops (injective): reshape, transpose, concat, slice, split,
broadcast_to, tile, pad, trilu, reverse_sequence; and the ONNX ops that map onto them
or need no op of their own (Flatten, Squeeze, Shape, Constant, Range, ...).

Indexing ops live in `indexing.py`; cast, where, clip, comparisons and logic in
`logic.py`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir.attrs import ATTR_CONCAT_AXIS
from kiln.ir.kernel_errors import KERNEL_ERRORS, op_error_code
from kiln.ir.shape_expr import (
    dim_product,
    dim_text,
    dims_equal,
    exact_div,
    is_static,
    shape_text,
    simplify_dim,
)
from kiln.ir.tensor import (
    Cast,
    PrimExpr,
    PrimFunc,
    as_expr,
    max_,
    min_,
    select,
)
from kiln.ir.types import Dim, TensorType, TupleType, Type
from kiln.ops import te
from kiln.ops.broadcast import broadcast_index, broadcast_shapes
from kiln.ops.onnx_map import (
    GraphContext,
    first_input,
    need_constant,
    need_dims,
    onnx_dtype,
    onnx_op,
)
from kiln.ops.reduce import norm_axes
from kiln.ops.registry import OPS, OpDef, register_op
from kiln.ops.reshape_dims import fill_rest, reshape_attr, reshape_target
from kiln.target.isa import ISA

Attrs = Mapping[str, Any]


# -------------------------------------------------------------------- reshape

def _reshape_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    shape = reshape_target(x.shape, attrs["shape"])
    if any(isinstance(d, int) and d < 0 for d in shape) or \
            dims_equal(dim_product(shape), dim_product(x.shape)) is not True:
        raise IRError(f"reshape: cannot view {x.dtype}{shape_text(x.shape)} as shape "
                      f"{shape_text(shape)}")
    return TensorType(shape, x.dtype)


def _reshape_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    shape: Any = reshape_target(x.shape, attrs["shape"])
    groups = reshape_groups(tuple(x.shape), tuple(shape))

    def element(*i: Any) -> Any:
        idx: list[Any] = []
        for (xa, xb), (ya, yb) in groups:  # flatten and split only within a group
            if xb - xa == 1 and yb - ya == 1:
                idx.append(i[ya])
            else:
                idx.extend(te.unflatten_index(te.flat_index(i[ya:yb], shape[ya:yb]),
                                              x.shape[xa:xb]))
        return x[tuple(idx)]

    return te.compute(shape, element, x.dtype, "reshape")


def reshape_groups(src: tuple[Any, ...], dst: tuple[Any, ...]
                   ) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Runs of axes `((a, b), (c, d))` with `src[a:b]` and `dst[c:d]` of equal size, as
    short as the sizes allow: a reshape only merges and splits axes within a run, so an
    axis kept as it is (a symbolic `seq`) is indexed directly instead of through a
    division by the other dims. One run of everything when no finer split is found."""
    whole = [((0, len(src)), (0, len(dst)))]
    groups: list[tuple[tuple[int, int], tuple[int, int]]] = []
    i = j = 0
    while i < len(src) and j < len(dst):
        a, c = i, j
        px, py = src[i], dst[j]
        i, j = i + 1, j + 1
        while dims_equal(px, py) is not True:
            if i < len(src) and exact_div(py, px) is not None:
                px, i = dim_product((px, src[i])), i + 1
            elif j < len(dst) and exact_div(px, py) is not None:
                py, j = dim_product((py, dst[j])), j + 1
            else:
                return whole
        groups.append(((a, i), (c, j)))
    if not groups:
        return whole
    (a, _), (c, _) = groups[-1]  # trailing axes of size 1 join the last run
    if any(d != 1 for d in src[i:]) or any(d != 1 for d in dst[j:]):
        return whole
    groups[-1] = ((a, len(src)), (c, len(dst)))
    return groups


register_op("reshape", pattern="injective", infer=_reshape_infer, compute=_reshape_compute,
            reference=lambda x, shape, **a: np.reshape(
                x, tuple(int(d) for d in reshape_target(x.shape, shape))  # type: ignore[arg-type]
            ).copy(), dim_text_attrs=("shape",))


register_op("copy", pattern="elemwise", infer=lambda t, a: t[0],
            compute=lambda ins, a: te.compute(ins[0].shape, lambda *i: ins[0][i], ins[0].dtype,
                                              "copy"),
            reference=lambda x, **a: np.array(x, copy=True))


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


# ------------------------------------------------------------------ transpose

def _perm(attrs: Attrs, ndim: int) -> tuple[int, ...]:
    perm = attrs.get("perm")
    p = tuple(range(ndim))[::-1] if perm is None else tuple(int(a) for a in perm)
    if sorted(p) != list(range(ndim)):
        raise IRError(f"transpose: perm {p} is not a permutation of {ndim} axes")
    return p


def _transpose_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    return TensorType(tuple(x.shape[a] for a in _perm(attrs, x.ndim)), x.dtype)


def _transpose_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    perm = _perm(attrs, x.ndim)
    inv = [perm.index(k) for k in range(x.ndim)]
    return te.compute(tuple(x.shape[a] for a in perm),
                      lambda *i: x[tuple(i[inv[k]] for k in range(x.ndim))], x.dtype,
                      "transpose")


register_op("transpose", pattern="injective", infer=_transpose_infer,
            compute=_transpose_compute,
            reference=lambda x, **a: np.transpose(x, _perm(a, x.ndim)).copy())


# ---------------------------------------------------------- reshape_transpose

def _reshape_transpose_attrs(x: TensorType | te.Tensor, attrs: Attrs
                             ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(inner, perm, shape) of a `reshape_transpose` call, checked against the input."""
    inner = tuple(int(d) for d in attrs["inner"])
    perm = _perm(attrs, len(inner))
    shape = tuple(int(d) for d in attrs["shape"])
    size = int(np.prod(inner, dtype=np.int64))
    if not is_static(tuple(x.shape)) or dim_product(x.shape) != size or \
            int(np.prod(shape, dtype=np.int64)) != size:
        raise IRError(f"reshape_transpose: a static input {shape_text(x.shape)}, its view "
                      f"{inner} and the result {shape} must hold as many elements")
    return inner, perm, shape


def _reshape_transpose_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    return TensorType(_reshape_transpose_attrs(x, attrs)[2], x.dtype)


def _reshape_transpose_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    """reshape -> transpose -> reshape as one copy: the three index maps composed (each
    reshape splits and merges only within its runs of axes, so an axis the chain keeps,
    e.g. the spatial axes of a channel shuffle, is indexed directly)."""
    (x,) = inputs
    inner, perm, shape = _reshape_transpose_attrs(x, attrs)
    viewed = _reshape_compute([x], {"shape": inner})
    moved = _transpose_compute([viewed], {"perm": perm})
    return _reshape_compute([moved], {"shape": shape})


def _reshape_transpose_ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
    inner = tuple(int(d) for d in attrs["inner"])
    perm = _perm(attrs, len(inner))
    shape = tuple(int(d) for d in attrs["shape"])
    return np.transpose(x.reshape(inner), perm).reshape(shape).copy()


# `reshape(x, inner) -> transpose(perm) -> reshape(shape)` in one copy; the
# `merge-copies` graph pass (kiln.transform.merge_copies) builds it from chains of
# reshapes and transposes such as ShuffleNet's channel shuffle.
register_op("reshape_transpose", pattern="injective", infer=_reshape_transpose_infer,
            compute=_reshape_transpose_compute, reference=_reshape_transpose_ref)


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


# --------------------------------------------------------------------- concat

def _concat_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    first = types[0]
    (axis,) = norm_axes(attrs.get("axis", 0), first.ndim)
    for t in types[1:]:
        if t.dtype != first.dtype or t.ndim != first.ndim or any(
                dims_equal(a, b) is not True
                for k, (a, b) in enumerate(zip(t.shape, first.shape)) if k != axis):
            raise IRError(f"concat: {t.dtype}{shape_text(t.shape)} does not fit "
                          f"{first.dtype}{shape_text(first.shape)} along axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum_dims(t.shape[axis] for t in types)
    return TensorType(tuple(shape), first.dtype)


def sum_dims(dims: Any) -> Dim:
    """The sum of `dims`, canonical."""
    total: Dim = 0
    for d in dims:
        total = total + d
    return simplify_dim(total)


def _concat_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (axis,) = norm_axes(attrs.get("axis", 0), inputs[0].ndim)
    out = _concat_infer([TensorType(t.shape, t.dtype) for t in inputs], attrs)
    assert isinstance(out, TensorType)

    # Where each input starts along the axis: ints, or expressions of symbolic sizes.
    starts: list[Dim] = [0]
    for t in inputs[:-1]:
        starts.append(sum_dims([starts[-1], t.shape[axis]]))

    def element(*i: PrimExpr) -> PrimExpr:
        # the last input whose start is <= i[axis] holds the element
        value: PrimExpr | None = None
        for t, start in zip(inputs, starts):
            local = list(i)
            local[axis] = te.clamp_index(i[axis] - start, t.shape[axis])
            v = t[tuple(local)]
            value = v if value is None else select(i[axis] >= start, v, value)
        assert value is not None
        return value

    return te.compute(out.shape, element, out.dtype, "concat")


@dataclass(frozen=True)
class ConcatOp(OpDef):
    """`concat`, whose lone kernel says it is one (`kiln.concat_axis`): lowering then
    has the inputs' kernels write into the output (kiln.transform.concat_views)."""

    def legalize(self, call: g.Call, isa: ISA | None = None) -> tuple[PrimFunc, str]:
        prim, hint = super().legalize(call, isa)
        (axis,) = norm_axes(call.attrs.get("axis", 0), len(prim.buffer_params[-1].shape))
        return prim.with_attrs(**{ATTR_CONCAT_AXIS: axis}), hint


OPS.register("concat", ConcatOp("concat", "injective", _concat_infer, _concat_compute,
                                lambda *xs, axis=0, **a: np.concatenate(xs, axis=axis)))


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


# -------------------------------------------------------------- slice / split

def _slice_params(shape: Sequence[Dim], attrs: Attrs) -> list[tuple[Any, int, Any]]:
    """Per-axis (start, step, length) with numpy slice semantics, clamped.

    Along a symbolic dimension `n` (step > 0) start and length are exact expressions
    with min/max (`min(e, n) - min(s, n)`), canonical; ints otherwise.
    """
    starts, ends = list(attrs["starts"]), list(attrs["ends"])
    axes = list(attrs.get("axes") or range(len(starts)))
    steps = list(attrs.get("steps") or [1] * len(starts))
    out: list[tuple[Any, int, Any]] = [(0, 1, d) for d in shape]
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axes(a, len(shape))[0]
        if st == 0:
            raise IRError("slice: step 0 is not allowed")
        n = shape[a]
        if st < 0:
            out[a] = _negative_step_params(int(s), int(e), int(st), n)
            continue
        if isinstance(n, int):
            sl = slice(int(s), int(e), int(st)).indices(n)
            out[a] = (sl[0], sl[2], len(range(*sl)))
            continue
        s, e = int(s), int(e)
        lo, hi = _clamped_bound(s, n), _clamped_bound(e, n)
        if (s >= 0) == (e >= 0) and e <= s:
            out[a] = (lo, int(st), 0)
            continue
        # hi >= lo when both bounds count from the same end (e > s), start at 0, or
        # end at n: no clamp needed.
        exact = (s >= 0) == (e >= 0) or s == 0 or e >= _TO_THE_END
        span: Any = hi - lo if exact else max_(hi - lo, 0)
        out[a] = (lo, int(st), simplify_dim(span if st == 1 else (span + (st - 1)) // st))
    return out


# A slice bound at least this large is "to the end" of any dimension.
_TO_THE_END = 2 ** 31


def _clamped_bound(b: int, n: PrimExpr) -> Dim:
    """A slice bound `b` (negative: from the end) clamped to [0, n], as an expression."""
    if b == 0:
        return 0
    if b >= _TO_THE_END:
        return n
    if b > 0:
        return simplify_dim(min_(as_expr(b).astype(n.dtype), n))
    return simplify_dim(max_(n + b, 0))


def _negative_step_params(s: int, e: int, st: int, n: Dim) -> tuple[Dim, int, Dim]:
    """(start, step, length) of `[s:e:st]` (st < 0) along dimension `n`, static or not.

    ONNX's rule (onnxruntime follows it; Python's slices differ when the start is
    before the first element): a bound counts from the end when negative, then the
    start is clamped to [0, n - 1] and the end to [-1, n - 1]; the length is
    `ceil((start - end) / -st)`, at least 0. Exporters write a reversal as
    `[-1:-INT_MAX:-1]` (start n - 1, end -1, length n)."""
    if isinstance(n, int):
        if n == 0:
            return 0, st, 0
        first = min(max(s + n if s < 0 else s, 0), n - 1)
        stop = min(max(e + n if e < 0 else e, -1), n - 1)
        return first, st, max(-(-(first - stop) // -st), 0)
    lo, hi = _back_bound(s, n, 0), _back_bound(e, n, -1)
    span: Any = lo - hi
    if not (isinstance(hi, int) and hi == -1):  # end -1: a start >= 0 makes span > 0
        span = max_(span, 0)
    return lo, st, simplify_dim(span if st == -1 else (span + (-st - 1)) // -st)


def _back_bound(b: int, n: PrimExpr, floor: int) -> Dim:
    """A bound of a negative-step slice (negative: from the end) clamped to
    [floor, n - 1] along a symbolic dimension `n` (at least 1)."""
    if b >= _TO_THE_END:
        return simplify_dim(n - 1)
    if b <= -_TO_THE_END:
        return floor
    if b >= 0:
        return simplify_dim(min_(as_expr(b).astype(n.dtype), n - 1))
    if b == -1:  # n - 1 >= floor for n >= 1; and n = 0 leaves nothing to slice
        return simplify_dim(n - 1)
    return simplify_dim(max_(n + b, floor))


def _slice_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    return TensorType(tuple(p[2] for p in _slice_params(x.shape, attrs)), x.dtype)


def _slice_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    params = _slice_params(x.shape, attrs)
    return te.compute(tuple(p[2] for p in params),
                      lambda *i: x[tuple(s + st * k for k, (s, st, _) in zip(i, params))],
                      x.dtype, "slice")


def _slice_ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
    params = _slice_params(x.shape, attrs)
    # explicit index lists: a negative step's stop cannot be written as a slice bound
    return x[np.ix_(*(np.arange(n, dtype=np.int64) * st + s for s, st, n in params))] \
        if x.ndim else x.copy()


register_op("strided_slice", pattern="injective", infer=_slice_infer, compute=_slice_compute,
            reference=_slice_ref)


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


def _split_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
    sizes = [int(s) for s in attrs["sections"]]
    if sum(sizes) != x.shape[axis]:
        raise IRError(f"split: sections {sizes} do not add up to {x.shape[axis]}")
    fields = []
    for s in sizes:
        shape = list(x.shape)
        shape[axis] = s
        fields.append(TensorType(tuple(shape), x.dtype))
    return TupleType(tuple(fields))


def _split_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> tuple[te.Tensor, ...]:
    (x,) = inputs
    (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
    outs = []
    start = 0
    for s in (int(v) for v in attrs["sections"]):
        shape = list(x.shape)
        shape[axis] = s

        def element(*i: PrimExpr, begin: int = start) -> PrimExpr:
            idx = list(i)
            idx[axis] = idx[axis] + begin
            return x[tuple(idx)]

        outs.append(te.compute(tuple(shape), element, x.dtype, "split"))
        start += s
    return tuple(outs)


def _split_ref(x: np.ndarray, axis: int = 0, sections: Sequence[int] = (), **a: Any) -> tuple:
    cuts = np.cumsum(list(sections))[:-1]
    return tuple(p.copy() for p in np.split(x, cuts, axis=axis))


register_op("split", pattern="injective", infer=_split_infer, compute=_split_compute,
            reference=_split_ref)


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


# --------------------------------------------------------- broadcast_to, tile

def _bto_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    return TensorType(broadcast_shapes(x.shape, tuple(attrs["shape"])), x.dtype)


def _bto_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    shape = broadcast_shapes(x.shape, tuple(attrs["shape"]))
    return te.compute(shape, lambda *i: x[broadcast_index(i, x.shape)], x.dtype, "broadcast_to")


register_op("broadcast_to", pattern="broadcast", infer=_bto_infer, compute=_bto_compute,
            reference=lambda x, shape, **a: np.broadcast_to(
                x, broadcast_shapes(x.shape, tuple(shape))).copy())


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


def _tile_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    reps = tuple(int(r) for r in attrs["repeats"])
    if len(reps) != x.ndim:
        raise IRError(f"tile: repeats {reps} must have one entry per dim of {x}")
    return TensorType(tuple(simplify_dim(d * r) for d, r in zip(x.shape, reps)), x.dtype)


def _tile_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    out = _tile_infer([TensorType(x.shape, x.dtype)], attrs)
    assert isinstance(out, TensorType)
    return te.compute(out.shape, lambda *i: x[tuple(k % d for k, d in zip(i, x.shape))],
                      x.dtype, "tile")


register_op("tile", pattern="injective", infer=_tile_infer, compute=_tile_compute,
            reference=lambda x, repeats, **a: np.tile(x, repeats))


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


# ------------------------------------------------------------------------ pad

def _pad_widths(attrs: Attrs, ndim: int) -> list[tuple[int, int]]:
    pads = [int(p) for p in attrs["pads"]]  # ONNX layout: all begins, then all ends
    if len(pads) != 2 * ndim:
        raise IRError(f"pad: pads needs {2 * ndim} values, got {len(pads)}")
    return [(pads[k], pads[k + ndim]) for k in range(ndim)]


def _pad_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    widths = _pad_widths(attrs, x.ndim)
    mode = attrs.get("mode", "constant")
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise IRError(f"pad: unknown mode {mode!r}; known: constant, edge, reflect, wrap")
    if mode == "reflect" and any(not isinstance(d, int) and (a or b)
                                 for d, (a, b) in zip(x.shape, widths)):
        raise IRError(f"pad: reflect mode along a symbolic dimension of "
                      f"{shape_text(x.shape)} is not supported")
    # Only padded axes read their neighbours: an unpadded axis may be empty. A padded
    # empty axis has nothing to copy (edge and wrap read past x; onnxruntime refuses).
    padded = [(d, a, b) for d, (a, b) in zip(x.shape, widths) if isinstance(d, int) and (a or b)]
    if mode in ("edge", "wrap") and any(d == 0 for d, _, _ in padded):
        raise IRError(f"pad: {mode} mode needs at least 1 element along padded dims of {x}")
    if mode == "reflect" and any(d < 2 for d, _, _ in padded):
        raise IRError(f"pad: reflect mode needs at least 2 elements along padded dims of {x}")
    if mode == "reflect" and any(a >= d or b >= d for d, a, b in padded):
        raise IRError(f"pad: reflect pads {widths} must be smaller than the dims of {x}")
    return TensorType(tuple(simplify_dim(d + a + b) for d, (a, b) in zip(x.shape, widths)),
                      x.dtype)


def _pad_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    widths = _pad_widths(attrs, x.ndim)
    mode = attrs.get("mode", "constant")
    out = _pad_infer([TensorType(x.shape, x.dtype)], attrs)
    assert isinstance(out, TensorType)

    def element(*i: PrimExpr) -> PrimExpr:
        src = [k - a for k, (a, _) in zip(i, widths)]
        if mode == "constant":
            return te.padded(x, src, float(attrs.get("value", 0.0))
                             if dt.is_float(x.dtype) else int(attrs.get("value", 0)))
        fixed = []
        for s, d in zip(src, x.shape):
            if mode == "edge":
                fixed.append(te.clamp_index(s, d))
            elif mode == "wrap":
                fixed.append(s % d)
            else:  # reflect: -1 -> 1, d -> d-2
                r = select(s < 0, -s, s)
                r = select(r >= d, 2 * (d - 1) - r, r)
                fixed.append(te.clamp_index(r, d))
        return x[tuple(fixed)]

    return te.compute(out.shape, element, x.dtype, "pad")


def _pad_ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
    widths = _pad_widths(attrs, x.ndim)
    mode = attrs.get("mode", "constant")
    if mode == "constant":
        return np.pad(x, widths, constant_values=attrs.get("value", 0))
    if x.size == 0:  # only unpadded axes may be empty (`_pad_infer`): so is the result
        return np.zeros([d + a + b for d, (a, b) in zip(x.shape, widths)], x.dtype)
    return np.pad(x, widths, mode=mode)


register_op("pad", pattern="injective", infer=_pad_infer, compute=_pad_compute,
            reference=_pad_ref)


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


# ---------------------------------------------------------------------- trilu

def _trilu_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    if types[0].ndim < 2:
        raise IRError(f"trilu needs at least 2 dims, got {types[0]}")
    return types[0]


def _trilu_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    k, upper = int(attrs.get("k", 0)), bool(attrs.get("upper", True))
    zero = as_expr(0, x.dtype) if x.dtype != "bool" else as_expr(False)

    def element(*i: PrimExpr) -> PrimExpr:
        diag = i[-1] - i[-2]
        keep = diag >= k if upper else diag <= k
        return select(keep, x[i], zero)

    return te.compute(x.shape, element, x.dtype, "trilu")


def _trilu_ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
    k = int(attrs.get("k", 0))
    return np.triu(x, k) if attrs.get("upper", True) else np.tril(x, k)


register_op("trilu", pattern="injective", infer=_trilu_infer, compute=_trilu_compute,
            reference=_trilu_ref)


@onnx_op("Trilu")
def _trilu_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
    k = 0
    if len(inputs) > 1 and inputs[1] is not None:
        k = int(need_constant(ctx, inputs[1], "Trilu k").reshape(-1)[0])
    return [ctx.call("trilu", first_input(inputs), k=k, upper=bool(attrs.get("upper", 1)))]


# ----------------------------------------------------------- reverse_sequence

def _reverse_sequence_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, lens = types
    b, t = int(attrs.get("batch_axis", 1)), int(attrs.get("time_axis", 0))
    if {b, t} != {0, 1} or x.ndim < 2 or lens.static_shape != (x.static_shape[b],) or \
            not dt.is_int(lens.dtype):
        raise IRError(f"reverse_sequence: sequence_lens {lens} must be ({x.shape[b]},) ints "
                      f"and batch/time axes 0 and 1, got {b}/{t}")
    return x


def _reverse_sequence_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, lens = inputs
    b, t = int(attrs.get("batch_axis", 1)), int(attrs.get("time_axis", 0))
    n = x.shape[t]

    def element(*i: PrimExpr) -> PrimExpr:
        length = lens[i[b]]
        length = length if length.dtype == "int64" else Cast("int64", length)
        src = list(i)
        src[t] = select(i[t] < length, te.clamp_index(length - 1 - i[t], n), i[t])
        return x[tuple(src)]

    def length_ok(k: PrimExpr) -> PrimExpr:
        length = lens[(k,)]
        length = length if length.dtype == "int64" else Cast("int64", length)
        return (length >= 0) & (length <= n)

    check = te.Check(lens.shape, length_ok, op_error_code("reverse_sequence"))
    return te.compute(x.shape, element, x.dtype, "reverse_sequence", checks=[check])


def _reverse_sequence_ref(x: np.ndarray, lens: np.ndarray, **attrs: Any) -> np.ndarray:
    b, t = int(attrs.get("batch_axis", 1)), int(attrs.get("time_axis", 0))
    if lens.size and (int(lens.min()) < 0 or int(lens.max()) > x.shape[t]):
        raise IRError(KERNEL_ERRORS[op_error_code("reverse_sequence")])
    out = x.copy()
    for k, length in enumerate(lens):
        sel: list[Any] = [slice(None)] * x.ndim
        sel[b] = k
        sel[t] = slice(0, int(length))
        out[tuple(sel)] = np.flip(x[tuple(sel)], axis=t - (1 if t > b else 0))
    return out


register_op("reverse_sequence", pattern="injective", infer=_reverse_sequence_infer,
            compute=_reverse_sequence_compute, reference=_reverse_sequence_ref)


@onnx_op("ReverseSequence")
def _reverse_sequence_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                           attrs: dict[str, Any]) -> list[g.Expr]:
    lens = inputs[1]
    assert lens is not None
    return [ctx.call("reverse_sequence", first_input(inputs), lens,
                     batch_axis=int(attrs.get("batch_axis", 1)),
                     time_axis=int(attrs.get("time_axis", 0)))]


# --------------------------------------------------------------------- shape_of

def _shape_of_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    start, end = int(attrs["start"]), int(attrs["end"])
    if not 0 <= start <= end <= x.ndim:
        raise IRError(f"shape_of: dimensions {start}:{end} are not within the {x.ndim} of {x}")
    return TensorType((end - start,), "int64")


def _shape_of_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    dims = [as_expr(d).astype("int64") for d in x.shape[int(attrs["start"]):int(attrs["end"])]]

    def element(i: PrimExpr) -> PrimExpr:
        value = dims[-1]
        for k in range(len(dims) - 2, -1, -1):
            value = select(i.eq(k), dims[k], value)
        return value

    return te.compute((len(dims),), element, "int64", "shape_of")


register_op("shape_of", pattern="opaque", infer=_shape_of_infer, compute=_shape_of_compute,
            reference=lambda x, start, end, **a: np.array(x.shape[start:end], dtype=np.int64))


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

"""Tensor manipulation (injective ops): reshape, transpose, concat, split, slice,
gather, broadcast_to, tile, pad, cast, where, clip, comparisons and logic."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir.tensor import (
    Cast,
    Const,
    PrimExpr,
    UnaryOp,
    as_expr,
    binary,
    compare,
    max_,
    min_,
    select,
)
from kiln.ir.types import TensorType, TupleType, Type
from kiln.ops import te
from kiln.ops.broadcast import broadcast_index, broadcast_shapes, broadcast_types
from kiln.ops.onnx_map import Converter, GraphContext, onnx_op
from kiln.ops.reduce import norm_axes
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]


def _flat_index(idx: Sequence[PrimExpr], shape: Sequence[int]) -> PrimExpr:
    flat: PrimExpr = as_expr(0)
    for i, d in zip(idx, shape):
        flat = flat * d + i
    return flat


def _unflatten(flat: PrimExpr, shape: Sequence[int]) -> tuple[PrimExpr, ...]:
    out: list[PrimExpr] = []
    for d in reversed(shape):
        out.append(flat % d if d != 1 else as_expr(0))
        flat = flat // d
    return tuple(reversed(out))


# --------------------------------------------------------------------------- reshape

def _reshape_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    shape = tuple(int(d) for d in attrs["shape"])
    if int(np.prod(shape)) != x.numel() or any(d < 0 for d in shape):
        raise IRError(f"reshape: cannot view {x} as shape {shape}")
    return TensorType(shape, x.dtype)


def _reshape_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    shape = tuple(int(d) for d in attrs["shape"])
    return te.compute(shape, lambda *i: x[_unflatten(_flat_index(i, shape), x.shape)],
                      x.dtype, "reshape")


register_op("reshape", pattern="injective", infer=_reshape_infer, compute=_reshape_compute,
            reference=lambda x, shape, **a: np.reshape(x, shape).copy())


register_op("copy", pattern="elemwise", infer=lambda t, a: t[0],
            compute=lambda ins, a: te.compute(ins[0].shape, lambda *i: ins[0][i], ins[0].dtype,
                                              "copy"),
            reference=lambda x, **a: np.array(x, copy=True))


# --------------------------------------------------------------------------- transpose

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


# --------------------------------------------------------------------------- concat

def _concat_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    first = types[0]
    (axis,) = norm_axes(attrs.get("axis", 0), first.ndim)
    for t in types[1:]:
        if t.dtype != first.dtype or t.ndim != first.ndim or any(
                a != b for k, (a, b) in enumerate(zip(t.shape, first.shape)) if k != axis):
            raise IRError(f"concat: {t} does not fit {first} along axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(_dim(t.shape[axis]) for t in types)
    return TensorType(tuple(shape), first.dtype)


def _dim(d: object) -> int:
    if not isinstance(d, int):
        raise IRError(f"a static dimension is required here, got {d}")
    return d


def _concat_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (axis,) = norm_axes(attrs.get("axis", 0), inputs[0].ndim)
    out = _concat_infer([TensorType(t.shape, t.dtype) for t in inputs], attrs)
    assert isinstance(out, TensorType)

    offsets = np.cumsum([0] + [t.shape[axis] for t in inputs])

    def element(*i: PrimExpr) -> PrimExpr:
        # the last input whose start is <= i[axis] holds the element
        value: PrimExpr | None = None
        for t, start in zip(inputs, offsets[:-1]):
            local = list(i)
            local[axis] = te.clamp_index(i[axis] - int(start), t.shape[axis])
            v = t[tuple(local)]
            value = v if value is None else select(i[axis] >= int(start), v, value)
        assert value is not None
        return value

    return te.compute(out.shape, element, out.dtype, "concat")  # type: ignore[arg-type]


register_op("concat", pattern="injective", infer=_concat_infer, compute=_concat_compute,
            reference=lambda *xs, axis=0, **a: np.concatenate(xs, axis=axis))


# --------------------------------------------------------------------------- slice / split

def _slice_params(shape: Sequence[int], attrs: Attrs) -> list[tuple[int, int, int]]:
    """Per-axis (start, step, length) with numpy slice semantics, clamped."""
    starts, ends = list(attrs["starts"]), list(attrs["ends"])
    axes = list(attrs.get("axes") or range(len(starts)))
    steps = list(attrs.get("steps") or [1] * len(starts))
    out = [(0, 1, int(d)) for d in shape]
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axes(a, len(shape))[0]
        if st == 0:
            raise IRError("slice: step 0 is not allowed")
        sl = slice(int(s), int(e), int(st)).indices(int(shape[a]))
        length = len(range(*sl))
        out[a] = (sl[0], sl[2], length)
    return out


def _slice_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    return TensorType(tuple(p[2] for p in _slice_params(x.shape, attrs)), x.dtype)  # type: ignore[arg-type]


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


# --------------------------------------------------------------------------- gather

def _gather_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, idx = types
    (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
    if not dt.is_int(idx.dtype):
        raise IRError(f"gather: indices must be integers, got {idx.dtype}")
    return TensorType((*x.shape[:axis], *idx.shape, *x.shape[axis + 1:]), x.dtype)


def _gather_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, ind = inputs
    (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
    out = _gather_infer([TensorType(x.shape, x.dtype), TensorType(ind.shape, ind.dtype)], attrs)
    assert isinstance(out, TensorType)
    n = x.shape[axis]

    def element(*i: PrimExpr) -> PrimExpr:
        k = ind[i[axis:axis + ind.ndim]]
        k = k if k.dtype == "int64" else Cast("int64", k)
        k = select(k < 0, k + n, k)  # negative indices count from the end (ONNX)
        src = (*i[:axis], te.clamp_index(k, n), *i[axis + ind.ndim:])
        return x[src]

    return te.compute(out.shape, element, x.dtype, "gather")  # type: ignore[arg-type]


register_op("gather", pattern="injective", infer=_gather_infer, compute=_gather_compute,
            reference=lambda x, i, axis=0, **a: np.take(x, i, axis=axis))


# --------------------------------------------------------------------------- broadcast_to, tile

def _bto_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    return TensorType(broadcast_shapes(x.shape, tuple(attrs["shape"])), x.dtype)  # type: ignore[arg-type]


def _bto_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    shape = broadcast_shapes(x.shape, tuple(attrs["shape"]))
    return te.compute(shape, lambda *i: x[broadcast_index(i, x.shape)], x.dtype, "broadcast_to")


register_op("broadcast_to", pattern="broadcast", infer=_bto_infer, compute=_bto_compute,
            reference=lambda x, shape, **a: np.broadcast_to(
                x, broadcast_shapes(x.shape, tuple(shape))).copy())


def _tile_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    reps = tuple(int(r) for r in attrs["repeats"])
    if len(reps) != x.ndim:
        raise IRError(f"tile: repeats {reps} must have one entry per dim of {x}")
    return TensorType(tuple(int(d) * r for d, r in zip(x.shape, reps)), x.dtype)  # type: ignore[arg-type]


def _tile_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    out = _tile_infer([TensorType(x.shape, x.dtype)], attrs)
    assert isinstance(out, TensorType)
    return te.compute(out.shape, lambda *i: x[tuple(k % d for k, d in zip(i, x.shape))],  # type: ignore[arg-type]
                      x.dtype, "tile")


register_op("tile", pattern="injective", infer=_tile_infer, compute=_tile_compute,
            reference=lambda x, repeats, **a: np.tile(x, repeats))


# --------------------------------------------------------------------------- pad

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
    if mode == "reflect" and any(d < 2 and (a or b) for d, (a, b) in zip(x.shape, widths)):
        raise IRError(f"pad: reflect mode needs at least 2 elements along padded dims of {x}")
    if mode == "reflect" and any(a >= d or b >= d for d, (a, b) in zip(x.shape, widths)):
        raise IRError(f"pad: reflect pads {widths} must be smaller than the dims of {x}")
    return TensorType(tuple(int(d) + a + b for d, (a, b) in zip(x.shape, widths)), x.dtype)  # type: ignore[arg-type]


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

    return te.compute(out.shape, element, x.dtype, "pad")  # type: ignore[arg-type]


def _pad_ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
    widths = _pad_widths(attrs, x.ndim)
    mode = attrs.get("mode", "constant")
    if mode == "constant":
        return np.pad(x, widths, constant_values=attrs.get("value", 0))
    if x.size == 0:
        raise IRError(f"pad: mode {mode!r} cannot pad an empty tensor")
    return np.pad(x, widths, mode=mode)


register_op("pad", pattern="injective", infer=_pad_infer, compute=_pad_compute,
            reference=_pad_ref)


# --------------------------------------------------------------------------- cast, where, clip

def _cast_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    return TensorType(types[0].shape, dt.check_dtype(attrs["dtype"]))


def _cast_value(v: PrimExpr, dtype: str) -> PrimExpr:
    if v.dtype == dtype:
        return v
    if dtype == "bool":
        return compare("ne", v, Const(0, v.dtype))
    return Cast(dtype, v)


register_op("cast", pattern="elemwise", infer=_cast_infer,
            compute=lambda ins, a: te.compute(
                ins[0].shape, lambda *i: _cast_value(ins[0][i], a["dtype"]), a["dtype"], "cast"),
            reference=lambda x, dtype, **a: x.astype(dt.to_numpy(dtype)))


def _where_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    c, a, b = types
    if c.dtype != "bool":
        raise IRError(f"where: condition must be bool, got {c.dtype}")
    shape = broadcast_shapes(c.shape, a.shape, b.shape)  # type: ignore[arg-type]
    return TensorType(shape, broadcast_types([a, b]).dtype)


def _where_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    c, a, b = inputs
    shape = broadcast_shapes(c.shape, a.shape, b.shape)
    return te.compute(shape, lambda *i: select(
        c[broadcast_index(i, c.shape)], a[broadcast_index(i, a.shape)],
        b[broadcast_index(i, b.shape)]), a.dtype, "where")


register_op("where", pattern="broadcast", infer=_where_infer, compute=_where_compute,
            reference=lambda c, a, b, **k: np.where(c, a, b))


def _clip_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    (x,) = inputs
    lo, hi = attrs.get("min"), attrs.get("max")

    def element(*i: PrimExpr) -> PrimExpr:
        v = x[i]
        if lo is not None:
            v = max_(v, as_expr(lo, x.dtype))
        if hi is not None:
            v = min_(v, as_expr(hi, x.dtype))
        return v

    return te.compute(x.shape, element, x.dtype, "clip")


register_op("clip", pattern="elemwise", infer=lambda t, a: t[0], compute=_clip_compute,
            reference=lambda x, min=None, max=None, **a: _clip_ref(x, min, max))


def _clip_ref(x: np.ndarray, lo: Any, hi: Any) -> np.ndarray:
    out = x
    if lo is not None:
        out = np.maximum(out, np.asarray(lo).astype(x.dtype))
    if hi is not None:
        out = np.minimum(out, np.asarray(hi).astype(x.dtype))
    return np.array(out, dtype=x.dtype)


# --------------------------------------------------------------------------- comparisons, logic

COMPARISONS: dict[str, tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "equal": ("eq", np.equal), "not_equal": ("ne", np.not_equal), "less": ("lt", np.less),
    "less_equal": ("le", np.less_equal), "greater": ("gt", np.greater),
    "greater_equal": ("ge", np.greater_equal),
}
LOGIC: dict[str, tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
    "logical_and": ("and", np.logical_and), "logical_or": ("or", np.logical_or),
    "logical_xor": ("xor", np.logical_xor),
}


def _register_cmp(name: str, fn: Callable[[PrimExpr, PrimExpr], PrimExpr], ref: Callable[..., Any],
                  check_bool: bool) -> None:
    def infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
        t = broadcast_types(types)
        if check_bool and t.dtype != "bool":
            raise IRError(f"{name} needs bool operands, got {t.dtype}")
        return TensorType(t.shape, "bool")

    def compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
        a, b = inputs
        shape = broadcast_shapes(a.shape, b.shape)
        return te.compute(shape, lambda *i: fn(a[broadcast_index(i, a.shape)],
                                               b[broadcast_index(i, b.shape)]), "bool", name)

    register_op(name, pattern="broadcast", infer=infer, compute=compute,
                reference=lambda a, b, **k: ref(a, b))


def _scalar_op(op: str, comparison: bool) -> Callable[[PrimExpr, PrimExpr], PrimExpr]:
    def fn(a: PrimExpr, b: PrimExpr) -> PrimExpr:
        return compare(op, a, b) if comparison else binary(op, a, b)
    return fn


for _n, (_op, _r) in COMPARISONS.items():
    _register_cmp(_n, _scalar_op(_op, True), _r, False)
for _n, (_op, _r) in LOGIC.items():
    _register_cmp(_n, _scalar_op(_op, False), _r, True)


register_op("logical_not", pattern="elemwise",
            infer=lambda t, a: t[0] if t[0].dtype == "bool" else _not_bool(t[0]),
            compute=lambda ins, a: te.compute(ins[0].shape, lambda *i: UnaryOp("not", ins[0][i]),
                                              "bool", "logical_not"),
            reference=lambda x, **a: np.logical_not(x))


def _not_bool(t: TensorType) -> Type:
    raise IRError(f"logical_not needs a bool tensor, got {t.dtype}")


# --------------------------------------------------------------------------- ONNX mapping

def _need(ctx: GraphContext, expr: g.Expr | None, what: str) -> np.ndarray:
    value = ctx.value(expr)
    if value is None:
        raise IRError(f"{what} must be a compile-time constant (kiln needs static shapes)")
    return value


def _one(inputs: Sequence[g.Expr | None]) -> g.Expr:
    x = inputs[0]
    if x is None:
        raise IRError("the first input is missing")
    return x


@onnx_op("Reshape")
def _reshape_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr]:
    x = _one(inputs)
    shape_in = attrs.get("shape") if ctx.opset < 5 else _need(ctx, inputs[1], "Reshape shape")
    assert shape_in is not None
    src = ctx.tensor_type(x).static_shape
    shape = [int(d) for d in np.asarray(shape_in).reshape(-1)]
    allow_zero = bool(attrs.get("allowzero", 0))
    for k, d in enumerate(shape):
        if d == 0 and not allow_zero:
            shape[k] = src[k]
    if -1 in shape:
        known = int(np.prod([d for d in shape if d != -1]))
        shape[shape.index(-1)] = int(np.prod(src)) // max(known, 1)
    return [ctx.call("reshape", x, shape=tuple(shape))]


@onnx_op("Flatten")
def _flatten_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr]:
    x = _one(inputs)
    shape = ctx.tensor_type(x).static_shape
    axis = int(attrs.get("axis", 1))
    axis = axis + len(shape) if axis < 0 else axis
    rows = int(np.prod(shape[:axis]))
    return [ctx.call("reshape", x, shape=(rows, int(np.prod(shape[axis:]))))]


@onnx_op("Squeeze")
def _squeeze_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr]:
    x = _one(inputs)
    shape = ctx.tensor_type(x).static_shape
    if ctx.opset >= 13:
        axes_v = ctx.value(inputs[1]) if len(inputs) > 1 else None
        axes_raw = None if axes_v is None else tuple(int(a) for a in axes_v.reshape(-1))
        if len(inputs) > 1 and inputs[1] is not None and axes_v is None:
            raise IRError("Squeeze axes must be a compile-time constant")
    else:
        axes_raw = attrs.get("axes")
    axes = norm_axes(axes_raw, len(shape)) if axes_raw is not None else tuple(
        k for k, d in enumerate(shape) if d == 1)
    for a in axes:
        if shape[a] != 1:
            raise IRError(f"Squeeze: dimension {a} has size {shape[a]}, not 1")
    return [ctx.call("reshape", x, shape=tuple(d for k, d in enumerate(shape) if k not in axes))]


@onnx_op("Unsqueeze")
def _unsqueeze_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                    attrs: dict[str, Any]) -> list[g.Expr]:
    x = _one(inputs)
    shape = list(ctx.tensor_type(x).static_shape)
    raw = (_need(ctx, inputs[1], "Unsqueeze axes").reshape(-1) if ctx.opset >= 13
           else attrs["axes"])
    axes = norm_axes(tuple(int(a) for a in raw), len(shape) + len(raw))
    for a in axes:
        shape.insert(a, 1)
    return [ctx.call("reshape", x, shape=tuple(shape))]


@onnx_op("Transpose")
def _transpose_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                    attrs: dict[str, Any]) -> list[g.Expr]:
    perm = attrs.get("perm")
    return [ctx.call("transpose", _one(inputs), perm=None if perm is None else tuple(perm))]


@onnx_op("Concat")
def _concat_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                 attrs: dict[str, Any]) -> list[g.Expr]:
    args = [x for x in inputs if x is not None and ctx.tensor_type(x).numel() > 0]
    if not args:
        raise IRError("Concat of only empty tensors")
    axis = norm_axes(attrs["axis"], ctx.tensor_type(args[0]).ndim)[0]
    if len(args) == 1:
        return [ctx.call("copy", args[0])]
    return [ctx.call("concat", *args, axis=axis)]


@onnx_op("Split")
def _split_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
    x = _one(inputs)
    t = ctx.tensor_type(x)
    axis = norm_axes(attrs.get("axis", 0), t.ndim)[0]
    n = t.static_shape[axis]
    if ctx.opset >= 13 and len(inputs) > 1 and inputs[1] is not None:
        sizes = [int(s) for s in _need(ctx, inputs[1], "Split sizes").reshape(-1)]
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
    return [_item(ctx, out, k) for k in range(len(sizes))]


def _item(ctx: GraphContext, expr: g.Expr, k: int) -> g.Expr:
    return ctx.item(expr, k)


@onnx_op("Slice")
def _slice_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
    x = _one(inputs)
    ndim = ctx.tensor_type(x).ndim
    if ctx.opset >= 10:
        starts = _need(ctx, inputs[1], "Slice starts").reshape(-1).tolist()
        ends = _need(ctx, inputs[2], "Slice ends").reshape(-1).tolist()
        axes_v = ctx.value(inputs[3]) if len(inputs) > 3 else None
        steps_v = ctx.value(inputs[4]) if len(inputs) > 4 else None
        axes = axes_v.reshape(-1).tolist() if axes_v is not None else list(range(len(starts)))
        steps = steps_v.reshape(-1).tolist() if steps_v is not None else [1] * len(starts)
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


@onnx_op("Gather")
def _gather_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                 attrs: dict[str, Any]) -> list[g.Expr]:
    x, idx = _one(inputs), inputs[1]
    assert idx is not None
    return [ctx.call("gather", x, idx, axis=norm_axes(attrs.get("axis", 0),
                                                       ctx.tensor_type(x).ndim)[0])]


@onnx_op("Expand")
def _expand_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                 attrs: dict[str, Any]) -> list[g.Expr]:
    shape = tuple(int(d) for d in _need(ctx, inputs[1], "Expand shape").reshape(-1))
    return [ctx.call("broadcast_to", _one(inputs), shape=shape)]


@onnx_op("Tile")
def _tile_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> list[g.Expr]:
    reps = tuple(int(d) for d in _need(ctx, inputs[1], "Tile repeats").reshape(-1))
    return [ctx.call("tile", _one(inputs), repeats=reps)]


@onnx_op("Pad")
def _pad_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
              attrs: dict[str, Any]) -> list[g.Expr]:
    x = _one(inputs)
    ndim = ctx.tensor_type(x).ndim
    if ctx.opset >= 11:
        pads = [int(p) for p in _need(ctx, inputs[1], "Pad pads").reshape(-1)]
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
    if any(p < 0 for p in pads):
        raise IRError(f"Pad: negative pads {pads} are not supported")
    return [ctx.call("pad", x, pads=tuple(pads), mode=mode, value=value)]


@onnx_op("Cast")
def _cast_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> list[g.Expr]:
    from onnx import helper

    to = attrs["to"]
    dtype = dt.from_numpy(helper.tensor_dtype_to_np_dtype(int(to)))
    return [ctx.call("cast", _one(inputs), dtype=dtype)]


@onnx_op("Where")
def _where_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
    c, a, b = inputs
    assert c is not None and a is not None and b is not None
    return [ctx.call("where", c, a, b)]


@onnx_op("Clip")
def _clip_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> list[g.Expr]:
    x = _one(inputs)
    if ctx.opset >= 11:
        lo_v = ctx.value(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else None
        hi_v = ctx.value(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else None
        if (len(inputs) > 1 and inputs[1] is not None and lo_v is None) or (
                len(inputs) > 2 and inputs[2] is not None and hi_v is None):
            raise IRError("Clip min/max must be compile-time constants")
        lo = None if lo_v is None else lo_v.reshape(-1)[0].item()
        hi = None if hi_v is None else hi_v.reshape(-1)[0].item()
    else:
        lo, hi = attrs.get("min"), attrs.get("max")
    return [ctx.call("clip", x, min=lo, max=hi)]


def _cmp_converter(op: str) -> Converter:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        a, b = inputs[0], inputs[1]
        assert a is not None and b is not None
        return [ctx.call(op, a, b)]
    return convert


for _o, _k in {"Equal": "equal", "Less": "less", "LessOrEqual": "less_equal",
               "Greater": "greater", "GreaterOrEqual": "greater_equal", "And": "logical_and",
               "Or": "logical_or", "Xor": "logical_xor"}.items():
    onnx_op(_o)(_cmp_converter(_k))


@onnx_op("Not")
def _not_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
              attrs: dict[str, Any]) -> list[g.Expr]:
    return [ctx.call("logical_not", _one(inputs))]


@onnx_op("Identity")
def _identity_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                   attrs: dict[str, Any]) -> list[g.Expr]:
    return [_one(inputs)]


@onnx_op("Dropout")
def _dropout_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr]:
    x = _one(inputs)
    training = bool(attrs.get("is_test", 1) == 0) if ctx.opset < 7 else False
    if len(inputs) > 2 and inputs[2] is not None:
        training = bool(_need(ctx, inputs[2], "Dropout training_mode").reshape(-1)[0])
    ratio = float(attrs.get("ratio", 0.5))
    if len(inputs) > 1 and inputs[1] is not None:
        ratio = float(_need(ctx, inputs[1], "Dropout ratio").reshape(-1)[0])
    if training and ratio > 0:
        raise IRError("training-mode Dropout is random; kiln compiles inference graphs")
    # Inference: the identity, and an all-true mask.
    return [x, ctx.const(np.ones(ctx.tensor_type(x).static_shape, dtype=bool))]


@onnx_op("Shape")
def _shape_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
    shape = ctx.tensor_type(_one(inputs)).static_shape
    start = int(attrs.get("start", 0))
    end = attrs.get("end")
    return [ctx.const(np.array(shape[start:None if end is None else int(end)], dtype=np.int64))]


@onnx_op("Size")
def _size_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> list[g.Expr]:
    return [ctx.const(np.array(ctx.tensor_type(_one(inputs)).numel(), dtype=np.int64))]


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
    shape = tuple(int(d) for d in _need(ctx, inputs[0], "ConstantOfShape shape").reshape(-1))
    value = np.asarray(attrs.get("value", np.zeros(1, np.float32))).reshape(-1)
    return [ctx.const(np.full(shape, value[0], dtype=value.dtype))]


@onnx_op("Range")
def _range_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
    start, limit, delta = (_need(ctx, x, "Range bounds") for x in inputs[:3])
    return [ctx.const(np.arange(start.item(), limit.item(), delta.item(), dtype=start.dtype))]


# --------------------------------------------------------------------------- trilu

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


# --------------------------------------------------------------------------- gather_elements

def _gather_elements_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, idx = types
    norm_axes(attrs.get("axis", 0), x.ndim)
    if idx.ndim != x.ndim or not dt.is_int(idx.dtype):
        raise IRError(f"gather_elements: indices {idx} must be integers of the rank of {x}")
    return TensorType(idx.shape, x.dtype)


def _gather_elements_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, ind = inputs
    (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
    n = x.shape[axis]

    def element(*i: PrimExpr) -> PrimExpr:
        k = ind[i]
        k = k if k.dtype == "int64" else Cast("int64", k)
        k = select(k < 0, k + n, k)
        return x[tuple(te.clamp_index(k, n) if d == axis else i[d] for d in range(x.ndim))]

    return te.compute(ind.shape, element, x.dtype, "gather_elements")


def _gather_elements_ref(x: np.ndarray, idx: np.ndarray, **attrs: Any) -> np.ndarray:
    (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return np.take_along_axis(x, idx.astype(np.int64), axis=axis)


register_op("gather_elements", pattern="injective", infer=_gather_elements_infer,
            compute=_gather_elements_compute, reference=_gather_elements_ref)


# --------------------------------------------------------------------------- gather_nd

def _index(ind: te.Tensor, idx: Sequence[PrimExpr], extent: int) -> PrimExpr:
    """An index value read from `ind`, negative values counted from the end, clamped."""
    k = ind[tuple(idx)]
    k = k if k.dtype == "int64" else Cast("int64", k)
    return te.clamp_index(select(k < 0, k + extent, k), extent)


def _gather_nd_shape(data: Sequence[int], ind: Sequence[int], batch: int) -> tuple[int, ...]:
    r = ind[-1] if ind else 0
    if not ind or batch >= len(ind) or batch + r > len(data) or \
            tuple(ind[:batch]) != tuple(data[:batch]):
        raise IRError(f"gather_nd: indices {tuple(ind)} with batch_dims {batch} do not fit "
                      f"data {tuple(data)}")
    return (*ind[:-1], *data[batch + r:])


def _gather_nd_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, idx = types
    if not dt.is_int(idx.dtype):
        raise IRError(f"gather_nd: indices must be integers, got {idx.dtype}")
    shape = _gather_nd_shape(x.static_shape, idx.static_shape, int(attrs.get("batch_dims", 0)))
    return TensorType(shape, x.dtype)


def _gather_nd_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, ind = inputs
    batch = int(attrs.get("batch_dims", 0))
    shape = _gather_nd_shape(x.shape, ind.shape, batch)
    r = ind.shape[-1]
    lead = ind.ndim - 1

    def element(*i: PrimExpr) -> PrimExpr:
        picked = [_index(ind, (*i[:lead], as_expr(t)), x.shape[batch + t]) for t in range(r)]
        return x[(*i[:batch], *picked, *i[lead:])]

    return te.compute(shape, element, x.dtype, "gather_nd")


def _gather_nd_ref(x: np.ndarray, idx: np.ndarray, **attrs: Any) -> np.ndarray:
    batch = int(attrs.get("batch_dims", 0))
    shape = _gather_nd_shape(x.shape, idx.shape, batch)
    r = idx.shape[-1]
    out = np.empty(shape, dtype=x.dtype)
    for pos in np.ndindex(*idx.shape[:-1]):
        key = tuple(int(v) for v in idx[pos])
        src = (*pos[:batch], *(k + x.shape[batch + t] if k < 0 else k
                               for t, k in enumerate(key)))
        out[pos] = x[src]
    del r
    return out


register_op("gather_nd", pattern="injective", infer=_gather_nd_infer,
            compute=_gather_nd_compute, reference=_gather_nd_ref)


# --------------------------------------------------------------------------- scatter

SCATTER_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _scatter_check(attrs: Attrs) -> str:
    red = str(attrs.get("reduction", "none"))
    if red not in SCATTER_REDUCTIONS:
        raise IRError(f"scatter: unknown reduction {red!r}; known: "
                      f"{', '.join(SCATTER_REDUCTIONS)}")
    return red


def _neutral(kind: str, dtype: str) -> PrimExpr:
    """The value that leaves a `kind` reduction unchanged."""
    if kind == "max":
        return te.lowest_value(dtype)
    if kind == "min":
        return te.highest_value(dtype)
    return as_expr(0 if kind == "sum" else 1, dtype)


def _scatter_combine(red: str, base: PrimExpr, matches: Callable[[str], PrimExpr]
                     ) -> PrimExpr:
    """`base` combined with the matching updates (`matches(kind)` reduces them)."""
    if red == "add":
        return base + matches("sum")
    if red == "mul":
        return base * matches("prod")
    if red == "max":
        return max_(base, matches("max"))
    return min_(base, matches("min"))


def _scatter_elements_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, idx, upd = types
    norm_axes(attrs.get("axis", 0), x.ndim)
    _scatter_check(attrs)
    if idx.ndim != x.ndim or idx.shape != upd.shape or upd.dtype != x.dtype or \
            not dt.is_int(idx.dtype):
        raise IRError(f"scatter_elements: indices {idx} and updates {upd} must have one shape "
                      f"and the rank of data {x}")
    return x


def _scatter_elements_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, ind, upd = inputs
    (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
    red = _scatter_check(attrs)
    n = x.shape[axis]

    def element(*i: PrimExpr) -> PrimExpr:
        def src(k: PrimExpr) -> tuple[PrimExpr, ...]:
            return tuple(k if d == axis else te.clamp_index(i[d], ind.shape[d])
                         for d in range(x.ndim))

        inside: PrimExpr = as_expr(True)
        for d in range(x.ndim):
            if d != axis and ind.shape[d] < x.shape[d]:
                inside = inside & (i[d] < ind.shape[d])

        def match(k: PrimExpr) -> PrimExpr:
            return inside & _index(ind, src(k), n).eq(i[axis])

        m = ind.shape[axis]
        if red == "none":
            last = te.reduce("max", lambda k: select(match(k), k, as_expr(-1)), (m,), "int64")
            hit = upd[src(te.clamp_index(last, m))]
            return select(last >= 0, hit, x[i])

        def matches(kind: str) -> PrimExpr:
            fill = _neutral(kind, x.dtype)
            return te.reduce(kind, lambda k: select(match(k), upd[src(k)], fill), (m,), x.dtype)

        return _scatter_combine(red, x[i], matches)

    return te.compute(x.shape, element, x.dtype, "scatter_elements")


_NP_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _scatter_elements_ref(x: np.ndarray, idx: np.ndarray, upd: np.ndarray,
                          **attrs: Any) -> np.ndarray:
    (axis,) = norm_axes(attrs.get("axis", 0), x.ndim)
    red = _scatter_check(attrs)
    out = x.copy()
    for pos in np.ndindex(*idx.shape):
        k = int(idx[pos])
        dst = list(pos)
        dst[axis] = k + x.shape[axis] if k < 0 else k
        t = tuple(dst)
        out[t] = upd[pos] if red == "none" else _NP_REDUCE[red](out[t], upd[pos])
    return out


register_op("scatter_elements", pattern="opaque", infer=_scatter_elements_infer,
            compute=_scatter_elements_compute, reference=_scatter_elements_ref)


def _scatter_nd_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, idx, upd = types
    _scatter_check(attrs)
    r = idx.static_shape[-1] if idx.ndim else 0
    want = (*idx.static_shape[:-1], *x.static_shape[r:])
    if not dt.is_int(idx.dtype) or r > x.ndim or upd.static_shape != want or \
            upd.dtype != x.dtype:
        raise IRError(f"scatter_nd: updates {upd} must have shape {want} for indices {idx} "
                      f"into data {x}")
    return x


def _scatter_nd_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, ind, upd = inputs
    red = _scatter_check(attrs)
    r = ind.shape[-1]
    lead = ind.shape[:-1]

    def element(*i: PrimExpr) -> PrimExpr:
        def match(*q: PrimExpr) -> PrimExpr:
            ok: PrimExpr = as_expr(True)
            for t in range(r):
                ok = ok & _index(ind, (*q, as_expr(t)), x.shape[t]).eq(i[t])
            return ok

        if red == "none":
            count = int(np.prod(lead))

            def flat_match(f: PrimExpr) -> PrimExpr:
                q = _unflatten(f, lead)
                return select(match(*q), f, as_expr(-1))

            last = te.reduce("max", flat_match, (count,), "int64")
            q = _unflatten(te.clamp_index(last, count), lead)
            return select(last >= 0, upd[(*q, *i[r:])], x[i])

        def matches(kind: str) -> PrimExpr:
            fill = _neutral(kind, x.dtype)
            return te.reduce(kind, lambda *q: select(match(*q), upd[(*q, *i[r:])], fill), lead,
                             x.dtype)

        return _scatter_combine(red, x[i], matches)

    return te.compute(x.shape, element, x.dtype, "scatter_nd")


def _scatter_nd_ref(x: np.ndarray, idx: np.ndarray, upd: np.ndarray, **attrs: Any) -> np.ndarray:
    red = _scatter_check(attrs)
    out = x.copy()
    for pos in np.ndindex(*idx.shape[:-1]):
        key = tuple(int(k) + x.shape[t] if int(k) < 0 else int(k) for t, k in enumerate(idx[pos]))
        out[key] = upd[pos] if red == "none" else _NP_REDUCE[red](out[key], upd[pos])
    return out


register_op("scatter_nd", pattern="opaque", infer=_scatter_nd_infer, compute=_scatter_nd_compute,
            reference=_scatter_nd_ref)


# --------------------------------------------------------------------------- reverse_sequence

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

    return te.compute(x.shape, element, x.dtype, "reverse_sequence")


def _reverse_sequence_ref(x: np.ndarray, lens: np.ndarray, **attrs: Any) -> np.ndarray:
    b, t = int(attrs.get("batch_axis", 1)), int(attrs.get("time_axis", 0))
    out = x.copy()
    for k, length in enumerate(lens):
        sel: list[Any] = [slice(None)] * x.ndim
        sel[b] = k
        sel[t] = slice(0, int(length))
        out[tuple(sel)] = np.flip(x[tuple(sel)], axis=t - (1 if t > b else 0))
    return out


register_op("reverse_sequence", pattern="injective", infer=_reverse_sequence_infer,
            compute=_reverse_sequence_compute, reference=_reverse_sequence_ref)


# --------------------------------------------------------------------------- ONNX: more mappings

@onnx_op("Trilu")
def _trilu_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
    k = 0
    if len(inputs) > 1 and inputs[1] is not None:
        k = int(_need(ctx, inputs[1], "Trilu k").reshape(-1)[0])
    return [ctx.call("trilu", _one(inputs), k=k, upper=bool(attrs.get("upper", 1)))]


@onnx_op("GatherElements")
def _gather_elements_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                          attrs: dict[str, Any]) -> list[g.Expr]:
    x, idx = _one(inputs), inputs[1]
    assert idx is not None
    axis = norm_axes(attrs.get("axis", 0), ctx.tensor_type(x).ndim)[0]
    return [ctx.call("gather_elements", x, idx, axis=axis)]


@onnx_op("CastLike")
def _cast_like_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                    attrs: dict[str, Any]) -> list[g.Expr]:
    like = inputs[1]
    assert like is not None
    return [ctx.call("cast", _one(inputs), dtype=ctx.tensor_type(like).dtype)]


@onnx_op("DepthToSpace")
def _depth_to_space_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                         attrs: dict[str, Any]) -> list[g.Expr]:
    x = _one(inputs)
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
    x = _one(inputs)
    n, c, h, w = ctx.tensor_type(x).static_shape
    b = int(attrs["blocksize"])
    if h % b or w % b:
        raise IRError(f"SpaceToDepth: spatial dims {h}x{w} are not divisible by blocksize {b}")
    y = ctx.call("reshape", x, shape=(n, c, h // b, b, w // b, b))
    # DCR: output channel = (row in block, column in block, c); CRD: (c, row, column)
    perm = (0, 1, 3, 5, 2, 4) if attrs.get("mode", "DCR") == "CRD" else (0, 3, 5, 1, 2, 4)
    y = ctx.call("transpose", y, perm=perm)
    return [ctx.call("reshape", y, shape=(n, c * b * b, h // b, w // b))]


@onnx_op("EyeLike")
def _eye_like_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                   attrs: dict[str, Any]) -> list[g.Expr]:
    from onnx import helper

    t = ctx.tensor_type(_one(inputs))
    if t.ndim != 2:
        raise IRError(f"EyeLike needs a 2-D input, got {t}")
    dtype = t.dtype if "dtype" not in attrs else dt.from_numpy(
        helper.tensor_dtype_to_np_dtype(int(attrs["dtype"])))
    rows, cols = t.static_shape
    eye = np.eye(rows, cols, k=int(attrs.get("k", 0)), dtype=dt.to_numpy(dtype))
    return [ctx.const(eye)]


@onnx_op("OneHot")
def _one_hot_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr]:
    indices, values = _one(inputs), inputs[2]
    assert values is not None
    depth = int(_need(ctx, inputs[1], "OneHot depth").reshape(-1)[0])
    it = ctx.tensor_type(indices)
    axis = norm_axes(int(attrs.get("axis", -1)), it.ndim + 1)[0]
    idx = indices if it.dtype == "int64" else ctx.call("cast", indices, dtype="int64")
    # negative indices count from the end
    idx = ctx.call("where", ctx.call("less", idx, ctx.const(0, "int64")),
                   ctx.call("add", idx, ctx.const(depth, "int64")), idx)
    shape = list(it.static_shape)
    shape.insert(axis, 1)
    idx = ctx.call("reshape", idx, shape=tuple(shape))
    iota_shape = [1] * len(shape)
    iota_shape[axis] = depth
    iota = ctx.const(np.arange(depth, dtype=np.int64).reshape(iota_shape))
    hot = ctx.call("equal", idx, iota)
    vt = ctx.tensor_type(values)
    off = ctx.call("reshape", ctx.call("strided_slice", values, starts=(0,), ends=(1,),
                                       axes=(0,), steps=(1,)), shape=())
    on = ctx.call("reshape", ctx.call("strided_slice", values, starts=(1,), ends=(2,),
                                      axes=(0,), steps=(1,)), shape=())
    if vt.static_shape != (2,):
        raise IRError(f"OneHot values must have shape (2,), got {vt.static_shape}")
    return [ctx.call("where", hot, on, off)]


@onnx_op("GatherND")
def _gather_nd_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                    attrs: dict[str, Any]) -> list[g.Expr]:
    idx = inputs[1]
    assert idx is not None
    return [ctx.call("gather_nd", _one(inputs), idx, batch_dims=int(attrs.get("batch_dims", 0)))]


@onnx_op("ScatterElements", "Scatter")
def _scatter_elements_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                           attrs: dict[str, Any]) -> list[g.Expr]:
    x, idx, upd = _one(inputs), inputs[1], inputs[2]
    assert idx is not None and upd is not None
    axis = norm_axes(attrs.get("axis", 0), ctx.tensor_type(x).ndim)[0]
    return [ctx.call("scatter_elements", x, idx, upd, axis=axis,
                     reduction=str(attrs.get("reduction", "none")))]


@onnx_op("ScatterND")
def _scatter_nd_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                     attrs: dict[str, Any]) -> list[g.Expr]:
    x, idx, upd = _one(inputs), inputs[1], inputs[2]
    assert idx is not None and upd is not None
    return [ctx.call("scatter_nd", x, idx, upd, reduction=str(attrs.get("reduction", "none")))]


@onnx_op("ReverseSequence")
def _reverse_sequence_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                           attrs: dict[str, Any]) -> list[g.Expr]:
    lens = inputs[1]
    assert lens is not None
    return [ctx.call("reverse_sequence", _one(inputs), lens,
                     batch_axis=int(attrs.get("batch_axis", 1)),
                     time_axis=int(attrs.get("time_axis", 0)))]


@onnx_op("CenterCropPad")
def _center_crop_pad_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                          attrs: dict[str, Any]) -> list[g.Expr]:
    x = _one(inputs)
    shape = ctx.tensor_type(x).static_shape
    target = [int(d) for d in _need(ctx, inputs[1], "CenterCropPad shape").reshape(-1)]
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

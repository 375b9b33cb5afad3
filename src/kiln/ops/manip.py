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

    def element(*i: PrimExpr) -> PrimExpr:
        offsets = np.cumsum([0] + [t.shape[axis] for t in inputs])
        value: PrimExpr | None = None
        for t, start in reversed(list(zip(inputs, offsets[:-1]))):
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
    return x[tuple(slice(s, s + st * n, st) if n else slice(0, 0)
                   for s, st, n in params)].copy()


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
    if mode not in ("constant", "edge", "reflect"):
        raise IRError(f"pad: unknown mode {mode!r}; known: constant, edge, reflect")
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
            reference=lambda x, min=None, max=None, **a: np.clip(
                x, -np.inf if min is None else min, np.inf if max is None else max
            ).astype(x.dtype))


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
        parts = int(attrs.get("num_outputs", 0)) or int(attrs.get("_num_outputs", 0))
        if not parts:
            raise IRError("Split needs split sizes or num_outputs")
        step = -(-n // parts)
        sizes = [min(step, n - k * step) for k in range(parts)]
    out = ctx.call("split", x, axis=axis, sections=tuple(sizes))
    return [_item(ctx, out, k) for k in range(len(sizes))]


def _item(ctx: GraphContext, expr: g.Expr, k: int) -> g.Expr:
    item = getattr(ctx, "item", None)
    if item is None:
        raise IRError("this importer cannot take tuple items")
    result: g.Expr = item(expr, k)
    return result


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


@onnx_op("Identity", "Dropout")
def _identity_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                   attrs: dict[str, Any]) -> list[g.Expr]:
    x = _one(inputs)
    outs = [x]
    # Dropout's optional mask output: all true at inference.
    t = ctx.tensor_type(x)
    outs.append(ctx.const(np.ones(t.static_shape, dtype=bool)))
    return outs


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

"""Tensor manipulation (injective ops): reshape, transpose, concat, split, slice,
gather, broadcast_to, tile, pad, cast, where, clip, comparisons and logic."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
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

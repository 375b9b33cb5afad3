"""Shape and layout ops (injective): reshape, transpose, concat, slice, split,
broadcast_to, tile, pad, trilu, reverse_sequence. The ONNX ops that map onto them or
need no op of their own (Flatten, Squeeze, Shape, Constant, Range, ...) are converted
in kiln.frontend.onnx.converters.manip.

Indexing ops live in `indexing.py`; cast, where, clip, comparisons and logic in
`logic.py`.
"""

from __future__ import annotations

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
    dims_equal,
    exact_div,
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
from kiln.ops.assumptions import unproven
from kiln.ops.broadcast import broadcast_index, broadcast_shapes
from kiln.ops.reduce import norm_axes
from kiln.ops.registry import OPS, OpDef, register_op
from kiln.ops.reshape_dims import reshape_attr, reshape_target

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
                             ) -> tuple[tuple[Dim, ...], tuple[int, ...], tuple[Dim, ...]]:
    """(inner, perm, shape) of a `reshape_transpose` call, checked against the input.
    `inner` and `shape` are reshape targets (kiln.ops.reshape_dims): a symbolic size is
    an input dimension (`-2 - k`, a batch the chain keeps) or a dimension text."""
    inner = reshape_target(x.shape, attrs["inner"])
    perm = _perm(attrs, len(inner))
    shape = reshape_target(x.shape, attrs["shape"])
    size = dim_product(x.shape)
    if any(dims_equal(dim_product(s), size) is not True for s in (inner, shape)):
        raise IRError(f"reshape_transpose: the input {shape_text(x.shape)}, its view "
                      f"{shape_text(inner)} and the result {shape_text(shape)} must hold "
                      "as many elements")
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
    viewed = _reshape_compute([x], {"shape": reshape_attr(tuple(x.shape), inner)})
    moved = _transpose_compute([viewed], {"perm": perm})
    return _reshape_compute([moved], {"shape": reshape_attr(tuple(moved.shape), shape)})


def _reshape_transpose_ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
    inner = tuple(int(d) for d in reshape_target(x.shape, attrs["inner"]))  # type: ignore[arg-type]
    shape = tuple(int(d) for d in reshape_target(x.shape, attrs["shape"]))  # type: ignore[arg-type]
    return np.transpose(x.reshape(inner), _perm(attrs, len(inner))).reshape(shape).copy()


# `reshape(x, inner) -> transpose(perm) -> reshape(shape)` in one copy; the
# `merge-copies` graph pass (kiln.transform.merge_copies) builds it from chains of
# reshapes and transposes such as ShuffleNet's channel shuffle.
register_op("reshape_transpose", pattern="injective", infer=_reshape_transpose_infer,
            compute=_reshape_transpose_compute, reference=_reshape_transpose_ref,
            dim_text_attrs=("inner", "shape"))


# --------------------------------------------------------------------- concat

def _concat_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    first = types[0]
    (axis,) = norm_axes(attrs.get("axis", 0), first.ndim)
    for t in types[1:]:
        if t.dtype != first.dtype or t.ndim != first.ndim:
            raise IRError(_concat_misfit(t, first, axis))
        for k, (a, b) in enumerate(zip(t.shape, first.shape)):
            same = dims_equal(a, b) if k != axis else True
            if same is None:
                unproven(_concat_misfit(t, first, axis), a, b)
            elif not same:
                raise IRError(_concat_misfit(t, first, axis))
    shape = list(first.shape)
    shape[axis] = sum_dims(t.shape[axis] for t in types)
    return TensorType(tuple(shape), first.dtype)


def _concat_misfit(t: TensorType, first: TensorType, axis: int) -> str:
    """The error text of a concat input `t` that does not fit the first one (printed
    only on failure: DenseNet's concats take dozens of inputs each)."""
    return (f"concat: {t.dtype}{shape_text(t.shape)} does not fit "
            f"{first.dtype}{shape_text(first.shape)} along axis {axis}")


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

    def legalize(self, call: g.Call) -> tuple[PrimFunc, str]:
        prim, hint = super().legalize(call)
        (axis,) = norm_axes(call.attrs.get("axis", 0), len(prim.buffer_params[-1].shape))
        return prim.with_attrs(**{ATTR_CONCAT_AXIS: axis}), hint


OPS.register("concat", ConcatOp("concat", "injective", _concat_infer, _concat_compute,
                                lambda *xs, axis=0, **a: np.concatenate(xs, axis=axis)))


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


def slice_params(shape: Sequence[int], attrs: Attrs) -> list[tuple[int, int, int]]:
    """Per-axis (start, step, length) a `strided_slice` call with `attrs` takes of an array
    of static `shape` (what its reference indexes; the replay of a folded slice,
    kiln.transform.weight_provenance)."""
    return [(int(s), int(st), int(n)) for s, st, n in _slice_params(shape, attrs)]


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

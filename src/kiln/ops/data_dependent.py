"""Operators whose output size is known only after they ran: NonZero, Compress,
Unique, NonMaxSuppression, and the run-time `k` of TopK (docs/abi.md, "Data-dependent
output sizes").

Such an operator's result type has a *run-time dimension*: a dimension variable that
no input gives, named by the call's `dim` attribute (the converter picks a fresh
name), with an **upper bound** that is a static size or an expression of the inputs'
dimensions (NonZero: the input's element count). Its kernel is built here by hand:

    kernel(inputs..., outputs..., count: int64[1], <input dimension scalars>)

Each output is a flat buffer of the bound's size; the kernel writes the result
compactly (row-major for the actual size, from the buffer's start) and stores the
actual size into `count`. The kernel's attribute `kiln.binds_dims` names the
dimension and its bound; `lower-graph-to-tensor` plans the bound's bytes, reads
`count` after the call and passes the value to every later kernel like any other
dimension scalar, and the lowered function returns the values of its results'
run-time dimensions. Every store stays inside the bound: a kernel never writes past
its flat buffer, whatever the data.

All kernels are plain serial loops: NonZero and Compress are linear; Unique and TopK
compare every pair (quadratic in the length); NonMaxSuppression scans the boxes once
per candidate it examines (it stops at max_output_boxes_per_class kept). Correct at
every size, written for detection post-processing and index extraction, not for
sorting millions of values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln import dim_expr
from kiln.errors import CallError, IRError
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.attrs import ATTR_BINDS_DIMS
from kiln.ir.kernel_errors import error_message
from kiln.ir.shape_expr import (
    dim_product,
    dim_text,
    dim_var,
    from_dim_expr,
    is_static,
    simplify_dim,
)
from kiln.ir.types import Dim, TensorType, TupleType, Type
from kiln.ops import nan_order, te
from kiln.ops.reduce import norm_axes, topk_compute, topk_ref
from kiln.ops.registry import OPS, Attrs, OpDef, register_op, result_types

I64 = "int64"
# Kernel error codes of the checks here (kiln.ir.kernel_errors).
TOPK_K_ERROR = 11
GQA_TOTAL_ERROR = 12
# The checks topk_k may report through its `error` attribute (the code of the op whose
# run-time size it computes; topk's own by default).
_RUNTIME_K_ERRORS = (TOPK_K_ERROR, GQA_TOTAL_ERROR)

_RUNTIME_VARS: dict[str, t.Var] = {}


def runtime_dim(name: str) -> t.Var:
    """The dimension variable `name` of a run-time size (one object per name, so every
    type that mentions it holds the same variable)."""
    var = _RUNTIME_VARS.get(name)
    if var is None:
        var = _RUNTIME_VARS[name] = dim_var(name)
    return var


def bound_text(d: Dim) -> int | str:
    """A bound as `kiln.binds_dims` holds it: an int, or its dimension text."""
    d = simplify_dim(d)
    return d if isinstance(d, int) else dim_text(d)


def bound_dim(b: int | str) -> Dim:
    """The Dim of a bound as `bound_text` wrote it."""
    return b if isinstance(b, int) else from_dim_expr(dim_expr.parse(b))


# --------------------------------------------------------------------------- the op class

KernelFn = Callable[[Sequence[t.Buffer], Sequence[t.Buffer], t.Buffer, Attrs], t.Stmt]
BoundFn = Callable[[Sequence[TensorType], Attrs], Dim]


@dataclass(frozen=True, kw_only=True)
class DataDependentOp(OpDef):
    """An operator binding one run-time dimension (`attrs["dim"]`), see the module
    docstring: `bound` gives its upper bound from the argument types, `kernel` the body
    of its hand-built kernel."""

    bound: BoundFn
    kernel: KernelFn

    def legalize(self, call: g.Call) -> tuple[t.PrimFunc, str]:
        types = [a.type for a in call.args]
        tensors = [ty for ty in types if isinstance(ty, TensorType)]
        if len(tensors) != len(types):
            raise IRError(f"operator {self.name}: every argument must be a tensor")
        name = str(call.attrs["dim"])
        bound = simplify_dim(self.bound(tensors, call.attrs))
        inputs = [t.Buffer(f"x{k}", ty.shape, ty.dtype) for k, ty in enumerate(tensors)]
        outputs = []
        for k, ty in enumerate(result_types(call.type)):
            shape = [bound if _is_dim(d, name) else d for d in ty.shape]
            outputs.append(t.Buffer(f"out{k}", (simplify_dim(dim_product(shape)),), ty.dtype))
        count = t.Buffer("count", (1,), I64)
        body = self.kernel(inputs, outputs, count, call.attrs)
        prim = te.with_dim_params(t.PrimFunc((*inputs, *outputs, count), body,
                                             {ATTR_BINDS_DIMS: ((name, bound_text(bound)),)}))
        return prim, self.name


def _is_dim(d: Dim, name: str) -> bool:
    return isinstance(d, t.Var) and d.name == name


def register_data_dependent(name: str, *, infer: Callable[[Sequence[TensorType], Attrs], Type],
                            bound: BoundFn, kernel: KernelFn,
                            reference: Callable[..., Any]) -> OpDef:
    """Register `name` as a DataDependentOp (pattern opaque: never fused)."""

    def compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
        raise IRError(f"operator {name} is lowered by its own kernel, not a te definition")

    op = DataDependentOp(name, "opaque", infer, compute, reference, bound=bound, kernel=kernel)
    OPS.register(name, op)
    return op


# --------------------------------------------------------------------------- IR helpers


def _e(d: Dim | t.PrimExpr | int) -> t.PrimExpr:
    return t.as_expr(d, I64)


def _flat(buf: t.Buffer, name: str) -> tuple[t.Buffer, t.Stmt]:
    """A 1-D view of `buf` (its elements in row-major order) and its declaration."""
    view = t.Buffer(name, (simplify_dim(dim_product(buf.shape)),), buf.dtype)
    return view, t.DeclBuffer(view, buf, 0)


def _loop(name: str, extent: Dim | t.PrimExpr, body: Callable[[t.Var], t.Stmt],
          start: Dim | t.PrimExpr = 0) -> t.Stmt:
    var = t.Var(name, I64)
    return t.For(var, _e(start), _e(extent), "serial", body(var))


def _counter(name: str) -> t.Buffer:
    return t.Buffer(name, (1,), I64, "local")


def _bump(c: t.Buffer) -> t.Stmt:
    return t.Store(c, c[0] + 1, (_e(0),))


def _set(c: t.Buffer, value: t.PrimExpr | int) -> t.Stmt:
    return t.Store(c, _e(value) if isinstance(value, int) else value, (_e(0),))


def _nonzero(v: t.PrimExpr) -> t.PrimExpr:
    return t.compare("ne", v, t.const(0, v.dtype))


def _when(cond: t.PrimExpr, *body: t.Stmt) -> t.Stmt:
    return t.IfThenElse(cond, t.seq(*body))


# --------------------------------------------------------------------------- nonzero


def _nonzero_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    (x,) = types
    if x.ndim == 0:
        raise IRError("nonzero: the input must have at least one dimension")
    return TensorType((x.ndim, runtime_dim(str(attrs["dim"]))), I64)


def _nonzero_bound(types: Sequence[TensorType], attrs: Attrs) -> Dim:
    return dim_product(types[0].shape)


def _nonzero_kernel(ins: Sequence[t.Buffer], outs: Sequence[t.Buffer], count: t.Buffer,
                    attrs: Attrs) -> t.Stmt:
    (x,), (out,) = ins, outs
    rank = x.ndim
    n = t.Var("n", I64)
    c = _counter("c")

    def nest(inner: Callable[[list[t.Var]], t.Stmt]) -> t.Stmt:
        idx = [t.Var(f"i{d}", I64) for d in range(rank)]
        stmt = inner(idx)
        for d in reversed(range(rank)):
            stmt = t.For(idx[d], _e(0), _e(x.shape[d]), "serial", stmt)
        return stmt

    write = nest(lambda idx: _when(_nonzero(x[tuple(idx)]),
                                   *(t.Store(out, idx[d], (_e(d) * n + c[0],))
                                     for d in range(rank)), _bump(c)))
    return t.seq(t.Allocate(c), _set(c, 0),
                 nest(lambda idx: _when(_nonzero(x[tuple(idx)]), _bump(c))),
                 t.LetStmt(n, c[0]), _set(c, 0), write, t.Store(count, n, (_e(0),)))


def nonzero_ref(x: np.ndarray, **attrs: Any) -> np.ndarray:
    """NonZero's result: the indices of the nonzero elements, one row per axis."""
    return np.stack(np.nonzero(x)).astype(np.int64).reshape(x.ndim, -1)


register_data_dependent("nonzero", infer=_nonzero_infer, bound=_nonzero_bound,
                        kernel=_nonzero_kernel, reference=nonzero_ref)


# --------------------------------------------------------------------------- compress


def _split(shape: Sequence[Dim], axis: int) -> tuple[Dim, Dim, Dim]:
    return (dim_product(shape[:axis]), shape[axis], dim_product(shape[axis + 1:]))


def _compress_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, cond = types
    if cond.ndim != 1 or cond.dtype != "bool":
        raise IRError(f"compress: the condition must be a 1-D bool tensor, got {cond}")
    n = runtime_dim(str(attrs["dim"]))
    axis = attrs.get("axis")
    if axis is None:
        return TensorType((n,), x.dtype)
    shape = list(x.shape)
    shape[int(axis)] = n
    return TensorType(tuple(shape), x.dtype)


def _compress_bound(types: Sequence[TensorType], attrs: Attrs) -> Dim:
    x = types[0]
    axis = attrs.get("axis")
    return dim_product(x.shape) if axis is None else x.shape[int(axis)]


def _compress_kernel(ins: Sequence[t.Buffer], outs: Sequence[t.Buffer], count: t.Buffer,
                     attrs: Attrs) -> t.Stmt:
    (x, cond), (out,) = ins, outs
    axis = attrs.get("axis")
    flat, decl = _flat(x, "xf")
    outer, length, inner = ((1, flat.shape[0], 1) if axis is None
                            else _split(x.shape, int(axis)))
    m = t.Var("m", I64)  # conditions beyond the axis (or a short condition) select nothing
    n = t.Var("n", I64)
    c = _counter("c")

    def copy(o: t.Var) -> t.Stmt:
        def take(j: t.Var) -> t.Stmt:
            def element(k: t.Var) -> t.Stmt:
                return t.Store(out, flat[(o * _e(length) + j) * _e(inner) + k],
                               ((o * n + c[0]) * _e(inner) + k,))
            return _when(cond[j], _loop("k", inner, element), _bump(c))
        return t.seq(_set(c, 0), _loop("j", m, take))

    return t.seq(decl, t.Allocate(c), t.LetStmt(m, t.min_(_e(length), _e(cond.shape[0]))),
                 _set(c, 0), _loop("j", m, lambda j: _when(cond[j], _bump(c))),
                 t.LetStmt(n, c[0]), _loop("o", outer, copy), t.Store(count, n, (_e(0),)))


def compress_ref(x: np.ndarray, cond: np.ndarray, **attrs: Any) -> np.ndarray:
    """Compress's result: the slices of `x` along `axis` (flattened when None) where
    `cond` is true."""
    axis = attrs.get("axis")
    if axis is None:
        flat = x.reshape(-1)
        m = min(flat.size, cond.size)
        return flat[:m][cond[:m]]
    m = min(x.shape[int(axis)], cond.size)
    return np.compress(cond[:m], x, axis=int(axis))


register_data_dependent("compress", infer=_compress_infer, bound=_compress_bound,
                        kernel=_compress_kernel, reference=compress_ref)


# --------------------------------------------------------------------------- run-time k


def _runtime_k_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    k, x = types
    if k.dtype != I64 or not is_static(k.shape) or k.numel() != 1:
        raise IRError(f"topk: k must be one int64 value, got {k}")
    norm_axes(int(attrs["axis"]), x.ndim)
    _runtime_k_error(attrs)
    return TensorType((runtime_dim(str(attrs["dim"])),), I64)


def _runtime_k_error(attrs: Attrs) -> int:
    code = int(attrs.get("error", TOPK_K_ERROR))
    if code not in _RUNTIME_K_ERRORS:
        raise IRError(f"topk_k: error {code} is none of {list(_RUNTIME_K_ERRORS)}")
    return code


def _runtime_k_bound(types: Sequence[TensorType], attrs: Attrs) -> Dim:
    x = types[1]
    return x.shape[norm_axes(int(attrs["axis"]), x.ndim)[0]]


def _runtime_k_kernel(ins: Sequence[t.Buffer], outs: Sequence[t.Buffer], count: t.Buffer,
                      attrs: Attrs) -> t.Stmt:
    k, out = ins[0], outs[0]  # ins[1] (x) sizes the bound only
    flat, decl = _flat(k, "kf")
    n = _e(out.shape[0])
    kv = t.Var("k", I64)
    ok = (kv >= 0) & (kv <= n)
    return t.seq(decl, t.LetStmt(kv, flat[0]),
                 t.Evaluate(t.Intrin(t.CHECK_INTRINSIC,
                                     (ok, t.const(_runtime_k_error(attrs), "int32")))),
                 _loop("i", kv, lambda i: t.Store(out, i, (i,))),
                 t.Store(count, kv, (_e(0),)))


def _runtime_k_ref(k: np.ndarray, x: np.ndarray, **attrs: Any) -> np.ndarray:
    n = x.shape[norm_axes(int(attrs["axis"]), x.ndim)[0]]
    value = int(k.reshape(-1)[0])
    if not 0 <= value <= n:
        raise CallError(error_message(_runtime_k_error(attrs)))
    return np.arange(value, dtype=np.int64)


register_data_dependent("topk_k", infer=_runtime_k_infer, bound=_runtime_k_bound,
                        kernel=_runtime_k_kernel, reference=_runtime_k_ref)


def _topk_dynamic_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x, ks = types
    (axis,) = norm_axes(int(attrs["axis"]), x.ndim)
    shape = list(x.shape)
    shape[axis] = ks.shape[0]
    return TupleType((TensorType(tuple(shape), x.dtype), TensorType(tuple(shape), I64)))


def _topk_dynamic_compute(inputs: Sequence[te.Tensor], attrs: Attrs
                          ) -> tuple[te.Tensor, te.Tensor]:
    x, ks = inputs
    return topk_compute([x], {**attrs, "k": ks.shape[0]})


def _topk_dynamic_ref(x: np.ndarray, ks: np.ndarray, **attrs: Any
                      ) -> tuple[np.ndarray, np.ndarray]:
    return topk_ref(x, **{**attrs, "k": ks.shape[0]})


register_op("topk_dynamic", pattern="opaque", infer=_topk_dynamic_infer,
            compute=_topk_dynamic_compute, reference=_topk_dynamic_ref)


__all__ = ["DataDependentOp", "bound_dim", "bound_text", "register_data_dependent",
           "runtime_dim"]


# --------------------------------------------------------------------------- unique


def _unique_axis(x: TensorType, attrs: Attrs) -> int | None:
    axis = attrs.get("axis")
    return None if axis is None else norm_axes(int(axis), x.ndim)[0]


def _unique_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    (x,) = types
    n = runtime_dim(str(attrs["dim"]))
    axis = _unique_axis(x, attrs)
    if axis is None:
        y, length = TensorType((n,), x.dtype), dim_product(x.shape)
    else:
        shape = list(x.shape)
        shape[axis] = n
        y, length = TensorType(tuple(shape), x.dtype), x.shape[axis]
    return TupleType((y, TensorType((n,), I64), TensorType((length,), I64),
                      TensorType((n,), I64)))


def _unique_bound(types: Sequence[TensorType], attrs: Attrs) -> Dim:
    x = types[0]
    axis = _unique_axis(x, attrs)
    return dim_product(x.shape) if axis is None else x.shape[axis]


def _unique_kernel(ins: Sequence[t.Buffer], outs: Sequence[t.Buffer], count: t.Buffer,
                   attrs: Attrs) -> t.Stmt:
    """Unique over slices `x[o, i, k]` (i along the axis; the flat case has one element per
    slice) as onnxruntime's std::map finds them: `rep[i]` is the first occurrence slice i
    counts for (`_unique_rep`), a slice with rep[i] == i is a unique one; its position
    counts the unique slices before it (in index order, or in value order when sorted)."""
    (x,), (y, indices, inverse, counts) = ins, outs
    axis = _unique_axis(TensorType(x.shape, x.dtype), attrs)
    flat, decl = _flat(x, "xf")
    outer, length, inner = ((1, flat.shape[0], 1) if axis is None else _split(x.shape, axis))
    rep = t.Buffer("rep", (simplify_dim(length),), I64, "global")
    state, c, pos, n = _counter("state"), _counter("c"), _counter("pos"), t.Var("n", I64)
    slices = _Slices(flat, state, outer, length, inner)

    def unique(j: t.PrimExpr) -> t.PrimExpr:
        return t.compare("eq", rep[j], j)

    def position(r: t.PrimExpr) -> t.Stmt:
        """pos := the output position of the unique slice r."""
        def before(m: t.Var) -> t.Stmt:
            if not attrs.get("sorted", 1):
                return _when(unique(m) & (m < r), _bump(pos))
            # value order (NaN above every number), ties by index: a permutation
            return _when(unique(m), slices.compare(m, r, total=True),
                         _when((state[0] < 0) | (t.compare("eq", state[0], _e(0)) & (m < r)),
                               _bump(pos)))
        return t.seq(_set(pos, 0), _loop("m", length, before))

    def emit(i: t.Var) -> t.Stmt:
        def copy(o: t.Var) -> t.Stmt:
            return _loop("k", inner, lambda k: t.Store(
                y, slices.at(i, o, k), ((o * n + pos[0]) * _e(inner) + k,)))

        def same(j: t.Var) -> t.Stmt:
            return _when(t.compare("eq", rep[j], i), _bump(c))
        write = _when(unique(i), _loop("o", outer, copy), t.Store(indices, i, (pos[0],)),
                      _set(c, 0), _loop("j", length, same), t.Store(counts, c[0], (pos[0],)))
        return t.seq(position(rep[i]), t.Store(inverse, pos[0], (i,)), write)

    return t.seq(decl, t.Allocate(rep), t.Allocate(state), t.Allocate(c), t.Allocate(pos),
                 _unique_rep(slices, rep, c), _set(pos, 0),
                 _loop("i", length, lambda i: _when(unique(i), _bump(pos))),
                 t.LetStmt(n, pos[0]), _loop("i", length, emit), t.Store(count, n, (_e(0),)))


@dataclass(frozen=True)
class _Slices:
    """The slices `flat[o, i, k]` of Unique's input and their comparisons into `state`."""

    flat: t.Buffer
    state: t.Buffer
    outer: Dim
    length: Dim
    inner: Dim

    def at(self, i: t.PrimExpr, o: t.PrimExpr, k: t.PrimExpr) -> t.PrimExpr:
        return self.flat[(o * _e(self.length) + i) * _e(self.inner) + k]

    def compare(self, a: t.PrimExpr, b: t.PrimExpr, total: bool = False) -> t.Stmt:
        """state := -1, 0 or 1 as slice a is below, equal to or above slice b,
        lexicographically: by `<` and `>` as onnxruntime's std::map compares (a NaN
        element equals everything), or, `total`, with NaN above every number."""
        state = self.state

        def one(o: t.Var, k: t.Var) -> t.Stmt:
            va, vb = self.at(a, o, k), self.at(b, o, k)
            less, more = ((nan_order.order_less(va, vb), nan_order.order_greater(va, vb))
                          if total else (va < vb, va > vb))
            return _when(t.compare("eq", state[0], _e(0)),
                         t.IfThenElse(less, _set(state, -1), _when(more, _set(state, 1))))
        return t.seq(_set(state, 0), _loop("o", self.outer, lambda o: _loop(
            "k", self.inner, lambda k: one(o, k))))


def _unique_rep(slices: _Slices, rep: t.Buffer, cand: t.Buffer) -> t.Stmt:
    """rep[i] for every slice i, as onnxruntime's `std::map::find` of slice i among the
    unique slices before it: the first of them in value order that slice i is not above
    (`lower_bound`), if slice i is not below it either; else i itself (a new unique
    slice). With a NaN, which `<` leaves unordered, this is what its tree does: a NaN
    (after a number first) counts for the smallest value seen so far, and everything
    after a leading NaN counts for it (exact for single elements; for longer slices
    holding NaN, onnxruntime's result depends on its tree's shape)."""
    state = slices.state

    def find(i: t.Var) -> t.Stmt:
        def candidate(j: t.Var) -> t.Stmt:
            smaller = t.seq(slices.compare(j, cand[0]),
                            _when(state[0] < 0, _set(cand, j)))
            take = t.IfThenElse(cand[0] < 0, _set(cand, j), smaller)
            return _when(t.compare("eq", rep[j], j), slices.compare(j, i),
                         _when(state[0] >= 0, take))
        found = t.seq(slices.compare(i, cand[0]),
                      t.IfThenElse(state[0] >= 0, t.Store(rep, cand[0], (i,)),
                                   t.Store(rep, i, (i,))))
        return t.seq(_set(cand, -1), _loop("j", i, candidate),
                     t.IfThenElse(cand[0] >= 0, found, t.Store(rep, i, (i,))))
    return _loop("i", slices.length, find)


def unique_ref(x: np.ndarray, **attrs: Any) -> tuple[np.ndarray, ...]:
    """Unique as the kernel computes it (onnxruntime's rules, `_unique_rep`)."""
    axis = attrs.get("axis")
    slices = x.reshape(-1, 1) if axis is None else \
        np.moveaxis(x, int(axis), 0).reshape(x.shape[int(axis)], -1)
    rep = _unique_rep_ref(slices)
    firsts = np.flatnonzero(rep == np.arange(rep.size))
    pos = np.zeros(rep.size, np.int64)
    if attrs.get("sorted", 1) and firsts.size:
        # value order, NaN last (numpy's sort), ties by index: lexsort is stable
        cols = slices[firsts].astype(np.float32) if slices.dtype.name == "bfloat16" \
            else slices[firsts]
        order = np.lexsort(cols.T[::-1]) if cols.shape[1] else np.arange(firsts.size)
        pos[firsts[order]] = np.arange(firsts.size)
    else:
        pos[firsts] = np.arange(firsts.size)
    out_firsts = np.empty(firsts.size, np.int64)
    out_firsts[pos[firsts]] = firsts
    counts = np.bincount(rep, minlength=rep.size)[out_firsts]
    vals = x.reshape(-1)[out_firsts] if axis is None else np.take(x, out_firsts, int(axis))
    return vals, out_firsts, pos[rep], counts.astype(np.int64)


def _unique_rep_ref(slices: np.ndarray) -> np.ndarray:
    """`_unique_rep` in numpy: vectorized without NaN (or for single elements), else the
    kernel's loop."""
    n = slices.shape[0]
    nan = np.isnan(slices) if _is_float_array(slices) else np.zeros(slices.shape, bool)
    if n == 0:
        return np.zeros(0, np.int64)
    if not nan.any():
        return _first_equal(slices)
    if slices.shape[1] == 1:
        v = slices[:, 0]
        if nan[0, 0]:  # every later value finds the leading NaN
            return np.zeros(n, np.int64)
        rep = _first_equal(slices)
        with np.errstate(invalid="ignore"):
            lowest = np.fmin.accumulate(v.astype(np.float64))  # the smallest number so far
        first_at = {float(v[j]): j for j in range(n - 1, -1, -1) if not nan[j, 0]}
        return np.where(nan[:, 0], [first_at.get(float(m), 0) for m in lowest], rep)
    return _unique_rep_loop(slices)


def _is_float_array(a: np.ndarray) -> bool:
    """True for float arrays (bfloat16 included), where NaN can occur."""
    return a.dtype.kind == "f" or a.dtype.name == "bfloat16"


def _first_equal(slices: np.ndarray) -> np.ndarray:
    """For each row, the first row equal to it (NaN-free rows; -0.0 equals 0.0)."""
    key = slices + 0 if _is_float_array(slices) else slices  # -0.0 + 0 is 0.0
    _, first, inv = np.unique(key, axis=0, return_index=True, return_inverse=True)
    return first[inv.reshape(-1)].astype(np.int64)


def _unique_rep_loop(slices: np.ndarray) -> np.ndarray:
    def cmp(a: int, b: int) -> int:
        for va, vb in zip(slices[a], slices[b]):
            if va < vb:
                return -1
            if va > vb:
                return 1
        return 0

    rep = np.zeros(slices.shape[0], np.int64)
    firsts: list[int] = []
    for i in range(slices.shape[0]):
        cand = -1
        for j in firsts:
            if cmp(j, i) >= 0 and (cand < 0 or cmp(j, cand) < 0):
                cand = j
        rep[i] = cand if cand >= 0 and cmp(i, cand) >= 0 else i
        if rep[i] == i:
            firsts.append(i)
    return rep


register_data_dependent("unique", infer=_unique_infer, bound=_unique_bound,
                        kernel=_unique_kernel, reference=unique_ref)


# --------------------------------------------------------------------------- NMS


def _nms_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    boxes, scores = types[0], types[1]
    if boxes.ndim != 3 or scores.ndim != 3 or boxes.shape[2] != 4:
        raise IRError(f"non_max_suppression: boxes must be [batch, boxes, 4] and scores "
                      f"[batch, classes, boxes], got {boxes} and {scores}")
    return TensorType((runtime_dim(str(attrs["dim"])), 3), I64)


def _nms_bound(types: Sequence[TensorType], attrs: Attrs) -> Dim:
    boxes, scores = types[0], types[1]
    return dim_product((scores.shape[0], scores.shape[1], boxes.shape[1]))


def _nms_kernel(ins: Sequence[t.Buffer], outs: Sequence[t.Buffer], count: t.Buffer,
                attrs: Attrs) -> t.Stmt:
    """Per batch and class: candidates in descending score (ties by index, NaN last) above
    the score threshold, each kept unless its IoU with a box kept before exceeds the
    threshold, at most max_output_boxes_per_class (onnxruntime's rules)."""
    boxes, scores, max_out, iou_thr, score_thr = ins
    (out,) = outs
    nb, nc, nn = scores.shape
    center = bool(attrs.get("center_point_box", 0))
    thresholded = bool(attrs.get("has_score_threshold", False))
    (fmax, dmax), (fiou, diou), (fscore, dscore) = (
        _flat(max_out, "mf"), _flat(iou_thr, "if"), _flat(score_thr, "sf"))
    taken = t.Buffer("taken", (nn,), I64, "global")
    pos, kept, ok, start = _counter("pos"), _counter("kept"), _counter("ok"), _counter("start")
    best = _counter("best")
    limit = t.Var("limit", I64)
    f32 = boxes.dtype

    def corners(b: t.Var, i: t.PrimExpr) -> tuple[t.PrimExpr, ...]:
        """(ymin, xmin, ymax, xmax) of box i."""
        v = [boxes[b, i, q] for q in range(4)]
        if center:  # [x_center, y_center, width, height]
            half_w, half_h = v[2] / t.const(2.0, f32), v[3] / t.const(2.0, f32)
            return v[1] - half_h, v[0] - half_w, v[1] + half_h, v[0] + half_w
        return (t.min_(v[0], v[2]), t.min_(v[1], v[3]), t.max_(v[0], v[2]),
                t.max_(v[1], v[3]))

    def suppressed(b: t.Var, i: t.PrimExpr, j: t.PrimExpr) -> t.PrimExpr:
        ay0, ax0, ay1, ax1 = corners(b, i)
        by0, bx0, by1, bx1 = corners(b, j)
        zero = t.const(0.0, f32)
        area_a, area_b = (ay1 - ay0) * (ax1 - ax0), (by1 - by0) * (bx1 - bx0)
        inter = (t.max_(zero, t.min_(ay1, by1) - t.max_(ay0, by0))
                 * t.max_(zero, t.min_(ax1, bx1) - t.max_(ax0, bx0)))
        union = area_a + area_b - inter
        positive = (area_a > zero) & (area_b > zero) & (inter > zero) & (union > zero)
        iou = inter / t.select(positive, union, t.const(1.0, f32))
        return positive & (iou > fiou[0])

    def per_class(b: t.Var, cl: t.Var) -> t.Stmt:
        """Take the best candidate left (highest score, lowest index on ties) until
        `limit` boxes are kept or none is left: O(boxes) per candidate examined."""
        def exclude(i: t.Var) -> t.Stmt:  # taken[i] != 0: taken, or not above the threshold
            low = ~(scores[b, cl, i] > fscore[0]) if thresholded else t.const(False, "bool")
            return t.Store(taken, t.select(low, _e(1), _e(0)), (i,))

        def scan(i: t.Var) -> t.Stmt:
            best_score = scores[b, cl, t.max_(best[0], _e(0))]
            # a NaN score ranks below every number (onnxruntime's heap has no order for it)
            better = (best[0] < 0) | nan_order.order_greater(scores[b, cl, i], best_score,
                                                              nan_order.NanPlace.LOW)
            return _when(t.compare("eq", taken[i], _e(0)) & better, _set(best, i))

        def candidate(r: t.Var) -> t.Stmt:
            i = best[0]

            def against(q: t.Var) -> t.Stmt:
                j = out[(start[0] + q) * 3 + 2]
                return _when(suppressed(b, i, j), _set(ok, 0))
            row = pos[0] * 3
            keep = _when(t.compare("ne", ok[0], _e(0)),
                         t.Store(out, b, (row,)), t.Store(out, cl, (row + 1,)),
                         t.Store(out, i, (row + 2,)), _bump(pos), _bump(kept))
            return _when(kept[0] < limit, _set(best, -1), _loop("i", nn, scan),
                         _when(best[0] >= 0, t.Store(taken, _e(1), (i,)), _set(ok, 1),
                               _loop("q", kept[0], against), keep))
        return t.seq(_loop("i", nn, exclude), _set(kept, 0), _set(start, pos[0]),
                     _loop("r", nn, candidate))

    body = _loop("b", nb, lambda b: _loop("c", nc, lambda cl: per_class(b, cl)))
    return t.seq(dmax, diou, dscore, t.Allocate(taken), t.Allocate(pos),
                 t.Allocate(kept), t.Allocate(ok), t.Allocate(start), t.Allocate(best),
                 t.LetStmt(limit, t.max_(_e(0), t.min_(fmax[0], _e(nn)))),
                 _set(pos, 0), body, t.Store(count, pos[0], (_e(0),)))


def nms_ref(boxes: np.ndarray, scores: np.ndarray, max_out: np.ndarray, iou_thr: np.ndarray,
            score_thr: np.ndarray, **attrs: Any) -> np.ndarray:
    """NonMaxSuppression's result as the kernel computes it: the selected
    [batch, class, box] index rows."""
    center = bool(attrs.get("center_point_box", 0))
    limit = max(0, min(int(max_out.reshape(-1)[0]), boxes.shape[1]))
    iou_t = np.float32(iou_thr.reshape(-1)[0])
    rows: list[tuple[int, int, int]] = []

    def corners(b: int, i: int) -> tuple[np.float32, ...]:
        v = boxes[b, i].astype(np.float32)
        if center:
            hw, hh = v[2] / np.float32(2), v[3] / np.float32(2)
            return v[1] - hh, v[0] - hw, v[1] + hh, v[0] + hw
        return min(v[0], v[2]), min(v[1], v[3]), max(v[0], v[2]), max(v[1], v[3])

    def suppressed(b: int, i: int, j: int) -> bool:
        ay0, ax0, ay1, ax1 = corners(b, i)
        by0, bx0, by1, bx1 = corners(b, j)
        area_a, area_b = (ay1 - ay0) * (ax1 - ax0), (by1 - by0) * (bx1 - bx0)
        inter = (max(np.float32(0), min(ay1, by1) - max(ay0, by0))
                 * max(np.float32(0), min(ax1, bx1) - max(ax0, bx0)))
        union = area_a + area_b - inter
        if area_a <= 0 or area_b <= 0 or inter <= 0 or union <= 0:
            return False
        return bool(inter / union > iou_t)

    for b in range(scores.shape[0]):
        for cl in range(scores.shape[1]):
            s = scores[b, cl]
            kept: list[int] = []
            for i in nan_order.order_argsort_ref(s, 0, True, nan_order.NanPlace.LOW):
                if len(kept) >= limit:
                    break
                if attrs.get("has_score_threshold") and not s[i] > score_thr.reshape(-1)[0]:
                    continue
                if not any(suppressed(b, i, j) for j in kept):
                    kept.append(i)
            rows.extend((b, cl, i) for i in kept)
    return np.array(rows, np.int64).reshape(-1, 3)


register_data_dependent("non_max_suppression", infer=_nms_infer, bound=_nms_bound,
                        kernel=_nms_kernel, reference=nms_ref)

"""A small tensor-expression language for defining operators (in the spirit of TVM's TE).

An operator's computation is written as index lambdas over `Tensor`s:

    def relu(x: Tensor) -> Tensor:
        return compute(x.shape, lambda *i: max_(x[i], const(0.0, x.dtype)), x.dtype, "relu")

`lower(inputs, outputs, name)` turns such a definition into a tensor-level
`PrimFunc` with one buffer parameter per input and per output. Accessing a
`compute` tensor inlines its lambda (that is how elementwise chains fuse into
their producer); a tensor created with `materialize=True` is computed once into
a temporary buffer. `reduce(...)` inside a lambda emits an accumulator loop at
the point of use and evaluates to the accumulated value.

A computed tensor may carry `checks`: conditions on data (e.g. every index
read from an input is in range) that the kernel verifies in a serial loop nest
before the tensor is first computed, failing with the check's error code
(kiln.ir.kernel_errors) through the `check` intrinsic.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.shape_expr import dim_vars, simplify_dim
from kiln.ir.tensor import (
    CHECK_INTRINSIC,
    Allocate,
    AllocConst,
    Buffer,
    Const,
    Evaluate,
    ExprLike,
    For,
    Intrin,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    Var,
    as_expr,
    max_,
    min_,
    select,
    seq,
)
from kiln.ops import nan_order

FCompute = Callable[..., PrimExpr]


@dataclass(frozen=True)
class Check:
    """`fcond(*i)` must hold for every `i` in `shape`, else the kernel fails with `code`."""

    shape: tuple[int, ...]
    fcond: FCompute
    code: int


@dataclass(eq=False)
class Tensor:
    """A tensor value inside an operator definition: an input or a computed tensor."""

    shape: tuple[int, ...]
    dtype: str
    name: str
    fcompute: FCompute | None = None     # None: a placeholder (an input) or a constant
    materialize: bool = False
    data: np.ndarray | None = None       # a constant table (see `const_tensor`)
    checks: tuple[Check, ...] = ()       # verified before the tensor is computed

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, idx: ExprLike | Sequence[ExprLike]) -> PrimExpr:
        items = tuple(idx) if isinstance(idx, (tuple, list)) else (idx,)
        if len(items) != len(self.shape):
            raise IRError(f"tensor {self.name} has {len(self.shape)} dims, indexed with "
                          f"{len(items)}")
        indices = tuple(as_expr(i, INDEX_DTYPE) for i in items)
        return _context().access(self, indices)


def dims(shape: Sequence[int | PrimExpr]) -> tuple[int, ...]:
    """`shape` with canonical dimensions: ints, or int64 expressions over dimension
    variables (kiln.ir.shape_expr) for a symbolic shape. Typed as ints so the static
    shape arithmetic of operator definitions type-checks; a symbolic dimension is a
    PrimExpr, which supports the same arithmetic and lowers to a loop extent."""
    return tuple(cast(int, simplify_dim(d if isinstance(d, PrimExpr) else int(d)))
                 for d in shape)


def placeholder(shape: Sequence[int | PrimExpr], dtype: str, name: str = "x") -> Tensor:
    """An operator input (its dims may be symbolic, see `dims`)."""
    dt.check_dtype(dtype)
    return Tensor(dims(shape), dtype, name)


def compute(shape: Sequence[int | PrimExpr], fcompute: FCompute, dtype: str,
            name: str = "t", *, materialize: bool = False, checks: Sequence[Check] = ()) -> Tensor:
    """A tensor whose element at `i` is `fcompute(*i)`, computed after `checks` passed."""
    dt.check_dtype(dtype)
    return Tensor(dims(shape), dtype, name, fcompute, materialize,
                  checks=tuple(checks))


def const_tensor(data: np.ndarray, name: str = "table") -> Tensor:
    """A constant tensor baked into the lowered function (read-only data).

    For lookup tables computed at lowering time (e.g. resize coordinates and
    weights), so the kernel and the numpy reference share one computation.
    """
    arr = np.asarray(data)
    return Tensor(tuple(int(d) for d in arr.shape), dt.from_numpy(arr.dtype), name, data=arr)


@dataclass(frozen=True)
class _Reducer:
    combine: Callable[[PrimExpr, PrimExpr], PrimExpr]
    init: Callable[[str], PrimExpr]


def lowest_value(dtype: str) -> PrimExpr:
    """The smallest value of `dtype` (-inf for floats): the neutral element of max."""
    if dt.is_float(dtype):
        return Const(float("-inf"), dtype)
    if dt.is_bool(dtype):
        return Const(False, dtype)
    bits = dt.bits(dtype)
    return Const(-(1 << (bits - 1)) if dt.is_signed(dtype) else 0, dtype)


def highest_value(dtype: str) -> PrimExpr:
    """The largest value of `dtype` (+inf for floats): the neutral element of min."""
    if dt.is_float(dtype):
        return Const(float("inf"), dtype)
    if dt.is_bool(dtype):
        return Const(True, dtype)
    bits = dt.bits(dtype)
    return Const((1 << (bits - 1)) - 1 if dt.is_signed(dtype) else (1 << bits) - 1, dtype)


REDUCERS: dict[str, _Reducer] = {
    "sum": _Reducer(lambda a, b: a + b, lambda d: Const(0, d)),
    "prod": _Reducer(lambda a, b: a * b, lambda d: Const(1, d)),
    "max": _Reducer(max_, lowest_value),
    "min": _Reducer(min_, highest_value),
    # onnxruntime's scan (kiln.ops.nan_order): a NaN never replaces the running extreme
    "scan_max": _Reducer(nan_order.max_keep_first, lowest_value),
    "scan_min": _Reducer(nan_order.min_keep_first, highest_value),
}


def reduce(kind: str, body: FCompute, extents: Sequence[int | PrimExpr], dtype: str,
           init: ExprLike | None = None) -> PrimExpr:
    """Reduce `body(*k)` over `k` in `extents` with `kind` (sum, prod, max, min; scan_max
    and scan_min skip NaN values, kiln.ops.nan_order.max_keep_first).

    Only valid inside a compute lambda while lowering: it emits the accumulator
    loop right before the statement that uses the result.
    """
    if kind not in REDUCERS:
        raise IRError(f"unknown reduction {kind!r}; known: {', '.join(REDUCERS)}")
    return _context().reduce(REDUCERS[kind], body, dims(extents), dtype, init)


def flat_index(idx: Sequence[PrimExpr], shape: Sequence[int]) -> PrimExpr:
    """The row-major position of index `idx` in a tensor of `shape`."""
    flat: PrimExpr = as_expr(0)
    for i, d in zip(idx, shape):
        flat = flat * d + i
    return flat


def unflatten_index(flat: PrimExpr, shape: Sequence[int | PrimExpr]) -> tuple[PrimExpr, ...]:
    """The index of row-major position `flat` in a tensor of `shape` (`flat_index` undone)."""
    out: list[PrimExpr] = []
    for d in reversed(shape):
        out.append(as_expr(0) if isinstance(d, int) and d == 1 else flat % d)
        flat = flat // d
    return tuple(reversed(out))


def clamp_index(i: PrimExpr, extent: int | PrimExpr) -> PrimExpr:
    """`i` clamped into [0, extent): keeps a not-taken Select branch in bounds."""
    return min_(max_(i, 0), extent - 1)


def padded(t: Tensor, idx: Sequence[PrimExpr], pad_value: ExprLike) -> PrimExpr:
    """`t[idx]` where every index is in range, else `pad_value` (reads stay in bounds)."""
    if any(isinstance(d, int) and d == 0 for d in t.shape):
        # nothing to read: a clamped index would be -1, a read before t
        return as_expr(pad_value, t.dtype)
    conds: PrimExpr | None = None
    safe: list[PrimExpr] = []
    for i, extent in zip(idx, t.shape):
        inside = (i >= 0) & (i < extent)
        conds = inside if conds is None else conds & inside
        safe.append(clamp_index(i, extent))
    value = t[tuple(safe)]
    if conds is None:
        return value
    return select(conds, value, as_expr(pad_value, t.dtype))


# --------------------------------------------------------------------------- lowering

_CTX: contextvars.ContextVar[_Lowering | None] = contextvars.ContextVar("kiln_te", default=None)


def _context() -> _Lowering:
    ctx = _CTX.get()
    if ctx is None:
        raise IRError("tensor expressions can only be evaluated while lowering (te.lower)")
    return ctx


class _Block:
    def __init__(self) -> None:
        self.stmts: list[Stmt] = []
        self.allocs: list[Buffer] = []

    def close(self) -> Stmt:
        # Declarations first: each is in scope for the rest of the block.
        return seq(*(Allocate(buf) for buf in self.allocs), *self.stmts)


class _Lowering:
    def __init__(self, buffers: dict[Tensor, Buffer]) -> None:
        self.buffers = buffers
        self.blocks: list[_Block] = [_Block()]
        self.counter = 0
        self.constants: list[tuple[Buffer, np.ndarray]] = []
        self.checked: set[Tensor] = set()

    def access(self, t: Tensor, idx: tuple[PrimExpr, ...]) -> PrimExpr:
        buf = self.buffers.get(t)
        if buf is not None:
            return buf[idx]
        if t.data is not None:
            return self.constant(t)[idx]
        if t.fcompute is None:
            raise IRError(f"input tensor {t.name} is not an input of this operator")
        if t.checks and t not in self.checked:
            self.in_outer_block(lambda: self.emit_checks(t))
        if t.materialize:
            return self.materialize(t)[idx]
        return as_expr(t.fcompute(*idx), t.dtype)

    def constant(self, t: Tensor) -> Buffer:
        """The read-only buffer of constant tensor `t` (bound around the whole body)."""
        assert t.data is not None
        self.counter += 1
        buf = Buffer(f"{t.name}_{self.counter}", t.shape, t.dtype)
        self.buffers[t] = buf
        self.constants.append((buf, t.data))
        return buf

    def materialize(self, t: Tensor) -> Buffer:
        """Compute `t` once into a temporary, before the statement being built."""
        self.counter += 1
        buf = Buffer(f"{t.name}_{self.counter}", t.shape, t.dtype)
        self.buffers[t] = buf
        self.blocks[0].allocs.append(buf)
        self.in_outer_block(lambda: self.store_all(t, buf))
        return buf

    def in_outer_block(self, emit: Callable[[], None]) -> None:
        """Run `emit` with statements going before the statement being built."""
        saved, self.blocks = self.blocks, [self.blocks[0]]
        try:
            emit()
        finally:
            self.blocks = saved

    def emit_checks(self, t: Tensor) -> None:
        """The serial loop nests verifying `t.checks` (once per tensor)."""
        self.checked.add(t)
        for check in t.checks:
            def body(i: tuple[Var, ...], check: Check = check) -> None:
                ok = as_expr(check.fcond(*i), "bool")
                self.emit(Evaluate(Intrin(CHECK_INTRINSIC, (ok, Const(check.code, "int32")))))

            if check.shape == ():
                body(())
            else:
                self.loop_nest(check.shape, "c", body)

    def emit(self, stmt: Stmt) -> None:
        self.blocks[-1].stmts.append(stmt)

    def loop_nest(self, shape: tuple[int, ...], name: str,
                  body: Callable[[tuple[Var, ...]], None]) -> None:
        """Emit `for i0.. in shape: body(i)` (body emits into the innermost block)."""
        loop_vars = tuple(Var(f"{name}{k}" if len(shape) > 1 else name, INDEX_DTYPE)
                          for k in range(len(shape)))
        self.blocks.append(_Block())
        body(loop_vars)
        stmt = self.blocks.pop().close()
        for v, extent in reversed(list(zip(loop_vars, shape))):
            stmt = For(v, Const(0, INDEX_DTYPE), as_expr(extent, INDEX_DTYPE), "serial", stmt)
        self.emit(stmt)

    def reduce(self, reducer: _Reducer, body: FCompute, extents: tuple[int, ...], dtype: str,
               init: ExprLike | None) -> PrimExpr:
        self.counter += 1
        acc = Buffer(f"acc{self.counter}", (1,), dtype, "local")
        self.blocks[-1].allocs.append(acc)
        start = reducer.init(dtype) if init is None else as_expr(init, dtype)
        self.emit(Store(acc, start, (Const(0, INDEX_DTYPE),)))

        def step(k: tuple[Var, ...]) -> None:
            value = as_expr(body(*k), dtype)
            self.emit(Store(acc, reducer.combine(acc[0], value), (Const(0, INDEX_DTYPE),)))

        self.loop_nest(extents, "k", step)
        return acc[0]

    def store_all(self, t: Tensor, buf: Buffer) -> None:
        assert t.fcompute is not None
        if t.checks and t not in self.checked:
            self.emit_checks(t)

        def body(i: tuple[Var, ...]) -> None:
            value = as_expr(t.fcompute(*i), t.dtype)  # type: ignore[misc]
            self.emit(Store(buf, value, i))

        if t.shape == ():
            body(())
        else:
            self.loop_nest(t.shape, "i", body)


def lower(inputs: Sequence[Tensor], outputs: Sequence[Tensor], name: str = "kernel",
          attrs: dict[str, Any] | None = None) -> PrimFunc:
    """Lower a tensor-expression definition to a PrimFunc(inputs..., outputs...)."""
    buffers: dict[Tensor, Buffer] = {}
    params: list[Buffer] = []
    for t in inputs:
        if t.fcompute is not None or t.data is not None:
            raise IRError(f"operator input {t.name} must be a placeholder")
        buffers[t] = Buffer(t.name, t.shape, t.dtype)
        params.append(buffers[t])
    out_bufs: list[Buffer] = []
    for k, t in enumerate(outputs):
        buf = Buffer(f"out{k}" if len(outputs) > 1 else "out", t.shape, t.dtype)
        out_bufs.append(buf)
    ctx = _Lowering(buffers)
    token = _CTX.set(ctx)
    try:
        for t, buf in zip(outputs, out_bufs):
            if t.fcompute is None and t in buffers:
                # the output is an input: copy it
                ctx.loop_nest(t.shape, "i", _copy_body(ctx, buffers[t], buf))
            elif t.fcompute is None:
                ctx.store_all(compute(t.shape, lambda *i, src=t: src[i], t.dtype, t.name), buf)
            else:
                ctx.store_all(t, buf)
        body = seq(*(AllocConst(cbuf, data) for cbuf, data in ctx.constants),
                   ctx.blocks[0].close())
    finally:
        _CTX.reset(token)
    return with_dim_params(PrimFunc(tuple(params + out_bufs), body, attrs or {}))


def with_dim_params(prim: PrimFunc) -> PrimFunc:
    """`prim` taking, after its parameters, one int64 scalar per dimension variable of its
    buffer parameters' shapes (sorted by name) that it does not take yet: the calling
    convention of kernels with symbolic shapes (docs/ir.md, "Kernels with symbolic
    shapes"). Unchanged when static."""
    taken = {id(p) for p in prim.params}
    extra = [v for v in dim_vars(d for b in prim.buffer_params for d in b.shape)
             if id(v) not in taken]
    if not extra:
        return prim
    return PrimFunc((*prim.params, *extra), prim.body, dict(prim.attrs))


def inline_expr(t: Tensor, idx: Sequence[ExprLike], buffers: dict[Tensor, Buffer]) -> PrimExpr:
    """`t[idx]` as one expression, reading the tensors in `buffers` from those buffers.

    For kernels built by hand that apply an elementwise chain as they store
    (kiln.ops.conv_direct). IRError if `t` needs statements: a reduction, a
    materialized or constant tensor, or checks.
    """
    ctx = _Lowering(dict(buffers))
    token = _CTX.set(ctx)
    try:
        value = as_expr(t[tuple(idx)], t.dtype)
    finally:
        _CTX.reset(token)
    if ctx.blocks[0].stmts or ctx.blocks[0].allocs or ctx.constants:
        raise IRError(f"tensor {t.name} needs statements; it cannot be inlined into a store")
    return value


def _copy_body(ctx: _Lowering, src: Buffer, dst: Buffer) -> Callable[[tuple[Var, ...]], None]:
    def body(i: tuple[Var, ...]) -> None:
        ctx.emit(Store(dst, src[i], i))
    return body

"""Tensor-level IR: loops over buffers (kiln's TIR).

Expressions (`PrimExpr`) and statements (`Stmt`) are frozen nodes compared by
identity; `kiln.ir.structural_equal` compares them by structure. Python operators
build expressions (`X[i] + 1`, `i * 4`, `a < b`); `==`/`!=` keep identity
semantics so nodes stay usable as dict keys: use `a.eq(b)` / `a.ne(b)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Union

import numpy as np

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir.dtype import INDEX_DTYPE, check_dtype

# --------------------------------------------------------------------------- expressions

ExprLike = Union["PrimExpr", int, float, bool]


class PrimExpr:
    """Base of scalar expressions. Every expression has a `dtype`."""

    __slots__ = ()
    dtype: str

    # Arithmetic; Python scalars adopt the other operand's dtype.
    def __add__(self, o: ExprLike) -> PrimExpr: return binary("add", self, o)
    def __radd__(self, o: ExprLike) -> PrimExpr: return binary("add", o, self)
    def __sub__(self, o: ExprLike) -> PrimExpr: return binary("sub", self, o)
    def __rsub__(self, o: ExprLike) -> PrimExpr: return binary("sub", o, self)
    def __mul__(self, o: ExprLike) -> PrimExpr: return binary("mul", self, o)
    def __rmul__(self, o: ExprLike) -> PrimExpr: return binary("mul", o, self)
    def __truediv__(self, o: ExprLike) -> PrimExpr: return binary("div", self, o)
    def __rtruediv__(self, o: ExprLike) -> PrimExpr: return binary("div", o, self)
    def __floordiv__(self, o: ExprLike) -> PrimExpr: return binary("floordiv", self, o)
    def __rfloordiv__(self, o: ExprLike) -> PrimExpr: return binary("floordiv", o, self)
    def __mod__(self, o: ExprLike) -> PrimExpr: return binary("floormod", self, o)
    def __rmod__(self, o: ExprLike) -> PrimExpr: return binary("floormod", o, self)
    def __and__(self, o: ExprLike) -> PrimExpr: return binary("and", self, o)
    def __rand__(self, o: ExprLike) -> PrimExpr: return binary("and", o, self)
    def __or__(self, o: ExprLike) -> PrimExpr: return binary("or", self, o)
    def __ror__(self, o: ExprLike) -> PrimExpr: return binary("or", o, self)
    def __xor__(self, o: ExprLike) -> PrimExpr: return binary("xor", self, o)
    def __lshift__(self, o: ExprLike) -> PrimExpr: return binary("shl", self, o)
    def __rshift__(self, o: ExprLike) -> PrimExpr: return binary("shr", self, o)
    def __neg__(self) -> PrimExpr: return UnaryOp("neg", self)
    def __invert__(self) -> PrimExpr: return UnaryOp("not", self)
    def __lt__(self, o: ExprLike) -> PrimExpr: return compare("lt", self, o)
    def __le__(self, o: ExprLike) -> PrimExpr: return compare("le", self, o)
    def __gt__(self, o: ExprLike) -> PrimExpr: return compare("gt", self, o)
    def __ge__(self, o: ExprLike) -> PrimExpr: return compare("ge", self, o)

    def eq(self, o: ExprLike) -> PrimExpr:
        return compare("eq", self, o)

    def ne(self, o: ExprLike) -> PrimExpr:
        return compare("ne", self, o)

    def astype(self, dtype: str) -> PrimExpr:
        return self if self.dtype == dtype else Cast(dtype, self)

    def __bool__(self) -> bool:
        raise IRError(
            "a kiln PrimExpr has no truth value; use kiln IR control flow "
            "(IfThenElse / Select) instead of Python `if`/`and`/`or`"
        )

    __hash__ = object.__hash__


@dataclass(frozen=True, eq=False, slots=True)
class Var(PrimExpr):
    """A scalar variable: loop index, let binding or scalar parameter. `name` is a hint."""

    name: str
    dtype: str = INDEX_DTYPE

    def __post_init__(self) -> None:
        check_dtype(self.dtype)


@dataclass(frozen=True, eq=False, slots=True)
class Const(PrimExpr):
    """A scalar literal."""

    value: int | float | bool
    dtype: str

    def __post_init__(self) -> None:
        check_dtype(self.dtype)
        if dt.is_float(self.dtype):
            object.__setattr__(self, "value", float(self.value))
        elif dt.is_bool(self.dtype):
            object.__setattr__(self, "value", bool(self.value))
        else:
            if isinstance(self.value, float) and not self.value.is_integer():
                raise IRError(f"Const({self.value!r}) cannot have integer dtype {self.dtype}")
            object.__setattr__(self, "value", int(self.value))


# Binary arithmetic/bitwise ops. `div` is true division on floats and truncating
# (C) division on integers; `mod` is C remainder; `floordiv`/`floormod` round down.
BINARY_OPS = (
    "add", "sub", "mul", "div", "floordiv", "floormod", "mod", "min", "max", "pow",
    "and", "or", "xor", "shl", "shr",
)
COMPARE_OPS = ("eq", "ne", "lt", "le", "gt", "ge")
UNARY_OPS = ("neg", "not")


@dataclass(frozen=True, eq=False, slots=True)
class BinaryOp(PrimExpr):
    """`a <op> b`; both operands have the same dtype, which is the result's."""

    op: str
    a: PrimExpr
    b: PrimExpr

    def __post_init__(self) -> None:
        if self.op not in BINARY_OPS:
            raise IRError(f"unknown binary op {self.op!r}; known: {', '.join(BINARY_OPS)}")

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return _result_dtype(self)


@dataclass(frozen=True, eq=False, slots=True)
class Compare(PrimExpr):
    """`a <op> b` giving bool."""

    op: str
    a: PrimExpr
    b: PrimExpr

    def __post_init__(self) -> None:
        if self.op not in COMPARE_OPS:
            raise IRError(f"unknown comparison {self.op!r}; known: {', '.join(COMPARE_OPS)}")

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return "bool"


@dataclass(frozen=True, eq=False, slots=True)
class UnaryOp(PrimExpr):
    """`-a` (neg) or logical/bitwise not."""

    op: str
    a: PrimExpr

    def __post_init__(self) -> None:
        if self.op not in UNARY_OPS:
            raise IRError(f"unknown unary op {self.op!r}; known: {', '.join(UNARY_OPS)}")

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return _result_dtype(self)


@dataclass(frozen=True, eq=False, slots=True)
class Select(PrimExpr):
    """`cond ? true_value : false_value` (both sides may be evaluated)."""

    cond: PrimExpr
    true_value: PrimExpr
    false_value: PrimExpr

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return _result_dtype(self)


@dataclass(frozen=True, eq=False, slots=True)
class Cast(PrimExpr):
    """Convert `value` to `dtype` (C conversion rules; float->int truncates)."""

    dtype: str
    value: PrimExpr

    def __post_init__(self) -> None:
        check_dtype(self.dtype)


@dataclass(frozen=True, eq=False, slots=True)
class Reinterpret(PrimExpr):
    """The bits of `value` read as `dtype`, which has the same width (a bit cast:
    float32 <-> int32/uint32, float64 <-> int64/uint64, integers of equal width).
    Build it with `reinterpret`, which checks the widths; the verifier checks them too."""

    dtype: str
    value: PrimExpr

    def __post_init__(self) -> None:
        check_dtype(self.dtype)


def reinterpret_fault(src: str, dst: str) -> str | None:
    """Why the bits of a `src` value cannot be read as `dst`, or None when they can."""
    for d in (src, dst):
        if dt.is_bool(d) or d in _HALF_FLOATS:
            return (f"{d} values cannot be reinterpreted (bool has no bit layout; "
                    "float16/bfloat16 compute in float32): use a Cast")
    if dt.bits(src) != dt.bits(dst):
        return (f"cannot reinterpret {src} ({dt.bits(src)} bits) as {dst} "
                f"({dt.bits(dst)} bits): the widths must be equal")
    return None


_HALF_FLOATS = frozenset({"float16", "bfloat16"})


def reinterpret(value: PrimExpr, dtype: str) -> PrimExpr:
    """The bits of `value` read as `dtype` (a Reinterpret; `value` itself when the
    dtypes are equal). Raises IRError unless the two dtypes have the same width."""
    fault = reinterpret_fault(value.dtype, check_dtype(dtype))
    if fault is not None:
        raise IRError(fault)
    return value if value.dtype == dtype else Reinterpret(dtype, value)


@dataclass(frozen=True, eq=False, slots=True)
class Load(PrimExpr):
    """`buffer[indices]`, one index per buffer dimension."""

    buffer: Buffer
    indices: tuple[PrimExpr, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "indices", tuple(self.indices))

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return self.buffer.dtype


# `Evaluate(Intrin("check", (cond, code)))`: the kernel fails with error `code`
# (an int32 Const of kiln.ir.kernel_errors) when the bool `cond` is false; the one
# intrinsic with an effect, valid only as the value of an Evaluate (docs/ir.md).
CHECK_INTRINSIC = "check"
# `Evaluate(Intrin("prefetch", (Load(buf, idx),)))`: a hint that `buf[idx]` (an
# element in bounds, as for any load) is read soon, so the backends ask the CPU to
# bring its cache line in; it reads nothing and changes no result. Valid only as the
# value of an Evaluate, outside vector loops (docs/ir.md, "Prefetches").
PREFETCH_INTRINSIC = "prefetch"
# Kernel-call timers (kiln.transform.profile): `profile_start(site)` reads a monotonic
# clock in nanoseconds, `profile_stop(site, start)` adds the time since `start` and one
# call to the counters of `site`. Both take and give int64; they have an effect, so no
# pass may drop or move them (docs/ir.md, "Profiling").
PROFILE_START = "profile_start"
PROFILE_STOP = "profile_stop"
PROFILE_INTRINSICS = frozenset({PROFILE_START, PROFILE_STOP})
# `Evaluate(Intrin("terminate_check", (Load(flag, idx),)))`: the kernel fails with
# kiln.ir.kernel_errors.ERROR_TERMINATED when the int32 element `flag[idx]` is non-zero.
# The element is read anew (a volatile load) every time: another thread sets it while
# the kernel runs (kiln.transform.terminate). Valid only as the value of an Evaluate.
TERMINATE_CHECK = "terminate_check"
# Math intrinsics: name -> number of arguments. Result dtype is the first argument's.
INTRINSICS: dict[str, int] = {
    "exp": 1, "exp2": 1, "expm1": 1, "log": 1, "log2": 1, "log1p": 1, "sqrt": 1, "rsqrt": 1,
    "sin": 1, "cos": 1, "tan": 1, "tanh": 1, "sinh": 1, "cosh": 1, "asin": 1, "acos": 1,
    "atan": 1, "asinh": 1, "acosh": 1, "atanh": 1, "erf": 1, "sigmoid": 1, "abs": 1,
    "floor": 1, "ceil": 1, "round": 1, "trunc": 1, "isnan": 1, "isinf": 1,
    "pow": 2, "atan2": 2, "fmod": 2,
    # fma(a, b, c) = a * b + c rounded once (IEEE fusedMultiplyAdd), floats only
    "fma": 3,
    # dot4_u8s8(acc, a, b): the integer dot product of DOT4_U8S8 below
    "dot4_u8s8": 3,
    # dot4_u8s8_sat16(acc, a, b): the same with int16-saturated pair sums (DOT4_U8S8_SAT16)
    "dot4_u8s8_sat16": 3,
    # dot2_i16(acc, a, b): two int16 products per word (DOT2_I16)
    "dot2_i16": 3,
    # dot2_bf16(acc, a, b): two bfloat16 products per word summed into float32 (DOT2_BF16)
    "dot2_bf16": 3,
    # bf16_pair(lo, hi): two float32 values rounded to bfloat16 in one int32 word (BF16_PAIR)
    "bf16_pair": 2,
    CHECK_INTRINSIC: 2,
    PREFETCH_INTRINSIC: 1,
    PROFILE_START: 1, PROFILE_STOP: 2,
    TERMINATE_CHECK: 1,
}
# `dot4_u8s8(acc, a, b)`, all int32: `acc + sum(u8(a >> 8i) * s8(b >> 8i) for i < 4)`
# with int32 wraparound: the four bytes of `a` unsigned, those of `b` signed (byte 0
# the least significant). One lane of x86 `vpdpbusd`; in a `vectorized` loop the
# llvm backend emits the target's dot-product instructions (docs/quantization.md).
DOT4_U8S8 = "dot4_u8s8"
# `dot4_u8s8_sat16(acc, a, b)`: `acc + sat16(p0 + p1) + sat16(p2 + p3)` with `pi` the
# product of byte i of `a` (unsigned) and of `b` (signed), each pair sum clamped to
# [-32768, 32767] (x86 `vpmaddubsw`, then `vpmaddwd` by ones): what onnxruntime's MLAS
# u8 x s8 kernels compute on AVX2 hosts without VNNI (docs/quantization.md, the
# `int8-pairs` target attribute), int32 wraparound for the additions to `acc`.
DOT4_U8S8_SAT16 = "dot4_u8s8_sat16"
# `dot2_i16(acc, a, b)`, all int32: `acc + s16(a) * s16(b) + s16(a >> 16) * s16(b >> 16)`
# with int32 wraparound: both 16-bit halves of each word signed (half 0 the least
# significant). One lane of x86 `vpmaddwd` plus an add: the exact int8 products on
# AVX2 / AVX-512BW without VNNI, with u8 or s8 values stored widened in int16 pairs
# (docs/quantization.md, "Without VNNI: int16 pairs").
DOT2_I16 = "dot2_i16"
# `dot2_bf16(acc, a, b)`: `acc` float32, `a` and `b` int32 words of two bfloat16 values
# (half 0 the least significant); `(acc + hi(a) * hi(b)) + lo(a) * lo(b)` in float32,
# each bfloat16 widened exactly (its bits the upper half of a float32), the products
# exact, the two additions rounded to nearest even. One lane of x86 `vdpbf16ps` (which
# also flushes subnormals to zero); the llvm backend emits it where the target has
# AVX512-BF16, else these float32 operations (kiln.codegen.llvm.bf16_dot).
DOT2_BF16 = "dot2_bf16"
# `bf16_pair(lo, hi)`: `lo` and `hi` float32, the result the int32 word of both rounded
# to bfloat16 (nearest, ties to even; a NaN a quiet NaN), `lo` in half 0: the words
# `dot2_bf16` reads. A subnormal may come out as a zero of its sign (x86
# `vcvtne2ps2bf16`, which the llvm backend emits where the target has AVX512-BF16,
# flushes them; `vdpbf16ps` flushes them anyway).
BF16_PAIR = "bf16_pair"
#: The integer dot-product intrinsics (int32 arguments: packed words of 4 bytes, or of
#: 2 int16 halves for `dot2_i16`).
DOT4_INTRINSICS = frozenset({DOT4_U8S8, DOT4_U8S8_SAT16, DOT2_I16})
# Intrinsics whose result is bool whatever the argument's dtype.
BOOL_INTRINSICS = frozenset({"isnan", "isinf"})


@dataclass(frozen=True, eq=False, slots=True)
class Intrin(PrimExpr):
    """A math intrinsic such as exp or sqrt. `round` rounds half to even."""

    name: str
    args: tuple[PrimExpr, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))
        if self.name not in INTRINSICS:
            known = ", ".join(sorted(INTRINSICS))
            raise IRError(f"unknown intrinsic {self.name!r}; known: {known}")
        if len(self.args) != INTRINSICS[self.name]:
            raise IRError(
                f"intrinsic {self.name} takes {INTRINSICS[self.name]} argument(s), "
                f"got {len(self.args)}"
            )

    @property
    def dtype(self) -> str:  # type: ignore[override]
        return _result_dtype(self)


@dataclass(frozen=True, slots=True)
class ExternDependency:
    """Where an external C function comes from (MLF `external_dependencies`)."""

    short_name: str
    version_spec: str = ""
    url: str = ""
    url_type: str = ""
    # Extra link inputs, e.g. ("-lm",) or ("-lopenblas",).
    libs: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "short_name": self.short_name, "version_spec": self.version_spec,
            "url": self.url, "url_type": self.url_type, "libs": list(self.libs),
        }


@dataclass(frozen=True, eq=False, slots=True)
class CallExtern(PrimExpr):
    """Call the external C function `name` with scalar or buffer-pointer arguments.

    A `Buffer` argument passes its data pointer. `dtype` is the C return type
    (use "int32" for an int status and ignore it with `Evaluate`).
    """

    name: str
    args: tuple[PrimExpr | Buffer, ...]
    dtype: str
    dependency: ExternDependency | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))
        check_dtype(self.dtype)


def _result_dtype(e: PrimExpr) -> str:
    """The dtype of an operator that takes its operand's, found by a loop: an
    expression chain may be deeper than Python's frame limit allows to recurse."""
    while True:
        if isinstance(e, (BinaryOp, UnaryOp)):
            e = e.a
        elif isinstance(e, Select):
            e = e.true_value
        elif isinstance(e, Intrin) and e.name == BF16_PAIR:
            return "int32"
        elif isinstance(e, Intrin) and e.name not in BOOL_INTRINSICS:
            e = e.args[0]
        elif isinstance(e, Intrin):
            return "bool"
        else:
            return e.dtype


def const(value: int | float | bool, dtype: str | None = None) -> Const:
    """A literal; the dtype defaults to int64, float32 or bool by Python type."""
    if dtype is None:
        dtype = "bool" if isinstance(value, bool) else (
            "float32" if isinstance(value, float) else INDEX_DTYPE)
    return Const(value, dtype)


def as_expr(value: ExprLike, like: str | None = None) -> PrimExpr:
    """Wrap a Python scalar as a Const of dtype `like` (or the default for its type)."""
    if isinstance(value, PrimExpr):
        return value
    if isinstance(value, (bool, int, float, np.generic)):
        scalar: int | float | bool = value.item() if isinstance(value, np.generic) else value
        if like is not None and not (isinstance(scalar, float) and not dt.is_float(like)):
            return Const(scalar, like)
        return const(scalar)
    raise IRError(f"cannot use {type(value).__name__} {value!r} as a kiln expression")


def _pair(a: ExprLike, b: ExprLike) -> tuple[PrimExpr, PrimExpr]:
    if isinstance(a, PrimExpr):
        return a, as_expr(b, a.dtype)
    if isinstance(b, PrimExpr):
        return as_expr(a, b.dtype), b
    return as_expr(a), as_expr(b)


def binary(op: str, a: ExprLike, b: ExprLike) -> PrimExpr:
    """`a <op> b`; a Python scalar adopts the other operand's dtype, which must match."""
    x, y = _pair(a, b)
    if x.dtype != y.dtype:
        raise IRError(f"{op}: operand dtypes differ ({x.dtype} vs {y.dtype}); insert a Cast")
    return BinaryOp(op, x, y)


def compare(op: str, a: ExprLike, b: ExprLike) -> PrimExpr:
    """`a <op> b` (eq, ne, lt, le, gt, ge) giving bool; operand dtypes must match."""
    x, y = _pair(a, b)
    if x.dtype != y.dtype:
        raise IRError(f"{op}: operand dtypes differ ({x.dtype} vs {y.dtype}); insert a Cast")
    return Compare(op, x, y)


def select(cond: PrimExpr, t: ExprLike, f: ExprLike) -> PrimExpr:
    """`cond ? t : f`; a Python scalar branch adopts the other branch's dtype."""
    x, y = _pair(t, f)
    return Select(cond, x, y)


def min_(a: ExprLike, b: ExprLike) -> PrimExpr:
    """The `min` BinaryOp."""
    return binary("min", a, b)


def max_(a: ExprLike, b: ExprLike) -> PrimExpr:
    """The `max` BinaryOp."""
    return binary("max", a, b)


def intrin(name: str, *args: ExprLike) -> PrimExpr:
    """Math intrinsic `name`; Python scalar arguments adopt the first expression's dtype."""
    first = next((a for a in args if isinstance(a, PrimExpr)), None)
    like = first.dtype if first is not None else None
    return Intrin(name, tuple(as_expr(a, like) for a in args))


# --------------------------------------------------------------------------- buffers

BUFFER_SCOPES = ("global", "local")


@dataclass(frozen=True, eq=False, slots=True)
class Buffer:
    """A dense row-major array: a function parameter or a local allocation.

    `name` is a hint; buffers compare by identity. `X[i, j]` builds a Load.
    """

    name: str
    shape: tuple[Any, ...]
    dtype: str
    scope: str = "global"

    def __post_init__(self) -> None:
        shape = tuple(int(d) if isinstance(d, (int, np.integer)) else d for d in self.shape)
        object.__setattr__(self, "shape", shape)
        check_dtype(self.dtype)
        if self.scope not in BUFFER_SCOPES:
            raise IRError(f"unknown buffer scope {self.scope!r}; known: {BUFFER_SCOPES}")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        n = 1
        for d in self.shape:
            if not isinstance(d, int):
                raise IRError(f"buffer {self.name} has a symbolic shape {self.shape}")
            n *= d
        return n

    def nbytes(self) -> int:
        return self.numel() * dt.itemsize(self.dtype)

    def strides(self) -> tuple[int, ...]:
        """Row-major element strides."""
        out: list[int] = []
        step = 1
        for d in reversed(self.shape):
            out.append(step)
            step *= int(d)
        return tuple(reversed(out))

    def __getitem__(self, idx: ExprLike | tuple[ExprLike, ...]) -> Load:
        items = idx if isinstance(idx, tuple) else (idx,)
        return Load(self, tuple(as_expr(i, INDEX_DTYPE) for i in items))

    __hash__ = object.__hash__


# --------------------------------------------------------------------------- statements


class Stmt:
    """Base of statements."""

    __slots__ = ()
    __hash__ = object.__hash__


@dataclass(frozen=True, eq=False, slots=True)
class Store(Stmt):
    """`buffer[indices] = value`."""

    buffer: Buffer
    value: PrimExpr
    indices: tuple[PrimExpr, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "indices", tuple(self.indices))


@dataclass(frozen=True, eq=False, slots=True)
class SeqStmt(Stmt):
    """Statements run in order."""

    body: tuple[Stmt, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "body", tuple(self.body))


# "block_x" / "thread_x": a GPU kernel's iterations bound to CUDA's blockIdx.x and
# threadIdx.x (kiln.transform.gpu_schedule); anywhere else they run as serial loops.
# "vector": a `vectorized` loop the `vectorize-loops` pass found to be straight-line vector
# code (kiln.ir.analysis.vector_loops): the backends emit it as vector instructions, all
# lanes (its constant extent) at once. It promises independent iterations, like "parallel".
# "scalar": a serial loop the backend compiler must not vectorize (its iterations lie a
# plane apart in memory: vectorized, its loads and stores would be gathers and scatters).
FOR_KINDS = ("serial", "parallel", "vectorized", "vector", "unrolled", "scalar", "block_x",
             "thread_x")


# weakref_slot: analyses of a loop are cached for the loop's lifetime (IdentityCache)
@dataclass(frozen=True, eq=False, slots=True, weakref_slot=True)
class For(Stmt):
    """`for var in range(start, start + extent)`; `kind` is a scheduling annotation."""

    var: Var
    start: PrimExpr
    extent: PrimExpr
    kind: str
    body: Stmt

    def __post_init__(self) -> None:
        if self.kind not in FOR_KINDS:
            raise IRError(f"unknown loop kind {self.kind!r}; known: {', '.join(FOR_KINDS)}")


@dataclass(frozen=True, eq=False, slots=True)
class LetStmt(Stmt):
    """Bind `var = value` for the rest of the enclosing statement list.

    Flat like the declarations below: `value` is evaluated once, here, and a chain
    of lets is a run of statements side by side, not nested scopes. A let in a
    loop body binds its variable afresh on every iteration.
    """

    var: Var
    value: PrimExpr


@dataclass(frozen=True, eq=False, slots=True)
class IfThenElse(Stmt):
    """`if cond: then_body else: else_body` (no else branch when `else_body` is None)."""

    cond: PrimExpr
    then_body: Stmt
    else_body: Stmt | None = None


@dataclass(frozen=True, eq=False, slots=True)
class While(Stmt):
    """`while cond: body`: `cond` (bool) is evaluated before every iteration.

    The loop of a graph-level `Loop` (kiln.transform.lower_control_flow): its state
    lives in buffers, so `cond` reads them (`counter[0] < m and keep[0]`).
    """

    cond: PrimExpr
    body: Stmt


# Declarations: `Allocate`, `AllocConst` and `DeclBuffer` (and `LetStmt`) have no body. Like a C
# declaration, each one's scope runs from the statement after it to the end of the
# enclosing statement list (the `SeqStmt` it stands in, or the loop/branch/function
# body it is). Keeping them flat means a model with thousands of weights is one long
# `SeqStmt`, not thousands of nested scopes that every walk would recurse through.


@dataclass(frozen=True, eq=False, slots=True)
class Allocate(Stmt):
    """Declare a fresh buffer (stack for "local", heap for "global") for the rest of the block.

    A "global" allocation is freed when the enclosing block ends.
    """

    buffer: Buffer


@dataclass(frozen=True, eq=False, slots=True)
class AllocConst(Stmt):
    """Declare `buffer` bound to read-only constant data (weights) for the rest of the block."""

    buffer: Buffer
    data: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", readonly_array(self.data))


@dataclass(frozen=True, eq=False, slots=True)
class DeclBuffer(Stmt):
    """Declare `buffer`, a view of `source`'s storage at `byte_offset`, for the rest of the
    block (memory planning).

    The offset is an int, or an int64 expression over the function's scalar
    parameters when sizes are symbolic (a workspace laid out at entry,
    docs/dynamic-shapes.md)."""

    buffer: Buffer
    source: Buffer
    byte_offset: int | PrimExpr


DECLARATIONS = (Allocate, AllocConst, DeclBuffer)


@dataclass(frozen=True, eq=False, slots=True)
class Evaluate(Stmt):
    """Evaluate an expression for its side effect (e.g. a CallExtern)."""

    value: PrimExpr


@dataclass(frozen=True, eq=False, slots=True)
class CallFunc(Stmt):
    """Call the tensor-level function `func` of the same module (buffers by pointer)."""

    func: str
    args: tuple[Buffer | PrimExpr, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", tuple(self.args))


def readonly_array(data: Any) -> np.ndarray:
    """A contiguous read-only array: `data` itself when it already is one, else a copy."""
    # np.asarray(order="C"), not np.ascontiguousarray: the latter turns a 0-d array into 1-d.
    arr = np.asarray(data, order="C")
    if arr.flags.writeable:
        arr = arr.copy()
        arr.flags.writeable = False
    return arr


def seq(*stmts: Stmt) -> Stmt:
    """Flatten into one statement (a lone non-declaration statement is returned as is).

    Splicing a nested `SeqStmt` widens the scope of the declarations in it to the end
    of the outer list; buffers are identity objects, so no name can be captured.
    A lone declaration stays wrapped in a `SeqStmt` so it keeps a block of its own.
    """
    flat: list[Stmt] = []
    for s in stmts:
        flat.extend(s.body if isinstance(s, SeqStmt) else (s,))
    if len(flat) == 1 and not isinstance(flat[0], (*DECLARATIONS, LetStmt)):
        return flat[0]
    return SeqStmt(tuple(flat))


# --------------------------------------------------------------------------- functions

Param = Buffer | Var


@dataclass(frozen=True, eq=False, slots=True, weakref_slot=True)  # IdentityCache keys
class PrimFunc:
    """A tensor-level function: buffer and scalar parameters and a loop-nest body.

    Outputs are written into parameter buffers (destination-passing style).
    """

    params: tuple[Param, ...]
    body: Stmt
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", tuple(self.params))
        object.__setattr__(self, "attrs", MappingProxyType(dict(self.attrs)))

    def with_body(self, body: Stmt) -> PrimFunc:
        """This function with another body (same params and attrs)."""
        return PrimFunc(self.params, body, dict(self.attrs))

    def with_attrs(self, **attrs: Any) -> PrimFunc:
        """This function with `attrs` added to (or replacing) its attributes."""
        return PrimFunc(self.params, self.body, {**self.attrs, **attrs})

    @property
    def buffer_params(self) -> tuple[Buffer, ...]:
        """The buffer parameters, in order (scalar parameters left out)."""
        return tuple(p for p in self.params if isinstance(p, Buffer))

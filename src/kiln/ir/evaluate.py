"""The reference interpreter: the executable meaning of kiln IR.

`evaluate(mod, name, *args)` runs function `name` of `mod` on numpy arrays. The
code generators are tested against it, so its semantics are the IR's semantics:

Values and dtypes
- Integers (intN/uintN) wrap modulo 2**N after every operation (int32 overflow
  wraps, as with two's complement hardware). bool is 0/1.
- float32 math is done in float32 (every add/sub/mul/div is rounded to float32).
  float16 and bfloat16 are storage types: loads widen to float32, arithmetic is
  float32, and the value is rounded to the storage type only by a Store or by a
  Cast from another dtype to float16/bfloat16 (a float16 Const holds a
  float16-representable value; a Cast between equal dtypes is a no-op).
  float64 math is float64.
Operators
- `div`: true division on floats; on integers truncation toward zero (C).
  `mod`: C remainder (sign of the dividend; C `fmod` on floats).
  `floordiv` / `floormod`: round toward minus infinity (floormod has the sign
  of the divisor); on floats `floor(a / b)` and `a - floor(a / b) * b`.
  Integer division or remainder by zero is an error (KilnError).
- `min` / `max`: `b if b < a else a` / `b if b > a else a` (with a NaN operand the
  result is unspecified). `pow` on integers wraps; a negative exponent gives
  the truncated quotient (0 unless the base is 1 or -1).
- `shl` / `shr`: shift amounts outside [0, bits) are an error; `shr` is arithmetic
  on signed and logical on unsigned integers; `shl` wraps.
- `and` / `or` / `xor` / `not`: logical on bool, bitwise on integers.
- Comparisons give bool; floats compare as IEEE (NaN compares false except `ne`).
- `Select(c, t, f)` evaluates both `t` and `f` (so both must be valid, e.g. both
  loads in bounds), then picks one.
- `Cast`: like C. Integer to integer wraps; float to integer truncates toward
  zero (out-of-range and NaN are undefined in C: the interpreter raises for NaN
  and infinity and wraps finite values; don't test them); anything to bool is
  `x != 0`; integer/bool to float rounds to nearest.
Intrinsics and externs
- float32 intrinsics are computed in float64 and rounded to float32 (libm's
  `expf` & co. may differ by 1 ulp); exact ones (sqrt, floor, ceil, trunc,
  round = `np.rint` half to even, abs, fmod) are exact. `rsqrt(x) = 1 / sqrt(x)`,
  `sigmoid(x) = 1 / (1 + exp(-x))`, each step in the dtype. `erf` uses math.erf.
  `abs` also accepts integers (abs(INT_MIN) wraps to INT_MIN).
- `CallExtern` supports the libm functions in `EXTERN_REFERENCES` (expf, exp,
  logf, sqrtf, tanhf, erff, fabsf, powf, ... and their double versions) on
  scalars, and memcpy / memmove / memset on buffers (their pointer result reads
  as 0); `register_extern_reference` adds more. Others raise IRError.
- `CallFunc` runs the callee on the caller's buffers (checked like arguments).
- Graph `Call`s run the operator's numpy reference from `kiln.ops`; the result
  must fit the call's type.
Shapes
- A buffer parameter's dimension may be symbolic: a fresh Var is bound from the
  argument's shape; any other expression (of scalar parameters and bound shape
  vars) is checked against it. Graph types bind their dimension Vars the same way.
Memory
- Every access is bounds-checked per dimension (a fault is a KilnError naming
  the buffer), except where the interpreter proves the index in range.
- `Allocate` memory starts poisoned (floats NaN, integers 0xA5 bytes, bool True)
  so reading it before writing shows up as a wrong answer, not a lucky zero.
  Graph-level outputs of `CallTensor` are poisoned the same way.
- `AllocConst` buffers are read-only; `DeclBuffer` is a byte view of its source.
- Loop kinds (parallel, vectorized, unrolled) run serially, in order.

Speed: each PrimFunc is compiled once into Python source (loops over Python
ints and numpy scalars, ranges of index expressions tracked to skip wrapping and
bounds checks) and cached; `python_source(func)` shows that source.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError, KilnError
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir._recursion import deep_recursion
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType, TupleType, Type

__all__ = [
    "EXTERN_REFERENCES", "ExternReference", "evaluate", "python_source",
    "register_extern_reference",
]

# --------------------------------------------------------------------------- public API


def evaluate(mod: IRModule, name: str, *args: Any, **kwargs: Any) -> Any:
    """Run function `name` of `mod` with the reference semantics (module docstring).

    PrimFunc: `args` are numpy arrays (checked against the parameters' shapes and
    dtypes; outputs are written in place) and Python scalars; returns None.
    Graph Function: `args` are numpy arrays (tuples for tuple parameters);
    returns an array, or a tuple for a tuple result. Keyword arguments name
    parameters by their name hint.
    """
    if not isinstance(mod, IRModule):
        raise IRError(f"evaluate expects an IRModule, got {type(mod).__name__}")
    fn = mod[name]
    full = _merge_kwargs(name, [p.name for p in fn.params], args, kwargs)
    if isinstance(fn, t.PrimFunc):
        _run_prim(mod, name, fn, full)
        return None
    return _GraphRunner(mod).run(name, fn, full)


def python_source(func: t.PrimFunc, name: str = "func") -> str:
    """The Python source the interpreter compiles `func` into (for debugging)."""
    return _compile(func, name).source


@dataclass(frozen=True)
class ExternReference:
    """How the interpreter runs an external C function.

    `arg_dtypes` entries are a dtype, "int" (any integer dtype) or "buffer" (the
    function receives the buffer's flat numpy array and may write it).
    `ret_dtype` is a dtype, or None to accept any: the result is then converted
    to the call's dtype.
    """

    arg_dtypes: tuple[str, ...]
    ret_dtype: str | None
    fn: Callable[..., Any]

    def accepts(self, args: tuple[str, ...], ret: str) -> bool:
        if len(args) != len(self.arg_dtypes) or self.ret_dtype not in (None, ret):
            return False
        return all(want == got or (want == "int" and got != "buffer" and dt.is_int(got))
                   for want, got in zip(self.arg_dtypes, args))


EXTERN_REFERENCES: dict[str, ExternReference] = {}


def register_extern_reference(name: str, arg_dtypes: Sequence[str], ret_dtype: str | None,
                              fn: Callable[..., Any], *, override: bool = False) -> None:
    """Teach the interpreter an extern (see ExternReference for the argument kinds)."""
    if name in EXTERN_REFERENCES and not override:
        raise IRError(f"extern reference {name!r} is already registered; pass override=True")
    EXTERN_REFERENCES[name] = ExternReference(tuple(arg_dtypes), ret_dtype, fn)


# --------------------------------------------------------------------------- libm table


def _erf(x: Any) -> float:
    return math.erf(x)


def _round_half_away(x: Any) -> Any:
    """C `round`: halfway cases away from zero (unlike `rint`)."""
    r = np.trunc(x)
    if abs(x - r) >= 0.5:
        r += np.copysign(1.0, x)
    return r


_LIBM_UNARY: dict[str, Callable[..., Any]] = {
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2,
    "log10": np.log10, "log1p": np.log1p, "sqrt": np.sqrt, "cbrt": np.cbrt, "sin": np.sin,
    "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh, "erf": _erf,
    "fabs": np.fabs, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "rint": np.rint,
    "nearbyint": np.rint, "round": _round_half_away,
}
_LIBM_BINARY: dict[str, Callable[..., Any]] = {
    "pow": np.power, "atan2": np.arctan2, "fmod": np.fmod, "fmin": np.fmin, "fmax": np.fmax,
    "hypot": np.hypot, "copysign": np.copysign,
}


def _libm(fn: Callable[..., Any], carrier: type) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        return carrier(fn(*(np.float64(a) for a in args)))
    return run


def _install_libm() -> None:
    for table, arity in ((_LIBM_UNARY, 1), (_LIBM_BINARY, 2)):
        for base, fn in table.items():
            register_extern_reference(base, ("float64",) * arity, "float64",
                                      _libm(fn, np.float64))
            register_extern_reference(base + "f", ("float32",) * arity, "float32",
                                      _libm(fn, np.float32))


_install_libm()


def _bytes(buf: np.ndarray, n: int, what: str) -> np.ndarray:
    raw = buf.view(np.uint8)
    if not 0 <= n <= raw.size:
        raise _Fault(f"{what} of {n} bytes on a buffer of {raw.size} bytes")
    return raw[:n]


def _memcpy(dst: np.ndarray, src: np.ndarray, n: int) -> int:
    _bytes(dst, n, "memcpy")[:] = _bytes(src, n, "memcpy")
    return 0  # the C function returns `dst`; a pointer has no meaning here


def _memset(dst: np.ndarray, value: int, n: int) -> int:
    _bytes(dst, n, "memset")[:] = value & 0xFF
    return 0


register_extern_reference("memcpy", ("buffer", "buffer", "int"), None, _memcpy)
register_extern_reference("memmove", ("buffer", "buffer", "int"), None, _memcpy)
register_extern_reference("memset", ("buffer", "int", "int"), None, _memset)

# --------------------------------------------------------------------------- runtime helpers


class _Fault(Exception):
    """A run-time fault inside interpreted code (reported as KilnError)."""


def _carrier(dtype: str) -> type:
    """The numpy scalar type arithmetic of `dtype` uses (floats only)."""
    return np.float64 if dtype == "float64" else np.float32


def _np_dtype(dtype: str) -> np.dtype[Any]:
    return dt.to_numpy(dtype)


def _int_range(dtype: str) -> tuple[int, int]:
    n = dt.bits(dtype)
    if dtype == "bool":
        return 0, 1
    if dt.kind(dtype) == "uint":
        return 0, (1 << n) - 1
    return -(1 << (n - 1)), (1 << (n - 1)) - 1


def _tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _tmod(a: int, b: int) -> int:
    return a - b * _tdiv(a, b)


def _ipow(a: int, b: int, bits: int) -> int:
    if b >= 0:
        return pow(a, b, 1 << bits)
    if a == 0:
        raise ZeroDivisionError
    if a == 1:
        return 1
    if a == -1:
        return 1 if b % 2 == 0 else -1
    return 0


def _shift_check(b: int, bits: int) -> None:
    if not 0 <= b < bits:
        raise _Fault(f"shift amount {b} is outside [0, {bits})")


def _shl(a: int, b: int, bits: int) -> int:
    _shift_check(b, bits)
    return a << b


def _shr(a: int, b: int, bits: int) -> int:
    _shift_check(b, bits)
    return a >> b


def _sel(c: Any, x: Any, y: Any) -> Any:
    return x if c else y


def _f2i(x: Any) -> int:
    if not np.isfinite(x):
        raise _Fault(f"cannot convert {x} to an integer (undefined in C)")
    return int(x)


def _ffloordiv(a: Any, b: Any) -> Any:
    return np.floor(a / b)


def _ffloormod(a: Any, b: Any) -> Any:
    return a - np.floor(a / b) * b


def _converter(dtype: str) -> Callable[[Any], Any]:
    """Converts an extern's result to the carrier of `dtype` (ints wrap)."""
    if dtype == "bool":
        return bool
    if dt.is_int(dtype):
        lo, hi = _int_range(dtype)
        span = hi - lo + 1
        return lambda x: (int(x) - lo) % span + lo
    if dtype == "float16":
        return _round16
    if dtype == "bfloat16":
        return _round_bf16
    return _carrier(dtype)


def _round16(x: Any) -> np.float32:
    return np.float32(np.float16(x))


def _round_bf16(x: Any) -> np.float32:
    return np.float32(dt.to_numpy("bfloat16").type(np.float32(x)))


def _alloc(count: int, dtype: np.dtype[Any]) -> np.ndarray:
    if count < 0:
        raise _Fault(f"cannot allocate {count} elements")
    arr = np.empty(count, dtype=dtype)
    if dtype.kind == "f" or dtype.name == "bfloat16":
        arr[:] = np.nan
    elif dtype.kind == "b":
        arr[:] = True
    else:
        arr.view(np.uint8)[:] = 0xA5
    return arr


def _view(src: np.ndarray, offset: int, count: int, dtype: np.dtype[Any]) -> np.ndarray:
    raw = src.view(np.uint8)
    size = count * dtype.itemsize
    if offset < 0 or offset + size > raw.size:
        raise _Fault(f"DeclBuffer view [{offset}, {offset + size}) is outside its source "
                     f"of {raw.size} bytes")
    return raw[offset:offset + size].view(dtype)


def _float_intrinsic(fn: Callable[..., Any], carrier: type) -> Callable[..., Any]:
    if carrier is np.float64:
        return fn

    def run(*args: Any) -> Any:
        return np.float32(fn(*args, dtype=np.float64))
    return run


_FLOAT_UFUNCS: dict[str, Callable[..., Any]] = {
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2,
    "log1p": np.log1p, "sin": np.sin, "cos": np.cos, "tan": np.tan, "tanh": np.tanh,
    "sinh": np.sinh, "cosh": np.cosh, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "pow": np.power, "atan2": np.arctan2,
}
# Correctly rounded in any precision: applied to the carrier directly.
_EXACT_UFUNCS: dict[str, Callable[..., Any]] = {
    "sqrt": np.sqrt, "abs": np.abs, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc,
    "round": np.rint, "fmod": np.fmod, "isnan": np.isnan, "isinf": np.isinf,
}


def _base_namespace() -> dict[str, Any]:
    ns: dict[str, Any] = {
        "_Fault": _Fault, "_tdiv": _tdiv, "_tmod": _tmod, "_ipow": _ipow, "_shl": _shl,
        "_shr": _shr, "_sel": _sel, "_f2i": _f2i, "_ffloordiv": _ffloordiv,
        "_ffloormod": _ffloormod, "_round16": _round16, "_round_bf16": _round_bf16,
        "_alloc": _alloc, "_view": _view, "_F32": np.float32, "_F64": np.float64,
        "_erf32": lambda x: np.float32(math.erf(x)), "_erf64": lambda x: np.float64(
            math.erf(x)),
    }
    for name, fn in _FLOAT_UFUNCS.items():
        ns[f"_{name}32"] = _float_intrinsic(fn, np.float32)
        ns[f"_{name}64"] = fn
    for name, fn in _EXACT_UFUNCS.items():
        ns[f"_{name}"] = fn
    return ns


_BASE_NS = _base_namespace()

# --------------------------------------------------------------------------- compiler


@dataclass
class _V:
    """A compiled expression: Python code, integer bounds if known, nesting depth."""

    code: str
    lo: int | None = None
    hi: int | None = None
    depth: int = 0


@dataclass
class _Layout:
    """A buffer's dimensions, strides and size as code: literals or runtime locals."""

    dims: list[str]
    static: list[int | None]
    strides: list[str]
    numel: str


@dataclass
class _Compiled:
    name: str
    func: t.PrimFunc
    source: str
    run: Callable[..., None]


_HOIST_DEPTH = 32  # spill deeper expressions into temporaries (parser nesting limits)


class _Compiler:
    """Compiles one PrimFunc into the source of a Python function."""

    def __init__(self, func: t.PrimFunc, name: str) -> None:
        self.func = func
        self.name = name
        self.lines: list[str] = []
        self.pre: list[str] = []
        self.ns: dict[str, Any] = dict(_BASE_NS)
        self.names: dict[int, str] = {}
        self.live: set[int] = set()
        self.ranges: dict[int, tuple[int, int]] = {}
        self.sites: list[str] = []
        self.layouts: dict[int, _Layout] = {}
        self._counter = itertools.count()
        self._keep: list[object] = []

    # ------------------------------------------------------------------ naming

    def ident(self, node: t.Var | t.Buffer) -> str:
        """Name a variable/buffer at its definition and bring it into scope."""
        key = id(node)
        self.live.add(key)
        if key not in self.names:
            hint = re.sub(r"\W", "_", node.name) or "v"
            if not hint[0].isalpha():
                hint = "v" + hint
            self.names[key] = f"{hint}_{next(self._counter)}"
            self._keep.append(node)
        return self.names[key]

    def end_scope(self, node: t.Var | t.Buffer) -> None:
        self.live.discard(id(node))

    def lookup(self, node: t.Var | t.Buffer) -> str:
        name = self.names.get(id(node))
        if name is None or id(node) not in self.live:
            kind = "variable" if isinstance(node, t.Var) else "buffer"
            raise IRError(f"{self.name}: {kind} '{node.name}' is used outside its scope "
                          "(run kiln.ir.verify for details)")
        return name

    def const(self, value: Any, hint: str = "k") -> str:
        name = f"_{hint}{next(self._counter)}"
        self.ns[name] = value
        return name

    def temp(self) -> str:
        return f"_t{next(self._counter)}"

    # ------------------------------------------------------------------ top level

    def compile(self) -> _Compiled:
        params = [self.ident(p) for p in self.func.params]
        for p in self.func.params:
            if isinstance(p, t.Var) and dt.is_int(p.dtype):
                self.ranges[id(p)] = _int_range(p.dtype)
        # Buffers arrive with their shapes; symbolic dimensions are bound or checked
        # against them, then the kernel works on flat views.
        for p in self.func.params:
            if isinstance(p, t.Buffer):
                name = self.names[id(p)]
                shape_of = None
                if not all(isinstance(d, int) for d in p.shape):
                    shape_of = self.temp()
                    self.emit(1, f"{shape_of} = {name}.shape")
                self.define_layout(p, 1, shape_of)
                self.emit(1, f"{name} = {name}.reshape(-1)")
        self.stmt(self.func.body, 1)
        header = f"def _kernel(_rt, {', '.join(params)}):" if params else "def _kernel(_rt):"
        source = "\n".join([header, *self.lines]) + "\n"
        sites = self.sites

        def oob(site: int, *values: int) -> int:
            raise _Fault(sites[site].format(*values))

        self.ns["_oob"] = oob
        try:
            code = compile(source, f"<kiln.evaluate {self.name}>", "exec")
        except (SyntaxError, RecursionError, MemoryError) as exc:
            raise IRError(f"{self.name}: the interpreter cannot compile this function "
                          f"({type(exc).__name__}: {exc})") from exc
        exec(code, self.ns)
        return _Compiled(self.name, self.func, source, self.ns["_kernel"])

    def emit(self, depth: int, text: str) -> None:
        for line in self.pre:
            self.lines.append("    " * depth + line)
        self.pre.clear()
        self.lines.append("    " * depth + text)

    # ------------------------------------------------------------------ statements

    def body(self, s: t.Stmt, depth: int) -> None:
        before = len(self.lines)
        self.stmt(s, depth)
        if len(self.lines) == before:
            self.emit(depth, "pass")

    def stmt(self, s: t.Stmt, depth: int) -> None:
        if isinstance(s, t.SeqStmt):
            for sub in s.body:
                self.stmt(sub, depth)
        elif isinstance(s, t.Store):
            index = self.flat_index(s.buffer, s.indices, "store to")
            value = self.expr(s.value)
            if s.value.dtype != s.buffer.dtype:
                raise IRError(f"{self.name}: Store to '{s.buffer.name}' of a {s.value.dtype} "
                              f"value into a {s.buffer.dtype} buffer (run kiln.ir.verify)")
            self.emit(depth, f"{self.lookup(s.buffer)}[{index}] = {value.code}")
        elif isinstance(s, t.For):
            self.for_(s, depth)
        elif isinstance(s, t.LetStmt):
            value = self.expr(s.value)
            name = self.ident(s.var)
            self.emit(depth, f"{name} = {value.code}")
            # (Always reset: a variable bound again in a sibling scope gets new bounds.)
            self.ranges.pop(id(s.var), None)
            if value.lo is not None and value.hi is not None:
                self.ranges[id(s.var)] = (value.lo, value.hi)
            self.stmt(s.body, depth)
            self.end_scope(s.var)
        elif isinstance(s, t.IfThenElse):
            cond = self.expr(s.cond)
            self.emit(depth, f"if {cond.code}:")
            self.body(s.then_body, depth + 1)
            if s.else_body is not None:
                self.emit(depth, "else:")
                self.body(s.else_body, depth + 1)
        elif isinstance(s, t.Allocate):
            b = s.buffer
            npdt = self.const(_np_dtype(b.dtype), "dt")
            name = self.ident(b)
            layout = self.define_layout(b, depth)
            self.emit(depth, f"{name} = _alloc({layout.numel}, {npdt})")
            self.stmt(s.body, depth)
            self.end_scope(b)
        elif isinstance(s, t.AllocConst):
            data = s.data.reshape(-1)
            if data.dtype != _np_dtype(s.buffer.dtype) or s.data.shape != s.buffer.shape:
                raise IRError(f"{self.name}: AllocConst data {s.data.dtype}{s.data.shape} "
                              f"does not match buffer '{s.buffer.name}' (run kiln.ir.verify)")
            name = self.ident(s.buffer)
            self.define_layout(s.buffer, depth)
            self.emit(depth, f"{name} = {self.const(data, 'w')}")
            self.stmt(s.body, depth)
            self.end_scope(s.buffer)
        elif isinstance(s, t.DeclBuffer):
            b = s.buffer
            npdt = self.const(_np_dtype(b.dtype), "dt")
            src = self.lookup(s.source)
            name = self.ident(b)
            layout = self.define_layout(b, depth)
            self.emit(depth, f"{name} = _view({src}, {int(s.byte_offset)}, "
                             f"{layout.numel}, {npdt})")
            self.stmt(s.body, depth)
            self.end_scope(b)
        elif isinstance(s, t.Evaluate):
            self.emit(depth, self.expr(s.value).code)
        elif isinstance(s, t.CallFunc):
            args = [self.shaped(a) if isinstance(a, t.Buffer) else self.expr(a).code
                    for a in s.args]
            packed = "".join(f"{a}, " for a in args)
            self.emit(depth, f"_rt.call({s.func!r}, ({packed}))")
        else:
            raise IRError(f"{self.name}: the interpreter has no rule for {type(s).__name__}")

    def for_(self, s: t.For, depth: int) -> None:
        if not dt.is_int(s.var.dtype):
            raise IRError(f"{self.name}: loop variable '{s.var.name}' has dtype {s.var.dtype}")
        start, extent = self.expr(s.start), self.expr(s.extent)
        if isinstance(s.start, t.Const) and isinstance(s.extent, t.Const):
            rng = f"range({int(s.start.value)}, {int(s.start.value) + int(s.extent.value)})"
        else:
            tmp = self.temp()
            self.emit(depth, f"{tmp} = {start.code}")
            rng = f"range({tmp}, {tmp} + {extent.code})"
        name = self.ident(s.var)
        self.ranges.pop(id(s.var), None)
        if None not in (start.lo, start.hi, extent.hi):
            assert start.lo is not None and start.hi is not None and extent.hi is not None
            hi = start.hi + max(extent.hi, 1) - 1
            self.ranges[id(s.var)] = (start.lo, hi)
        self.emit(depth, f"for {name} in {rng}:")
        self.body(s.body, depth + 1)
        self.end_scope(s.var)

    def define_layout(self, b: t.Buffer, depth: int, shape_of: str | None = None) -> _Layout:
        """Compute `b`'s dimensions and strides where it is defined.

        `shape_of` names the runtime shape of a parameter: a dimension that is a
        fresh Var is bound from it (a shape variable), any other symbolic
        dimension is checked against it.
        """
        dims: list[str] = []
        static: list[int | None] = []
        for k, d in enumerate(b.shape):
            if isinstance(d, int):
                dims.append(str(d))
                static.append(d)
                continue
            if not isinstance(d, t.PrimExpr) or not dt.is_int(d.dtype):
                raise IRError(f"{self.name}: buffer '{b.name}' has a bad dimension {d!r}")
            static.append(None)
            if shape_of is not None and isinstance(d, t.Var) and id(d) not in self.live:
                name = self.ident(d)
                self.emit(depth, f"{name} = {shape_of}[{k}]")
                self.ranges[id(d)] = (0, _int_range(d.dtype)[1])
                dims.append(name)
                continue
            value = self.expr(d)
            tmp = self.temp()
            self.emit(depth, f"{tmp} = {value.code}")
            if shape_of is not None:
                site = self.site(f"argument '{b.name}': dimension {k} is {{0}} but the "
                                 f"parameter's shape says {_text(d)} = {{1}}")
                self.emit(depth, f"if {shape_of}[{k}] != {tmp}: "
                                 f"_oob({site}, {shape_of}[{k}], {tmp})")
            else:
                site = self.site(f"buffer '{b.name}': dimension {k} ({_text(d)}) is {{0}}")
                self.emit(depth, f"if {tmp} < 0: _oob({site}, {tmp})")
            dims.append(tmp)
        strides = ["1"] * len(dims)
        size_code, size = "1", 1
        symbolic = False
        for k in reversed(range(len(dims))):
            strides[k] = size_code
            dim = static[k]
            if not symbolic and dim is not None:
                size *= dim
                size_code = str(size)
            else:
                symbolic = True
                tmp = self.temp()
                self.emit(depth, f"{tmp} = {dims[k]} * {size_code}")
                size_code = tmp
        layout = _Layout(dims, static, strides, size_code)
        self.layouts[id(b)] = layout
        return layout

    def site(self, message: str) -> int:
        """Register a fault message (formatted with runtime values) and return its id."""
        self.sites.append(f"{self.name}: {message}")
        return len(self.sites) - 1

    def shaped(self, b: t.Buffer) -> str:
        """`b` reshaped to its dimensions, to pass to another function."""
        name = self.lookup(b)
        dims = self.layouts[id(b)].dims
        shape = f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"
        return f"{name}.reshape({shape})"

    def flat_index(self, b: t.Buffer, indices: tuple[t.PrimExpr, ...], what: str) -> str:
        self.lookup(b)
        layout = self.layouts[id(b)]
        if len(indices) != len(layout.dims):
            raise IRError(f"{self.name}: {what} '{b.name}' with {len(indices)} indices; the "
                          f"buffer has {len(layout.dims)} dimensions (run kiln.ir.verify)")
        terms: list[str] = []
        for d, idx in enumerate(indices):
            if not dt.is_int(idx.dtype):
                raise IRError(f"{self.name}: index {d} of '{b.name}' has dtype {idx.dtype}")
            v = self.expr(idx)
            code = v.code
            size = layout.static[d]
            dim = layout.dims[d]
            if size is None or v.lo is None or v.hi is None or v.lo < 0 or v.hi >= size:
                site = self.site(f"{what} buffer '{b.name}': index {{0}} is out of bounds for "
                                 f"dimension {d} of size {{1}}")
                tmp = self.temp()
                code = (f"({tmp} if 0 <= ({tmp} := {code}) < {dim} "
                        f"else _oob({site}, {tmp}, {dim}))")
            stride = layout.strides[d]
            terms.append(code if stride == "1" else f"{code} * {stride}")
        return " + ".join(terms) if terms else "0"

    # ------------------------------------------------------------------ expressions

    def expr(self, e: t.PrimExpr) -> _V:
        v = self._expr(e)
        if v.depth > _HOIST_DEPTH:
            tmp = self.temp()
            self.pre.append(f"{tmp} = {v.code}")
            return _V(tmp, v.lo, v.hi, 0)
        return v

    def wrap(self, code: str, lo: int | None, hi: int | None, dtype: str, depth: int) -> _V:
        """Wrap an integer result into `dtype` unless its bounds prove it fits."""
        dlo, dhi = _int_range(dtype)
        if lo is not None and hi is not None and dlo <= lo and hi <= dhi:
            return _V(code, lo, hi, depth)
        mask = (1 << dt.bits(dtype)) - 1
        if dt.kind(dtype) == "uint":
            return _V(f"({code} & {mask})", dlo, dhi, depth + 1)
        half = 1 << (dt.bits(dtype) - 1)
        return _V(f"((({code} + {half}) & {mask}) - {half})", dlo, dhi, depth + 1)

    def _expr(self, e: t.PrimExpr) -> _V:
        method = _EXPR_RULES.get(type(e))
        if method is None:
            raise IRError(f"{self.name}: the interpreter has no rule for {type(e).__name__}")
        result: _V = method(self, e)
        return result

    def var(self, e: t.Var) -> _V:
        name = self.lookup(e)
        if dt.is_int(e.dtype):
            lo, hi = self.ranges.get(id(e), _int_range(e.dtype))
            return _V(name, lo, hi)
        return _V(name)

    def const_expr(self, e: t.Const) -> _V:
        if e.dtype == "bool":
            return _V("True" if e.value else "False")
        if dt.is_float(e.dtype):
            value = float(e.value)
            if e.dtype == "float16":
                return _V(self.const(_round16(value)))
            if e.dtype == "bfloat16":
                return _V(self.const(_round_bf16(value)))
            return _V(self.const(_carrier(e.dtype)(value)))
        v = int(e.value)
        lo, hi = _int_range(e.dtype)
        if not lo <= v <= hi:
            raise IRError(f"{self.name}: constant {v} does not fit {e.dtype}")
        return _V(f"({v})" if v < 0 else str(v), v, v)

    def load(self, e: t.Load) -> _V:
        b = e.buffer
        index = self.flat_index(b, e.indices, "load from")
        name = self.lookup(b)
        if dt.is_float(b.dtype):
            if b.dtype in ("float16", "bfloat16"):
                return _V(f"_F32({name}[{index}])", depth=1)
            return _V(f"{name}[{index}]", depth=1)
        lo, hi = _int_range(b.dtype)
        return _V(f"{name}.item({index})", lo, hi, depth=1)

    def binary(self, e: t.BinaryOp) -> _V:
        a, b = self.expr(e.a), self.expr(e.b)
        if e.a.dtype != e.b.dtype:
            raise IRError(f"{self.name}: '{e.op}' on {e.a.dtype} and {e.b.dtype} "
                          "(run kiln.ir.verify)")
        dtype = e.a.dtype
        depth = max(a.depth, b.depth) + 1
        op = e.op
        if op in ("min", "max"):
            fn = "min" if op == "min" else "max"
            lo = hi = None
            if None not in (a.lo, a.hi, b.lo, b.hi):
                pick = min if op == "min" else max
                lo, hi = pick(a.lo, b.lo), pick(a.hi, b.hi)  # type: ignore[type-var]
            # Python's min/max return the first operand on ties and when unordered.
            return _V(f"{fn}({a.code}, {b.code})", lo, hi, depth)
        if dtype == "bool":
            return self.bool_binary(op, a, b, depth)
        if dt.is_float(dtype):
            return self.float_binary(op, a, b, dtype, depth)
        return self.int_binary(op, a, b, dtype, depth)

    def bool_binary(self, op: str, a: _V, b: _V, depth: int) -> _V:
        sym = {"and": "&", "or": "|", "xor": "^"}.get(op)
        if sym is None:
            raise IRError(f"{self.name}: '{op}' is not defined on bool")
        return _V(f"bool({a.code} {sym} {b.code})", depth=depth)

    def float_binary(self, op: str, a: _V, b: _V, dtype: str, depth: int) -> _V:
        sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}.get(op)
        if sym is not None:
            return _V(f"({a.code} {sym} {b.code})", depth=depth)
        width = "64" if dtype == "float64" else "32"
        calls = {"floordiv": "_ffloordiv", "floormod": "_ffloormod", "mod": "_fmod",
                 "pow": f"_pow{width}"}
        if op not in calls:
            raise IRError(f"{self.name}: '{op}' is not defined on {dtype}")
        return _V(f"{calls[op]}({a.code}, {b.code})", depth=depth)

    def int_binary(self, op: str, a: _V, b: _V, dtype: str, depth: int) -> _V:
        bits = dt.bits(dtype)
        lo: int | None = None
        hi: int | None = None
        known = None not in (a.lo, a.hi, b.lo, b.hi)
        alo, ahi, blo, bhi = (a.lo or 0), (a.hi or 0), (b.lo or 0), (b.hi or 0)
        nonneg = known and alo >= 0 and blo >= 1
        if op in ("add", "sub", "mul"):
            sym = {"add": "+", "sub": "-", "mul": "*"}[op]
            if known:
                if op == "add":
                    lo, hi = alo + blo, ahi + bhi
                elif op == "sub":
                    lo, hi = alo - bhi, ahi - blo
                else:
                    corners = (alo * blo, alo * bhi, ahi * blo, ahi * bhi)
                    lo, hi = min(corners), max(corners)
            return self.wrap(f"({a.code} {sym} {b.code})", lo, hi, dtype, depth)
        if op in ("div", "floordiv"):
            if nonneg or op == "floordiv":
                code = f"({a.code} // {b.code})"
                if known and blo >= 1:
                    lo, hi = min(alo // blo, alo // bhi), max(ahi // blo, ahi // bhi)
            else:
                code = f"_tdiv({a.code}, {b.code})"
                if known:
                    m = max(abs(alo), abs(ahi))
                    lo, hi = -m, m
            return self.wrap(code, lo, hi, dtype, depth)
        if op in ("mod", "floormod"):
            if nonneg or op == "floormod":
                code = f"({a.code} % {b.code})"
                if known and blo >= 1:
                    lo, hi = 0, bhi - 1
            else:
                code = f"_tmod({a.code}, {b.code})"
            if lo is None and known:
                m = max(abs(blo), abs(bhi))
                lo, hi = -m, m
            return self.wrap(code, lo, hi, dtype, depth)
        if op in ("and", "or", "xor"):
            sym = {"and": "&", "or": "|", "xor": "^"}[op]
            # Bitwise ops on in-range two's complement ints stay in range.
            dlo, dhi = _int_range(dtype)
            return _V(f"({a.code} {sym} {b.code})", dlo, dhi, depth)
        if op == "shl":
            return self.wrap(f"_shl({a.code}, {b.code}, {bits})", None, None, dtype, depth)
        if op == "shr":
            dlo, dhi = _int_range(dtype)
            return _V(f"_shr({a.code}, {b.code}, {bits})", dlo, dhi, depth)
        if op == "pow":
            return self.wrap(f"_ipow({a.code}, {b.code}, {bits})", None, None, dtype, depth)
        raise IRError(f"{self.name}: '{op}' is not defined on {dtype}")

    def compare(self, e: t.Compare) -> _V:
        a, b = self.expr(e.a), self.expr(e.b)
        sym = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}[e.op]
        return _V(f"({a.code} {sym} {b.code})", depth=max(a.depth, b.depth) + 1)

    def unary(self, e: t.UnaryOp) -> _V:
        a = self.expr(e.a)
        dtype = e.a.dtype
        depth = a.depth + 1
        if e.op == "neg":
            if dt.is_float(dtype):
                return _V(f"(-{a.code})", depth=depth)
            if dtype == "bool":
                raise IRError(f"{self.name}: 'neg' is not defined on bool")
            lo = -a.hi if a.hi is not None else None
            hi = -a.lo if a.lo is not None else None
            return self.wrap(f"(-{a.code})", lo, hi, dtype, depth)
        if dtype == "bool":
            return _V(f"(not {a.code})", depth=depth)
        if dt.is_float(dtype):
            raise IRError(f"{self.name}: 'not' is not defined on {dtype}")
        if dt.kind(dtype) == "uint":
            return _V(f"(~{a.code} & {(1 << dt.bits(dtype)) - 1})", *_int_range(dtype), depth)
        return _V(f"(~{a.code})", *_int_range(dtype), depth)

    def select(self, e: t.Select) -> _V:
        c, x, y = self.expr(e.cond), self.expr(e.true_value), self.expr(e.false_value)
        lo = hi = None
        if None not in (x.lo, x.hi, y.lo, y.hi):
            lo, hi = min(x.lo, y.lo), max(x.hi, y.hi)  # type: ignore[type-var]
        return _V(f"_sel({c.code}, {x.code}, {y.code})", lo, hi,
                  max(c.depth, x.depth, y.depth) + 1)

    def cast(self, e: t.Cast) -> _V:
        v = self.expr(e.value)
        src, dst = e.value.dtype, e.dtype
        depth = v.depth + 1
        if src == dst:
            return v
        if dst == "bool":
            return _V(f"bool({v.code} != 0)", depth=depth)
        if dt.is_int(dst):
            if src == "bool":
                return _V(f"int({v.code})", 0, 1, depth)
            if dt.is_float(src):
                return self.wrap(f"_f2i({v.code})", None, None, dst, depth)
            return self.wrap(v.code, v.lo, v.hi, dst, depth)
        # To a float dtype.
        if dst == "float16":
            return _V(f"_round16({v.code})", depth=depth)
        if dst == "bfloat16":
            return _V(f"_round_bf16({v.code})", depth=depth)
        fn = "_F64" if dst == "float64" else "_F32"
        return _V(f"{fn}({v.code})", depth=depth)

    def intrin(self, e: t.Intrin) -> _V:
        args = [self.expr(a) for a in e.args]
        codes = ", ".join(a.code for a in args)
        depth = max(a.depth for a in args) + 1
        dtype = e.args[0].dtype
        name = e.name
        if not dt.is_float(dtype):
            if name == "abs" and dt.is_int(dtype):
                a = args[0]
                lo = hi = None
                if a.lo is not None and a.hi is not None:
                    hi = max(abs(a.lo), abs(a.hi))
                    lo = 0 if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi))
                return self.wrap(f"abs({codes})", lo, hi, dtype, depth)
            raise IRError(f"{self.name}: intrinsic '{name}' needs a float argument, got {dtype}")
        width = "64" if dtype == "float64" else "32"
        carrier = "_F64" if dtype == "float64" else "_F32"
        if name in _EXACT_UFUNCS:
            return _V(f"_{name}({codes})", depth=depth)
        if name in _FLOAT_UFUNCS:
            return _V(f"_{name}{width}({codes})", depth=depth)
        one = self.const(_carrier(dtype)(1.0))
        if name == "rsqrt":
            return _V(f"({one} / _sqrt({codes}))", depth=depth)
        if name == "sigmoid":
            return _V(f"({one} / ({one} + _exp{width}(-{codes})))", depth=depth)
        if name == "erf":
            return _V(f"_erf{width}({codes})", depth=depth)
        raise IRError(f"{self.name}: the interpreter has no rule for intrinsic '{name}' "
                      f"({carrier})")

    def call_extern(self, e: t.CallExtern) -> _V:
        ref = EXTERN_REFERENCES.get(e.name)
        if ref is None:
            known = ", ".join(sorted(EXTERN_REFERENCES))
            raise IRError(f"{self.name}: no reference for extern '{e.name}'; the interpreter "
                          f"knows {known}. Add one with "
                          "kiln.ir.evaluate.register_extern_reference")
        got = tuple("buffer" if isinstance(a, t.Buffer) else a.dtype for a in e.args)
        if not ref.accepts(got, e.dtype):
            raise IRError(f"{self.name}: extern '{e.name}' takes ({', '.join(ref.arg_dtypes)}) "
                          f"-> {ref.ret_dtype or 'any'}, but is called with "
                          f"({', '.join(got)}) -> {e.dtype}")
        args = [_V(self.lookup(a)) if isinstance(a, t.Buffer) else self.expr(a)
                for a in e.args]
        fn = self.const(ref.fn, "x")
        depth = max((a.depth for a in args), default=0) + 1
        code = f"{fn}({', '.join(a.code for a in args)})"
        if ref.ret_dtype is None:
            code = f"{self.const(_converter(e.dtype), 'cv')}({code})"
        if dt.is_int(e.dtype):
            lo, hi = _int_range(e.dtype)
            return _V(code, lo, hi, depth)
        return _V(code, depth=depth)


_EXPR_RULES: dict[type, Callable[[_Compiler, Any], _V]] = {
    t.Var: _Compiler.var,
    t.Const: _Compiler.const_expr,
    t.Load: _Compiler.load,
    t.BinaryOp: _Compiler.binary,
    t.Compare: _Compiler.compare,
    t.UnaryOp: _Compiler.unary,
    t.Select: _Compiler.select,
    t.Cast: _Compiler.cast,
    t.Intrin: _Compiler.intrin,
    t.CallExtern: _Compiler.call_extern,
}

# Compiled functions by identity (the entry keeps the PrimFunc alive so ids are unique).
_CACHE: OrderedDict[int, _Compiled] = OrderedDict()
_CACHE_SIZE = 512


def _compile(func: t.PrimFunc, name: str) -> _Compiled:
    hit = _CACHE.get(id(func))
    if hit is not None and hit.func is func:
        _CACHE.move_to_end(id(func))
        return hit
    with deep_recursion(f"evaluate {name}"):
        compiled = _Compiler(func, name).compile()
    _CACHE[id(func)] = compiled
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return compiled


# --------------------------------------------------------------------------- running


def _merge_kwargs(name: str, params: list[str], args: Sequence[Any],
                  kwargs: Mapping[str, Any]) -> list[Any]:
    if not kwargs:
        return list(args)
    full: list[Any] = list(args) + [_MISSING] * max(0, len(params) - len(args))
    for key, value in kwargs.items():
        if key not in params:
            raise KilnError(f"{name}: no parameter named {key!r}; parameters: "
                            f"{', '.join(params)}")
        k = params.index(key)
        if full[k] is not _MISSING:
            raise KilnError(f"{name}: parameter {key!r} given twice")
        full[k] = value
    missing = [p for p, v in zip(params, full) if v is _MISSING]
    if missing:
        raise KilnError(f"{name}: missing argument(s) {', '.join(missing)}")
    return full


_MISSING = object()


def _scalar_arg(where: str, p: t.Var, a: Any) -> Any:
    dtype = p.dtype
    if dtype == "bool":
        if not isinstance(a, (bool, np.bool_)):
            raise KilnError(f"{where}: expected a bool scalar, got {type(a).__name__}")
        return bool(a)
    if dt.is_int(dtype):
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)):
            raise KilnError(f"{where}: expected an integer scalar ({dtype}), got "
                            f"{type(a).__name__}")
        lo, hi = _int_range(dtype)
        if not lo <= int(a) <= hi:
            raise KilnError(f"{where}: {int(a)} does not fit {dtype}")
        return int(a)
    if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, float, np.integer,
                                                             np.floating)):
        raise KilnError(f"{where}: expected a float scalar ({dtype}), got {type(a).__name__}")
    if dtype == "float16":
        return _round16(a)
    if dtype == "bfloat16":
        return _round_bf16(a)
    return _carrier(dtype)(a)


def _prepare_args(name: str, fn: t.PrimFunc, args: Sequence[Any]) -> list[Any]:
    params = fn.params
    if len(args) != len(params):
        names = ", ".join(p.name for p in params)
        raise KilnError(f"{name}: expected {len(params)} arguments ({names}), got {len(args)}")
    flat: list[Any] = []
    for k, (p, a) in enumerate(zip(params, args)):
        where = f"{name}: argument {k} '{p.name}'"
        if isinstance(p, t.Var):
            flat.append(_scalar_arg(where, p, a))
            continue
        want = _np_dtype(p.dtype)
        if not isinstance(a, np.ndarray):
            raise KilnError(f"{where}: expected a numpy array of shape {tuple(p.shape)} and "
                            f"dtype {p.dtype}, got {type(a).__name__}")
        if a.dtype != want:
            raise KilnError(f"{where}: expected dtype {p.dtype}, got {a.dtype}")
        if a.ndim != len(p.shape) or any(isinstance(d, int) and d != n
                                         for d, n in zip(p.shape, a.shape)):
            raise KilnError(f"{where}: expected shape {_shape_text(p.shape)}, got {a.shape}")
        if not a.flags.c_contiguous:
            raise KilnError(f"{where}: expected a contiguous array (use np.ascontiguousarray)")
        flat.append(a)
    return flat


def _shape_text(shape: Sequence[Any]) -> str:
    items = [str(d) if isinstance(d, int) else _text(d) for d in shape]
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def _text(node: object) -> str:
    from kiln.ir._printer import Printer

    return Printer().node(node)


class _Runtime:
    """What compiled code calls back into: other PrimFuncs of the module."""

    def __init__(self, mod: IRModule) -> None:
        self.mod = mod

    def call(self, callee: str, args: tuple[Any, ...]) -> None:
        if callee not in self.mod:
            raise _Fault(f"CallFunc to missing function '{callee}'")
        fn = self.mod[callee]
        if not isinstance(fn, t.PrimFunc):
            raise _Fault(f"CallFunc to '{callee}', which is not a PrimFunc")
        if len(args) != len(fn.params):
            raise _Fault(f"CallFunc to '{callee}' with {len(args)} arguments; it takes "
                         f"{len(fn.params)}")
        for p, a in zip(fn.params, args):
            if isinstance(p, t.Buffer) != isinstance(a, np.ndarray):
                raise _Fault(f"CallFunc to '{callee}': argument for '{p.name}' has the wrong "
                             "kind (buffer vs scalar)")
        _compile(fn, callee).run(self, *_prepare_args(callee, fn, args))


def _run_prim(mod: IRModule, name: str, fn: t.PrimFunc, args: Sequence[Any]) -> None:
    compiled = _compile(fn, name)
    prepared = _prepare_args(name, fn, args)
    try:
        with np.errstate(all="ignore"):
            compiled.run(_Runtime(mod), *prepared)
    except _Fault as exc:
        raise KilnError(f"{name}: {exc}") from None
    except ZeroDivisionError:
        raise KilnError(f"{name}: integer division or remainder by zero") from None
    except ValueError as exc:
        if "read-only" in str(exc):
            raise KilnError(f"{name}: a store wrote to a read-only array ({exc}); pass "
                            "writable output arrays") from None
        raise


class _Shapes:
    """Values of the symbolic dimensions of graph types, bound from the values seen."""

    def __init__(self) -> None:
        self.values: dict[int, int] = {}
        self._keep: list[object] = []

    def match(self, ty: TensorType, shape: tuple[int, ...]) -> str | None:
        """Bind fresh dimension variables; return a complaint if `shape` does not fit."""
        if len(shape) != len(ty.shape):
            return f"expected {len(ty.shape)} dimensions {_shape_text(ty.shape)}, got {shape}"
        for d, n in zip(ty.shape, shape):
            if isinstance(d, t.Var) and id(d) not in self.values:
                self.values[id(d)] = n
                self._keep.append(d)
            elif self.dim(d) != n:
                return f"expected shape {self.text(ty)}, got {shape}"
        return None

    def dim(self, d: Any) -> int:
        return d if isinstance(d, int) else self.eval(d)

    def shape(self, ty: TensorType) -> tuple[int, ...]:
        return tuple(self.dim(d) for d in ty.shape)

    def text(self, ty: TensorType) -> str:
        dims = [str(d) if isinstance(d, int) else f"{_text(d)}={self.dim(d)}" for d in ty.shape]
        return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"

    def eval(self, e: t.PrimExpr) -> int:
        """Integer value of a dimension expression."""
        if isinstance(e, t.Const):
            return int(e.value)
        if isinstance(e, t.Var):
            if id(e) not in self.values:
                raise IRError(f"symbolic dimension '{e.name}' has no value here: no argument "
                              "or earlier result bound it")
            return self.values[id(e)]
        if isinstance(e, t.Cast):
            return self.eval(e.value)
        if isinstance(e, t.BinaryOp):
            a, b = self.eval(e.a), self.eval(e.b)
            ops: dict[str, Callable[[int, int], int]] = {
                "add": lambda x, y: x + y, "sub": lambda x, y: x - y,
                "mul": lambda x, y: x * y, "floordiv": lambda x, y: x // y,
                "floormod": lambda x, y: x % y, "div": _tdiv, "mod": _tmod,
                "min": min, "max": max,
            }
            if e.op in ops:
                try:
                    return ops[e.op](a, b)
                except ZeroDivisionError:
                    raise IRError(f"dimension {_text(e)} divides by zero") from None
        raise IRError(f"the interpreter cannot evaluate dimension {_text(e)}")


class _GraphRunner:
    def __init__(self, mod: IRModule) -> None:
        self.mod = mod
        self.shapes = _Shapes()

    def run(self, name: str, fn: g.Function, args: Sequence[Any]) -> Any:
        if len(args) != len(fn.params):
            names = ", ".join(p.name for p in fn.params)
            raise KilnError(f"{name}: expected {len(fn.params)} arguments ({names}), "
                            f"got {len(args)}")
        env: dict[int, Any] = {}
        keep: list[object] = []
        for k, (p, a) in enumerate(zip(fn.params, args)):
            env[id(p)] = self.check_arg(f"{name}: argument {k} '{p.name}'", p.var_type, a)
            keep.append(p)
        for b in fn.bindings:
            env[id(b.var)] = self.expr(name, b.value, env)
            keep.append(b.var)
        return _own(self.expr(name, fn.result, env))

    def expr(self, fname: str, e: g.Expr, env: dict[int, Any]) -> Any:
        if isinstance(e, g.Var):
            if id(e) not in env:
                raise IRError(f"{fname}: graph variable '{e.name}' is used before its "
                              "definition (run kiln.ir.verify)")
            return env[id(e)]
        if isinstance(e, g.Constant):
            return e.data
        if isinstance(e, g.Tuple):
            return tuple(self.expr(fname, f, env) for f in e.fields)
        if isinstance(e, g.TupleGetItem):
            value = self.expr(fname, e.tuple_value, env)
            if not isinstance(value, tuple) or not 0 <= e.index < len(value):
                raise IRError(f"{fname}: TupleGetItem index {e.index} does not fit the value")
            return value[e.index]
        if isinstance(e, g.CallTensor):
            return self.call_tensor(fname, e, [self.expr(fname, a, env) for a in e.args])
        if isinstance(e, g.Call):
            return self.call_op(fname, e, [self.expr(fname, a, env) for a in e.args])
        raise IRError(f"{fname}: the interpreter has no rule for {type(e).__name__}")

    def call_tensor(self, fname: str, e: g.CallTensor, args: list[Any]) -> Any:
        callee = self.mod[e.func]
        if not isinstance(callee, t.PrimFunc):
            raise IRError(f"{fname}: CallTensor target '{e.func}' is not a PrimFunc")
        outs = []
        for ty in e.out_types:
            shape = self.shapes.shape(ty)
            outs.append(_alloc(math.prod(shape), _np_dtype(ty.dtype)).reshape(shape))
        ins = [_contiguous(a) if isinstance(a, np.ndarray) else a for a in args]
        _run_prim(self.mod, e.func, callee, [*ins, *outs])
        return tuple(outs) if isinstance(e.ret_type, TupleType) else outs[0]

    def call_op(self, fname: str, e: g.Call, args: list[Any]) -> Any:
        reference = _op_reference(e.op)
        try:
            result = reference(*args, **dict(e.attrs))
        except (IRError, KilnError):
            raise
        except Exception as exc:
            raise KilnError(f"{fname}: the reference of operator '{e.op}' failed: "
                            f"{type(exc).__name__}: {exc}") from exc
        return self.conform(f"{fname}: operator '{e.op}'", e.ret_type, result)

    def check_arg(self, where: str, ty: Type, value: Any) -> Any:
        """Check a graph argument against its declared type."""
        if isinstance(ty, TupleType):
            if not isinstance(value, (tuple, list)) or len(value) != len(ty.fields):
                raise KilnError(f"{where}: expected a tuple of {len(ty.fields)} arrays")
            return tuple(self.check_arg(f"{where}[{i}]", f, v)
                         for i, (f, v) in enumerate(zip(ty.fields, value)))
        if not isinstance(value, np.ndarray):
            raise KilnError(f"{where}: expected a numpy array of shape {_shape_text(ty.shape)} "
                            f"and dtype {ty.dtype}, got {type(value).__name__}")
        if value.dtype != _np_dtype(ty.dtype):
            raise KilnError(f"{where}: expected dtype {ty.dtype}, got {value.dtype}")
        complaint = self.shapes.match(ty, value.shape)
        if complaint:
            raise KilnError(f"{where}: {complaint}")
        return value

    def conform(self, where: str, ty: Type, value: Any) -> Any:
        """Check an operator reference's result against the call's type."""
        if isinstance(ty, TupleType):
            if not isinstance(value, (tuple, list)) or len(value) != len(ty.fields):
                raise IRError(f"{where}: reference returned {type(value).__name__}, expected "
                              f"a tuple of {len(ty.fields)}")
            return tuple(self.conform(where, f, v) for f, v in zip(ty.fields, value))
        arr = np.asarray(value)
        want = _np_dtype(ty.dtype)
        complaint = self.shapes.match(ty, arr.shape)
        if complaint:
            raise IRError(f"{where}: the reference result does not fit the call's type {ty}: "
                          f"{complaint}")
        if arr.dtype != want:
            if not np.can_cast(arr.dtype, want, "same_kind"):
                raise IRError(f"{where}: reference returned dtype {arr.dtype}, but the call's "
                              f"type is {ty}")
            arr = arr.astype(want)
        return _contiguous(arr)


def _op_reference(op: str) -> Callable[..., Any]:
    legalize = f"operator '{op}' has no reference implementation; legalize it first"
    try:
        import kiln.ops as ops
    except ImportError:
        raise IRError(legalize) from None
    get_op = getattr(ops, "get_op", None)
    if get_op is None:
        raise IRError(legalize)
    try:
        spec = get_op(op)
    except Exception as exc:  # the registry's message names the op and the known ones
        raise IRError(str(exc) if op in str(exc) else f"unknown operator '{op}': {exc}") \
            from None
    reference = getattr(spec, "reference", None)
    if reference is None:
        raise IRError(legalize)
    return reference


def _contiguous(a: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns 0-d arrays into shape (1,).
    return a if a.flags.c_contiguous else np.array(a, order="C")


def _own(value: Any) -> Any:
    """Results the caller may modify: copy read-only arrays (constants)."""
    if isinstance(value, tuple):
        return tuple(_own(v) for v in value)
    if isinstance(value, np.ndarray) and not value.flags.writeable:
        return value.copy()
    return value


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
  Integer division or remainder by zero is an error (CallError).
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
- `Reinterpret`: the value's bits read as another dtype of the same width (numpy's
  `.view`): float32 <-> int32/uint32, float64 <-> int64/uint64; NaN payloads are
  kept.
Intrinsics and externs
- float32 intrinsics are computed in float64 and rounded to float32 (libm's
  `expf` & co. may differ by 1 ulp); exact ones (sqrt, floor, ceil, trunc,
  round = `np.rint` half to even, abs, fmod) are exact. `rsqrt(x) = 1 / sqrt(x)`,
  `sigmoid(x) = 1 / (1 + exp(-x))`, each step in the dtype. `erf` uses math.erf.
  `abs` also accepts integers (abs(INT_MIN) wraps to INT_MIN). `dot4_u8s8` is
  exact integer arithmetic wrapped to int32 (`dot4_u8s8_sat16` clamps its two pair
  sums to int16 first; `dot2_i16` multiplies signed 16-bit halves). `dot2_bf16`
  adds two exact bfloat16 products in float32; `bf16_pair` rounds two float32 values
  to bfloat16 (ties to even, a NaN 0x7FC0) into one int32 word, subnormals kept.
- `CallExtern` supports the libm functions in `EXTERN_REFERENCES` (expf, exp,
  logf, sqrtf, tanhf, erff, fabsf, powf, ... and their double versions) on
  scalars, and memcpy / memmove / memset on buffers (their pointer result reads
  as 0); `register_extern_reference` adds more. Others raise IRError.
- `CallFunc` runs the callee on the caller's buffers (checked like arguments).
- Graph `Call`s run the operator's numpy reference, found by the interpreter's op
  resolver (`Interpreter(ops=...)`: a callable from an operator name to an object
  with `reference(*arrays, **attrs)`); the result must fit the call's type. The
  str entries of the tuple attributes the object lists in `dim_text_attrs` are
  dimension texts (the reshape target's new symbolic sizes): the reference gets
  their values for the variables bound by the call's arguments.
  `kiln.ir` knows no operators: `kiln.evaluate` is this interpreter with kiln's
  own (`kiln.ops.get_op`); plain `evaluate` runs graph functions without Calls.
Shapes
- A buffer parameter's dimension may be symbolic: a fresh Var is bound from the
  argument's shape; any other expression (of scalar parameters and bound shape
  vars) is checked against it. Graph types bind their dimension Vars the same way
  and compute their expressions as every compiled entry does (`kiln.dim_expr`:
  int64, a size that overflows, divides by zero or is negative is a CallError).
Memory
- Every access is bounds-checked per dimension (a fault is a CallError naming
  the buffer), except where the interpreter proves the index in range.
- `Allocate` memory starts poisoned (floats NaN, integers 0xA5 bytes, bool True)
  so reading it before writing shows up as a wrong answer, not a lucky zero.
  Graph-level outputs of `CallTensor` are poisoned the same way.
- `AllocConst` buffers are read-only; `DeclBuffer` is a byte view of its source.
- Loop kinds (parallel, vectorized, unrolled) run serially, in order.

Speed: each PrimFunc is compiled once into Python source (loops over Python
ints and numpy scalars, ranges of index expressions tracked to skip wrapping and
bounds checks) and cached; `python_source(func)` shows that source.
The compiler is `kiln.ir._interp_compiler`, the helpers the compiled code
calls `kiln.ir._interp_runtime`, the extern table `kiln.ir._interp_externs`;
this module checks arguments and runs graph functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln import dim_expr
from kiln.errors import CallError, IRError
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir._interp_compiler import compile_primfunc
from kiln.ir._interp_externs import (
    EXTERN_REFERENCES,
    ExternReference,
    register_extern_reference,
)
from kiln.ir._interp_runtime import (
    Fault,
    alloc,
    float_carrier,
    int_range,
    ir_text,
    np_dtype,
    round16,
    round_bf16,
)
from kiln.ir.attrs import ATTR_ARG_DIMS, ATTR_BINDS_DIMS
from kiln.ir.kernel_errors import ERROR_LOOP_SCAN, KERNEL_ERRORS
from kiln.ir.module import IRModule
from kiln.ir.shape_expr import dim_vars, to_dim_expr
from kiln.ir.types import TensorType, TupleType, Type

__all__ = [
    "EXTERN_REFERENCES", "ExternReference", "Interpreter", "OpResolver", "evaluate",
    "python_source", "register_extern_reference",
]

#: Operator name -> an object whose `reference(*arrays, **attrs)` computes the op.
OpResolver = Callable[[str], Any]

# --------------------------------------------------------------------------- public API


@dataclass(frozen=True)
class Interpreter:
    """The reference interpreter, with the op resolver graph-level `Call`s use.

        Interpreter(ops=kiln.ops.get_op)(mod, "main", x)   # what kiln.evaluate does

    Without `ops` a graph `Call` is an error that says where to find one.
    """

    ops: OpResolver | None = None

    def __call__(self, mod: IRModule, name: str, *args: Any, **kwargs: Any) -> Any:
        """Run function `name` of `mod` (see `evaluate`)."""
        return _evaluate(mod, name, args, kwargs, self.ops)


def evaluate(mod: IRModule, name: str, *args: Any, **kwargs: Any) -> Any:
    """Run function `name` of `mod` with the reference semantics (module docstring).

    PrimFunc: `args` are numpy arrays (checked against the parameters' shapes and
    dtypes; outputs are written in place) and Python scalars; returns None.
    Graph Function: `args` are numpy arrays (tuples for tuple parameters);
    returns an array, or a tuple for a tuple result. Keyword arguments name
    parameters by their name hint. Operator `Call`s need an op resolver: use
    `kiln.evaluate` (kiln's operators) or `Interpreter(ops=...)`.
    """
    return _evaluate(mod, name, args, kwargs, None)


def _evaluate(mod: IRModule, name: str, args: Sequence[Any], kwargs: dict[str, Any],
              ops: OpResolver | None) -> Any:
    if not isinstance(mod, IRModule):
        raise IRError(f"evaluate expects an IRModule, got {type(mod).__name__}")
    fn = mod[name]
    full = _merge_kwargs(name, [p.name for p in fn.params], args, kwargs)
    if isinstance(fn, t.PrimFunc):
        _run_prim(mod, name, fn, full)
        return None
    return _GraphRunner(mod, ops).run(name, fn, full)


def python_source(func: t.PrimFunc, name: str = "func") -> str:
    """The Python source the interpreter compiles `func` into (for debugging)."""
    return compile_primfunc(func, name).source



# --------------------------------------------------------------------------- running


def _merge_kwargs(name: str, params: list[str], args: Sequence[Any],
                  kwargs: Mapping[str, Any]) -> list[Any]:
    if not kwargs:
        return list(args)
    full: list[Any] = list(args) + [_MISSING] * max(0, len(params) - len(args))
    for key, value in kwargs.items():
        if key not in params:
            raise CallError(f"{name}: no parameter named {key!r}; parameters: "
                            f"{', '.join(params)}")
        k = params.index(key)
        if full[k] is not _MISSING:
            raise CallError(f"{name}: parameter {key!r} given twice")
        full[k] = value
    missing = [p for p, v in zip(params, full) if v is _MISSING]
    if missing:
        raise CallError(f"{name}: missing argument(s) {', '.join(missing)}")
    return full


_MISSING = object()


def _scalar_arg(where: str, p: t.Var, a: Any) -> Any:
    dtype = p.dtype
    if dtype == "bool":
        if not isinstance(a, (bool, np.bool_)):
            raise CallError(f"{where}: expected a bool scalar, got {type(a).__name__}")
        return bool(a)
    if dt.is_int(dtype):
        if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, np.integer)):
            raise CallError(f"{where}: expected an integer scalar ({dtype}), got "
                            f"{type(a).__name__}")
        lo, hi = int_range(dtype)
        if not lo <= int(a) <= hi:
            raise CallError(f"{where}: {int(a)} does not fit {dtype}")
        return int(a)
    if isinstance(a, (bool, np.bool_)) or not isinstance(a, (int, float, np.integer,
                                                             np.floating)):
        raise CallError(f"{where}: expected a float scalar ({dtype}), got {type(a).__name__}")
    if dtype == "float16":
        return round16(a)
    if dtype == "bfloat16":
        return round_bf16(a)
    return float_carrier(dtype)(a)


def _prepare_args(name: str, fn: t.PrimFunc, args: Sequence[Any]) -> list[Any]:
    params = fn.params
    if len(args) != len(params):
        names = ", ".join(p.name for p in params)
        raise CallError(f"{name}: expected {len(params)} arguments ({names}), got {len(args)}")
    flat: list[Any] = []
    for k, (p, a) in enumerate(zip(params, args)):
        where = f"{name}: argument {k} '{p.name}'"
        if isinstance(p, t.Var):
            flat.append(_scalar_arg(where, p, a))
            continue
        want = np_dtype(p.dtype)
        if not isinstance(a, np.ndarray):
            raise CallError(f"{where}: expected a numpy array of shape {tuple(p.shape)} and "
                            f"dtype {p.dtype}, got {type(a).__name__}")
        if a.dtype != want:
            raise CallError(f"{where}: expected dtype {p.dtype}, got {a.dtype}")
        if a.ndim != len(p.shape) or any(isinstance(d, int) and d != n
                                         for d, n in zip(p.shape, a.shape)):
            raise CallError(f"{where}: expected shape {_shape_text(p.shape)}, got {a.shape}")
        if not a.flags.c_contiguous:
            raise CallError(f"{where}: expected a contiguous array (use np.ascontiguousarray)")
        flat.append(a)
    return flat


def _shape_text(shape: Sequence[Any]) -> str:
    items = [str(d) if isinstance(d, int) else ir_text(d) for d in shape]
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"



class _Runtime:
    """What compiled code calls back into: other PrimFuncs of the module."""

    def __init__(self, mod: IRModule) -> None:
        self.mod = mod

    def call(self, callee: str, args: tuple[Any, ...]) -> None:
        if callee not in self.mod:
            raise Fault(f"CallFunc to missing function '{callee}'")
        fn = self.mod[callee]
        if not isinstance(fn, t.PrimFunc):
            raise Fault(f"CallFunc to '{callee}', which is not a PrimFunc")
        if len(args) != len(fn.params):
            raise Fault(f"CallFunc to '{callee}' with {len(args)} arguments; it takes "
                         f"{len(fn.params)}")
        for p, a in zip(fn.params, args):
            if isinstance(p, t.Buffer) != isinstance(a, np.ndarray):
                raise Fault(f"CallFunc to '{callee}': argument for '{p.name}' has the wrong "
                             "kind (buffer vs scalar)")
        compile_primfunc(fn, callee).run(self, *_prepare_args(callee, fn, args))


def _run_prim(mod: IRModule, name: str, fn: t.PrimFunc, args: Sequence[Any]) -> None:
    compiled = compile_primfunc(fn, name)
    prepared = _prepare_args(name, fn, args)
    try:
        with np.errstate(all="ignore"):
            compiled.run(_Runtime(mod), *prepared)
    except Fault as exc:
        raise CallError(f"{name}: {exc}") from None
    except ZeroDivisionError:
        raise CallError(f"{name}: integer division or remainder by zero") from None
    except ValueError as exc:
        if "read-only" in str(exc):
            raise CallError(f"{name}: a store wrote to a read-only array ({exc}); pass "
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

    def bind(self, var: t.Var, value: int) -> None:
        """Bind a data-dependent dimension to the value its kernel computed."""
        if id(var) not in self.values:
            self.values[id(var)] = value
            self._keep.append(var)

    def named(self) -> dict[str, int]:
        """The bound dimension variables' values, by name."""
        return {v.name: self.values[id(v)] for v in self._keep if isinstance(v, t.Var)}

    def by_name(self, fname: str, name: str) -> int:
        """The value of the bound dimension variable called `name`."""
        for v in self._keep:
            if isinstance(v, t.Var) and v.name == name:
                return self.values[id(v)]
        raise IRError(f"{fname}: a kernel takes dimension '{name}', which no argument of "
                      "the caller bound")

    def shape(self, ty: TensorType) -> tuple[int, ...]:
        return tuple(self.dim(d) for d in ty.shape)

    def text(self, ty: TensorType) -> str:
        dims = [str(d) if isinstance(d, int) else f"{ir_text(d)}={self.dim(d)}" for d in ty.shape]
        return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"

    def eval(self, e: t.PrimExpr) -> int:
        """The size a dimension expression has for the bound variables, computed as
        every other user of the dimension language does (`kiln.dim_expr.evaluate_size`)."""
        values: dict[str, int] = {}
        for v in dim_vars(e):
            if id(v) not in self.values:
                raise IRError(f"symbolic dimension '{v.name}' has no value here: no argument "
                              "or earlier result bound it")
            values[v.name] = self.values[id(v)]
        return dim_expr.evaluate_size(to_dim_expr(e), values)


class _GraphRunner:
    def __init__(self, mod: IRModule, ops: OpResolver | None) -> None:
        self.mod = mod
        self.ops = ops
        self.shapes = _Shapes()

    def run(self, name: str, fn: g.Function, args: Sequence[Any]) -> Any:
        if len(args) != len(fn.params):
            names = ", ".join(p.name for p in fn.params)
            raise CallError(f"{name}: expected {len(fn.params)} arguments ({names}), "
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
        rule = _GRAPH_RULES.get(type(e))
        if rule is None:
            raise IRError(f"{fname}: the interpreter has no rule for {type(e).__name__}")
        return rule(self, fname, e, env)

    def var(self, fname: str, e: g.Var, env: dict[int, Any]) -> Any:
        if id(e) not in env:
            raise IRError(f"{fname}: graph variable '{e.name}' is used before its "
                          "definition (run kiln.ir.verify)")
        return env[id(e)]

    def constant(self, fname: str, e: g.Constant, env: dict[int, Any]) -> Any:
        return e.data

    def tuple_(self, fname: str, e: g.Tuple, env: dict[int, Any]) -> Any:
        return tuple(self.expr(fname, f, env) for f in e.fields)

    def get_item(self, fname: str, e: g.TupleGetItem, env: dict[int, Any]) -> Any:
        value = self.expr(fname, e.tuple_value, env)
        if not isinstance(value, tuple) or not 0 <= e.index < len(value):
            raise IRError(f"{fname}: TupleGetItem index {e.index} does not fit the value")
        return value[e.index]

    def call_tensor_expr(self, fname: str, e: g.CallTensor, env: dict[int, Any]) -> Any:
        return self.call_tensor(fname, e, [self.expr(fname, a, env) for a in e.args])

    def call_op_expr(self, fname: str, e: g.Call, env: dict[int, Any]) -> Any:
        return self.call_op(fname, e, [self.expr(fname, a, env) for a in e.args])

    def graph_call(self, fname: str, callee: str, args: list[Any]) -> Any:
        """Run graph function `callee` of the module (an If branch, a Loop body)."""
        fn = self.mod.functions.get(callee)
        if not isinstance(fn, g.Function):
            raise IRError(f"{fname}: control flow calls '{callee}', which is not a graph "
                          "function of the module (run kiln.ir.verify)")
        return _GraphRunner(self.mod, self.ops).run(callee, fn, args)

    def if_expr(self, fname: str, e: g.If, env: dict[int, Any]) -> Any:
        cond = self.expr(fname, e.cond, env)
        branch = e.then_branch if bool(np.asarray(cond).reshape(())) else e.else_branch
        result = self.graph_call(fname, branch, [self.expr(fname, a, env) for a in e.args])
        return self.conform(f"{fname}: if branch '{branch}'", e.ret_type, result)

    def loop(self, fname: str, e: g.Loop, env: dict[int, Any]) -> Any:
        """ONNX Loop: run the body while `i < trip_count` (if given) and `cond` holds."""
        trip = (None if e.trip_count is None
                else int(np.asarray(self.expr(fname, e.trip_count, env)).reshape(())))
        cond = (True if e.cond is None
                else bool(np.asarray(self.expr(fname, e.cond, env)).reshape(())))
        states = [self.expr(fname, s, env) for s in e.states]
        captures = [self.expr(fname, c, env) for c in e.captures]
        scans: list[list[Any]] = [[] for _ in range(e.num_scan_outputs)]
        i = 0
        while (trip is None or i < trip) and cond:
            out = self.graph_call(fname, e.body, [np.array(i, np.int64), np.array(cond),
                                                  *states, *captures])
            if not isinstance(out, tuple) or len(out) != 1 + len(states) + len(scans):
                raise IRError(f"{fname}: loop body '{e.body}' must return (cond, "
                              f"{len(states)} state(s), {len(scans)} scan value(s))")
            cond = bool(np.asarray(out[0]).reshape(()))
            states = list(out[1:1 + len(states)])
            for acc, v in zip(scans, out[1 + len(states):]):
                acc.append(v)
            i += 1
        fields = e.ret_type.fields
        for k in range(len(scans)):
            length = fields[len(states) + k]
            assert isinstance(length, TensorType)
            if self.shapes.dim(length.shape[0]) != i:  # what the compiled check reports
                raise CallError(f"{fname}: {KERNEL_ERRORS[ERROR_LOOP_SCAN]} ({i} iterations, "
                                f"{self.shapes.dim(length.shape[0])} slices)")
        stacked = []
        for k, acc in enumerate(scans):
            ty = fields[len(states) + k]
            assert isinstance(ty, TensorType)
            stacked.append(np.stack(acc) if acc else
                           np.zeros((0, *self.shapes.shape(ty)[1:]), np_dtype(ty.dtype)))
        return self.conform(f"{fname}: loop '{e.body}'", e.ret_type, (*states, *stacked))

    def call_tensor(self, fname: str, e: g.CallTensor, args: list[Any]) -> Any:
        callee = self.mod[e.func]
        if not isinstance(callee, t.PrimFunc):
            raise IRError(f"{fname}: CallTensor target '{e.func}' is not a PrimFunc")
        binds = callee.attrs.get(ATTR_BINDS_DIMS)
        if binds:
            return self.call_binding(fname, e, callee, args, binds)
        outs = []
        for ty in e.out_types:
            shape = self.shapes.shape(ty)
            outs.append(alloc(math.prod(shape), np_dtype(ty.dtype)).reshape(shape))
        ins = [_contiguous(a) if isinstance(a, np.ndarray) else a for a in args]
        # A kernel with symbolic shapes takes its dimensions as trailing int64 scalars,
        # named as the caller's dimension variables, or sizes of its arguments
        # (`ATTR_ARG_DIMS`) (docs/ir.md).
        of_args = {name: (param, axis) for name, param, axis
                   in callee.attrs.get(ATTR_ARG_DIMS, ())}
        buffers = [*ins, *outs]
        dims = [int(np.shape(buffers[of_args[p.name][0]])[of_args[p.name][1]])
                if p.name in of_args else self.shapes.by_name(fname, p.name)
                for p in callee.params[len(ins) + len(outs):] if isinstance(p, t.Var)]
        _run_prim(self.mod, e.func, callee, [*ins, *outs, *dims])
        return tuple(outs) if isinstance(e.ret_type, TupleType) else outs[0]

    def call_binding(self, fname: str, e: g.CallTensor, callee: t.PrimFunc, args: list[Any],
                     binds: Any) -> Any:
        """A kernel binding data-dependent dimensions (`kiln.binds_dims`): flat outputs at
        the bound, one int64[1] count per dimension; the results are their first elements
        at the actual shapes, and the dimensions are bound for later calls."""
        ins = [_contiguous(a) if isinstance(a, np.ndarray) else a for a in args]
        values = self.shapes.named()
        flats: list[np.ndarray] = []
        outs_params = callee.params[len(ins):len(ins) + len(e.out_types)]
        for p in outs_params:
            assert isinstance(p, t.Buffer)
            size = dim_expr.evaluate_size(to_dim_expr(p.shape[0]), values)
            flats.append(alloc(size, np_dtype(p.dtype)))
        counts = [np.zeros(1, np.int64) for _ in binds]
        dims = [self.shapes.by_name(fname, p.name)
                for p in callee.params[len(ins) + len(flats) + len(counts):]
                if isinstance(p, t.Var)]
        _run_prim(self.mod, e.func, callee, [*ins, *flats, *counts, *dims])
        bound_now = {str(name): int(c[0]) for (name, _), c in zip(binds, counts)}
        outs = []
        for ty, flat in zip(e.out_types, flats):
            for d in ty.shape:
                if isinstance(d, t.Var) and d.name in bound_now:
                    self.shapes.bind(d, bound_now[d.name])
            shape = self.shapes.shape(ty)
            outs.append(flat[:math.prod(shape)].reshape(shape))
        return tuple(outs) if isinstance(e.ret_type, TupleType) else outs[0]

    def call_op(self, fname: str, e: g.Call, args: list[Any]) -> Any:
        reference, text_attrs = _op_reference(e.op, self.ops)
        attrs: dict[str, Any] = dict(e.attrs)
        for key in text_attrs:  # dimension texts become the sizes bound now
            value = attrs.get(key)
            if isinstance(value, tuple):
                attrs[key] = tuple(self.dim_text_value(fname, d) if isinstance(d, str) else d
                                   for d in value)
        try:
            result = reference(*args, **attrs)
        except (IRError, CallError):
            raise
        except Exception as exc:
            raise CallError(f"{fname}: the reference of operator '{e.op}' failed: "
                            f"{type(exc).__name__}: {exc}") from exc
        return self.conform(f"{fname}: operator '{e.op}'", e.ret_type, result)

    def dim_text_value(self, fname: str, text: str) -> int:
        """The value of the dimension text `text` (kiln.dim_expr) for the bound variables."""
        expr = dim_expr.parse(text)
        values = {v: self.shapes.by_name(fname, v) for v in sorted(dim_expr.variables(expr))}
        return dim_expr.evaluate_size(expr, values)

    def check_arg(self, where: str, ty: Type, value: Any) -> Any:
        """Check a graph argument against its declared type."""
        if isinstance(ty, TupleType):
            if not isinstance(value, (tuple, list)) or len(value) != len(ty.fields):
                raise CallError(f"{where}: expected a tuple of {len(ty.fields)} arrays")
            return tuple(self.check_arg(f"{where}[{i}]", f, v)
                         for i, (f, v) in enumerate(zip(ty.fields, value)))
        if not isinstance(value, np.ndarray):
            raise CallError(f"{where}: expected a numpy array of shape {_shape_text(ty.shape)} "
                            f"and dtype {ty.dtype}, got {type(value).__name__}")
        if value.dtype != np_dtype(ty.dtype):
            raise CallError(f"{where}: expected dtype {ty.dtype}, got {value.dtype}")
        complaint = self.shapes.match(ty, value.shape)
        if complaint:
            raise CallError(f"{where}: {complaint}")
        return value

    def conform(self, where: str, ty: Type, value: Any) -> Any:
        """Check an operator reference's result against the call's type."""
        if isinstance(ty, TupleType):
            if not isinstance(value, (tuple, list)) or len(value) != len(ty.fields):
                raise IRError(f"{where}: reference returned {type(value).__name__}, expected "
                              f"a tuple of {len(ty.fields)}")
            return tuple(self.conform(where, f, v) for f, v in zip(ty.fields, value))
        arr = np.asarray(value)
        want = np_dtype(ty.dtype)
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


# Graph interpreter dispatch table: expression type -> the method that evaluates it.
_GRAPH_RULES: dict[type, Callable[[_GraphRunner, str, Any, dict[int, Any]], Any]] = {
    g.Var: _GraphRunner.var,
    g.Constant: _GraphRunner.constant,
    g.Tuple: _GraphRunner.tuple_,
    g.TupleGetItem: _GraphRunner.get_item,
    g.CallTensor: _GraphRunner.call_tensor_expr,
    g.Call: _GraphRunner.call_op_expr,
    g.If: _GraphRunner.if_expr,
    g.Loop: _GraphRunner.loop,
}


def _op_reference(op: str, ops: OpResolver | None) -> tuple[Callable[..., Any], tuple[str, ...]]:
    """The op's reference, and the names of its attributes whose tuple entries may be
    dimension texts (`dim_text_attrs`: the reshape target's new symbolic sizes)."""
    if ops is None:
        raise IRError(f"operator '{op}': this interpreter has no op resolver; run the module "
                      "with kiln.evaluate (kiln's operators) or Interpreter(ops=...), or "
                      "legalize the calls first")
    legalize = f"operator '{op}' has no reference implementation; legalize it first"
    try:
        spec = ops(op)
    except Exception as exc:  # the registry's message names the op and the known ones
        raise IRError(str(exc) if op in str(exc) else f"unknown operator '{op}': {exc}") \
            from None
    reference = getattr(spec, "reference", None)
    if reference is None:
        raise IRError(legalize)
    return reference, tuple(getattr(spec, "dim_text_attrs", ()))


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


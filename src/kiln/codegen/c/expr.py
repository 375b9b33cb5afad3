"""Expressions to C: a dispatch table from IR node type to an emit function.

Each emit function returns a `CExpr`: the text, its C precedence (so the
printer adds only the parentheses C or `-Wparentheses` needs) and whether the
text already has the C type of its dtype (a plain literal like `3` is `int`,
narrower than `int64_t`; see `typed`).

Semantics follow the IR interpreter:
- integer arithmetic wraps (the kernels are compiled with `-fwrapv`; results of
  8- and 16-bit types are cast back to their type after C's promotion to int);
- float16 / bfloat16 are storage types: values compute in float and are rounded
  to the 16-bit type only by a Store or a Cast;
- `div` is `/` (C truncation on integers), `mod` is `%` / `fmod`, `floordiv` and
  `floormod` round toward negative infinity (helpers), min/max propagate NaN;
- integer `div`/`mod`/`floordiv`/`floormod` never trap: unless the divisor is a
  constant other than 0 and -1 they call helpers where a zero divisor gives 0
  and `INT_MIN / -1` gives INT_MIN (the llvm backend's rule, docs/codegen-llvm.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kiln.codegen.c.context import FuncContext, value_ctype
from kiln.codegen.cfamily.helpers import suffix
from kiln.codegen.cfamily.literals import float_literal, int_literal, wrap_int
from kiln.codegen.naming import C_TYPE_NAMES, profile_symbol
from kiln.ir import dtype as dt
from kiln.ir.amx import is_amx_call
from kiln.ir.same_address import SAME_ADDRESS
from kiln.ir.tensor import (
    DOT4_INTRINSICS,
    PROFILE_INTRINSICS,
    BinaryOp,
    Buffer,
    CallExtern,
    Cast,
    Compare,
    Const,
    Intrin,
    Load,
    PrimExpr,
    Reinterpret,
    Select,
    UnaryOp,
    Var,
    reinterpret_fault,
)

# C precedence levels: higher binds tighter.
ATOM, UNARY, MUL, ADD, SHIFT, REL, EQ, BITAND, XOR, BITOR, LAND, LOR, COND = (
    16, 15, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3)


@dataclass(frozen=True)
class CExpr:
    """C text of an expression. `typed` is False for literals of C type `int`."""

    text: str
    prec: int = ATOM
    typed: bool = True
    # For a float16/bfloat16 result: the float value before rounding (storing
    # it converts straight to the bit pattern, which rounds the same way).
    unrounded: CExpr | None = None


def paren(e: CExpr, min_prec: int) -> str:
    """`e` as an operand needing precedence `min_prec`, parenthesised if looser."""
    return e.text if e.prec >= min_prec else f"({e.text})"


def operand(e: CExpr) -> str:
    """`e` as the operand of a unary operator or cast (never forming `--`)."""
    text = paren(e, UNARY)
    return f"({text})" if text.startswith(("-", "+")) else text


def call(fn: str, *args: CExpr) -> CExpr:
    return CExpr(f"{fn}({', '.join(a.text for a in args)})")


def cast(ctype: str, e: CExpr) -> CExpr:
    return CExpr(f"({ctype}){operand(e)}", UNARY)


# Infix operators: op -> (C token, precedence, min precedence of the left and right operand).
# Shift, bitwise and logical operators take only atoms/unary operands, which keeps
# gcc's -Wparentheses quiet and the code unambiguous to a reader.
_INFIX: dict[str, tuple[str, int, int, int]] = {
    "mul": ("*", MUL, MUL, UNARY), "div": ("/", MUL, MUL, UNARY), "mod": ("%", MUL, MUL, UNARY),
    "add": ("+", ADD, ADD, MUL), "sub": ("-", ADD, ADD, MUL),
    "shl": ("<<", SHIFT, UNARY, UNARY), "shr": (">>", SHIFT, UNARY, UNARY),
    "and": ("&", BITAND, UNARY, UNARY), "xor": ("^", XOR, UNARY, UNARY),
    "or": ("|", BITOR, UNARY, UNARY),
    "land": ("&&", LAND, UNARY, UNARY), "lor": ("||", LOR, UNARY, UNARY),
    "lt": ("<", REL, ADD, ADD), "le": ("<=", REL, ADD, ADD),
    "gt": (">", REL, ADD, ADD), "ge": (">=", REL, ADD, ADD),
    "eq": ("==", EQ, ADD, ADD), "ne": ("!=", EQ, ADD, ADD),
}


def infix(op: str, a: CExpr, b: CExpr, typed: bool = True) -> CExpr:
    token, prec, left, right = _INFIX[op]
    rhs = paren(b, right)
    if token in ("-", "+") and rhs.startswith(token):
        rhs = f"({rhs})"
    return CExpr(f"{paren(a, left)} {token} {rhs}", prec, typed)


# 8/16-bit results of these ops can leave the type's range after promotion to int.
_WRAPPING_OPS = frozenset({"add", "sub", "mul", "div", "floordiv", "pow", "neg", "not"})
# Integer dtypes a bare `int` literal is narrower than.
_WIDE = frozenset({"int64", "uint64", "uint32"})

# Intrinsic -> C function for double (float32 appends "f"); rsqrt/sigmoid/is* are special.
_MATH_FN = {
    "exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log", "log2": "log2",
    "log1p": "log1p", "sqrt": "sqrt", "sin": "sin", "cos": "cos", "tan": "tan", "tanh": "tanh",
    "sinh": "sinh", "cosh": "cosh", "asin": "asin", "acos": "acos", "atan": "atan",
    "asinh": "asinh", "acosh": "acosh", "atanh": "atanh", "erf": "erf", "abs": "fabs",
    "floor": "floor", "ceil": "ceil", "trunc": "trunc", "pow": "pow", "atan2": "atan2",
    "fmod": "fmod", "fma": "fma",
    # Half to even under the default rounding mode (kiln never changes the mode).
    "round": "rint",
}


def narrow(dtype: str) -> bool:
    return dt.is_int(dtype) and dt.bits(dtype) < 32


class ExprEmitter:
    """Emits the C text of expressions of one kernel."""

    def __init__(self, ctx: FuncContext) -> None:
        self.ctx = ctx
        self.helpers = ctx.module.helpers

    def emit(self, e: PrimExpr) -> CExpr:
        fn = _EMITTERS.get(type(e))
        if fn is None:
            raise self.ctx.error(f"the C backend cannot print expression {type(e).__name__} "
                                 f"{e!r:.80}")
        return fn(self, e)

    # ------------------------------------------------------------------ shared pieces

    def round16(self, dtype: str, e: CExpr) -> CExpr:
        """Round a float result back to float16 / bfloat16; other dtypes pass through."""
        if dtype == "float16":
            return replace(call(self.helpers.use("kiln_f16_round"), e), unrounded=e)
        if dtype == "bfloat16":
            return replace(call(self.helpers.use("kiln_bf16_round"), e), unrounded=e)
        return e

    def to_bits(self, dtype: str, e: CExpr) -> CExpr:
        """The C value to store in a `dtype` element (16-bit floats: their bit pattern)."""
        if dtype in ("float16", "bfloat16") and e.unrounded is not None:
            e = e.unrounded
        if dtype == "float16":
            return call(self.helpers.use("kiln_f16_from_double"), e)
        if dtype == "bfloat16":
            return call(self.helpers.use("kiln_bf16_from_double"), e)
        return e

    def from_bits(self, dtype: str, e: CExpr) -> CExpr:
        """The value of a `dtype` element (16-bit floats: decoded to float)."""
        if dtype == "float16":
            return call(self.helpers.use("kiln_f16_to_float"), e)
        if dtype == "bfloat16":
            return call(self.helpers.use("kiln_bf16_to_float"), e)
        return e

    def wrap(self, dtype: str, op: str, e: CExpr) -> CExpr:
        """Cast a promoted 8/16-bit result of `op` back to `dtype`'s C type."""
        if narrow(dtype) and op in _WRAPPING_OPS:
            return cast(C_TYPE_NAMES[dtype], e)
        return e

    def typed_pair(self, dtype: str, a: CExpr, b: CExpr) -> tuple[CExpr, CExpr]:
        """Cast `a` when neither operand has the C type of a wide dtype (`2 * 3` is int)."""
        if dtype in _WIDE and not a.typed and not b.typed:
            a = cast(C_TYPE_NAMES[dtype], a)
        return a, b

    def index(self, buf: Buffer, indices: tuple[PrimExpr, ...]) -> str:
        """The row-major flat element offset of `indices`, in int64_t arithmetic."""
        if len(indices) != buf.ndim:
            raise self.ctx.error(f"buffer '{buf.name}' has {buf.ndim} dimensions but is "
                                 f"indexed with {len(indices)}")
        if any(not isinstance(d, int) for d in buf.shape):
            # Dims are int64 scalars of the kernel: the row-major offset as one expression.
            flat: PrimExpr = Const(0, "int64")
            for idx, d in zip(indices, buf.shape):
                flat = flat * d + (idx if idx.dtype == "int64" else Cast("int64", idx))
            return cast("int64_t", self.emit(flat)).text
        terms: list[str] = []
        offset = 0
        for idx, stride in zip(indices, buf.strides()):
            if isinstance(idx, Const) and dt.is_int(idx.dtype):
                offset += int(idx.value) * stride
                continue
            e = self.emit(idx)
            if idx.dtype != "int64" or not e.typed:
                e = cast("int64_t", e)
            if stride == 1:
                terms.append(paren(e, ADD if not terms else MUL))
            else:
                terms.append(f"{paren(e, MUL)} * {int_literal(stride, 'int64')[0]}")
        text = " + ".join(terms)
        if not terms:
            return int_literal(offset, "int64")[0]
        if offset > 0:
            text += f" + {int_literal(offset, 'int64')[0]}"
        elif offset < 0:
            text += f" - {int_literal(-offset, 'int64')[0]}"
        return text

    # ------------------------------------------------------------------ leaves

    def var(self, e: Var) -> CExpr:
        return CExpr(self.ctx.var_name(e))

    def const(self, e: Const) -> CExpr:
        if dt.is_float(e.dtype):
            text = float_literal(float(e.value), e.dtype)
            return CExpr(text, UNARY if text.startswith("-") else ATOM)
        text, typed = int_literal(int(e.value), e.dtype)
        return CExpr(text, UNARY if text.startswith("-") else ATOM, typed)

    def load(self, e: Load) -> CExpr:
        ref = self.ctx.buffer(e.buffer)
        element = CExpr(f"{ref.name}[{self.index(e.buffer, e.indices)}]")
        return self.from_bits(e.buffer.dtype, element)

    # ------------------------------------------------------------------ operators

    def binary(self, e: BinaryOp) -> CExpr:
        a, b = self.emit(e.a), self.emit(e.b)
        d = e.dtype
        if e.b.dtype != d:
            raise self.ctx.error(f"{e.op}: operand dtypes differ ({d} vs {e.b.dtype})")
        if d == "bool":
            return self.bool_binary(e.op, a, b)
        if dt.is_float(d):
            return self.float_binary(e.op, a, b, d)
        safe = isinstance(e.b, Const) and wrap_int(int(e.b.value), d) not in (0, -1)
        return self.wrap(d, e.op, self.int_binary(e.op, a, b, d, safe_divisor=safe))

    def bool_binary(self, op: str, a: CExpr, b: CExpr) -> CExpr:
        # bools are 0 or 1: min is `and`, max is `or`.
        logical = {"and": "land", "min": "land", "or": "lor", "max": "lor"}
        if op in logical:
            return infix(logical[op], a, b)
        if op == "xor":
            return infix("ne", a, b)
        raise self.ctx.error(f"binary op '{op}' is not defined on bool; cast to an integer")

    def float_binary(self, op: str, a: CExpr, b: CExpr, d: str) -> CExpr:
        s = suffix(d)
        if op in ("add", "sub", "mul", "div"):
            return infix(op, a, b)
        if op in ("mod", "pow"):
            return call(("fmod" if op == "mod" else "pow") + ("f" if s == "f32" else ""), a, b)
        if op in ("floordiv", "floormod", "min", "max"):
            return call(self.helpers.use(f"kiln_{op}_{s}"), a, b)
        raise self.ctx.error(f"binary op '{op}' needs integer operands, got {d}")

    def int_binary(self, op: str, a: CExpr, b: CExpr, d: str, *,
                   safe_divisor: bool = False) -> CExpr:
        """`a op b` on integers; `safe_divisor`: b is a constant other than 0 and -1."""
        s = suffix(d)
        signed = dt.kind(d) == "int"
        if op == "shl" and (signed or narrow(d)):
            # Shift the bits unsigned: shifting into or out of a signed value's
            # sign bit is undefined in ISO C; the result wraps like the IR's.
            unsigned = "uint64_t" if dt.bits(d) == 64 else "uint32_t"
            return cast(C_TYPE_NAMES[d], infix("shl", cast(unsigned, a), b))
        if op in ("shl", "shr"):
            if not a.typed and d in _WIDE:
                a = cast(C_TYPE_NAMES[d], a)
            return infix(op, a, b)
        a, b = self.typed_pair(d, a, b)
        if op in ("floordiv", "floormod") and not signed:
            op = "div" if op == "floordiv" else "mod"
        if op in ("div", "mod") and safe_divisor:
            return infix(op, a, b, typed=a.typed or b.typed)
        if op in ("add", "sub", "mul", "and", "or", "xor"):
            return infix(op, a, b, typed=a.typed or b.typed)
        if op in ("div", "mod", "floordiv", "floormod", "min", "max", "pow"):
            # Integer division by 0 (or INT_MIN / -1) traps in C: guarded helpers.
            return call(self.helpers.use(f"kiln_{op}_{s}"), a, b)
        raise self.ctx.error(f"unknown binary op '{op}'")

    def compare(self, e: Compare) -> CExpr:
        a, b = self.emit(e.a), self.emit(e.b)
        if e.a.dtype != e.b.dtype:
            raise self.ctx.error(f"{e.op}: operand dtypes differ ({e.a.dtype} vs {e.b.dtype})")
        return infix(e.op, a, b)

    def unary(self, e: UnaryOp) -> CExpr:
        d = e.dtype
        a = self.emit(e.a)
        if e.op == "not":
            if d == "bool":
                return CExpr(f"!{operand(a)}", UNARY)
            if dt.is_float(d):
                raise self.ctx.error(f"'not' needs a bool or integer operand, got {d}")
            return self.wrap(d, "not", CExpr(f"~{operand(a)}", UNARY, a.typed))
        if d == "bool":
            raise self.ctx.error("'neg' is not defined on bool")
        return self.wrap(d, "neg", CExpr(f"-{operand(a)}", UNARY, a.typed))

    def select(self, e: Select) -> CExpr:
        if e.true_value.dtype != e.false_value.dtype:
            raise self.ctx.error(f"select: branch dtypes differ ({e.true_value.dtype} vs "
                                 f"{e.false_value.dtype})")
        c, t, f = self.emit(e.cond), self.emit(e.true_value), self.emit(e.false_value)
        if e.cond.dtype != "bool":
            c = infix("ne", c, CExpr("0"))
        return CExpr(f"{paren(c, EQ)} ? {paren(t, LOR)} : {paren(f, LOR)}", COND,
                     t.typed or f.typed)

    def cast_expr(self, e: Cast) -> CExpr:
        v = self.emit(e.value)
        src, dst = e.value.dtype, e.dtype
        if src == dst:
            return v
        if dst == "bool":
            return infix("ne", v, CExpr("0"))
        if dst == "float16":
            return self.round16(dst, v)  # rounds once, from any source type
        if dst == "bfloat16":
            # via float32, as the IR interpreter rounds (float64 rounds twice)
            return self.round16(dst, v if value_ctype(src) == "float" else cast("float", v))
        if src in ("float16", "bfloat16") and dst == "float32":
            return v  # already a float holding the exact value
        return cast(C_TYPE_NAMES[dst], v)

    def reinterpret(self, e: Reinterpret) -> CExpr:
        """A float's bits through the memcpy helpers (which compilers turn into a
        register move; a pointer cast would break strict aliasing); integers of equal
        width convert as a Cast does (modulo 2^n)."""
        src, dst = e.value.dtype, e.dtype
        fault = reinterpret_fault(src, dst)
        if fault is not None:
            raise self.ctx.error(fault)
        if not dt.is_float(src) and not dt.is_float(dst):
            return self.cast_expr(Cast(dst, e.value))
        width = dt.bits(src)
        v = self.emit(e.value)
        if dt.is_float(src):
            return cast(C_TYPE_NAMES[dst], call(self.helpers.use(f"kiln_f{width}_bits"), v))
        return call(self.helpers.use(f"kiln_f{width}_from_bits"), cast(f"uint{width}_t", v))

    # ------------------------------------------------------------------ calls

    def intrin(self, e: Intrin) -> CExpr:
        args = [self.emit(a) for a in e.args]
        d = e.args[0].dtype
        name = e.name
        if any(a.dtype != d for a in e.args):
            raise self.ctx.error(f"intrinsic {name}: argument dtypes differ "
                                 f"({', '.join(a.dtype for a in e.args)})")
        if name in PROFILE_INTRINSICS:  # host.c's timers (kiln.ir.profiling)
            return call(profile_symbol(self.ctx.module.prefix, name), *args)
        if name in DOT4_INTRINSICS:
            if d != "int32":
                raise self.ctx.error(f"intrinsic {name} takes int32 arguments, got {d}")
            return call(self.helpers.use(f"kiln_{name}"), *args)
        if not dt.is_float(d):
            return self.int_intrin(name, args, d)
        f32 = d != "float64"
        one = CExpr("1.0f" if f32 else "1.0")
        if name in ("isnan", "isinf"):
            return call(name, *args)
        if name == "rsqrt":
            result = infix("div", one, call("sqrtf" if f32 else "sqrt", args[0]))
        elif name == "sigmoid":
            exp = call("expf" if f32 else "exp", CExpr(f"-{operand(args[0])}", UNARY))
            result = infix("div", one, CExpr(f"{one.text} + {exp.text}", ADD))
        else:
            result = call(_MATH_FN[name] + ("f" if f32 else ""), *args)
        return result

    def int_intrin(self, name: str, args: list[CExpr], d: str) -> CExpr:
        if name in ("isnan", "isinf"):
            return CExpr("0")  # an integer is never NaN or infinite
        if name in ("floor", "ceil", "round", "trunc"):
            return args[0]
        if name == "abs":
            if dt.kind(d) == "uint":
                return args[0]
            return self.wrap(d, "neg", call(self.helpers.use(f"kiln_abs_{suffix(d)}"), *args))
        if name == "pow":
            return self.wrap(d, "pow", self.int_binary("pow", args[0], args[1], d))
        if name == "fmod":
            return self.int_binary("mod", args[0], args[1], d)
        raise self.ctx.error(f"intrinsic {name} needs a float argument, got {d}; "
                             "insert a Cast")

    def call_extern(self, e: CallExtern, *, discard: bool = False) -> CExpr:
        """The call; `discard` when its value is unused (Evaluate): the bare call."""
        ctx = self.ctx
        if e.name == SAME_ADDRESS:  # no function: the comparison (kiln.ir.same_address)
            lhs, rhs = (ctx.buffer(x).name for x in e.args if isinstance(x, Buffer))
            return CExpr(f"((int32_t)((const void*){lhs} == (const void*){rhs}))")
        if is_amx_call(e.name):
            raise ctx.error(f"{e.name}: the AMX tile calls (kiln.ir.amx) are defined by the "
                            "llvm backend only; build for kind 'llvm' (the c kind refuses "
                            "precision=bf16, which makes them)")
        proto = ctx.module.externs.add(e, f"C codegen of '{ctx.func_name}'")
        args: list[CExpr] = []
        for a in e.args:
            if isinstance(a, Buffer):
                ref = ctx.buffer(a)
                # An external function gets a mutable pointer, as its prototype says.
                args.append(cast(f"{C_TYPE_NAMES[a.dtype]}*", CExpr(ref.name)) if ref.const
                            else CExpr(ref.name))
            else:
                args.append(self.to_bits(a.dtype, self.emit(a)))
        result = call(e.name, *args)
        if discard:
            return result
        if proto.pointer_result:
            # memcpy & co. return their pointer argument; the IR reads it as 0.
            return CExpr(f"((void){result.text}, ({C_TYPE_NAMES[e.dtype]})0)")
        return self.from_bits(e.dtype, result)


def _table() -> dict[type, Callable[[ExprEmitter, Any], CExpr]]:
    return {
        Var: ExprEmitter.var,
        Const: ExprEmitter.const,
        Load: ExprEmitter.load,
        BinaryOp: ExprEmitter.binary,
        Compare: ExprEmitter.compare,
        UnaryOp: ExprEmitter.unary,
        Select: ExprEmitter.select,
        Cast: ExprEmitter.cast_expr,
        Reinterpret: ExprEmitter.reinterpret,
        Intrin: ExprEmitter.intrin,
        CallExtern: ExprEmitter.call_extern,
    }


_EMITTERS = _table()

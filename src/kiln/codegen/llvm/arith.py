"""Scalar semantics of kiln's operators, as LLVM instructions.

Every function here works on *compute* values (see `dtypes`): `i1` for bool,
`float` for the 16-bit floats. The rules are those of the IR interpreter
(kiln/ir/evaluate.py); where it leaves a case undefined (it raises), they follow
numpy, so no input traps or yields poison:

- integer `div`/`mod`/`floordiv`/`floormod` by zero give 0 (numpy's result);
  `INT_MIN / -1` wraps to INT_MIN;
- shifts by a negative amount or by >= the bit width give 0 (`shl`, unsigned
  `shr`) or the sign (`shr` of a signed value), as numpy's shifts do;
- float `floordiv`/`floormod` are `floor(a / b)` and `a - floor(a / b) * b`
  (kiln.ir.evaluate's definition; numpy's `npy_divmod` differs in rare cases
  such as 1.0 // 0.1);
- `min`/`max` return the first operand on ties (so min(-0.0, +0.0) is -0.0), as
  the interpreter does; a NaN operand gives NaN, like `np.minimum`/`np.maximum`
  (the interpreter and the c backend's helpers too; the NaN rules of ONNX operators
  are built on top of these in kiln/ops/nan_order.py);
- float `ne` is unordered (NaN != NaN is true), the other comparisons ordered;
- float -> int truncates toward zero; values outside the target type but within
  int64 wrap modulo 2**bits, beyond int64 they saturate, NaN gives 0;
- integer `pow` by a negative exponent gives 0 (1 and -1 keep their powers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from llvmlite import ir

from kiln.codegen.llvm.decls import intrinsic
from kiln.codegen.llvm.dtypes import F32, F64, I1, I64, compute_type, float_suffix, is_half
from kiln.codegen.llvm.float16 import HalfConversions
from kiln.errors import CompileError
from kiln.ir import dtype as dt


@dataclass
class MathContext:
    """What scalar emission needs to know about the module being built."""

    module: ir.Module
    halfs: HalfConversions
    # Fast-math flags put on float instructions (never nnan/ninf: isnan must work).
    fastmath: tuple[str, ...] = ()
    # Whether llvm.roundeven lowers to an instruction (else llvm.rint is used).
    native_roundeven: bool = True
    # The target's integer dot-product family (kiln.target.isa.ISA.int8_dot).
    int8_dot: str | None = None
    # Lanes of the target's bfloat16 dot product (kiln.codegen.llvm.bf16_dot; 0: none).
    bf16_dot: int = 0
    _ipow: dict[str, ir.Function] = field(default_factory=dict)


# ---------------------------------------------------------------- small helpers


def _zero(ty: ir.Type) -> ir.Constant:
    return ir.Constant(ty, 0.0 if ty in (F32, F64) else 0)


def _one(ty: ir.Type) -> ir.Constant:
    return ir.Constant(ty, 1.0 if ty in (F32, F64) else 1)


def _all_ones(ty: ir.IntType) -> ir.Constant:
    return ir.Constant(ty, -1)


def call_float_intrinsic(
    cx: MathContext, b: ir.IRBuilder, name: str, *args: ir.Value,
) -> ir.Value:
    """Call `llvm.<name>.<f32|f64>` on float arguments of one type."""
    ty = args[0].type
    fn = intrinsic(cx.module, f"llvm.{name}.{float_suffix(ty)}", ty, [ty] * len(args))
    return b.call(fn, list(args), fastmath=cx.fastmath)


def _float_kind(dtype: str) -> str:
    if dt.is_bool(dtype):
        return "bool"
    if dt.is_float(dtype):
        return "float"
    return "signed" if dt.kind(dtype) == "int" else "unsigned"


# ---------------------------------------------------------------- binary ops


BinaryEmitter = Callable[[MathContext, ir.IRBuilder, str, ir.Value, ir.Value], ir.Value]


def _int_constant(v: ir.Value) -> int | None:
    """The value of an integer constant operand (not a vector, not undef), else None."""
    if isinstance(v, ir.Constant) and isinstance(v.type, ir.IntType) \
            and isinstance(v.constant, int) and not isinstance(v.constant, bool):
        return v.constant
    return None


def folded_int(op: str, x: ir.Value, y: ir.Value) -> ir.Value | None:
    """`x op y` ("add", "sub", "mul") of two integers without an instruction where
    the answer is known here: both constants (wrapped to the type's width, as the
    instruction would), or `x + 0`, `0 + x`, `x - 0`, `x * 1`, `1 * x`. None otherwise.
    The lowering's index arithmetic is full of these (a tile's constant rows, a loop's
    first iteration); left to LLVM, they only make the IR longer to parse and combine."""
    a, c = _int_constant(x), _int_constant(y)
    if a is not None and c is not None:
        value = a + c if op == "add" else a - c if op == "sub" else a * c
        width = x.type.width
        value &= (1 << width) - 1
        if width > 1 and value >= 1 << (width - 1):
            value -= 1 << width
        return ir.Constant(x.type, value)
    if (c == 0 and op in ("add", "sub")) or (c == 1 and op == "mul"):
        return x
    if (a == 0 and op == "add") or (a == 1 and op == "mul"):
        return y
    return None


def int_add(b: ir.IRBuilder, x: ir.Value, y: ir.Value, flags: Sequence[str] = ()) -> ir.Value:
    """`add` of two integers, folded where `folded_int` knows the answer."""
    folded = folded_int("add", x, y)
    return folded if folded is not None else b.add(x, y, flags=list(flags))


def int_mul(b: ir.IRBuilder, x: ir.Value, y: ir.Value, flags: Sequence[str] = ()) -> ir.Value:
    """`mul` of two integers, folded where `folded_int` knows the answer."""
    folded = folded_int("mul", x, y)
    return folded if folded is not None else b.mul(x, y, flags=list(flags))


def _add(cx: MathContext, b: ir.IRBuilder, dtype: str, x: ir.Value, y: ir.Value) -> ir.Value:
    if dt.is_float(dtype):
        return b.fadd(x, y, flags=cx.fastmath)
    return int_add(b, x, y)


def _sub(cx: MathContext, b: ir.IRBuilder, dtype: str, x: ir.Value, y: ir.Value) -> ir.Value:
    if dt.is_float(dtype):
        return b.fsub(x, y, flags=cx.fastmath)
    folded = folded_int("sub", x, y)
    return folded if folded is not None else b.sub(x, y)


def _mul(cx: MathContext, b: ir.IRBuilder, dtype: str, x: ir.Value, y: ir.Value) -> ir.Value:
    if dt.is_float(dtype):
        return b.fmul(x, y, flags=cx.fastmath)
    return int_mul(b, x, y)


def _safe_divisor(b: ir.IRBuilder, dtype: str, y: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(divisor that cannot trap, whether y was 0). Signed -1 is replaced too."""
    ty = y.type
    is_zero = b.icmp_unsigned("==", y, _zero(ty))
    bad = is_zero
    if dt.kind(dtype) == "int":
        bad = b.or_(is_zero, b.icmp_signed("==", y, _all_ones(ty)))
    return b.select(bad, _one(ty), y), is_zero


def _const_divisor(y: ir.Value) -> int | None:
    """The value of a constant integer divisor other than 0 and -1 (the two that need the
    guards below), else None. Index arithmetic divides by constants: emitting the guards
    there only makes LLVM fold them away again."""
    if isinstance(y, ir.Constant) and isinstance(y.constant, int) and y.constant not in (0, -1):
        return int(y.constant)
    return None


def _div(cx: MathContext, b: ir.IRBuilder, dtype: str, x: ir.Value, y: ir.Value) -> ir.Value:
    if dt.is_float(dtype):
        return b.fdiv(x, y, flags=cx.fastmath)
    if _const_divisor(y) is not None:
        return b.udiv(x, y) if dt.kind(dtype) == "uint" else b.sdiv(x, y)
    ty = x.type
    d, is_zero = _safe_divisor(b, dtype, y)
    if dt.kind(dtype) == "uint":
        q = b.udiv(x, d)
    else:
        # x / -1 == -x (wrapping); sdiv by the substituted 1 would give x.
        q = b.select(b.icmp_signed("==", y, _all_ones(ty)), b.sub(_zero(ty), x), b.sdiv(x, d))
    return b.select(is_zero, _zero(ty), q)


def _mod(cx: MathContext, b: ir.IRBuilder, dtype: str, x: ir.Value, y: ir.Value) -> ir.Value:
    if dt.is_float(dtype):
        return b.frem(x, y, flags=cx.fastmath)
    if _const_divisor(y) is not None:
        return b.urem(x, y) if dt.kind(dtype) == "uint" else b.srem(x, y)
    d, is_zero = _safe_divisor(b, dtype, y)
    r = b.urem(x, d) if dt.kind(dtype) == "uint" else b.srem(x, d)  # x % -1 == x % 1 == 0
    return b.select(is_zero, _zero(x.type), r)


def _float_floordiv(cx: MathContext, b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """floor(x / y), as the IR interpreter defines it."""
    return call_float_intrinsic(cx, b, "floor", b.fdiv(x, y, flags=cx.fastmath))


def _floordiv(cx: MathContext, b: ir.IRBuilder, dtype: str, x: ir.Value, y: ir.Value) -> ir.Value:
    if dt.is_float(dtype):
        return _float_floordiv(cx, b, x, y)
    if dt.kind(dtype) == "uint":
        return _div(cx, b, dtype, x, y)
    ty = x.type
    q = _div(cx, b, dtype, x, y)
    r = _mod(cx, b, dtype, x, y)
    c = _const_divisor(y)
    if c is not None:  # round toward -inf: the remainder's sign must be the divisor's
        wrong = (b.icmp_signed("<", r, _zero(ty)) if c > 0
                 else b.icmp_signed(">", r, _zero(ty)))
        return b.sub(q, b.zext(wrong, ty))
    # Round toward -inf: step down when the remainder is non-zero and signs differ.
    differ = b.xor(b.icmp_signed("<", r, _zero(ty)), b.icmp_signed("<", y, _zero(ty)))
    step = b.and_(b.icmp_signed("!=", r, _zero(ty)), differ)
    return b.sub(q, b.zext(step, ty))


def _floormod(cx: MathContext, b: ir.IRBuilder, dtype: str, x: ir.Value, y: ir.Value) -> ir.Value:
    if dt.is_float(dtype):
        # x - floor(x / y) * y: the sign of y, as the IR interpreter defines it.
        q = _float_floordiv(cx, b, x, y)
        return b.fsub(x, b.fmul(q, y, flags=cx.fastmath), flags=cx.fastmath)
    if dt.kind(dtype) == "uint":
        return _mod(cx, b, dtype, x, y)
    ty = x.type
    r = _mod(cx, b, dtype, x, y)
    c = _const_divisor(y)
    if c is not None:
        wrong = (b.icmp_signed("<", r, _zero(ty)) if c > 0
                 else b.icmp_signed(">", r, _zero(ty)))
        return b.select(wrong, b.add(r, y), r)
    differ = b.xor(b.icmp_signed("<", r, _zero(ty)), b.icmp_signed("<", y, _zero(ty)))
    fix = b.and_(b.icmp_signed("!=", r, _zero(ty)), differ)
    return b.select(fix, b.add(r, y), r)


def _min(cx: MathContext, b: ir.IRBuilder, dtype: str, x: ir.Value, y: ir.Value) -> ir.Value:
    return _minmax(b, dtype, x, y, "<=")


def _max(cx: MathContext, b: ir.IRBuilder, dtype: str, x: ir.Value, y: ir.Value) -> ir.Value:
    return _minmax(b, dtype, x, y, ">=")


def _minmax(b: ir.IRBuilder, dtype: str, x: ir.Value, y: ir.Value, op: str) -> ir.Value:
    kind = _float_kind(dtype)
    if kind == "bool":
        return b.and_(x, y) if op == "<=" else b.or_(x, y)
    if kind == "float":
        # numpy: (x <= y || isnan(x)) ? x : y  -- a NaN on either side wins. Beside a
        # number (a ReLU6's bounds) one compare says it all: `x <= y` unordered (true
        # for a NaN x), or ordered when x is the number (false for a NaN y). That is
        # x86's vminps / vmaxps with the NaN side second, one instruction where the
        # compare of each side and a blend took four.
        if _number(y):
            return b.select(b.fcmp_unordered(op, x, y), x, y)
        if _number(x):
            return b.select(b.fcmp_ordered(op, x, y), x, y)
        pick_x = b.or_(b.fcmp_ordered(op, x, y), b.fcmp_unordered("uno", x, x))
        return b.select(pick_x, x, y)
    cmp = b.icmp_signed(op, x, y) if kind == "signed" else b.icmp_unsigned(op, x, y)
    return b.select(cmp, x, y)


def _number(v: ir.Value) -> bool:
    """Whether `v` is a float constant other than NaN, or a vector of such lanes (a
    constant or the broadcast of one, kiln.codegen.llvm.vector_loops)."""
    if isinstance(v, ir.ShuffleVector) and isinstance(v.operands[0], ir.InsertElement):
        _, lane, index = v.operands[0].operands
        if _zeros(index) and _zeros(v.operands[2]):  # lane 0 into every lane
            v = lane
    if not isinstance(v, ir.Constant):
        return False
    lanes = v.constant if isinstance(v.type, ir.VectorType) else [v.constant]
    return isinstance(lanes, list) and all(
        isinstance(c, (int, float)) and c == c for c in lanes)


def _zeros(v: ir.Value) -> bool:
    """Whether `v` is the integer constant 0 or a vector of zeros (a broadcast's mask)."""
    if not isinstance(v, ir.Constant):
        return False
    lanes = v.constant if isinstance(v.type, ir.VectorType) else [v.constant]
    return isinstance(lanes, list) and all(
        (c.constant if isinstance(c, ir.Constant) else c) == 0 for c in lanes)


def _pow(cx: MathContext, b: ir.IRBuilder, dtype: str, x: ir.Value, y: ir.Value) -> ir.Value:
    if dt.is_float(dtype):
        return call_float_intrinsic(cx, b, "pow", x, y)
    return b.call(_ipow_function(cx, dtype), [x, y])


def _ipow_function(cx: MathContext, dtype: str) -> ir.Function:
    """A private function computing x**y for one integer dtype by squaring."""
    fn = cx._ipow.get(dtype)
    if fn is not None:
        return fn
    ty = compute_type(dtype)
    fn = ir.Function(cx.module, ir.FunctionType(ty, [ty, ty]), f"kiln.ipow.{dtype}")
    fn.linkage = "private"
    fn.attributes.add("nounwind")
    x, y = fn.args
    entry, loop, done = (fn.append_basic_block(n) for n in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    one, zero = _one(ty), _zero(ty)
    if dt.kind(dtype) == "int":
        # Negative exponents: 1 and -1 keep their powers, everything else gives 0.
        neg = fn.append_basic_block("neg")
        b.cbranch(b.icmp_signed("<", y, zero), neg, loop)
        b.position_at_end(neg)
        minus_one_pow = b.select(b.trunc(y, I1), _all_ones(ty), one)
        b.ret(b.select(b.icmp_signed("==", x, one), one,
                       b.select(b.icmp_signed("==", x, _all_ones(ty)), minus_one_pow, zero)))
    else:
        b.branch(loop)
    # Square-and-multiply; y == 0 runs the body once (result stays 1) and exits.
    b.position_at_end(loop)
    result = b.phi(ty)
    base = b.phi(ty)
    exp = b.phi(ty)
    result.add_incoming(one, entry)
    base.add_incoming(x, entry)
    exp.add_incoming(y, entry)
    odd = b.trunc(exp, I1)
    new_result = b.select(odd, b.mul(result, base), result)
    new_base = b.mul(base, base)
    new_exp = b.lshr(exp, one)
    result.add_incoming(new_result, loop)
    base.add_incoming(new_base, loop)
    exp.add_incoming(new_exp, loop)
    b.cbranch(b.icmp_unsigned("==", new_exp, zero), done, loop)
    b.position_at_end(done)
    b.ret(new_result)
    cx._ipow[dtype] = fn
    return fn


def _bitwise(op: str) -> BinaryEmitter:
    def emit(cx: MathContext, b: ir.IRBuilder, dtype: str, x: ir.Value, y: ir.Value) -> ir.Value:
        if dt.is_float(dtype):
            raise CompileError(f"bitwise '{op}' needs integer or bool operands, got {dtype}")
        return {"and": b.and_, "or": b.or_, "xor": b.xor}[op](x, y)
    return emit


def _shift(op: str) -> BinaryEmitter:
    def emit(cx: MathContext, b: ir.IRBuilder, dtype: str, x: ir.Value, y: ir.Value) -> ir.Value:
        if not dt.is_int(dtype):
            raise CompileError(f"shift '{op}' needs integer operands, got {dtype}")
        ty = x.type
        width = ir.Constant(ty, dt.bits(dtype))
        in_range = b.icmp_unsigned("<", y, width)
        if op == "shl":
            return b.select(in_range, b.shl(x, y), _zero(ty))
        if dt.kind(dtype) == "uint":
            return b.select(in_range, b.lshr(x, y), _zero(ty))
        # Arithmetic shift by >= width gives the sign: shift by width - 1 instead.
        amount = b.select(in_range, y, ir.Constant(ty, dt.bits(dtype) - 1))
        return b.ashr(x, amount)
    return emit


BINARY: dict[str, BinaryEmitter] = {
    "add": _add, "sub": _sub, "mul": _mul, "div": _div, "mod": _mod,
    "floordiv": _floordiv, "floormod": _floormod, "min": _min, "max": _max, "pow": _pow,
    "and": _bitwise("and"), "or": _bitwise("or"), "xor": _bitwise("xor"),
    "shl": _shift("shl"), "shr": _shift("shr"),
}

# Ops defined on bool operands (logical); the others need numbers.
BOOL_OPS = frozenset({"and", "or", "xor", "min", "max"})


def binary(cx: MathContext, b: ir.IRBuilder, op: str, dtype: str,
           x: ir.Value, y: ir.Value) -> ir.Value:
    """`x <op> y` for operands of `dtype`."""
    if dt.is_bool(dtype) and op not in BOOL_OPS:
        raise CompileError(
            f"binary op '{op}' is not defined on bool operands; cast them to an integer "
            f"dtype first (bool supports {', '.join(sorted(BOOL_OPS))})")
    return BINARY[op](cx, b, dtype, x, y)


# ---------------------------------------------------------------- compare / unary

_ICMP = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def compare(b: ir.IRBuilder, op: str, dtype: str, x: ir.Value, y: ir.Value) -> ir.Value:
    """`x <op> y` as i1; floats compare ordered except `ne` (true when either is NaN)."""
    kind = _float_kind(dtype)
    pred = _ICMP[op]
    if kind == "float":
        if op == "ne":
            return b.fcmp_unordered(pred, x, y)
        return b.fcmp_ordered(pred, x, y)
    if kind == "signed":
        return b.icmp_signed(pred, x, y)
    return b.icmp_unsigned(pred, x, y)


def unary(cx: MathContext, b: ir.IRBuilder, op: str, dtype: str, x: ir.Value) -> ir.Value:
    """`-x` or `~x` (logical not on bool)."""
    if op == "neg":
        if dt.is_bool(dtype):
            raise CompileError("'neg' is not defined on bool; use 'not'")
        if dt.is_float(dtype):
            return b.fneg(x, flags=cx.fastmath)
        return b.sub(_zero(x.type), x)
    if dt.is_float(dtype):
        raise CompileError(f"'not' needs an integer or bool operand, got {dtype}")
    return b.xor(x, _all_ones(x.type))


# ---------------------------------------------------------------- casts


def cast(cx: MathContext, b: ir.IRBuilder, value: ir.Value, src: str, dst: str) -> ir.Value:
    """Convert a compute value of dtype `src` to dtype `dst` (C rules; see module doc)."""
    if src == dst:
        return value
    dst_ty = compute_type(dst)
    if dt.is_bool(dst):
        if dt.is_float(src):
            return b.fcmp_unordered("!=", value, _zero(value.type))  # NaN is true, as in C
        return b.icmp_unsigned("!=", value, _zero(value.type))
    if dt.is_bool(src):
        return b.uitofp(value, dst_ty) if dt.is_float(dst) else b.zext(value, dst_ty)
    if dt.is_int(src) and dt.is_int(dst):
        return _int_to_int(b, value, src, dst)
    if dt.is_int(src):
        return _int_to_float(cx, b, value, src, dst)
    if dt.is_int(dst):
        return _float_to_int(cx, b, value, dst)
    return _float_to_float(cx, b, value, dst)


def reinterpret(b: ir.IRBuilder, value: ir.Value, dst: str) -> ir.Value:
    """The bits of `value` (a scalar or a vector of lanes) as dtype `dst` of the same
    width: one `bitcast`, which costs no instruction (the IR's Reinterpret)."""
    ty = compute_type(dst)
    if isinstance(value.type, ir.VectorType):
        ty = ir.VectorType(ty, value.type.count)
    return value if value.type == ty else b.bitcast(value, ty)


def _int_to_int(b: ir.IRBuilder, value: ir.Value, src: str, dst: str) -> ir.Value:
    sb, db = dt.bits(src), dt.bits(dst)
    ty = compute_type(dst)
    if db < sb:
        return b.trunc(value, ty)
    if db > sb:
        return b.sext(value, ty) if dt.kind(src) == "int" else b.zext(value, ty)
    return value


def _int_to_float(cx: MathContext, b: ir.IRBuilder, value: ir.Value, src: str,
                  dst: str) -> ir.Value:
    signed = dt.kind(src) == "int"
    if is_half(dst):
        # Exact for |v| < 2**53, then one rounding to 16 bits.
        wide = b.sitofp(value, F64) if signed else b.uitofp(value, F64)
        return cx.halfs.round_f64(b, wide, dst)
    ty = compute_type(dst)
    return b.sitofp(value, ty) if signed else b.uitofp(value, ty)


def _float_to_int(cx: MathContext, b: ir.IRBuilder, value: ir.Value, dst: str) -> ir.Value:
    fty = value.type
    if fty == F32 and dt.bits(dst) <= 32:
        low = _f32_to_low32(cx, b, value)
        return b.trunc(low, compute_type(dst)) if dt.bits(dst) < 32 else low
    suffix = float_suffix(fty)
    wide = _fptosi_sat_i64(b, value)
    if dst == "uint64":
        # Values >= 2**63 need the unsigned conversion; below, wrap like the others.
        to_unsigned = intrinsic(cx.module, f"llvm.fptoui.sat.i64.{suffix}", I64, [fty])
        big = b.fcmp_ordered(">=", value, ir.Constant(fty, 2.0 ** 63))
        wide = b.select(big, b.call(to_unsigned, [value]), wide)
    if dt.bits(dst) < 64:
        return b.trunc(wide, compute_type(dst))
    return wide


def bounded_float_to_int(b: ir.IRBuilder, value: ir.Value, dst: str) -> ir.Value:
    """float32 `value` -> int `dst` (at most 32 bits) when every non-NaN value is known to
    truncate into int32 (kiln.codegen.llvm.float_range): NaN gives 0, as in `cast`; the
    rest is one `fptosi` (`cvttps2dq`), whose result `cast` would give too."""
    clear = b.select(b.fcmp_ordered("ord", value, value), value, ir.Constant(F32, 0.0))
    low = b.fptosi(clear, ir.IntType(32))
    return b.trunc(low, compute_type(dst)) if dt.bits(dst) < 32 else low


def _f32_to_low32(cx: MathContext, b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """The low 32 bits of `fptosi.sat.i64(v)` for a float32 `v`, in 32-bit lanes.

    LLVM converts `fptosi.sat` of float vectors lane by lane (so a loop it vectorizes,
    such as a requantizing epilogue, would spend most of its time there); this is one
    plain `fptosi` to i32 (`cvttps2dq`) of an operand always in range. Below 2**31 in
    magnitude that is `v`. Above, a float32 is an integer, and its low 32 bits are
    `lo = v - floor(v / 2**32) * 2**32` (exact: `lo` keeps a subset of v's 24 significant
    bits), moved into [-2**31, 2**31). From 2**63 up, the saturated int64 is 0x7fff...ff
    (low bits -1); down from -2**63 it is 0x8000...00 (low bits 0, as `lo`); NaN gives 0
    (`lo` is NaN for NaN and the infinities: 0 is taken)."""
    two31, two32 = ir.Constant(F32, 2.0 ** 31), ir.Constant(F32, 2.0 ** 32)
    fabs = intrinsic(cx.module, "llvm.fabs.f32", F32, [F32])
    floor = intrinsic(cx.module, "llvm.floor.f32", F32, [F32])
    high = b.call(floor, [b.fmul(v, ir.Constant(F32, 2.0 ** -32))])
    lo = b.fsub(v, b.fmul(high, two32))
    lo = b.select(b.fcmp_ordered(">=", lo, two31), b.fsub(lo, two32), lo)
    lo = b.select(b.fcmp_ordered("ord", lo, lo), lo, ir.Constant(F32, 0.0))
    small = b.fcmp_ordered("<", b.call(fabs, [v]), two31)
    low = b.fptosi(b.select(small, v, lo), ir.IntType(32))
    return b.select(b.fcmp_ordered(">=", v, ir.Constant(F32, 2.0 ** 63)),
                    ir.Constant(ir.IntType(32), -1), low)


def _fptosi_sat_i64(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """`llvm.fptosi.sat.i64` spelled out (NaN -> 0, out of range -> the nearest limit):
    the loop vectorizer widens these selects into vector conversions, while x86 takes
    the intrinsic's vector form apart into one scalar conversion per lane."""
    fty = value.type
    raw = b.fptosi(value, I64)  # poison out of range or NaN: selected away below
    big = b.fcmp_ordered(">=", value, ir.Constant(fty, 2.0 ** 63))
    small = b.fcmp_ordered("<", value, ir.Constant(fty, -(2.0 ** 63)))
    nan = b.fcmp_unordered("uno", value, value)
    wide = b.select(big, ir.Constant(I64, 2 ** 63 - 1), raw)
    wide = b.select(small, ir.Constant(I64, -(2 ** 63)), wide)
    return b.select(nan, ir.Constant(I64, 0), wide)


def _float_to_float(cx: MathContext, b: ir.IRBuilder, value: ir.Value, dst: str) -> ir.Value:
    if is_half(dst):
        if value.type == F64:
            return cx.halfs.round_f64(b, value, dst)
        return cx.halfs.round_f32(b, value, dst)
    ty = compute_type(dst)
    if value.type == ty:
        return value
    return b.fpext(value, ty) if ty == F64 else b.fptrunc(value, ty)

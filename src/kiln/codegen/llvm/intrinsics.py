"""Math intrinsics (`kiln.ir.tensor.Intrin`) as LLVM intrinsics or C math library calls.

LLVM intrinsics where LLVM has one (exp, exp2, log, log2, sqrt, sin, cos,
fabs, floor, ceil, trunc, roundeven, pow): the backend picks an instruction
or the libm call. The rest call the C math library by name, `expm1f` for
float32 (and the 16-bit floats, computed in float32) and `expm1` for float64.
`round` rounds half to even: `llvm.roundeven` on x86 and AArch64 (one
instruction), `llvm.rint` elsewhere (same result in the default rounding
mode, and `rintf` exists in every libm, unlike `roundevenf`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llvmlite import ir

from kiln.codegen.llvm import arith
from kiln.codegen.llvm.arith import MathContext, call_float_intrinsic
from kiln.codegen.llvm.bf16_dot import emit_bf16_pair, emit_dot2_bf16
from kiln.codegen.llvm.decls import declare, intrinsic
from kiln.codegen.llvm.dtypes import I1, libm_name
from kiln.codegen.llvm.int_dot import emit_dot2_i16, emit_dot4_u8s8
from kiln.errors import CompileError
from kiln.ir import dtype as dt

IntrinEmitter = Callable[[MathContext, ir.IRBuilder, str, Sequence[ir.Value]], ir.Value]


def _need_float(name: str, dtype: str) -> None:
    if not dt.is_float(dtype):
        raise CompileError(
            f"intrinsic {name} needs a float argument, got {dtype}; insert a Cast to a float dtype")


def _llvm(name: str, llvm_name: str | None = None) -> IntrinEmitter:
    def emit(cx: MathContext, b: ir.IRBuilder, dtype: str, args: Sequence[ir.Value]) -> ir.Value:
        _need_float(name, dtype)
        return call_float_intrinsic(cx, b, llvm_name or name, *args)
    return emit


def _libm(name: str) -> IntrinEmitter:
    def emit(cx: MathContext, b: ir.IRBuilder, dtype: str, args: Sequence[ir.Value]) -> ir.Value:
        _need_float(name, dtype)
        ty = args[0].type
        fn = declare(cx.module, libm_name(name, ty), ty, [ty] * len(args))
        return b.call(fn, list(args), fastmath=cx.fastmath)
    return emit


def _rounding(name: str) -> IntrinEmitter:
    """floor/ceil/trunc/round: identity on integers."""
    def emit(cx: MathContext, b: ir.IRBuilder, dtype: str, args: Sequence[ir.Value]) -> ir.Value:
        if not dt.is_float(dtype):
            if dt.is_bool(dtype):
                raise CompileError(f"intrinsic {name} is not defined on bool")
            return args[0]
        llvm_name = name
        if name == "round":
            llvm_name = "roundeven" if cx.native_roundeven else "rint"
        return call_float_intrinsic(cx, b, llvm_name, args[0])
    return emit


def _abs(cx: MathContext, b: ir.IRBuilder, dtype: str, args: Sequence[ir.Value]) -> ir.Value:
    (x,) = args
    if dt.is_float(dtype):
        return call_float_intrinsic(cx, b, "fabs", x)
    if dt.is_bool(dtype):
        raise CompileError("intrinsic abs is not defined on bool")
    if dt.kind(dtype) == "uint":
        return x
    fn = intrinsic(cx.module, f"llvm.abs.i{dt.bits(dtype)}", x.type, [x.type, I1])
    return b.call(fn, [x, ir.Constant(I1, 0)])  # abs(INT_MIN) == INT_MIN, not poison


def _rsqrt(cx: MathContext, b: ir.IRBuilder, dtype: str, args: Sequence[ir.Value]) -> ir.Value:
    _need_float("rsqrt", dtype)
    x = args[0]
    root = call_float_intrinsic(cx, b, "sqrt", x)
    return b.fdiv(ir.Constant(x.type, 1.0), root, flags=cx.fastmath)


def _sigmoid(cx: MathContext, b: ir.IRBuilder, dtype: str, args: Sequence[ir.Value]) -> ir.Value:
    _need_float("sigmoid", dtype)
    x = args[0]
    one = ir.Constant(x.type, 1.0)
    e = call_float_intrinsic(cx, b, "exp", b.fneg(x, flags=cx.fastmath))
    return b.fdiv(one, b.fadd(one, e, flags=cx.fastmath), flags=cx.fastmath)


def _isnan(cx: MathContext, b: ir.IRBuilder, dtype: str, args: Sequence[ir.Value]) -> ir.Value:
    if not dt.is_float(dtype):
        return ir.Constant(I1, 0)
    return b.fcmp_unordered("uno", args[0], args[0])


def _isinf(cx: MathContext, b: ir.IRBuilder, dtype: str, args: Sequence[ir.Value]) -> ir.Value:
    if not dt.is_float(dtype):
        return ir.Constant(I1, 0)
    x = args[0]
    magnitude = call_float_intrinsic(cx, b, "fabs", x)
    return b.fcmp_ordered("==", magnitude, ir.Constant(x.type, float("inf")))


def _pow(cx: MathContext, b: ir.IRBuilder, dtype: str, args: Sequence[ir.Value]) -> ir.Value:
    return arith.binary(cx, b, "pow", dtype, args[0], args[1])


def _fmod(cx: MathContext, b: ir.IRBuilder, dtype: str, args: Sequence[ir.Value]) -> ir.Value:
    # frem is C fmod; on integers fmod is the C remainder.
    return arith.binary(cx, b, "mod", dtype, args[0], args[1])


def _dot4_u8s8(cx: MathContext, b: ir.IRBuilder, dtype: str,
               args: Sequence[ir.Value]) -> ir.Value:
    if dtype != "int32":
        raise CompileError(f"intrinsic dot4_u8s8 takes int32 arguments, got {dtype}")
    return emit_dot4_u8s8(b, cx.module, cx.int8_dot, args)


def _dot4_u8s8_sat16(cx: MathContext, b: ir.IRBuilder, dtype: str,
                     args: Sequence[ir.Value]) -> ir.Value:
    if dtype != "int32":
        raise CompileError(f"intrinsic dot4_u8s8_sat16 takes int32 arguments, got {dtype}")
    return emit_dot4_u8s8(b, cx.module, cx.int8_dot, args, saturate=True)


def _dot2_i16(cx: MathContext, b: ir.IRBuilder, dtype: str,
              args: Sequence[ir.Value]) -> ir.Value:
    if dtype != "int32":
        raise CompileError(f"intrinsic dot2_i16 takes int32 arguments, got {dtype}")
    return emit_dot2_i16(b, cx.module, cx.int8_dot, args)


def _dot2_bf16(cx: MathContext, b: ir.IRBuilder, dtype: str,
               args: Sequence[ir.Value]) -> ir.Value:
    if dtype != "float32":
        raise CompileError(f"intrinsic dot2_bf16 takes a float32 sum, got {dtype}")
    return emit_dot2_bf16(b, cx.module, cx.bf16_dot, args)


def _bf16_pair(cx: MathContext, b: ir.IRBuilder, dtype: str,
               args: Sequence[ir.Value]) -> ir.Value:
    if dtype != "float32":
        raise CompileError(f"intrinsic bf16_pair takes float32 values, got {dtype}")
    return emit_bf16_pair(b, cx.module, cx.bf16_dot, args)


INTRINSICS: dict[str, IntrinEmitter] = {
    "exp": _llvm("exp"), "exp2": _llvm("exp2"), "log": _llvm("log"), "log2": _llvm("log2"),
    "sqrt": _llvm("sqrt"), "sin": _llvm("sin"), "cos": _llvm("cos"),
    "expm1": _libm("expm1"), "log1p": _libm("log1p"), "tan": _libm("tan"),
    "tanh": _libm("tanh"), "sinh": _libm("sinh"), "cosh": _libm("cosh"),
    "asin": _libm("asin"), "acos": _libm("acos"), "atan": _libm("atan"),
    "asinh": _libm("asinh"), "acosh": _libm("acosh"), "atanh": _libm("atanh"),
    "erf": _libm("erf"), "atan2": _libm("atan2"), "fma": _llvm("fma"),
    "floor": _rounding("floor"), "ceil": _rounding("ceil"), "trunc": _rounding("trunc"),
    "round": _rounding("round"),
    "abs": _abs, "rsqrt": _rsqrt, "sigmoid": _sigmoid, "isnan": _isnan, "isinf": _isinf,
    "pow": _pow, "fmod": _fmod, "dot4_u8s8": _dot4_u8s8,
    "dot4_u8s8_sat16": _dot4_u8s8_sat16, "dot2_i16": _dot2_i16, "dot2_bf16": _dot2_bf16,
    "bf16_pair": _bf16_pair,
}


def emit_intrinsic(
    cx: MathContext, b: ir.IRBuilder, name: str, dtype: str, args: Sequence[ir.Value],
) -> ir.Value:
    """The value of intrinsic `name` applied to `args` (compute values of `dtype`)."""
    emitter = INTRINSICS.get(name)
    if emitter is None:
        raise CompileError(f"the llvm backend has no lowering for intrinsic {name!r}; "
                           f"known: {', '.join(sorted(INTRINSICS))}")
    return emitter(cx, b, dtype, args)

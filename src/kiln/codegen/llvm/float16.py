"""float16 / bfloat16 conversions written in integer IR.

Buffers hold 16-bit floats as bit patterns (docs/abi.md); kernels compute with
them in float32. The conversions are spelled out with integer operations
rather than LLVM's `half`/`bfloat` types, because those lower to runtime
library calls (`__truncsfhf2`, `__truncsfbf2`, ...) on targets without
hardware support — calls a bare-metal build or the JIT may not resolve. All
roundings are to nearest, ties to even; NaN stays NaN (quiet), infinities and
overflow give infinities, subnormals are exact.

Each conversion is a small private, always-inlined function, defined in the
module on first use. The one exception: on a target with F16C (`native_f16`), float16
widens through LLVM's `fpext` from `half`, which is one `vcvtph2ps` there (vectorized
loops: one per vector), the same values as the integer form.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir

from kiln.codegen.llvm.decls import intrinsic
from kiln.codegen.llvm.dtypes import F32, F64, I16, I32


def _c32(v: int) -> ir.Constant:
    v &= 0xFFFFFFFF
    return ir.Constant(I32, v - (1 << 32) if v >= 1 << 31 else v)


class HalfConversions:
    """Defines and calls the 16-bit float conversions of one LLVM module."""

    def __init__(self, module: ir.Module, native_f16: bool = False) -> None:
        self._module = module
        self._native_f16 = native_f16
        self._funcs: dict[str, ir.Function] = {}

    # -- public: emit a call at the builder's position ------------------------

    def to_f32(self, b: ir.IRBuilder, bits: ir.Value, dtype: str) -> ir.Value:
        """float32 value of a 16-bit pattern of `dtype` (float16 or bfloat16)."""
        if dtype == "float16" and self._native_f16:
            return b.fpext(b.bitcast(bits, ir.HalfType()), F32)
        name = "kiln.f16_to_f32" if dtype == "float16" else "kiln.bf16_to_f32"
        body = _f16_to_f32 if dtype == "float16" else _bf16_to_f32
        return b.call(self._get(name, F32, [I16], body), [bits])

    def from_f32(self, b: ir.IRBuilder, value: ir.Value, dtype: str) -> ir.Value:
        """16-bit pattern of `dtype` nearest to a float32 value."""
        name = "kiln.f32_to_f16" if dtype == "float16" else "kiln.f32_to_bf16"
        body = _f32_to_f16 if dtype == "float16" else _f32_to_bf16
        return b.call(self._get(name, I16, [F32], body), [value])

    def from_f64(self, b: ir.IRBuilder, value: ir.Value, dtype: str) -> ir.Value:
        """16-bit pattern of `dtype` nearest to a float64 value (one rounding)."""
        odd = b.call(self._get("kiln.f64_to_f32_odd", F32, [F64], _f64_to_f32_odd), [value])
        return self.from_f32(b, odd, dtype)

    def round_f32(self, b: ir.IRBuilder, value: ir.Value, dtype: str) -> ir.Value:
        """A float32 value rounded to the precision and range of `dtype`."""
        return self.to_f32(b, self.from_f32(b, value, dtype), dtype)

    def round_f64(self, b: ir.IRBuilder, value: ir.Value, dtype: str) -> ir.Value:
        """A float64 value rounded once to `dtype`, returned as float32."""
        return self.to_f32(b, self.from_f64(b, value, dtype), dtype)

    # -- helpers ---------------------------------------------------------------

    def _get(
        self, name: str, ret: ir.Type, args: list[ir.Type],
        body: Callable[[ir.IRBuilder, list[ir.Argument]], ir.Value],
    ) -> ir.Function:
        fn = self._funcs.get(name)
        if fn is None:
            fn = ir.Function(self._module, ir.FunctionType(ret, args), name)
            fn.linkage = "private"
            fn.attributes.add("alwaysinline")
            fn.attributes.add("nounwind")
            b = ir.IRBuilder(fn.append_basic_block("entry"))
            b.ret(body(b, list(fn.args)))
            self._funcs[name] = fn
        return fn


def _f32_to_f16(b: ir.IRBuilder, args: list[ir.Argument]) -> ir.Value:
    # F. Giesen's float_to_half_fast3_rtne, branch-free.
    u = b.bitcast(args[0], I32)
    sign = b.and_(u, _c32(0x80000000))
    a = b.xor(u, sign)
    # |x| >= 65520 (rounds to infinity) or NaN.
    is_big = b.icmp_unsigned(">=", a, _c32(0x47800000))
    big = b.select(b.icmp_unsigned(">", a, _c32(0x7F800000)), _c32(0x7E00), _c32(0x7C00))
    # |x| < 2**-14: the result is subnormal or zero; a float add by 0.5 rounds it.
    is_sub = b.icmp_unsigned("<", a, _c32(0x38800000))
    fsum = b.fadd(b.bitcast(a, F32), ir.Constant(F32, 0.5))
    sub = b.sub(b.bitcast(fsum, I32), _c32(0x3F000000))
    # Normal: rebias the exponent and round the 13 dropped bits to even.
    mant_odd = b.and_(b.lshr(a, _c32(13)), _c32(1))
    t = b.add(a, _c32(((15 - 127) << 23) + 0xFFF))
    norm = b.lshr(b.add(t, mant_odd), _c32(13))
    out = b.select(is_big, big, b.select(is_sub, sub, norm))
    out = b.or_(out, b.lshr(sign, _c32(16)))
    return b.trunc(out, I16)


def _f16_to_f32(b: ir.IRBuilder, args: list[ir.Argument]) -> ir.Value:
    # F. Giesen's half_to_float (magic-number variant), branch-free.
    h = b.zext(args[0], I32)
    o = b.shl(b.and_(h, _c32(0x7FFF)), _c32(13))
    exp = b.and_(o, _c32(0x0F800000))
    o = b.add(o, _c32((127 - 15) << 23))
    inf_nan = b.bitcast(b.add(o, _c32((128 - 16) << 23)), F32)
    denorm = b.fsub(b.bitcast(b.add(o, _c32(1 << 23)), F32),
                    ir.Constant(F32, 2.0 ** -14))
    mag = b.select(b.icmp_unsigned("==", exp, _c32(0x0F800000)), inf_nan,
                   b.select(b.icmp_unsigned("==", exp, _c32(0)), denorm, b.bitcast(o, F32)))
    sign = b.shl(b.and_(h, _c32(0x8000)), _c32(16))
    return b.bitcast(b.or_(b.bitcast(mag, I32), sign), F32)


def _bf16_to_f32(b: ir.IRBuilder, args: list[ir.Argument]) -> ir.Value:
    return b.bitcast(b.shl(b.zext(args[0], I32), _c32(16)), F32)


def _f32_to_bf16(b: ir.IRBuilder, args: list[ir.Argument]) -> ir.Value:
    u = b.bitcast(args[0], I32)
    is_nan = b.icmp_unsigned(">", b.and_(u, _c32(0x7FFFFFFF)), _c32(0x7F800000))
    lsb = b.and_(b.lshr(u, _c32(16)), _c32(1))
    rounded = b.lshr(b.add(b.add(u, _c32(0x7FFF)), lsb), _c32(16))
    quiet_nan = b.or_(b.lshr(u, _c32(16)), _c32(0x40))
    return b.trunc(b.select(is_nan, quiet_nan, rounded), I16)


def _f64_to_f32_odd(b: ir.IRBuilder, args: list[ir.Argument]) -> ir.Value:
    # Round to odd: truncate toward zero, then set the last bit if inexact. A
    # second rounding of the result to <= 22 bits is then correctly rounded.
    d = args[0]
    t = b.fptrunc(d, F32)
    back = b.fpext(t, F64)
    inexact = b.fcmp_ordered("one", back, d)
    fabs = intrinsic(b.module, "llvm.fabs.f64", F64, [F64])
    too_big = b.fcmp_ordered(">", b.call(fabs, [back]), b.call(fabs, [d]))
    bits = b.bitcast(t, I32)
    toward_zero = b.select(too_big, b.sub(bits, _c32(1)), bits)
    odd = b.or_(toward_zero, _c32(1))
    result = b.select(inexact, odd, bits)
    return b.bitcast(result, F32)

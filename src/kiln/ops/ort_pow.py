"""float32 `x ** y` for positive `x` and a constant `y`, rounded as onnxruntime's CPU
kernels round it.

onnxruntime computes some float32 powers with Eigen's vectorized `pow` (its LRN:
`scale.pow(-beta)` in onnxruntime/core/providers/cpu/nn/lrn.cc). That function is
accurate to about 3 ulp, not correctly rounded: about one result in five differs from
libm's `powf` by an ulp, enough to flip a later QuantizeLinear of a quantized model.
To match those results bit for bit, this module follows Eigen's algorithm
(Eigen/src/Core/arch/Default/GenericPacketMathFunctions.h at the commit onnxruntime's
cmake/deps.txt pins, `unary_pow_impl` / `generic_pow_impl`) step by step, as compiled
for onnxruntime's x86-64 wheels: SSE without FMA, so every multiply-add rounds twice
and exact products are split (Veltkamp/Dekker).

- an integer exponent in [-3, 7]: repeated squaring (of `1 / x` when negative);
- otherwise `x = m 2^e` with `m` in [sqrt(1/2), sqrt(2)); `log2(m)` as a double word
  (a degree-8 polynomial in `m - 1`, its last two Horner steps and the final product
  in double-word arithmetic); `f = y e + y log2(m)` as a double word, split into an
  integer `n` and `r` in [-1/2, 1/2]; `2^r = exp(ln2 r)` with the ln2 product split so
  its low part multiplies `exp` of the high part (Eigen's float `exp`: a Cephes-style
  degree-6 polynomial); times `2^n`.

The algorithm is written once over `Arith`, the handful of operations it needs, so
the numpy reference (`NumpyArith`) and the generated code (kiln.ops.lrn builds an IR
`Arith`) round identically.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

F32 = np.float32
# Veltkamp splitting constant for float32: 2^12 + 1 (half of the 24-bit significand).
_SPLIT = 4097.0
# Eigen's accurate_log2<float>: log2(1 + t) / t = c1 + t (c0... ) with the two last
# coefficients in double-word precision (kC0, kC1) and these in float32, highest first.
_LOG2_C0 = 1.442695041742110273474963832995854318141937255859375
_LOG2_C1 = -7.2134751588268664068692714863573201000690460205078125e-01
_LOG2_P = (9.7010828554630279541015625e-02, -1.6896486282348632812500000e-01,
           1.7200836539268493652343750e-01, -1.7892272770404815673828125e-01,
           2.0505344867706298828125000e-01, -2.4046677350997924804687500e-01,
           2.8857553005218505859375000e-01, -3.6067414283752441406250000e-01,
           4.8089790344238281250000000e-01)
_SQRT_HALF = 0.70710678118654752440
_LN2 = 0.693147180559945309417232121458
# Eigen's pexp_float: m = floor(x log2(e) + 1/2), r = x - m ln2 (ln2 in two parts),
# exp(r) = 1 + r + r^2 (p2 + r p3 + r^2 (p4 + r p5 + r^2 p6)).
_EXP_LOG2E = 1.44269504088896341
_EXP_C1, _EXP_C2 = -0.693359375, 2.12194440e-4
_EXP_P = (0.49999988079071044921875, 0.16666518151760101318359375,
          4.166965186595916748046875e-2, 8.36894474923610687255859375e-3,
          1.37449637986719608306884765625e-3)


class Arith(Protocol):
    """The operations the algorithm needs on float32 values (`+`, `-`, `*` and unary
    `-` on the values themselves, each rounded to float32)."""

    def const(self, v: float) -> Any:
        """`v` rounded to float32."""

    def bind(self, x: Any) -> Any:
        """`x` evaluated once (the IR binds a let; numpy has the value already)."""

    def round(self, x: Any) -> Any:
        """`x` rounded to an integer, halves away from zero."""

    def floor(self, x: Any) -> Any:
        """The largest integer <= `x`."""

    def frexp(self, x: Any) -> tuple[Any, Any]:
        """`(m, e)` with `x = m 2^e`, `m` in [1/2, 1), `e` as a float (x positive, normal)."""

    def ldexp(self, x: Any, n: Any) -> Any:
        """`x 2^n` for an integer-valued float `n` (exact while the result is normal)."""

    def select(self, cond: Any, a: Any, b: Any) -> Any:
        """`a` where `cond`, else `b`."""

    def less(self, a: Any, b: Any) -> Any:
        """`a < b`."""

    def recip(self, x: Any) -> Any:
        """`1 / x`, correctly rounded."""

    def equal(self, a: Any, b: Any) -> Any:
        """`a == b`."""

    def product_error(self, x: Any, y: Any, hi: Any) -> Any | None:
        """`x y - hi` by one fused multiply-add (exact), or None without one: Dekker's
        split product then computes the same value (see `_two_prod`)."""


def powf(ar: Arith, x: Any, y: float) -> Any:
    """`x ** y` for a constant `y` as Eigen computes it for onnxruntime (see the
    module docstring), with IEEE pow's values where `x` is zero, infinite, negative
    (NaN for a non-integer `y`) or NaN."""
    y = float(F32(y))
    if y.is_integer() and -3 <= y <= 7:
        return _int_pow(ar, x, int(y))  # right for every x as it is
    value = ar.bind(_generic_pow(ar, x, y))
    inf = float("inf")
    at_zero, at_inf = (inf, 0.0) if y < 0 else (0.0, inf)
    special = ar.select(ar.equal(x, ar.const(0.0)), ar.const(at_zero),
                        ar.select(ar.equal(x, ar.const(inf)), ar.const(at_inf),
                                  ar.const(float("nan"))))
    special = ar.bind(special)
    finite = ar.bind(ar.select(ar.less(x, ar.const(inf)), value, special))
    return ar.bind(ar.select(ar.less(ar.const(0.0), x), finite, special))


def _int_pow(ar: Arith, x: Any, k: int) -> Any:
    # Eigen's int_pow: start from x (1 / x for negative k), square while halving |k|.
    if k == 0:
        return ar.const(1.0)
    result = ar.bind(ar.recip(x) if k < 0 else x)
    acc = None
    m = abs(k)
    while m > 1:
        if m % 2:
            acc = result if acc is None else ar.bind(acc * result)
        result = ar.bind(result * result)
        m //= 2
    return result if acc is None else ar.bind(acc * result)


def _madd(ar: Arith, a: Any, b: Any, c: Any) -> Any:
    return ar.bind(ar.bind(a * b) + c)  # pmadd without FMA: two roundings


def _split(ar: Arith, x: Any) -> tuple[Any, Any]:
    gamma = ar.bind(ar.const(_SPLIT) * x)
    rho = ar.bind(x - gamma)
    hi = ar.bind(rho + gamma)
    return hi, ar.bind(x - hi)


def _two_prod(ar: Arith, x: Any, y: Any) -> tuple[Any, Any]:
    """Dekker's exact product: x y = hi + lo. Without underflow `lo` is the exact
    error of `hi`, so a fused multiply-add's `x y - hi` is the same float32 (2 operations
    instead of 17)."""
    hi = ar.bind(x * y)
    fused = ar.product_error(x, y, hi)
    if fused is not None:
        return hi, ar.bind(fused)
    xh, xl = _split(ar, x)
    yh, yl = _split(ar, y)
    lo = _madd(ar, xh, yh, -hi)
    lo = _madd(ar, xh, yl, lo)
    lo = _madd(ar, xl, yh, lo)
    return hi, _madd(ar, xl, yl, lo)


def _fast_two_sum(ar: Arith, x: Any, y: Any) -> tuple[Any, Any]:
    s = ar.bind(x + y)
    t = ar.bind(s - x)
    return s, ar.bind(y - t)


def _dw_add(ar: Arith, xh: Any, xl: Any, yh: Any, yl: Any) -> tuple[Any, Any]:
    """Double-word sum assuming |xh| >= |yh| (Eigen's 4-argument fast_twosum)."""
    rh, rl = _fast_two_sum(ar, xh, yh)
    s = ar.bind(ar.bind(yl + rl) + xl)
    return _fast_two_sum(ar, rh, s)


def _dw_mul(ar: Arith, xh: Any, xl: Any, y: Any) -> tuple[Any, Any]:
    """Double word times float (Muller's Algorithm 7, Eigen's 3-argument twoprod)."""
    ch, cl1 = _two_prod(ar, xh, y)
    cl2 = ar.bind(xl * y)
    th, tl1 = _fast_two_sum(ar, ch, cl2)
    tl2 = ar.bind(tl1 + cl1)
    return _fast_two_sum(ar, th, tl2)


def _log2(ar: Arith, z: Any) -> tuple[Any, Any]:
    """log2(z) for z in [sqrt(1/2), sqrt(2)) as a double word."""
    # the double-word constants: the float32 nearest kC, then the rest rounded
    c0h, c1h = float(F32(_LOG2_C0)), float(F32(_LOG2_C1))
    c0l, c1l = float(F32(_LOG2_C0 - c0h)), float(F32(_LOG2_C1 - c1h))
    x = ar.bind(z - ar.const(1.0))
    p = ar.const(_LOG2_P[0])
    for c in _LOG2_P[1:]:
        p = _madd(ar, p, x, ar.const(c))
    ph, pl = _two_prod(ar, x, p)
    ph, pl = _dw_add(ar, ar.const(c1h), ar.const(c1l), ph, pl)
    ph, pl = _dw_mul(ar, ph, pl, x)
    ph, pl = _dw_add(ar, ar.const(c0h), ar.const(c0l), ph, pl)
    return _dw_mul(ar, ph, pl, x)


def _exp(ar: Arith, x: Any) -> Any:
    """Eigen's pexp_float for |x| < 87 (here |x| <= ln2 / 2)."""
    m = ar.bind(ar.floor(_madd(ar, x, ar.const(_EXP_LOG2E), ar.const(0.5))))
    r = _madd(ar, m, ar.const(_EXP_C1), x)
    r = _madd(ar, m, ar.const(_EXP_C2), r)
    r2 = ar.bind(r * r)
    p2, p3, p4, p5, p6 = (ar.const(c) for c in _EXP_P)
    even = _madd(ar, r2, p6, p4)
    odd = _madd(ar, r2, p5, p3)
    even = _madd(ar, r2, even, p2)
    low = ar.bind(r + ar.const(1.0))
    v = _madd(ar, r, odd, even)
    v = _madd(ar, r2, v, low)
    return ar.ldexp(v, m)


def _generic_pow(ar: Arith, x: Any, y: float) -> Any:
    m, e = ar.frexp(x)
    small = ar.less(m, ar.const(_SQRT_HALF))
    m = ar.bind(ar.select(small, ar.bind(ar.const(2.0) * m), m))
    e = ar.bind(ar.select(small, ar.bind(e - ar.const(1.0)), e))
    rh, rl = _log2(ar, m)
    yc = ar.const(y)
    f1h, f1l = _two_prod(ar, e, yc)
    f2h, f2l = _dw_mul(ar, rh, rl, yc)
    fh, fl = _dw_add(ar, f1h, f1l, f2h, f2l)
    n = ar.bind(ar.round(fh))
    r = ar.bind(ar.bind(fh - n) + fl)
    nr = ar.bind(ar.round(r))
    r = ar.bind(r - nr)
    n = ar.bind(n + nr)
    # generic_exp2(r): exp(ln2 r) with ln2 r = hi + lo, as exp(hi) (1 + lo)
    hi, lo = _two_prod(ar, ar.const(_LN2), r)
    e_r = ar.bind(_exp(ar, hi) * ar.bind(ar.const(1.0) + lo))
    return ar.ldexp(e_r, n)


class NumpyArith:
    """`Arith` on float32 numpy arrays (the operators are numpy's, rounded to float32)."""

    def const(self, v: float) -> Any:
        return F32(v)

    def bind(self, x: Any) -> Any:
        return x

    def round(self, x: Any) -> Any:
        x64 = np.asarray(x, np.float64)  # exact: x + 1/2 needs no rounding in float64
        return np.trunc(x64 + np.copysign(0.5, x64)).astype(F32)

    def floor(self, x: Any) -> Any:
        return np.floor(x).astype(F32)

    def frexp(self, x: Any) -> tuple[Any, Any]:
        m, e = np.frexp(np.asarray(x, F32))
        return m.astype(F32), e.astype(F32)

    def ldexp(self, x: Any, n: Any) -> Any:
        return np.ldexp(x, np.asarray(n).astype(np.int32)).astype(F32)

    def select(self, cond: Any, a: Any, b: Any) -> Any:
        return np.where(cond, a, b).astype(F32)

    def less(self, a: Any, b: Any) -> Any:
        return a < b

    def recip(self, x: Any) -> Any:
        return (F32(1.0) / x).astype(F32)

    def equal(self, a: Any, b: Any) -> Any:
        return a == b

    def product_error(self, x: Any, y: Any, hi: Any) -> Any | None:
        return None  # numpy has no float32 fused multiply-add: Dekker's split

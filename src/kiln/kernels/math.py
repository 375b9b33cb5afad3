"""float32 exp, tanh, sigmoid and erf as plain IR arithmetic that vectorizes.

The C math library's `expf`/`tanhf`/`erff` are scalar calls: a loop calling one
cannot be widened by LLVM's loop vectorizer (nor by a C compiler) without a
vector math library. These builders spell the functions with what every
backend vectorizes: multiply-adds, int32-to-float32 conversions, float32 <->
int32 bit casts (`reinterpret`), integer adds and shifts, selects (all of it
`vector` loop code: kiln.ir.analysis.vector_loops). onnxruntime's MLAS computes
its `MlasComputeExp`, `MlasComputeTanh` and `MlasComputeLogistic` the same way,
with intrinsics.

- exp: `x = n ln2 + r`, `|r| <= ln2/2` (Cody-Waite: ln2 in two parts, so
  `n ln2` is exact), a degree-6 polynomial for `exp(r)` (fitted here; Cephes'
  expf has degree 7 for no accuracy float32 can show), times `2^n`.
  `n` is rounded by adding `1.5 * 2^23` to `x log2(e)` (the sum's last bits are
  `n`: no float-to-int conversion), and `2^n` is built in the exponent field
  through a bit cast (`reinterpret`): the sum's bits shifted left by 23 are
  `n << 23`. Clamped to the normal exponents that is `2^m`; the rest, `n - m`
  (non-zero only for results near overflow or below float32's normal range),
  is a second factor `2^(n-m)`, so `(exp(r) 2^m) 2^(n-m)` rounds once, at the
  last product, and subnormal results and overflow to `inf` come out as
  libm's do (onnxruntime's MLAS `MlasComputeExp` scales the same way). When
  the caller knows `x <= 0` (softmax, sigmoid) `n <= 0`: only the lower clamp.
- tanh: of `|x|`, Cephes' odd polynomial below 0.625, `1 - 2 / (exp(2|x|) + 1)`
  above (`|x|` clamped to 9, where float32's tanh is 1: one `2^n` factor, no
  overflow; a clamp that passes NaN on, so NaN needs no select), then `x`'s
  sign bit put on it (a bit cast: `-0.0` stays `-0.0`). MLAS's single rational
  `x P(x^2) / Q(x^2)` on `x` clamped to +-9 is cheaper but not this accurate
  in float32: its rounding reaches 5.5 ulp near `|x|` = 6-8.5 (the sweep of
  tests/ops/test_vector_math.py allows 1.5; docs/performance.md).
- sigmoid: `e = exp(-|x|)`, then `1 / (1 + e)` or `e / (1 + e)` by the sign,
  so tiny results for very negative inputs keep their precision.
- erf: an odd polynomial below 0.92 (where MLAS's erf splits too), a
  degree-15 polynomial in `|x|` up to 3.92, +-1 beyond (no `exp`: half the
  work of MLAS's `1 - exp(Q(|x|))` form, as accurate).

NaN in, NaN out; `+-inf` give libm's limits. `fused`: multiply-adds as the
`fma` intrinsic (one instruction where the target has FMA; without it, `fma`
is a library call, so plain multiplies and adds are used). Measured errors are
in docs/performance.md ("Row kernels").

Operators keep writing the `exp`/`tanh`/`sigmoid`/`erf` intrinsics; the
`expand-math` pass (kiln.transform.expand_math), last in the CPU tensor
pipeline, replaces them with these forms, every intermediate value a let.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kiln.ir.tensor import (
    Cast,
    Const,
    PrimExpr,
    intrin,
    max_,
    min_,
    reinterpret,
    select,
)

F32 = "float32"
I32 = "int32"

# exp: log2(e); ln2 = _LN2_HI + _LN2_LO with _LN2_HI's 9 significant bits (n * _LN2_HI
# is exact for |n| < 2^15); exp(r) = 1 + r + r^2 P(r) on |r| <= ln2/2 with P of degree 4
# (one degree below Cephes' expf): a least-squares fit reweighted towards minimax of the
# relative error, 3.6e-9 with these float32 coefficients (0.06 of float32's rounding unit).
_LOG2E, _LN2_HI, _LN2_LO = 1.44269504088896341, 0.693359375, -2.12194440e-4
_EXP_P = (0.0013814539, 0.008368745, 0.04166839, 0.16666521, 0.49999994)
# With FMA, onnxruntime's MLAS constants (its `MlasComputeExp`/softmax kernels, core/mlas/
# lib/compute.cpp): ln2 split as -0.693145752 - 1.42860677e-6 (the products n * ln2_hi
# need the FMA's exact product: _LN2_HI's short split is for plain multiplies) and
# exp(r) = 1 + r (1 + r P(r)) with P of degree 4, both last steps multiply-adds. The
# same arithmetic in the same order gives MLAS's results bit for bit (softmax, GELU).
_MLAS_LN2_HI, _MLAS_LN2_LO = -6.93145752e-1, -1.42860677e-6
_MLAS_EXP_P = (float.fromhex("0x1.694000p-10"), float.fromhex("0x1.125edcp-7"),
               float.fromhex("0x1.555b5ap-5"), float.fromhex("0x1.555450p-3"),
               float.fromhex("0x1.fffff6p-2"), 1.0, 1.0)
# MLAS's lower clamp: exp is 0 in float32 below it
_MLAS_EXP_LO = -103.9720840454
# MLAS's lower clamp of softmax's `x - max` (its `LowerRangeSumExp`): n = -127 there,
# 2^n's exponent field 0, the result 0
_MLAS_SUM_EXP_LO = -88.3762626647949
# exp(x) is 0 in float32 below -103.98 (under half the smallest subnormal) and inf above
# 88.73; clamping to these keeps n within [-150, 128].
_EXP_LO, _EXP_HI = -104.0, 88.75
# x log2(e) + 1.5 * 2^23 lies in [2^23, 2^24), where float32's spacing is 1: the sum is
# rounded to an integer n (ties to even), held in the low bits as _ROUNDER's bits + n.
_ROUNDER, _ROUNDER_BITS = 12582912.0, 0x4B400000
# 2^m for the normal exponents m in [-126, 127]: bits (m + 127) << 23; the field values
# of m = 127 and m = -126, less the bias (the bounds `n << 23` is clamped to).
_ONE_BITS, _EXP_FIELD_MAX, _EXP_FIELD_MIN = 127 << 23, 127 << 23, -126 << 23
# tanh(x) = x + x^3 P(x^2) for |x| < 0.625 (Cephes' tanhf).
_TANH_P = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
           -3.33332819422e-1)
_TANH_SMALL = 0.625
# tanh(x) rounds to 1 in float32 from 9.01 on (1 - tanh(9) < 2^-25)
_TANH_ONE = 9.0
_SIGN_BIT = -(1 << 31)  # int32 0x80000000
# erf: x P(x^2) below _ERF_SPLIT (P's constant term less 1 here); from there to
# _ERF_ONE a polynomial in |x| - _ERF_MID (erf is within 1.2e-9 of it); beyond
# _ERF_ONE, float32's erf is +-1. Least-squares fits reweighted towards minimax
# (relative error 1.6e-8, absolute 1.2e-9, in float64).
_ERF_SPLIT, _ERF_ONE = 0.921875, 3.92
_ERF_MID = (_ERF_SPLIT + _ERF_ONE) / 2
_ERF_SMALL = (-5.991149499880959e-4, 4.993250037681141e-3, -2.6766676180021286e-2,
              1.128181842193311e-1, -3.761249403319632e-1, 1.128379149704809 - 1.0)
_ERF_BIG = (-3.0726646005889705e-07, 1.2775221941525514e-06, 1.908717145763411e-06,
            -1.8492221164972602e-05, 2.5217043147061725e-05, 6.688150049504601e-05,
            -3.146972591579529e-04, 4.6162531193796674e-04, 3.2054049002849577e-04,
            -3.042933821306152e-03, 7.506109646817584e-03, -1.1311337826504002e-02,
            1.148790552658578e-02, -7.7815661772257716e-03, 3.2142538813616163e-03,
            9.993823041870228e-01)

# MLAS's erf (with FMA): x + x P(x^2) below the split, 1 - exp(-(x + x Q(x))) above,
# |x| clamped to 3.925 (its ErfUpperAbsRange: from there on the result rounds to exactly
# +-1); its exp has its own degree-6 polynomial. Faithfully rounded.
_MLAS_ERF_UPPER = 3.925
_MLAS_ERF_SMALL = (-5.99104969e-4, 4.99339588e-3, -2.67667342e-2, 1.12818025e-1,
                   -3.76124859e-1, 1.28379151e-1)
_MLAS_ERF_BIG = (1.72948930e-5, -3.83208680e-4, 3.88393435e-3, -2.42545605e-2,
                 1.06777847e-1, 6.34846687e-1, 1.28717512e-1)
_MLAS_ERF_EXP_LO = -88.3762626647949
_MLAS_ERF_EXP_P = (1.38319808e-3, 8.37550033e-3, 4.16689515e-2, 1.66664466e-1,
                   4.99999851e-1, 1.0, 1.0)


def _f(v: float) -> Const:
    return Const(float(v), F32)


def _i(v: int) -> Const:
    return Const(v, I32)


def _mul_add(a: PrimExpr, b: PrimExpr, c: PrimExpr, fused: bool) -> PrimExpr:
    return intrin("fma", a, b, c) if fused else a * b + c


def _horner(x: PrimExpr, coefs: Sequence[float], fused: bool) -> PrimExpr:
    acc: PrimExpr = _f(coefs[0])
    for c in coefs[1:]:
        acc = _mul_add(acc, x, _f(c), fused)
    return acc


Bind = Callable[[PrimExpr], PrimExpr]


def _inline(e: PrimExpr) -> PrimExpr:
    return e


def exp_f32(x: PrimExpr, *, fused: bool = False, nonpositive: bool = False,
            bind: Bind = _inline) -> PrimExpr:
    """`exp(x)` of a float32 `x` (see the module docstring); `nonpositive`: the caller
    knows `x <= 0` or NaN (softmax's `x - max`), so the upper clamp is left out.
    `bind(e)` names a value used more than once (a let variable: without one, the
    expression is a DAG that every tree walk would copy out)."""
    # clamps that let NaN through (NaN fails both comparisons): its `n` is garbage, but
    # `r = x - n ln2` is NaN, and so is the result (no select for it)
    x = bind(x)
    high = x if nonpositive else bind(select(x > _f(_EXP_HI), _f(_EXP_HI), x))
    lo = _f(_MLAS_EXP_LO if fused else _EXP_LO)
    xc = bind(select(high < lo, lo, high))
    e_r, field = _exp_parts(xc, fused, bind)
    # n <= 0 when x <= 0: only the lower bound can bind
    top = field if nonpositive else min_(field, _i(_EXP_FIELD_MAX))
    normal = bind(max_(top, _i(_EXP_FIELD_MIN)))
    two_m = reinterpret(normal + _i(_ONE_BITS), F32)
    two_rest = reinterpret(field - normal + _i(_ONE_BITS), F32)  # 2^(n - m), n - m in [-24, 1]
    return (e_r * two_m) * two_rest  # the last product rounds (subnormal or inf)


def softmax_exp_f32(x: PrimExpr, *, fused: bool = False, bind: Bind = _inline) -> PrimExpr:
    """`exp(x)` of softmax's `x - max` (`<= 0` or NaN) as onnxruntime's softmax computes
    it (MLAS's `MlasComputeSumExpF32Kernel`, with FMA): `x` clamped below at
    `_MLAS_SUM_EXP_LO`, where `n` reaches -127, and one `2^n` factor whose exponent field
    is then 0 (the result flushed to 0 below about -87.3: MLAS's zeros). Without FMA,
    `exp_f32` knowing `x <= 0`. Seven vector operations and three constants fewer than
    `exp_f32`: the kernel keeps its constants in the 16 AVX2 registers."""
    if not fused:
        return exp_f32(x, fused=False, nonpositive=True, bind=bind)
    x = bind(x)
    lo = _f(_MLAS_SUM_EXP_LO)
    # a clamp that lets NaN through: r, exp(r) and the product are NaN
    e_r, field = _exp_parts(bind(select(x < lo, lo, x)), True, bind)
    return e_r * reinterpret(field + _i(_ONE_BITS), F32)


def _exp_parts(x: PrimExpr, fused: bool, bind: Bind) -> tuple[PrimExpr, PrimExpr]:
    """`exp(r)` and `n << 23` (int32) with `x = n ln2 + r`, for `x` in [_EXP_LO,
    _EXP_HI] or NaN (then `exp(r)` is NaN)."""
    rounded = bind(reinterpret(_mul_add(x, _f(_LOG2E), _f(_ROUNDER), fused), I32))
    # n from the integer bits, not as `sum - _ROUNDER`: a fast-math build may reassociate
    # that float subtraction away (x log2(e) + R - R = x log2(e)); through the bits it can't
    n = bind(Cast(F32, rounded - _i(_ROUNDER_BITS)))
    if fused:  # MLAS's reduction and polynomial (see _MLAS_EXP_P)
        r = bind(intrin("fma", n, _f(_MLAS_LN2_LO), intrin("fma", n, _f(_MLAS_LN2_HI), x)))
        return _horner(r, _MLAS_EXP_P, True), rounded << _i(23)
    r = bind(_mul_add(n, _f(-_LN2_LO), _mul_add(n, _f(-_LN2_HI), x, fused), fused))
    e_r = _mul_add(_horner(r, _EXP_P, fused), r * r, r + _f(1.0), fused)
    return e_r, rounded << _i(23)  # n << 23: _ROUNDER's bits shift out


def tanh_f32(x: PrimExpr, *, fused: bool = False, bind: Bind = _inline) -> PrimExpr:
    """`tanh(x)` of a float32 `x` (see the module docstring; `bind` as for exp_f32)."""
    x = bind(x)
    ax = bind(intrin("abs", x))
    z = bind(ax * ax)
    small = _mul_add(ax * z, _horner(z, _TANH_P, fused), ax, fused)
    # 2|x| <= 2 _TANH_ONE: exp cannot overflow, 2^n is one factor. A clamp that lets NaN
    # through (`min` would not), so NaN needs no select: r, e and y are NaN
    e_r, field = _exp_parts(bind(select(ax > _f(_TANH_ONE), _f(_TANH_ONE), ax) * _f(2.0)),
                            fused, bind)
    e = e_r * reinterpret(field + _i(_ONE_BITS), F32)
    y = select(ax < _f(_TANH_SMALL), small, _f(1.0) - _f(2.0) / (e + _f(1.0)))
    # tanh(|x|) with the sign bit of x (so -0.0 stays -0.0)
    return reinterpret(reinterpret(y, I32) | (reinterpret(x, I32) & _i(_SIGN_BIT)), F32)


def sigmoid_f32(x: PrimExpr, *, fused: bool = False, bind: Bind = _inline) -> PrimExpr:
    """`1 / (1 + exp(-x))` of a float32 `x` (see the module docstring; `bind` as for
    exp_f32)."""
    x = bind(x)
    e = bind(exp_f32(-intrin("abs", x), fused=fused, nonpositive=True, bind=bind))
    return select(x < _f(0.0), e, _f(1.0)) / (e + _f(1.0))


def erf_f32(x: PrimExpr, *, fused: bool = False, bind: Bind = _inline) -> PrimExpr:
    """`erf(x)` of a float32 `x` (see the module docstring; `bind` as for exp_f32)."""
    if fused:
        return _erf_mlas(bind(x), bind)
    x = bind(x)
    ax = bind(intrin("abs", x))
    x2 = bind(x * x)
    small = _mul_add(x, _horner(x2, _ERF_SMALL, fused), x, fused)
    t = bind(min_(ax, _f(_ERF_ONE)) - _f(_ERF_MID))
    big = bind(min_(_horner(t, _ERF_BIG, fused), _f(1.0)))
    y = select(ax < _f(_ERF_SPLIT), small, select(x < _f(0.0), -big, big))
    return select(intrin("isnan", x), x, y)


def _erf_mlas(x: PrimExpr, bind: Bind) -> PrimExpr:
    """MLAS's erf (`MlasErfKernelFma3`, core/mlas/lib/erf.cpp's constants) in its order of
    multiply-adds: an odd polynomial below _MLAS_ERF_SPLIT, `1 - exp(-|x| Q(|x|))` from
    there (|x| clamped to _MLAS_ERF_UPPER, where it is 1), the sign of `x` put back."""
    ax = bind(min_(intrin("abs", x), _f(_MLAS_ERF_UPPER)))
    small = intrin("fma", _horner(bind(ax * ax), _MLAS_ERF_SMALL, True), ax, ax)
    # MLAS computes the large branch on 0 for small |x| (its result is then unused)
    q = intrin("fma", _horner(ax, _MLAS_ERF_BIG, True), ax, ax)
    a = bind(max_(-q, _f(_MLAS_ERF_EXP_LO)))
    # m = round(a log2(e)) through the bits, as in _exp_parts; a >= -16 here, so 2^m is normal
    n = bind(reinterpret(intrin("fma", _f(_LOG2E), a, _f(_ROUNDER)), I32) - _i(_ROUNDER_BITS))
    m = bind(Cast(F32, n))
    f = bind(intrin("fma", m, _f(_MLAS_LN2_LO), intrin("fma", m, _f(_MLAS_LN2_HI), a)))
    two_m = reinterpret((n + _i(127)) << _i(23), F32)
    big = _f(1.0) - _horner(f, _MLAS_ERF_EXP_P, True) * two_m
    y = select(ax < _f(_ERF_SPLIT), small, big)
    # |erf| with the sign bit of x; NaN passes through
    signed = reinterpret(reinterpret(y, I32) | (reinterpret(x, I32) & _i(_SIGN_BIT)), F32)
    return select(intrin("isnan", x), x, signed)


# The short erf of reduced-precision targets: Abramowitz and Stegun's 7.1.28,
# `1 - (1 + a1 |x| + ... + a6 |x|^6)^-16` (within 3e-7 of erf), and below
# _ERF_SHORT_SMALL `x (2 / sqrt(pi) - (2 / (3 sqrt(pi))) x^2)`, where the subtraction from
# 1 would cancel. In float32: within 1.8e-6 of erf, and 2.5e-5 of it relatively.
_ERF_SHORT = (4.30638e-5, 2.765672e-4, 1.520143e-4, 9.2705272e-3, 4.22820123e-2,
              7.05230784e-2, 1.0)
_ERF_SHORT_SMALL = 0.0625
_ERF_SHORT_SERIES = (-0.37612638903183754, 1.1283791670955126)


def erf_short_f32(x: PrimExpr, *, fused: bool = False, bind: Bind = _inline) -> PrimExpr:
    """`erf(x)` of a float32 `x` to about 2e-6 (the constants above): 7 multiply-adds,
    four squarings and a division, where erf_f32 takes about 20 multiply-adds and an
    `exp`. For targets that compute in bfloat16 (`precision=bf16`), whose GELUs feed
    products of 8-bit significands."""
    x = bind(x)
    ax = bind(intrin("abs", x))
    p = bind(_horner(ax, _ERF_SHORT, fused))
    for _ in range(4):  # p^16; past float32's range inf, and the quotient 0 (erf 1)
        p = bind(p * p)
    big = _f(1.0) - _f(1.0) / p
    signed = reinterpret(reinterpret(big, I32) | (reinterpret(x, I32) & _i(_SIGN_BIT)), F32)
    small = x * _mul_add(_f(_ERF_SHORT_SERIES[0]), x * x, _f(_ERF_SHORT_SERIES[1]), fused)
    y = select(ax < _f(_ERF_SHORT_SMALL), small, signed)
    return select(intrin("isnan", x), x, y)


#: The intrinsics built here, by name.
BUILDERS: dict[str, Callable[..., PrimExpr]] = {
    "exp": exp_f32, "tanh": tanh_f32, "sigmoid": sigmoid_f32, "erf": erf_f32}
#: Target kinds whose kernels get these forms (CPUs; GPUs have fast math libraries).
CPU_KINDS = frozenset({"llvm", "llvmjit", "c"})

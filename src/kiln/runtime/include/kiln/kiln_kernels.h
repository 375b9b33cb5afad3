/* kiln_kernels.h: the small C helpers kiln's generated C calls.

   Each helper is named kiln_<op>_<suffix>; the suffix names the C type it works
   on: i32 (int32_t, also used for the narrower integers after C's promotion),
   i64, u32, u64, f32 (float; float16 and bfloat16 compute in float) and f64.
   They exist where C has no operator with the IR's meaning (kiln.ir.evaluate):
   rounding division and modulo, min/max with Python's tie rule, integer pow/abs,
   and the 16-bit float conversions (correctly rounded, ties to even).

   The C backend copies into a translation unit only the helpers it uses
   (kiln.codegen.cfamily.helpers), so generated files stay self-contained: each
   helper starts at a `KILN_HELPER(name)` line, optionally followed by the
   helpers it needs in `KILN_NEEDS(...)`; both are markers for that reader and
   expand to nothing. The whole header also compiles alone (tests/codegen/
   test_kiln_kernels_header.py: -std=c11 -Wall -Wextra -Werror). */
#ifndef KILN_KERNELS_H
#define KILN_KERNELS_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define KILN_HELPER(name)
#define KILN_NEEDS(...)


KILN_HELPER(kiln_narrow_float)
/* Round `x` to a binary float with `exp_bits` exponent and `man_bits` fraction bits
   (ties to even, overflow to inf, NaN stays NaN); return its bit pattern. */
static inline uint16_t kiln_narrow_float(double x, int exp_bits, int man_bits) {
  uint64_t b, man, q, rem, half;
  uint16_t sign, inf;
  int64_t e;
  int bias, shift;
  memcpy(&b, &x, sizeof b);
  sign = (uint16_t)((b >> 48) & 0x8000u);
  inf = (uint16_t)(((1u << exp_bits) - 1u) << man_bits);
  e = (int64_t)((b >> 52) & 0x7ffu);
  man = b & UINT64_C(0xfffffffffffff);
  if (e == 0x7ff) {
    return (uint16_t)(sign | inf | (man != 0 ? 1u << (man_bits - 1) : 0u));
  }
  if (e == 0) {
    return sign; /* double subnormals are far below the 16-bit range */
  }
  bias = (1 << (exp_bits - 1)) - 1;
  e = e - 1023 + bias;
  if (e >= (1 << exp_bits) - 1) {
    return (uint16_t)(sign | inf);
  }
  man |= UINT64_C(1) << 52;
  shift = 52 - man_bits + (e >= 1 ? 0 : (int)(1 - (e < -64 ? -64 : e)));
  if (shift > 63) {
    return sign;
  }
  q = man >> shift;
  rem = man & ((UINT64_C(1) << shift) - 1u);
  half = UINT64_C(1) << (shift - 1);
  if (rem > half || (rem == half && (q & 1u) != 0)) {
    q += 1;
  }
  /* For a normal result q still holds the implicit bit, which adds one to
     (e - 1); a carry out of the fraction moves to the next binade (or inf). */
  return (uint16_t)(sign | ((e >= 1 ? (uint64_t)(e - 1) << man_bits : 0u) + q));
}

KILN_HELPER(kiln_dot4_u8s8)
/* acc + the products of a's four bytes (unsigned) and b's (signed), wrapping like
   int32 in the IR (the `dot4_u8s8` intrinsic; docs/quantization.md). Each product
   fits 16 bits, the four fit 18: only the last add wraps, done unsigned. Sign
   extension by xor/subtract avoids C's implementation-defined narrowing; compilers
   fold it to one sign-extending load.
   With the Arm DSP extension (Cortex-M4/M7/M33/M55: __ARM_FEATURE_SIMD32) the bytes
   are widened in pairs, bytes 0 and 2 then 1 and 3 (UXTB16 for a, SXTB16 for b, the
   odd bytes rotated down first), and two SMLADs add the pair products: an unsigned
   byte is a non-negative 16-bit lane, each product fits, and SMLAD's accumulation
   wraps modulo 2^32 like the IR's int32. */
#if defined(__ARM_FEATURE_SIMD32) && __ARM_FEATURE_SIMD32
#include <arm_acle.h>
#endif
static inline int32_t kiln_dot4_u8s8(int32_t acc, int32_t a, int32_t b) {
  uint32_t ua = (uint32_t)a, ub = (uint32_t)b;
#if defined(__ARM_FEATURE_SIMD32) && __ARM_FEATURE_SIMD32
  uint32_t ua_odd = (ua >> 8) | (ua << 24), ub_odd = (ub >> 8) | (ub << 24);
  acc = __smlad((int16x2_t)__uxtb16(ua), __sxtb16((int8x4_t)ub), acc);
  return __smlad((int16x2_t)__uxtb16(ua_odd), __sxtb16((int8x4_t)ub_odd), acc);
#else
  int32_t sum = 0;
  int shift;
  for (shift = 0; shift < 32; shift += 8) {
    int32_t x = (int32_t)((ua >> shift) & 0xFFu);
    int32_t w = (int32_t)(((ub >> shift) & 0xFFu) ^ 0x80u) - 0x80;
    sum += x * w;
  }
  return (int32_t)((uint32_t)acc + (uint32_t)sum);
#endif
}

KILN_HELPER(kiln_dot4_u8s8_sat16)
/* The `dot4_u8s8_sat16` intrinsic: like kiln_dot4_u8s8, but the products of bytes 0 and
   1 and those of bytes 2 and 3 are added in pairs, each pair sum clamped to int16 (x86
   vpmaddubsw, then vpmaddwd by ones: onnxruntime's MLAS u8 x s8 kernels on AVX2; the
   `int8-pairs=saturate` target attribute, docs/quantization.md). */
static inline int32_t kiln_dot4_u8s8_sat16(int32_t acc, int32_t a, int32_t b) {
  uint32_t ua = (uint32_t)a, ub = (uint32_t)b, total = (uint32_t)acc;
  int shift;
  for (shift = 0; shift < 32; shift += 16) {
    int32_t x0 = (int32_t)((ua >> shift) & 0xFFu), x1 = (int32_t)((ua >> (shift + 8)) & 0xFFu);
    int32_t w0 = (int32_t)(((ub >> shift) & 0xFFu) ^ 0x80u) - 0x80;
    int32_t w1 = (int32_t)(((ub >> (shift + 8)) & 0xFFu) ^ 0x80u) - 0x80;
    int32_t pair = x0 * w0 + x1 * w1;
    pair = pair > 32767 ? 32767 : pair < -32768 ? -32768 : pair;
    total += (uint32_t)pair;
  }
  return (int32_t)total;
}

KILN_HELPER(kiln_dot2_i16)
/* The `dot2_i16` intrinsic: acc + the products of a's and b's 16-bit halves, both
   signed, wrapping like int32 in the IR (x86 vpmaddwd and an add: the exact int8
   products on AVX2 without VNNI, values stored widened in int16 pairs;
   docs/quantization.md). The products are summed unsigned: -32768 * -32768 twice is
   the one sum past int32. */
static inline int32_t kiln_dot2_i16(int32_t acc, int32_t a, int32_t b) {
  uint32_t ua = (uint32_t)a, ub = (uint32_t)b, total = (uint32_t)acc;
  int shift;
  for (shift = 0; shift < 32; shift += 16) {
    int32_t x = (int32_t)(((ua >> shift) & 0xFFFFu) ^ 0x8000u) - 0x8000;
    int32_t w = (int32_t)(((ub >> shift) & 0xFFFFu) ^ 0x8000u) - 0x8000;
    total += (uint32_t)x * (uint32_t)w;
  }
  return (int32_t)total;
}

KILN_HELPER(kiln_f16_from_double)
KILN_NEEDS(kiln_narrow_float)
/* float16 bit pattern of x (IEEE binary16, round to nearest even). */
static inline uint16_t kiln_f16_from_double(double x) {
  return kiln_narrow_float(x, 5, 10);
}

KILN_HELPER(kiln_bf16_from_double)
KILN_NEEDS(kiln_narrow_float)
/* bfloat16 bit pattern of x (round to nearest even). */
static inline uint16_t kiln_bf16_from_double(double x) {
  return kiln_narrow_float(x, 8, 7);
}

KILN_HELPER(kiln_f16_to_float)
/* The value of a float16 bit pattern (exact). */
static inline float kiln_f16_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = ((uint32_t)h >> 10) & 0x1fu;
  uint32_t man = (uint32_t)h & 0x3ffu;
  uint32_t bits;
  float f;
  if (e == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13); /* inf, NaN */
  } else if (e != 0) {
    bits = sign | ((e + 112u) << 23) | (man << 13);
  } else {
    f = (float)man * 5.9604644775390625e-8f; /* zero or subnormal: man * 2^-24 */
    return sign != 0 ? -f : f;
  }
  memcpy(&f, &bits, sizeof f);
  return f;
}

KILN_HELPER(kiln_bf16_to_float)
/* The value of a bfloat16 bit pattern (exact). */
static inline float kiln_bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

KILN_HELPER(kiln_f32_bits)
/* The bits of a float (the IR's Reinterpret; memcpy compiles to a register move). */
static inline uint32_t kiln_f32_bits(float x) {
  uint32_t bits;
  memcpy(&bits, &x, sizeof bits);
  return bits;
}

KILN_HELPER(kiln_f32_from_bits)
/* The float with these bits (the IR's Reinterpret). */
static inline float kiln_f32_from_bits(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

KILN_HELPER(kiln_f64_bits)
/* The bits of a double (the IR's Reinterpret). */
static inline uint64_t kiln_f64_bits(double x) {
  uint64_t bits;
  memcpy(&bits, &x, sizeof bits);
  return bits;
}

KILN_HELPER(kiln_f64_from_bits)
/* The double with these bits (the IR's Reinterpret). */
static inline double kiln_f64_from_bits(uint64_t bits) {
  double f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

KILN_HELPER(kiln_f16_round)
KILN_NEEDS(kiln_f16_from_double, kiln_f16_to_float)
/* x rounded to the nearest float16 value: every float16 operation ends here. */
static inline float kiln_f16_round(double x) {
  return kiln_f16_to_float(kiln_f16_from_double(x));
}

KILN_HELPER(kiln_bf16_round)
KILN_NEEDS(kiln_bf16_from_double, kiln_bf16_to_float)
/* x rounded to the nearest bfloat16 value: every bfloat16 operation ends here. */
static inline float kiln_bf16_round(double x) {
  return kiln_bf16_to_float(kiln_bf16_from_double(x));
}

KILN_HELPER(kiln_div_i32)
/* a / b truncated, as the IR defines it on every input (docs/codegen-c.md): by
   zero 0, and INT_MIN / -1 wraps to INT_MIN; C's `/` would trap on both. */
static inline int32_t kiln_div_i32(int32_t a, int32_t b) {
  if (b == 0) {
    return 0;
  }
  return b == -1 ? (int32_t)((uint32_t)0 - (uint32_t)a) : a / b;
}

KILN_HELPER(kiln_div_i64)
/* a / b truncated, as the IR defines it on every input (docs/codegen-c.md): by
   zero 0, and INT_MIN / -1 wraps to INT_MIN; C's `/` would trap on both. */
static inline int64_t kiln_div_i64(int64_t a, int64_t b) {
  if (b == 0) {
    return 0;
  }
  return b == -1 ? (int64_t)((uint64_t)0 - (uint64_t)a) : a / b;
}

KILN_HELPER(kiln_div_u32)
/* a / b; by zero 0 (docs/codegen-c.md). */
static inline uint32_t kiln_div_u32(uint32_t a, uint32_t b) {
  return b == 0 ? 0 : a / b;
}

KILN_HELPER(kiln_div_u64)
/* a / b; by zero 0 (docs/codegen-c.md). */
static inline uint64_t kiln_div_u64(uint64_t a, uint64_t b) {
  return b == 0 ? 0 : a / b;
}

KILN_HELPER(kiln_mod_i32)
/* a % b with the sign of a; by zero (and by -1, which C's `%` may trap on) 0. */
static inline int32_t kiln_mod_i32(int32_t a, int32_t b) {
  return (b == 0 || b == -1) ? 0 : a % b;
}

KILN_HELPER(kiln_mod_i64)
/* a % b with the sign of a; by zero (and by -1, which C's `%` may trap on) 0. */
static inline int64_t kiln_mod_i64(int64_t a, int64_t b) {
  return (b == 0 || b == -1) ? 0 : a % b;
}

KILN_HELPER(kiln_mod_u32)
/* a % b; by zero 0 (docs/codegen-c.md). */
static inline uint32_t kiln_mod_u32(uint32_t a, uint32_t b) {
  return b == 0 ? 0 : a % b;
}

KILN_HELPER(kiln_mod_u64)
/* a % b; by zero 0 (docs/codegen-c.md). */
static inline uint64_t kiln_mod_u64(uint64_t a, uint64_t b) {
  return b == 0 ? 0 : a % b;
}

KILN_HELPER(kiln_floordiv_i32)
/* a / b rounded toward negative infinity; by zero 0, INT_MIN / -1 is INT_MIN. */
static inline int32_t kiln_floordiv_i32(int32_t a, int32_t b) {
  int32_t q;
  if (b == 0) {
    return 0;
  }
  if (b == -1) {
    return (int32_t)((uint32_t)0 - (uint32_t)a);
  }
  q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

KILN_HELPER(kiln_floordiv_i64)
/* a / b rounded toward negative infinity; by zero 0, INT_MIN / -1 is INT_MIN. */
static inline int64_t kiln_floordiv_i64(int64_t a, int64_t b) {
  int64_t q;
  if (b == 0) {
    return 0;
  }
  if (b == -1) {
    return (int64_t)((uint64_t)0 - (uint64_t)a);
  }
  q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

KILN_HELPER(kiln_floordiv_f32)
static inline float kiln_floordiv_f32(float a, float b) {
  return floorf(a / b);
}

KILN_HELPER(kiln_floordiv_f64)
static inline double kiln_floordiv_f64(double a, double b) {
  return floor(a / b);
}

KILN_HELPER(kiln_floormod_i32)
/* a - b * floor(a / b): the remainder takes the sign of b; by zero or -1, 0. */
static inline int32_t kiln_floormod_i32(int32_t a, int32_t b) {
  int32_t r;
  if (b == 0 || b == -1) {
    return 0;
  }
  r = a % b;
  return (r != 0 && (r < 0) != (b < 0)) ? r + b : r;
}

KILN_HELPER(kiln_floormod_i64)
/* a - b * floor(a / b): the remainder takes the sign of b; by zero or -1, 0. */
static inline int64_t kiln_floormod_i64(int64_t a, int64_t b) {
  int64_t r;
  if (b == 0 || b == -1) {
    return 0;
  }
  r = a % b;
  return (r != 0 && (r < 0) != (b < 0)) ? r + b : r;
}

KILN_HELPER(kiln_floormod_f32)
static inline float kiln_floormod_f32(float a, float b) {
  return a - floorf(a / b) * b;
}

KILN_HELPER(kiln_floormod_f64)
static inline double kiln_floormod_f64(double a, double b) {
  return a - floor(a / b) * b;
}

KILN_HELPER(kiln_min_i32)
/* min(a, b): b only if b < a (so a on ties and, for floats, when unordered). */
static inline int32_t kiln_min_i32(int32_t a, int32_t b) {
  return b < a ? b : a;
}

KILN_HELPER(kiln_min_i64)
/* min(a, b): b only if b < a (so a on ties and, for floats, when unordered). */
static inline int64_t kiln_min_i64(int64_t a, int64_t b) {
  return b < a ? b : a;
}

KILN_HELPER(kiln_min_u32)
/* min(a, b): b only if b < a (so a on ties and, for floats, when unordered). */
static inline uint32_t kiln_min_u32(uint32_t a, uint32_t b) {
  return b < a ? b : a;
}

KILN_HELPER(kiln_min_u64)
/* min(a, b): b only if b < a (so a on ties and, for floats, when unordered). */
static inline uint64_t kiln_min_u64(uint64_t a, uint64_t b) {
  return b < a ? b : a;
}

KILN_HELPER(kiln_min_f32)
/* min(a, b) as numpy's minimum (the IR's `min`): a on ties, and a NaN operand
   wins, whichever side it is on. */
static inline float kiln_min_f32(float a, float b) {
  return (a <= b || a != a) ? a : b;
}

KILN_HELPER(kiln_min_f64)
/* min(a, b) as numpy's minimum (the IR's `min`): a on ties, and a NaN operand
   wins, whichever side it is on. */
static inline double kiln_min_f64(double a, double b) {
  return (a <= b || a != a) ? a : b;
}

KILN_HELPER(kiln_max_i32)
/* max(a, b): b only if b > a (so a on ties and, for floats, when unordered). */
static inline int32_t kiln_max_i32(int32_t a, int32_t b) {
  return b > a ? b : a;
}

KILN_HELPER(kiln_max_i64)
/* max(a, b): b only if b > a (so a on ties and, for floats, when unordered). */
static inline int64_t kiln_max_i64(int64_t a, int64_t b) {
  return b > a ? b : a;
}

KILN_HELPER(kiln_max_u32)
/* max(a, b): b only if b > a (so a on ties and, for floats, when unordered). */
static inline uint32_t kiln_max_u32(uint32_t a, uint32_t b) {
  return b > a ? b : a;
}

KILN_HELPER(kiln_max_u64)
/* max(a, b): b only if b > a (so a on ties and, for floats, when unordered). */
static inline uint64_t kiln_max_u64(uint64_t a, uint64_t b) {
  return b > a ? b : a;
}

KILN_HELPER(kiln_max_f32)
/* max(a, b) as numpy's maximum (the IR's `max`): a on ties, and a NaN operand
   wins, whichever side it is on. */
static inline float kiln_max_f32(float a, float b) {
  return (a >= b || a != a) ? a : b;
}

KILN_HELPER(kiln_max_f64)
/* max(a, b) as numpy's maximum (the IR's `max`): a on ties, and a NaN operand
   wins, whichever side it is on. */
static inline double kiln_max_f64(double a, double b) {
  return (a >= b || a != a) ? a : b;
}

KILN_HELPER(kiln_pow_i32)
/* a ** b by repeated squaring, wrapping on overflow like numpy. */
static inline int32_t kiln_pow_i32(int32_t a, int32_t b) {
  uint32_t result = 1, base = (uint32_t)a;
  if (b < 0) {
    /* the real result truncated toward zero: 0 unless |a| == 1 */
    return a == 1 ? 1 : (a == -1 ? ((b & 1) != 0 ? -1 : 1) : 0);
  }
  while (b > 0) {
    if ((b & 1) != 0) {
      result *= base;
    }
    base *= base;
    b >>= 1;
  }
  return (int32_t)result;
}

KILN_HELPER(kiln_pow_i64)
/* a ** b by repeated squaring, wrapping on overflow like numpy. */
static inline int64_t kiln_pow_i64(int64_t a, int64_t b) {
  uint64_t result = 1, base = (uint64_t)a;
  if (b < 0) {
    /* the real result truncated toward zero: 0 unless |a| == 1 */
    return a == 1 ? 1 : (a == -1 ? ((b & 1) != 0 ? -1 : 1) : 0);
  }
  while (b > 0) {
    if ((b & 1) != 0) {
      result *= base;
    }
    base *= base;
    b >>= 1;
  }
  return (int64_t)result;
}

KILN_HELPER(kiln_pow_u32)
/* a ** b by repeated squaring, wrapping on overflow like numpy. */
static inline uint32_t kiln_pow_u32(uint32_t a, uint32_t b) {
  uint32_t result = 1, base = (uint32_t)a;
  while (b > 0) {
    if ((b & 1) != 0) {
      result *= base;
    }
    base *= base;
    b >>= 1;
  }
  return (uint32_t)result;
}

KILN_HELPER(kiln_pow_u64)
/* a ** b by repeated squaring, wrapping on overflow like numpy. */
static inline uint64_t kiln_pow_u64(uint64_t a, uint64_t b) {
  uint64_t result = 1, base = (uint64_t)a;
  while (b > 0) {
    if ((b & 1) != 0) {
      result *= base;
    }
    base *= base;
    b >>= 1;
  }
  return (uint64_t)result;
}

KILN_HELPER(kiln_abs_i32)
/* |a|; the most negative value maps to itself (two's complement wrap). */
static inline int32_t kiln_abs_i32(int32_t a) {
  return a < 0 ? (int32_t)(0u - (uint32_t)a) : a;
}

KILN_HELPER(kiln_abs_i64)
/* |a|; the most negative value maps to itself (two's complement wrap). */
static inline int64_t kiln_abs_i64(int64_t a) {
  return a < 0 ? (int64_t)(0u - (uint64_t)a) : a;
}

#endif /* KILN_KERNELS_H */

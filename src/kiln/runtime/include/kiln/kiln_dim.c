/*
 * kiln_dim.c -- checked int64 arithmetic for symbolic sizes (kiln.dim_expr,
 * docs/dynamic-shapes.md). A dimension expression printed to C
 * (`kiln.dim_expr.to_c`) is nested calls of these helpers, each taking the
 * address of one int32_t status: a result outside int64 ORs KILN_DIM_OVERFLOW
 * into it, a zero divisor KILN_DIM_ZERO_DIVISOR, and the helper returns 0
 * instead of wrapping; the caller checks the status once, after the whole
 * expression. Failures only ever add bits, so the status does not depend on the
 * order C evaluates a call's arguments in, and it is the one kiln.dim_expr.compute
 * gives in Python.
 *
 * Portable C99 (no compiler builtins): host.c holds this text in place of
 * kiln_host.c's #include of it, and kernels.c (c backend) once when a kernel
 * sizes a buffer from symbolic dimensions. Tests compile it alone.
 */
#ifndef KILN_DIM_C
#define KILN_DIM_C
#include <stdint.h>

#define KILN_DIM_OVERFLOW 1
#define KILN_DIM_ZERO_DIVISOR 2

static inline int64_t kiln_dim_fail(int32_t* status, int32_t bit) {
  *status |= bit;
  return 0;
}

static inline int64_t kiln_dim_add(int64_t a, int64_t b, int32_t* status) {
  if ((b > 0 && a > INT64_MAX - b) || (b < 0 && a < INT64_MIN - b)) {
    return kiln_dim_fail(status, KILN_DIM_OVERFLOW);
  }
  return a + b;
}

static inline int64_t kiln_dim_sub(int64_t a, int64_t b, int32_t* status) {
  if ((b < 0 && a > INT64_MAX + b) || (b > 0 && a < INT64_MIN + b)) {
    return kiln_dim_fail(status, KILN_DIM_OVERFLOW);
  }
  return a - b;
}

static inline int64_t kiln_dim_mul(int64_t a, int64_t b, int32_t* status) {
  /* the quotients are exact limits: |a * b| <= limit iff |a| <= limit / |b| */
  if (a > 0 ? (b > 0 ? a > INT64_MAX / b : b < INT64_MIN / a)
            : (b > 0 ? a < INT64_MIN / b : (a != 0 && b < INT64_MAX / a))) {
    return kiln_dim_fail(status, KILN_DIM_OVERFLOW);
  }
  return a * b;
}

static inline int64_t kiln_dim_neg(int64_t a, int32_t* status) {
  if (a == INT64_MIN) {
    return kiln_dim_fail(status, KILN_DIM_OVERFLOW);
  }
  return -a;
}

/* Python's // (rounds toward minus infinity). */
static inline int64_t kiln_dim_floordiv(int64_t a, int64_t b, int32_t* status) {
  int64_t q;
  if (b == 0) {
    return kiln_dim_fail(status, KILN_DIM_ZERO_DIVISOR);
  }
  if (a == INT64_MIN && b == -1) {
    return kiln_dim_fail(status, KILN_DIM_OVERFLOW);
  }
  q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* Python's % (the sign of the divisor). */
static inline int64_t kiln_dim_floormod(int64_t a, int64_t b, int32_t* status) {
  int64_t r;
  if (b == 0) {
    return kiln_dim_fail(status, KILN_DIM_ZERO_DIVISOR);
  }
  if (b == -1) {
    return 0; /* INT64_MIN % -1 is undefined in C; every x % -1 is 0 */
  }
  r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}

static inline int64_t kiln_dim_min(int64_t a, int64_t b, int32_t* status) {
  (void)status;
  return b < a ? b : a;
}

static inline int64_t kiln_dim_max(int64_t a, int64_t b, int32_t* status) {
  (void)status;
  return b > a ? b : a;
}
#endif /* KILN_DIM_C */

/*
 * kiln_swap_state.c -- the interpreter of a library's swap program (docs/format.md, "The
 * swap program"; docs/runtime.md, "Swapping weights"): `{prefix}_swap_weights` (host.c,
 * kiln_swap.c) checks the raw weights, then calls KILN_SWAP_RUN here to rebuild every
 * constant aside (a bad index or a failed allocation leaves the old weights) and install
 * them under host.c's call guard (KILN_SWAP_PAUSE / KILN_SWAP_RESUME). The steps run in
 * numpy's order of float operations (kiln.runtime.swap, its reference), so the constants
 * are the compile's bit for bit; `dot` sums in order of k (numpy's BLAS may differ in the
 * last bit).
 *
 * Its own object (`swap_runtime.c`, written beside `swap_program.c` when the library has
 * a program): the same text for every model of a prefix, so a build compiles it once
 * (kiln.runtime.object_cache) and host.c stays quick to compile. Linux only (mprotect,
 * /proc/self/maps), with threads, as host.c's entry: elsewhere (firmware, an MLF
 * archive's sources, wasm) it is empty. kiln.codegen.swap_program writes a few #defines, then this file:
 *   KILN_SWAP_RUN     `{prefix}_swap_run` (hidden; host.c holds a weak stand-in)
 *   KILN_SWAP_PAUSE   `{prefix}_swap_pause`, KILN_SWAP_RESUME `{prefix}_swap_resume`
 *   KILN_SWAP_CONSTS  `{prefix}_consts`
 *   KILN_SWAP_REWRITTEN `{prefix}_check_rewritten` (kiln_check.c, hidden; absent from a
 *                     library without the weights check: a weak reference)
 */
#if defined(__linux__) && !defined(KILN_NO_THREADS) /* else host.c's stand-in answers */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* mprotect, madvise, sysconf (not in ISO C) */
#endif
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h> /* the IEEE square root without libm */
#endif

#define KILN_SWAP_VISIBLE __attribute__((visibility("hidden")))
#define KILN_SWAP_POPULATE_WRITE 23 /* MADV_POPULATE_WRITE (Linux 5.14; else EINVAL) */
#define KILN_SWAP_RANK 8

/* Return codes (kiln.h's KILN_SWAP_*). */
#define KILN_SWAP_ENOMEM 1
#define KILN_SWAP_EUNSUPPORTED 2
#define KILN_SWAP_EPROTECT 3
#define KILN_SWAP_EVALUE 4

enum { /* the program's dtypes (kiln.codegen.swap_program.DTYPES) */
  KILN_SWAP_BOOL, KILN_SWAP_I8, KILN_SWAP_I16, KILN_SWAP_I32, KILN_SWAP_I64, KILN_SWAP_U8,
  KILN_SWAP_U16, KILN_SWAP_U32, KILN_SWAP_U64, KILN_SWAP_F32, KILN_SWAP_F64, KILN_SWAP_NTYPES
};
enum { /* the program's nodes (kiln.codegen.swap_program.OPS) */
  KILN_SWAP_WEIGHT_OP = 1, KILN_SWAP_VALUE, KILN_SWAP_FULL, KILN_SWAP_TRANSPOSE,
  KILN_SWAP_RESHAPE, KILN_SWAP_ASTYPE, KILN_SWAP_PAD, KILN_SWAP_BROADCAST, KILN_SWAP_SLICE,
  KILN_SWAP_APPLY
};
enum { /* the functions of an APPLY node */
  KILN_SWAP_ADD = 1, KILN_SWAP_SUB, KILN_SWAP_MUL, KILN_SWAP_DIV, KILN_SWAP_SQRT,
  KILN_SWAP_DOT, KILN_SWAP_TAKE
};

/* Bits of each program dtype. */
static const uint8_t kiln_swap_bits[KILN_SWAP_NTYPES] = {8, 8, 16, 32, 64, 8, 16, 32, 64, 32,
                                                         64};

/* DLPack's DLTensor, laid out as kiln/kiln.h says (host.c checked each one). */
typedef struct {
  void* data;
  int32_t device_type, device_id;
  int32_t ndim;
  uint8_t code, bits;
  uint16_t lanes;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} kiln_swap_tensor;

extern KILN_SWAP_VISIBLE const uint8_t KILN_SWAP_CONSTS[];
KILN_SWAP_VISIBLE void KILN_SWAP_PAUSE(void);
KILN_SWAP_VISIBLE void KILN_SWAP_RESUME(void);
KILN_SWAP_VISIBLE int32_t KILN_SWAP_RUN(const void* raw, const int64_t* program, char* error,
                                        size_t size);

/* An array while the program runs: compact, C order; `own`: `data` is malloc'd here. */
typedef struct {
  int32_t dtype, ndim, own;
  int64_t shape[KILN_SWAP_RANK];
  int64_t n;
  void* data;
} kiln_swap_array;

typedef struct {
  const int64_t* pc;             /* the next word of the program */
  const kiln_swap_tensor* raw;   /* the raw weights, in the program's order */
  int32_t status;                /* the first failure */
  char* error;                   /* its message */
  size_t error_size;
} kiln_swap_state;

static size_t kiln_swap_itemsize(int32_t dtype) {
  return (size_t)kiln_swap_bits[dtype] / 8;
}

static void kiln_swap_free(kiln_swap_array* a) {
  if (a->own) free(a->data);
  a->data = NULL;
  a->own = 0;
}

static int32_t kiln_swap_fail(kiln_swap_state* run, int32_t status, const char* what) {
  if (run->status == 0) {
    run->status = status;
    snprintf(run->error, run->error_size, "swap_weights: %s", what);
  }
  return status;
}

/* A fresh array of the node's dtype and shape (read from the program). */
static int32_t kiln_swap_head(kiln_swap_state* run, kiln_swap_array* a) {
  int32_t i;
  a->dtype = (int32_t)*run->pc++;
  a->ndim = (int32_t)*run->pc++;
  a->n = 1;
  a->own = 0;
  a->data = NULL;
  if (a->dtype < 0 || a->dtype >= KILN_SWAP_NTYPES || a->ndim < 0 || a->ndim > KILN_SWAP_RANK)
    return kiln_swap_fail(run, KILN_SWAP_EUNSUPPORTED, "damaged swap program");
  for (i = 0; i < a->ndim; ++i) a->n *= a->shape[i] = *run->pc++;
  return 0;
}

static int32_t kiln_swap_alloc(kiln_swap_state* run, kiln_swap_array* a, int zero) {
  size_t bytes = (size_t)a->n * kiln_swap_itemsize(a->dtype);
  a->data = zero ? calloc(bytes ? bytes : 1, 1) : malloc(bytes ? bytes : 1);
  a->own = 1;
  return a->data ? 0 : kiln_swap_fail(run, KILN_SWAP_ENOMEM, "out of memory");
}

/* One row of `n` elements of `size` bytes, at element strides `dstep` and `sstep`. */
#define KILN_SWAP_ROW(T)                                                     \
  for (j = 0; j < n; ++j) ((T*)dst)[j * dstep] = ((const T*)src)[j * sstep]; \
  break;
static void kiln_swap_row(char* dst, const char* src, size_t size, int64_t n, int64_t dstep,
                          int64_t sstep) {
  int64_t j;
  if (dstep == 1 && sstep == 1) {
    memcpy(dst, src, (size_t)n * size);
    return;
  }
  switch (size) {
    case 1: KILN_SWAP_ROW(uint8_t)
    case 2: KILN_SWAP_ROW(uint16_t)
    case 4: KILN_SWAP_ROW(uint32_t)
    default: KILN_SWAP_ROW(uint64_t)
  }
}

/* Copy `counts` elements (C order over `ndim` axes) from `src` at element strides
   `ss` to `dst` at element strides `ds`: transposes, slices, pads and broadcasts, a
   row (the last axis) at a time. */
static void kiln_swap_copy(char* dst, const char* src, size_t size, int32_t ndim,
                           const int64_t* counts, const int64_t* ds, const int64_t* ss) {
  int64_t idx[KILN_SWAP_RANK] = {0}, rows = 1, k, d = 0, s = 0, last;
  int32_t i;
  if (ndim == 0) {
    memcpy(dst, src, size);
    return;
  }
  last = counts[ndim - 1];
  for (i = 0; i < ndim - 1; ++i) rows *= counts[i];
  if (last == 0) return;
  for (k = 0; k < rows; ++k) {
    kiln_swap_row(dst + d * (int64_t)size, src + s * (int64_t)size, size, last, ds[ndim - 1],
                  ss[ndim - 1]);
    for (i = ndim - 2; i >= 0; --i) {
      d += ds[i];
      s += ss[i];
      if (++idx[i] < counts[i]) break;
      d -= ds[i] * counts[i];
      s -= ss[i] * counts[i];
      idx[i] = 0;
    }
  }
}

static void kiln_swap_strides(const int64_t* shape, int32_t ndim, int64_t* out) {
  int64_t s = 1;
  int32_t i;
  for (i = ndim - 1; i >= 0; --i) {
    out[i] = s;
    s *= shape[i];
  }
}

/* Element-wise C casts between every pair of dtypes (numpy's astype). */
#define KILN_SWAP_TYPES_A(X, A)                                                              \
  X(A, KILN_SWAP_BOOL, _Bool) X(A, KILN_SWAP_I8, int8_t) X(A, KILN_SWAP_I16, int16_t)      \
  X(A, KILN_SWAP_I32, int32_t) X(A, KILN_SWAP_I64, int64_t) X(A, KILN_SWAP_U8, uint8_t)    \
  X(A, KILN_SWAP_U16, uint16_t) X(A, KILN_SWAP_U32, uint32_t) X(A, KILN_SWAP_U64, uint64_t) \
  X(A, KILN_SWAP_F32, float) X(A, KILN_SWAP_F64, double)
#define KILN_SWAP_TYPES_B(X, A)                                                              \
  X(A, KILN_SWAP_BOOL, _Bool) X(A, KILN_SWAP_I8, int8_t) X(A, KILN_SWAP_I16, int16_t)      \
  X(A, KILN_SWAP_I32, int32_t) X(A, KILN_SWAP_I64, int64_t) X(A, KILN_SWAP_U8, uint8_t)    \
  X(A, KILN_SWAP_U16, uint16_t) X(A, KILN_SWAP_U32, uint32_t) X(A, KILN_SWAP_U64, uint64_t) \
  X(A, KILN_SWAP_F32, float) X(A, KILN_SWAP_F64, double)
#define KILN_SWAP_CAST_TO(S, code, D) \
  case code: for (k = 0; k < n; ++k) ((D*)out)[k] = (D)((const S*)in)[k]; break;
#define KILN_SWAP_CAST_FROM(unused, code, S) \
  case code: switch (to) { KILN_SWAP_TYPES_B(KILN_SWAP_CAST_TO, S) default: break; } break;

static void kiln_swap_cast(void* out, int32_t to, const void* in, int32_t from, int64_t n) {
  int64_t k;
  switch (from) {
    KILN_SWAP_TYPES_A(KILN_SWAP_CAST_FROM, 0)
    default: break;
  }
}

/* `a` as dtype `to` (in place of `a`; nothing done when it is already). */
static int32_t kiln_swap_astype(kiln_swap_state* run, kiln_swap_array* a, int32_t to) {
  kiln_swap_array b = *a;
  if (a->dtype == to) return 0;
  b.dtype = to;
  if (kiln_swap_alloc(run, &b, 0) != 0) return run->status;
  kiln_swap_cast(b.data, to, a->data, a->dtype, a->n);
  kiln_swap_free(a);
  *a = b;
  return 0;
}

static double kiln_swap_sqrt(double x) {
#if defined(__SSE2__)
  return _mm_cvtsd_f64(_mm_sqrt_sd(_mm_set_sd(x), _mm_set_sd(x)));
#else
  return __builtin_sqrt(x);
#endif
}

static float kiln_swap_sqrtf(float x) {
#if defined(__SSE2__)
  return _mm_cvtss_f32(_mm_sqrt_ss(_mm_set_ss(x)));
#else
  return __builtin_sqrtf(x);
#endif
}

/* out = f(x[, y]) element-wise with numpy's broadcasting, in float T. */
#define KILN_SWAP_ELEMENTWISE(T, SQRT)                                                      \
  static void kiln_swap_elementwise_##T(int64_t fn, kiln_swap_array* out,                  \
                                        const kiln_swap_array* x, const kiln_swap_array* y) { \
    int64_t xs[KILN_SWAP_RANK] = {0}, ys[KILN_SWAP_RANK] = {0}, idx[KILN_SWAP_RANK] = {0};  \
    int64_t k, i, j, xo = 0, yo = 0, s;                                                     \
    const T* xp = (const T*)x->data;                                                        \
    const T* yp = y ? (const T*)y->data : xp;                                               \
    T* op = (T*)out->data;                                                                  \
    for (s = 1, i = x->ndim - 1, j = out->ndim - 1; i >= 0; --i, --j) {                     \
      xs[j] = x->shape[i] == 1 ? 0 : s;                                                     \
      s *= x->shape[i];                                                                     \
    }                                                                                       \
    for (s = 1, i = (y ? y->ndim : 0) - 1, j = out->ndim - 1; i >= 0; --i, --j) {           \
      ys[j] = y->shape[i] == 1 ? 0 : s;                                                     \
      s *= y->shape[i];                                                                     \
    }                                                                                       \
    for (k = 0; k < out->n; ++k) {                                                          \
      T a = xp[xo], b = yp[yo];                                                             \
      switch (fn) {                                                                         \
        case KILN_SWAP_ADD: op[k] = a + b; break;                                           \
        case KILN_SWAP_SUB: op[k] = a - b; break;                                           \
        case KILN_SWAP_MUL: op[k] = a * b; break;                                           \
        case KILN_SWAP_DIV: op[k] = a / b; break;                                           \
        default: op[k] = SQRT(a); break;                                                    \
      }                                                                                     \
      for (i = out->ndim - 1; i >= 0; --i) {                                                \
        xo += xs[i];                                                                        \
        yo += ys[i];                                                                        \
        if (++idx[i] < out->shape[i]) break;                                                \
        xo -= xs[i] * out->shape[i];                                                        \
        yo -= ys[i] * out->shape[i];                                                        \
        idx[i] = 0;                                                                         \
      }                                                                                     \
    }                                                                                       \
  }                                                                                         \
  /* [m, k] @ [k, n], summed in order of k. */                                              \
  static void kiln_swap_dot_##T(kiln_swap_array* out, const kiln_swap_array* x,            \
                                const kiln_swap_array* y) {                                 \
    int64_t m = x->shape[0], kk = x->shape[1], n = y->shape[1], i, j, k;                    \
    const T* xp = (const T*)x->data;                                                        \
    const T* yp = (const T*)y->data;                                                        \
    for (i = 0; i < m; ++i)                                                                 \
      for (j = 0; j < n; ++j) {                                                             \
        T acc = 0;                                                                          \
        for (k = 0; k < kk; ++k) {                                                          \
          T p = xp[i * kk + k] * yp[k * n + j];                                             \
          acc = acc + p;                                                                    \
        }                                                                                   \
        ((T*)out->data)[i * n + j] = acc;                                                   \
      }                                                                                     \
  }
KILN_SWAP_ELEMENTWISE(float, kiln_swap_sqrtf)
KILN_SWAP_ELEMENTWISE(double, kiln_swap_sqrt)

static int32_t kiln_swap_eval(kiln_swap_state* run, kiln_swap_array* out);

/* numpy's take(x, indices, axis) into `out` (of x's dtype). */
static int32_t kiln_swap_take(kiln_swap_state* run, kiln_swap_array* out, kiln_swap_array* x,
                              kiln_swap_array* idx, int64_t axis) {
  int64_t outer = 1, inner = 1, n = x->shape[axis], i, j;
  size_t size = kiln_swap_itemsize(x->dtype);
  if (kiln_swap_astype(run, idx, KILN_SWAP_I64) != 0) return run->status;
  for (i = 0; i < axis; ++i) outer *= x->shape[i];
  for (i = axis + 1; i < x->ndim; ++i) inner *= x->shape[i];
  for (i = 0; i < outer; ++i)
    for (j = 0; j < idx->n; ++j) {
      int64_t at = ((const int64_t*)idx->data)[j];
      if (at < 0) at += n;
      if (at < 0 || at >= n)
        return kiln_swap_fail(run, KILN_SWAP_EVALUE,
                              "an index of a gathered weight is out of range");
      memcpy((char*)out->data + ((i * idx->n + j) * inner) * (int64_t)size,
             (const char*)x->data + ((i * n + at) * inner) * (int64_t)size, (size_t)inner * size);
    }
  return 0;
}

/* APPLY: fn, the compute dtype, the argument count, take's axis, then the arguments. */
static int32_t kiln_swap_apply(kiln_swap_state* run, kiln_swap_array* out) {
  kiln_swap_array args[2], r = *out;
  int64_t fn = *run->pc++, n_args = *run->pc++, axis = *run->pc++, k;
  int32_t compute = (int32_t)*run->pc++, status = 0;
  if (n_args < 1 || n_args > 2 || compute < 0 || compute >= KILN_SWAP_NTYPES)
    return kiln_swap_fail(run, KILN_SWAP_EUNSUPPORTED, "damaged swap program");
  memset(args, 0, sizeof args);
  for (k = 0; k < n_args && status == 0; ++k) status = kiln_swap_eval(run, &args[k]);
  if (status == 0 && fn != KILN_SWAP_TAKE) {
    for (k = 0; k < n_args && status == 0; ++k) status = kiln_swap_astype(run, &args[k], compute);
  }
  r.dtype = fn == KILN_SWAP_TAKE ? args[0].dtype : compute;
  if (status == 0) status = kiln_swap_alloc(run, &r, 0);
  if (status == 0 && fn == KILN_SWAP_TAKE) {
    status = kiln_swap_take(run, &r, &args[0], &args[1], axis);
  } else if (status == 0 && fn == KILN_SWAP_DOT) {
    if (compute == KILN_SWAP_F32) kiln_swap_dot_float(&r, &args[0], &args[1]);
    else kiln_swap_dot_double(&r, &args[0], &args[1]);
  } else if (status == 0) {
    const kiln_swap_array* y = n_args == 2 ? &args[1] : NULL;
    if (compute == KILN_SWAP_F32) kiln_swap_elementwise_float(fn, &r, &args[0], y);
    else kiln_swap_elementwise_double(fn, &r, &args[0], y);
  }
  for (k = 0; k < n_args; ++k) kiln_swap_free(&args[k]);
  if (status == 0) status = kiln_swap_astype(run, &r, out->dtype);
  if (status != 0) {
    kiln_swap_free(&r);
    return status;
  }
  *out = r;
  return 0;
}

/* The strides, counts and first elements of a view node over its source `x` (transpose,
   pad (into zeros), slice, broadcast), from its parameters at run->pc. */
static void kiln_swap_view(kiln_swap_state* run, int64_t op, const kiln_swap_array* out,
                          const kiln_swap_array* x, int64_t* counts, int64_t* ds,
                          int64_t* ss, int64_t* d0, int64_t* s0) {
  int64_t xs[KILN_SWAP_RANK], os[KILN_SWAP_RANK], i;
  kiln_swap_strides(x->shape, x->ndim, xs);
  kiln_swap_strides(out->shape, out->ndim, os);
  *d0 = *s0 = 0;
  for (i = 0; i < out->ndim; ++i) {
    counts[i] = out->shape[i];
    ds[i] = os[i];
  }
  if (op == KILN_SWAP_TRANSPOSE) {
    for (i = 0; i < out->ndim; ++i) ss[i] = xs[run->pc[i]];
  } else if (op == KILN_SWAP_PAD) {
    for (i = 0; i < out->ndim; ++i) {
      counts[i] = x->shape[i];
      ss[i] = xs[i];
      *d0 += run->pc[i] * os[i];
    }
  } else if (op == KILN_SWAP_SLICE) { /* starts, then steps */
    for (i = 0; i < out->ndim; ++i) {
      ss[i] = xs[i] * run->pc[out->ndim + i];
      *s0 += run->pc[i] * xs[i];
    }
  } else { /* broadcast: x's axes align with out's last ones */
    int64_t lead = out->ndim - x->ndim;
    for (i = 0; i < out->ndim; ++i)
      ss[i] = i < lead || x->shape[i - lead] == 1 ? 0 : xs[i - lead];
  }
}

static int32_t kiln_swap_leaf(kiln_swap_state* run, int64_t op, kiln_swap_array* out) {
  if (op == KILN_SWAP_WEIGHT_OP) {
    const kiln_swap_tensor* t = &run->raw[*run->pc++];
    out->data = (char*)t->data + t->byte_offset;
    out->own = 0;
    return 0;
  }
  if (op == KILN_SWAP_VALUE) {
    int64_t words = *run->pc++;
    out->data = (void*)run->pc; /* the values' bytes, in the program's words */
    out->own = 0;
    run->pc += words;
    return 0;
  }
  if (kiln_swap_alloc(run, out, 0) != 0) return run->status; /* FULL: one element's bytes */
  {
    size_t size = kiln_swap_itemsize(out->dtype);
    int64_t k;
    for (k = 0; k < out->n; ++k) memcpy((char*)out->data + k * (int64_t)size, run->pc, size);
    run->pc++;
  }
  return 0;
}

/* Evaluate the node at run->pc into `out` (run->pc moves past it). */
static int32_t kiln_swap_eval(kiln_swap_state* run, kiln_swap_array* out) {
  int64_t op = *run->pc++, counts[KILN_SWAP_RANK], ds[KILN_SWAP_RANK], ss[KILN_SWAP_RANK];
  int64_t d0, s0, params;
  kiln_swap_array x;
  if (kiln_swap_head(run, out) != 0) return run->status;
  if (op == KILN_SWAP_WEIGHT_OP || op == KILN_SWAP_VALUE || op == KILN_SWAP_FULL)
    return kiln_swap_leaf(run, op, out);
  if (op == KILN_SWAP_APPLY) return kiln_swap_apply(run, out);
  params = op == KILN_SWAP_TRANSPOSE || op == KILN_SWAP_PAD ? out->ndim
         : op == KILN_SWAP_SLICE ? 2 * out->ndim : 0;
  {
    const int64_t* at = run->pc;
    run->pc += params;
    memset(&x, 0, sizeof x);
    if (kiln_swap_eval(run, &x) != 0) return run->status;
    if (op == KILN_SWAP_RESHAPE || op == KILN_SWAP_ASTYPE) {
      int32_t dtype = out->dtype;
      out->data = x.data;
      out->own = x.own;
      out->dtype = x.dtype;
      return op == KILN_SWAP_ASTYPE ? kiln_swap_astype(run, out, dtype) : 0;
    }
    if (kiln_swap_alloc(run, out, op == KILN_SWAP_PAD) != 0) {
      kiln_swap_free(&x);
      return run->status;
    }
    {
      const int64_t* next = run->pc;
      run->pc = at;
      kiln_swap_view(run, op, out, &x, counts, ds, ss, &d0, &s0);
      run->pc = next;
    }
    kiln_swap_copy((char*)out->data + d0 * (int64_t)kiln_swap_itemsize(out->dtype),
                   (const char*)x.data + s0 * (int64_t)kiln_swap_itemsize(x.dtype),
                   kiln_swap_itemsize(out->dtype), out->ndim, counts, ds, ss);
    kiln_swap_free(&x);
  }
  return 0;
}

/* ---------------------------------------------------------------- install */
#define KILN_SWAP_SPANS 64
typedef struct {
  uintptr_t lo, hi;
  int prot;
} kiln_swap_span;

/* The mappings over [lo, hi) with their protections (/proc/self/maps); -1 when some
   page is not mapped, unreadable or there are too many mappings. */
static int kiln_swap_spans(uintptr_t lo, uintptr_t hi, kiln_swap_span* spans) {
  char buf[8192], line[512];
  size_t len = 0;
  int n = 0, fd = open("/proc/self/maps", O_RDONLY);
  uintptr_t covered = 0;
  ssize_t got;
  if (fd < 0) return -1;
  while ((got = read(fd, buf, sizeof buf)) > 0) {
    ssize_t i;
    for (i = 0; i < got; ++i) {
      if (buf[i] != '\n') {
        if (len + 1 < sizeof line) line[len++] = buf[i];
        continue;
      }
      line[len] = '\0';
      len = 0;
      {
        char* end;
        uintptr_t a = (uintptr_t)strtoull(line, &end, 16), b;
        if (*end != '-') continue;
        b = (uintptr_t)strtoull(end + 1, &end, 16);
        if (a >= hi || b <= lo) continue;
        if (n == KILN_SWAP_SPANS || end[0] != ' ' || end[1] != 'r') {
          close(fd);
          return -1;
        }
        spans[n].lo = a < lo ? lo : a;
        spans[n].hi = b > hi ? hi : b;
        spans[n].prot = PROT_READ | (end[2] == 'w' ? PROT_WRITE : 0) |
                        (end[3] == 'x' ? PROT_EXEC : 0);
        covered += spans[n].hi - spans[n].lo;
        n++;
      }
    }
  }
  close(fd);
  return covered == hi - lo ? n : -1;
}

#if defined(KILN_SWAP_REWRITTEN)
/* The weights check's table follows the swap (kiln_check.c): phase 0 before the writes,
   1 after; absent (NULL) in a library without the check. */
KILN_SWAP_VISIBLE __attribute__((weak)) int64_t KILN_SWAP_REWRITTEN(const void* data,
                                                                   uint64_t size,
                                                                   int32_t phase);
#endif

/* The weights check's `phase` over the span of the built constants (see
   KILN_SWAP_REWRITTEN): one call, so a chunk holding many small constants is hashed
   once a phase; the unchanged bytes between them hash as they did. */
static void kiln_swap_rewritten(kiln_swap_array* built, const int64_t* offsets, int64_t n,
                                uintptr_t start, int32_t phase) {
#if defined(KILN_SWAP_REWRITTEN)
  uint64_t lo = UINT64_MAX, hi = 0, end;
  int64_t k;
  for (k = 0; k < n; ++k) {
    end = (uint64_t)offsets[k] + (uint64_t)built[k].n * kiln_swap_itemsize(built[k].dtype);
    if ((uint64_t)offsets[k] < lo) lo = (uint64_t)offsets[k];
    if (end > hi) hi = end;
  }
  if (KILN_SWAP_REWRITTEN && lo < hi)
    KILN_SWAP_REWRITTEN((const uint8_t*)start + lo, hi - lo, phase);
#else
  (void)built, (void)offsets, (void)n, (void)start, (void)phase;
#endif
}

/* Write the built constants into the library's, while no kernel runs; the weights
   check's table learns the new hashes of the chunks that were intact
   ({prefix}_check_weights after a swap: -1 unless a byte was damaged). */
static int32_t kiln_swap_install(kiln_swap_state* run, kiln_swap_array* built,
                                 const int64_t* offsets, int64_t n, int64_t size) {
  kiln_swap_span spans[KILN_SWAP_SPANS];
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), start = (uintptr_t)KILN_SWAP_CONSTS;
  uintptr_t lo = start / page * page, hi = (start + (uintptr_t)size + page - 1) / page * page;
  int count = kiln_swap_spans(lo, hi, spans), done = 0, i;
  int64_t k;
  if (count < 0)
    return kiln_swap_fail(run, KILN_SWAP_EPROTECT, "the constants are not mapped as "
                          "expected (external weights not mapped yet?); nothing was changed");
  for (i = 0; i < count; ++i, ++done)
    if (mprotect((void*)spans[i].lo, spans[i].hi - spans[i].lo,
                 spans[i].prot | PROT_READ | PROT_WRITE) != 0) break;
  if (done == count) {
    madvise((void*)lo, hi - lo, KILN_SWAP_POPULATE_WRITE); /* the private copies now */
    KILN_SWAP_PAUSE(); /* host.c's call guard: no kernel runs until resume */
    kiln_swap_rewritten(built, offsets, n, start, 0);
    for (k = 0; k < n; ++k)
      memcpy((uint8_t*)start + offsets[k], built[k].data,
             (size_t)built[k].n * kiln_swap_itemsize(built[k].dtype));
    kiln_swap_rewritten(built, offsets, n, start, 1);
    KILN_SWAP_RESUME();
  }
  for (i = 0; i < done; ++i)
    mprotect((void*)spans[i].lo, spans[i].hi - spans[i].lo, spans[i].prot);
  if (done != count)
    return kiln_swap_fail(run, KILN_SWAP_EPROTECT, "cannot make the constants' pages "
                          "writable (mprotect); nothing was changed");
  return 0;
}

/* Build every constant `program` rebuilds from `raw` (checked by host.c), then install
   them; 0, or a KILN_SWAP_ code with its message in `error`. */
KILN_SWAP_VISIBLE int32_t KILN_SWAP_RUN(const void* raw, const int64_t* program, char* error,
                                        size_t size) {
  int64_t n = program[3], k;
  kiln_swap_state run;
  kiln_swap_array* built = (kiln_swap_array*)calloc((size_t)n + 1, sizeof *built);
  int64_t* offsets = (int64_t*)calloc((size_t)n + 1, sizeof *offsets);
  run.raw = (const kiln_swap_tensor*)raw;
  run.status = 0;
  run.error = error;
  run.error_size = size;
  run.pc = program + 6;
  for (k = 0; k < program[2]; ++k) run.pc += 2 + run.pc[1]; /* past the raw weights */
  if (built == NULL || offsets == NULL) kiln_swap_fail(&run, KILN_SWAP_ENOMEM, "out of memory");
  for (k = 0; k < n && run.status == 0; ++k) {
    int64_t bytes;
    offsets[k] = *run.pc++;
    bytes = *run.pc++;
    kiln_swap_eval(&run, &built[k]); /* a weight as it stands stays the caller's memory */
    if (run.status == 0 &&
        (int64_t)kiln_swap_itemsize(built[k].dtype) * built[k].n != bytes)
      kiln_swap_fail(&run, KILN_SWAP_EUNSUPPORTED, "damaged swap program (a constant's size)");
  }
  if (run.status == 0) kiln_swap_install(&run, built, offsets, n, program[4]);
  for (k = 0; built && k < n; ++k) kiln_swap_free(&built[k]);
  free(built);
  free(offsets);
  return run.status;
}
#else
typedef int kiln_swap_unsupported; /* (ISO C: a translation unit declares something) */
#endif

/*
 * kiln_host.c -- the part of every generated host.c that is the same for every
 * model (docs/abi.md, docs/codegen-c.md): the DLPack/KilnValue layout, the
 * argument checks of the packed entries, the thread-local last error and the
 * thread pool of parallel loops.
 *
 * kiln.codegen.host writes host.c as: a few #defines, this file verbatim, then
 * kiln_host_entries.c and the model's part (raw kernel prototypes, one packed
 * entry per function, the metadata). Nothing model-specific is in here, so it is
 * reviewed and compiled as C: tests build it alone with `cc -std=c11 -Wall
 * -Wextra -Werror -c`, with and without KILN_HOST_PARALLEL and KILN_NO_THREADS;
 * and kiln.runtime.native compiles it once for every model of one configuration
 * ("split builds" below).
 *
 * Configuration (defined before this text, or on the command line):
 *   KILN_HOST_PARALLEL  define the thread pool: some kernel has a parallel loop;
 *   KILN_PARALLEL_FOR   the pool's symbol, `{prefix}_parallel_for` (hidden);
 *   KILN_NO_THREADS     firmware: no pthreads, parallel loops run serially;
 *   KILN_HOST_PROFILE   the number of kernel-call timer sites (profile=True), with
 *                       KILN_PROFILE_{START,STOP,READ,RESET} their symbols and
 *                       KILN_HOST_PROFILE_FUNCTIONS / _KERNELS the names of the sites;
 *   KILN_HOST_CPU_FEATURES  the rows of the CPU features the kernels need, checked on
 *                       the first call, and KILN_HOST_CPU_MISSING `{prefix}_cpu_missing`;
 *   KILN_HOST_SWAP      `{prefix}_swap_weights` and the call guard (kiln_swap.c), with
 *                       KILN_SWAP_{WEIGHTS,WEIGHT,PROGRAM,NAMES,CONSTS} its symbols;
 *   KILN_WORKSPACE_ALLOC / KILN_WORKSPACE_FREE  the kernels' heap allocator,
 *                       `{prefix}_workspace_alloc`/`_free` (hidden), with KILN_MALLOC /
 *                       KILN_FREE the allocator behind it (malloc/free by default);
 *   KILN_HOST_PRELUDE_ONLY / KILN_HOST_MODEL_ONLY  the two objects of a split build
 *                       (below): this file's definitions only / its declarations only.
 *
 * It includes only the C standard library (and, for the pool, POSIX threads; for
 * the CPU check the compiler's <cpuid.h> on x86, <sys/auxv.h> on AArch64 Linux):
 * the DLPack and KilnValue definitions are copied inline with the layout of
 * kiln/kiln.h. C11 for `_Thread_local` (GNU `__thread` before C11).
 */
/* Before any #include when the thread pool is in: pthreads, sysconf and
   sigset_t are POSIX, which a strict -std=c11 build does not declare otherwise. */
#if ((defined(KILN_HOST_PARALLEL) && !defined(KILN_NO_THREADS)) || defined(KILN_HOST_PROFILE)) \
    && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* pthreads, sysconf, clock_gettime (not in ISO C) */
#endif
#if ((defined(KILN_HOST_PARALLEL) || defined(KILN_HOST_SWAP)) && !defined(KILN_NO_THREADS)) \
    && defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE /* sched_setaffinity, sched_getcpu and cpu_set_t: pinned workers */
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
/* The checked arithmetic of dimension expressions; host.c holds its text here. */
#include "kiln_dim.c"

/* DLPack and KilnValue, laid out exactly as docs/abi.md and kiln/kiln.h say
   (host.c includes nothing but the C standard library). */
typedef struct {
  int32_t device_type;
  int32_t device_id;
} DLDevice;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;

typedef union {
  int64_t v_int64;
  double v_float64;
  void* v_handle;
} KilnValue;

enum { KILN_ARG_INT = 0, KILN_ARG_FLOAT = 2, KILN_ARG_HANDLE = 3, KILN_ARG_DLTENSOR = 7 };
enum { KILN_DEVICE_CPU = 1 };

#if defined(__GNUC__) || defined(__clang__)
#define KILN_HIDDEN __attribute__((visibility("hidden")))
#define KILN_EXPORT __attribute__((visibility("default")))
#define KILN_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define KILN_UNUSED __attribute__((unused)) /* helpers a model may not need */
#else
#define KILN_HIDDEN
#define KILN_EXPORT
#define KILN_PRINTF(f, a)
#define KILN_UNUSED
#endif

#if defined(KILN_NO_THREADS)
#define KILN_THREAD_LOCAL /* single-threaded firmware: one static buffer */
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define KILN_THREAD_LOCAL _Thread_local
#else
#define KILN_THREAD_LOCAL __thread /* GNU C before C11 */
#endif
#if defined(KILN_HOST_PARALLEL) && !defined(KILN_NO_THREADS)
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#endif

/* ------------------------------------------------------- argument checks */

/* The return value of an entry whose arguments were rejected. */
#define KILN_HOST_ARGUMENT_ERROR (-1)
/* Bytes of the thread-local error message buffer. */
#define KILN_HOST_ERROR_SIZE 1024

/* ------------------------------------------------------- split builds
   kiln.runtime.native builds a host.c in two objects: its start (the #defines and
   this file) alone with KILN_HOST_PRELUDE_ONLY, an object the same for every model
   of one configuration that kiln's object cache keeps, and the whole file with
   KILN_HOST_MODEL_ONLY, where this file only declares what the model's part calls.
   The helpers below are then hidden externs (not exported: every library keeps its
   own); in one translation unit (Model Library Format, standalone builds) static. */
#if defined(KILN_HOST_PRELUDE_ONLY) || defined(KILN_HOST_MODEL_ONLY)
#define KILN_HOST_FN KILN_HIDDEN
extern KILN_HIDDEN KILN_THREAD_LOCAL char kiln_host_error[KILN_HOST_ERROR_SIZE];
KILN_HOST_FN KILN_PRINTF(1, 2) int32_t kiln_host_fail(const char* format, ...);
KILN_HOST_FN int32_t kiln_host_tensor(void** data, const char* fn, int32_t index,
    const char* param, KilnValue arg, int32_t type_code, int32_t ndim, const int64_t* shape,
    uint8_t code, uint8_t bits, size_t align);
KILN_HOST_FN int32_t kiln_host_bind_dim(const char* fn, const char* dim, int64_t* value,
    int32_t* first_index, const char** first_param, int32_t index, const char* param,
    int64_t got);
KILN_HOST_FN int32_t kiln_host_dim_range(const char* fn, const char* dim, int64_t value,
    int64_t min, int64_t max);
KILN_HOST_FN int32_t kiln_host_shape_is(const char* fn, int32_t index, const char* param,
    KilnValue arg, int32_t ndim, const int64_t* want, const char* want_text);
KILN_HOST_FN int32_t kiln_host_dim_ok(const char* fn, int32_t status, int64_t value,
    const char* text);
KILN_HOST_FN int32_t kiln_host_dim_nonzero(const char* fn, int32_t status, int64_t value,
    const char* text, const char* why);
KILN_HOST_FN int32_t kiln_host_int(int64_t* out, const char* fn, int32_t index,
    const char* param, KilnValue arg, int32_t type_code, int64_t lo, int64_t hi,
    const char* dtype);
KILN_HOST_FN int32_t kiln_host_float(double* out, const char* fn, int32_t index,
    const char* param, KilnValue arg, int32_t type_code);
KILN_HOST_FN int32_t kiln_host_terminate_flag(void** flag, const char* fn, int32_t index,
    const KilnValue* args, const int32_t* type_codes, int32_t num_args);
KILN_HOST_FN int kiln_host_cpu_ok(const char* fn);
#else
#define KILN_HOST_FN static
#endif

#if !defined(KILN_HOST_MODEL_ONLY) /* the definitions: up to the end of this file */
KILN_HOST_FN KILN_THREAD_LOCAL char kiln_host_error[KILN_HOST_ERROR_SIZE];

/* Format the message of a failed call into this thread's error buffer. */
KILN_HOST_FN KILN_UNUSED KILN_PRINTF(1, 2) int32_t kiln_host_fail(const char* format, ...) {
  va_list ap;
  va_start(ap, format);
  vsnprintf(kiln_host_error, sizeof kiln_host_error, format, ap);
  va_end(ap);
  return KILN_HOST_ARGUMENT_ERROR;
}

/* Like kiln_host_fail, for argument `index` of `fn`: "fn: argument 1 'Y': <message>". */
static KILN_UNUSED KILN_PRINTF(4, 5) int32_t kiln_host_arg_fail(const char* fn, int32_t index,
    const char* param, const char* format, ...) {
  va_list ap;
  int n = snprintf(kiln_host_error, sizeof kiln_host_error, "%s: argument %d '%s': ", fn,
      (int)index, param);
  if (n < 0 || (size_t)n >= sizeof kiln_host_error) {
    return KILN_HOST_ARGUMENT_ERROR;
  }
  va_start(ap, format);
  vsnprintf(kiln_host_error + n, sizeof kiln_host_error - (size_t)n, format, ap);
  va_end(ap);
  return KILN_HOST_ARGUMENT_ERROR;
}

/* A DLDataType as error messages name it: "float32", "bool", "int8x4". */
static KILN_UNUSED void kiln_host_dtype_name(char* out, size_t size, DLDataType t) {
  static const char* const names[] = {"int", "uint", "float", "handle", "bfloat", "complex"};
  int n;
  if (t.code == 6 && t.bits == 8) {
    n = snprintf(out, size, "bool");
  } else if (t.code < 6) {
    n = snprintf(out, size, "%s%u", names[t.code], (unsigned)t.bits);
  } else {
    n = snprintf(out, size, "dtype(code=%u, bits=%u)", (unsigned)t.code, (unsigned)t.bits);
  }
  if (t.lanes != 1 && n > 0 && (size_t)n < size) {
    snprintf(out + n, size - (size_t)n, "x%u", (unsigned)t.lanes);
  }
}

/* A shape as error messages show it: "[4, 5]". */
static KILN_UNUSED void kiln_host_shape_text(char* out, size_t size, const int64_t* shape,
    int32_t ndim) {
  size_t used = 0;
  int32_t d;
  out[0] = '\0';
  for (d = 0; d < ndim && used + 1 < size; ++d) {
    int n = snprintf(out + used, size - used, "%s%lld", d == 0 ? "[" : ", ",
        (long long)shape[d]);
    if (n < 0) {
      return;
    }
    used += (size_t)n;
  }
  if (used + 1 < size) {
    snprintf(out + used, size - used, "%s", ndim == 0 ? "[]" : "]");
  }
}

/* Checks 2-5 of docs/abi.md for tensor argument `index`; on success *data is the
   address of its first element. A NULL `shape` (ndim > 0) takes any shape: a symbolic
   one, checked by the entry once its dimensions are bound (kiln_host_bind_dim). */
KILN_HOST_FN KILN_UNUSED int32_t kiln_host_tensor(void** data, const char* fn, int32_t index,
    const char* param, KilnValue arg, int32_t type_code, int32_t ndim, const int64_t* shape,
    uint8_t code, uint8_t bits, size_t align) {
  const DLTensor* t = (const DLTensor*)arg.v_handle;
  DLDataType want;
  int64_t numel = 1, stride = 1;
  int32_t d;
  char want_text[256], got_text[256];
  if (type_code != KILN_ARG_DLTENSOR) {
    return kiln_host_arg_fail(fn, index, param,
        "expected a tensor (type code %d), got type code %d",
        KILN_ARG_DLTENSOR, (int)type_code);
  }
  if (t == NULL) {
    return kiln_host_arg_fail(fn, index, param, "expected a tensor, got NULL");
  }
  if (t->device.device_type != KILN_DEVICE_CPU) {
    return kiln_host_arg_fail(fn, index, param, "expected a CPU tensor (device_type %d), got "
        "device_type %d", KILN_DEVICE_CPU, (int)t->device.device_type);
  }
  if (t->ndim != ndim) {
    return kiln_host_arg_fail(fn, index, param, "expected %d dimension%s, got %d", (int)ndim,
        ndim == 1 ? "" : "s", (int)t->ndim);
  }
  if (t->dtype.code != code || t->dtype.bits != bits || t->dtype.lanes != 1) {
    want.code = code;
    want.bits = bits;
    want.lanes = 1;
    kiln_host_dtype_name(want_text, sizeof want_text, want);
    kiln_host_dtype_name(got_text, sizeof got_text, t->dtype);
    return kiln_host_arg_fail(fn, index, param, "expected dtype %s, got %s", want_text, got_text);
  }
  if (shape == NULL && ndim > 0) {
    if (t->shape == NULL) {
      return kiln_host_arg_fail(fn, index, param, "shape is NULL");
    }
    for (d = 0; d < ndim; ++d) {
      if (t->shape[d] < 0) {
        return kiln_host_arg_fail(fn, index, param, "dimension %d is negative (%lld)", (int)d,
            (long long)t->shape[d]);
      }
    }
    shape = t->shape;
  }
  for (d = 0; d < ndim; ++d) {
    if (t->shape == NULL || t->shape[d] != shape[d]) {
      kiln_host_shape_text(want_text, sizeof want_text, shape, ndim);
      if (t->shape == NULL) {
        snprintf(got_text, sizeof got_text, "NULL");
      } else {
        kiln_host_shape_text(got_text, sizeof got_text, t->shape, ndim);
      }
      return kiln_host_arg_fail(fn, index, param, "expected shape %s, got %s", want_text, got_text);
    }
    numel *= shape[d];
  }
  if (t->strides != NULL && numel != 0) {
    for (d = ndim - 1; d >= 0; --d) {
      if (shape[d] != 1 && t->strides[d] != stride) {
        return kiln_host_arg_fail(fn, index, param, "expected a contiguous tensor");
      }
      stride *= shape[d];
    }
  }
  *data = t->data == NULL ? NULL : (void*)((char*)t->data + t->byte_offset);
  if (numel != 0 && t->data == NULL) {
    return kiln_host_arg_fail(fn, index, param, "data is NULL");
  }
  if (numel != 0 && (uintptr_t)*data % align != 0) {
    return kiln_host_arg_fail(fn, index, param, "data is not aligned to its %u-byte elements",
        (unsigned)align);
  }
  return 0;
}

/* Symbolic dimensions (docs/dynamic-shapes.md). Dimension `dim` of an argument is `got`:
   the first occurrence of a variable binds it (*first_index < 0), every later one must
   agree. */
KILN_HOST_FN KILN_UNUSED int32_t kiln_host_bind_dim(const char* fn, const char* dim, int64_t* value,
    int32_t* first_index, const char** first_param, int32_t index, const char* param,
    int64_t got) {
  if (*first_index < 0) {
    *value = got;
    *first_index = index;
    *first_param = param;
    return 0;
  }
  if (*value != got) {
    return kiln_host_fail("%s: dimension '%s' is %lld in argument %d '%s' but %lld in argument "
        "%d '%s'", fn, dim, (long long)*value, (int)*first_index, *first_param, (long long)got,
        (int)index, param);
  }
  return 0;
}

/* A bound variable against its declared range (max < 0: no maximum). */
KILN_HOST_FN KILN_UNUSED int32_t kiln_host_dim_range(const char* fn, const char* dim, int64_t value,
    int64_t min, int64_t max) {
  if (value < min) {
    return kiln_host_fail("%s: dimension '%s' = %lld is below its minimum %lld", fn, dim,
        (long long)value, (long long)min);
  }
  if (max >= 0 && value > max) {
    return kiln_host_fail("%s: dimension '%s' = %lld is above its maximum %lld", fn, dim,
        (long long)value, (long long)max);
  }
  return 0;
}

/* Tensor argument `index` against the shape `want` its signature gives for the bound
   variables; the message shows `want_text` ("[batch, seq*2]"), else `want`. */
KILN_HOST_FN KILN_UNUSED int32_t kiln_host_shape_is(const char* fn, int32_t index,
    const char* param, KilnValue arg, int32_t ndim, const int64_t* want,
    const char* want_text) {
  const DLTensor* t = (const DLTensor*)arg.v_handle;
  char want_buf[256], got_text[256];
  int32_t d;
  for (d = 0; d < ndim; ++d) {
    if (t->shape[d] != want[d]) {
      if (want_text == NULL) {
        kiln_host_shape_text(want_buf, sizeof want_buf, want, ndim);
        want_text = want_buf;
      }
      kiln_host_shape_text(got_text, sizeof got_text, t->shape, ndim);
      return kiln_host_arg_fail(fn, index, param, "expected shape %s, got %s", want_text,
          got_text);
    }
  }
  return 0;
}

/* A size computed by kiln_dim.c's checked helpers (a tensor dimension of a signature):
   0 when `status` is clear and `value` is not negative, else the failure named by the
   dimension's text, with kiln.dim_expr's messages. */
KILN_HOST_FN KILN_UNUSED int32_t kiln_host_dim_ok(const char* fn, int32_t status, int64_t value,
    const char* text) {
  if ((status & KILN_DIM_OVERFLOW) != 0) {
    return kiln_host_fail("%s: dimension '%s' overflows int64", fn, text);
  }
  if (status != 0) {
    return kiln_host_fail("%s: dimension '%s' divides by zero", fn, text);
  }
  if (value < 0) {
    return kiln_host_fail("%s: dimension '%s' = %lld is negative", fn, text, (long long)value);
  }
  return 0;
}

/* A size the model divides by (a Reshape's -1) or a convolution's output image, computed
   into `status`: it must be positive; `why` names the node (docs/dynamic-shapes.md,
   "Zero sizes"). */
KILN_HOST_FN KILN_UNUSED int32_t kiln_host_dim_nonzero(const char* fn, int32_t status,
    int64_t value, const char* text, const char* why) {
  if (status != 0) {  /* an overflow or a zero divisor: named by the dimension's text */
    return kiln_host_dim_ok(fn, status, value, text);
  }
  if (value <= 0) {  /* a negative one (a conv's image below its kernel) named by `why` too */
    return kiln_host_fail("%s: %s, which is %lld here (onnxruntime refuses it too)", fn, why,
                          (long long)value);
  }
  return 0;
}

/* An integer (or bool) scalar argument, range-checked against its dtype. */
KILN_HOST_FN KILN_UNUSED int32_t kiln_host_int(int64_t* out, const char* fn, int32_t index,
    const char* param, KilnValue arg, int32_t type_code, int64_t lo, int64_t hi,
    const char* dtype) {
  if (type_code != KILN_ARG_INT) {
    return kiln_host_arg_fail(fn, index, param, "expected an integer scalar (type code %d), got "
        "type code %d", KILN_ARG_INT, (int)type_code);
  }
  if (arg.v_int64 < lo || arg.v_int64 > hi) {
    return kiln_host_arg_fail(fn, index, param, "value %lld out of range for %s",
        (long long)arg.v_int64, dtype);
  }
  *out = arg.v_int64;
  return 0;
}

/* A float scalar argument; an integer is accepted too. */
KILN_HOST_FN KILN_UNUSED int32_t kiln_host_float(double* out, const char* fn, int32_t index,
    const char* param, KilnValue arg, int32_t type_code) {
  if (type_code == KILN_ARG_FLOAT) {
    *out = arg.v_float64;
  } else if (type_code == KILN_ARG_INT) {
    *out = (double)arg.v_int64;
  } else {
    return kiln_host_arg_fail(fn, index, param, "expected a float scalar (type code %d), got type "
        "code %d", KILN_ARG_FLOAT, (int)type_code);
  }
  return 0;
}

/* The terminate flag a lowered graph function polls (docs/abi.md, "Stopping a call"): the
   caller's, a KILN_ARG_HANDLE to an int32_t after the function's own arguments, when
   the call has one more argument (NULL: none); else this flag, which is never set. */
static int32_t kiln_host_never_terminated;
KILN_HOST_FN KILN_UNUSED int32_t kiln_host_terminate_flag(void** flag, const char* fn,
    int32_t index, const KilnValue* args, const int32_t* type_codes, int32_t num_args) {
  *flag = &kiln_host_never_terminated;
  if (num_args <= index) {
    return 0;
  }
  if (type_codes[index] != KILN_ARG_HANDLE) {
    return kiln_host_arg_fail(fn, index, "terminate", "expected a terminate flag (type code "
        "%d), got type code %d", KILN_ARG_HANDLE, (int)type_codes[index]);
  }
  if (args[index].v_handle != NULL) {
    *flag = args[index].v_handle;
  }
  return 0;
}

/* ------------------------------------------------------- CPU features
   KILN_HOST_CPU_FEATURES, when the generated part defines it, initializes the
   rows below: the CPU features the kernels were compiled for, each with how to
   detect it (kiln.runtime.cpu_features.TABLES, LLVM names). The exported
   KILN_HOST_CPU_MISSING (`{prefix}_cpu_missing`) writes the names of those this
   CPU lacks into `out`, separated by ", " (a name that does not fit in `size`
   bytes is left out), and returns how many; -1 when this build cannot read the
   CPU's identification. Python's loader calls it right after dlopen, and the
   first call of any entry runs it, so a program on a CPU without the features
   gets an error instead of an illegal instruction. x86 (GCC/clang): cpuid and
   xgetbv; AArch64 Linux: getauxval(AT_HWCAP/AT_HWCAP2). This code itself needs
   only the baseline instruction set (host.c is not compiled for the target CPU). */
#if !defined(KILN_HOST_CPU_MISSING)
#define KILN_HOST_CPU_MISSING kiln_cpu_missing /* standalone builds of this file */
#endif

typedef struct {
  uint32_t leaf, subleaf;  /* x86: the cpuid inputs; AArch64: the auxv entry (AT_HWCAP = 16) */
  uint32_t reg, shift;     /* x86: 0..3 = EAX..EDX; the field's lowest bit */
  uint32_t mask, at_least; /* holds when ((word >> shift) & mask) >= at_least */
} kiln_host_cpu_field;

typedef struct {
  const char* name;        /* LLVM's name of the feature */
  uint64_t xcr0;           /* x86: the register state the OS must save (XGETBV(0) bits) */
  uint32_t n_fields;
  kiln_host_cpu_field fields[3];
} kiln_host_cpu_feature;

#if defined(KILN_HOST_CPU_FEATURES)
#include <stdlib.h> /* getenv */
#endif
#if defined(KILN_HOST_CPU_FEATURES) && (defined(__x86_64__) || defined(__i386__)) && \
    (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define KILN_HOST_CPU_READABLE 1
/* Register `reg` of cpuid(leaf, subleaf); 0 for a leaf beyond the CPU's maximum
   (basic or extended), and, as LLVM does, for a sub-leaf of leaf 7 beyond 7.0's EAX. */
static KILN_UNUSED uint64_t kiln_host_cpu_word(uint32_t leaf, uint32_t subleaf, uint32_t reg) {
  unsigned int r[4] = {0, 0, 0, 0};
  unsigned int top = __get_cpuid_max(leaf & 0x80000000u, NULL);
  if (top == 0 || leaf > top) {
    return 0;
  }
  if (leaf == 7 && subleaf > 0) {
    __cpuid_count(7, 0, r[0], r[1], r[2], r[3]);
    if (r[0] < subleaf) {
      return 0;
    }
  }
  __cpuid_count(leaf, subleaf, r[0], r[1], r[2], r[3]);
  return r[reg & 3u];
}
/* XCR0, the register state the OS saves; 0 unless OSXSAVE says xgetbv may run. */
static KILN_UNUSED uint64_t kiln_host_cpu_xcr0(void) {
  uint32_t lo, hi;
  if (((kiln_host_cpu_word(1, 0, 2) >> 27) & 1u) == 0) {
    return 0;
  }
  __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}
#elif defined(KILN_HOST_CPU_FEATURES) && defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#define KILN_HOST_CPU_READABLE 1
static KILN_UNUSED uint64_t kiln_host_cpu_word(uint32_t leaf, uint32_t subleaf, uint32_t reg) {
  (void)subleaf;
  (void)reg;
  return (uint64_t)getauxval((unsigned long)leaf);
}
static KILN_UNUSED uint64_t kiln_host_cpu_xcr0(void) {
  return 0;
}
#endif

#if defined(KILN_HOST_CPU_FEATURES)
static const kiln_host_cpu_feature kiln_host_cpu_features[] = KILN_HOST_CPU_FEATURES;
#endif

/* AMX tile data (XCR0 bit 18, XFEATURE_XTILEDATA) is enabled per process on Linux: a
   process must ask for it (arch_prctl(ARCH_REQ_XCOMP_PERM, 18)) before its first tile
   instruction, which would otherwise die with SIGILL. 0 when granted (or when this OS
   asks for nothing); the raw syscall, so that host.c needs no feature-test macros. */
#define KILN_HOST_XTILEDATA_STATE (1ull << 18)
#if defined(KILN_HOST_CPU_FEATURES) && defined(KILN_HOST_CPU_READABLE)
static KILN_UNUSED long kiln_host_amx_permission(void) {
#if defined(__x86_64__) && defined(__linux__)
  long ret;
  /* 158: SYS_arch_prctl; 0x1023: ARCH_REQ_XCOMP_PERM; 18: XFEATURE_XTILEDATA */
  __asm__ __volatile__("syscall" : "=a"(ret) : "a"(158L), "D"(0x1023L), "S"(18L)
                       : "rcx", "r11", "memory");
  return ret;
#else
  return 0;
#endif
}
#endif

KILN_EXPORT int32_t KILN_HOST_CPU_MISSING(char* out, int32_t size);
KILN_EXPORT int32_t KILN_HOST_CPU_MISSING(char* out, int32_t size) {
  int32_t count = 0;
  if (out != NULL && size > 0) {
    out[0] = '\0';
  }
#if defined(KILN_HOST_CPU_FEATURES) && defined(KILN_HOST_CPU_READABLE)
  {
    const size_t n = sizeof kiln_host_cpu_features / sizeof kiln_host_cpu_features[0];
    const uint64_t xcr0 = kiln_host_cpu_xcr0();
    size_t used = 0, i;
    long amx = 1; /* AMX tile data permission: 1 not asked yet, 0 granted */
    for (i = 0; i < n; ++i) {
      const kiln_host_cpu_feature* f = &kiln_host_cpu_features[i];
      const char* name = f->name;
      int has = (xcr0 & f->xcr0) == f->xcr0;
      uint32_t j;
      for (j = 0; has && j < f->n_fields; ++j) {
        const kiln_host_cpu_field* b = &f->fields[j];
        has = ((kiln_host_cpu_word(b->leaf, b->subleaf, b->reg) >> b->shift) & b->mask)
              >= b->at_least;
      }
      if (has && (f->xcr0 & KILN_HOST_XTILEDATA_STATE) != 0 && amx == 1) {
        amx = kiln_host_amx_permission(); /* asked once; reported once if refused */
        if (amx != 0) {
          has = 0; /* the CPU has it, the OS refused this process the tile data */
          name = "the AMX tile data (Linux refused arch_prctl ARCH_REQ_XCOMP_PERM)";
        }
      }
      if (!has) {
        size_t len = strlen(name);
        size_t sep = used > 0 ? 2 : 0; /* ", " before every name but the first */
        ++count;
        if (out != NULL && size > 0 && used + sep + len < (size_t)size) {
          if (sep > 0) {
            out[used++] = ',';
            out[used++] = ' ';
          }
          memcpy(out + used, name, len + 1);
          used += len;
        }
      }
    }
  }
#elif defined(KILN_HOST_CPU_FEATURES)
  count = -1; /* features to check, but no way to read them in this build */
#endif
  return count;
}

/* Run once, on the first call of any entry: 0 (with the error set) when this CPU lacks
   a feature the kernels need. */
#if defined(KILN_HOST_CPU_FEATURES) && (defined(__GNUC__) || defined(__clang__))
/* Whether KILN_SKIP_CPU_CHECK asks to skip the check (set, and neither "" nor "0"). */
static int kiln_host_cpu_skipped(void) {
  const char* skip = getenv("KILN_SKIP_CPU_CHECK");
  return skip != NULL && skip[0] != '\0' && strcmp(skip, "0") != 0;
}

/* With the check skipped, AMX code still needs the tile data: asked for all the same
   (a refusal then shows as the illegal instruction the skip accepts). 0. */
static KILN_UNUSED int32_t kiln_host_amx_asked(void) {
#if defined(KILN_HOST_CPU_READABLE)
  size_t i;
  for (i = 0; i < sizeof kiln_host_cpu_features / sizeof kiln_host_cpu_features[0]; ++i) {
    if ((kiln_host_cpu_features[i].xcr0 & KILN_HOST_XTILEDATA_STATE) != 0) {
      (void)kiln_host_amx_permission();
      break;
    }
  }
#endif
  return 0;
}

static int kiln_host_cpu_checked; /* 1 once the features were found */
KILN_HOST_FN KILN_UNUSED int kiln_host_cpu_ok(const char* fn) {
  char missing[256];
  int32_t count;
  if (__atomic_load_n(&kiln_host_cpu_checked, __ATOMIC_RELAXED)) {
    return 1;
  }
  count = kiln_host_cpu_skipped() ? kiln_host_amx_asked()
                                   : KILN_HOST_CPU_MISSING(missing, (int32_t)sizeof missing);
  if (count < 0) {
    kiln_host_fail("%s: cannot read this CPU's features to check those the library was "
                   "compiled for; set KILN_SKIP_CPU_CHECK=1 to call it anyway", fn);
    return 0;
  }
  if (count > 0) {
    kiln_host_fail("%s: this CPU lacks %s the library was compiled for: %s (it would stop "
                   "with an illegal instruction); rebuild it for this machine or for a "
                   "baseline both have, or set KILN_SKIP_CPU_CHECK=1", fn,
                   count == 1 ? "a feature" : "features", missing);
    return 0;
  }
  __atomic_store_n(&kiln_host_cpu_checked, 1, __ATOMIC_RELAXED);
  return 1;
}
#else
KILN_HOST_FN KILN_UNUSED int kiln_host_cpu_ok(const char* fn) {
  (void)fn;
  return 1;
}
#endif

/* ------------------------------------------------------- heap workspaces
   The kernels of a library built with a host.c take their heap buffers (the
   memory plan's arena, packing buffers) from KILN_WORKSPACE_ALLOC/_FREE, hidden
   `{prefix}_workspace_alloc`/`_free`. A buffer of KILN_WORKSPACE_CACHED_MIN bytes
   or more is kept when freed, in a few slots, and handed to the next request it
   fits: C libraries return such blocks to the OS on free (glibc maps anything above
   32 MiB afresh each time), so without the cache every call page-faults its whole
   workspace in again (docs/abi.md, "Heap workspaces"). Blocks are kept until the
   library is unloaded; KILN_WORKSPACE_CACHE=0 in the environment turns the cache
   off. The backing allocator is KILN_MALLOC/KILN_FREE (malloc and free unless
   defined: Model Library Format builds pass their own, and with KILN_NO_THREADS
   the functions only pass requests through). */
#if defined(KILN_WORKSPACE_ALLOC)
#if !defined(KILN_MALLOC)
#include <stdlib.h>
#define KILN_MALLOC malloc
#define KILN_FREE free
#else
void* KILN_MALLOC(size_t size);
void KILN_FREE(void* ptr);
#endif
#if defined(KILN_NO_THREADS)
KILN_HIDDEN void* KILN_WORKSPACE_ALLOC(size_t size) { return KILN_MALLOC(size); }
KILN_HIDDEN void KILN_WORKSPACE_FREE(void* ptr) { KILN_FREE(ptr); }
#else
#include <stdlib.h> /* getenv */
#define KILN_WORKSPACE_CACHED_MIN ((size_t)1 << 20)
#define KILN_WORKSPACE_SLOTS 4
/* Each block starts with its capacity (0: not cached); 64 bytes keep the buffer
   at the allocator's alignment. */
#define KILN_WORKSPACE_HEADER 64
static char* kiln_workspace_slots[KILN_WORKSPACE_SLOTS]; /* cached blocks (headers) */
static char kiln_workspace_lock;                         /* __atomic_test_and_set */

static size_t kiln_workspace_capacity(const char* block) {
  size_t capacity;
  memcpy(&capacity, block, sizeof capacity);
  return capacity;
}

static void kiln_workspace_acquire(void) {
  while (__atomic_test_and_set(&kiln_workspace_lock, __ATOMIC_ACQUIRE)) {
  }
}

static void kiln_workspace_release(void) { __atomic_clear(&kiln_workspace_lock, __ATOMIC_RELEASE); }

static int kiln_workspace_cached(size_t size) {
  const char* off = getenv("KILN_WORKSPACE_CACHE");
  return size >= KILN_WORKSPACE_CACHED_MIN && !(off != 0 && off[0] == '0' && off[1] == 0);
}

KILN_HIDDEN void* KILN_WORKSPACE_ALLOC(size_t size) {
  char* block = 0;
  size_t capacity = 0;
  if (size > (size_t)-1 - KILN_WORKSPACE_HEADER) return 0;
  if (kiln_workspace_cached(size)) {
    /* the smallest cached block that holds `size` and is not four times larger */
    int best = -1;
    kiln_workspace_acquire();
    for (int i = 0; i < KILN_WORKSPACE_SLOTS; ++i) {
      const char* b = kiln_workspace_slots[i];
      size_t c = b != 0 ? kiln_workspace_capacity(b) : 0;
      if (b != 0 && c >= size && c / 4 <= size
          && (best < 0 || c < kiln_workspace_capacity(kiln_workspace_slots[best]))) best = i;
    }
    if (best >= 0) {
      block = kiln_workspace_slots[best];
      kiln_workspace_slots[best] = 0;
    }
    kiln_workspace_release();
    if (block != 0) return block + KILN_WORKSPACE_HEADER;
    capacity = size;
  }
  block = (char*)KILN_MALLOC(size + KILN_WORKSPACE_HEADER);
  if (block == 0) return 0;
  memcpy(block, &capacity, sizeof capacity);
  return block + KILN_WORKSPACE_HEADER;
}

KILN_HIDDEN void KILN_WORKSPACE_FREE(void* ptr) {
  if (ptr == 0) return;
  char* block = (char*)ptr - KILN_WORKSPACE_HEADER;
  size_t capacity = kiln_workspace_capacity(block);
  if (capacity > 0) {
    /* keep it in an empty slot, else in place of the smallest smaller block */
    int slot = -1;
    kiln_workspace_acquire();
    for (int i = 0; i < KILN_WORKSPACE_SLOTS && slot < 0; ++i) {
      if (kiln_workspace_slots[i] == 0) slot = i;
    }
    for (int i = 0; i < KILN_WORKSPACE_SLOTS && slot < 0; ++i) {
      if (kiln_workspace_capacity(kiln_workspace_slots[i]) < capacity) slot = i;
    }
    if (slot >= 0) {
      char* evicted = kiln_workspace_slots[slot];
      kiln_workspace_slots[slot] = block;
      block = evicted;
    }
    kiln_workspace_release();
  }
  if (block != 0) KILN_FREE(block);
}

#if defined(__GNUC__) || defined(__clang__)
/* Unloading the library returns the cached blocks. */
__attribute__((destructor)) static void kiln_workspace_unload(void) {
  for (int i = 0; i < KILN_WORKSPACE_SLOTS; ++i) {
    if (kiln_workspace_slots[i] != 0) KILN_FREE(kiln_workspace_slots[i]);
    kiln_workspace_slots[i] = 0;
  }
}
#endif
#endif
#endif

/* ------------------------------------------------------- the pool's controls
   Exported from every library (docs/abi.md, "Threads"), with or without a pool, so a
   C program or kiln.runtime can set them before or between calls:
     {prefix}_set_num_threads(n)  threads of parallel loops, the caller included
                                  (1..KILN_POOL_MAX_THREADS; 0: back to the default,
                                  KILN_NUM_THREADS, else the online CPUs);
     {prefix}_num_threads()       the count parallel loops use (1 without a pool);
     {prefix}_set_spin_us(us)     how long an idle worker spins before it sleeps
                                  (0..KILN_POOL_MAX_SPIN_US; -1: back to KILN_SPIN_US,
                                  else KILN_POOL_DEFAULT_SPIN_US);
     {prefix}_pool_stats(out, n)  the pool's counters (KILN_POOL_STAT_*), for tests
                                  and monitoring; returns how many were written.
   The setters return 0, or -1 with a message for {prefix}_last_error. */
#if !defined(KILN_SET_NUM_THREADS) /* standalone builds of this file */
#define KILN_SET_NUM_THREADS kiln_set_num_threads
#define KILN_GET_NUM_THREADS kiln_num_threads
#define KILN_SET_SPIN_US kiln_set_spin_us
#define KILN_POOL_STATS kiln_pool_stats
#endif

enum {
  KILN_POOL_MAX_THREADS = 256,
  KILN_POOL_MAX_SPIN_US = 10000000,    /* 10 s */
  KILN_POOL_DEFAULT_SPIN_US = 20000,   /* 20 ms: a server's or camera's next call */
  KILN_POOL_MAX_PROBE_MS = 60000       /* KILN_PROBE_MS: 1 minute at most */
};
/* The loops' time between two probes at least (ms; 0: no probe, every loop on the
   pool's threads; docs/runtime.md, "Threads"); $KILN_PROBE_MS overrides it. A probe
   on the caller's side sends the workers to sleep and wakes them after (tens of
   microseconds on a VM), so it is worth a few milliseconds of loops between two. */
#if !defined(KILN_POOL_DEFAULT_PROBE_MS)
#define KILN_POOL_DEFAULT_PROBE_MS 10
#endif
/* Loops between two probes at least: a probe costs up to one loop's time where the
   threads pay (one loop run at about half speed), so 1 in 128 keeps it below 1%
   (tests build with fewer). */
#if !defined(KILN_POOL_PROBE_LOOPS)
#define KILN_POOL_PROBE_LOOPS 128
#endif
/* The longest wait (ns) for the workers to fall asleep, or wake, for a probe (tests
   under a sanitizer, where everything is slower, build with more). */
#if !defined(KILN_POOL_SETTLE_NS)
#define KILN_POOL_SETTLE_NS 200000
#endif
/* Loops measured below this many ns run on the caller: a hand-off costs more than it
   saves. The generated host file sets it to the compiler's threshold
   (kiln.kernels.parallel_work.PARALLEL_MIN_NS); $KILN_SERIAL_NS overrides it. */
#if !defined(KILN_POOL_DEFAULT_SERIAL_NS)
#define KILN_POOL_DEFAULT_SERIAL_NS 5000
#endif
/* Indexes of {prefix}_pool_stats's counters. */
enum {
  KILN_POOL_STAT_THREADS,  /* threads of parallel loops, the caller included */
  KILN_POOL_STAT_STARTED,  /* worker threads running */
  KILN_POOL_STAT_SLEEPING, /* workers asleep now (past the spin window) */
  KILN_POOL_STAT_SLEEPS,   /* times a worker went to sleep */
  KILN_POOL_STAT_LOOPS,    /* loops handed to the pool */
  KILN_POOL_STAT_SMALL,    /* loops run on the caller alone: too small to hand off */
  KILN_POOL_STAT_SPIN_US,  /* the spin window */
  KILN_POOL_STAT_PINNED,   /* workers pinned to a CPU (kiln_pool_pins) */
  KILN_POOL_STAT_CHUNKS,   /* chunks of handed-off loops run, by any thread */
  KILN_POOL_STAT_HELPED,   /* ... of them run by a worker (the rest: by the caller) */
  KILN_POOL_STAT_STOLEN,   /* ... of them run by a thread other than their share's */
  KILN_POOL_STAT_WORK_NS,  /* time threads spent running chunks, summed over the threads */
  KILN_POOL_STAT_SPAN_NS,  /* wall time of handed-off loops, from posting to return */
  KILN_POOL_STAT_PREEMPTED, /* ... of the sleeps, those before the spin window's end: the
                               worker was descheduled while it spun */
  KILN_POOL_STAT_PROBES,   /* loops run the other way than the verdict's, to time both ways */
  KILN_POOL_STAT_SHARED,   /* ... of them, those that ran faster on the caller alone */
  KILN_POOL_STAT_ALONE,    /* loops run on the caller alone: by the verdict, or as a probe */
  KILN_POOL_STAT_GAIN,     /* the verdict's figure: the typical recent probe's time
                              on the caller alone over the time on the threads, in
                              thousandths (about 1500-2000 for two threads on two cores,
                              below 1000 where they share one) */
  KILN_POOL_STAT_SWITCHES, /* times the verdict changed (odd: the loops run alone now) */
  KILN_POOL_STAT_COUNT
};

static KILN_UNUSED int32_t kiln_pool_check_threads(int32_t n) {
  if (n < 0 || n > KILN_POOL_MAX_THREADS) {
    return kiln_host_fail("set_num_threads: %d threads: expected 1 to %d (or 0 for the "
        "default)", (int)n, (int)KILN_POOL_MAX_THREADS);
  }
  return 0;
}

static KILN_UNUSED int32_t kiln_pool_check_spin(int32_t us) {
  if (us < -1 || us > KILN_POOL_MAX_SPIN_US) {
    return kiln_host_fail("set_spin_us: %d microseconds: expected 0 to %d (or -1 for the "
        "default)", (int)us, (int)KILN_POOL_MAX_SPIN_US);
  }
  return 0;
}

#if !defined(KILN_HOST_PARALLEL) || defined(KILN_NO_THREADS) \
    || !(defined(__GNUC__) || defined(__clang__))

/* No pool: the controls check their arguments and change nothing; every loop runs on
   its caller. */
static int32_t kiln_pool_spin_us_set = KILN_POOL_DEFAULT_SPIN_US;

KILN_EXPORT int32_t KILN_SET_NUM_THREADS(int32_t n) {
  return kiln_pool_check_threads(n);
}

KILN_EXPORT int32_t KILN_GET_NUM_THREADS(void) {
  return 1;
}

KILN_EXPORT int32_t KILN_SET_SPIN_US(int32_t us) {
  if (kiln_pool_check_spin(us) != 0) {
    return KILN_HOST_ARGUMENT_ERROR;
  }
  kiln_pool_spin_us_set = us < 0 ? KILN_POOL_DEFAULT_SPIN_US : us;
  return 0;
}

KILN_EXPORT int32_t KILN_POOL_STATS(int64_t* out, int32_t size) {
  int32_t i;
  for (i = 0; out != NULL && i < size && i < KILN_POOL_STAT_COUNT; ++i) {
    out[i] = i == KILN_POOL_STAT_THREADS ? 1 : i == KILN_POOL_STAT_SPIN_US ? kiln_pool_spin_us_set
                                                                          : 0;
  }
  return out == NULL || size < 0 ? 0 : i;
}

#endif

#if defined(KILN_HOST_PARALLEL)

#if !defined(KILN_PARALLEL_FOR)
#define KILN_PARALLEL_FOR kiln_parallel_for /* standalone builds of this file */
#endif

/* ------------------------------------------------------- parallel loops
   A kernel runs each parallel loop through KILN_PARALLEL_FOR (docs/abi.md,
   "Parallel loops"): `body` is called on chunks [begin, end) of [0, n) by a
   small pthread pool that lives in this library, so an exported library needs
   no kiln runtime. The first non-zero status of a chunk is returned (the
   remaining chunks are skipped). */
typedef int32_t (*kiln_pool_body_fn)(int64_t begin, int64_t end, void* context);

#if defined(KILN_NO_THREADS) || !(defined(__GNUC__) || defined(__clang__))

/* Firmware (or a compiler without GNU atomics): a parallel loop runs serially. */
KILN_HIDDEN int32_t KILN_PARALLEL_FOR(int64_t n, kiln_pool_body_fn body, void* context) {
  return n > 0 ? body(0, n, context) : 0;
}

#else

/* Chunks per share: a thread that finishes its share first waits, at the end of a loop,
   for up to one chunk of another's. With 4, the threads of two-thread runs spent 3-4%
   of a loop's time so (MobileNetV2 and EfficientNet-B0, `PoolStats` work_ns against
   span_ns: 96.8% and 97.2% working), 1-1.5% on ResNet-18 and SqueezeNet; with 16,
   98.2-98.6% and 99.2-99.4% (Zen 4), the chunks' own cost unseen (a 784-512-512-10
   MLP's 25 us the same). */
enum {
  KILN_POOL_CHUNKS_PER_THREAD = 16,
  KILN_POOL_WAIT_SPINS = 2000,  /* the caller waiting for the last chunks */
  KILN_POOL_SPIN_BATCH = 64,    /* pauses between two looks at the clock */
  /* More than this (ns) between two looks at the clock: the spinning worker was
     descheduled (a batch of pauses takes a few microseconds). */
  KILN_POOL_PREEMPTED_NS = 20000,
  /* For this long (ns) after a worker was descheduled while it spun, the workers spin
     at most KILN_POOL_LOADED_SPIN_NS before they sleep. */
  KILN_POOL_LOADED_NS = 1000000000,
  KILN_POOL_LOADED_SPIN_NS = 200000,
  KILN_POOL_COSTS = 64,         /* loops whose cost the pool remembers */
  KILN_POOL_LINE = 64,          /* bytes of a cache line: one thread's chunk counter each */
  /* The verdict (kiln_pool_judge): the typical gain of the last KILN_POOL_SAMPLES
     probes, once there are KILN_POOL_MIN_SAMPLES; the loops go to the caller alone
     below KILN_POOL_ALONE_BELOW (alone clearly faster: 0.85x the threads' time) and
     back to the threads from KILN_POOL_SHARED_FROM. */
  KILN_POOL_SAMPLES = 15,
  KILN_POOL_MIN_SAMPLES = 5,
  KILN_POOL_ALONE_BELOW = 850,
  KILN_POOL_SHARED_FROM = 1000
};

#define KILN_LOAD(x) __atomic_load_n(&(x), __ATOMIC_SEQ_CST)
#define KILN_STORE(x, v) __atomic_store_n(&(x), (v), __ATOMIC_SEQ_CST)
#define KILN_ADD(x, v) __atomic_fetch_add(&(x), (v), __ATOMIC_SEQ_CST)
#if defined(__x86_64__) || defined(__i386__)
#define KILN_PAUSE() __builtin_ia32_pause()
#elif defined(__aarch64__) || (defined(__arm__) && defined(__ARM_ARCH) && __ARM_ARCH >= 7)
#define KILN_PAUSE() __asm__ __volatile__("yield")
#else
#define KILN_PAUSE() ((void)0)
#endif

/* One loop at a time runs on the pool. The caller posts it and takes chunks
   itself. The iterations are split into one contiguous share per thread (the
   caller's first, then worker 0's, ...), the same number of iterations each (n / T
   rounded up or down: kiln_pool_share_begin), and each share into chunks of at most
   `chunk` iterations (about KILN_POOL_CHUNKS_PER_THREAD of them); each thread takes
   the chunks of its own share first and then those left in the others' shares, each
   chunk with an atomic add to its share's counter, so no lock is held while the loop
   runs. (Chunks of ceil(n / 4T) dealt out as whole chunks gave one thread up to 4
   chunks' worth of remainder more: n = 100 on 2 threads, shares of 52 and 48.) A
   thread thus runs the same part of a loop on every call while no thread falls
   behind: the weights and activations it touched last call are still in its
   core's cache (a small model's layers fit a core's L2, and a shared counter
   scattered them over the cores anew on every call), and a descheduled worker's
   share is taken by the others. `generation` works like a sequence lock:
   odd while the caller rewrites the loop's fields, even once they are posted. A
   worker counts itself in `entered`, then checks that the generation it saw is
   still current before it reads the fields, and counts itself out when done.
   The caller makes the generation odd, waits until no worker is inside, writes
   the fields, makes it even and wakes the workers; it returns once it has taken
   the last chunk and no worker is inside (a worker waking up later finds no
   chunk). An idle worker spins for the spin window (`spin_ns`, a time: the same
   on every CPU) after its last chunk, so the next loop of a model, or the next
   call of a server, needs no wake-up, then sleeps on a condition variable
   (`lock`, which also guards `busy`, `started` and `threads`). Only the thread
   that set `busy` resizes the pool or reads and writes `costs`. */
static struct {
  pthread_mutex_t lock;
  pthread_cond_t wake;      /* a loop was posted, or workers must stop */
  pthread_cond_t done;      /* the last worker left the loop */
  pthread_t workers[KILN_POOL_MAX_THREADS];
  int threads;              /* set_num_threads, KILN_NUM_THREADS or the online CPUs */
  int started;              /* workers running */
  int busy;                 /* some thread is running a loop on the pool */
  int keep;                 /* atomic: workers with a smaller index keep running */
  int pin;                  /* KILN_PIN_THREADS: 1 pin, 0 never, -1 (unset) as kiln_pool_pins */
  int pin_now;              /* the workers being started pin themselves (set by resize) */
  int caller_cpu;           /* atomic: the CPU left to the caller (-1: unknown) */
  int post_cpu;             /* atomic: the CPU the caller posted the loop from (-1: unknown) */
  int pinned[KILN_POOL_MAX_THREADS]; /* each worker's CPU (-1: not pinned; its own) */
  unsigned long generation; /* atomic: odd while a loop is being posted */
  unsigned long birth;      /* the generation new workers start from (set by resize) */
  int entered;              /* atomic: workers inside the posted loop */
  int waiting;              /* atomic: the caller sleeps on `done` (set under `lock`) */
  int shares;               /* threads the posted loop's chunks are split between */
  int32_t status;           /* atomic: first non-zero status of a chunk */
  int64_t spin_ns;          /* atomic: the spin window */
  int64_t serial_ns;        /* loops whose measured work is below run on the caller */
  int64_t loaded_until;     /* atomic: until then (ns) workers spin KILN_POOL_LOADED_SPIN_NS */
  int64_t probe_ns;         /* the loops' time between two probes (0: never; KILN_PROBE_MS) */
  int64_t since_probe;      /* the loops' wall time since the last probe (ns) */
  int since_loops;          /* loops handed off or run alone since the last probe */
  int verdict;              /* loops run on the caller alone (1) or on the threads (0) */
  int one_cpu;              /* the caller may run on one CPU only: alone, no probes */
  int alone;                /* atomic: idle workers sleep at once (the verdict is alone:
                               a spinning sibling would take a share of the core) */
  int64_t samples[KILN_POOL_SAMPLES]; /* the recent probes' gains (kiln_pool_judge) */
  int sampled;              /* how many of them there are, up to KILN_POOL_SAMPLES */
  int sample_next;          /* where the next one goes */
  int64_t work_ns;          /* atomic: time the threads spent in chunks of this loop */
  int64_t stats[KILN_POOL_STAT_COUNT]; /* atomic: the counters of KILN_POOL_STATS */
  kiln_pool_body_fn body;            /* the posted loop: written before `generation` */
  void* context;
  int64_t n;
  int64_t chunk;            /* iterations per chunk (a share's last one may have fewer) */
  /* Each thread's share of the iterations: the first not taken, `next` (atomic), up
     to `end`, one cache line each so that a thread taking its chunks does not slow
     the others'. */
  struct {
    int64_t next;
    int64_t end;
    char pad[KILN_POOL_LINE - 2 * sizeof(int64_t)];
  } share[KILN_POOL_MAX_THREADS] __attribute__((aligned(KILN_POOL_LINE)));
  /* The last measured work per iteration of recent loops (in ns / 256), by body, and
     the wall time per iteration of its last usual run, alone or on the threads (the
     probes' reference, kiln_pool_measured). */
  struct kiln_pool_cost {
    kiln_pool_body_fn body;
    int64_t per_iteration;
    int64_t wall;           /* -1: not run since it took this slot */
    int wall_alone;
  } costs[KILN_POOL_COSTS];
} kiln_pool;
static pthread_once_t kiln_pool_once = PTHREAD_ONCE_INIT;
static int kiln_pool_ready;
/* Set on pool threads, and on a caller while it runs a loop: nested loops run serially. */
static KILN_THREAD_LOCAL int kiln_pool_in_parallel;

static int64_t kiln_pool_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
}

/* The environment variable `name` if it is a whole decimal number in [lo, hi] (above
   hi: hi), else `fallback`: a bad value changes nothing (docs/abi.md, "Threads"). */
static long kiln_pool_env(const char* name, long lo, long hi, long fallback) {
  const char* env = getenv(name);
  char* end = NULL;
  long n;
  if (env == NULL || *env == '\0') {
    return fallback;
  }
  n = strtol(env, &end, 10);
  if (end == NULL || *end != '\0' || n < lo) {
    return fallback;
  }
  return n > hi ? hi : n;
}

/* KILN_NUM_THREADS if it is a positive integer, else the number of online CPUs. */
static int kiln_pool_default_threads(void) {
  long n = kiln_pool_env("KILN_NUM_THREADS", 1, KILN_POOL_MAX_THREADS, 0);
  if (n == 0) {
    n = sysconf(_SC_NPROCESSORS_ONLN);
  }
  if (n < 1) {
    n = 1;
  }
  return n > KILN_POOL_MAX_THREADS ? KILN_POOL_MAX_THREADS : (int)n;
}

static int64_t kiln_pool_default_spin_ns(void) {
  return (int64_t)kiln_pool_env("KILN_SPIN_US", 0, KILN_POOL_MAX_SPIN_US,
                                KILN_POOL_DEFAULT_SPIN_US) * 1000;
}

/* fork(): the child has none of the workers. The lock is held across fork so the
   child never inherits it locked mid-update; the child resets the pool and starts
   new workers when it next runs a parallel loop. */
static void kiln_pool_before_fork(void) {
  pthread_mutex_lock(&kiln_pool.lock);
}

static void kiln_pool_after_fork_parent(void) {
  pthread_mutex_unlock(&kiln_pool.lock);
}

static void kiln_pool_after_fork_child(void) {
  pthread_mutex_unlock(&kiln_pool.lock);
  pthread_cond_init(&kiln_pool.wake, NULL);
  pthread_cond_init(&kiln_pool.done, NULL);
  kiln_pool.started = 0;
  kiln_pool.busy = 0;
  KILN_STORE(kiln_pool.keep, KILN_POOL_MAX_THREADS);
  KILN_STORE(kiln_pool.entered, 0);
  KILN_STORE(kiln_pool.waiting, 0);
  KILN_STORE(kiln_pool.stats[KILN_POOL_STAT_STARTED], 0);
  KILN_STORE(kiln_pool.stats[KILN_POOL_STAT_SLEEPING], 0);
  KILN_STORE(kiln_pool.stats[KILN_POOL_STAT_PINNED], 0);
  KILN_STORE(kiln_pool.generation, (KILN_LOAD(kiln_pool.generation) + 1) & ~1UL); /* not mid-post */
}

static void kiln_pool_init(void) {
  pthread_mutex_init(&kiln_pool.lock, NULL);
  pthread_cond_init(&kiln_pool.wake, NULL);
  pthread_cond_init(&kiln_pool.done, NULL);
  kiln_pool.threads = kiln_pool_default_threads();
  kiln_pool.pin = (int)kiln_pool_env("KILN_PIN_THREADS", 0, 1, -1);
  kiln_pool.serial_ns = kiln_pool_env("KILN_SERIAL_NS", 0, 2000000000L,
                                      KILN_POOL_DEFAULT_SERIAL_NS);
  kiln_pool.probe_ns = kiln_pool_env("KILN_PROBE_MS", 0, KILN_POOL_MAX_PROBE_MS,
                                     KILN_POOL_DEFAULT_PROBE_MS) * 1000000;
  KILN_STORE(kiln_pool.keep, KILN_POOL_MAX_THREADS);
  KILN_STORE(kiln_pool.spin_ns, kiln_pool_default_spin_ns());
  pthread_atfork(kiln_pool_before_fork, kiln_pool_after_fork_parent, kiln_pool_after_fork_child);
  kiln_pool_ready = 1;
}

/* Run chunks of the posted loop, those of share `self` (0: the caller, 1 + i: worker
   i) first, then those left in the other shares, until none is left or one has
   failed; the time spent in them goes to `work_ns` (what the loop costs serially, for
   the next decision). */
static void kiln_pool_run_chunks(int self) {
  int64_t start = -1, ran = 0, stolen = 0;
  int shares = kiln_pool.shares, i;
  for (i = 0; i < shares; ++i) {
    int owner = (self + i) % shares;
    for (;;) {
      int64_t begin = KILN_ADD(kiln_pool.share[owner].next, kiln_pool.chunk);
      int64_t end = kiln_pool.share[owner].end;
      int32_t status;
      if (begin >= end || KILN_LOAD(kiln_pool.status) != 0) {
        break;
      }
      if (start < 0) {
        start = kiln_pool_now_ns();
      }
      if (end - begin > kiln_pool.chunk) {
        end = begin + kiln_pool.chunk;
      }
      status = kiln_pool.body(begin, end, kiln_pool.context);
      ++ran;
      stolen += owner != self;
      if (status != 0) {
        int32_t none = 0;
        __atomic_compare_exchange_n(&kiln_pool.status, &none, status, 0, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST);
      }
    }
  }
  if (start >= 0) {
    int64_t spent = kiln_pool_now_ns() - start;
    KILN_ADD(kiln_pool.work_ns, spent);
    KILN_ADD(kiln_pool.stats[KILN_POOL_STAT_WORK_NS], spent);
    KILN_ADD(kiln_pool.stats[KILN_POOL_STAT_CHUNKS], ran);
    KILN_ADD(kiln_pool.stats[KILN_POOL_STAT_STOLEN], stolen);
    if (self != 0) {
      KILN_ADD(kiln_pool.stats[KILN_POOL_STAT_HELPED], ran);
    }
  }
}

/* A loop other than `seen` is posted (generation even and new). */
static int kiln_pool_posted(unsigned long seen) {
  unsigned long now = KILN_LOAD(kiln_pool.generation);
  return now != seen && (now & 1UL) == 0;
}

/* The CPUs this process may run on (0: unknown, or not Linux). */
static int kiln_pool_allowed_cpus(void) {
#if defined(__linux__) && defined(CPU_SETSIZE)
  cpu_set_t allowed;
  return sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed) : 0;
#else
  return 0;
#endif
}

/* Whether `workers` new workers pin themselves: always with KILN_PIN_THREADS=1, never
   with 0; by default when the pool's threads (the workers and the caller) are as many
   as the CPUs the process may use. Unpinned, a worker woken after a pause was often
   left on its caller's CPU, or moved between the CPUs with its caller, for hundreds of
   calls: the share it ran last call (its weights in that core's L2) was then read from
   the other core, or the two threads took turns on one CPU (a 784-512-512-10 MLP
   after 50 ms idle: 38 us a call unpinned, 25 pinned; docs/abi.md "Parallel loops").
   A pool smaller than the machine stays unpinned: other processes' pools (a server's
   workers, each with two threads) would all pin to the same CPUs. */
static int kiln_pool_pins(int workers) {
  if (kiln_pool.pin >= 0) {
    return kiln_pool.pin;
  }
  return workers + 1 == kiln_pool_allowed_cpus();
}

/* Pin the calling worker (`index`) to `cpu` and record it; 0 where the OS refuses. */
static int kiln_pool_pin_to(int index, int cpu) {
#if defined(__linux__) && defined(CPU_SETSIZE)
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  if (sched_setaffinity(0, sizeof one, &one) != 0) {
    return 0;
  }
  kiln_pool.pinned[index] = cpu;
  return 1;
#else
  (void)index;
  (void)cpu;
  return 0;
#endif
}

/* Pin the calling worker (`index`) to one CPU of those the process may use: the
   index-th of them after leaving out the CPU its caller ran on when it started the
   workers (`caller_cpu`, where the caller's share usually runs). Linux only; a
   refusal (a container's CPU set, a seccomp filter) leaves the worker unpinned. */
static void kiln_pool_pin(int index) {
#if defined(__linux__) && defined(CPU_SETSIZE)
  cpu_set_t allowed;
  int cpu, count = 0, want, others, caller;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) {
    return;
  }
  caller = KILN_LOAD(kiln_pool.caller_cpu);
  others = CPU_COUNT(&allowed) - (caller >= 0 && CPU_ISSET(caller, &allowed));
  want = index % others;
  for (cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed) && cpu != caller && count++ == want) {
      if (kiln_pool_pin_to(index, cpu)) {
        KILN_ADD(kiln_pool.stats[KILN_POOL_STAT_PINNED], 1);
      }
      return;
    }
  }
#else
  (void)index;
#endif
}

/* The CPU the calling thread runs on (-1: unknown, or not Linux). */
static int kiln_pool_current_cpu(void) {
#if defined(__linux__) && defined(CPU_SETSIZE)
  return sched_getcpu();
#else
  return -1;
#endif
}

/* A pinned worker whose caller now posts from the worker's own CPU moves to the CPU
   the caller left, which no worker holds (`caller_cpu`): else the two take turns on one
   CPU while another idles until the OS moves the caller, if it does (an application
   pinning its thread, or two libraries in one process whose workers were pinned
   while their caller ran on different CPUs: one of them then shared its caller's CPU
   for whole runs, MobileNetV2 int8 2.45 ms a call against 1.8). Pinned workers hold
   distinct CPUs, so at most one moves, and it alone writes `caller_cpu` then. */
static void kiln_pool_follow_caller(int index) {
  int mine = kiln_pool.pinned[index], left;
  if (mine < 0 || KILN_LOAD(kiln_pool.post_cpu) != mine) {
    return;
  }
  left = KILN_LOAD(kiln_pool.caller_cpu);
  if (left >= 0 && left != mine && kiln_pool_pin_to(index, left)) {
    KILN_STORE(kiln_pool.caller_cpu, mine);
  }
}

/* The spin window of a worker that starts or goes on spinning at `now`: the set one,
   or while a worker was descheduled in the last KILN_POOL_LOADED_NS at most
   KILN_POOL_LOADED_SPIN_NS (a loaded machine: the caller, too, is often descheduled
   between two loops, and a worker spinning through that is charged for it). */
static int64_t kiln_pool_window(int64_t now) {
  int64_t window = KILN_LOAD(kiln_pool.spin_ns);
  if (now < KILN_LOAD(kiln_pool.loaded_until) && window > KILN_POOL_LOADED_SPIN_NS) {
    return KILN_POOL_LOADED_SPIN_NS;
  }
  return window;
}

/* Until a loop other than `seen` is posted or this worker must stop: spin for the
   spin window (read again as it goes: set_spin_us applies at once), then sleep. A
   worker that finds it was descheduled while it spun (KILN_POOL_PREEMPTED_NS between
   two looks at the clock) sleeps at once: another thread wants its CPU, and the
   scheduler charges a spinning thread for the time it spins, so that at the next loop
   it would run last, its share waiting for it (docs/abi.md, "Parallel loops"); a
   sleeping thread it wakes gets the CPU back at once. */
static void kiln_pool_idle(unsigned long seen, int index) {
  int64_t start = kiln_pool_now_ns(), last = start, now, window = kiln_pool_window(start);
  int preempted = 0;
  for (;;) {
    int i;
    for (i = 0; i < KILN_POOL_SPIN_BATCH; ++i) {
      if (kiln_pool_posted(seen) || index >= KILN_LOAD(kiln_pool.keep)) {
        return;
      }
      KILN_PAUSE();
    }
    if (KILN_LOAD(kiln_pool.alone)) {
      break; /* the loops run on the caller: a spinning sibling would slow it */
    }
    now = kiln_pool_now_ns();
    if (now - start >= window) {
      /* A window cut short by a recent preemption (this worker's or another's) is
         one too: the machine is loaded. */
      preempted = window < KILN_LOAD(kiln_pool.spin_ns);
      break;
    }
    if (now - last >= KILN_POOL_PREEMPTED_NS) {
      preempted = 1;
      KILN_STORE(kiln_pool.loaded_until, now + KILN_POOL_LOADED_NS);
      break;
    }
    last = now;
    window = kiln_pool_window(now);
  }
  pthread_mutex_lock(&kiln_pool.lock);
  if (index < KILN_LOAD(kiln_pool.keep) && !kiln_pool_posted(seen)) {
    KILN_ADD(kiln_pool.stats[KILN_POOL_STAT_SLEEPS], 1);
    KILN_ADD(kiln_pool.stats[KILN_POOL_STAT_PREEMPTED], preempted);
    KILN_ADD(kiln_pool.stats[KILN_POOL_STAT_SLEEPING], 1);
    while (index < KILN_LOAD(kiln_pool.keep) && !kiln_pool_posted(seen)) {
      pthread_cond_wait(&kiln_pool.wake, &kiln_pool.lock);
    }
    KILN_ADD(kiln_pool.stats[KILN_POOL_STAT_SLEEPING], -1);
  }
  pthread_mutex_unlock(&kiln_pool.lock);
}

/* A worker: waits until a loop is posted, helps run it. The argument is its index;
   workers with an index of at least `keep` return. */
static void* kiln_pool_worker(void* arg) {
  int index = (int)(intptr_t)arg;
  unsigned long seen = kiln_pool.birth; /* written before this thread was created */
  kiln_pool_in_parallel = 1;
  if (kiln_pool.pin_now) {
    kiln_pool_pin(index);
  }
  for (;;) {
    unsigned long posted;
    kiln_pool_idle(seen, index);
    if (index >= KILN_LOAD(kiln_pool.keep)) {
      return NULL;
    }
    posted = KILN_LOAD(kiln_pool.generation);
    KILN_ADD(kiln_pool.entered, 1);
    /* Still that loop? Then its fields stay put until this worker leaves. */
    if (KILN_LOAD(kiln_pool.generation) == posted && (posted & 1UL) == 0) {
      seen = posted;
      kiln_pool_follow_caller(index);
      kiln_pool_run_chunks(1 + index);
    }
    /* The last worker out wakes the caller only if it sleeps: taking the lock after
       every loop made the caller's next post wait for it (a futex round trip when
       the two met). `entered` and `waiting` are sequentially consistent, so either
       the caller sees no worker inside or this worker sees it waiting. */
    if (KILN_ADD(kiln_pool.entered, -1) == 1 && KILN_LOAD(kiln_pool.waiting)) {
      pthread_mutex_lock(&kiln_pool.lock);
      pthread_cond_signal(&kiln_pool.done); /* only a caller waits on it */
      pthread_mutex_unlock(&kiln_pool.lock);
    }
  }
}

/* Make the pool `want` workers (the caller holds `busy`, not the lock): start the
   missing ones, or stop and join those past `want`. The workers block every signal:
   signals go to the application's own threads. If the system refuses a thread, run
   with fewer. */
static void kiln_pool_resize(int want) {
  int i, started = kiln_pool.started;
  /* Another thread count: the verdict starts again from the threads, or stays with
     the caller for good where the caller may run on one CPU only (its threads could
     only take turns: no probe needed). */
  kiln_pool.one_cpu = kiln_pool.probe_ns > 0 && kiln_pool_allowed_cpus() == 1;
  kiln_pool.verdict = kiln_pool.one_cpu;
  KILN_ADD(kiln_pool.stats[KILN_POOL_STAT_SWITCHES],
           (KILN_LOAD(kiln_pool.stats[KILN_POOL_STAT_SWITCHES]) & 1) != kiln_pool.one_cpu);
  kiln_pool.sampled = kiln_pool.sample_next = kiln_pool.since_loops = 0;
  kiln_pool.since_probe = 0;
  KILN_STORE(kiln_pool.alone, kiln_pool.one_cpu);
  if (started > want) {
    pthread_mutex_lock(&kiln_pool.lock);
    KILN_STORE(kiln_pool.keep, want);
    pthread_cond_broadcast(&kiln_pool.wake);
    pthread_mutex_unlock(&kiln_pool.lock);
    for (i = want; i < started; ++i) {
      pthread_join(kiln_pool.workers[i], NULL);
    }
    started = want;
    KILN_STORE(kiln_pool.keep, KILN_POOL_MAX_THREADS);
  } else {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    kiln_pool.birth = KILN_LOAD(kiln_pool.generation);
    /* read by the new workers (written before pthread_create, which orders them) */
    kiln_pool.pin_now = kiln_pool_pins(want);
    KILN_STORE(kiln_pool.caller_cpu, kiln_pool_current_cpu());
    for (i = started; i < want; ++i) {
      kiln_pool.pinned[i] = -1; /* until the new worker pins itself */
    }
    while (started < want) {
      if (pthread_create(&kiln_pool.workers[started], NULL, kiln_pool_worker,
                         (void*)(intptr_t)started) != 0) {
        break;
      }
      ++started;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
  }
  pthread_mutex_lock(&kiln_pool.lock);
  kiln_pool.started = started;
  KILN_STORE(kiln_pool.stats[KILN_POOL_STAT_STARTED], started);
  pthread_mutex_unlock(&kiln_pool.lock);
}

/* Wait until no worker is inside the posted loop (spin, then sleep). */
static void kiln_pool_wait_workers(void) {
  int spin;
  for (spin = 0; spin < KILN_POOL_WAIT_SPINS && KILN_LOAD(kiln_pool.entered) > 0; ++spin) {
    KILN_PAUSE();
  }
  if (KILN_LOAD(kiln_pool.entered) > 0) {
    pthread_mutex_lock(&kiln_pool.lock);
    KILN_STORE(kiln_pool.waiting, 1); /* before looking at `entered` again */
    while (KILN_LOAD(kiln_pool.entered) > 0) {
      pthread_cond_wait(&kiln_pool.done, &kiln_pool.lock);
    }
    KILN_STORE(kiln_pool.waiting, 0);
    pthread_mutex_unlock(&kiln_pool.lock);
  }
}

/* The remembered cost of `body` (the caller holds `busy`). */
static struct kiln_pool_cost* kiln_pool_cost(kiln_pool_body_fn body) {
  size_t slot = ((size_t)(uintptr_t)body >> 4) % KILN_POOL_COSTS;
  struct kiln_pool_cost* cost = &kiln_pool.costs[slot];
  if (cost->body != body) {
    cost->body = body;
    cost->per_iteration = -1; /* not measured yet */
    cost->wall = -1;
  }
  return cost;
}

/* Work measured over n iterations, per iteration in ns / 256 (integer arithmetic). */
static int64_t kiln_pool_per_iteration(int64_t ns, int64_t n) {
  return ns > INT64_MAX / 256 ? INT64_MAX / n : ns * 256 / n;
}

/* A loop the pool does not take: on the caller, timed when it is `small` (so that a
   loop which has grown is handed off again). */
static int32_t kiln_pool_run_here(int64_t n, kiln_pool_body_fn body, void* context,
                                  int64_t* cost) {
  int64_t start = kiln_pool_now_ns();
  int32_t status;
  kiln_pool_in_parallel = 1;
  status = body(0, n, context);
  kiln_pool_in_parallel = 0;
  *cost = kiln_pool_per_iteration(kiln_pool_now_ns() - start, n);
  KILN_ADD(kiln_pool.stats[KILN_POOL_STAT_SMALL], 1);
  return status;
}

/* The first iteration of share `t` of `threads` over [0, n): the shares' sizes differ
   by at most one iteration, the larger ones last (n * t / threads, without overflow:
   n < 2^63 and threads <= KILN_POOL_MAX_THREADS). */
static int64_t kiln_pool_share_begin(int64_t n, int t, int threads) {
  return n / threads * t + n % threads * t / threads;
}

/* Split the n iterations of the posted loop into `threads` contiguous shares of equal
   size (within one) and chunks of at most `chunk` iterations, about
   KILN_POOL_CHUNKS_PER_THREAD per share, none crossing a share's end (the caller
   holds `busy`, the generation is odd and no worker is inside). */
static void kiln_pool_split(int64_t n, int threads) {
  int64_t widest = n / threads + (n % threads != 0);
  int t;
  kiln_pool.n = n;
  kiln_pool.chunk = widest / KILN_POOL_CHUNKS_PER_THREAD
                    + (widest % KILN_POOL_CHUNKS_PER_THREAD != 0);
  kiln_pool.shares = threads;
  for (t = 0; t < threads; ++t) {
    KILN_STORE(kiln_pool.share[t].next, kiln_pool_share_begin(n, t, threads));
    kiln_pool.share[t].end = kiln_pool_share_begin(n, t + 1, threads);
  }
}

/* Leave the pool to the next caller. */
static void kiln_pool_release(void) {
  pthread_mutex_lock(&kiln_pool.lock);
  kiln_pool.busy = 0;
  pthread_mutex_unlock(&kiln_pool.lock);
}

/* Post a loop to the pool (the caller holds `busy` and there are workers): the workers
   start taking its chunks. */
static void kiln_pool_post(int64_t n, kiln_pool_body_fn body, void* context) {
  KILN_STORE(kiln_pool.generation, KILN_LOAD(kiln_pool.generation) + 1); /* odd: being posted */
  kiln_pool_wait_workers(); /* a late worker may still be looking at the previous loop */
  kiln_pool.body = body;
  kiln_pool.context = context;
  kiln_pool_split(n, kiln_pool.started + 1);
  KILN_STORE(kiln_pool.post_cpu, kiln_pool_current_cpu());
  KILN_STORE(kiln_pool.status, 0);
  KILN_STORE(kiln_pool.work_ns, 0);
  pthread_mutex_lock(&kiln_pool.lock);
  KILN_STORE(kiln_pool.generation, KILN_LOAD(kiln_pool.generation) + 1); /* even: posted */
  if (KILN_LOAD(kiln_pool.stats[KILN_POOL_STAT_SLEEPING]) > 0) {
    pthread_cond_broadcast(&kiln_pool.wake); /* spinning workers see the generation */
  }
  pthread_mutex_unlock(&kiln_pool.lock);
}

/* Post a loop, run chunks of it on the caller and wait for the workers still in it;
   `*span` is its wall time. */
static int32_t kiln_pool_hand_off(int64_t n, kiln_pool_body_fn body, void* context,
                                  int64_t* span) {
  int64_t posted = kiln_pool_now_ns();
  kiln_pool_post(n, body, context);
  kiln_pool_in_parallel = 1;
  kiln_pool_run_chunks(0);
  kiln_pool_in_parallel = 0;
  kiln_pool_wait_workers(); /* every chunk is taken: wait for those still running */
  *span = kiln_pool_now_ns() - posted;
  return KILN_LOAD(kiln_pool.status);
}

/* Wait until `asleep` workers sleep: all (told to by `alone`; an idle worker looks
   every KILN_POOL_SPIN_BATCH pauses) or none (woken by an empty loop, posted and not
   waited for). 0 if they are not so within KILN_POOL_SETTLE_NS (descheduled by other
   jobs, or a worker on a halted CPU of a VM slow to wake). */
static int kiln_pool_settle(int64_t asleep) {
  int64_t start = kiln_pool_now_ns();
  while (KILN_LOAD(kiln_pool.stats[KILN_POOL_STAT_SLEEPING]) != asleep) {
    if (kiln_pool_now_ns() - start > KILN_POOL_SETTLE_NS) {
      return 0;
    }
    KILN_PAUSE();
  }
  return 1;
}

/* Whether this loop is a probe: run the other way than the verdict says, so that its
   time alone and on the threads, its last run's, are both known (kiln_pool_measured).
   One every KILN_POOL_PROBE_LOOPS loops and `probe_ns` of their time at least, with
   the workers as the probe needs them (kiln_pool_settle): all asleep for a probe on
   the caller alone (a worker spinning on an SMT sibling, or on the same CPU, slows the
   caller), all awake for one on the threads (where the loops run alone they sleep;
   waking one is not what the threads cost). A probe whose workers do not settle is
   dropped. */
static int kiln_pool_probe_due(void) {
  if (kiln_pool.probe_ns <= 0 || kiln_pool.one_cpu
      || ++kiln_pool.since_loops < KILN_POOL_PROBE_LOOPS
      || kiln_pool.since_probe < kiln_pool.probe_ns) {
    return 0;
  }
  kiln_pool.since_loops = 0;
  kiln_pool.since_probe = 0;
  KILN_STORE(kiln_pool.alone, !kiln_pool.verdict);
  if (kiln_pool.verdict) {
    kiln_pool_post(0, NULL, NULL);
  }
  if (kiln_pool_settle(kiln_pool.verdict ? 0 : kiln_pool.started)) {
    return 1;
  }
  KILN_STORE(kiln_pool.alone, kiln_pool.verdict);
  if (!kiln_pool.verdict) {
    kiln_pool_post(0, NULL, NULL); /* those asleep by now */
  }
  return 0;
}

/* log2(x) in 1/1024ths for x >= 1, and its inverse: exact at powers of two, linear
   between (within 0.09, about 6%: the verdict's thresholds are 15% apart). */
static int64_t kiln_pool_log2(int64_t x) {
  int top = 63 - __builtin_clzll((unsigned long long)x);
  int64_t below = x - ((int64_t)1 << top);
  return (int64_t)top * 1024 + (top > 10 ? below >> (top - 10) : below << (10 - top));
}

static int64_t kiln_pool_exp2(int64_t y) {
  int64_t top = y / 1024, frac = y % 1024;
  return top > 10 ? (1024 + frac) << (top - 10) : (1024 + frac) >> (10 - top);
}

/* The verdict's figure: the geometric mean of the recent probes' gains, leaving out
   the highest and the lowest sixth (a loop held up by another job, on either side).
   Not a median: where the threads take turns on one CPU most loops run as fast as
   alone and one in four waits a time slice (milliseconds) for a descheduled thread,
   which a median leaves out and the mean of the logarithms keeps (docs/performance.md,
   "Two threads on one core"). */
static int64_t kiln_pool_typical_gain(void) {
  int64_t sorted[KILN_POOL_SAMPLES], g, sum = 0;
  int n = kiln_pool.sampled, trim = n / 6, i, j;
  for (i = 0; i < n; ++i) { /* insertion sort: 15 at most */
    g = kiln_pool_log2(kiln_pool.samples[i]);
    for (j = i; j > 0 && sorted[j - 1] > g; --j) {
      sorted[j] = sorted[j - 1];
    }
    sorted[j] = g;
  }
  for (i = trim; i < n - trim; ++i) {
    sum += sorted[i];
  }
  return kiln_pool_exp2(sum / (n - 2 * trim));
}

/* One probe's finding: a loop took `alone` on the caller alone and `shared` on the
   threads (ns / 256 per iteration; one of them in the probe, the other in its last
   run the verdict's way). The verdict follows the recent probes
   (kiln_pool_typical_gain). Why not a unit of synthetic work: a 12 us unit
   misjudged where other runtimes' pools shared the process (docs/performance.md,
   "Two threads on one core"); the model's own loops are what the verdict is about. */
static void kiln_pool_judge(int64_t alone, int64_t shared) {
  double ratio = shared > 0 ? 1000.0 * (double)alone / (double)shared : 1e9;
  int64_t gain = ratio < 1.0 ? 1 : ratio < 1e9 ? (int64_t)ratio : 1000000000;
  int want;
  kiln_pool.samples[kiln_pool.sample_next] = gain;
  kiln_pool.sample_next = (kiln_pool.sample_next + 1) % KILN_POOL_SAMPLES;
  kiln_pool.sampled += kiln_pool.sampled < KILN_POOL_SAMPLES;
  KILN_ADD(kiln_pool.stats[KILN_POOL_STAT_PROBES], 1);
  KILN_ADD(kiln_pool.stats[KILN_POOL_STAT_SHARED], gain < KILN_POOL_ALONE_BELOW);
  gain = kiln_pool_typical_gain();
  KILN_STORE(kiln_pool.stats[KILN_POOL_STAT_GAIN], gain);
  if (kiln_pool.sampled >= KILN_POOL_MIN_SAMPLES) {
    want = gain < (kiln_pool.verdict ? KILN_POOL_SHARED_FROM : KILN_POOL_ALONE_BELOW);
    if (want != kiln_pool.verdict) {
      kiln_pool.verdict = want;
      KILN_ADD(kiln_pool.stats[KILN_POOL_STAT_SWITCHES], 1);
    }
  }
}

/* Run a loop the pool takes: on the threads, or on the caller alone where the verdict
   (or a probe) says so, timed either way; a probe whose body last ran the other way
   adds its finding to the verdict. Results are the same either way (an iteration
   computes what it computes serially). */
static int32_t kiln_pool_measured(int64_t n, kiln_pool_body_fn body, void* context,
                                  struct kiln_pool_cost* cost) {
  int probe = kiln_pool_probe_due();
  int here = kiln_pool.verdict != probe;
  /* A reference for later probes only as the loops usually run: on the threads, with
     none of them asleep (waking one is not what the threads cost). */
  int usual = probe || here || KILN_LOAD(kiln_pool.stats[KILN_POOL_STAT_SLEEPING]) == 0;
  int64_t wall, start = kiln_pool_now_ns();
  int32_t status;
  if (here) {
    kiln_pool_in_parallel = 1;
    status = body(0, n, context);
    kiln_pool_in_parallel = 0;
    wall = kiln_pool_now_ns() - start;
    KILN_ADD(kiln_pool.stats[KILN_POOL_STAT_ALONE], 1);
  } else {
    status = kiln_pool_hand_off(n, body, context, &wall);
    KILN_ADD(kiln_pool.stats[KILN_POOL_STAT_LOOPS], 1);
    KILN_ADD(kiln_pool.stats[KILN_POOL_STAT_SPAN_NS], wall);
    cost->per_iteration = kiln_pool_per_iteration(KILN_LOAD(kiln_pool.work_ns), n);
  }
  if (probe && cost->wall >= 0 && cost->wall_alone != here) {
    int64_t now = kiln_pool_per_iteration(wall, n);
    kiln_pool_judge(here ? now : cost->wall, here ? cost->wall : now);
  }
  if (probe) { /* the workers as the verdict wants them: asleep, or woken now */
    KILN_STORE(kiln_pool.alone, kiln_pool.verdict);
    if (!kiln_pool.verdict) {
      kiln_pool_post(0, NULL, NULL);
    }
  }
  if (usual) {
    cost->wall = kiln_pool_per_iteration(wall, n);
    cost->wall_alone = here;
  }
  kiln_pool.since_probe += wall;
  return status;
}

KILN_HIDDEN int32_t KILN_PARALLEL_FOR(int64_t n, kiln_pool_body_fn body, void* context) {
  struct kiln_pool_cost* cost;
  int32_t status;
  int want;
  if (n <= 0) {
    return 0;
  }
  if (n == 1 || kiln_pool_in_parallel) {
    return body(0, n, context);
  }
  pthread_once(&kiln_pool_once, kiln_pool_init);
  pthread_mutex_lock(&kiln_pool.lock);
  if (kiln_pool.busy || kiln_pool.threads == 1) {
    /* One thread configured, or another thread is running a loop: run serially (with
       one thread, first stop the workers a larger count had started). */
    int shrink = !kiln_pool.busy && kiln_pool.started > 0;
    kiln_pool.busy |= shrink;
    pthread_mutex_unlock(&kiln_pool.lock);
    if (shrink) {
      kiln_pool_resize(0);
      kiln_pool_release();
    }
    return body(0, n, context);
  }
  kiln_pool.busy = 1;
  want = kiln_pool.threads - 1;
  pthread_mutex_unlock(&kiln_pool.lock);
  if (kiln_pool.started != want) {
    kiln_pool_resize(want); /* first use, first use after fork(), or set_num_threads */
  }
  if (kiln_pool.started == 0) { /* the system refused every worker */
    kiln_pool_release();
    return body(0, n, context);
  }
  cost = kiln_pool_cost(body);
  /* Measured work below serial_ns: n * cost / 256 < serial_ns, without overflow. */
  if (cost->per_iteration >= 0 && cost->per_iteration < kiln_pool.serial_ns * 256 / n) {
    status = kiln_pool_run_here(n, body, context, &cost->per_iteration);
  } else {
    status = kiln_pool_measured(n, body, context, cost);
  }
  kiln_pool_release();
  return status;
}

KILN_EXPORT int32_t KILN_SET_NUM_THREADS(int32_t n) {
  if (kiln_pool_check_threads(n) != 0) {
    return KILN_HOST_ARGUMENT_ERROR;
  }
  pthread_once(&kiln_pool_once, kiln_pool_init);
  pthread_mutex_lock(&kiln_pool.lock);
  kiln_pool.threads = n == 0 ? kiln_pool_default_threads() : (int)n; /* from the next loop */
  KILN_STORE(kiln_pool.stats[KILN_POOL_STAT_THREADS], kiln_pool.threads);
  pthread_mutex_unlock(&kiln_pool.lock);
  return 0;
}

KILN_EXPORT int32_t KILN_GET_NUM_THREADS(void) {
  int n;
  pthread_once(&kiln_pool_once, kiln_pool_init);
  pthread_mutex_lock(&kiln_pool.lock);
  n = kiln_pool.threads;
  pthread_mutex_unlock(&kiln_pool.lock);
  return n;
}

KILN_EXPORT int32_t KILN_SET_SPIN_US(int32_t us) {
  if (kiln_pool_check_spin(us) != 0) {
    return KILN_HOST_ARGUMENT_ERROR;
  }
  pthread_once(&kiln_pool_once, kiln_pool_init);
  KILN_STORE(kiln_pool.spin_ns, us < 0 ? kiln_pool_default_spin_ns() : (int64_t)us * 1000);
  return 0;
}

KILN_EXPORT int32_t KILN_POOL_STATS(int64_t* out, int32_t size) {
  int32_t i;
  pthread_once(&kiln_pool_once, kiln_pool_init);
  KILN_STORE(kiln_pool.stats[KILN_POOL_STAT_THREADS], KILN_GET_NUM_THREADS());
  KILN_STORE(kiln_pool.stats[KILN_POOL_STAT_SPIN_US], KILN_LOAD(kiln_pool.spin_ns) / 1000);
  for (i = 0; out != NULL && i < size && i < KILN_POOL_STAT_COUNT; ++i) {
    out[i] = KILN_LOAD(kiln_pool.stats[i]);
  }
  return out == NULL || size < 0 ? 0 : i;
}

/* Unloading the library (dlclose, or exit): the workers run its code, so they must
   exit before it is unmapped. */
__attribute__((destructor)) static void kiln_pool_stop(void) {
  int i, started;
  if (!kiln_pool_ready) {
    return;
  }
  pthread_mutex_lock(&kiln_pool.lock);
  KILN_STORE(kiln_pool.keep, 0);
  started = kiln_pool.started;
  pthread_cond_broadcast(&kiln_pool.wake);
  pthread_mutex_unlock(&kiln_pool.lock);
  for (i = 0; i < started; ++i) {
    pthread_join(kiln_pool.workers[i], NULL);
  }
  pthread_mutex_lock(&kiln_pool.lock);
  kiln_pool.started = 0;
  KILN_STORE(kiln_pool.stats[KILN_POOL_STAT_STARTED], 0);
  KILN_STORE(kiln_pool.keep, KILN_POOL_MAX_THREADS);
  pthread_mutex_unlock(&kiln_pool.lock);
}

#endif /* KILN_NO_THREADS */

#endif /* KILN_HOST_PARALLEL */

#if defined(KILN_HOST_PROFILE)

/* ------------------------------------------------------- profiling
   Counters of the kernel-call timers that kiln.transform.profile puts around
   every kernel call of a lowered graph function, and around its whole body
   (docs/abi.md, "Profiling"). Counts are summed over every thread that calls
   the library (relaxed atomic adds with GCC/clang). A firmware build without
   clock_gettime defines KILN_PROFILE_CLOCK_NS() to its own nanosecond clock. */
#include <time.h>

#if !defined(KILN_PROFILE_START) /* standalone builds of this file */
#define KILN_PROFILE_START kiln_profile_start
#define KILN_PROFILE_STOP kiln_profile_stop
#define KILN_PROFILE_READ kiln_profile_read
#define KILN_PROFILE_RESET kiln_profile_reset
#endif
#if !defined(KILN_HOST_PROFILE_FUNCTIONS)
#define KILN_HOST_PROFILE_FUNCTIONS {0}
#define KILN_HOST_PROFILE_KERNELS {0}
#endif

#if defined(__GNUC__) || defined(__clang__)
#define KILN_PROFILE_ADD(x, v) __atomic_fetch_add(&(x), (v), __ATOMIC_RELAXED)
#define KILN_PROFILE_SET(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)
#define KILN_PROFILE_GET(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#else
#define KILN_PROFILE_ADD(x, v) ((x) += (v))
#define KILN_PROFILE_SET(x, v) ((x) = (v))
#define KILN_PROFILE_GET(x) (x)
#endif

static const char* const kiln_host_profile_functions[KILN_HOST_PROFILE] =
    KILN_HOST_PROFILE_FUNCTIONS;
static const char* const kiln_host_profile_kernels[KILN_HOST_PROFILE] = KILN_HOST_PROFILE_KERNELS;
static uint64_t kiln_host_profile_calls[KILN_HOST_PROFILE];
static uint64_t kiln_host_profile_ns[KILN_HOST_PROFILE];

static int64_t kiln_host_clock_ns(void) {
#if defined(KILN_PROFILE_CLOCK_NS)
  return (int64_t)KILN_PROFILE_CLOCK_NS();
#else
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + (int64_t)ts.tv_nsec;
#endif
}

/* The clock, read where a timed region starts. */
KILN_HIDDEN int64_t KILN_PROFILE_START(int64_t site) {
  (void)site;
  return kiln_host_clock_ns();
}

/* One more call of `site`, which took the time since `start`. */
KILN_HIDDEN int64_t KILN_PROFILE_STOP(int64_t site, int64_t start) {
  int64_t elapsed = kiln_host_clock_ns() - start;
  if (site >= 0 && site < KILN_HOST_PROFILE) {
    KILN_PROFILE_ADD(kiln_host_profile_calls[site], 1u);
    KILN_PROFILE_ADD(kiln_host_profile_ns[site], (uint64_t)(elapsed > 0 ? elapsed : 0));
  }
  return 0;
}

/* The counters of `site` (0 <= site < the number of sites): 0, or -1 past the last
   site. `function` is the calling function; `kernel` the called kernel, or "" for
   the site that times the function's whole body. Any output may be NULL. */
KILN_EXPORT int32_t KILN_PROFILE_READ(int32_t site, const char** function, const char** kernel,
                                      uint64_t* calls, uint64_t* total_ns) {
  if (site < 0 || site >= KILN_HOST_PROFILE) {
    return -1;
  }
  if (function != NULL) {
    *function = kiln_host_profile_functions[site] ? kiln_host_profile_functions[site] : "";
  }
  if (kernel != NULL) {
    *kernel = kiln_host_profile_kernels[site] ? kiln_host_profile_kernels[site] : "";
  }
  if (calls != NULL) {
    *calls = KILN_PROFILE_GET(kiln_host_profile_calls[site]);
  }
  if (total_ns != NULL) {
    *total_ns = KILN_PROFILE_GET(kiln_host_profile_ns[site]);
  }
  return 0;
}

/* Zero every counter. */
KILN_EXPORT void KILN_PROFILE_RESET(void) {
  int32_t site;
  for (site = 0; site < KILN_HOST_PROFILE; ++site) {
    KILN_PROFILE_SET(kiln_host_profile_calls[site], 0u);
    KILN_PROFILE_SET(kiln_host_profile_ns[site], 0u);
  }
}

#endif /* KILN_HOST_PROFILE */

#endif /* !KILN_HOST_MODEL_ONLY */

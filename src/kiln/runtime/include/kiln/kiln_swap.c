/* ------------------------------------------------------- swapping weights
   kiln_host.c's part for `{prefix}_swap_weights` (docs/abi.md, "Swapping weights";
   docs/format.md, "The swap program"): new raw weights (the model's named weights, as
   the ONNX initializers hold them) into the loaded library's constants, without the
   compiler. The compiler writes, per constant, the steps that made it from the named
   weights (transposes, panel packing, batch-norm folding, Winograd filter transforms)
   as a table of int64 words, `{prefix}_swap_program`, with the weights' names in
   `{prefix}_swap_names` (`swap_program.c`), and the interpreter that runs it,
   `{prefix}_swap_run` (kiln_swap_run.c, as `swap_runtime.c`): both written after the
   compile cache, as the record names the weights. Here: the call guard (each entry counts
   the calls inside their kernel; a swap holds new ones and waits for the running ones,
   so a call sees the old or the new constants, never a mix), the list of raw weights
   (`{prefix}_swap_weight`) and the entry, which checks the raw weights and calls the
   interpreter. Weak stand-ins answer "no swap program" in a library without them.

   host.c defines, when the model has constants:
     KILN_HOST_SWAP       (this part is in)
     KILN_SWAP_WEIGHTS    `{prefix}_swap_weights` (exported)
     KILN_SWAP_WEIGHT     `{prefix}_swap_weight` (exported: the raw weights it takes)
     KILN_SWAP_PROGRAM    `{prefix}_swap_program`, KILN_SWAP_NAMES `{prefix}_swap_names`,
     KILN_SWAP_RUN        `{prefix}_swap_run` (hidden; weak here)
     KILN_SWAP_PAUSE      `{prefix}_swap_pause`, KILN_SWAP_RESUME `{prefix}_swap_resume`
                          (hidden: the guard, for the interpreter) */
#if defined(KILN_HOST_SWAP)
#include <stdlib.h>
#if defined(__linux__) && !defined(KILN_NO_THREADS)
#include <sched.h>
#define KILN_SWAP_SUPPORTED 1
#endif

/* Return codes of {prefix}_swap_weights (kiln.h). */
#define KILN_SWAP_EARGUMENT (-1) /* raw weights of another count, name, dtype or shape */
#define KILN_SWAP_ENOMEM 1       /* an allocation failed */
#define KILN_SWAP_EUNSUPPORTED 2 /* no swap program, or a host without mprotect */
#define KILN_SWAP_EPROTECT 3     /* the constants' pages could not be made writable */
#define KILN_SWAP_EVALUE 4       /* new values the compiled transforms cannot take */

#define KILN_SWAP_MAGIC 0x314d5250575358LL /* "XSWPRM1" */
#define KILN_SWAP_VERSION 1
#define KILN_SWAP_RANK 8

enum { /* the program's dtypes (kiln.codegen.swap_program.DTYPES) */
  KILN_SWAP_BOOL, KILN_SWAP_I8, KILN_SWAP_I16, KILN_SWAP_I32, KILN_SWAP_I64, KILN_SWAP_U8,
  KILN_SWAP_U16, KILN_SWAP_U32, KILN_SWAP_U64, KILN_SWAP_F32, KILN_SWAP_F64, KILN_SWAP_NTYPES
};
/* DLPack code, bits of each program dtype. */
static const uint8_t kiln_swap_dl[KILN_SWAP_NTYPES][2] = {
    {6, 8}, {0, 8}, {0, 16}, {0, 32}, {0, 64}, {1, 8}, {1, 16}, {1, 32}, {1, 64}, {2, 32},
    {2, 64}};
static const char* const kiln_swap_dtype_names[KILN_SWAP_NTYPES] = {
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float32", "float64"};

KILN_HIDDEN __attribute__((weak)) const int64_t KILN_SWAP_PROGRAM[1] = {0};
KILN_HIDDEN __attribute__((weak)) const char KILN_SWAP_NAMES[1] = {0};

/* The call guard: `kiln_swap_calls` kernels running, `kiln_swap_paused` a swap installing. */
static int kiln_swap_calls;
static int kiln_swap_paused;
static char kiln_swap_lock; /* one swap at a time */

/* The program and names through a pointer the compiler cannot see the bounds of: the
   weak stand-ins above are one element long, swap_program.c's are the real ones. */
static const int64_t* kiln_swap_words(void) {
  const int64_t* p = KILN_SWAP_PROGRAM;
#if defined(__GNUC__) || defined(__clang__)
  __asm__("" : "+r"(p));
#endif
  return p;
}

static const char* kiln_swap_name_list(void) {
  const char* p = KILN_SWAP_NAMES;
#if defined(__GNUC__) || defined(__clang__)
  __asm__("" : "+r"(p));
#endif
  return p;
}

static void kiln_swap_pause_point(void) {
#if defined(KILN_SWAP_SUPPORTED)
  sched_yield();
#endif
}

/* Around each kernel call of an entry (KILN_HOST_CALL_ENTER / _LEAVE). */
static KILN_UNUSED void kiln_host_call_enter(void) {
  for (;;) {
    __atomic_add_fetch(&kiln_swap_calls, 1, __ATOMIC_SEQ_CST);
    if (!__atomic_load_n(&kiln_swap_paused, __ATOMIC_SEQ_CST)) return;
    __atomic_sub_fetch(&kiln_swap_calls, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&kiln_swap_paused, __ATOMIC_SEQ_CST)) kiln_swap_pause_point();
  }
}

static KILN_UNUSED void kiln_host_call_leave(void) {
  __atomic_sub_fetch(&kiln_swap_calls, 1, __ATOMIC_SEQ_CST);
}
/* Hold new calls and wait for the running ones (kiln_swap_run.c installs meanwhile). */
KILN_HIDDEN void KILN_SWAP_PAUSE(void) {
  while (__atomic_test_and_set(&kiln_swap_lock, __ATOMIC_ACQUIRE)) kiln_swap_pause_point();
  __atomic_store_n(&kiln_swap_paused, 1, __ATOMIC_SEQ_CST);
  while (__atomic_load_n(&kiln_swap_calls, __ATOMIC_SEQ_CST)) kiln_swap_pause_point();
}

KILN_HIDDEN void KILN_SWAP_RESUME(void) {
  __atomic_store_n(&kiln_swap_paused, 0, __ATOMIC_SEQ_CST);
  __atomic_clear(&kiln_swap_lock, __ATOMIC_RELEASE);
}

/* The interpreter (kiln_swap_run.c, its own object `swap_runtime.c` beside the program):
   build every constant from `raw` by `program`, then install; a library without it
   keeps this stand-in. */
KILN_HIDDEN __attribute__((weak)) int32_t KILN_SWAP_RUN(const void* raw, const int64_t* program,
                                                       char* error, size_t size) {
  (void)raw;
  (void)program;
  snprintf(error, size, "swap_weights: the library has no swap program (built before it, or "
           "with a transform the program cannot express)");
  return KILN_SWAP_EUNSUPPORTED;
}
#define KILN_HOST_CALL_ENTER() kiln_host_call_enter()
#define KILN_HOST_CALL_LEAVE() kiln_host_call_leave()

/* The raw weight `i` of the program: its name, dtype, rank and shape (words). */
static const int64_t* kiln_swap_describe(int32_t i, const char** name) {
  const int64_t* pc = kiln_swap_words() + 6;
  const char* s = kiln_swap_name_list();
  int32_t k;
  for (k = 0; k < i; ++k) {
    pc += 2 + pc[1];
    s += strlen(s) + 1;
  }
  if (name) *name = s;
  return pc;
}

static int32_t kiln_swap_count(void) {
  const int64_t* words = kiln_swap_words();
  if (words[0] != KILN_SWAP_MAGIC || words[1] != KILN_SWAP_VERSION) return -1;
  return (int32_t)words[2];
}

/* The number of raw weights {prefix}_swap_weights takes (-1: the library has no swap
   program); with 0 <= i < that number, the i-th one's name, dtype, rank and shape. */
KILN_EXPORT int32_t KILN_SWAP_WEIGHT(int32_t i, const char** name, DLDataType* dtype,
                                     int32_t* ndim, const int64_t** shape) {
  int32_t n = kiln_swap_count();
  if (i >= 0 && i < n) {
    const int64_t* w = kiln_swap_describe(i, name);
    if (dtype) {
      dtype->code = kiln_swap_dl[w[0]][0];
      dtype->bits = kiln_swap_dl[w[0]][1];
      dtype->lanes = 1;
    }
    if (ndim) *ndim = (int32_t)w[1];
    if (shape) *shape = w + 2;
  }
  return n;
}

/* Whether raw weight `i` is a compact CPU tensor of the program's dtype and shape. */
static int32_t kiln_swap_check(const DLTensor* t, int32_t i) {
  const char* name;
  const int64_t* w = kiln_swap_describe(i, &name);
  int64_t expected = 1, k;
  if (t->data == NULL && w[1] >= 0) {
    for (k = 0; k < w[1]; ++k) expected *= w[2 + k];
    if (expected) return kiln_host_fail("swap_weights: weight %d '%s': data is NULL", (int)i, name);
  }
  if (t->device.device_type != KILN_DEVICE_CPU)
    return kiln_host_fail("swap_weights: weight %d '%s': not a CPU tensor", (int)i, name);
  if (t->dtype.code != kiln_swap_dl[w[0]][0] || t->dtype.bits != kiln_swap_dl[w[0]][1] ||
      t->dtype.lanes != 1)
    return kiln_host_fail("swap_weights: weight %d '%s': expected dtype %s", (int)i, name,
                          kiln_swap_dtype_names[w[0]]);
  if (t->ndim != w[1] || (t->ndim && t->shape == NULL))
    return kiln_host_fail("swap_weights: weight %d '%s': expected %d dimensions, got %d", (int)i,
                          name, (int)w[1], (int)t->ndim);
  expected = 1;
  for (k = t->ndim - 1; k >= 0; --k) {
    if (t->shape[k] != w[2 + k])
      return kiln_host_fail("swap_weights: weight %d '%s': dimension %d is %lld, expected %lld",
                            (int)i, name, (int)k, (long long)t->shape[k], (long long)w[2 + k]);
    if (t->strides && t->shape[k] != 1 && t->strides[k] != expected)
      return kiln_host_fail("swap_weights: weight %d '%s': not compact (strides)", (int)i, name);
    expected *= w[2 + k];
  }
  return 0;
}

KILN_EXPORT int32_t KILN_SWAP_WEIGHTS(const DLTensor* raw, int32_t n_raw) {
  int32_t n = kiln_swap_count(), i;
  kiln_host_error[0] = '\0';
  if (n < 0) {
    kiln_host_fail("swap_weights: the library has no swap program (built before it, or "
                   "with a transform the program cannot express)");
    return KILN_SWAP_EUNSUPPORTED;
  }
  if (n_raw != n)
    return kiln_host_fail("swap_weights: expected %d raw weights, got %d", (int)n,
                          (int)n_raw);
  if (n && raw == NULL) return kiln_host_fail("swap_weights: raw is NULL");
  for (i = 0; i < n; ++i)
    if (kiln_swap_check(&raw[i], i) != 0) return KILN_SWAP_EARGUMENT;
#if defined(KILN_SWAP_SUPPORTED)
  return KILN_SWAP_RUN(raw, kiln_swap_words(), kiln_host_error, sizeof kiln_host_error);
#else
  kiln_host_fail("swap_weights: needs Linux (mprotect, /proc/self/maps) and threads; "
                 "nothing was changed");
  return KILN_SWAP_EUNSUPPORTED;
#endif
}

#else
#define KILN_HOST_CALL_ENTER() ((void)0)
#define KILN_HOST_CALL_LEAVE() ((void)0)
#endif /* KILN_HOST_SWAP */

/*
 * kiln.h -- the C ABI of libraries built by kiln (docs/abi.md).
 *
 * A library kiln exports (.so or .a) needs nothing but this header: no Python
 * and no kiln runtime library. Every public IR function `name` is a packed
 * entry `{prefix}name` with the KilnPackedFunc signature; tensors cross as
 * DLPack DLTensor*, scalars as KilnValue.
 *
 *     #include <kiln/kiln.h>
 *     float x[4] = {1, 2, 3, 4}, y[4];
 *     int64_t shape[1] = {4};
 *     DLTensor tx = kiln_tensor(x, 1, shape, KILN_FLOAT32);
 *     DLTensor ty = kiln_tensor(y, 1, shape, KILN_FLOAT32);
 *     KilnValue args[2]; int32_t codes[2];
 *     kiln_set_tensor(args, codes, 0, &tx);
 *     kiln_set_tensor(args, codes, 1, &ty);
 *     if (kiln_main(args, codes, 2) != 0) puts(kiln__last_error());
 *
 * The DLPack part is written from the DLPack specification (v1.x). If you need
 * all of DLPack (DLManagedTensor, ...), include <dlpack/dlpack.h> before this
 * header; kiln.h then uses its definitions.
 */
#ifndef KILN_KILN_H_
#define KILN_KILN_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__cplusplus) || (defined(__STDC_VERSION__) && __STDC_VERSION__ >= 199901L)
#define KILN_INLINE static inline
#else
#define KILN_INLINE static __inline__ /* C89 with GNU extensions */
#endif

/* ---------------------------------------------------------------- DLPack */
#ifndef DLPACK_DLPACK_H_
#define KILN_DLPACK_SUBSET 1

#define DLPACK_MAJOR_VERSION 1
#define DLPACK_MINOR_VERSION 0

/* Where a tensor's memory lives. kiln's CPU libraries accept kDLCPU only. */
typedef enum {
  kDLCPU = 1,
  kDLCUDA = 2,
  kDLCUDAHost = 3,
  kDLOpenCL = 4,
  kDLVulkan = 7,
  kDLMetal = 8,
  kDLVPI = 9,
  kDLROCM = 10,
  kDLROCMHost = 11,
  kDLExtDev = 12,
  kDLCUDAManaged = 13,
  kDLOneAPI = 14,
  kDLWebGPU = 15,
  kDLHexagon = 16,
  kDLMAIA = 17
} DLDeviceType;

typedef struct {
  DLDeviceType device_type;
  int32_t device_id;
} DLDevice;

typedef enum {
  kDLInt = 0,
  kDLUInt = 1,
  kDLFloat = 2,
  kDLOpaqueHandle = 3,
  kDLBfloat = 4,
  kDLComplex = 5,
  kDLBool = 6
} DLDataTypeCode;

/* Element type: code (a DLDataTypeCode), bits per lane, lanes (1 = scalar). */
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

/*
 * A tensor view. `shape` has `ndim` entries; `strides` (in elements) is NULL
 * for a compact row-major tensor; the first element is at
 * (char *)data + byte_offset.
 */
typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides;
  uint64_t byte_offset;
} DLTensor;
#endif /* DLPACK_DLPACK_H_ */

/* ------------------------------------------------------------- kiln ABI */
/* Version of the packed calling convention described in docs/abi.md. */
#define KILN_ABI_VERSION 2

/* One argument of a packed call; which member is live is given by its type code. */
typedef union {
  int64_t v_int64;
  double v_float64;
  void *v_handle;
} KilnValue;

/* Type codes of packed arguments (values match TVM's / DLPack's usage). */
enum {
  KILN_ARG_INT = 0,      /* v_int64: integer and bool scalars */
  KILN_ARG_FLOAT = 2,    /* v_float64: float scalars */
  KILN_ARG_HANDLE = 3,   /* v_handle: the terminate flag, an int32_t* (or NULL) */
  KILN_ARG_DLTENSOR = 7  /* v_handle: DLTensor* */
};

/*
 * A public entry `{prefix}name`. Returns 0 on success; non-zero on failure,
 * with the message in `{prefix}_last_error()` (thread-local).
 */
typedef int32_t (*KilnPackedFunc)(const KilnValue *args, const int32_t *type_codes,
                                  int32_t num_args);

/*
 * `{prefix}_output_shapes_{name}` of a graph function with symbolic dimensions
 * (docs/abi.md, "Symbolic shapes"): given the inputs only (`num_args` of them), it
 * checks them as `{prefix}name` would and writes every result's dimensions, one
 * result after the other, into `shapes`. Returns 0, or non-zero with the message
 * in `{prefix}_last_error()`.
 */
typedef int32_t (*KilnOutputShapesFunc)(const KilnValue *args, const int32_t *type_codes,
                                        int32_t num_args, int64_t *shapes);

/*
 * A generation's token callback: step `step`'s (from 0) chosen token of each of the
 * `batch` rows (`tokens`, valid during the call only), and the caller's `user` pointer.
 * Returning non-zero ends the generation after this step.
 */
typedef int32_t (*KilnTokenFunc)(const int64_t *tokens, int64_t batch, int64_t step,
                                 void *user);

/*
 * `{prefix}_generate_{name}` of a decoder function with a key/value cache (docs/abi.md,
 * "Generation"): greedy generation of up to `max_new_tokens` tokens after each row of
 * `prompt` (int64 [batch, prompt_len]) into `out_ids` (int64 [batch, max_new_tokens]);
 * `*out_steps` is the number generated per row. A row that produced one of the `n_stop`
 * `stop_tokens` continues with `pad_token`; the loop ends when every row has. `on_token`
 * (NULL: none) is called with each step's tokens as they are chosen, on the calling
 * thread, with `user`; a non-zero return ends the loop early (still a success). Returns
 * 0, or non-zero with the message in `{prefix}_last_error()`.
 */
typedef int32_t (*KilnGenerateFunc)(const int64_t *prompt, int64_t batch, int64_t prompt_len,
                                    int64_t max_new_tokens, const int64_t *stop_tokens,
                                    int32_t n_stop, int64_t pad_token, int64_t *out_ids,
                                    int64_t *out_steps, KilnTokenFunc on_token, void *user);

/*
 * `{prefix}_swap_weights` of a library with constants (docs/abi.md, "Swapping weights"):
 * new values of the model's named weights (`raw`, as the ONNX initializers hold them:
 * compact CPU tensors, `n_raw` of them in the order `{prefix}_swap_weight` gives)
 * rebuilt into the library's constants (transposed, packed, batch norms folded, as the
 * compile did) and installed while no call runs: each call sees the old or the new
 * weights, never a mix. Returns KILN_SWAP_OK, or one of the codes below with the message
 * in `{prefix}_last_error()`; on any error nothing is installed.
 */
typedef int32_t (*KilnSwapWeightsFunc)(const DLTensor *raw, int32_t n_raw);

/*
 * `{prefix}_swap_weight(i, &name, &dtype, &ndim, &shape)`: the number of raw weights
 * `{prefix}_swap_weights` takes (-1: the library cannot swap in C); with 0 <= i < that
 * number, the i-th one's name, dtype, rank and shape (pointers may be NULL).
 */
typedef int32_t (*KilnSwapWeightFunc)(int32_t i, const char **name, DLDataType *dtype,
                                      int32_t *ndim, const int64_t **shape);

#define KILN_SWAP_OK 0
#define KILN_SWAP_EARGUMENT (-1)    /* another count, dtype or shape; NULL or strided data */
#define KILN_SWAP_ENOMEM 1          /* an allocation failed */
#define KILN_SWAP_EUNSUPPORTED 2    /* no swap program in this library (Python can swap) */
#define KILN_SWAP_EPROTECT 3        /* the constants' pages cannot be written */
#define KILN_SWAP_EVALUE 4          /* a value the compiled transforms cannot take */

/* `{prefix}_last_error` and `{prefix}_metadata`. */
typedef const char *(*KilnStringFunc)(void);

/* DLDataType of a scalar element type (lanes = 1). */
KILN_INLINE DLDataType kiln_dtype(uint8_t code, uint8_t bits) {
  DLDataType t;
  t.code = code;
  t.bits = bits;
  t.lanes = 1;
  return t;
}

/* DLDataType values of kiln's dtypes. */
#define KILN_DTYPE(code_, bits_) kiln_dtype((uint8_t)(code_), (uint8_t)(bits_))
#define KILN_BOOL KILN_DTYPE(kDLBool, 8)
#define KILN_INT8 KILN_DTYPE(kDLInt, 8)
#define KILN_INT16 KILN_DTYPE(kDLInt, 16)
#define KILN_INT32 KILN_DTYPE(kDLInt, 32)
#define KILN_INT64 KILN_DTYPE(kDLInt, 64)
#define KILN_UINT8 KILN_DTYPE(kDLUInt, 8)
#define KILN_UINT16 KILN_DTYPE(kDLUInt, 16)
#define KILN_UINT32 KILN_DTYPE(kDLUInt, 32)
#define KILN_UINT64 KILN_DTYPE(kDLUInt, 64)
#define KILN_FLOAT16 KILN_DTYPE(kDLFloat, 16)
#define KILN_BFLOAT16 KILN_DTYPE(kDLBfloat, 16)
#define KILN_FLOAT32 KILN_DTYPE(kDLFloat, 32)
#define KILN_FLOAT64 KILN_DTYPE(kDLFloat, 64)

/* A compact CPU tensor over `data` (not copied; `shape` must outlive the tensor). */
KILN_INLINE DLTensor kiln_tensor(void *data, int32_t ndim, int64_t *shape,
                                   DLDataType dtype) {
  DLTensor t;
  t.data = data;
  t.device.device_type = kDLCPU;
  t.device.device_id = 0;
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = shape;
  t.strides = NULL;
  t.byte_offset = 0;
  return t;
}

/* Set packed argument `i` to a tensor, an integer or a float. */
KILN_INLINE void kiln_set_tensor(KilnValue *args, int32_t *codes, int32_t i, DLTensor *t) {
  args[i].v_handle = (void *)t;
  codes[i] = KILN_ARG_DLTENSOR;
}

KILN_INLINE void kiln_set_int(KilnValue *args, int32_t *codes, int32_t i, int64_t v) {
  args[i].v_int64 = v;
  codes[i] = KILN_ARG_INT;
}

KILN_INLINE void kiln_set_float(KilnValue *args, int32_t *codes, int32_t i, double v) {
  args[i].v_float64 = v;
  codes[i] = KILN_ARG_FLOAT;
}

/*
 * Set packed argument `i` (one after a graph function's own arguments) to the call's
 * terminate flag: an int32_t the caller owns and may set to non-zero from another
 * thread while the call runs; the call then stops at its next kernel call or loop
 * back-edge and returns non-zero ("terminated: ..." in `{prefix}_last_error()`).
 * Pass `num_args` + 1. Only entries whose metadata says "terminate": true take it
 * (docs/abi.md, "Stopping a call").
 */
KILN_INLINE void kiln_set_terminate_flag(KilnValue *args, int32_t *codes, int32_t i,
                                         volatile int32_t *flag) {
  args[i].v_handle = (void *)flag;
  codes[i] = KILN_ARG_HANDLE;
}

/* Number of elements of a tensor (1 for a 0-d tensor). */
KILN_INLINE int64_t kiln_numel(const DLTensor *t) {
  int64_t n = 1;
  int32_t i;
  for (i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

/*
 * Call a packed entry whose arguments are all tensors:
 *     DLTensor *ts[] = {&x, &y};
 *     rc = kiln_call_tensors(kiln_main, ts, 2);
 * At most KILN_MAX_TENSOR_ARGS tensors; more returns -1 without calling.
 */
#ifndef KILN_MAX_TENSOR_ARGS
#define KILN_MAX_TENSOR_ARGS 64
#endif
KILN_INLINE int32_t kiln_call_tensors(KilnPackedFunc fn, DLTensor *const *tensors,
                                        int32_t n) {
  KilnValue args[KILN_MAX_TENSOR_ARGS];
  int32_t codes[KILN_MAX_TENSOR_ARGS];
  int32_t i;
  if (n < 0 || n > KILN_MAX_TENSOR_ARGS) return -1;
  for (i = 0; i < n; ++i) kiln_set_tensor(args, codes, i, tensors[i]);
  return fn(args, codes, n);
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_KILN_H_ */

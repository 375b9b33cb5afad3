/*
 * swap_weights.c -- new weights into a kiln library from plain C, then run its `main`
 * (no Python, no kiln runtime; docs/abi.md "Swapping weights").
 *
 *     cc -I<kiln include dir> swap_weights.c -ldl -o swap_weights
 *     ./swap_weights model.so kiln_ weights.bin input.bin 1,3,32,32 output.bin 1,10
 *
 * `weights.bin` holds the new raw weights one after the other, each compact in its own
 * dtype, in the order `{prefix}_swap_weight` lists them (the program prints that list
 * with `-` for the weights file). The library rebuilds its constants from them (the
 * transposes, panel packing and folded batch norms the compile applied) and installs
 * them; the weights are checked (`{prefix}_check_weights`: the swap keeps its table
 * true, docs/runtime.md "Swapping weights"), then a float32 input runs through `main`
 * as in deploy.c.
 */
#include <kiln/kiln.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_DIMS 8

static int parse_shape(const char *text, int64_t *shape, int32_t *ndim) {
  char *end;
  *ndim = 0;
  while (*text) {
    if (*ndim == MAX_DIMS) return -1;
    shape[(*ndim)++] = strtoll(text, &end, 10);
    if (end == text) return -1;
    text = (*end == ',') ? end + 1 : end;
  }
  return 0;
}

static void *symbol(void *lib, const char *prefix, const char *name) {
  char full[256];
  snprintf(full, sizeof full, "%s%s", prefix, name);
  return dlsym(lib, full);
}

/* Read the raw weights of `weights` into tensors (shapes point into the library). */
static DLTensor *read_raw(KilnSwapWeightFunc describe, FILE *weights, int32_t n) {
  DLTensor *raw = calloc((size_t)n + 1, sizeof *raw);
  int32_t i;
  for (i = 0; raw && i < n; ++i) {
    const char *name;
    const int64_t *shape;
    DLDataType dtype;
    int32_t ndim;
    size_t bytes;
    describe(i, &name, &dtype, &ndim, &shape);
    raw[i] = kiln_tensor(NULL, ndim, (int64_t *)shape, dtype);
    bytes = (size_t)kiln_numel(&raw[i]) * dtype.bits / 8;
    raw[i].data = malloc(bytes ? bytes : 1);
    if (!weights) {
      printf("%s %u/%u %lld\n", name, dtype.code, dtype.bits, (long long)bytes);
    } else if (!raw[i].data || fread(raw[i].data, 1, bytes, weights) != bytes) {
      fprintf(stderr, "cannot read weight %d '%s' (%lld bytes)\n", i, name, (long long)bytes);
      exit(2);
    }
  }
  return raw;
}

int main(int argc, char **argv) {
  int64_t in_shape[MAX_DIMS], out_shape[MAX_DIMS];
  int32_t in_ndim, out_ndim, n, rc, i;
  void *lib;
  KilnPackedFunc entry;
  KilnStringFunc last_error;
  KilnSwapWeightsFunc swap;
  KilnSwapWeightFunc describe;
  int64_t (*check)(int64_t first, int64_t count);
  int64_t (*chunks)(void);
  FILE *weights = NULL;
  DLTensor *raw;
  if (argc != 8 || parse_shape(argv[5], in_shape, &in_ndim) ||
      parse_shape(argv[7], out_shape, &out_ndim)) {
    fprintf(stderr, "usage: %s LIB.so PREFIX WEIGHTS.bin IN.bin D0,... OUT.bin D0,...\n",
            argv[0]);
    return 2;
  }
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  *(void **)&entry = symbol(lib, argv[2], "main");
  *(void **)&last_error = symbol(lib, argv[2], "_last_error");
  *(void **)&swap = symbol(lib, argv[2], "_swap_weights");
  *(void **)&describe = symbol(lib, argv[2], "_swap_weight");
  *(void **)&check = symbol(lib, argv[2], "_check_weights");
  *(void **)&chunks = symbol(lib, argv[2], "_weights_chunks");
  if (!entry || !last_error || !swap || !describe) {
    fprintf(stderr, "%s: no %smain or no %s_swap_weights\n", argv[1], argv[2], argv[2]);
    return 1;
  }
  n = describe(-1, NULL, NULL, NULL, NULL);
  if (n < 0) {
    fprintf(stderr, "%s: the library cannot swap its weights in C\n", argv[1]);
    return 1;
  }
  if (argv[3][0] != '-' && !(weights = fopen(argv[3], "rb"))) {
    fprintf(stderr, "cannot open %s\n", argv[3]);
    return 2;
  }
  raw = read_raw(describe, weights, n);
  if (!weights) return 0; /* the list of raw weights only */
  fclose(weights);
  rc = swap(raw, n);
  if (rc != KILN_SWAP_OK) {
    fprintf(stderr, "swap_weights failed (%d): %s\n", (int)rc, last_error());
    return 3;
  }
  for (i = 0; i < n; ++i) free(raw[i].data);
  free(raw);
  if (check && chunks && check(0, chunks()) != -1) {
    fprintf(stderr, "%s: weights damaged after the swap\n", argv[1]);
    return 4;
  }
  {
    DLTensor x = kiln_tensor(NULL, in_ndim, in_shape, KILN_FLOAT32);
    DLTensor y = kiln_tensor(NULL, out_ndim, out_shape, KILN_FLOAT32);
    DLTensor *args[2];
    FILE *f = fopen(argv[4], "rb");
    x.data = malloc((size_t)kiln_numel(&x) * sizeof(float));
    y.data = malloc((size_t)kiln_numel(&y) * sizeof(float));
    if (!f || fread(x.data, sizeof(float), (size_t)kiln_numel(&x), f) !=
                  (size_t)kiln_numel(&x)) {
      fprintf(stderr, "cannot read %s\n", argv[4]);
      return 2;
    }
    fclose(f);
    args[0] = &x;
    args[1] = &y;
    if (kiln_call_tensors(entry, args, 2) != 0) {
      fprintf(stderr, "main failed: %s\n", last_error());
      return 1;
    }
    f = fopen(argv[6], "wb");
    if (!f || fwrite(y.data, sizeof(float), (size_t)kiln_numel(&y), f) !=
                  (size_t)kiln_numel(&y)) {
      fprintf(stderr, "cannot write %s\n", argv[6]);
      return 1;
    }
    fclose(f);
    free(x.data);
    free(y.data);
  }
  return 0;
}

/*
 * nonzero.c -- call a kiln library whose result has a data-dependent size (NonZero)
 * from plain C.
 *
 *     cc -I<kiln include dir> nonzero.c -ldl -o nonzero
 *     ./nonzero model.so kiln_ main out.bin:2,12 x.bin:float32:3,4
 *
 * Arguments: the library, its system_lib_prefix, the graph function, the file to write
 * the (single, int64) result to with the shape of the buffer to pass (the result's
 * upper bound: the metadata's "shape" of the result), then the float32 input as
 * file:float32:shape. The entry checks the buffer against the bound, runs, and writes
 * the result's actual extents into the buffer's DLTensor shape (docs/abi.md,
 * "Data-dependent output sizes"): this program prints that shape and writes the
 * actual elements. On an error it prints the library's message and exits 2.
 */
#include <kiln/kiln.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(int argc, char **argv) {
  int64_t in_shape[MAX_DIMS], out_shape[MAX_DIMS], numel = 1, bound = 1, i;
  int32_t in_ndim, out_ndim, d;
  char out_path[1024], in_path[1024], name[256], *colon;
  DLTensor tensors[2];
  DLTensor *ptrs[2];
  KilnPackedFunc fn;
  KilnStringFunc last_error;
  void *lib;
  float *x;
  int64_t *y;
  FILE *f;
  if (argc != 6) {
    fprintf(stderr, "usage: %s LIB PREFIX FN OUT:SHAPE IN:float32:SHAPE\n", argv[0]);
    return 1;
  }
  snprintf(out_path, sizeof out_path, "%s", argv[4]);
  colon = strrchr(out_path, ':');
  if (!colon || parse_shape(colon + 1, out_shape, &out_ndim) != 0) return 1;
  *colon = '\0';
  snprintf(in_path, sizeof in_path, "%s", argv[5]);
  colon = strrchr(in_path, ':');
  if (!colon || parse_shape(colon + 1, in_shape, &in_ndim) != 0) return 1;
  *colon = '\0';
  colon = strrchr(in_path, ':');
  if (!colon || strcmp(colon + 1, "float32") != 0) return 1;
  *colon = '\0';

  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  snprintf(name, sizeof name, "%s%s", argv[2], argv[3]);
  fn = (KilnPackedFunc)dlsym(lib, name);
  snprintf(name, sizeof name, "%s_last_error", argv[2]);
  last_error = (KilnStringFunc)dlsym(lib, name);
  if (!fn || !last_error) {
    fprintf(stderr, "missing symbols\n");
    return 1;
  }

  for (d = 0; d < in_ndim; ++d) numel *= in_shape[d];
  for (d = 0; d < out_ndim; ++d) bound *= out_shape[d];
  x = (float *)malloc((size_t)(numel ? numel : 1) * sizeof *x);
  y = (int64_t *)malloc((size_t)(bound ? bound : 1) * sizeof *y);
  f = fopen(in_path, "rb");
  if (!x || !y || !f || fread(x, sizeof *x, (size_t)numel, f) != (size_t)numel) {
    fprintf(stderr, "cannot read %s\n", in_path);
    return 1;
  }
  fclose(f);

  /* The result buffer has the bound's shape; after the call, out_shape holds the
     actual extents (the entry writes them into the DLTensor's shape array). */
  tensors[0] = kiln_tensor(x, in_ndim, in_shape, KILN_FLOAT32);
  tensors[1] = kiln_tensor(y, out_ndim, out_shape, KILN_INT64);
  ptrs[0] = &tensors[0];
  ptrs[1] = &tensors[1];
  if (kiln_call_tensors(fn, ptrs, 2) != 0) {
    fprintf(stderr, "%s\n", last_error());
    return 2;
  }

  numel = 1;
  printf("shape");
  for (d = 0; d < out_ndim; ++d) {
    printf(" %lld", (long long)out_shape[d]);
    numel *= out_shape[d];
  }
  printf("\n");
  f = fopen(out_path, "wb");
  if (!f) return 1;
  for (i = 0; i < numel; ++i) fwrite(&y[i], sizeof *y, 1, f);
  fclose(f);
  free(x);
  free(y);
  dlclose(lib);
  return 0;
}

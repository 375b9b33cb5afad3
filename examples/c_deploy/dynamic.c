/*
 * dynamic.c -- call a kiln library with symbolic dimensions from plain C, at any size.
 *
 *     cc -I<kiln include dir> dynamic.c -ldl -o dynamic
 *     ./dynamic model.so kiln_ main out.bin:3 feats.bin:float32:2,7,64 mask.bin:int64:2,7
 *
 * Arguments: the library, its system_lib_prefix, the graph function, then the file to
 * write the (single) result to with either its rank (`out.bin:3`: the sizes come from
 * `{prefix}_output_shapes_{fn}`) or its whole shape (`out.bin:2,7,64`: the entry
 * itself checks it), then each input as file:dtype:shape (dtype float32 or int64).
 * Prints the result's shape; on an error prints the library's message and exits 2.
 */
#include <kiln/kiln.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIMS 8
#define MAX_ARGS 16

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

static void *read_file(const char *path, size_t bytes) {
  FILE *f = fopen(path, "rb");
  void *data = malloc(bytes ? bytes : 1);
  if (!f || !data || (bytes && fread(data, 1, bytes, f) != bytes)) {
    fprintf(stderr, "cannot read %zu bytes from %s\n", bytes, path);
    exit(1);
  }
  fclose(f);
  return data;
}

static void *symbol(void *lib, const char *prefix, const char *name) {
  char text[256];
  void *sym;
  snprintf(text, sizeof text, "%s%s", prefix, name);
  sym = dlsym(lib, text);
  if (!sym) {
    fprintf(stderr, "no symbol %s\n", text);
    exit(1);
  }
  return sym;
}

int main(int argc, char **argv) {
  int64_t shapes[MAX_ARGS][MAX_DIMS], out_shape[MAX_DIMS];
  int32_t ndims[MAX_ARGS], out_ndim, n_in = argc - 5, i, j;
  DLTensor tensors[MAX_ARGS];
  KilnValue args[MAX_ARGS];
  int32_t codes[MAX_ARGS];
  char out_path[1024], name[256], *colon;
  KilnPackedFunc fn;
  KilnStringFunc last_error;
  void *lib, *out_data;
  int64_t numel = 1;
  FILE *f;
  if (argc < 5 || n_in > MAX_ARGS - 1) {
    fprintf(stderr, "usage: %s LIB PREFIX FN OUT:RANK|OUT:SHAPE IN:DTYPE:SHAPE...\n", argv[0]);
    return 1;
  }
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  fn = (KilnPackedFunc)symbol(lib, argv[2], argv[3]);
  last_error = (KilnStringFunc)symbol(lib, argv[2], "_last_error");
  for (i = 0; i < n_in; ++i) {
    char spec[1024], *dtype, *shape;
    int is_int;
    int64_t count = 1;
    snprintf(spec, sizeof spec, "%s", argv[5 + i]);
    dtype = strchr(spec, ':');
    shape = dtype ? strchr(dtype + 1, ':') : NULL;
    if (!shape) return 1;
    *dtype++ = '\0';
    *shape++ = '\0';
    if (parse_shape(shape, shapes[i], &ndims[i]) != 0) return 1;
    for (j = 0; j < ndims[i]; ++j) count *= shapes[i][j];
    is_int = strcmp(dtype, "int64") == 0;
    tensors[i] = kiln_tensor(read_file(spec, (size_t)count * (is_int ? 8 : 4)), ndims[i],
                             shapes[i], is_int ? KILN_INT64 : KILN_FLOAT32);
    kiln_set_tensor(args, codes, i, &tensors[i]);
  }
  snprintf(out_path, sizeof out_path, "%s", argv[4]);
  colon = strrchr(out_path, ':');
  if (!colon) return 1;
  *colon++ = '\0';
  if (strchr(colon, ',') == NULL) {
    /* Only the rank: learn the sizes from the library before allocating. */
    KilnOutputShapesFunc output_shapes;
    snprintf(name, sizeof name, "_output_shapes_%s", argv[3]);
    output_shapes = (KilnOutputShapesFunc)symbol(lib, argv[2], name);
    out_ndim = (int32_t)atoi(colon);
    if (output_shapes(args, codes, n_in, out_shape) != 0) {
      fprintf(stderr, "%s\n", last_error());
      return 2;
    }
  } else if (parse_shape(colon, out_shape, &out_ndim) != 0) {
    return 1;
  }
  for (j = 0; j < out_ndim; ++j) numel *= out_shape[j];
  out_data = malloc(numel ? (size_t)numel * sizeof(float) : 1);
  tensors[n_in] = kiln_tensor(out_data, out_ndim, out_shape, KILN_FLOAT32);
  kiln_set_tensor(args, codes, n_in, &tensors[n_in]);
  if (fn(args, codes, n_in + 1) != 0) {
    fprintf(stderr, "%s\n", last_error());
    return 2;
  }
  f = fopen(out_path, "wb");
  if (!f || fwrite(out_data, sizeof(float), (size_t)numel, f) != (size_t)numel) return 1;
  fclose(f);
  for (j = 0; j < out_ndim; ++j) printf("%s%lld", j ? "," : "shape ", (long long)out_shape[j]);
  printf("\n");
  return 0;
}

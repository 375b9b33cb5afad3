/*
 * deploy.c -- run a kiln library's `main` from plain C (no Python, no kiln runtime).
 *
 * Shared library (dlopen):
 *     cc -I<kiln include dir> deploy.c -ldl -o deploy
 *     ./deploy model.so kiln_ input.bin 1,3,32,32 output.bin 1,10
 * Static library (link the .a and call the entry directly):
 *     cc -I<kiln include dir> -DKILN_STATIC_ENTRY=kiln_main \
 *        -DKILN_STATIC_ERROR=kiln__last_error deploy.c model.a -lm -lpthread -o deploy
 *     ./deploy - - input.bin 1,3,32,32 output.bin 1,10
 *
 * Arguments: library, system_lib_prefix, a float32 input file and its shape, the file
 * to write the float32 output to and its shape. One input and one output; the
 * library checks the shapes against its own signature and says what is wrong.
 *
 * A library exported with weights="external" exports `{prefix}_map_weights`: the
 * program maps $KILN_WEIGHTS, else `<library>.weights`, before the first call
 * (docs/runtime.md "External weights"). It then checks the weights, embedded or
 * mapped, with `{prefix}_check_weights` (docs/runtime.md "Checking the weights":
 * a hash at memory bandwidth, about 0.1 s per GiB) and refuses damaged ones.
 */
#include <kiln/kiln.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef KILN_STATIC_ENTRY
int32_t KILN_STATIC_ENTRY(const KilnValue *, const int32_t *, int32_t);
const char *KILN_STATIC_ERROR(void);
#else
#include <dlfcn.h>
#endif

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

static float *read_floats(const char *path, int64_t count) {
  FILE *f = fopen(path, "rb");
  float *data = malloc((size_t)count * sizeof(float));
  if (!f || !data || fread(data, sizeof(float), (size_t)count, f) != (size_t)count) {
    fprintf(stderr, "cannot read %lld floats from %s\n", (long long)count, path);
    exit(2);
  }
  fclose(f);
  return data;
}

#ifndef KILN_STATIC_ENTRY
/* Map the weights file of an external-weights library (nothing to do otherwise). */
static int map_weights(void *lib, const char *path, const char *prefix) {
  int32_t (*map)(const char *);
  char name[256], file[4096];
  const char *weights = getenv("KILN_WEIGHTS");
  int32_t rc;
  snprintf(name, sizeof name, "%s_map_weights", prefix);
  *(void **)&map = dlsym(lib, name);
  if (!map) return 0; /* the weights are embedded in the library */
  if (!weights) {
    snprintf(file, sizeof file, "%s.weights", path);
    weights = file;
  }
  rc = map(weights);
  if (rc != 0) fprintf(stderr, "%s: cannot map the weights file %s (%d)\n", path, weights, rc);
  return rc;
}

/* Check the weights against the library's table of chunk hashes (kiln_check.c). */
static int check_weights(void *lib, const char *path, const char *prefix) {
  int64_t (*check)(int64_t, int64_t);
  int64_t (*chunks)(void);
  int64_t bad;
  char name[256];
  snprintf(name, sizeof name, "%s_check_weights", prefix);
  *(void **)&check = dlsym(lib, name);
  snprintf(name, sizeof name, "%s_weights_chunks", prefix);
  *(void **)&chunks = dlsym(lib, name);
  if (!check || !chunks) return 0; /* no weights, or exported before the check existed */
  bad = check(0, chunks());
  if (bad == -1) return 0;
  fprintf(stderr, "%s: its weights are damaged (4 MiB chunk %lld)\n", path, (long long)bad);
  return 1;
}
#endif

int main(int argc, char **argv) {
  int64_t in_shape[MAX_DIMS], out_shape[MAX_DIMS];
  int32_t in_ndim, out_ndim;
  KilnPackedFunc entry;
  KilnStringFunc last_error;
  if (argc != 7 || parse_shape(argv[4], in_shape, &in_ndim) ||
      parse_shape(argv[6], out_shape, &out_ndim)) {
    fprintf(stderr, "usage: %s LIB.so PREFIX IN.bin D0,D1,... OUT.bin D0,D1,...\n", argv[0]);
    return 2;
  }
#ifdef KILN_STATIC_ENTRY
  entry = KILN_STATIC_ENTRY;
  last_error = KILN_STATIC_ERROR;
#else
  {
    char name[256];
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      fprintf(stderr, "dlopen: %s\n", dlerror());
      return 1;
    }
    snprintf(name, sizeof name, "%smain", argv[2]);
    *(void **)&entry = dlsym(lib, name);
    snprintf(name, sizeof name, "%s_last_error", argv[2]);
    *(void **)&last_error = dlsym(lib, name);
    if (!entry || !last_error) {
      fprintf(stderr, "%s: no entry %smain\n", argv[1], argv[2]);
      return 1;
    }
    if (map_weights(lib, argv[1], argv[2]) != 0) return 1;
    if (check_weights(lib, argv[1], argv[2]) != 0) return 1;
  }
#endif
  {
    DLTensor x = kiln_tensor(NULL, in_ndim, in_shape, KILN_FLOAT32);
    DLTensor y = kiln_tensor(NULL, out_ndim, out_shape, KILN_FLOAT32);
    KilnValue args[2];
    int32_t codes[2];
    FILE *out;
    x.data = read_floats(argv[3], kiln_numel(&x));
    y.data = malloc((size_t)kiln_numel(&y) * sizeof(float));
    kiln_set_tensor(args, codes, 0, &x);
    kiln_set_tensor(args, codes, 1, &y);
    if (entry(args, codes, 2) != 0) {
      fprintf(stderr, "main failed: %s\n", last_error());
      return 1;
    }
    out = fopen(argv[5], "wb");
    if (!out || fwrite(y.data, sizeof(float), (size_t)kiln_numel(&y), out) !=
                    (size_t)kiln_numel(&y)) {
      fprintf(stderr, "cannot write %s\n", argv[5]);
      return 1;
    }
    fclose(out);
    free(x.data);
    free(y.data);
  }
  return 0;
}

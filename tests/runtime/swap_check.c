/*
 * The weights check after a swap, from plain C (docs/runtime.md, "Swapping weights"):
 * a host that swaps, then checks its weights, is not refused; a byte damaged after the
 * swap still is. test_swap_weights.py builds this program (cc -Werror) and reads what
 * it prints:
 *
 *     swap_check LIB.so PREFIX RAW.bin DELTA [WEIGHTS]
 *
 *   before <check>     {prefix}_check_weights(0, all) on the loaded weights (-1: intact)
 *   swap <status>      {prefix}_swap_weights of RAW.bin (its raw weights one after the
 *                      other, in {prefix}_swap_weight's order)
 *   after <check>      the check again
 *   damaged <check>    the check after the byte DELTA bytes past {prefix}_blob (one of
 *                      the constants') is flipped: the index of its chunk
 *
 * WEIGHTS, when given, is the external weights file to map first ({prefix}_map_weights).
 */
#define _DEFAULT_SOURCE /* mprotect, sysconf */
#include <kiln/kiln.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int64_t (*CheckFunc)(int64_t first, int64_t count);
typedef int64_t (*ChunksFunc)(void);
typedef int32_t (*MapFunc)(const char *path);

static void *symbol(void *lib, const char *prefix, const char *name) {
  char full[256];
  snprintf(full, sizeof full, "%s%s", prefix, name);
  return dlsym(lib, full);
}

/* The raw weights of `path`, read whole, as {prefix}_swap_weight describes them. */
static DLTensor *read_raw(KilnSwapWeightFunc describe, const char *path, int32_t n) {
  static uint8_t bytes[1 << 20]; /* the test's model is small */
  FILE *f = fopen(path, "rb");
  size_t size = f ? fread(bytes, 1, sizeof bytes, f) : 0, at = 0;
  DLTensor *raw = calloc((size_t)n + 1, sizeof *raw);
  int32_t i;
  for (i = 0; raw && i < n; ++i) {
    const int64_t *shape;
    DLDataType dtype;
    int32_t ndim;
    describe(i, NULL, &dtype, &ndim, &shape);
    raw[i] = kiln_tensor(bytes + at, ndim, (int64_t *)shape, dtype);
    at += (size_t)kiln_numel(&raw[i]) * dtype.bits / 8;
  }
  if (!f || !raw || at != size) {
    fprintf(stderr, "%s: not the raw weights the library takes\n", path);
    exit(2);
  }
  fclose(f);
  return raw;
}

int main(int argc, char **argv) {
  void *lib;
  CheckFunc check;
  ChunksFunc chunks;
  MapFunc map;
  KilnSwapWeightsFunc swap;
  KilnSwapWeightFunc describe;
  KilnStringFunc last_error;
  uint8_t *byte;
  uintptr_t page;
  int32_t n, rc;
  if (argc != 5 && argc != 6) {
    fprintf(stderr, "usage: %s LIB.so PREFIX RAW.bin DELTA [WEIGHTS]\n", argv[0]);
    return 2;
  }
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  *(void **)&check = symbol(lib, argv[2], "_check_weights");
  *(void **)&chunks = symbol(lib, argv[2], "_weights_chunks");
  *(void **)&map = symbol(lib, argv[2], "_map_weights");
  *(void **)&swap = symbol(lib, argv[2], "_swap_weights");
  *(void **)&describe = symbol(lib, argv[2], "_swap_weight");
  *(void **)&last_error = symbol(lib, argv[2], "_last_error");
  byte = symbol(lib, argv[2], "_blob");
  if (!check || !chunks || !swap || !describe || !last_error || !byte) {
    fprintf(stderr, "%s: an entry is missing\n", argv[1]);
    return 1;
  }
  if (argc == 6 && (!map || map(argv[5]) != 0)) {
    fprintf(stderr, "cannot map %s\n", argv[5]);
    return 1;
  }
  printf("before %lld\n", (long long)check(0, chunks()));
  n = describe(-1, NULL, NULL, NULL, NULL);
  rc = n < 0 ? -100 : swap(read_raw(describe, argv[3], n), n);
  printf("swap %d %s\n", (int)rc, rc ? last_error() : "");
  printf("after %lld\n", (long long)check(0, chunks()));
  byte += strtoll(argv[4], NULL, 10);
  page = (uintptr_t)byte / (uintptr_t)sysconf(_SC_PAGESIZE) * (uintptr_t)sysconf(_SC_PAGESIZE);
  if (mprotect((void *)page, (size_t)sysconf(_SC_PAGESIZE), PROT_READ | PROT_WRITE) != 0) {
    perror("mprotect");
    return 1;
  }
  *byte ^= 0x40;
  printf("damaged %lld\n", (long long)check(0, chunks()));
  return 0;
}

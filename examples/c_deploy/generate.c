/*
 * generate.c -- greedy generation with a kiln decoder library from plain C.
 *
 *     cc -I<kiln include dir> generate.c -ldl -o generate
 *     ./generate decoder.so kiln_ main 16 4:2:16 464 3290 318
 *
 * Arguments: the library, its system_lib_prefix, the graph function, how many tokens to
 * generate, the cache as PASTS:HEADS:HEAD_DIM, then the prompt's token ids (one row).
 * The function is a decoder exported with its cache (docs/llm.md): inputs `input_ids`
 * int64 [batch, seq], then PASTS float32 tensors [batch, HEADS, past, HEAD_DIM]; results
 * the logits float32 [batch, seq, vocab], then the PASTS presents [batch, HEADS,
 * past + seq, HEAD_DIM]. The loop is kiln.generate's, greedy: the prompt from an empty
 * cache, then one token a step, each step's presents passed back as the pasts, the
 * result shapes learned from `{prefix}_output_shapes_{fn}` before each call.
 * Prints the generated ids on one line; on an error prints the library's message and
 * exits 2.
 */
#include <kiln/kiln.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PASTS 64
#define MAX_PROMPT 4096

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

static void *allocate(int64_t count, size_t item) {
  void *data = malloc(count > 0 ? (size_t)count * item : 1);
  if (!data) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  return data;
}

static int64_t numel(const int64_t *shape, int32_t ndim) {
  int64_t n = 1;
  int32_t i;
  for (i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

/* The index of the largest of `n` floats (the first one on a tie, as numpy.argmax). */
static int64_t argmax(const float *row, int64_t n) {
  int64_t best = 0, i;
  for (i = 1; i < n; ++i)
    if (row[i] > row[best]) best = i;
  return best;
}

int main(int argc, char **argv) {
  /* Tensors: 0 the ids, 1..P the pasts, P+1 the logits, P+2..2P+1 the presents. */
  static int64_t shapes[2 * MAX_PASTS + 2][4];
  static DLTensor tensors[2 * MAX_PASTS + 2];
  static KilnValue args[2 * MAX_PASTS + 2];
  static int32_t codes[2 * MAX_PASTS + 2];
  static int64_t ids[MAX_PROMPT];
  static float *pasts[MAX_PASTS];
  int32_t n_past, heads, head_dim, n_in, i, step, steps;
  int64_t seq, past = 0;
  KilnPackedFunc fn;
  KilnOutputShapesFunc output_shapes;
  KilnStringFunc last_error;
  char name[256];
  void *lib;
  if (argc < 7 || sscanf(argv[5], "%d:%d:%d", &n_past, &heads, &head_dim) != 3 ||
      n_past < 1 || n_past > MAX_PASTS || argc - 6 > MAX_PROMPT) {
    fprintf(stderr, "usage: %s LIB PREFIX FN STEPS PASTS:HEADS:HEAD_DIM ID...\n", argv[0]);
    return 1;
  }
  steps = atoi(argv[4]);
  seq = argc - 6;
  for (i = 0; i < seq; ++i) ids[i] = strtoll(argv[6 + i], NULL, 10);
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  fn = (KilnPackedFunc)symbol(lib, argv[2], argv[3]);
  snprintf(name, sizeof name, "_output_shapes_%s", argv[3]);
  output_shapes = (KilnOutputShapesFunc)symbol(lib, argv[2], name);
  last_error = (KilnStringFunc)symbol(lib, argv[2], "_last_error");
  n_in = 1 + n_past;
  for (i = 0; i < n_past; ++i) pasts[i] = allocate(0, sizeof(float));  /* an empty cache */
  for (step = 0; step < steps; ++step) {
    int64_t flat[(2 * MAX_PASTS + 2) * 4], offset = 0, token;
    shapes[0][0] = 1;
    shapes[0][1] = seq;
    tensors[0] = kiln_tensor(ids, 2, shapes[0], KILN_INT64);
    kiln_set_tensor(args, codes, 0, &tensors[0]);
    for (i = 0; i < n_past; ++i) {
      int64_t *s = shapes[1 + i];
      s[0] = 1, s[1] = heads, s[2] = past, s[3] = head_dim;
      tensors[1 + i] = kiln_tensor(pasts[i], 4, s, KILN_FLOAT32);
      kiln_set_tensor(args, codes, 1 + i, &tensors[1 + i]);
    }
    /* The results' shapes (logits rank 3, presents rank 4), one after the other. */
    if (output_shapes(args, codes, n_in, flat) != 0) {
      fprintf(stderr, "%s\n", last_error());
      return 2;
    }
    for (i = 0; i <= n_past; ++i) {
      int32_t rank = i == 0 ? 3 : 4;
      int64_t *s = shapes[n_in + i];
      memcpy(s, flat + offset, (size_t)rank * sizeof(int64_t));
      offset += rank;
      tensors[n_in + i] = kiln_tensor(allocate(numel(s, rank), sizeof(float)), rank, s,
                                      KILN_FLOAT32);
      kiln_set_tensor(args, codes, n_in + i, &tensors[n_in + i]);
    }
    if (fn(args, codes, n_in + 1 + n_past) != 0) {
      fprintf(stderr, "%s\n", last_error());
      return 2;
    }
    {
      const int64_t *ls = shapes[n_in];  /* [1, seq, vocab]: the last position's row */
      token = argmax((const float *)tensors[n_in].data + (ls[1] - 1) * ls[2], ls[2]);
    }
    printf("%s%lld", step ? " " : "", (long long)token);
    free(tensors[n_in].data);
    for (i = 0; i < n_past; ++i) {
      free(pasts[i]);
      pasts[i] = tensors[n_in + 1 + i].data;  /* the presents become the pasts */
    }
    past += seq;
    ids[0] = token;
    seq = 1;
  }
  printf("\n");
  for (i = 0; i < n_past; ++i) free(pasts[i]);
  return 0;
}

/*
 * generate_entry.c -- greedy generation from plain C through the library's own loop.
 *
 *     cc -I<kiln include dir> generate_entry.c -ldl -o generate_entry
 *     ./generate_entry decoder.so kiln_ main 16 2 -1 0 464 3290 318 50256 40 1101
 *
 * Arguments: the library, its system_lib_prefix, the decoder function, how many tokens to
 * generate, the batch, a stop token (-1: none), the pad token, then the prompt's ids,
 * row after row (batch x prompt length). A decoder exported with its cache gets the entry
 * `{prefix}_generate_{fn}` (docs/abi.md, "Generation"): the loop of kiln.generate, greedy,
 * with the cache kept inside the library's call. Each step's tokens stream to stderr as
 * they are chosen (`step S: ID...`, one per row), through the entry's token callback;
 * with STOP_AFTER=N in the environment the callback ends the loop after N steps. Prints
 * each row's new ids on a line; on an error prints the library's message and exits 2.
 * (examples/c_deploy/generate.c runs the same loop by hand over the function's own entry.)
 */
#include <kiln/kiln.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

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

/* The token callback: prints step `step`'s tokens; non-zero (stop) after `*user` steps. */
static int32_t on_token(const int64_t *tokens, int64_t batch, int64_t step, void *user) {
  int64_t r, stop_after = *(const int64_t *)user;
  fprintf(stderr, "step %lld:", (long long)step);
  for (r = 0; r < batch; ++r) fprintf(stderr, " %lld", (long long)tokens[r]);
  fprintf(stderr, "\n");
  return stop_after > 0 && step + 1 >= stop_after;
}

int main(int argc, char **argv) {
  int64_t batch, n_ids, steps, stop, pad, done, stop_after, i, j, *prompt, *out;
  KilnGenerateFunc generate;
  KilnStringFunc last_error;
  char name[256];
  void *lib;
  if (argc < 9) {
    fprintf(stderr, "usage: %s LIB PREFIX FN STEPS BATCH STOP PAD ID...\n", argv[0]);
    return 1;
  }
  steps = strtoll(argv[4], NULL, 10);
  batch = strtoll(argv[5], NULL, 10);
  stop = strtoll(argv[6], NULL, 10);
  pad = strtoll(argv[7], NULL, 10);
  n_ids = argc - 8;
  stop_after = getenv("STOP_AFTER") ? strtoll(getenv("STOP_AFTER"), NULL, 10) : 0;
  if (steps < 0 || batch < 1 || n_ids % batch != 0) {
    fprintf(stderr, "%lld ids do not make %lld rows\n", (long long)n_ids, (long long)batch);
    return 1;
  }
  prompt = malloc((size_t)n_ids * sizeof *prompt);
  out = malloc((size_t)(batch * steps + 1) * sizeof *out);
  if (!prompt || !out) {
    fprintf(stderr, "out of memory\n");
    return 1;
  }
  for (i = 0; i < n_ids; ++i) prompt[i] = strtoll(argv[8 + i], NULL, 10);
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  snprintf(name, sizeof name, "_generate_%s", argv[3]);
  generate = (KilnGenerateFunc)symbol(lib, argv[2], name);
  last_error = (KilnStringFunc)symbol(lib, argv[2], "_last_error");
  if (generate(prompt, batch, n_ids / batch, steps, &stop, stop >= 0 ? 1 : 0, pad, out,
               &done, on_token, &stop_after) != 0) {
    fprintf(stderr, "%s\n", last_error());
    return 2;
  }
  for (i = 0; i < batch; ++i) {
    for (j = 0; j < done; ++j) printf("%s%lld", j ? " " : "", (long long)out[i * steps + j]);
    printf("\n");
  }
  free(prompt);
  free(out);
  return 0;
}

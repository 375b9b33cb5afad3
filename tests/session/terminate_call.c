/*
 * A call of a kiln library stopped from a second thread through its terminate flag
 * (docs/abi.md, "Stopping a call"). The library's main(M, x) -> y is a Loop adding 1
 * to x M times (tests/golden/make_library_golden.py's model); test_terminate.py builds
 * this program, runs it on the library and reads what it prints:
 *
 *   stopped rc=<status> error=<last error>    M = 2^62, the flag set after 0.2 s
 *   after rc=<status> y=<y>                   the flag cleared, M = 3
 *   plain rc=<status> y=<y>                   no flag argument at all, M = 3
 *   wrong rc=<status> error=<last error>      the flag passed with type code 0
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include <kiln/kiln.h>

static volatile int32_t terminate_flag;

/* The second thread: sets the flag while the first runs the endless Loop. */
static void *stop_soon(void *unused) {
  struct timespec pause = {0, 200000000};
  (void)unused;
  nanosleep(&pause, NULL);
  terminate_flag = 1;
  return NULL;
}

/* main(M, x) into y, x = {0, 1, 2, 3}; `flag_code` < 0: no flag argument. */
static int32_t call(KilnPackedFunc fn, int64_t m, float *y, int32_t flag_code) {
  float x[4] = {0, 1, 2, 3};
  int64_t shape[1] = {4};
  DLTensor tm = kiln_tensor(&m, 0, shape, KILN_INT64);
  DLTensor tx = kiln_tensor(x, 1, shape, KILN_FLOAT32);
  DLTensor ty = kiln_tensor(y, 1, shape, KILN_FLOAT32);
  KilnValue args[4];
  int32_t codes[4];
  kiln_set_tensor(args, codes, 0, &tm);
  kiln_set_tensor(args, codes, 1, &tx);
  kiln_set_tensor(args, codes, 2, &ty);
  if (flag_code < 0) {
    return fn(args, codes, 3);
  }
  kiln_set_terminate_flag(args, codes, 3, &terminate_flag);
  codes[3] = flag_code;
  return fn(args, codes, 4);
}

int main(int argc, char **argv) {
  void *lib;
  KilnPackedFunc fn;
  KilnStringFunc last_error;
  pthread_t stopper;
  float y[4] = {0, 0, 0, 0};
  int32_t rc;
  if (argc != 2 || (lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL)) == NULL) {
    fprintf(stderr, "usage: terminate_call library.so\n");
    return 2;
  }
  fn = (KilnPackedFunc)dlsym(lib, "kiln_main");
  last_error = (KilnStringFunc)dlsym(lib, "kiln__last_error");
  if (fn == NULL || last_error == NULL || pthread_create(&stopper, NULL, stop_soon, NULL) != 0) {
    fprintf(stderr, "cannot find kiln_main or start a thread\n");
    return 2;
  }
  rc = call(fn, (int64_t)1 << 62, y, KILN_ARG_HANDLE);
  pthread_join(stopper, NULL);
  printf("stopped rc=%d error=%s\n", (int)rc, last_error());
  terminate_flag = 0;
  rc = call(fn, 3, y, KILN_ARG_HANDLE);
  printf("after rc=%d y=%g %g %g %g\n", (int)rc, y[0], y[1], y[2], y[3]);
  rc = call(fn, 3, y, -1);
  printf("plain rc=%d y=%g %g %g %g\n", (int)rc, y[0], y[1], y[2], y[3]);
  rc = call(fn, 3, y, KILN_ARG_INT);
  printf("wrong rc=%d error=%s\n", (int)rc, last_error());
  return 0;
}

"""host.c: the checked packed entry points shared by the `c` and `llvm` backends.

For every PrimFunc `name` of a lowered module, host.c defines the public entry

    int32_t {prefix}{name}(const KilnValue* args, const int32_t* type_codes, int32_t num_args)

which performs every check of docs/abi.md in order, argument by argument, and
then calls the raw kernel `{prefix}_kernel_{name}` (defined by the backend in
kernels.c or kernels.o). It also defines `{prefix}_last_error` (a thread-local
message buffer) and `{prefix}_metadata` (the library metadata JSON).

Return codes of an entry: 0 success; -1 an argument was rejected; otherwise the
kernel's non-zero status (1: a heap workspace could not be allocated).

host.c includes only the C standard library: the DLPack and KilnValue
definitions it needs are copied inline (same layout as kiln/kiln.h). It needs
C11 for `_Thread_local` (GNU `__thread` is used before C11).

When some kernel has a `parallel` loop, host.c also defines the hidden
`{prefix}_parallel_for`, a small pthread pool the kernels run their outlined
loops on (kiln.transform.outline; docs/abi.md, "Parallel loops"); it then
includes the POSIX headers too, and `-DKILN_NO_THREADS` (firmware) makes it
run loops serially.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kiln.codegen.cfamily.analysis import calls, heap_allocations
from kiln.codegen.cfamily.helpers import Helpers
from kiln.codegen.cfamily.literals import INT_RANGES, MAX_STRING_LITERAL, c_string_literal
from kiln.codegen.cfamily.printer import CPrinter, NameScope
from kiln.codegen.cfamily.signature import describe_params, param_ctype, qualifiers
from kiln.codegen.naming import (
    C_TYPES,
    check_prefix,
    dl_dtype,
    entry_symbol,
    kernel_symbol,
    last_error_symbol,
    metadata_symbol,
    parallel_for_symbol,
)
from kiln.errors import CompileError
from kiln.ir import dtype as dt
from kiln.ir.module import IRModule
from kiln.ir.tensor import Buffer, PrimFunc
from kiln.transform.outline import has_parallel_loops

HOST_FILE = "host.c"
DEFAULT_HOST_CFLAGS = ("-std=c11", "-O2", "-fPIC")

# The return value of an entry whose arguments were rejected.
ARGUMENT_ERROR = -1
# Bytes of the thread-local error message buffer.
ERROR_BUFFER_SIZE = 1024

_PREAMBLE = """\
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* DLPack and KilnValue, laid out exactly as docs/abi.md and kiln/kiln.h say
   (host.c includes nothing but the C standard library). */
typedef struct {
  int32_t device_type;
  int32_t device_id;
} DLDevice;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} DLDataType;

typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;

typedef union {
  int64_t v_int64;
  double v_float64;
  void* v_handle;
} KilnValue;

enum { KILN_ARG_INT = 0, KILN_ARG_FLOAT = 2, KILN_ARG_DLTENSOR = 7 };
enum { KILN_DEVICE_CPU = 1 };

#if defined(__GNUC__) || defined(__clang__)
#define KILN_HIDDEN __attribute__((visibility("hidden")))
#define KILN_EXPORT __attribute__((visibility("default")))
#define KILN_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define KILN_HIDDEN
#define KILN_EXPORT
#define KILN_PRINTF(f, a)
#endif

#if defined(KILN_NO_THREADS)
#define KILN_THREAD_LOCAL /* single-threaded firmware: one static buffer */
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define KILN_THREAD_LOCAL _Thread_local
#else
#define KILN_THREAD_LOCAL __thread /* GNU C before C11 */
#endif"""

# Defined before any #include when host.c holds the thread pool: pthreads, sysconf
# and sigset_t are POSIX, which a strict -std=c11 build does not declare otherwise.
_POSIX_FEATURES = """\
#if !defined(KILN_NO_THREADS) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* pthreads, sysconf (not in ISO C) */
#endif"""

_PARALLEL_INCLUDES = """\
#if !defined(KILN_NO_THREADS)
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>
#endif"""

# The thread pool behind parallel loops (docs/abi.md, "Parallel loops"); `@` becomes
# the reserved `{prefix}_host_`, PARALLEL_FOR the hidden `{prefix}_parallel_for`.
_PARALLEL_RUNTIME = r"""/* ------------------------------------------------------- parallel loops
   A kernel runs each parallel loop through PARALLEL_FOR (docs/abi.md,
   "Parallel loops"): `body` is called on chunks [begin, end) of [0, n) by a
   small pthread pool that lives in this library, so an exported library needs
   no kiln runtime. The first non-zero status of a chunk is returned (the
   remaining chunks are skipped). */
typedef int32_t (*@body_fn)(int64_t begin, int64_t end, void* context);

#if defined(KILN_NO_THREADS) || !(defined(__GNUC__) || defined(__clang__))

/* Firmware (or a compiler without GNU atomics): a parallel loop runs serially. */
KILN_HIDDEN int32_t PARALLEL_FOR(int64_t n, @body_fn body, void* context) {
  return n > 0 ? body(0, n, context) : 0;
}

#else

enum { @MAX_THREADS = 256, @CHUNKS_PER_THREAD = 4, @SPINS = 2000 };

#define @load(x) __atomic_load_n(&(x), __ATOMIC_SEQ_CST)
#define @store(x, v) __atomic_store_n(&(x), (v), __ATOMIC_SEQ_CST)
#define @add(x, v) __atomic_fetch_add(&(x), (v), __ATOMIC_SEQ_CST)
#if defined(__x86_64__) || defined(__i386__)
#define @pause() __builtin_ia32_pause()
#elif defined(__aarch64__) || (defined(__arm__) && defined(__ARM_ARCH) && __ARM_ARCH >= 7)
#define @pause() __asm__ __volatile__("yield")
#else
#define @pause() ((void)0)
#endif

/* One loop at a time runs on the pool. The caller posts it and takes chunks
   itself; every thread takes the next chunk index with an atomic increment, so
   no lock is held while the loop runs. `generation` works like a sequence lock:
   odd while the caller rewrites the loop's fields, even once they are posted. A
   worker counts itself in `entered`, then checks that the generation it saw is
   still current before it reads the fields, and counts itself out when done.
   The caller makes the generation odd, waits until no worker is inside, writes
   the fields, makes it even and wakes the workers; it returns once it has taken
   the last chunk and no worker is inside (a worker waking up later finds no
   chunk). Waiting threads spin briefly (a model's back-to-back loops need no
   sleep and wake-up), then sleep on a condition variable (`lock`, which also
   guards `busy` and `started`). */
static struct {
  pthread_mutex_t lock;
  pthread_cond_t wake;      /* a loop was posted, or the workers must stop */
  pthread_cond_t done;      /* the last worker left the loop */
  pthread_t workers[@MAX_THREADS];
  int threads;              /* KILN_NUM_THREADS, else the online CPUs (caller included) */
  int started;              /* workers running */
  int busy;                 /* some thread is running a loop on the pool */
  int stop;                 /* atomic: the library is being unloaded */
  unsigned long generation; /* atomic: odd while a loop is being posted */
  int entered;              /* atomic: workers inside the posted loop */
  int64_t next;             /* atomic: the next chunk to take */
  int32_t status;           /* atomic: first non-zero status of a chunk */
  @body_fn body;            /* the posted loop: written before `generation` */
  void* context;
  int64_t n;
  int64_t chunk;
  int64_t chunks;
} @pool;
static pthread_once_t @pool_once = PTHREAD_ONCE_INIT;
static int @pool_ready;
/* Set on pool threads, and on a caller while it runs a loop: nested loops run serially. */
static KILN_THREAD_LOCAL int @in_parallel;

/* KILN_NUM_THREADS if it is a positive integer, else the number of online CPUs. */
static int @thread_count(void) {
  const char* env = getenv("KILN_NUM_THREADS");
  long n = 0;
  if (env != NULL && *env != '\0') {
    char* end = NULL;
    n = strtol(env, &end, 10);
    if (end == NULL || *end != '\0' || n < 1) {
      n = 0;
    }
  }
  if (n == 0) {
    n = sysconf(_SC_NPROCESSORS_ONLN);
  }
  if (n < 1) {
    n = 1;
  }
  return n > @MAX_THREADS ? @MAX_THREADS : (int)n;
}

/* fork(): the child has none of the workers. The lock is held across fork so the
   child never inherits it locked mid-update; the child resets the pool and starts
   new workers when it next runs a parallel loop. */
static void @before_fork(void) {
  pthread_mutex_lock(&@pool.lock);
}

static void @after_fork_parent(void) {
  pthread_mutex_unlock(&@pool.lock);
}

static void @after_fork_child(void) {
  pthread_mutex_unlock(&@pool.lock);
  pthread_cond_init(&@pool.wake, NULL);
  pthread_cond_init(&@pool.done, NULL);
  @pool.started = 0;
  @pool.busy = 0;
  @store(@pool.stop, 0);
  @store(@pool.entered, 0);
  @store(@pool.generation, (@load(@pool.generation) + 1) & ~1UL); /* not mid-post */
}

static void @pool_init(void) {
  pthread_mutex_init(&@pool.lock, NULL);
  pthread_cond_init(&@pool.wake, NULL);
  pthread_cond_init(&@pool.done, NULL);
  @pool.threads = @thread_count();
  pthread_atfork(@before_fork, @after_fork_parent, @after_fork_child);
  @pool_ready = 1;
}

/* Run chunks of the posted loop until none is left or one has failed. */
static void @run_chunks(void) {
  for (;;) {
    int64_t k = @add(@pool.next, 1);
    int64_t begin, end;
    int32_t status;
    if (k >= @pool.chunks || @load(@pool.status) != 0) {
      return;
    }
    begin = k * @pool.chunk;
    end = @pool.n - begin > @pool.chunk ? begin + @pool.chunk : @pool.n;
    status = @pool.body(begin, end, @pool.context);
    if (status != 0) {
      int32_t none = 0;
      __atomic_compare_exchange_n(&@pool.status, &none, status, 0, __ATOMIC_SEQ_CST,
                                  __ATOMIC_SEQ_CST);
    }
  }
}

/* A loop other than `seen` is posted (generation even and new). */
static int @posted(unsigned long seen) {
  unsigned long now = @load(@pool.generation);
  return now != seen && (now & 1UL) == 0;
}

/* A worker: waits until a loop is posted, helps run it. */
static void* @worker(void* arg) {
  unsigned long seen = (unsigned long)(uintptr_t)arg;
  @in_parallel = 1;
  for (;;) {
    unsigned long posted;
    int spin;
    for (spin = 0; spin < @SPINS && !@posted(seen) && !@load(@pool.stop); ++spin) {
      @pause();
    }
    if (!@posted(seen)) {
      pthread_mutex_lock(&@pool.lock);
      while (!@load(@pool.stop) && !@posted(seen)) {
        pthread_cond_wait(&@pool.wake, &@pool.lock);
      }
      pthread_mutex_unlock(&@pool.lock);
    }
    if (@load(@pool.stop)) {
      return NULL;
    }
    posted = @load(@pool.generation);
    @add(@pool.entered, 1);
    /* Still that loop? Then its fields stay put until this worker leaves. */
    if (@load(@pool.generation) == posted && (posted & 1UL) == 0) {
      seen = posted;
      @run_chunks();
    }
    if (@add(@pool.entered, -1) == 1) {
      pthread_mutex_lock(&@pool.lock);
      pthread_cond_signal(&@pool.done); /* only a caller waits on it */
      pthread_mutex_unlock(&@pool.lock);
    }
  }
}

/* Start the missing workers (lock held). They block every signal: signals go to
   the application's own threads. If the system refuses a thread, run with fewer. */
static void @start_workers(void) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  while (@pool.started < @pool.threads - 1) {
    void* seen = (void*)(uintptr_t)@load(@pool.generation);
    if (pthread_create(&@pool.workers[@pool.started], NULL, @worker, seen) != 0) {
      @pool.threads = @pool.started + 1;
      break;
    }
    ++@pool.started;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* Wait until no worker is inside the posted loop (spin, then sleep). */
static void @wait_workers(void) {
  int spin;
  for (spin = 0; spin < @SPINS && @load(@pool.entered) > 0; ++spin) {
    @pause();
  }
  if (@load(@pool.entered) > 0) {
    pthread_mutex_lock(&@pool.lock);
    while (@load(@pool.entered) > 0) {
      pthread_cond_wait(&@pool.done, &@pool.lock);
    }
    pthread_mutex_unlock(&@pool.lock);
  }
}

KILN_HIDDEN int32_t PARALLEL_FOR(int64_t n, @body_fn body, void* context) {
  int64_t chunks;
  int32_t status;
  if (n <= 0) {
    return 0;
  }
  if (n == 1 || @in_parallel) {
    return body(0, n, context);
  }
  pthread_once(&@pool_once, @pool_init);
  pthread_mutex_lock(&@pool.lock);
  if (!@pool.busy && @pool.started < @pool.threads - 1) {
    @start_workers(); /* first use, or first use after fork() */
  }
  if (@pool.busy || @pool.started == 0) {
    /* One thread configured, or another thread is running a loop: run serially. */
    pthread_mutex_unlock(&@pool.lock);
    return body(0, n, context);
  }
  @pool.busy = 1;
  @store(@pool.generation, @load(@pool.generation) + 1); /* odd: being posted */
  pthread_mutex_unlock(&@pool.lock);
  @wait_workers(); /* a late worker may still be looking at the previous loop */
  chunks = (int64_t)(@pool.started + 1) * @CHUNKS_PER_THREAD;
  if (chunks > n) {
    chunks = n;
  }
  @pool.body = body;
  @pool.context = context;
  @pool.n = n;
  @pool.chunk = n / chunks + (n % chunks != 0);
  @pool.chunks = n / @pool.chunk + (n % @pool.chunk != 0);
  @store(@pool.next, 0);
  @store(@pool.status, 0);
  pthread_mutex_lock(&@pool.lock);
  @store(@pool.generation, @load(@pool.generation) + 1); /* even: posted */
  pthread_cond_broadcast(&@pool.wake);
  pthread_mutex_unlock(&@pool.lock);
  @in_parallel = 1;
  @run_chunks();
  @in_parallel = 0;
  @wait_workers(); /* every chunk is taken: wait for those still running */
  status = @load(@pool.status);
  pthread_mutex_lock(&@pool.lock);
  @pool.busy = 0;
  pthread_mutex_unlock(&@pool.lock);
  return status;
}

/* Unloading the library (dlclose, or exit): the workers run its code, so they must
   exit before it is unmapped. */
__attribute__((destructor)) static void @pool_stop(void) {
  int i, started;
  if (!@pool_ready) {
    return;
  }
  pthread_mutex_lock(&@pool.lock);
  @store(@pool.stop, 1);
  started = @pool.started;
  pthread_cond_broadcast(&@pool.wake);
  pthread_mutex_unlock(&@pool.lock);
  for (i = 0; i < started; ++i) {
    pthread_join(@pool.workers[i], NULL);
  }
  pthread_mutex_lock(&@pool.lock);
  @pool.started = 0;
  @store(@pool.stop, 0);
  pthread_mutex_unlock(&@pool.lock);
}

#endif /* KILN_NO_THREADS */"""

# Linker input of the thread pool (glibc before 2.34 keeps pthreads in libpthread).
PTHREAD_LIBS = ("-pthread",)

# Static helpers of host.c, emitted when used; `@` becomes the reserved `{prefix}_host_`.
_CHECKS: dict[str, str] = {
    "error": """\
static KILN_THREAD_LOCAL char @error[ERROR_BUFFER_SIZE];""",
    "fail": """\
/* Format the message of a failed call into this thread's error buffer. */
static KILN_PRINTF(1, 2) int32_t @fail(const char* format, ...) {
  va_list ap;
  va_start(ap, format);
  vsnprintf(@error, sizeof @error, format, ap);
  va_end(ap);
  return ARGUMENT_ERROR;
}""",
    "arg_fail": """\
/* Like @fail, for argument `index` of `fn`: "fn: argument 1 'Y': <message>". */
static KILN_PRINTF(4, 5) int32_t @arg_fail(const char* fn, int32_t index, const char* param,
    const char* format, ...) {
  va_list ap;
  int n = snprintf(@error, sizeof @error, "%s: argument %d '%s': ", fn, (int)index, param);
  if (n < 0 || (size_t)n >= sizeof @error) {
    return ARGUMENT_ERROR;
  }
  va_start(ap, format);
  vsnprintf(@error + n, sizeof @error - (size_t)n, format, ap);
  va_end(ap);
  return ARGUMENT_ERROR;
}""",
    "dtype_name": """\
/* A DLDataType as error messages name it: "float32", "bool", "int8x4". */
static void @dtype_name(char* out, size_t size, DLDataType t) {
  static const char* const names[] = {"int", "uint", "float", "handle", "bfloat", "complex"};
  int n;
  if (t.code == 6 && t.bits == 8) {
    n = snprintf(out, size, "bool");
  } else if (t.code < 6) {
    n = snprintf(out, size, "%s%u", names[t.code], (unsigned)t.bits);
  } else {
    n = snprintf(out, size, "dtype(code=%u, bits=%u)", (unsigned)t.code, (unsigned)t.bits);
  }
  if (t.lanes != 1 && n > 0 && (size_t)n < size) {
    snprintf(out + n, size - (size_t)n, "x%u", (unsigned)t.lanes);
  }
}""",
    "shape_text": """\
/* A shape as error messages show it: "[4, 5]". */
static void @shape_text(char* out, size_t size, const int64_t* shape, int32_t ndim) {
  size_t used = 0;
  int32_t d;
  out[0] = '\\0';
  for (d = 0; d < ndim && used + 1 < size; ++d) {
    int n = snprintf(out + used, size - used, "%s%lld", d == 0 ? "[" : ", ",
        (long long)shape[d]);
    if (n < 0) {
      return;
    }
    used += (size_t)n;
  }
  if (used + 1 < size) {
    snprintf(out + used, size - used, "%s", ndim == 0 ? "[]" : "]");
  }
}""",
    "tensor": """\
/* Checks 2-5 of docs/abi.md for tensor argument `index`; on success *data is the
   address of its first element. */
static int32_t @tensor(void** data, const char* fn, int32_t index, const char* param,
    KilnValue arg, int32_t type_code, int32_t ndim, const int64_t* shape,
    uint8_t code, uint8_t bits, size_t align) {
  const DLTensor* t = (const DLTensor*)arg.v_handle;
  DLDataType want;
  int64_t numel = 1, stride = 1;
  int32_t d;
  char want_text[256], got_text[256];
  if (type_code != KILN_ARG_DLTENSOR) {
    return @arg_fail(fn, index, param, "expected a tensor (type code %d), got type code %d",
        KILN_ARG_DLTENSOR, (int)type_code);
  }
  if (t == NULL) {
    return @arg_fail(fn, index, param, "expected a tensor, got NULL");
  }
  if (t->device.device_type != KILN_DEVICE_CPU) {
    return @arg_fail(fn, index, param, "expected a CPU tensor (device_type %d), got "
        "device_type %d", KILN_DEVICE_CPU, (int)t->device.device_type);
  }
  if (t->ndim != ndim) {
    return @arg_fail(fn, index, param, "expected %d dimension%s, got %d", (int)ndim,
        ndim == 1 ? "" : "s", (int)t->ndim);
  }
  if (t->dtype.code != code || t->dtype.bits != bits || t->dtype.lanes != 1) {
    want.code = code;
    want.bits = bits;
    want.lanes = 1;
    @dtype_name(want_text, sizeof want_text, want);
    @dtype_name(got_text, sizeof got_text, t->dtype);
    return @arg_fail(fn, index, param, "expected dtype %s, got %s", want_text, got_text);
  }
  for (d = 0; d < ndim; ++d) {
    if (t->shape == NULL || t->shape[d] != shape[d]) {
      @shape_text(want_text, sizeof want_text, shape, ndim);
      if (t->shape == NULL) {
        snprintf(got_text, sizeof got_text, "NULL");
      } else {
        @shape_text(got_text, sizeof got_text, t->shape, ndim);
      }
      return @arg_fail(fn, index, param, "expected shape %s, got %s", want_text, got_text);
    }
    numel *= shape[d];
  }
  if (t->strides != NULL && numel != 0) {
    for (d = ndim - 1; d >= 0; --d) {
      if (shape[d] != 1 && t->strides[d] != stride) {
        return @arg_fail(fn, index, param, "expected a contiguous tensor");
      }
      stride *= shape[d];
    }
  }
  *data = t->data == NULL ? NULL : (void*)((char*)t->data + t->byte_offset);
  if (numel != 0 && t->data == NULL) {
    return @arg_fail(fn, index, param, "data is NULL");
  }
  if (numel != 0 && (uintptr_t)*data % align != 0) {
    return @arg_fail(fn, index, param, "data is not aligned to its %u-byte elements",
        (unsigned)align);
  }
  return 0;
}""",
    "int": """\
/* An integer (or bool) scalar argument, range-checked against its dtype. */
static int32_t @int(int64_t* out, const char* fn, int32_t index, const char* param,
    KilnValue arg, int32_t type_code, int64_t lo, int64_t hi,
    const char* dtype) {
  if (type_code != KILN_ARG_INT) {
    return @arg_fail(fn, index, param, "expected an integer scalar (type code %d), got "
        "type code %d", KILN_ARG_INT, (int)type_code);
  }
  if (arg.v_int64 < lo || arg.v_int64 > hi) {
    return @arg_fail(fn, index, param, "value %lld out of range for %s",
        (long long)arg.v_int64, dtype);
  }
  *out = arg.v_int64;
  return 0;
}""",
    "float": """\
/* A float scalar argument; an integer is accepted too. */
static int32_t @float(double* out, const char* fn, int32_t index, const char* param,
    KilnValue arg, int32_t type_code) {
  if (type_code == KILN_ARG_FLOAT) {
    *out = arg.v_float64;
  } else if (type_code == KILN_ARG_INT) {
    *out = (double)arg.v_int64;
  } else {
    return @arg_fail(fn, index, param, "expected a float scalar (type code %d), got type "
        "code %d", KILN_ARG_FLOAT, (int)type_code);
  }
  return 0;
}""",
    "kernel_failed": """\
/* The message of a kernel's non-zero status (docs/codegen-c.md, "Error codes");
   `workspace_bytes` is 0 when the failed allocation's size is not known. */
static int32_t @kernel_failed(const char* fn, int32_t status, long long workspace_bytes) {
  if (status == 1 && workspace_bytes > 0) {
    @fail("%s: out of memory allocating a workspace of %lld bytes", fn, workspace_bytes);
  } else if (status == 1) {
    @fail("%s: out of memory allocating a workspace", fn);
  } else {
    @fail("%s: kernel failed with status %d", fn, (int)status);
  }
  return status;
}""",
}


def _static_shape(fn_name: str, buf: Buffer) -> list[int]:
    if any(not isinstance(d, int) for d in buf.shape):
        raise CompileError(f"host entry of '{fn_name}': parameter '{buf.name}' has a symbolic "
                           f"shape {buf.shape}; packed entries need static shapes")
    return [int(d) for d in buf.shape]


def workspace_bytes(mod: IRModule, name: str) -> tuple[int, bool]:
    """(largest heap workspace in bytes, whether all have that size) of `name` and its callees."""
    sizes: set[int] = set()
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        fn = mod.functions.get(current)
        if not isinstance(fn, PrimFunc):
            continue
        for alloc in heap_allocations(fn.body):
            if all(isinstance(d, int) for d in alloc.buffer.shape):
                sizes.add(alloc.buffer.nbytes())
        todo.extend(c.func for c in calls(fn.body))
    if not sizes:
        return 0, True
    return max(sizes), len(sizes) == 1


class HostPrinter:
    """Prints host.c for one module."""

    def __init__(self, mod: IRModule, prefix: str, metadata: Mapping[str, Any]) -> None:
        self.mod = mod
        self.prefix = check_prefix(prefix)
        self.ns = f"{prefix}_host_"  # static helpers: reserved by docs/abi.md's `{prefix}_`
        self.metadata = metadata
        self.helpers = Helpers()
        # Kernels with parallel loops call the thread pool defined here.
        self.parallel = has_parallel_loops(mod)
        funcs = mod.prim_funcs()
        self.quals = qualifiers(funcs)
        # Globals of host.c that a local must not shadow.
        self.reserved = (
            {entry_symbol(prefix, f) for f in funcs} | {kernel_symbol(prefix, f) for f in funcs}
            | {"DLDevice", "DLDataType", "DLTensor", "KilnValue"})

    def helper(self, name: str) -> str:
        """Use a shared kernels helper (renamed into this file's namespace)."""
        return self.helpers.use(name).replace("kiln_", self.ns, 1)

    def render(self) -> str:
        from kiln import __version__

        funcs = self.mod.prim_funcs()
        entries: list[str] = []
        for name, fn in funcs.items():
            entries.extend(self.entry(name, fn))
            entries.append("")
        out = [
            "/*",
            f" * {HOST_FILE} -- generated by kiln {__version__}. Do not edit.",
            " * Checked packed entry points, last error and metadata of docs/abi.md.",
            " */",
            *([_POSIX_FEATURES] if self.parallel else []),
            _PREAMBLE,
            *([_PARALLEL_INCLUDES] if self.parallel else []),
            "",
            "/* Raw kernels (kernels.c / kernels.o). */",
            *(self.kernel_prototype(name, fn) for name, fn in funcs.items()),
            "",
            self.checks_text(),
            "",
            *([self.parallel_runtime(), ""] if self.parallel else []),
            *self.helpers.lines(self.ns),
            *entries,
            *self.accessors(),
        ]
        return "\n".join(out).rstrip("\n") + "\n"

    def checks_text(self) -> str:
        """The static check helpers the entries use (unused statics would warn)."""
        funcs = self.mod.prim_funcs().values()
        params = [q for fn in funcs for q in fn.params]
        wanted = ["error"]
        if funcs:
            wanted += ["fail", "kernel_failed"]
        if params:
            wanted.append("arg_fail")
        if any(isinstance(q, Buffer) for q in params):
            wanted += ["dtype_name", "shape_text", "tensor"]
        if any(not isinstance(q, Buffer) and not dt.is_float(q.dtype) for q in params):
            wanted.append("int")
        if any(not isinstance(q, Buffer) and dt.is_float(q.dtype) for q in params):
            wanted.append("float")
        text = "\n\n".join(_CHECKS[k] for k in _CHECKS if k in wanted)
        text = text.replace("@", self.ns)
        text = text.replace("ERROR_BUFFER_SIZE", str(ERROR_BUFFER_SIZE))
        return text.replace("ARGUMENT_ERROR", str(ARGUMENT_ERROR))

    def parallel_runtime(self) -> str:
        """The thread pool and `{prefix}_parallel_for` (serial under KILN_NO_THREADS)."""
        text = _PARALLEL_RUNTIME.replace("PARALLEL_FOR", parallel_for_symbol(self.prefix))
        return text.replace("@", self.ns)

    def kernel_prototype(self, name: str, fn: PrimFunc) -> str:
        """The raw kernel's declaration, with kernels.c's parameter types."""
        quals = self.quals[name]
        params = [f"{param_ctype(p, i, quals)} p{i}" for i, p in enumerate(fn.params)]
        return (f"KILN_HIDDEN int32_t {kernel_symbol(self.prefix, name)}"
                f"({', '.join(params) or 'void'});")

    def entry(self, name: str, fn: PrimFunc) -> list[str]:
        """The packed entry of `name`: checks in docs/abi.md order, then the kernel call."""
        p = CPrinter()
        ns = self.ns
        n = len(fn.params)
        names = NameScope(self.reserved | {"args", "type_codes", "num_args", "status", "fn"})
        p.line(f"/* {name}({describe_params(fn)}) */")
        p.line(f"KILN_EXPORT int32_t {entry_symbol(self.prefix, name)}"
               "(const KilnValue* args, const int32_t* type_codes,")
        p.line("    int32_t num_args) {")
        with p.indented():
            p.line(f"static const char fn[] = {c_string_literal(name)};")
            decls: list[str] = []
            checks: list[str] = []
            call_args: list[str] = []
            for i, q in enumerate(fn.params):
                local = names.fresh(q.name)
                where = f"fn, {i}, {c_string_literal(q.name)}, args[{i}], type_codes[{i}]"
                if isinstance(q, Buffer):
                    shape = _static_shape(name, q)
                    code, bits, _ = dl_dtype(q.dtype)
                    shape_arg = "NULL"
                    if shape:
                        shape_arg = names.fresh(f"{q.name}_shape")
                        p.line(f"static const int64_t {shape_arg}[{len(shape)}] = "
                               f"{{{', '.join(str(d) for d in shape)}}};")
                    decls.append(f"void* {local} = NULL;")
                    checks.append(f"{ns}tensor(&{local}, {where}, {len(shape)}, {shape_arg}, "
                                  f"{code}, {bits}, {dt.itemsize(q.dtype)})")
                    call_args.append(local)  # void* converts to the kernel's pointer type
                elif dt.is_float(q.dtype):
                    decls.append(f"double {local} = 0;")
                    checks.append(f"{ns}float(&{local}, {where})")
                    call_args.append(self.float_scalar(q.dtype, local))
                else:
                    lo, hi = (0, 1) if q.dtype == "bool" else INT_RANGES[q.dtype]
                    hi = min(hi, (1 << 63) - 1)  # values cross as int64_t
                    decls.append(f"int64_t {local} = 0;")
                    checks.append(f"{ns}int(&{local}, {where}, {_int64(lo)}, {_int64(hi)}, "
                                  f"{c_string_literal(q.dtype)})")
                    ctype = C_TYPES[q.dtype]
                    call_args.append(local if ctype == "int64_t" else f"({ctype}){local}")
            p.extend(decls)
            p.line("int32_t status;")
            p.line(f"{ns}error[0] = '\\0';")
            noun = "argument" if n == 1 else "arguments"
            with p.block(f"if (num_args != {n})"):
                p.line(f'return {ns}fail("%s: expected {n} {noun}, got %d", fn, (int)num_args);')
            if n:
                with p.block("if (args == NULL || type_codes == NULL)"):
                    p.line(f'return {ns}fail("%s: args or type_codes is NULL", fn);')
                # Argument by argument, each check in order; the first failure wins.
                p.line(f"if ({checks[0]} != 0{' ||' if len(checks) > 1 else ') {'}")
                for j, check in enumerate(checks[1:], 1):
                    tail = " ||" if j < len(checks) - 1 else ") {"
                    p.line(f"    {check} != 0{tail}")
                with p.indented():
                    p.line(f"return {ARGUMENT_ERROR};")
                p.line("}")
            else:
                p.line("(void)args;")
                p.line("(void)type_codes;")
            symbol = kernel_symbol(self.prefix, name)
            p.line(f"status = {symbol}({', '.join(call_args)});")
            size, exact = workspace_bytes(self.mod, name)
            # Report a size only when it is the one workspace size that can have failed.
            reported = size if exact else 0
            p.line(f"return status == 0 ? 0 : {ns}kernel_failed(fn, status, {reported});")
        p.line("}")
        return p.lines

    def float_scalar(self, dtype: str, local: str) -> str:
        if dtype == "float16":
            return f"{self.helper('kiln_f16_from_double')}({local})"
        if dtype == "bfloat16":  # through float32, like the IR interpreter
            return f"{self.helper('kiln_bf16_from_double')}((float){local})"
        return f"({C_TYPES[dtype]}){local}"

    def accessors(self) -> list[str]:
        meta = json.dumps(self.metadata, sort_keys=False, ensure_ascii=False,
                          separators=(",", ":"))
        out = [f"static const char {self.ns}metadata_json[] ="]
        if len(meta.encode("utf-8")) <= MAX_STRING_LITERAL:
            chunks = [meta[i:i + 80] for i in range(0, len(meta), 80)] or [""]
            out += [f"  {c_string_literal(chunk)}" for chunk in chunks]
            out[-1] += ";"
        else:
            # Longer than C99's portable string literal: spell the bytes out.
            data = [*meta.encode("utf-8"), 0]
            out[0] = out[0].replace("[] =", f"[{len(data)}] = {{")
            for i in range(0, len(data), 16):
                out.append("  " + ", ".join(str(b) for b in data[i:i + 16]) + ",")
            out.append("};")
        out += [
            "",
            "/* The message of the last failed call on this thread (\"\" after a success). */",
            f"KILN_EXPORT const char* {last_error_symbol(self.prefix)}(void) {{",
            f"  return {self.ns}error;",
            "}",
            "",
            "/* Library metadata JSON (docs/abi.md). */",
            f"KILN_EXPORT const char* {metadata_symbol(self.prefix)}(void) {{",
            f"  return {self.ns}metadata_json;",
            "}",
        ]
        return out


def _int64(value: int) -> str:
    if value == -(1 << 63):
        return "INT64_MIN"
    if value == (1 << 63) - 1:
        return "INT64_MAX"
    return str(value) if -(1 << 31) < value < (1 << 31) else f"INT64_C({value})"


def host_source(mod: IRModule, *, prefix: str, metadata: Mapping[str, Any]) -> str:
    """The text of host.c for `mod` (see the module docstring)."""
    return HostPrinter(mod, prefix, metadata).render()


def codegen_host(
    mod: IRModule, *, prefix: str, metadata: Mapping[str, Any],
    cflags: Sequence[str] | None = None,
) -> Any:
    """`Artifact("host", "native", "host.c", ...)`: packed entries, last error, metadata.

    `metadata` is `kiln.codegen.naming.library_metadata(mod, prefix)`; `cflags`
    defaults to `-std=c11 -O2 -fPIC` (backends pass their target's flags). When
    a kernel has a parallel loop, host.c also holds the thread pool and its
    metadata asks the linker for `-pthread` (not with `-DKILN_NO_THREADS`, which
    makes parallel loops serial for firmware).
    """
    from kiln.artifact import Artifact

    flags = list(cflags if cflags is not None else DEFAULT_HOST_CFLAGS)
    meta: dict[str, Any] = {"cflags": flags}
    if has_parallel_loops(mod) and "-DKILN_NO_THREADS" not in flags:
        meta["libs"] = list(PTHREAD_LIBS)
    source = host_source(mod, prefix=prefix, metadata=metadata)
    return Artifact("host", "native", HOST_FILE, source.encode("utf-8"), meta)


__all__ = ["ARGUMENT_ERROR", "codegen_host", "host_source", "workspace_bytes"]

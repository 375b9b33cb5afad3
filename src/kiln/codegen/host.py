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
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kiln.codegen.c.analysis import calls, heap_allocations
from kiln.codegen.c.helpers import Helpers
from kiln.codegen.c.kernel import describe_params
from kiln.codegen.c.literals import INT_RANGES, MAX_STRING_LITERAL, c_string_literal
from kiln.codegen.c.printer import CPrinter, NameScope
from kiln.codegen.c.signature import param_ctype, qualifiers
from kiln.codegen.naming import (
    C_TYPES,
    check_prefix,
    dl_dtype,
    entry_symbol,
    kernel_symbol,
    last_error_symbol,
    metadata_symbol,
)
from kiln.errors import CompileError
from kiln.ir import dtype as dt
from kiln.ir.module import IRModule
from kiln.ir.tensor import Buffer, PrimFunc

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
            _PREAMBLE,
            "",
            "/* Raw kernels (kernels.c / kernels.o). */",
            *(self.kernel_prototype(name, fn) for name, fn in funcs.items()),
            "",
            self.checks_text(),
            "",
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
    defaults to `-std=c11 -O2 -fPIC` (backends pass their target's flags).
    """
    from kiln.artifact import Artifact

    source = host_source(mod, prefix=prefix, metadata=metadata)
    return Artifact("host", "native", HOST_FILE, source.encode("utf-8"),
                    {"cflags": list(cflags if cflags is not None else DEFAULT_HOST_CFLAGS)})


__all__ = ["ARGUMENT_ERROR", "codegen_host", "host_source", "workspace_bytes"]

"""Hand-made kiln libraries for the runtime/export tests.

The real codegens and the host-entry generator are written elsewhere; these
tests need libraries now, so this module writes them by hand, following
docs/abi.md to the letter: raw kernels `{p}_kernel_f` (kernels.c), a generated
host.c with checked packed entries, `{p}_last_error`, `{p}_metadata`,
`{p}_cpu_missing`, and the weights as a `constants.bin` artifact linked as
`{p}_consts`.

Functions (and their numpy references in `reference`):
- add_one  (tensor): X f32[4], Y f32[4]              Y = X + 1
- scale_add (tensor): X f32[2,3], Y f32[2,3], alpha f32, k i32   Y = alpha*X + k
- main     (graph):  x f32[4] -> y f32[4]            y = 2*x + W  (W = weights)
- split    (graph):  x i64[3] -> (a i64[3], b f64[3])  a = x + 1, b = x * 0.5
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from kiln.artifact import Artifact, ArtifactSet

WEIGHTS = np.array([10.0, 20.0, 30.0, 40.0], dtype=np.float32)

DL = {"bool": (6, 8), "int8": (0, 8), "int16": (0, 16), "int32": (0, 32), "int64": (0, 64),
      "uint8": (1, 8), "uint16": (1, 16), "uint32": (1, 32), "uint64": (1, 64),
      "float16": (2, 16), "bfloat16": (4, 16), "float32": (2, 32), "float64": (2, 64)}
CTYPE = {"bool": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
         "int64": "int64_t", "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t",
         "uint64": "uint64_t", "float16": "uint16_t", "bfloat16": "uint16_t",
         "float32": "float", "float64": "double"}


def _t(name: str, shape: list[int], dtype: str) -> dict[str, Any]:
    return {"name": name, "kind": "tensor", "shape": shape, "dtype": dtype}


def _w(param: dict[str, Any]) -> dict[str, Any]:
    """A tensor parameter the function writes (docs/abi.md: "written": true)."""
    return {**param, "written": True}


def _s(name: str, dtype: str) -> dict[str, Any]:
    return {"name": name, "kind": "scalar", "dtype": dtype}


def signatures(prefix: str) -> dict[str, dict[str, Any]]:
    def sig(name: str, kind: str, params: list[Any], results: list[Any],
            tuple_result: bool = False) -> dict[str, Any]:
        return {"name": name, "symbol": f"{prefix}{name}", "kind": kind, "params": params,
                "results": results, "tuple_result": tuple_result}

    return {
        "add_one": sig("add_one", "tensor",
                       [_t("X", [4], "float32"), _w(_t("Y", [4], "float32"))], []),
        "scale_add": sig("scale_add", "tensor",
                         [_t("X", [2, 3], "float32"), _w(_t("Y", [2, 3], "float32")),
                          _s("alpha", "float32"), _s("k", "int32")], []),
        "main": sig("main", "graph", [_t("x", [4], "float32")], [_t("y", [4], "float32")]),
        "split": sig("split", "graph", [_t("x", [3], "int64")],
                     [_t("a", [3], "int64"), _t("b", [3], "float64")], tuple_result=True),
    }


def library_metadata(prefix: str) -> dict[str, Any]:
    return {"format": "kiln.library", "version": 1, "kiln_version": "0.1.0",
            "prefix": prefix, "functions": signatures(prefix)}


KERNELS = r"""
#include <stdint.h>
extern const float {p}_consts[];

__attribute__((visibility("hidden"))) int32_t {p}_kernel_add_one(float *X, float *Y) {
  for (int i = 0; i < 4; ++i) Y[i] = X[i] + 1.0f;
  return 0;
}
__attribute__((visibility("hidden")))
int32_t {p}_kernel_scale_add(float *X, float *Y, float alpha, int32_t k) {
  for (int i = 0; i < 6; ++i) Y[i] = alpha * X[i] + (float)k;
  return 0;
}
__attribute__((visibility("hidden"))) int32_t {p}_kernel_main(float *x, float *y) {
  for (int i = 0; i < 4; ++i) y[i] = 2.0f * x[i] + {p}_consts[i];
  return 0;
}
__attribute__((visibility("hidden")))
int32_t {p}_kernel_split(int64_t *x, int64_t *a, double *b) {
  for (int i = 0; i < 3; ++i) { a[i] = x[i] + 1; b[i] = (double)x[i] * 0.5; }
  return 0;
}
/* A helper every library defines under the same name: static archives must not clash. */
int helper_shared_name(void) { return 1; }
"""

HOST_PRELUDE = r"""
#include <stdarg.h>
#include <stdio.h>
#include <kiln/kiln.h>

#define KILN_EXPORT __attribute__((visibility("default")))
static __thread char last_error[1024];

static int32_t fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return -1;
}

KILN_EXPORT const char *{p}_last_error(void) { return last_error; }
KILN_EXPORT const char *{p}_metadata(void) { return "{meta}"; }
/* Plain C kernels need no CPU feature beyond the baseline: none is missing. */
KILN_EXPORT int32_t {p}_cpu_missing(char *out, int32_t size) {
  if (out != NULL && size > 0) out[0] = '\0';
  return 0;
}
/* No parallel loop: the thread controls of a library without a pool (docs/abi.md). */
KILN_EXPORT int32_t {p}_set_num_threads(int32_t n) {
  return n < 0 || n > 256 ? fail("set_num_threads: %d threads", (int)n) : 0;
}
KILN_EXPORT int32_t {p}_num_threads(void) { return 1; }
KILN_EXPORT int32_t {p}_set_spin_us(int32_t us) {
  return us < -1 ? fail("set_spin_us: %d", (int)us) : 0;
}
KILN_EXPORT int32_t {p}_pool_stats(int64_t *out, int32_t size) {
  (void)out;
  (void)size;
  return 0;
}

static void dtype_name(DLDataType t, char *buf, size_t n) {
  static const char *names[] = {"int", "uint", "float", "handle", "bfloat", "complex", "bool"};
  int len;
  if (t.code == kDLBool && t.bits == 8) len = snprintf(buf, n, "bool");
  else if (t.code <= 6) len = snprintf(buf, n, "%s%d", names[t.code], t.bits);
  else len = snprintf(buf, n, "dtype(code=%d, bits=%d)", t.code, t.bits);
  if (t.lanes != 1 && len > 0 && (size_t)len < n) snprintf(buf + len, n - len, "x%d", t.lanes);
}

static void shape_text(const int64_t *shape, int ndim, char *buf, size_t n) {
  size_t used = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < ndim && used < n; ++i)
    used += (size_t)snprintf(buf + used, n - used, i ? ", %lld" : "%lld", (long long)shape[i]);
  if (used < n) snprintf(buf + used, n - used, "]");
}

static int32_t check_tensor(const char *fn, int i, const char *name, const KilnValue *args,
                            const int32_t *codes, int ndim, const int64_t *shape,
                            uint8_t code, uint8_t bits, const char *want) {
  char got[64], a[256], b[256];
  if (codes[i] != KILN_ARG_DLTENSOR)
    return fail("%s: argument %d '%s': expected a tensor (type code 7), got type code %d",
                fn, i, name, codes[i]);
  const DLTensor *t = (const DLTensor *)args[i].v_handle;
  if (!t) return fail("%s: argument %d '%s': expected a tensor, got NULL", fn, i, name);
  if (t->device.device_type != kDLCPU)
    return fail("%s: argument %d '%s': expected a CPU tensor (device_type 1), got device_type %d",
                fn, i, name, (int)t->device.device_type);
  if (t->ndim != ndim)
    return fail("%s: argument %d '%s': expected %d dimension%s, got %d", fn, i, name, ndim,
                ndim == 1 ? "" : "s", t->ndim);
  if (t->dtype.code != code || t->dtype.bits != bits || t->dtype.lanes != 1) {
    dtype_name(t->dtype, got, sizeof got);
    return fail("%s: argument %d '%s': expected dtype %s, got %s", fn, i, name, want, got);
  }
  for (int d = 0; d < ndim; ++d)
    if (t->shape[d] != shape[d]) {
      shape_text(shape, ndim, a, sizeof a);
      shape_text(t->shape, ndim, b, sizeof b);
      return fail("%s: argument %d '%s': expected shape %s, got %s", fn, i, name, a, b);
    }
  if (t->strides) {
    int64_t expect = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      if (t->shape[d] != 1 && t->strides[d] != expect)
        return fail("%s: argument %d '%s': expected a contiguous tensor", fn, i, name);
      expect *= t->shape[d];
    }
  }
  if (!t->data && kiln_numel(t) != 0)
    return fail("%s: argument %d '%s': data is NULL", fn, i, name);
  return 0;
}

static void *data_of(const KilnValue *args, int i) {
  const DLTensor *t = (const DLTensor *)args[i].v_handle;
  return (char *)t->data + t->byte_offset;
}
"""

INT_RANGES = {"int8": (-128, 127), "int16": (-32768, 32767),
              "int32": (-2147483648, 2147483647), "uint8": (0, 255), "uint16": (0, 65535),
              "uint32": (0, 4294967295), "bool": (0, 1)}


def _c_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def host_c(prefix: str) -> str:
    meta = json.dumps(library_metadata(prefix), separators=(",", ":"))
    out = [HOST_PRELUDE.replace("{p}", prefix).replace("{meta}", _c_string(meta))]
    for name, sig in signatures(prefix).items():
        params = sig["params"] + sig["results"]
        n = len(params)
        kernel_params = ", ".join(
            f"{CTYPE[p['dtype']]} *" if p["kind"] == "tensor" else CTYPE[p["dtype"]]
            for p in params)
        body = [f"int32_t {prefix}_kernel_{name}({kernel_params});",
                f"KILN_EXPORT int32_t {prefix}{name}(const KilnValue *args, "
                "const int32_t *codes, int32_t n) {",
                f'  if (n != {n}) return fail("{name}: expected {n} argument'
                f'{"" if n == 1 else "s"}, got %d", n);']
        call = []
        for i, p in enumerate(params):
            pname, dtype = p["name"], p["dtype"]
            if p["kind"] == "tensor":
                code, bits = DL[dtype]
                shape = ", ".join(str(d) for d in p["shape"]) or "0"
                body.append(f"  {{ static const int64_t s[] = {{{shape}}}; if (check_tensor("
                            f'"{name}", {i}, "{pname}", args, codes, {len(p["shape"])}, s, '
                            f'{code}, {bits}, "{dtype}")) return -1; }}')
                call.append(f"({CTYPE[dtype]} *)data_of(args, {i})")
            elif dtype.startswith("float"):
                body.append(f"  if (codes[{i}] != KILN_ARG_FLOAT && codes[{i}] != KILN_ARG_INT) "
                            f'return fail("{name}: argument {i} \'{pname}\': expected a float '
                            f'scalar (type code 2), got type code %d", codes[{i}]);')
                call.append(f"(codes[{i}] == KILN_ARG_INT ? ({CTYPE[dtype]})args[{i}].v_int64 "
                            f": ({CTYPE[dtype]})args[{i}].v_float64)")
            else:
                body.append(f"  if (codes[{i}] != KILN_ARG_INT) return fail(\"{name}: argument "
                            f"{i} '{pname}': expected an integer scalar (type code 0), got "
                            f'type code %d", codes[{i}]);')
                if dtype in INT_RANGES:
                    lo, hi = INT_RANGES[dtype]
                    body.append(f"  if (args[{i}].v_int64 < {lo}LL || args[{i}].v_int64 > "
                                f'{hi}LL) return fail("{name}: argument {i} \'{pname}\': '
                                f'value %lld out of range for {dtype}", '
                                f"(long long)args[{i}].v_int64);")
                call.append(f"({CTYPE[dtype]})args[{i}].v_int64")
        body.append(f"  return {prefix}_kernel_{name}({', '.join(call)});")
        body.append("}")
        out.append("\n".join(body))
    return "\n\n".join(out) + "\n"


def artifacts(prefix: str = "kiln_", *, extra: list[Any] | None = None) -> ArtifactSet:
    """The hand-made library as artifacts (kernels.c, host.c, constants.bin)."""
    arts = ArtifactSet([
        Artifact("c", "native", "kernels.c", KERNELS.replace("{p}", prefix).encode(),
                 {"cflags": ["-std=gnu99"]}),
        Artifact("host", "native", "host.c", host_c(prefix).encode()),
        Artifact("c", "native", "constants.bin", WEIGHTS.tobytes(),
                 {"symbol": f"{prefix}_consts", "align": 64, "count": 1}),
    ])
    for a in extra or ():
        arts.add(a)
    return arts


def reference(name: str, *args: np.ndarray) -> Any:
    """numpy reference of each hand-made function (outputs returned, not written)."""
    if name == "add_one":
        return args[0] + np.float32(1)
    if name == "scale_add":
        x, alpha, k = args[0], args[1], args[2]
        return (np.float32(alpha) * x + np.float32(k)).astype(np.float32)
    if name == "main":
        return (np.float32(2) * args[0] + WEIGHTS).astype(np.float32)
    if name == "split":
        return args[0] + 1, args[0].astype(np.float64) * 0.5
    raise KeyError(name)

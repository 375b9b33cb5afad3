"""Small `static inline` C helpers the generated code calls, emitted only when used.

Each helper is named `kiln_<op>_<suffix>`; the suffix names the C type it works
on: i32 (int32_t, also used for the narrower integers after C's promotion), i64,
u32, u64, f32 (float; float16 and bfloat16 compute in float) and f64.

They exist where C has no operator with the IR's meaning (kiln.ir.evaluate):
rounding division and modulo, min/max with Python's tie rule, integer pow/abs,
and the 16-bit float conversions (correctly rounded, ties to even).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

from kiln.errors import CompileError
from kiln.ir import dtype as dt

SUFFIX_CTYPES = {
    "i32": "int32_t", "i64": "int64_t", "u32": "uint32_t", "u64": "uint64_t",
    "f32": "float", "f64": "double",
}


def suffix(dtype: str) -> str:
    """The helper suffix of the C type a `dtype` value computes in."""
    k, b = dt.DTYPES[dt.check_dtype(dtype)]
    if k == "float":
        return "f64" if b == 64 else "f32"
    if b == 64:
        return "i64" if k == "int" else "u64"
    if b == 32 and k == "uint":
        return "u32"
    return "i32"  # bool, int8..int32, uint8, uint16: promoted to int


class Helpers:
    """The helpers one translation unit uses, in dependency order."""

    def __init__(self) -> None:
        self._code: dict[str, str] = {}

    def use(self, name: str) -> str:
        """Register helper `name` (and what it needs); return the name to call."""
        if name not in self._code:
            code, deps = _make(name)
            for dep in deps:
                self.use(dep)
            self._code[name] = code
        return name

    def __contains__(self, name: object) -> bool:
        return name in self._code

    def __bool__(self) -> bool:
        return bool(self._code)

    @property
    def needs_string_h(self) -> bool:
        return any("memcpy" in code for code in self._code.values())

    def lines(self, namespace: str = "kiln_") -> list[str]:
        """The helpers' C definitions; `namespace` replaces their `kiln_` name prefix
        (host.c shares a namespace with the public entries, so it uses the reserved
        `{prefix}_host_`)."""
        out: list[str] = []
        for code in self._code.values():
            code = code.strip("\n").replace("kiln_", namespace)
            out.extend(code.split("\n"))
            out.append("")
        return out


def _make(name: str) -> tuple[str, tuple[str, ...]]:
    if name in _FIXED:
        return _FIXED[name]
    if name == DIM_HELPERS:
        return dim_runtime_source(), ()
    parts = name.split("_")
    if len(parts) == 3 and parts[0] == "kiln" and parts[2] in SUFFIX_CTYPES:
        maker = _BY_OP.get(parts[1])
        if maker is not None:
            made = maker(parts[2])
            if made is not None:
                return made, ()
    raise CompileError(f"internal error: no C helper named {name!r}")


# ------------------------------------------------------------------ 16-bit floats

_NARROW_FLOAT = """
/* Round `x` to a binary float with `exp_bits` exponent and `man_bits` fraction bits
   (ties to even, overflow to inf, NaN stays NaN); return its bit pattern. */
static inline uint16_t kiln_narrow_float(double x, int exp_bits, int man_bits) {
  uint64_t b, man, q, rem, half;
  uint16_t sign, inf;
  int64_t e;
  int bias, shift;
  memcpy(&b, &x, sizeof b);
  sign = (uint16_t)((b >> 48) & 0x8000u);
  inf = (uint16_t)(((1u << exp_bits) - 1u) << man_bits);
  e = (int64_t)((b >> 52) & 0x7ffu);
  man = b & UINT64_C(0xfffffffffffff);
  if (e == 0x7ff) {
    return (uint16_t)(sign | inf | (man != 0 ? 1u << (man_bits - 1) : 0u));
  }
  if (e == 0) {
    return sign; /* double subnormals are far below the 16-bit range */
  }
  bias = (1 << (exp_bits - 1)) - 1;
  e = e - 1023 + bias;
  if (e >= (1 << exp_bits) - 1) {
    return (uint16_t)(sign | inf);
  }
  man |= UINT64_C(1) << 52;
  shift = 52 - man_bits + (e >= 1 ? 0 : (int)(1 - (e < -64 ? -64 : e)));
  if (shift > 63) {
    return sign;
  }
  q = man >> shift;
  rem = man & ((UINT64_C(1) << shift) - 1u);
  half = UINT64_C(1) << (shift - 1);
  if (rem > half || (rem == half && (q & 1u) != 0)) {
    q += 1;
  }
  /* For a normal result q still holds the implicit bit, which adds one to
     (e - 1); a carry out of the fraction moves to the next binade (or inf). */
  return (uint16_t)(sign | ((e >= 1 ? (uint64_t)(e - 1) << man_bits : 0u) + q));
}
"""

_F16 = {
    "kiln_f16_from_double": ("""
/* float16 bit pattern of x (IEEE binary16, round to nearest even). */
static inline uint16_t kiln_f16_from_double(double x) {
  return kiln_narrow_float(x, 5, 10);
}
""", ("kiln_narrow_float",)),
    "kiln_bf16_from_double": ("""
/* bfloat16 bit pattern of x (round to nearest even). */
static inline uint16_t kiln_bf16_from_double(double x) {
  return kiln_narrow_float(x, 8, 7);
}
""", ("kiln_narrow_float",)),
    "kiln_f16_to_float": ("""
/* The value of a float16 bit pattern (exact). */
static inline float kiln_f16_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = ((uint32_t)h >> 10) & 0x1fu;
  uint32_t man = (uint32_t)h & 0x3ffu;
  uint32_t bits;
  float f;
  if (e == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13); /* inf, NaN */
  } else if (e != 0) {
    bits = sign | ((e + 112u) << 23) | (man << 13);
  } else {
    f = (float)man * 5.9604644775390625e-8f; /* zero or subnormal: man * 2^-24 */
    return sign != 0 ? -f : f;
  }
  memcpy(&f, &bits, sizeof f);
  return f;
}
""", ()),
    "kiln_bf16_to_float": ("""
/* The value of a bfloat16 bit pattern (exact). */
static inline float kiln_bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}
""", ()),
    "kiln_f16_round": ("""
/* x rounded to the nearest float16 value: every float16 operation ends here. */
static inline float kiln_f16_round(double x) {
  return kiln_f16_to_float(kiln_f16_from_double(x));
}
""", ("kiln_f16_from_double", "kiln_f16_to_float")),
    "kiln_bf16_round": ("""
/* x rounded to the nearest bfloat16 value: every bfloat16 operation ends here. */
static inline float kiln_bf16_round(double x) {
  return kiln_bf16_to_float(kiln_bf16_from_double(x));
}
""", ("kiln_bf16_from_double", "kiln_bf16_to_float")),
}

# The checked int64 arithmetic of dimension expressions (kiln.dim_expr.to_c): a real C
# file shipped next to kiln.h, shared with host.c (kiln_host.c includes it).
DIM_RUNTIME_FILE = "kiln_dim.c"
#: The name `Helpers.use` takes for all of kiln_dim.c.
DIM_HELPERS = "kiln_dim"


@functools.cache
def dim_runtime_source() -> str:
    """The text of kiln_dim.c (`kiln.runtime.include_dir()/kiln/kiln_dim.c`)."""
    path = Path(__file__).resolve().parents[2] / "runtime" / "include" / "kiln"
    return (path / DIM_RUNTIME_FILE).read_text(encoding="utf-8")


# ------------------------------------------------------------------ int8 dot product
# (the `dot4_u8s8` intrinsic, kiln.ir.tensor; docs/quantization.md). Kept in a block of
# its own: the quantized kernels own it.

_DOT4_U8S8 = """
/* acc + the products of a's four bytes (unsigned) and b's (signed), wrapping like
   int32 in the IR. Each product fits 16 bits, the four fit 18: only the last add
   wraps, done unsigned. Sign extension by xor/subtract avoids C's
   implementation-defined narrowing; compilers fold it to one sign-extending load. */
static inline int32_t kiln_dot4_u8s8(int32_t acc, int32_t a, int32_t b) {
  uint32_t ua = (uint32_t)a, ub = (uint32_t)b;
  int32_t sum = 0;
  int shift;
  for (shift = 0; shift < 32; shift += 8) {
    int32_t x = (int32_t)((ua >> shift) & 0xFFu);
    int32_t w = (int32_t)(((ub >> shift) & 0xFFu) ^ 0x80u) - 0x80;
    sum += x * w;
  }
  return (int32_t)((uint32_t)acc + (uint32_t)sum);
}
"""

_FIXED: dict[str, tuple[str, tuple[str, ...]]] = {
    "kiln_narrow_float": (_NARROW_FLOAT, ()),
    "kiln_dot4_u8s8": (_DOT4_U8S8, ()),
    **_F16,
}

# ------------------------------------------------------------------ arithmetic


def _float_fn(s: str, base: str) -> str:
    return base + "f" if s == "f32" else base


def _negate(s: str, a: str) -> str:
    """`-a` wrapping like the IR (`-INT_MIN` is INT_MIN), computed unsigned."""
    t = SUFFIX_CTYPES[s]
    u = "uint64_t" if s == "i64" else "uint32_t"
    return f"({t})(({u})0 - ({u}){a})"


def _div(s: str) -> str | None:
    t = SUFFIX_CTYPES[s]
    if s in ("i32", "i64"):
        return f"""
/* a / b truncated, as the IR defines it on every input (docs/codegen-c.md): by
   zero 0, and INT_MIN / -1 wraps to INT_MIN; C's `/` would trap on both. */
static inline {t} kiln_div_{s}({t} a, {t} b) {{
  if (b == 0) {{
    return 0;
  }}
  return b == -1 ? {_negate(s, "a")} : a / b;
}}
"""
    if s in ("u32", "u64"):
        return f"""
/* a / b; by zero 0 (docs/codegen-c.md). */
static inline {t} kiln_div_{s}({t} a, {t} b) {{
  return b == 0 ? 0 : a / b;
}}
"""
    return None


def _mod(s: str) -> str | None:
    t = SUFFIX_CTYPES[s]
    if s in ("i32", "i64"):
        return f"""
/* a % b with the sign of a; by zero (and by -1, which C's `%` may trap on) 0. */
static inline {t} kiln_mod_{s}({t} a, {t} b) {{
  return (b == 0 || b == -1) ? 0 : a % b;
}}
"""
    if s in ("u32", "u64"):
        return f"""
/* a % b; by zero 0 (docs/codegen-c.md). */
static inline {t} kiln_mod_{s}({t} a, {t} b) {{
  return b == 0 ? 0 : a % b;
}}
"""
    return None


def _floordiv(s: str) -> str | None:
    t = SUFFIX_CTYPES[s]
    if s in ("i32", "i64"):
        return f"""
/* a / b rounded toward negative infinity; by zero 0, INT_MIN / -1 is INT_MIN. */
static inline {t} kiln_floordiv_{s}({t} a, {t} b) {{
  {t} q;
  if (b == 0) {{
    return 0;
  }}
  if (b == -1) {{
    return {_negate(s, "a")};
  }}
  q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}}
"""
    if s in ("f32", "f64"):
        return f"""
static inline {t} kiln_floordiv_{s}({t} a, {t} b) {{
  return {_float_fn(s, "floor")}(a / b);
}}
"""
    return None


def _floormod(s: str) -> str | None:
    t = SUFFIX_CTYPES[s]
    if s in ("i32", "i64"):
        return f"""
/* a - b * floor(a / b): the remainder takes the sign of b; by zero or -1, 0. */
static inline {t} kiln_floormod_{s}({t} a, {t} b) {{
  {t} r;
  if (b == 0 || b == -1) {{
    return 0;
  }}
  r = a % b;
  return (r != 0 && (r < 0) != (b < 0)) ? r + b : r;
}}
"""
    if s in ("f32", "f64"):
        return f"""
static inline {t} kiln_floormod_{s}({t} a, {t} b) {{
  return a - {_float_fn(s, "floor")}(a / b) * b;
}}
"""
    return None


def _minmax(op: str, cmp: str) -> Callable[[str], str | None]:
    def make(s: str) -> str:
        t = SUFFIX_CTYPES[s]
        return f"""
/* {op}(a, b): b only if b {cmp} a (so a on ties and, for floats, when unordered). */
static inline {t} kiln_{op}_{s}({t} a, {t} b) {{
  return b {cmp} a ? b : a;
}}
"""
    return make


def _pow(s: str) -> str | None:
    t = SUFFIX_CTYPES[s]
    if s in ("f32", "f64"):
        return None
    u = "uint64_t" if s in ("i64", "u64") else "uint32_t"
    negative = ""
    if s in ("i32", "i64"):
        negative = """
  if (b < 0) {
    /* the real result truncated toward zero: 0 unless |a| == 1 */
    return a == 1 ? 1 : (a == -1 ? ((b & 1) != 0 ? -1 : 1) : 0);
  }"""
    return f"""
/* a ** b by repeated squaring, wrapping on overflow like numpy. */
static inline {t} kiln_pow_{s}({t} a, {t} b) {{
  {u} result = 1, base = ({u})a;{negative}
  while (b > 0) {{
    if ((b & 1) != 0) {{
      result *= base;
    }}
    base *= base;
    b >>= 1;
  }}
  return ({t})result;
}}
"""


def _abs(s: str) -> str | None:
    if s not in ("i32", "i64"):
        return None
    t, u = SUFFIX_CTYPES[s], "uint" + SUFFIX_CTYPES[s][3:]
    return f"""
/* |a|; the most negative value maps to itself (two's complement wrap). */
static inline {t} kiln_abs_{s}({t} a) {{
  return a < 0 ? ({t})(0u - ({u})a) : a;
}}
"""


_BY_OP: dict[str, Callable[[str], str | None]] = {
    "div": _div,
    "mod": _mod,
    "floordiv": _floordiv,
    "floormod": _floormod,
    "min": _minmax("min", "<"),
    "max": _minmax("max", ">"),
    "pow": _pow,
    "abs": _abs,
}

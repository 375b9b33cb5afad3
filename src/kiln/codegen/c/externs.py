"""Prototypes of the external C functions a module calls (`CallExtern`).

Each external function gets one `extern` prototype built from the dtypes of its
arguments; calls that disagree on the signature are a compile error. A name
that <math.h> already declares is checked against the library's own
prototype instead, so `call_extern("expf", x)` works and `call_extern("sqrt", x)`
with a float32 `x` is reported clearly (libm's `sqrt` takes a double).
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.codegen.cfamily.printer import C_KEYWORDS, HELPER_PREFIX
from kiln.codegen.naming import C_TYPE_NAMES
from kiln.errors import CompileError
from kiln.escape import is_c_identifier
from kiln.ir import dtype as dt
from kiln.ir.tensor import Buffer, CallExtern, PrimExpr

_UNARY = (
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "cbrt", "sin", "cos", "tan",
    "tanh", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh", "atanh", "erf", "erfc",
    "tgamma", "lgamma", "fabs", "floor", "ceil", "rint", "nearbyint", "round", "trunc",
)
_BINARY = (
    "pow", "atan2", "fmod", "fmin", "fmax", "copysign", "hypot", "remainder", "fdim", "nextafter",
)

# libm prototypes: name -> (return C type, argument C types).
MATH_H: dict[str, tuple[str, tuple[str, ...]]] = {}
for _fn in _UNARY:
    MATH_H[_fn] = ("double", ("double",))
    MATH_H[_fn + "f"] = ("float", ("float",))
for _fn in _BINARY:
    MATH_H[_fn] = ("double", ("double", "double"))
    MATH_H[_fn + "f"] = ("float", ("float", "float"))

# <string.h> functions: name -> (return C type, argument C types). Pointer
# arguments take Buffers, the others integers; a pointer result reads as 0
# (as in the IR interpreter).
STRING_H: dict[str, tuple[str, tuple[str, ...]]] = {
    "memcpy": ("void*", ("void*", "const void*", "size_t")),
    "memmove": ("void*", ("void*", "const void*", "size_t")),
    "memset": ("void*", ("void*", "int", "size_t")),
    "memcmp": ("int", ("const void*", "const void*", "size_t")),
}

# <math.h> macros that cannot be redeclared as functions.
MATH_H_MACROS = frozenset((
    "isnan", "isinf", "isfinite", "isnormal", "signbit", "fpclassify", "isgreater",
    "isgreaterequal", "isless", "islessequal", "islessgreater", "isunordered",
))


@dataclass(frozen=True)
class Prototype:
    """An external function; `header` is set when a standard header declares it."""

    name: str
    ret: str
    args: tuple[str, ...]
    header: str | None = None

    @property
    def pointer_result(self) -> bool:
        return self.ret.endswith("*")

    def c_decl(self) -> str:
        args = ", ".join(self.args) if self.args else "void"
        return f"extern {self.ret} {self.name}({args});"


def signature(call: CallExtern) -> tuple[str, tuple[str, ...]]:
    """(return C type, argument C types) of a call; a Buffer argument is a pointer."""
    args = tuple(f"{C_TYPE_NAMES[a.dtype]}*" if isinstance(a, Buffer) else C_TYPE_NAMES[a.dtype]
                 for a in call.args)
    return C_TYPE_NAMES[call.dtype], args


class ExternTable:
    """Prototypes of every external function of a translation unit, checked for conflicts."""

    def __init__(self, reserved: set[str]) -> None:
        self._reserved = reserved
        self._protos: dict[str, Prototype] = {}
        self._calls: dict[str, tuple[str, tuple[str, ...]]] = {}  # the signature calls use
        self.libs: list[str] = []
        self.dependencies: dict[str, dict[str, object]] = {}  # short name -> record

    def add(self, call: CallExtern, where: str) -> Prototype:
        name = call.name
        if (not is_c_identifier(name) or name in C_KEYWORDS
                or name.startswith(HELPER_PREFIX) or name in self._reserved):
            raise CompileError(
                f"{where}: call_extern name {name!r} cannot be used in C: it must be an ASCII "
                f"identifier that is not a C keyword, does not start with {HELPER_PREFIX!r} "
                "and is not a kiln symbol of this module")
        if name in MATH_H_MACROS:
            raise CompileError(
                f"{where}: call_extern {name!r} is a <math.h> macro, not a function; "
                f"use the intrinsic instead (Intrin('{name}', ...))")
        ret, args = signature(call)
        known = self._protos.get(name)
        if known is not None:
            seen_ret, seen_args = self._calls[name]
            if (seen_ret, seen_args) != (ret, args):
                raise CompileError(
                    f"{where}: call_extern {name!r} is called as {_show(ret, args)} here but as "
                    f"{_show(seen_ret, seen_args)} elsewhere; one C function has one signature")
            return known
        if name in MATH_H and MATH_H[name] != (ret, args):
            lib_ret, lib_args = MATH_H[name]
            raise CompileError(
                f"{where}: call_extern {name!r}: <math.h> declares {_show(lib_ret, lib_args)}, "
                f"but the call is {_show(ret, args)}; cast the arguments or use "
                f"{name + 'f' if lib_ret == 'double' else name[:-1]!r}")
        if name in STRING_H:
            proto = _string_h(call, where)
        else:
            proto = Prototype(name, ret, args, "math.h" if name in MATH_H else None)
        self._protos[name] = proto
        self._calls[name] = (ret, args)
        if call.dependency is not None:
            self.dependencies.setdefault(call.dependency.short_name, call.dependency.to_json())
            for lib in call.dependency.libs:
                if lib not in self.libs:
                    self.libs.append(lib)
        return proto

    def declarations(self) -> list[str]:
        """`extern` lines for every function no standard header declares."""
        return [p.c_decl() for p in self._protos.values() if p.header is None]

    def headers(self) -> set[str]:
        """Standard headers declaring some of the functions (besides math.h and stdint.h)."""
        return {p.header for p in self._protos.values()
                if p.header is not None and p.header != "math.h"}

    def __len__(self) -> int:
        return len(self._protos)


def _string_h(call: CallExtern, where: str) -> Prototype:
    """Check a call of a <string.h> function: Buffers for pointers, integers otherwise."""
    ret, params = STRING_H[call.name]
    def fits(arg: Buffer | PrimExpr, param: str) -> bool:
        if isinstance(arg, Buffer):
            return param.endswith("*")
        return not param.endswith("*") and dt.kind(arg.dtype) in ("int", "uint", "bool")

    ok = (len(call.args) == len(params) and dt.kind(call.dtype) in ("int", "uint")
          and all(fits(arg, param) for arg, param in zip(call.args, params)))
    if not ok:
        raise CompileError(
            f"{where}: call_extern {call.name!r}: <string.h> declares {_show(ret, params)}; "
            "pass buffers for the pointers and integers for the rest, with an integer result "
            "dtype (a pointer result reads as 0)")
    return Prototype(call.name, ret, params, "string.h")


def _show(ret: str, args: tuple[str, ...]) -> str:
    return f"{ret} f({', '.join(args) or 'void'})"

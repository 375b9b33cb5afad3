"""External C functions the reference interpreter knows (`CallExtern`).

`EXTERN_REFERENCES` maps a C function name to its Python reference: the libm
functions (`exp`/`expf`, `pow`/`powf`, ...) and memcpy / memmove / memset on
buffers. `register_extern_reference` (re-exported by `kiln.ir.evaluate`) adds more.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import amx
from kiln.ir import dtype as dt
from kiln.ir._interp_runtime import Fault
from kiln.ir.same_address import SAME_ADDRESS


@dataclass(frozen=True)
class ExternReference:
    """How the interpreter runs an external C function.

    `arg_dtypes` entries are a dtype, "int" (any integer dtype) or "buffer" (the
    function receives the buffer's flat numpy array and may write it).
    `ret_dtype` is a dtype, or None to accept any: the result is then converted
    to the call's dtype.
    """

    arg_dtypes: tuple[str, ...]
    ret_dtype: str | None
    fn: Callable[..., Any]

    def accepts(self, args: tuple[str, ...], ret: str) -> bool:
        if len(args) != len(self.arg_dtypes) or self.ret_dtype not in (None, ret):
            return False
        return all(want == got or (want == "int" and got != "buffer" and dt.is_int(got))
                   for want, got in zip(self.arg_dtypes, args))


EXTERN_REFERENCES: dict[str, ExternReference] = {}


def register_extern_reference(name: str, arg_dtypes: Sequence[str], ret_dtype: str | None,
                              fn: Callable[..., Any], *, override: bool = False) -> None:
    """Teach the interpreter an extern (see ExternReference for the argument kinds)."""
    if name in EXTERN_REFERENCES and not override:
        raise IRError(f"extern reference {name!r} is already registered; pass override=True")
    EXTERN_REFERENCES[name] = ExternReference(tuple(arg_dtypes), ret_dtype, fn)


# --------------------------------------------------------------------------- libm table


def _erf(x: Any) -> float:
    return math.erf(x)


def _round_half_away(x: Any) -> Any:
    """C `round`: halfway cases away from zero (unlike `rint`)."""
    r = np.trunc(x)
    if abs(x - r) >= 0.5:
        r += np.copysign(1.0, x)
    return r


_LIBM_UNARY: dict[str, Callable[..., Any]] = {
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2,
    "log10": np.log10, "log1p": np.log1p, "sqrt": np.sqrt, "cbrt": np.cbrt, "sin": np.sin,
    "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh, "erf": _erf,
    "fabs": np.fabs, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "rint": np.rint,
    "nearbyint": np.rint, "round": _round_half_away,
}
_LIBM_BINARY: dict[str, Callable[..., Any]] = {
    "pow": np.power, "atan2": np.arctan2, "fmod": np.fmod, "fmin": np.fmin, "fmax": np.fmax,
    "hypot": np.hypot, "copysign": np.copysign,
}


def _libm(fn: Callable[..., Any], carrier: type) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        return carrier(fn(*(np.float64(a) for a in args)))
    return run


def _install_libm() -> None:
    for table, arity in ((_LIBM_UNARY, 1), (_LIBM_BINARY, 2)):
        for base, fn in table.items():
            register_extern_reference(base, ("float64",) * arity, "float64",
                                      _libm(fn, np.float64))
            register_extern_reference(base + "f", ("float32",) * arity, "float32",
                                      _libm(fn, np.float32))


_install_libm()


def _bytes(buf: np.ndarray, n: int, what: str) -> np.ndarray:
    raw = buf.view(np.uint8)
    if not 0 <= n <= raw.size:
        raise Fault(f"{what} of {n} bytes on a buffer of {raw.size} bytes")
    return raw[:n]


def _memcpy(dst: np.ndarray, src: np.ndarray, n: int) -> int:
    _bytes(dst, n, "memcpy")[:] = _bytes(src, n, "memcpy")
    return 0  # the C function returns `dst`; a pointer has no meaning here


def _memset(dst: np.ndarray, value: int, n: int) -> int:
    _bytes(dst, n, "memset")[:] = value & 0xFF
    return 0


register_extern_reference("memcpy", ("buffer", "buffer", "int"), None, _memcpy)
register_extern_reference("memmove", ("buffer", "buffer", "int"), None, _memcpy)
register_extern_reference("memset", ("buffer", "int", "int"), None, _memset)


def _same_address(a: np.ndarray, b: np.ndarray) -> int:
    """kiln.ir.same_address: the arrays' first bytes at one address."""
    return int(a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


register_extern_reference(SAME_ADDRESS, ("buffer", "buffer"), "int32", _same_address)


def _install_amx() -> None:
    """The AMX tile calls a kernel makes (kiln.ir.amx): configuration and release do
    nothing here; a block runs its numpy reference."""
    for name in (amx.AMX_TILE_CONFIG, amx.AMX_TILE_RELEASE):
        register_extern_reference(name, (), "int32", lambda: 0)
    for tm, tn in amx.AMX_BLOCKS:
        register_extern_reference(
            amx.amx_bf16_block(tm, tn), ("buffer",) * 3 + ("int",) * 6, "int32",
            functools.partial(amx.bf16_block_reference, tm, tn))


_install_amx()

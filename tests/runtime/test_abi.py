"""kiln.runtime.abi is the one table of the C ABI: kiln.h, kiln_host.c, numpy and the
IR's dtypes all agree with it.

The C side is read by compiling small programs with `cc -Werror` that print the
header's values, so a renamed macro or a changed enum fails here rather than in
a user's build.
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kiln import escape
from kiln.errors import CallError
from kiln.ir import dtype as ir_dtype
from kiln.runtime import abi, ctypes_abi, include_dir
from support.toolchains import needs

needs_cc = needs("cc", why="a C compiler")

# Every DLDataTypeCode of kiln.h, by its enumerator.
DL_CODES = {"kDLInt": abi.KDL_INT, "kDLUInt": abi.KDL_UINT, "kDLFloat": abi.KDL_FLOAT,
            "kDLOpaqueHandle": abi.KDL_OPAQUE, "kDLBfloat": abi.KDL_BFLOAT,
            "kDLComplex": abi.KDL_COMPLEX, "kDLBool": abi.KDL_BOOL}

# Every scalar constant kiln.h defines that abi.py names.
HEADER_CONSTANTS = {
    "DLPACK_MAJOR_VERSION": abi.DLPACK_MAJOR_VERSION, "kDLCPU": abi.KDL_CPU,
    "kDLCUDA": abi.KDL_CUDA,
    "KILN_ABI_VERSION": abi.ABI_VERSION, "KILN_ARG_INT": abi.ARG_INT,
    "KILN_ARG_FLOAT": abi.ARG_FLOAT, "KILN_ARG_HANDLE": abi.ARG_HANDLE,
    "KILN_ARG_DLTENSOR": abi.ARG_DLTENSOR, "KILN_MAX_TENSOR_ARGS": abi.MAX_TENSOR_ARGS,
    **DL_CODES,
}

# The same for kiln_host.c, which copies kiln.h's layout rather than including it.
HOST_CONSTANTS = {
    "KILN_ARG_INT": abi.ARG_INT, "KILN_ARG_FLOAT": abi.ARG_FLOAT,
    "KILN_ARG_HANDLE": abi.ARG_HANDLE, "KILN_ARG_DLTENSOR": abi.ARG_DLTENSOR,
    "KILN_DEVICE_CPU": abi.KDL_CPU,
    "KILN_HOST_ARGUMENT_ERROR": abi.ARGUMENT_ERROR,
    "KILN_HOST_ERROR_SIZE": abi.ERROR_BUFFER_SIZE,
}


def _run_c(tmp_path: Path, source: str) -> dict[str, list[int]]:
    """Compile and run `source`; its output lines are `name value...`."""
    src = tmp_path / "abi.c"
    src.write_text(source, encoding="utf-8")
    exe = tmp_path / "abi"
    cmd = ["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", f"-I{include_dir()}", "-o",
           str(exe), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    return {line.split()[0]: [int(v) for v in line.split()[1:]] for line in out.splitlines()}


def _print_ints(names: list[str]) -> list[str]:
    return [f'  printf("{n} %lld\\n", (long long)({n}));' for n in names]


@needs_cc
def test_kiln_h_defines_the_constants_of_abi_py(tmp_path: Path) -> None:
    source = "\n".join(["#include <stdio.h>", "#include <kiln/kiln.h>", "int main(void) {",
                        *_print_ints(list(HEADER_CONSTANTS)), "  return 0;", "}", ""])
    got = _run_c(tmp_path, source)
    assert {name: values[0] for name, values in got.items()} == HEADER_CONSTANTS


@needs_cc
def test_kiln_h_dtype_macros_and_c_types_match_abi_py(tmp_path: Path) -> None:
    """Per dtype: its KILN_<DTYPE> macro gives abi's (code, bits, lanes), and its C type
    has the dtype's width and (for integers) signedness."""
    lines = ["#include <stdio.h>", "#include <kiln/kiln.h>", "int main(void) {",
             "  DLDataType t;"]
    for dtype, macro in abi.C_DTYPE_MACROS.items():
        c_type = abi.C_TYPE_NAMES[dtype]
        lines += [f"  t = {macro};",
                  f'  printf("{dtype} %d %d %d %d %d\\n", t.code, t.bits, t.lanes, '
                  f"(int)sizeof({c_type}), (double)({c_type})-1 < 0.0);"]
    got = _run_c(tmp_path, "\n".join([*lines, "  return 0;", "}", ""]))
    assert set(got) == set(abi.DL_TYPES)
    for dtype, (code, bits, lanes, size, signed) in got.items():
        assert abi.dl_type(dtype) == (code, bits, lanes), dtype
        assert size * 8 == bits, f"{dtype}: C type {abi.C_TYPE_NAMES[dtype]}"
        # bool and 16-bit floats travel as unsigned bit patterns; float/double are signed.
        kind = ir_dtype.kind(dtype)
        assert bool(signed) == (kind == "int" or dtype in ("float32", "float64")), dtype


@needs_cc
def test_kiln_host_c_uses_the_constants_of_abi_py(tmp_path: Path) -> None:
    # kiln_host.c is meant to be the start of a translation unit (host.c); a main
    # after it reads its constants as the compiler sees them.
    source = "\n".join(['#include "kiln/kiln_host.c"', "int main(void) {",
                        *_print_ints(list(HOST_CONSTANTS)), "  return 0;", "}", ""])
    got = _run_c(tmp_path, source)
    assert {name: values[0] for name, values in got.items()} == HOST_CONSTANTS


def test_abi_agrees_with_numpy() -> None:
    pytest.importorskip("ml_dtypes")  # bfloat16's numpy dtype
    for dtype, dl in abi.DL_TYPES.items():
        np_dtype = abi.numpy_dtype(dtype)
        assert np_dtype.itemsize * 8 == dl.bits, dtype
        assert abi.dl_type_of(np_dtype) == dl, dtype
        assert ctypes.sizeof(ctypes_abi.CTYPES_BY_DTYPE[dtype]) == np_dtype.itemsize, dtype
        assert abi.is_float_dtype(dtype) == (np_dtype.kind == "f" or dtype == "bfloat16")
        if dtype in abi.SCALAR_RANGES and dtype != "bool":
            info = np.iinfo(np_dtype)
            assert abi.SCALAR_RANGES[dtype] == (int(info.min), int(info.max)), dtype
    assert abi.dl_type_of(np.dtype(object)) is None
    assert abi.dl_type_of(np.dtype("complex64")) == (abi.KDL_COMPLEX, 64, 1)


def test_abi_agrees_with_the_ir_dtypes() -> None:
    """kiln.ir.dtype keeps (kind, bits) for the IR's semantics; abi.py the ABI's view."""
    assert list(ir_dtype.DTYPES) == list(abi.DL_TYPES)
    codes = {"bool": abi.KDL_BOOL, "int": abi.KDL_INT, "uint": abi.KDL_UINT,
             "float": abi.KDL_FLOAT}
    for dtype, (kind, bits) in ir_dtype.DTYPES.items():
        code = abi.KDL_BFLOAT if dtype == "bfloat16" else codes[kind]
        assert abi.dl_type(dtype) == (code, bits, 1), dtype
        assert abi.is_float_dtype(dtype) == ir_dtype.is_float(dtype), dtype
        assert (dtype in abi.SCALAR_RANGES) == (not ir_dtype.is_float(dtype)), dtype
    pytest.importorskip("ml_dtypes")  # bfloat16's numpy dtype
    assert all(ir_dtype.to_numpy(d) == abi.numpy_dtype(d) for d in ir_dtype.DTYPES)


def test_codegen_uses_the_abi_tables() -> None:
    naming = pytest.importorskip("kiln.codegen.naming")
    literals = pytest.importorskip("kiln.codegen.cfamily.literals")
    assert naming.C_TYPE_NAMES is abi.C_TYPE_NAMES
    # The IR's wrap-around ranges and the ABI's argument ranges are the same numbers.
    assert {**literals.INT_RANGES, "bool": (0, 1)} == abi.SCALAR_RANGES


def test_int64_literal_has_one_spelling() -> None:
    assert abi.int64_literal is escape.int64_literal
    assert abi.int64_literal(abi.INT64_MIN) == "INT64_MIN"


def test_an_unknown_dtype_is_a_call_error_naming_it() -> None:
    with pytest.raises(CallError, match="unknown dtype 'float8'; known: bool, int8"):
        abi.dl_type("float8")
    with pytest.raises(CallError, match="'complex64'"):
        abi.numpy_dtype("complex64")

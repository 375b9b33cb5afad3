"""kiln.h compiles cleanly everywhere, and the ctypes mirrors match its layout."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest

from kiln.runtime import abi, ctypes_abi, include_dir
from support.toolchains import needs

USE_HEADER = r"""
#include <kiln/kiln.h>
int main(void) {
  float x[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  DLTensor t = kiln_tensor(x, 1, shape, KILN_FLOAT32);
  KilnValue args[3];
  int32_t codes[3];
  kiln_set_tensor(args, codes, 0, &t);
  kiln_set_int(args, codes, 1, 7);
  kiln_set_float(args, codes, 2, 0.5);
  return (int)(kiln_numel(&t) - 4) + codes[0] - KILN_ARG_DLTENSOR + codes[1] - KILN_ARG_INT
         + codes[2] - KILN_ARG_FLOAT + (t.dtype.code != kDLFloat)
         + (t.device.device_type != kDLCPU);
}
"""

LAYOUT = r"""
#include <stddef.h>
#include <stdio.h>
#include <kiln/kiln.h>
int main(void) {
  printf("%zu %zu %zu %zu\n", sizeof(DLDevice), sizeof(DLDataType), sizeof(DLTensor),
         sizeof(KilnValue));
  printf("%zu %zu %zu %zu %zu %zu %zu\n", offsetof(DLTensor, data), offsetof(DLTensor, device),
         offsetof(DLTensor, ndim), offsetof(DLTensor, dtype), offsetof(DLTensor, shape),
         offsetof(DLTensor, strides), offsetof(DLTensor, byte_offset));
  printf("%d %d %d %d %d %d %d %d %d %d\n", DLPACK_MAJOR_VERSION, kDLCPU, kDLInt, kDLUInt,
         kDLFloat, kDLBfloat, kDLBool, KILN_ARG_INT, KILN_ARG_FLOAT, KILN_ARG_DLTENSOR);
  return 0;
}
"""


def _build(tmp_path: Path, source: str, flags: list[str], compiler: str = "cc") -> Path:
    src = tmp_path / "prog.c"
    src.write_text(source)
    exe = tmp_path / "prog"
    cmd = [compiler, *flags, f"-I{include_dir()}", "-o", str(exe), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"
    return exe


def test_header_is_package_data() -> None:
    header = Path(include_dir()) / "kiln" / "kiln.h"
    assert header.is_file()
    assert "KilnPackedFunc" in header.read_text()


@pytest.mark.parametrize("std", ["c99", "c11", "gnu89"])
def test_header_compiles_warning_free_in_c(tmp_path: Path, std: str) -> None:
    pedantic = [] if std == "gnu89" else ["-pedantic"]
    exe = _build(tmp_path, USE_HEADER, [f"-std={std}", "-Wall", "-Wextra", "-Werror", *pedantic])
    assert subprocess.run([str(exe)], check=False).returncode == 0


@needs("g++", why="a C++ compiler")
def test_header_compiles_as_cplusplus(tmp_path: Path) -> None:
    exe = _build(tmp_path, USE_HEADER, ["-x", "c++", "-Wall", "-Wextra", "-Werror", "-pedantic"],
                 compiler="g++")
    assert subprocess.run([str(exe)], check=False).returncode == 0


def test_ctypes_mirrors_match_the_header(tmp_path: Path) -> None:
    exe = _build(tmp_path, LAYOUT, ["-std=c99", "-Wall", "-Werror"])
    proc = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    lines = proc.stdout.split("\n")
    sizes = [int(v) for v in lines[0].split()]
    assert sizes == [ctypes.sizeof(ctypes_abi.DLDevice), ctypes.sizeof(ctypes_abi.DLDataType),
                     ctypes.sizeof(ctypes_abi.DLTensor), ctypes.sizeof(ctypes_abi.KilnValue)]
    offsets = [int(v) for v in lines[1].split()]
    assert offsets == [getattr(ctypes_abi.DLTensor, f).offset for f in
                       ("data", "device", "ndim", "dtype", "shape", "strides", "byte_offset")]
    consts = [int(v) for v in lines[2].split()]
    assert consts == [1, abi.KDL_CPU, abi.KDL_INT, abi.KDL_UINT, abi.KDL_FLOAT, abi.KDL_BFLOAT,
                      abi.KDL_BOOL, abi.ARG_INT, abi.ARG_FLOAT, abi.ARG_DLTENSOR]


@pytest.mark.parametrize(("code", "bits", "lanes", "name"), [
    (2, 32, 1, "float32"), (0, 64, 1, "int64"), (1, 8, 1, "uint8"), (6, 8, 1, "bool"),
    (4, 16, 1, "bfloat16"), (5, 64, 1, "complex64"), (2, 32, 4, "float32x4"),
    (9, 8, 1, "dtype(code=9, bits=8)"), (3, 64, 1, "handle64"),
])
def test_dtype_names_follow_the_abi(code: int, bits: int, lanes: int, name: str) -> None:
    assert abi.dtype_name(code, bits, lanes) == name

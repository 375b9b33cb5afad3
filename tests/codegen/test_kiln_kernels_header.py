"""kiln_kernels.h, the C helpers generated C calls, is a real C header.

It ships next to kiln.h (package data), compiles on its own with -Werror, and
its helpers compute what the IR defines: checked here against numpy in a C
program that includes the header as it is.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from c_helpers import CC, have_cc

from kiln.codegen.cfamily.dialect import C_DIALECT
from kiln.codegen.cfamily.helpers import KERNEL_HELPERS_FILE, Helpers, kernel_helpers
from kiln.runtime import include_dir

pytestmark = pytest.mark.skipif(not have_cc(), reason="needs a C compiler")

HEADER = Path(include_dir()) / "kiln" / KERNEL_HELPERS_FILE


@pytest.mark.parametrize("std", ["-std=c11", "-std=c99"])
def test_compiles_standalone_with_werror(std: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [CC, std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-x", "c", "-c", str(HEADER),
         "-o", str(tmp_path / "h.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_every_helper_and_its_needs_are_in_the_header() -> None:
    helpers = kernel_helpers()
    assert {"kiln_narrow_float", "kiln_f16_round", "kiln_div_i32", "kiln_pow_u64",
            "kiln_floormod_f64", "kiln_abs_i64"} <= set(helpers)
    text = HEADER.read_text(encoding="utf-8")
    for name, helper in helpers.items():
        code = helper.text(C_DIALECT)
        assert f" {name}(" in code and code in text
        assert set(helper.needs) <= set(helpers), name
    used = Helpers()
    used.use("kiln_bf16_round")  # pulls in what it needs, dependencies first
    names = [line.split("(")[0].split()[-1] for line in used.lines() if line.startswith("static")]
    assert names == ["kiln_narrow_float", "kiln_bf16_from_double", "kiln_bf16_to_float",
                     "kiln_bf16_round"]


PROGRAM = r"""
#include <stdio.h>
#include "kiln/kiln_kernels.h"
int main(void) {
  static const int32_t a[] = {7, -7, 7, -7, 5, -2147483647 - 1, 3};
  static const int32_t b[] = {2, 2, -2, -2, 0, -1, 4};
  static const double f[] = {1.0009765625, 65520.0, -0.1, 3.14159, 1e-8};
  int k;
  for (k = 0; k < 7; ++k) {
    printf("%d %d %d %d\n", kiln_floordiv_i32(a[k], b[k]), kiln_floormod_i32(a[k], b[k]),
           kiln_div_i32(a[k], b[k]), kiln_mod_i32(a[k], b[k]));
  }
  printf("%lld %u\n", (long long)kiln_pow_i64(3, 41), (unsigned)kiln_pow_u32(3u, 25u));
  for (k = 0; k < 5; ++k) {
    printf("%u %u\n", kiln_f16_from_double(f[k]), kiln_bf16_from_double(f[k]));
  }
  return 0;
}
"""


def test_helpers_compute_what_numpy_does(tmp_path: Path) -> None:
    src = tmp_path / "probe.c"
    src.write_text(PROGRAM)
    exe = tmp_path / "probe"
    proc = subprocess.run([CC, "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{include_dir()}",
                           str(src), "-o", str(exe), "-lm"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = subprocess.run([str(exe)], capture_output=True, text=True, check=True
                           ).stdout.splitlines()
    a = np.array([7, -7, 7, -7, 5, -2**31, 3], np.int32)
    b = np.array([2, 2, -2, -2, 0, -1, 4], np.int32)
    with np.errstate(all="ignore"):
        for k in range(7):
            got = [int(v) for v in lines[k].split()]
            if b[k] in (0, -1):  # the IR's definitions where numpy warns or C traps
                assert got[1] == 0 and got[3] == 0
                assert got[0] == got[2] == (0 if b[k] == 0 else np.int32(-a[k]))
                continue
            assert got == [np.floor_divide(a[k], b[k]), np.mod(a[k], b[k]),
                           int(np.trunc(a[k] / b[k])), np.fmod(a[k], b[k])]
    assert [int(v) for v in lines[7].split()] == [
        int(np.int64(3) ** np.int64(41)), int(np.uint32(3) ** np.uint32(25))]
    ml_dtypes = pytest.importorskip("ml_dtypes")
    for k, x in enumerate([1.0009765625, 65520.0, -0.1, 3.14159, 1e-8]):
        f16, bf16 = (int(v) for v in lines[8 + k].split())
        with np.errstate(over="ignore"):  # 65520 rounds to float16's inf
            assert f16 == int(np.array(x).astype(np.float16).view(np.uint16))
        assert bf16 == int(np.array(x).astype(ml_dtypes.bfloat16).view(np.uint16))

"""The int8 dot-product kernels on the c backend (kiln/kernels/int8/dot.py, conv_dot.py,
the `kiln_dot4_u8s8` helper of kiln_kernels.h).

A c target whose ISA has a dot-product family builds the dot form (B packed in words,
`dot4_u8s8` per accumulator, or `dot2_i16` on int16 pairs without VNNI) and equals
onnxruntime exactly. On Cortex-M (`dsp`) the helper is two SMLADs per word:
arm-none-eabi-gcc compiles a model's kernels to them, and the pairing of bytes is
checked on the host against numpy through the Arm ARM's definitions of SMLAD, UXTB16
and SXTB16.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
from test_dot_gemm import host_runs, qlinear_conv, qlinear_matmul
from test_dot_intrinsic import expected, operands

import kiln
from kiln.frontend import from_onnx
from kiln.script import print_module
from support.reference import like_onnxruntime, onnxruntime_outputs
from support.toolchains import find_tool, needs

ort = pytest.importorskip("onnxruntime")
HEADER_DIR = Path(kiln.__file__).parent / "runtime" / "include"


@pytest.mark.parametrize("op", ["matmul", "conv"])
def test_c_dot_form_equals_onnxruntime(op: str) -> None:
    # -mcpu=haswell gives the c target a dot family (avx2); the dot product is the
    # helper's portable C
    target = "c -mcpu=haswell"
    if not host_runs(target):
        pytest.skip(f"this host cannot run {target}")
    rng = np.random.default_rng(4)
    if op == "matmul":
        model = qlinear_matmul(5, 13, 70, True, rng)
        x = rng.integers(-128, 128, (5, 13)).astype(np.int8)
        x[0] = 127
    else:
        model = qlinear_conv((1, 5, 7, 6), 9, 3, 1, 1, False, rng)
        x = rng.integers(0, 256, (1, 5, 7, 6)).astype(np.uint8)
    ex = kiln.compile(from_onnx(model), like_onnxruntime(target))
    # byte words, or int16 pairs (`dot2_i16`) for the exact products without VNNI
    assert re.search(r"T\.dot(4_u8s8|2_i16)", print_module(ex.ir))
    name = "a" if op == "matmul" else "x"
    np.testing.assert_array_equal(ex["main"](x), onnxruntime_outputs(model, {name: x})[0])


@needs("arm-none-eabi-gcc", "arm-none-eabi-objdump", why="make test installs gcc-arm-none-eabi")
def test_cortex_m4_kernels_use_smlad(tmp_path: Path) -> None:
    model = qlinear_matmul(3, 40, 24, False, np.random.default_rng(2))
    ex = kiln.compile(from_onnx(model), "arm/cortex-m4")
    source = next(a for a in ex.artifacts if a.file_name == "kernels.c")
    path = tmp_path / "kernels.c"
    path.write_bytes(source.content)
    assert "kiln_dot4_u8s8" in path.read_text()
    obj = tmp_path / "kernels.o"
    subprocess.run(["arm-none-eabi-gcc", "-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=hard",
                    "-O2", "-std=c99", "-Wall", "-Werror", f"-I{HEADER_DIR}", "-c", str(path),
                    "-o", str(obj)], check=True)
    disassembly = subprocess.run(["arm-none-eabi-objdump", "-d", str(obj)], check=True,
                                 capture_output=True, text=True).stdout
    assert re.search(r"\bsmlad\b", disassembly) and re.search(r"\buxtb16\b", disassembly)


# The ACLE functions kiln_kernels.h calls, as the Arm ARM defines the instructions.
ACLE = """#include <stdint.h>
typedef int32_t int16x2_t;
typedef uint32_t uint16x2_t;
typedef int32_t int8x4_t;
static inline uint16x2_t __uxtb16(uint32_t x) { return x & 0x00FF00FFu; }
static inline int16x2_t __sxtb16(int8x4_t x) {
  uint32_t u = (uint32_t)x;
  uint32_t lo = (uint32_t)(int32_t)(int8_t)(u & 0xFF) & 0xFFFFu;
  uint32_t hi = (uint32_t)(int32_t)(int8_t)((u >> 16) & 0xFF) & 0xFFFFu;
  return (int16x2_t)(lo | (hi << 16));
}
static inline int32_t __smlad(int16x2_t a, int16x2_t b, int32_t acc) {
  int32_t p0 = (int16_t)((uint32_t)a & 0xFFFF) * (int16_t)((uint32_t)b & 0xFFFF);
  int32_t p1 = (int16_t)((uint32_t)a >> 16) * (int16_t)((uint32_t)b >> 16);
  return (int32_t)((uint32_t)acc + (uint32_t)p0 + (uint32_t)p1);
}
"""


@needs(("cc", "gcc"), why="the host C compiler")
def test_smlad_pairing_equals_numpy(tmp_path: Path) -> None:
    acc, a, b = operands()
    (tmp_path / "arm_acle.h").write_text(ACLE)
    rows = ",\n".join(f"{{{x}, {y}, {z}}}" for x, y, z in zip(acc.tolist(), a.tolist(),
                                                               b.tolist()))
    (tmp_path / "main.c").write_text(f"""#include <stdio.h>
#include "kiln/kiln_kernels.h"
static const int64_t ops[][3] = {{{rows}}};
int main(void) {{
  for (unsigned i = 0; i < sizeof ops / sizeof ops[0]; i++)
    printf("%d\\n", (int)kiln_dot4_u8s8((int32_t)ops[i][0], (int32_t)ops[i][1],
                                       (int32_t)ops[i][2]));
  return 0;
}}
""")
    cc = find_tool("cc", "gcc")
    exe = tmp_path / "dot"
    subprocess.run([str(cc), "-std=c11", "-O1", "-Wall", "-Werror", "-D__ARM_FEATURE_SIMD32=1",
                    f"-I{tmp_path}", f"-I{HEADER_DIR}", str(tmp_path / "main.c"), "-o",
                    str(exe)], check=True)
    got = np.array(subprocess.run([str(exe)], capture_output=True, text=True,
                                  check=True).stdout.split(), np.int64).astype(np.int32)
    np.testing.assert_array_equal(got, expected(acc, a, b))

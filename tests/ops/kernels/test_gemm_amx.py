"""The bf16 GEMM on AMX tiles (kiln.kernels.gemm.amx_bf16, kiln.codegen.llvm.amx) for a
`precision=bf16` target with AMX-BF16, built on any host.

One build for `-mcpu=sapphirerapids` holds every case as a branch: remainders of M
(symbolic, 37 rows: one whole and one partial tile of 32), N (70: two panels of 32 and a
partial one) and K (45: part of a second block of 32), Gemm's transB with bias and ReLU
on 16-row tiles (M = 5), a 16-column panel (N = 12), and K = 1030, whose 32 converted
rows would not fit the stack (converted once into a heap buffer instead). Its assembly
holds the tile instructions; its IR, run on the reference interpreter (whose AMX block
is the numpy product of kiln.ir.amx), matches float32 numpy; on a host without AMX its
library is refused at load (in a subprocess: nothing of it runs), and where the host has
AMX it runs natively against the same references. The c backend refuses `precision=bf16`
when the target is built (kiln.target.precision), and the AMX calls with a CompileError.
Tolerances as in test_gemm_bf16.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.artifact.inspect import inspect_artifact
from kiln.errors import CompileError, TargetError
from kiln.frontend import from_onnx
from kiln.ir import IRModule
from kiln.ir import graph as g
from kiln.ir.amx import AMX_TILE_CONFIG
from kiln.ir.tensor import Buffer, CallExtern, Const, PrimFunc, Store
from kiln.ir.types import TensorType
from kiln.kernels.gemm.amx_bf16 import uses_amx
from kiln.kernels.gemm.bf16 import GEMM_BF16
from kiln.ops.registry import call
from kiln.target import Target
from kiln.target.isa import isa_for
from support.bf16_gemms import Case, Weights, gemm_model, gemm_reference
from support.numerics import rel_l2

RNG = np.random.default_rng(630)
TOL, TIGHT = 1e-2, 1e-5
SPR = "llvm -mtriple=x86_64-linux-gnu -mcpu=sapphirerapids -precision=bf16"
CASES: list[Case] = [  # (name, A's shape, K, N, Gemm with transB, bias and ReLU)
    ("remainders", ("M", 45), 45, 70, False),
    ("gemm_16_rows", (5, 64), 64, 40, True),
    ("one_panel", (20, 33), 33, 12, False),
    ("long_k", (20, 1030), 1030, 20, False),  # A's words on the heap, not the stack
]
ROWS = 37  # the symbolic M fed


@pytest.fixture(scope="module")
def built() -> tuple[Any, Weights]:
    model, weights = gemm_model(CASES, RNG)
    return kiln.compile(from_onnx(model), Target(SPR)), weights


def _feeds() -> dict[str, np.ndarray]:
    return {f"x_{name}": RNG.standard_normal((ROWS, *shape[1:]) if shape[0] == "M"
                                             else shape).astype(np.float32)
            for name, shape, *_ in CASES}


def _check(outs: list[np.ndarray], feeds: dict[str, np.ndarray],
           weights: Weights) -> None:
    for (name, *_), got in zip(CASES, outs):
        w, bias = weights[name]
        x = feeds[f"x_{name}"]
        assert rel_l2(got, gemm_reference(x, w, bias, False)) <= TOL, name
        assert rel_l2(got, gemm_reference(x, w, bias, True)) <= TIGHT, name


def test_the_target_chooses_amx_through_mcpu_or_mattr() -> None:
    for spec in (SPR, "llvm -mcpu=znver5 -mattr=+amx-tile,+amx-bf16 -precision=bf16"):
        assert uses_amx(isa_for(Target(spec))), spec
    assert not uses_amx(isa_for(Target("llvm -mcpu=sapphirerapids")))  # f32: no AMX


def test_amx_tiles_are_packed_16_or_32_wide() -> None:
    x = g.Var("x", TensorType((100, 45), "float32"))
    w = g.Constant(RNG.standard_normal((45, 12)).astype(np.float32), "w")
    packed = GEMM_BF16.pack(call("matmul", x, w), isa_for(Target(SPR)))
    assert packed.attrs["tile"] == (32, 16)
    bp = packed.args[1]
    assert isinstance(bp, g.Constant)
    assert bp.data.shape == (1, 32, 16)  # [panels][words of K: 2 blocks][16 columns]


def test_assembly_holds_the_tile_instructions(built: Any) -> None:
    ex, _ = built
    kernels = next(a for a in ex.artifacts if a.file_name == "kernels.o")
    asm = inspect_artifact(kernels, "asm")
    for op in ("ldtilecfg", "tileloadd", "tdpbf16ps", "tilestored", "tilerelease"):
        assert re.search(rf"\b{op}\b", asm), op
    text = ex.ir.script()
    assert "__kiln_amx_bf16_2x2" in text and "__kiln_amx_bf16_1x2" in text
    assert "__kiln_amx_bf16_2x1" in text
    assert re.search(r'a_bf16 = T\.allocate\(\(32, 528\), "int32", scope="global"\)', text)


def test_amx_kernels_on_the_interpreter(built: Any) -> None:
    ex, weights = built
    feeds = _feeds()
    outs = [np.zeros((*x.shape[:-1], n), np.float32)
            for x, (_, _, _, n, _) in zip(feeds.values(), CASES)]
    kiln.evaluate(ex.ir, "main", *feeds.values(), *outs, ROWS)
    _check(outs, feeds, weights)


def _host_has_amx() -> bool:
    return uses_amx(isa_for(Target("host -precision=bf16"))) if _bf16_host() else False


def _bf16_host() -> bool:
    try:
        Target("host -precision=bf16")
    except TargetError:
        return False
    return True


_LOAD = ("import sys, kiln\n"
         "try:\n"
         "    kiln.runtime.load_module(sys.argv[1])\n"
         "except kiln.errors.KilnError as e:\n"
         "    print(type(e).__name__ + ':', e); sys.exit(3)\n"
         "print('loaded')\n")


def test_amx_library_refused_or_run(built: Any, tmp_path: Path) -> None:
    """Without AMX the loader refuses the library (naming AMX); with it, it runs."""
    ex, weights = built
    lib = ex.export_library(tmp_path / "amx.so")
    if not _host_has_amx():
        proc = subprocess.run([sys.executable, "-c", _LOAD, str(lib)], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 3, (proc.returncode, proc.stdout, proc.stderr)
        assert proc.stdout.startswith("CPUFeatureError:") and "amx-tile" in proc.stdout
        return
    feeds = _feeds()
    _check([np.asarray(o) for o in kiln.runtime.load_module(lib)["main"](*feeds.values())],
           feeds, weights)


def test_c_backend_refuses_bf16_and_the_amx_calls() -> None:
    with pytest.raises(TargetError, match="code generator"):
        Target("c -mcpu=sapphirerapids -precision=bf16")
    out = Buffer("out", (1,), "int32")
    body = Store(out, CallExtern(AMX_TILE_CONFIG, (), "int32"), (Const(0, "int64"),))
    with pytest.raises(CompileError, match="llvm backend only"):
        kiln.compile(IRModule({"f": PrimFunc((out,), body)}), "c")

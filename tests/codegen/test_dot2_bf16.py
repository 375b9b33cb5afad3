"""The `dot2_bf16` intrinsic (two bfloat16 products per int32 word added to a float32,
kiln.ir.tensor; the bf16 GEMM's step, kiln.kernels.gemm.bf16) and `bf16_pair` (the
words it reads, two float32 values rounded to bfloat16), in one loop: on the reference
interpreter and llvm against numpy, one `vdpbf16ps` and one `vcvtne2ps2bf16` per 16
lanes on an AVX512-BF16 target, the float32 and integer forms elsewhere (llvm's
`znver3`), through kiln.script and back; `bf16_pair` on vectors of 8 and 4 lanes (the
word rows of half and quarter blocks) one `vcvtne2ps2bf16` too."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.codegen.constants import ConstantPool
from kiln.codegen.cpu_requirements import required_features
from kiln.codegen.llvm.codegen import compile_module
from kiln.ir import IRModule, assert_structural_equal, evaluate
from kiln.ir import tensor as tir
from kiln.ops.gemm_bf16 import bf16_round
from kiln.script import from_source, print_module
from kiln.target import Target
from kiln.target.host import host_triple
from kiln.target.llvm_features import llvm_binding
from kiln.transform.vectorize_loops import VectorizeLoops

N = 37  # not a multiple of the instruction's 16 lanes
SPR = "llvm -mtriple=x86_64-linux-gnu -mcpu=sapphirerapids"


def _module(n: int = N) -> IRModule:
    acc, out = tir.Buffer("acc", (n,), "float32"), tir.Buffer("out", (n,), "float32")
    a, b = tir.Buffer("a", (n,), "int32"), tir.Buffer("b", (n,), "int32")
    lo, hi = tir.Buffer("lo", (n,), "float32"), tir.Buffer("hi", (n,), "float32")
    pairs = tir.Buffer("pairs", (n,), "int32")
    i = tir.Var("i", "int64")
    dot = tir.Store(out, tir.Intrin(tir.DOT2_BF16, (acc[i], a[i], b[i])), (i,))
    pair = tir.Store(pairs, tir.Intrin(tir.BF16_PAIR, (lo[i], hi[i])), (i,))
    body = tir.For(i, tir.Const(0, "int64"), tir.Const(n, "int64"), "vectorized",
                   tir.seq(dot, pair))
    return IRModule({"dot": tir.PrimFunc((acc, a, b, out, lo, hi, pairs), body)})


def _operands(n: int = N) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(7)
    acc = rng.standard_normal(n).astype(np.float32)
    a, b = (bf16_round(rng.standard_normal(2 * n).astype(np.float32)).view(np.uint32) >> 16
            for _ in range(2))
    words = [(x[0::2] | (x[1::2] << 16)).astype(np.uint32).view(np.int32) for x in (a, b)]
    lo, hi = (rng.standard_normal(n).astype(np.float32) * 1e3 for _ in range(2))
    # ties to even both ways, a NaN, infinities and a signed zero (as many as fit)
    special = np.array([0x3F808000, 0x3F818000, 0x7FC00000, 0x7F800000, 0x80000000,
                        0xC0FFFFFF], np.uint32).view(np.float32)
    lo[:6] = special[:n]
    hi[:3] = np.array([0x3F818000, 0xFF800000, 0x7F7FFFFF], np.uint32).view(np.float32)
    return acc, words[0], words[1], lo, hi


def _pairs(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """bfloat16 `lo` in each word's low half, `hi` in its high half."""
    low, high = (bf16_round(x).view(np.uint32) for x in (lo, hi))
    return ((low >> 16) | (high & 0xFFFF0000)).view(np.int32)


def _expected(acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    def halves(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        u = w.view(np.uint32)
        return (u & 0xFFFF0000).view(np.float32), (u << 16).view(np.float32)

    (ah, al), (bh, bl) = halves(a), halves(b)
    return (acc + ah * bh) + al * bl  # float32, the high half first (vdpbf16ps's order)


def _check(run: Callable[..., Any], n: int = N) -> None:
    """`run(*operands, out, pairs)` fills both outputs as numpy computes them."""
    acc, a, b, lo, hi = _operands(n)
    out, pairs = np.zeros(n, np.float32), np.zeros(n, np.int32)
    run(acc, a, b, out, lo, hi, pairs)
    np.testing.assert_array_equal(out, _expected(acc, a, b))
    np.testing.assert_array_equal(pairs, _pairs(lo, hi))


def test_interpreter_and_script() -> None:
    _check(lambda *args: evaluate(_module(), "dot", *args))
    text = print_module(_module())
    assert "T.dot2_bf16(" in text and "T.bf16_pair(" in text
    assert_structural_equal(from_source(text), _module())


def _assembly(target: str, n: int = N) -> str:
    with Target(target):  # the pass makes the lane loop a vector loop
        mod = VectorizeLoops()(_module(n))
    compiled = compile_module(mod, Target(target), prefix="kiln_",
                              pool=ConstantPool.from_module(mod))
    return str(compiled.target_machine.emit_assembly(compiled.module))


def _lacks(target: str) -> list[str]:
    """The features the library for `target` requires that LLVM says this host lacks
    (an AMD CPU's sse4a on an Intel host too, which the ISA object does not probe)."""
    t = Target(target)
    cpu, triple = str(t.get("mcpu") or ""), str(t.get("mtriple") or host_triple())
    host = dict(llvm_binding().get_host_cpu_features())
    return [f for f in required_features(triple, cpu, "") if host.get(f) is False]


@pytest.mark.parametrize(("target", "bf16"), [(SPR, True), ("llvm -mcpu=znver4", True),
                                                 ("llvm -mcpu=znver3", False)])
def test_llvm(target: str, bf16: bool) -> None:
    # 37 lanes: vdpbf16ps on whole vectors of 16, the rest however LLVM splits it
    assembly = _assembly(target)
    for instruction in ("vdpbf16ps", "vcvtne2ps2bf16"):
        found = len(re.findall(rf"\b{instruction}\b", assembly))
        assert found >= 2 if bf16 else found == 0
    if _lacks(target):  # every feature the library records, not only the ISA's
        pytest.skip(f"this host lacks {', '.join(_lacks(target))} of {target}: compiled only")
    # exact: the products of bfloat16 values are exact in float32, the operands normal
    _check(kiln.compile(_module(), target)["dot"])


@pytest.mark.parametrize("n", [8, 4])
@pytest.mark.parametrize(("target", "bf16"), [("llvm -mcpu=znver4", True),
                                                 ("llvm -mcpu=znver3", False)])
def test_llvm_narrow_pairs(n: int, target: str, bf16: bool) -> None:
    """A vector of 8 or 4 lanes (fewer than one instruction's 16) rounds its words with one
    `vcvtne2ps2bf16` on its lanes widened, not the integer form, to the same words (ties
    to even, the NaN, the infinities); without AVX512-BF16 (`znver3`) the integer form."""
    found = len(re.findall(r"\bvcvtne2ps2bf16\b", _assembly(target, n)))
    assert found == (1 if bf16 else 0)
    if _lacks(target):
        pytest.skip(f"this host lacks {', '.join(_lacks(target))} of {target}: compiled only")
    _check(kiln.compile(_module(n), target)["dot"], n)

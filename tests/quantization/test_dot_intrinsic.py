"""The `dot4_u8s8` intrinsic (4 u8 x s8 products added to an int32) on the reference
interpreter, c and llvm, exact against numpy; on llvm it becomes the dot-product
instructions of the target's ISA (vpdpbusd, vpmaddwd on int16 halves, sdot, usdot)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import kiln
from kiln.codegen.constants import ConstantPool
from kiln.codegen.llvm.codegen import compile_module
from kiln.errors import IRError
from kiln.ir import IRModule, evaluate
from kiln.ir.structural import assert_structural_equal
from kiln.ir.tensor import Buffer, Const, For, Intrin, PrimFunc, Store, Var
from kiln.ir.verify import verify
from kiln.script import from_source, print_module
from kiln.target import Target
from kiln.target.isa import isa_for
from kiln.transform.vectorize_loops import VectorizeLoops

N = 37  # not a multiple of any instruction's lanes: the last chunk is partial


def dot_module(kind: str = "vectorized") -> IRModule:
    acc, a, b, out = (Buffer(n, (N,), "int32") for n in ("acc", "a", "b", "out"))
    i = Var("i", "int64")
    body = For(i, Const(0, "int64"), Const(N, "int64"), kind,
               Store(out, Intrin("dot4_u8s8", (acc[i], a[i], b[i])), (i,)))
    return IRModule({"dot": PrimFunc((acc, a, b, out), body)})


def operands() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    acc, a, b = (rng.integers(-2 ** 31, 2 ** 31, N, dtype=np.int64).astype(np.int32)
                 for _ in range(3))
    # the int16 saturation case of vpmaddubsw: 255 * -128 twice per pair
    a[0], b[0] = -1, np.uint32(0x80808080).view(np.int32)
    a[1], b[1] = -1, 0x7F7F7F7F
    acc[2] = 2 ** 31 - 1  # the accumulator wraps
    a[2], b[2] = -1, 0x7F7F7F7F
    return acc, a, b


def expected(acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    products = (a.view(np.uint8).reshape(-1, 4).astype(np.int64)
                * b.view(np.int8).reshape(-1, 4).astype(np.int64)).sum(axis=1)
    return ((acc.astype(np.int64) + products) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


def run(target: str, kind: str = "vectorized") -> np.ndarray:
    out = np.zeros(N, np.int32)
    kiln.compile(dot_module(kind), target)["dot"](*operands(), out)
    return out


def assembly(target: str, module: IRModule | None = None) -> str:
    with Target(target):  # the pass makes the lane loop a vector loop
        mod = VectorizeLoops()(module or dot_module())
    compiled = compile_module(mod, Target(target), prefix="kiln_",
                              pool=ConstantPool.from_module(mod))
    return str(compiled.target_machine.emit_assembly(compiled.module))


def host_runs(target: str) -> bool:
    """Whether this host has every feature (of those an ISA decision reads) of `target`."""
    return isa_for(Target(target)).features <= isa_for(Target.from_host()).features


def test_interpreter() -> None:
    out = np.zeros(N, np.int32)
    evaluate(dot_module(), "dot", *operands(), out)
    np.testing.assert_array_equal(out, expected(*operands()))


@pytest.mark.parametrize("target,kind", [("c", "vectorized"), ("llvm", "vectorized"),
                                         ("llvm", "serial")])
def test_portable(target: str, kind: str) -> None:
    np.testing.assert_array_equal(run(target, kind), expected(*operands()))


@pytest.mark.parametrize("cpu,feature,instructions", [
    ("znver4", "avx512vnni", {"vpdpbusd"}),
    ("haswell", "avx2", {"vpmaddwd"}),
    ("skylake-avx512", "avx512bw", {"vpmaddwd"}),
])
def test_x86_instructions(cpu: str, feature: str, instructions: set[str]) -> None:
    target = f"llvm -mcpu={cpu}"
    found = set(re.findall(r"\b(vpdpbusd|vpmaddubsw|vpmaddwd)\b", assembly(target)))
    assert found == instructions
    if not host_runs(target):
        pytest.skip(f"this host lacks {cpu}'s features: compile-only")
    np.testing.assert_array_equal(run(target), expected(*operands()))


@pytest.mark.parametrize("mattr,instruction", [("+dotprod", "sdot"),
                                               ("+dotprod,+i8mm", "usdot")])
def test_aarch64_instructions(mattr: str, instruction: str) -> None:
    asm = assembly(f"llvm -mtriple=aarch64-linux-gnu -mattr={mattr}")
    assert re.search(rf"\b{instruction}\b", asm)


def test_script_round_trip_and_verify() -> None:
    mod = dot_module()
    text = print_module(mod)
    assert "T.dot4_u8s8(" in text
    assert_structural_equal(from_source(text), mod)
    x = Buffer("x", (N,), "int64")
    i = Var("i", "int64")
    bad = For(i, Const(0, "int64"), Const(N, "int64"), "serial",
              Store(x, Intrin("dot4_u8s8", (x[i], x[i], x[i])), (i,)))
    with pytest.raises(IRError, match=r"dot4_u8s8.*int32"):
        verify(IRModule({"bad": PrimFunc((x,), bad)}))

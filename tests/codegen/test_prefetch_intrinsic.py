"""The `prefetch` intrinsic (a hint that a buffer element is read soon): the verifier's
rules, the interpreter's bounds check, kiln.script text, and the llvm and c backends,
which emit the CPU's prefetch instruction and leave every result as it was."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.errors import CallError, IRError
from kiln.ir import IRModule, evaluate, verify
from kiln.ir.structural import assert_structural_equal
from kiln.ir.tensor import (
    Buffer,
    Const,
    Evaluate,
    For,
    Intrin,
    PrimFunc,
    Store,
    Var,
    const,
    min_,
    seq,
)
from kiln.script import from_source, print_module

N = 64
AHEAD = 16  # elements: one 64-byte line of float32


def doubling(dtype: str, ahead: int = AHEAD, clamp: bool = True) -> IRModule:
    """out[i] = a[i] * 2, each iteration prefetching `a` `ahead` elements on (clamped to
    the last element unless `clamp` is off)."""
    a, out = Buffer("a", (N,), dtype), Buffer("out", (N,), dtype)
    i = Var("i", "int64")
    nxt = i + ahead
    if clamp:
        nxt = min_(nxt, const(N - 1))
    body = seq(Evaluate(Intrin("prefetch", (a[nxt],))),
               Store(out, a[i] * Const(2, dtype), (i,)))
    loop = For(i, const(0), const(N), "serial", body)
    return IRModule({"double": PrimFunc((a, out), loop)})


def operand(dtype: str) -> np.ndarray:
    return np.arange(N, dtype=dtype) - 7


@pytest.mark.parametrize("dtype", ["float32", "int32", "uint8"])
@pytest.mark.parametrize("target", ["llvm", "c"])
def test_results_are_unchanged_on_native_backends(target: str, dtype: str) -> None:
    ex = kiln.compile(doubling(dtype), target)
    out = np.zeros(N, dtype)
    ex["double"](operand(dtype), out)
    np.testing.assert_array_equal(out, operand(dtype) * np.asarray(2, dtype))


@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs binutils' objdump")
@pytest.mark.parametrize("target", ["llvm", "c"])
def test_the_library_holds_a_prefetch_instruction(target: str, tmp_path: Path) -> None:
    """x86-64: `prefetcht0` (locality 3, a read); other hosts name it otherwise."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("checks the x86-64 instruction")
    so = tmp_path / "lib.so"
    kiln.compile(doubling("float32"), target).export_library(so)
    asm = subprocess.run(["objdump", "-d", str(so)], capture_output=True, text=True,
                         check=True).stdout
    assert "prefetcht0" in asm


def test_the_c_source_names_the_macro() -> None:
    ex = kiln.compile(doubling("float32"), "c")
    source = next(a.content.decode() for a in ex.artifacts if a.file_name == "kernels.c")
    assert "#define KILN_PREFETCH(p) __builtin_prefetch((p), 0, 3)" in source
    assert "KILN_PREFETCH(&" in source


def test_interpreter_checks_the_element_is_in_bounds() -> None:
    out = np.zeros(N, np.float32)
    evaluate(doubling("float32"), "double", operand("float32"), out)
    np.testing.assert_array_equal(out, operand("float32") * 2)
    with pytest.raises(CallError, match="load from buffer 'a': index 64 is out of bounds"):
        evaluate(doubling("float32", clamp=False), "double", operand("float32"), out)


def test_script_round_trip() -> None:
    mod = doubling("float32")
    text = print_module(mod)
    assert "T.evaluate(T.prefetch(a[" in text
    assert_structural_equal(from_source(text), mod)


def test_verifier_rules() -> None:
    a, out = Buffer("a", (N,), "float32"), Buffer("out", (N,), "float32")
    i = Var("i", "int64")

    def module(body: object) -> IRModule:
        loop = For(i, const(0), const(N), "serial", body)  # type: ignore[arg-type]
        return IRModule({"f": PrimFunc((a, out), loop)})

    verify(doubling("float32"))
    with pytest.raises(IRError, match="prefetch' is valid only as the value of an Evaluate"):
        verify(module(Store(out, Intrin("prefetch", (a[i],)), (i,))))
    with pytest.raises(IRError, match="prefetch' takes a buffer element"):
        verify(module(Evaluate(Intrin("prefetch", (a[i] * 2.0,)))))
    # the element is checked as any load's
    with pytest.raises(IRError, match="undefined buffer 'b'"):
        verify(module(Evaluate(Intrin("prefetch", (Buffer("b", (N,), "float32")[i],)))))

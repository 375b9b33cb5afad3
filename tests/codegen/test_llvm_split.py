"""The llvm codegen's threaded compile: a large module split into parts (codegen.llvm.parallel).

The split is forced on a small model (several kernels) and checked against the
one-module build: the same outputs bit for bit in this process and from the
exported library in a fresh process, kernel symbols still hidden (the parts
are linked into one library), and the merged kernels.bc defines every kernel.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.codegen.llvm import codegen as llvm_codegen
from kiln.codegen.llvm.target_machine import llvm_binding
from kiln.frontend import from_onnx
from kiln.runtime.dynsym import dynamic_symbols
from kiln.transform import PassContext
from support.graphs import GraphBuilder

RNG = np.random.default_rng(5)
X = RNG.standard_normal((1, 3, 12, 12)).astype(np.float32)


def model() -> bytes:
    """conv -> relu -> conv -> global pool -> Gemm: a handful of distinct kernels."""
    b = GraphBuilder()
    b.consts({n: RNG.standard_normal(s).astype(np.float32)
              for n, s in (("w1", (8, 3, 3, 3)), ("w2", (8, 8, 3, 3)), ("fc", (5, 8)))})
    b.node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1])
    b.node("Relu", ["c1"], ["r1"])
    b.node("Conv", ["r1", "w2"], ["c2"], pads=[1, 1, 1, 1])
    b.node("GlobalAveragePool", ["c2"], ["p"])
    b.node("Flatten", ["p"], ["f"])
    b.node("Gemm", ["f", "fc"], ["y"], transB=1)
    b.input("x", list(X.shape))
    b.output("y", [1, 5])
    return b.model(name="split").SerializeToString()


MODEL = model()


def _compile() -> kiln.driver.Executable:
    with PassContext(config={"kiln.cache": False}):
        return kiln.compile(from_onnx(MODEL), kiln.Target.from_host())


@pytest.fixture(scope="module")
def whole() -> kiln.driver.Executable:
    return _compile()


@pytest.fixture(scope="module")
def split() -> kiln.driver.Executable:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(llvm_codegen, "SPLIT_MIN_INSTRUCTIONS", 0)
        mp.setattr(llvm_codegen, "compile_threads", lambda: 2)
        return _compile()


def _objects(ex: kiln.driver.Executable) -> list[str]:
    return [a.file_name for a in ex.artifacts if a.file_name.endswith(".o")]


def test_the_split_build_has_several_objects_and_the_same_results(
        whole: kiln.driver.Executable, split: kiln.driver.Executable) -> None:
    assert _objects(whole) == ["kernels.o"]
    assert len(_objects(split)) > 1 and _objects(split)[0] == "kernels.o"
    assert split["main"](X).tobytes() == whole["main"](X).tobytes()


def test_the_exported_split_library_runs_in_a_fresh_process_with_hidden_kernels(
        whole: kiln.driver.Executable, split: kiln.driver.Executable, tmp_path: Path) -> None:
    lib = split.export_library(tmp_path / "model.so")
    names = {s[0] for s in dynamic_symbols(str(lib))}
    assert not any("kernel" in n for n in names), sorted(names)
    script = ("import sys, numpy as np; from kiln.runtime import load_module\n"
              "x = np.frombuffer(bytes.fromhex(sys.argv[2]), np.float32).reshape(1, 3, 12, 12)\n"
              "with load_module(sys.argv[1]) as m: print(m['main'](x).tobytes().hex())")
    proc = subprocess.run([sys.executable, "-c", script, str(lib), X.tobytes().hex()],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert bytes.fromhex(proc.stdout.strip()) == whole["main"](X).tobytes()


def test_the_merged_bitcode_defines_every_kernel(split: kiln.driver.Executable) -> None:
    (bc,) = [a for a in split.artifacts if a.file_name == "kernels.bc"]
    mod = llvm_binding().parse_bitcode(bytes(bc.content))
    mod.verify()
    defined = {f.name for f in mod.functions if not f.is_declaration}
    assert set(bc.metadata["functions"]) <= defined


def test_split_declares_the_other_parts_functions_and_keeps_a_defined_global_whole() -> None:
    from llvmlite import ir

    from kiln.codegen.llvm.parallel import split_module_text

    module = ir.Module("m")
    i32 = ir.IntType(32)
    for name in ("f", "g"):
        fn = ir.Function(module, ir.FunctionType(i32, []), name)
        ir.IRBuilder(fn.append_basic_block()).ret(ir.Constant(i32, 1))
    texts = split_module_text(module, 2)
    assert len(texts) == 2
    assert [t.count("define") for t in texts] == [1, 1]
    assert all(t.count("declare") == 1 for t in texts)
    table = ir.GlobalVariable(module, i32, "table")
    table.initializer = ir.Constant(i32, 7)
    (whole,) = split_module_text(module, 2)
    assert whole.count("define") == 2 and "declare" not in whole

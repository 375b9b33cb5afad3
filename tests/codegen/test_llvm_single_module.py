"""The llvm codegen gives one kernels.o for many kernels, without starting a thread.

llvmlite serialises every call into LLVM with one lock, so the code generation uses
no threads (docs/codegen-llvm.md, "Parts on every core": parts, where there are, go to
forked processes): a model of several kernels gives one kernels.o, the compile
starts no thread but the one that asks LLVM for the CPU's features while the passes
run in Python (`kiln.codegen.llvm.codegen.prepare_llvm`, joined before the code
generation) and the one hashing the weights beside it (`ConstantPool.hash_in_background`),
the bitcode defines every kernel, and the library computes what
onnxruntime computes.
"""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest

import kiln
from kiln.codegen.llvm.target_machine import llvm_binding
from kiln.frontend import from_onnx
from kiln.transform import PassContext
from support.graphs import GraphBuilder
from support.reference import onnxruntime_outputs

pytest.importorskip("onnxruntime")

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
    return b.model(name="kernels").SerializeToString()


#: The threads a compile starts beside its main thread (see the module docstring).
BESIDE = ("kiln-prepare-llvm", "kiln-weights-hash")


def test_many_kernels_compile_to_one_object_without_a_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = model()

    start = threading.Thread.start

    def refuse(thread: threading.Thread) -> None:
        if thread.name not in BESIDE:
            raise AssertionError(f"the compile started a thread: {thread!r}")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with PassContext(config={"kiln.cache": False}):  # no cache writer thread either
        ex = kiln.compile(from_onnx(data), kiln.Target.from_host())
    monkeypatch.undo()
    assert [a.file_name for a in ex.artifacts if a.file_name.endswith(".o")] == ["kernels.o"]
    (bc,) = [a for a in ex.artifacts if a.file_name == "kernels.bc"]
    mod = llvm_binding().parse_bitcode(bytes(bc.content))
    mod.verify()
    defined = {f.name for f in mod.functions if not f.is_declaration}
    assert len(bc.metadata["functions"]) > 3
    assert set(bc.metadata["functions"]) <= defined
    (expected,) = onnxruntime_outputs(onnx.load_from_string(data), {"x": X})
    np.testing.assert_allclose(ex["main"](X), expected, rtol=1e-5, atol=1e-5)

"""The llvmjit codegen and loader: artifacts, save and reload, bad inputs."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from llvm_helpers import PREFIX, jit

from kiln.artifact import Artifact, ArtifactSet
from kiln.codegen.constants import ConstantPool
from kiln.codegen.llvm import codegen_llvmjit
from kiln.codegen.llvm.jit_loader import LLVMJITModule, load_llvmjit
from kiln.codegen.naming import library_metadata
from kiln.errors import CallError, FormatError, KilnError
from kiln.ir import IRBuilder, IRModule
from kiln.ir.tensor import Cast
from kiln.runtime import LoadContext, load_artifacts
from kiln.target import Target

W = np.arange(6, dtype=np.float32).reshape(2, 3)


def _module() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("addw"):
        x = ib.arg("X", (2, 3), "float32")
        y = ib.arg("Y", (2, 3), "float32")
        with ib.alloc_const("W", W) as w, ib.for_range(2, name="i") as i, \
                ib.for_range(3, name="j") as j:
            ib.store(y, [i, j], x[i, j] + w[i, j])
    with ib.prim_func("count", {"kiln.graph": True, "kiln.num_outputs": 1}):
        n = ib.scalar_arg("n", "int32")
        y = ib.arg("Y", (4,), "int32")
        with ib.for_range(4, name="i") as i:
            ib.store(y, [i], Cast("int32", i) * n)
    return ib.get()


def _artifacts(prefix: str = PREFIX) -> list[Artifact]:
    mod = _module()
    return codegen_llvmjit(mod, Target("llvmjit"), prefix=prefix,
                           pool=ConstantPool.from_module(mod))


def _check_runs(m: object) -> None:
    x = np.ones((2, 3), np.float32)
    y = np.zeros((2, 3), np.float32)
    m["addw"](x, y)  # type: ignore[index]
    np.testing.assert_array_equal(y, W + 1)
    out = m["count"](3)  # type: ignore[index]
    np.testing.assert_array_equal(out, [0, 3, 6, 9])


def test_artifacts_and_direct_load() -> None:
    arts = _artifacts()
    assert [(a.codegen_id, a.loader, a.file_name) for a in arts] == [
        ("llvmjit", "llvmjit", "module.bc"), ("llvmjit", "llvmjit", "constants.bin")]
    meta = arts[0].metadata
    assert meta["prefix"] == PREFIX and meta["metadata"]["functions"]["addw"]["kind"] == "tensor"
    assert meta["kernels"] == {"addw": "kiln__kernel_addw", "count": "kiln__kernel_count"}
    m = load_llvmjit(arts, LoadContext(prefix=PREFIX))
    assert isinstance(m, LLVMJITModule) and m.kind == "llvmjit"
    assert sorted(m.function_names()) == ["addw", "count"]
    _check_runs(m)
    assert re.search(r"define noundef i32 @kiln__kernel_addw\(ptr", m.inspect_source("ll"))
    assert "kiln__kernel_addw:" in m.inspect_source("asm")


def test_through_the_runtime_loading_process_and_a_tar(tmp_path: Path) -> None:
    arts = ArtifactSet(_artifacts())
    meta = library_metadata(_module(), PREFIX)
    _check_runs(load_artifacts(arts, metadata=meta, prefix=PREFIX))
    # The bitcode is the saved form: archive it, reload it in a fresh interpreter.
    from kiln.artifact import archive

    path = tmp_path / "model.tar"
    archive.write_tar(path, arts, meta)
    # Bitcode needs the compiler, which registers the llvmjit loader when imported.
    script = textwrap.dedent(f"""
        import numpy as np
        import kiln.codegen
        from kiln.runtime import load_module
        m = load_module({str(path)!r})
        y = np.zeros((2, 3), np.float32)
        m["addw"](np.ones((2, 3), np.float32), y)
        print(y.ravel().tolist(), m["count"](2).tolist())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=False)
    assert out.stdout.strip() == "[1.0, 2.0, 3.0, 4.0, 5.0, 6.0] [0, 2, 4, 6]", out.stderr


def test_reloading_copied_bytes_gives_the_same_results() -> None:
    arts = _artifacts()
    copies = [Artifact(a.codegen_id, a.loader, a.file_name, bytes(a.content), dict(a.metadata))
              for a in arts]
    first, second = load_llvmjit(arts), load_llvmjit(copies)
    _check_runs(first)
    _check_runs(second)
    # Two engines with the same prefix bind their constants independently.
    assert first.kernel_address("addw") != second.kernel_address("addw")


def test_functions_stop_at_module_close() -> None:
    m = jit(_module())
    fn = m["count"]
    np.testing.assert_array_equal(fn(1), [0, 1, 2, 3])
    m.close()
    with pytest.raises(KilnError, match="no function 'count'"):
        m["count"]
    with pytest.raises(CallError, match="count: the llvmjit module is closed"):
        fn(1)


def test_arguments_are_checked_before_the_kernel_runs() -> None:
    m = jit(_module())
    with pytest.raises(KilnError, match=r"addw: argument 1 'Y': expected shape"):
        m["addw"](np.ones((2, 3), np.float32), np.zeros((3, 2), np.float32))
    with pytest.raises(KilnError, match=r"expected 2 arguments, got 1|argument"):
        m["addw"](np.ones((2, 3), np.float32))


def test_loader_rejects_bad_artifacts() -> None:
    bc, consts = _artifacts()
    with pytest.raises(FormatError, match=r"no module\.bc among the artifacts"):
        load_llvmjit([consts])
    with pytest.raises(FormatError, match=r"the kernels read constants .* no constants\.bin"):
        load_llvmjit([bc])
    broken = Artifact(bc.codegen_id, bc.loader, bc.file_name, b"BC\xc0\xde" + b"\0" * 32,
                      dict(bc.metadata))
    with pytest.raises(FormatError, match="not valid LLVM bitcode"):
        load_llvmjit([broken, consts])
    newer = Artifact(bc.codegen_id, bc.loader, bc.file_name, bc.content,
                     {**bc.metadata, "version": 99})
    with pytest.raises(FormatError, match="metadata version 99 is not supported"):
        load_llvmjit([newer, consts])
    foreign = Artifact(bc.codegen_id, bc.loader, bc.file_name, bc.content,
                       {**bc.metadata, "triple": "aarch64-unknown-linux-gnu"})
    if not foreign.metadata["triple"].startswith(_host_arch()):
        with pytest.raises(KilnError, match="compiled for aarch64-unknown-linux-gnu"):
            load_llvmjit([foreign, consts])
    extra = Artifact("llvmjit", "llvmjit", "other.txt", b"x")
    with pytest.raises(FormatError, match="unexpected artifact"):
        load_llvmjit([bc, consts, extra])


def test_missing_cpu_feature_is_refused() -> None:
    from kiln.codegen.llvm.target_machine import llvm_binding

    host = dict(llvm_binding().get_host_cpu_features())
    absent = sorted(name for name, on in host.items() if not on)
    if not absent:
        pytest.skip("this CPU has every feature LLVM knows")
    bc, consts = _artifacts()
    needy = Artifact(bc.codegen_id, bc.loader, bc.file_name, bc.content,
                     {**bc.metadata, "features": f"+{absent[0]}"})
    with pytest.raises(KilnError, match=f"needs CPU feature\\(s\\) {absent[0]}"):
        load_llvmjit([needy, consts])


def _host_arch() -> str:
    from kiln.codegen.llvm.target_machine import llvm_binding

    return str(llvm_binding().get_process_triple()).split("-")[0]

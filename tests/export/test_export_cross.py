"""export_library picks the compiler the target needs: a cross compiler for an
aarch64 tag, with no CC set; a missing one names the package to install."""

from __future__ import annotations

import platform
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import kiln
from kiln.errors import FormatError, MissingDependencyError
from kiln.ir import IRBuilder
from support.toolchains import needs

EM_AARCH64 = 183


def _module() -> kiln.ir.IRModule:
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (16,), "float32")
        ib.ret(ib.emit(kiln.ops.call("relu", x), "y"))
    return ib.get()


def _machine(path: Path) -> int:
    head = path.read_bytes()[:20]
    assert head[:4] == b"\x7fELF"
    return int(struct.unpack_from("<H", head, 18)[0])


needs_cross = needs("aarch64-linux-gnu-gcc", why="make test installs it")


@needs_cross
@pytest.mark.parametrize("target", ["raspberry-pi/4b-aarch64", "c -mtriple=aarch64-linux-gnu"])
def test_aarch64_library_without_cc(tmp_path: Path, target: str,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CC", raising=False)
    ex = kiln.compile(_module(), target)
    so = ex.export_library(tmp_path / "m.so")
    assert _machine(Path(so)) == EM_AARCH64
    a = ex.export_library(tmp_path / "m.a")
    members = subprocess.run(["aarch64-linux-gnu-objdump", "-f", str(a)], capture_output=True,
                             text=True, check=True).stdout
    assert "aarch64" in members


@needs_cross
@pytest.mark.skipif(platform.machine() != "x86_64", reason="loads an aarch64 library on x86_64")
def test_loading_a_library_for_another_machine_names_both(tmp_path: Path) -> None:
    so = kiln.compile(_module(), "raspberry-pi/4b-aarch64").export_library(tmp_path / "m.so")
    with pytest.raises(FormatError, match=r"built for aarch64, but this machine is x86_64; "
                                          r"run it on aarch64 hardware \(or under qemu-aarch64"):
        kiln.runtime.load_module(so)


@needs_cross
def test_cli_compile_cross_and_cc_flag(tmp_path: Path) -> None:
    import onnx

    from support.graphs import GraphBuilder

    b = GraphBuilder()
    b.node("Relu", ["x"], ["y"])
    b.input("x", [4])
    b.output("y", [4])
    onnx.save(b.model(ir_version=None), tmp_path / "m.onnx")
    env = {k: v for k, v in __import__("os").environ.items() if k != "CC"}
    out = tmp_path / "m.so"
    proc = subprocess.run([sys.executable, "-m", "kiln", "compile", str(tmp_path / "m.onnx"),
                           "-t", "raspberry-pi/4b-aarch64", "-o", str(out)],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert _machine(out) == EM_AARCH64
    # --cc overrides: a compiler that does not exist is named in the one-line error.
    proc = subprocess.run([sys.executable, "-m", "kiln", "compile", str(tmp_path / "m.onnx"),
                           "-t", "raspberry-pi/4b-aarch64", "-o", str(out), "--cc",
                           "no-such-gcc"], capture_output=True, text=True, env=env)
    assert proc.returncode != 0 and "no-such-gcc" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_cross_compiler_names_the_package(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler on PATH at all
    ex = kiln.compile(_module(), "c -mtriple=riscv64-linux-gnu")
    with pytest.raises(MissingDependencyError,
                       match=r"'riscv64-linux-gnu-gcc'.*apt-get install gcc-riscv64-linux-gnu"):
        ex.export_library(tmp_path / "m.so")

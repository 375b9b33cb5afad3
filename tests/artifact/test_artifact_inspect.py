"""Inspectors: built-in views checked against their real consumers (LLVM, objdump, cc)."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kiln._registry import RegistryError
from kiln.artifact import (
    Artifact,
    ArtifactSet,
    InMemoryArtifact,
    archive,
    available_views,
    inspect_artifact,
)
from kiln.artifact import inspect as insp
from kiln.errors import FormatError
from support.toolchains import require_tool

llvm = pytest.importorskip("llvmlite.binding")

ADD1_IR = """\
target triple = "{triple}"

define i32 @kiln_add1(i32 %x) {{
  %y = add i32 %x, 1
  ret i32 %y
}}
"""


def llvm_module(triple: str = "x86_64-unknown-linux-gnu"):
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    mod = llvm.parse_assembly(ADD1_IR.format(triple=triple))
    mod.verify()
    return mod


def object_code(triple: str = "x86_64-unknown-linux-gnu") -> bytes:
    mod = llvm_module(triple)
    machine = llvm.Target.from_triple(triple).create_target_machine(reloc="pic",
                                                                    codemodel="default")
    return bytes(machine.emit_object(mod))


def test_c_source_is_shown_as_is():
    src = b"#include <stdint.h>\nint32_t f(void) { return 1; }\n"
    for name in ("kernels.c", "kiln.h"):
        a = Artifact("c", "native", name, src, {"cflags": ["-O2"]})
        assert inspect_artifact(a) == src.decode()
        assert inspect_artifact(a, "c") == src.decode()
    with pytest.raises(FormatError, match="expected UTF-8 C source, found an invalid byte at "
                                          "offset 1"):
        inspect_artifact(Artifact("c", "native", "k.c", b"a\xff"))


def test_bitcode_to_llvm_ir_text_and_assembly():
    a = Artifact("llvm", "none", "kernels.bc", bytes(llvm_module().as_bitcode()))
    text = inspect_artifact(a)
    assert text == inspect_artifact(a, "ll")
    assert "define i32 @kiln_add1(i32 %x)" in text
    reparsed = llvm.parse_assembly(text)  # the IR text is valid LLVM IR
    reparsed.verify()
    assert reparsed.get_function("kiln_add1") is not None
    asm = inspect_artifact(a, "asm")
    assert "kiln_add1:" in asm and "ret" in asm


def test_bitcode_for_another_target_gives_that_targets_assembly():
    mod = llvm_module("aarch64-unknown-linux-gnu")
    a = Artifact("llvm", "none", "kernels.bc", bytes(mod.as_bitcode()))
    asm = inspect_artifact(a, "asm")
    assert "kiln_add1:" in asm and "add\tw0, w0, #1" in asm


def test_llvm_ir_text_views():
    text = ADD1_IR.format(triple="x86_64-unknown-linux-gnu")
    a = Artifact("llvm", "none", "kernels.ll", text.encode())
    assert inspect_artifact(a) == text
    assert "kiln_add1:" in inspect_artifact(a, "asm")


def test_bad_bitcode_is_a_format_error():
    with pytest.raises(FormatError, match=re.escape("llvm/kernels.bc: LLVM could not parse it")):
        inspect_artifact(Artifact("llvm", "none", "kernels.bc", b"BC\xc0\xde garbage"))


# One byte of valid llvmlite 0.50 bitcode changed (a function's value-symbol-table
# offset): LLVM's reader asserts and aborts the process instead of reporting it.
CRAFTED_BC = Path(__file__).parent / "data" / "crafted_vst_offset.bc"


def test_crafted_bitcode_aborts_llvm_itself():
    """The fixture is a real danger: parsed in-process, LLVM kills the interpreter."""
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, llvmlite.binding as l; "
         "l.parse_bitcode(open(sys.argv[1], 'rb').read())", str(CRAFTED_BC)],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == -signal.SIGABRT, (proc.returncode, proc.stderr[-500:])


@pytest.mark.parametrize("view", ["ll", "asm"])
def test_crafted_bitcode_is_a_format_error_not_a_crash(view):
    a = Artifact("llvm", "none", "kernels.bc", CRAFTED_BC.read_bytes())
    with pytest.raises(FormatError, match=re.escape("llvm/kernels.bc: LLVM crashed reading it "
                                                    "(SIGABRT: ")) as info:
        inspect_artifact(a, view)
    assert str(info.value).endswith("the file is damaged or crafted")


def test_kiln_inspect_of_crafted_bitcode_in_a_consistent_tar(tmp_path):
    """The manifest's hashes match the crafted member, so only LLVM sees the damage."""
    tar = tmp_path / "crafted.tar"
    arts = ArtifactSet([Artifact("llvm", "none", "kernels.bc", CRAFTED_BC.read_bytes())])
    archive.write_tar(tar, arts, {"format": "kiln.library", "version": 1, "functions": {}})
    assert archive.read_tar(tar)[0][0].content == CRAFTED_BC.read_bytes()  # hashes check out
    proc = subprocess.run([sys.executable, "-m", "kiln.cli.main", "inspect", str(tar),
                           "--artifact", "llvm/kernels.bc", "--format", "ll"],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("kiln inspect: error: llvm/kernels.bc: LLVM crashed reading "
                                  "it (SIGABRT")
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_object_from_llvm_disassembly_and_symbols():
    a = Artifact("llvm", "native", "kernels.o", object_code())
    symbols = inspect_artifact(a, "symbols")
    row = next(line for line in symbols.splitlines() if line.endswith("kiln_add1"))
    assert row.split()[2:5] == ["FUNC", "GLOBAL", ".text"]
    assert "EM_X86_64" in symbols.splitlines()[0]
    require_tool("objdump", why="binutils")
    asm = inspect_artifact(a, "asm")
    assert "Disassembly of section .text" in asm and "<kiln_add1>:" in asm
    assert "llvm/kernels.o" in asm and "/tmp" not in asm  # temp path replaced by the name
    full = inspect_artifact(a)
    assert full.startswith("symbols of llvm/kernels.o") and "<kiln_add1>:" in full


def test_object_from_cc(tmp_path):
    require_tool("cc")
    require_tool("objdump", why="binutils")
    src = tmp_path / "k.c"
    src.write_text("int kiln_twice(int x) { return 2 * x; }\n"
                   "static const int kiln_table[4] = {1, 2, 3, 4};\n"
                   "const int *kiln_get(void) { return kiln_table; }\n")
    obj = tmp_path / "k.o"
    subprocess.run(["cc", "-O2", "-c", str(src), "-o", str(obj)], check=True)
    a = Artifact("c", "native", "k.o", obj.read_bytes())
    symbols = inspect_artifact(a, "symbols")
    names = {line.split()[-1]: line.split() for line in symbols.splitlines()[2:]}
    assert names["kiln_twice"][2:4] == ["FUNC", "GLOBAL"]
    assert names["kiln_table"][2:4] == ["OBJECT", "LOCAL"]
    assert names["kiln_table"][1] == "16"
    asm = inspect_artifact(a, "asm")
    assert "<kiln_twice>:" in asm and "<kiln_get>:" in asm


def test_cross_architecture_object_uses_llvm_objdump():
    if not insp._llvm_objdumps():
        pytest.skip("needs llvm-objdump")
    a = Artifact("llvm", "native", "kernels.o", object_code("aarch64-unknown-linux-gnu"))
    asm = inspect_artifact(a, "asm")
    assert "<kiln_add1>:" in asm and "add\tw0, w0, #1" in asm
    wasm = Artifact("llvm", "native", "w.o", object_code("wasm32-unknown-unknown"))
    assert "not an ELF object (starts with b'\\x00asm')" in inspect_artifact(wasm, "symbols")
    assert "kiln_add1" in inspect_artifact(wasm, "asm")


def test_json_bin_and_fallback_views():
    j = Artifact("cuda", "cuda", "functions.json", b'{"f": {"args": [1, 2]}}')
    assert inspect_artifact(j) == json.dumps({"f": {"args": [1, 2]}}, indent=2)
    with pytest.raises(FormatError, match=re.escape("cuda/bad.json: not valid JSON")):
        inspect_artifact(Artifact("cuda", "cuda", "bad.json", b"{"))

    weights = Artifact("llvm", "native", "constants.bin", bytes(range(40)),
                       {"symbol": "kiln__consts", "align": 64})
    view = inspect_artifact(weights)
    assert view.splitlines() == [
        "llvm/constants.bin: 40 bytes (loader native, symbol kiln__consts, align 64)",
        "00000000  00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f  |................|",
        "00000010  10 11 12 13 14 15 16 17 18 19 1a 1b 1c 1d 1e 1f  |................|",
        "00000020  20 21 22 23 24 25 26 27                          | !\"#$%&'|",
    ]
    assert inspect_artifact(weights, "hex") == view
    big = Artifact("x", "dsp", "cmd.stream", b"A" * 1000)
    lines = inspect_artifact(big).splitlines()
    assert lines[0] == "x/cmd.stream: 1000 bytes (loader dsp)"
    assert lines[-1] == "... (744 more bytes)" and len(lines) == 18
    # Any artifact has a hex view, even one whose extension has an inspector.
    assert inspect_artifact(j, "hex").startswith("cuda/functions.json: 23 bytes")


def test_unknown_view_lists_the_available_ones():
    a = Artifact("llvm", "none", "kernels.bc", b"BC")
    with pytest.raises(ValueError, match=re.escape("llvm/kernels.bc has no 'c' view; "
                                                   "available: asm, hex, ll")):
        inspect_artifact(a, "c")
    assert available_views(a) == ["ll", "asm", "hex"]


def test_linked_stub_and_in_memory_artifacts():
    stub = Artifact("llvm", "native", "kernels.o", b"", {"linked": True, "size": 1234})
    assert inspect_artifact(stub) == ("llvm/kernels.o: content not stored here -- it is linked "
                                      "into the library (1234 bytes, loader native)")
    mem = InMemoryArtifact("torch", "python", "model.bc", {"layers": 3})
    assert inspect_artifact(mem) == ("torch/model.bc: in-memory dict (loader python)\n"
                                     "{'layers': 3}")
    with pytest.raises(ValueError, match="has no 'hex' view; available: repr"):
        inspect_artifact(mem, "hex")


def test_custom_inspectors_and_lookup_order():
    a = Artifact("mycg", "myloader", "prog.json", b'{"a": 1}')
    try:
        insp.register_inspector(lambda art: "by loader", loader="myloader")
        assert inspect_artifact(a) == '{\n  "a": 1\n}'  # extension beats loader
        assert inspect_artifact(Artifact("mycg", "myloader", "prog.x", b"")) == "by loader"
        insp.register_inspector({"pretty": lambda art: "by codegen", "json": lambda art: "j"},
                                codegen_id="mycg")
        assert inspect_artifact(a) == "by codegen"       # codegen id beats extension
        assert inspect_artifact(a, "json") == "j"
        assert inspect_artifact(a, "text") == "by loader"  # first inspector offering it
        assert available_views(a) == ["pretty", "json", "text", "hex"]
        with pytest.raises(RegistryError, match="already registered"):
            insp.register_inspector(lambda art: "again", codegen_id="mycg")
        insp.register_inspector(lambda art: "again", codegen_id="mycg", override=True)
        assert inspect_artifact(a) == "again"
    finally:
        insp.INSPECTORS.unregister("codegen:mycg")
        insp.INSPECTORS.unregister("loader:myloader")
    assert inspect_artifact(a) == '{\n  "a": 1\n}'


def test_register_inspector_validates_its_arguments():
    with pytest.raises(ValueError, match="exactly one of ext=, codegen_id=, loader="):
        insp.register_inspector(lambda a: "", ext=".x", loader="y")
    with pytest.raises(ValueError, match=re.escape("must look like '.json'")):
        insp.register_inspector(lambda a: "", ext="json")
    with pytest.raises(ValueError, match="default view 'nope' is not one of"):
        insp.register_inspector({"a": lambda a: ""}, ext=".zz", default="nope")
    assert "ext:.zz" not in insp.INSPECTORS


def test_multi_suffix_extensions_prefer_the_longest():
    try:
        insp.register_inspector(lambda a: "tarball", ext=".tar.gz")
        insp.register_inspector(lambda a: "gzip", ext=".gz")
        assert inspect_artifact(Artifact("x", "none", "a.tar.gz", b"")) == "tarball"
        assert inspect_artifact(Artifact("x", "none", "a.gz", b"")) == "gzip"
    finally:
        insp.INSPECTORS.unregister("ext:.tar.gz")
        insp.INSPECTORS.unregister("ext:.gz")

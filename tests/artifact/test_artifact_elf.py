"""kiln.artifact.load on real shared libraries built with `cc`, never dlopen'ed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kiln.artifact import Artifact, ArtifactSet, blob, elf, load, load_with_metadata
from kiln.errors import FormatError
from support.toolchains import needs

pytestmark = needs("cc", why="a C compiler")

META = {"format": "kiln.library", "version": 1, "prefix": "kiln_", "functions": {}}


def sample_set() -> ArtifactSet:
    return ArtifactSet([
        Artifact("llvm", "native", "kernels.o", b"\x7fELF" + bytes(100)),
        Artifact("host", "native", "host.c", b"int kiln__x;\n", {"cflags": ["-O2"]}),
        Artifact("llvm", "native", "constants.bin", bytes(4096),
                 {"symbol": "kiln__consts", "align": 64}),
        Artifact("llvm", "none", "kernels.bc", b"BC\xc0\xde\x01\x02"),
        Artifact("jit", "llvmjit", "kernels.bc", b"BC\xc0\xde\x03"),
    ])


def blob_asm(symbol: str, blob_path: Path, *, size: bool = True,
             section: str = ".rodata") -> str:
    lines = [f"\t.section {section}", f"\t.globl {symbol}", f"\t.type {symbol}, @object",
             "\t.balign 8", f"{symbol}:", f'\t.incbin "{blob_path}"']
    if size:
        lines.append(f"\t.size {symbol}, . - {symbol}")
    return "\n".join(lines) + "\n"


def build_so(tmp: Path, name: str, parts: list[str], *, shared: bool = True) -> Path:
    src = tmp / f"{name}.s"
    src.write_text("".join(parts) + '\t.section .note.GNU-stack,"",@progbits\n')
    out = tmp / (f"{name}.so" if shared else f"{name}.o")
    cmd = ["cc", "-shared", "-o", str(out), str(src)] if shared else \
        ["cc", "-c", "-o", str(out), str(src)]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


def write_blob(tmp: Path, name: str, contents: blob.BlobContents) -> Path:
    p = tmp / f"{name}.bin"
    p.write_bytes(blob.pack(contents))
    return p


@pytest.fixture
def packed(tmp_path) -> Path:
    return write_blob(tmp_path, "blob", blob.build_contents(sample_set(), META))


def test_load_reads_the_blob_of_a_real_shared_library(tmp_path, packed):
    so = build_so(tmp_path, "libmodel", [blob_asm("kiln__blob", packed)])
    arts, meta = load_with_metadata(so)
    assert meta == META
    expected = blob.build_contents(sample_set(), META).artifacts
    assert arts == expected
    assert arts.get("host", "host.c").content == b"int kiln__x;\n"
    weights = arts.get("llvm", "constants.bin")
    assert weights.content == b"" and weights.metadata["linked"] is True
    assert weights.metadata["size"] == 4096
    assert load(so, prefix="kiln_") == expected
    # The library was read from disk, never mapped into this process.
    assert str(so) not in Path("/proc/self/maps").read_text()


def test_load_from_relocatable_object_and_symbol_without_size(tmp_path, packed):
    obj = build_so(tmp_path, "blob", [blob_asm("m_blob", packed)], shared=False)
    assert load(obj) == blob.build_contents(sample_set(), META).artifacts
    so = build_so(tmp_path, "nosize", [blob_asm("m_blob", packed, size=False)])
    assert load(so) == blob.build_contents(sample_set(), META).artifacts


def test_several_blobs_need_a_prefix_unless_metadata_disambiguates(tmp_path, packed):
    other_contents = blob.build_contents(ArtifactSet([Artifact("x", "none", "y", b"z")]), {})
    other = write_blob(tmp_path, "other", other_contents)
    so = build_so(tmp_path, "two", [blob_asm("a__blob", packed), blob_asm("b__blob", other)])
    with pytest.raises(FormatError, match=r"several blob symbols \(a__blob, b__blob\); "
                                          "pass prefix= to choose one"):
        load(so)
    assert load(so, prefix="b_") == other_contents.artifacts
    assert load(so, prefix="a_") == blob.build_contents(sample_set(), META).artifacts
    with pytest.raises(FormatError, match="no symbol 'c__blob' found"):
        load(so, prefix="c_")
    # A library exporting b__metadata too: its blob is the one.
    meta_fn = "\t.text\n\t.globl b__metadata\n\t.type b__metadata, @function\nb__metadata:\n\tret\n"
    so2 = build_so(tmp_path, "paired", [blob_asm("a__blob", packed),
                                        blob_asm("b__blob", other), meta_fn])
    assert load(so2) == other_contents.artifacts


def test_missing_symbol_non_elf_and_truncated_files(tmp_path, packed):
    plain = build_so(tmp_path, "plain", ["\t.data\n\t.globl x\nx:\n\t.long 1\n"])
    with pytest.raises(FormatError) as info:
        load(plain)
    assert str(info.value) == (f"{plain}: no data symbol ending in '_blob' found: not a "
                               "library exported by kiln, or the blob was stripped")

    text = tmp_path / "notes.txt"
    text.write_text("hello")
    expected = re.escape("notes.txt: not a kiln library, archive or blob")
    with pytest.raises(FormatError, match=expected):
        load(text)
    array = tmp_path / "x.npy"
    np.save(array, np.ones(3))
    with pytest.raises(FormatError, match=r"x\.npy: .*a NumPy \.npy array, an input .*an "
                                          r"\.onnx model is read by `kiln inspect model\.onnx`"):
        load(array)

    so = build_so(tmp_path, "lib", [blob_asm("kiln__blob", packed)])
    data = so.read_bytes()
    for cut in (10, 64, 4000, len(data) // 2, len(data) - 100):
        bad = tmp_path / f"cut{cut}.so"
        bad.write_bytes(data[:cut])
        with pytest.raises(FormatError) as info:
            load(bad)
        assert str(info.value).startswith(f"{bad}:"), str(info.value)


def test_damaged_blob_inside_a_library(tmp_path):
    raw = bytearray(blob.pack(blob.build_contents(sample_set(), META)))
    raw[100] ^= 0xFF
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(raw))
    so = build_so(tmp_path, "lib", [blob_asm("kiln__blob", bad)])
    with pytest.raises(FormatError, match=f"^{so}: kiln blob: checksum mismatch"):
        load(so)

    # A blob whose header claims more bytes than its symbol holds.
    good = blob.pack(blob.build_contents(sample_set(), META))
    short = tmp_path / "short.bin"
    short.write_bytes(good[:200])
    so = build_so(tmp_path, "short", [blob_asm("kiln__blob", short)])
    with pytest.raises(FormatError, match=f"the blob header gives {len(good)} bytes, "
                                          "but the symbol is only 200"):
        load(so)

    # A blob symbol in .bss has no bytes in the file.
    bss = "\t.bss\n\t.globl kiln__blob\n\t.type kiln__blob, @object\nkiln__blob:\n\t.zero 64\n"
    so = build_so(tmp_path, "bss", [bss])
    with pytest.raises(FormatError, match=r"symbol 'kiln__blob' is in \.bss, which has no data"):
        load(so)

    # Not a blob at all behind the symbol.
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x7fELF" + bytes(60))
    so = build_so(tmp_path, "junk", [blob_asm("kiln__blob", junk)])
    with pytest.raises(FormatError, match="symbol 'kiln__blob': kiln blob: not a kiln blob"):
        load(so)


def test_raw_blob_file_loads_too(tmp_path, packed):
    arts, meta = load_with_metadata(packed)
    assert meta == META and arts == blob.build_contents(sample_set(), META).artifacts


def test_find_blob_symbol_reports_its_location(tmp_path, packed):
    so = build_so(tmp_path, "lib", [blob_asm("kiln__blob", packed)])
    with open(so, "rb") as f:
        sym = elf.find_blob_symbol(f, str(so))
    assert sym.name == "kiln__blob" and sym.section == ".rodata"
    assert sym.size == packed.stat().st_size
    assert so.read_bytes()[sym.file_offset:sym.file_offset + 8] == b"KILNBLOB"

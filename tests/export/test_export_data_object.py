"""The blob + weights object: written directly (ELF) or by the assembler, the same result."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.artifact import ArtifactSet
from kiln.artifact.elf import read_blob
from kiln.ir import IRBuilder
from kiln.ir import graph as g
from kiln.runtime import library, mapped_fill
from kiln.runtime.data_object import LARGE_PAGE_BYTES, machine_of
from kiln.runtime.library import blob_object


def _executable(n: int = 3000) -> kiln.driver.executable.Executable:
    table = np.arange(n, dtype=np.float32)
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", (n,), "float32")
        ib.ret(ib.emit(kiln.ops.call("add", x, g.Constant(table, "table")), "y"))
    return kiln.compile(ib.get(), "c")


def _symbols(obj: Path) -> dict[str, tuple[str, ...]]:
    """name -> (value, size, type, bind, visibility) from `readelf -sW`."""
    out = subprocess.run(["readelf", "-sW", str(obj)], capture_output=True, text=True,
                         check=True).stdout
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if len(f) == 8 and f[7].startswith("kiln_"):
            rows[f[7]] = (f[1], f[2], f[3], f[4], f[5])
    return rows


def _section(obj: Path, name: str) -> bytes:
    out = obj.with_suffix(".section")
    subprocess.run(["objcopy", "-O", "binary", f"--only-section={name}", str(obj), str(out)],
                   check=True)
    return out.read_bytes()


def test_direct_object_matches_the_assembler_one(tmp_path: Path) -> None:
    ex = _executable()
    arts = ArtifactSet(ex.artifacts)
    (tmp_path / "asm").mkdir()
    (tmp_path / "elf").mkdir()
    by_asm = blob_object(arts, ex.metadata, "kiln_", tmp_path / "asm")
    # Any object of the same machine: the assembler's says which machine that is.
    by_elf = blob_object(arts, ex.metadata, "kiln_", tmp_path / "elf", like=[by_asm])
    assert by_elf.read_bytes()[:4] == b"\x7fELF"
    symbols = _symbols(by_elf)
    assert symbols == _symbols(by_asm)
    assert symbols["kiln__consts"][3:] == ("GLOBAL", "HIDDEN")
    assert symbols["kiln__blob"][3:] == ("GLOBAL", "DEFAULT")
    section = ".rodata.kiln__blob"
    assert _section(by_elf, section) == _section(by_asm, section)
    assert read_blob(by_elf) == read_blob(by_asm)
    # The weights sit where the blob says, after it.
    data = _section(by_elf, section)
    assert np.arange(3000, dtype=np.float32).tobytes() in data


def test_weights_reach_the_disk_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A .so's object only reserves the weights (NOBITS); they are written into the
    linked library (through a mapping, on threads: both thresholds lowered), where they
    sit right after the blob, equal to the artifact, on a large-page boundary of address
    and file offset alike, and the loader advises large pages on them."""
    n = 1 << 20
    ex = _executable(n)
    monkeypatch.setattr(library, "LARGE_PAGE_DATA_BYTES", 0)
    monkeypatch.setattr(mapped_fill, "PARALLEL_MIN_BYTES", 0)  # the weights on threads
    work = tmp_path / "work"
    lib = ex.export_library(tmp_path / "m.so", workspace_dir=work)
    consts = next(a for a in ex.artifacts if a.file_name == "constants.bin")
    obj = work / "blob.o"
    assert obj.stat().st_size < consts.size  # the weights are not in the object
    headers = subprocess.run(["readelf", "-SW", str(obj)], capture_output=True, text=True,
                             check=True).stdout
    assert ".rodata.kiln__blob.reserved" in headers and "NOBITS" in headers
    symbols = {row[7]: int(row[1], 16) for line in subprocess.run(
        ["readelf", "-sW", str(lib)], capture_output=True, text=True, check=True
    ).stdout.splitlines() if len(row := line.split()) == 8 and row[7].startswith("kiln__")}
    rodata = subprocess.run(["readelf", "-SW", str(lib)], capture_output=True, text=True,
                            check=True).stdout
    line = next(x for x in rodata.splitlines() if " .rodata " in x).split()
    at = line.index("PROGBITS")
    addr, offset = int(line[at + 1], 16), int(line[at + 2], 16)
    start = symbols["kiln__consts"] - addr + offset
    assert Path(lib).read_bytes()[start:start + consts.size] == bytes(consts.content)
    assert len(read_blob(lib)) > 0
    large_page = LARGE_PAGE_BYTES.get(machine_of(work / "blob.o").machine, 1)  # type: ignore[union-attr]
    assert symbols["kiln__consts"] % large_page == 0 and (addr - offset) % large_page == 0
    out = subprocess.run([sys.executable, "-c", _LOAD_AND_RUN, str(lib), str(n)],
                         capture_output=True, text=True, check=True)
    advised = Path("/sys/kernel/mm/transparent_hugepage/enabled").exists()
    assert out.stdout.split() == ["1.0", f"{float(n)}", str(advised)]


# Loads the library, runs it on ones, and says whether the mapping holding the last byte
# of the weights carries the large-page advice (smaps VmFlags "hg").
_LOAD_AND_RUN = """
import ctypes, sys, numpy as np, kiln
from kiln.runtime.dynsym import find_blob_symbol
m = kiln.runtime.load_module(sys.argv[1], verify_weights=True)
y = m['main'](np.ones(int(sys.argv[2]), np.float32))
last = (ctypes.addressof(ctypes.c_uint8.in_dll(m.cdll, 'kiln__blob'))
        + find_blob_symbol(sys.argv[1]).size - 1)
mine = hg = False
for line in open('/proc/self/smaps'):
    head = line.split()[0]
    if '-' in head and not head.endswith(':'):
        lo, hi = (int(v, 16) for v in head.split('-'))
        mine = lo <= last < hi
    elif mine and head == 'VmFlags:':
        hg = 'hg' in line.split()
print(float(y[0]), float(y[-1]), hg)
"""

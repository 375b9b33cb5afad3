"""Finding the blob symbol: the fast .dynsym reader agrees with pyelftools, never crashes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.artifact import elf
from kiln.errors import FormatError
from kiln.export import export_library, load_module
from kiln.runtime.dynsym import dynamic_symbols, find_blob_symbol
from support import handmade_lib as hm


def test_agrees_with_pyelftools(exported: dict[str, Path]) -> None:
    so = str(exported[".so"])
    ours = find_blob_symbol(so)
    with open(so, "rb") as f:
        theirs = elf.find_blob_symbol(f, so)
    assert (ours.name, ours.size) == (theirs.name, theirs.size)
    assert ours.prefix == "kiln_"

    from elftools.elf.elffile import ELFFile

    with open(so, "rb") as f:
        table = ELFFile(f).get_section_by_name(".dynsym")
        expected = [(s.name, s["st_size"]) for s in table.iter_symbols()]
    assert [(name, size) for name, _kind, _shndx, size in dynamic_symbols(so)] == expected

    # The shared reader behind both finders, over both symbol tables.
    with open(so, "rb") as f:
        tables = [s for s in ELFFile(f).iter_sections() if s.name in (".dynsym", ".symtab")]
        expected_all = [(s.name, s["st_value"], s["st_size"])
                        for table in tables for s in table.iter_symbols()]
        found = elf.read_symbols(f.fileno(), so, (elf.SHT_DYNSYM, elf.SHT_SYMTAB))
    assert [(s.name, s.value, s.size) for s in found.symbols] == expected_all


def test_one_shared_library_holding_two_kiln_libraries_needs_a_prefix(tmp_path: Path) -> None:
    archives = [export_library(hm.artifacts(p), hm.library_metadata(p), tmp_path / f"{p}.a",
                               prefix=p) for p in ("alpha_", "beta_")]
    both = tmp_path / "both.so"
    subprocess.run(["cc", "-shared", "-o", str(both), "-Wl,--whole-archive",
                    *map(str, archives), "-Wl,--no-whole-archive", "-lm"], check=True)
    with pytest.raises(FormatError, match=r"several kiln libraries inside \(alpha__blob, "
                                          r"beta__blob\); pass prefix= to choose one"):
        load_module(both)
    x = np.arange(4, dtype=np.float32)
    with load_module(both, prefix="beta_") as beta:
        assert beta.metadata["prefix"] == "beta_"
        np.testing.assert_array_equal(beta["main"](x), hm.reference("main", x))
    with pytest.raises(FormatError, match="no 'gamma__blob'"):
        load_module(both, prefix="gamma_")


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_headers_give_format_errors_not_crashes(
        exported: dict[str, Path], tmp_path: Path, data: st.DataObject) -> None:
    original = exported[".so"].read_bytes()
    raw = bytearray(original)
    # Damage the parts the reader trusts: ELF header, section headers, .dynsym/.dynstr.
    shoff = int.from_bytes(raw[0x28:0x30], "little")
    regions = [(0, 64), (shoff, len(raw)), (0, 4096)]
    for _ in range(data.draw(st.integers(1, 8))):
        lo, hi = data.draw(st.sampled_from(regions))
        at = data.draw(st.integers(lo, min(hi, len(raw)) - 1))
        raw[at] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    bad = tmp_path / "fuzz.so"
    bad.write_bytes(bytes(raw))
    try:
        found = find_blob_symbol(str(bad))
    except FormatError:
        return
    assert found.name.endswith("_blob")

"""The library blob: round trips, the documented byte layout, and damaged input."""

from __future__ import annotations

import hashlib
import struct

import pytest
from artifact_strategies import artifact_sets, assemble, metadata, reseal, string, u32
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.artifact import Artifact, ArtifactSet, InMemoryArtifact, blob
from kiln.artifact.blob import BlobContents, ModuleNode
from kiln.errors import ExportError, FormatError

ARTS, MODS, TREE, META, LINKED = 1, 2, 3, 4, 5


def sample_set() -> ArtifactSet:
    return ArtifactSet([
        Artifact("llvm", "native", "kernels.o", b"\x7fELF" + bytes(60)),
        Artifact("llvm", "none", "kernels.bc", b"BC\xc0\xde", {"triple": "x86_64"}),
        Artifact("host", "native", "host.c", b"int kiln__x;\n", {"cflags": ["-O2"]}),
        Artifact("llvm", "native", "constants.bin", bytes(range(256)) * 4,
                 {"symbol": "kiln__consts", "align": 64, "count": 3}),
        Artifact("jit", "llvmjit", "kernels.bc", b"BC\xc0\xde\x01", {"opt": 3}),
        Artifact("jit", "llvmjit", "constants.bin", b"\x00\x01", {"align": 64}),
    ])


LIB_META = {"format": "kiln.library", "version": 1, "prefix": "kiln_",
            "functions": {"f": {"name": "f", "params": []}}}


def nested_contents() -> BlobContents:
    """root -> (none, llvmjit), llvmjit -> dsp: a two-level CSR tree."""
    arts = ArtifactSet([
        Artifact("host", "native", "host.c", b"int x;"),
        Artifact("llvm", "none", "k.bc", b"BC"),
        Artifact("jit", "llvmjit", "k.bc", b"BC2"),
        Artifact("dsp", "dsp", "cmd.bin", b"\x01\x02"),
    ])
    modules = (ModuleNode("native", (0,)), ModuleNode("none", (1,)),
               ModuleNode("llvmjit", (2,)), ModuleNode("dsp", (3,)))
    return BlobContents(arts, modules, (0, 2, 2, 3, 3), (1, 2, 3), {"m": 1})


# -- build_contents -----------------------------------------------------------

def test_build_contents_groups_by_loader_under_a_native_root():
    c = blob.build_contents(sample_set(), LIB_META, drop_linked=False)
    assert c.modules == (ModuleNode("native", (0, 2, 3)), ModuleNode("none", (1,)),
                         ModuleNode("llvmjit", (4, 5)))
    assert c.row_ptr == (0, 2, 2, 2) and c.child_indices == (1, 2)
    assert c.children(0) == (1, 2) and c.children(2) == ()
    assert c.artifacts == sample_set()
    assert c.metadata == LIB_META
    assert [a.file_name for a in c.module_artifacts(2)] == ["kernels.bc", "constants.bin"]


def test_build_contents_drops_linked_native_binaries_but_keeps_sources():
    c = blob.build_contents(sample_set(), LIB_META)
    by_name = {(a.codegen_id, a.file_name): a for a in c.artifacts}
    obj = by_name["llvm", "kernels.o"]
    assert obj.content == b"" and obj.metadata == {"linked": True, "size": 64}
    weights = by_name["llvm", "constants.bin"]
    assert weights.content == b"" and weights.metadata == {
        "symbol": "kiln__consts", "align": 64, "count": 3, "linked": True, "size": 1024}
    assert by_name["host", "host.c"].content == b"int kiln__x;\n"     # source kept
    assert by_name["llvm", "kernels.bc"].content == b"BC\xc0\xde"     # loader none kept
    assert by_name["jit", "constants.bin"].content == b"\x00\x01"     # not native: kept
    assert blob.is_linked(obj) and not blob.is_linked(by_name["host", "host.c"])
    # Building again from what a .so gives back keeps the stubs as they are.
    again = blob.build_contents(c.artifacts, LIB_META)
    assert again.artifacts == c.artifacts


def test_build_contents_without_native_artifacts_still_has_a_root():
    c = blob.build_contents(ArtifactSet([Artifact("jit", "llvmjit", "k.bc", b"BC")]), {})
    assert c.modules == (ModuleNode("native", ()), ModuleNode("llvmjit", (0,)))
    assert blob.unpack(blob.pack(c)) == c
    empty = blob.build_contents(ArtifactSet(), {})
    assert empty.modules == (ModuleNode("native", ()),) and empty.row_ptr == (0, 0)
    assert blob.unpack(blob.pack(empty)) == empty


def test_build_contents_rejects_in_memory_artifacts_and_bad_metadata():
    s = ArtifactSet([InMemoryArtifact("jit", "llvmjit", "engine", object())])
    with pytest.raises(ExportError, match="jit/engine lives in memory"):
        blob.build_contents(s, {})
    with pytest.raises(ValueError, match="library metadata"):
        blob.build_contents(sample_set(), {"x": {1, 2}})


# -- round trips ----------------------------------------------------------------

def test_round_trip_nested_tree_and_memoryview():
    c = nested_contents()
    data = blob.pack(c)
    assert blob.unpack(data) == c
    assert blob.unpack(memoryview(data)) == c
    assert blob.unpack(bytearray(data)) == c
    assert blob.blob_length(data[:blob.HEADER_SIZE]) == len(data)
    assert blob.unpack(data).children(2) == (3,)


@settings(max_examples=100, deadline=None)
@given(artifact_sets(), metadata, st.booleans())
def test_random_artifact_sets_round_trip(arts, meta, drop_linked):
    contents = blob.build_contents(arts, meta, drop_linked=drop_linked)
    data = blob.pack(contents)
    back = blob.unpack(data)
    assert back == contents
    assert blob.pack(back) == data  # the writer is deterministic
    if not drop_linked:
        assert back.artifacts == arts


def test_pack_rejects_inconsistent_contents():
    good = nested_contents()
    cases = [
        ((ModuleNode("none", (0, 1, 2, 3)),), (0, 0), (), "module 0 (the root) must have"),
        (good.modules, (0, 2, 2, 3), (1, 2, 3), "row_ptr has 4 entries, expected 5"),
        (good.modules, (0, 2, 2, 3, 3), (1, 2, 0), "child 0 is not a module index"),
        (good.modules, (0, 1, 1, 2, 2), (1, 3), "modules [2, 3] are not reachable"),
        (good.modules, (0, 2, 2, 3, 4), (1, 2, 3, 2), "import cycle"),
        ((ModuleNode("native", (0,)), ModuleNode("none", (1, 1)),
          ModuleNode("llvmjit", (2,)), ModuleNode("dsp", (3,))), good.row_ptr,
         good.child_indices, "artifact 1 belongs to both"),
        ((ModuleNode("native", (0, 1)), ModuleNode("none", ()),
          ModuleNode("llvmjit", (2,)), ModuleNode("dsp", (3,))), good.row_ptr,
         good.child_indices, "artifact 1 has loader 'none' but sits in module 0"),
    ]
    for modules, row_ptr, child_indices, message in cases:
        bad = BlobContents(good.artifacts, modules, row_ptr, child_indices, good.metadata)
        with pytest.raises(ValueError, match="inconsistent blob contents") as info:
            blob.pack(bad)
        assert message in str(info.value)


# -- the documented layout (docs/format.md) -------------------------------------

def test_header_and_section_table_match_the_documented_layout():
    data = blob.pack(nested_contents())
    magic, version, flags, total, count, reserved = struct.unpack_from("<8sIIQII", data, 0)
    assert (magic, version, flags, total, count, reserved) == (b"KILNBLOB", 3, 0, len(data), 5, 0)
    assert blob.HEADER_SIZE == 32
    entries = [struct.unpack_from("<IIQQ", data, 32 + 24 * i) for i in range(count)]
    assert [e[0] for e in entries] == [ARTS, MODS, TREE, META, LINKED]
    for _kind, res, offset, length in entries:
        assert res == 0 and offset % 8 == 0 and offset + length <= total - 32
    assert data[-32:] == hashlib.sha256(data[:-32]).digest()
    # The import tree section is exactly: u32 n, row_ptr, u32 m, child_indices.
    _, _, off, length = entries[2]
    assert data[off:off + length] == u32(5, 0, 2, 2, 3, 3) + u32(3, 1, 2, 3)
    # The metadata section is compact UTF-8 JSON.
    _, _, off, length = entries[3]
    assert data[off:off + length] == b'{"m":1}'
    # No linked data: LINKED_DATA is just a zero count.
    _, _, off, length = entries[4]
    assert data[off:off + length] == u32(0)


def test_hand_assembled_blob_is_read():
    """A blob written from docs/format.md alone, independently of blob.pack."""
    artifacts = (u32(2)
                 + string("host") + string("native") + string("host.c") + string("{}")
                 + struct.pack("<Q", 6) + b"int x;"
                 + string("llvm") + string("none") + string("k.bc") + string('{"a":[1]}')
                 + struct.pack("<Q", 2) + b"BC")
    modules = u32(2) + string("native") + u32(1, 0) + string("none") + u32(1, 1)
    tree = u32(3, 0, 1, 1) + u32(1, 1)
    data = assemble([(META, b'{"prefix":"p_"}'), (ARTS, artifacts), (MODS, modules),
                     (TREE, tree)])
    c = blob.unpack(data)
    assert list(c.artifacts) == [Artifact("host", "native", "host.c", b"int x;"),
                                 Artifact("llvm", "none", "k.bc", b"BC", {"a": [1]})]
    assert c.modules == (ModuleNode("native", (0,)), ModuleNode("none", (1,)))
    assert (c.row_ptr, c.child_indices, c.metadata) == ((0, 1, 1), (1,), {"prefix": "p_"})


# -- damaged input: each failure names what it expected and what it found --------

GOOD = blob.pack(nested_contents())


def expect_error(data: bytes | bytearray, *fragments: str) -> None:
    with pytest.raises(FormatError) as info:
        blob.unpack(bytes(data))
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def patched(offset: int, fmt: str, *values: int, seal: bool = True) -> bytes:
    data = bytearray(GOOD)
    struct.pack_into(fmt, data, offset, *values)
    return reseal(data) if seal else bytes(data)


def test_wrong_magic():
    expect_error(b"ELFBLOB!" + GOOD[8:], "not a kiln blob", "expected magic b'KILNBLOB'",
                 "found b'ELFBLOB!'")
    with pytest.raises(FormatError, match="not a kiln blob"):
        blob.blob_length(b"\x7fELF" + bytes(28))


def test_versions_outside_the_supported_range():
    expect_error(patched(8, "<I", 4), "format version 4 is newer", "versions 1..3",
                 "upgrade kiln")
    expect_error(patched(8, "<I", 0), "format version 0 is too old", "versions 1..3")
    # blob_length still works on a newer blob: the first 24 bytes never change.
    assert blob.blob_length(patched(8, "<I", 7)) == len(GOOD)


def test_flags_and_reserved_fields():
    expect_error(patched(12, "<I", 1), "unknown header flags 0x00000001")
    expect_error(patched(28, "<I", 5), "reserved header field must be 0, found 5")


def test_truncated_and_length_mismatch():
    expect_error(GOOD[:10], "truncated header: expected 32 bytes, found 10")
    expect_error(GOOD[:-1], f"header gives total length {len(GOOD)}",
                 f"only {len(GOOD) - 1} bytes present")
    expect_error(GOOD + b"\0", "length mismatch", f"but {len(GOOD) + 1} bytes were given")
    expect_error(patched(16, "<Q", 8, seal=False), "less than the minimum 64")
    with pytest.raises(FormatError, match="truncated header"):
        blob.blob_length(GOOD[:31])


def test_checksum_mismatch():
    data = bytearray(GOOD)
    data[200] ^= 0x01
    expect_error(data, "checksum mismatch", "the blob is damaged")


def section_entry(kind: int) -> tuple[int, int, int]:
    """(table offset, section offset, section length) of section `kind` in GOOD."""
    for i in range(5):
        k, _, off, length = struct.unpack_from("<IIQQ", GOOD, 32 + 24 * i)
        if k == kind:
            return 32 + 24 * i, off, length
    raise AssertionError(kind)


def test_section_table_errors():
    entry, _, _ = section_entry(MODS)
    expect_error(patched(entry, "<I", 9), "section 1 has unknown kind 9")
    expect_error(patched(entry, "<I", ARTS), "section ARTIFACTS appears twice")
    expect_error(patched(entry + 4, "<I", 1), "reserved field must be 0, found 1")
    expect_error(patched(entry + 8, "<Q", len(GOOD)), "section MODULES", "out of bounds")
    expect_error(patched(entry + 16, "<Q", 2**64 - 1), "out of bounds")
    expect_error(patched(entry + 8, "<Q", 8), "out of bounds")   # inside the header
    _, a_off, _ = section_entry(ARTS)
    expect_error(patched(entry + 8, "<Q", a_off + 4), "overlap")
    expect_error(patched(24, "<I", 3), "missing section(s) METADATA")
    expect_error(patched(24, "<I", 1000), "section count 1000 exceeds the maximum 64")
    expect_error(patched(24, "<I", 40), "section table of 40 entries ends at byte 992",
                 "past the end of the data")


def section_blob(kind: int, body: bytes) -> bytes:
    """GOOD with section `kind` replaced by `body` (a fresh, valid envelope)."""
    sections = []
    for k in (ARTS, MODS, TREE, META, LINKED):
        _, off, length = section_entry(k)
        sections.append((k, body if k == kind else GOOD[off:off + length]))
    return assemble(sections, version=blob.FORMAT_VERSION)


def test_huge_counts_are_rejected_before_allocating():
    expect_error(section_blob(ARTS, u32(0xFFFFFFFF)), "artifact count is 4294967295",
                 "need at least")
    expect_error(section_blob(MODS, u32(0xFFFFFFFF)), "module count is 4294967295")
    expect_error(section_blob(TREE, u32(0xFFFFFFFF)), "length of row_ptr is 4294967295")
    huge_content = (u32(1) + string("a") + string("none") + string("f") + string("")
                    + string("{}")
                    + struct.pack("<Q", 2**63))
    expect_error(section_blob(ARTS, huge_content), "artifact 0 content needs",
                 "truncated or corrupt")
    huge_string = u32(1) + u32(0xFFFFFFF0) + bytes(24)
    expect_error(section_blob(ARTS, huge_string), "artifact 0 codegen_id needs 4294967280")


def test_bad_strings_json_and_names_inside_sections():
    one = lambda cid, loader, name, meta: (  # noqa: E731
        u32(1) + string(cid) + string(loader) + string(name) + string("") + string(meta)
        + struct.pack("<Q", 0))
    expect_error(section_blob(ARTS, one(b"\xff\xfe", "none", "f", "{}")),
                 "artifact 0 codegen_id is not valid UTF-8")
    expect_error(section_blob(ARTS, one("a", "none", "f", "{nope")),
                 "metadata of artifact 0 (a/f)", "invalid JSON")
    expect_error(section_blob(ARTS, one("a", "none", "f", "[1]")), "found a list")
    expect_error(section_blob(ARTS, one("a", "none", "f", '{"x":NaN}')), "invalid JSON")
    expect_error(section_blob(ARTS, one("a", "none", "f", '{"x":1,"x":2}')),
                 "duplicate key 'x'")
    expect_error(section_blob(ARTS, one("a", "none", "f", "[" * 100000 + "]" * 100000)),
                 "nested 100000 levels deep")
    expect_error(section_blob(ARTS, one("a", "none", "../../etc/passwd", "{}")),
                 "artifact 0: file_name", "path separator")
    expect_error(section_blob(META, b"\xff"), "METADATA section: expected UTF-8")
    expect_error(section_blob(META, b"[]"), "METADATA section: expected a JSON object")


def test_trailing_bytes_and_structure_errors_inside_sections():
    _, off, length = section_entry(TREE)
    tree = GOOD[off:off + length]
    expect_error(section_blob(TREE, tree + b"\0\0\0\0"), "IMPORT_TREE section has 4 unexpected")
    expect_error(section_blob(TREE, u32(5, 0, 2, 2, 3, 3) + u32(3, 1, 2, 9)),
                 "import tree child 9 is not a module index in [1, 4)")
    expect_error(section_blob(TREE, u32(5, 0, 2, 1, 3, 3) + u32(3, 1, 2, 3)),
                 "row_ptr decreases at 2")
    expect_error(section_blob(TREE, u32(5, 0, 3, 3, 4, 4) + u32(4, 1, 2, 2, 3)),
                 "module 0 imports the same module twice")
    expect_error(section_blob(MODS, u32(1) + string("native") + u32(1, 0)),
                 "artifacts [1, 2, 3] belong to no module")
    expect_error(section_blob(TREE, u32(4, 0, 2, 2, 3) + u32(3, 1, 2, 3)),
                 "row_ptr has 4 entries, expected 5 (modules + 1)")
    expect_error(section_blob(MODS, u32(1) + string("native") + u32(1, 7)),
                 "module 0 refers to artifact 7, but there are 4 artifacts")
    expect_error(section_blob(MODS, u32(1) + string("bad loader") + u32(0)),
                 "module 0 loader 'bad loader' is not a valid name")
    dup_arts = (u32(2) + (string("a") + string("native") + string("f") + string("")
                          + string("{}")
                          + struct.pack("<Q", 0)) * 2)
    expect_error(section_blob(ARTS, dup_arts), "duplicate artifact a/f")


# -- fuzz: every mutation is a FormatError or reads back faithfully ---------------

@st.composite
def mutations(draw):
    data = bytearray(GOOD)
    n = len(data)
    kind = draw(st.sampled_from(
        ["truncate", "flip_bit", "set_byte", "zero_tail", "splice", "version", "extend",
         "set_u32", "set_u64"]))
    if kind == "truncate":
        data = data[:draw(st.integers(0, n - 1))]
    elif kind == "flip_bit":
        i = draw(st.integers(0, n - 1))
        data[i] ^= 1 << draw(st.integers(0, 7))
    elif kind == "set_byte":
        data[draw(st.integers(0, n - 1))] = draw(st.integers(0, 255))
    elif kind == "zero_tail":
        k = draw(st.integers(0, n - 1))
        data[k:] = bytes(n - k)
    elif kind == "splice":
        i = draw(st.integers(0, n))
        j = draw(st.integers(i, min(n, i + 64)))
        data[i:j] = draw(st.binary(max_size=64))
    elif kind == "version":
        struct.pack_into("<I", data, 8, draw(st.integers(0, 2**32 - 1)))
    elif kind == "extend":
        data += draw(st.binary(min_size=1, max_size=16))
    else:  # overwrite a length/count/offset-sized field anywhere past the magic
        size = 4 if kind == "set_u32" else 8
        i = draw(st.integers(8, n - size))
        values = st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]) if size == 8 \
            else st.sampled_from([0, 1, 3, 255, 2**31, 2**32 - 1])
        struct.pack_into("<I" if size == 4 else "<Q", data, i, draw(values))
    # Re-sealing the checksum (and, sometimes, the total length) sends the
    # damage past the envelope checks into the section parser.
    seal = draw(st.booleans()) and len(data) >= 64
    if seal and draw(st.booleans()):
        struct.pack_into("<Q", data, 16, len(data))
    return (reseal(data) if seal else bytes(data)), seal


@settings(max_examples=400, deadline=None)
@given(mutations())
def test_fuzz_mutated_blobs(mutation):
    data, sealed = mutation
    original = blob.unpack(GOOD)
    try:
        result = blob.unpack(data)
    except FormatError:
        return
    if not sealed or data == GOOD:
        # Without a fresh checksum only an unchanged blob can be accepted.
        assert data == GOOD and result == original
    else:
        # Accepted after re-sealing: the blob must mean exactly what it says,
        # i.e. writing the result again reads back to the same contents.
        assert blob.unpack(blob.pack(result)) == result


# -- LINKED_DATA (version 2) ------------------------------------------------------

def linked_contents() -> BlobContents:
    """sample_set as export stores it, the 1024 bytes of constants.bin placed after the blob."""
    c = blob.build_contents(sample_set(), LIB_META)
    digests = hashlib.sha256(bytes(range(256)) * 4).digest()
    placed, end = blob.place_linked(c, [(3, 1024, 4096, digests)], 64)
    assert end == placed.linked[0].offset + 1024
    return placed


def test_place_linked_puts_the_data_aligned_after_the_blob():
    c = linked_contents()
    data = blob.pack(c)
    (record,) = c.linked
    assert record.offset == -(-len(data) // 64) * 64 and record.offset >= len(data)
    assert blob.unpack(data).linked == c.linked
    # The record, as docs/format.md lays it out.
    entries = [struct.unpack_from("<IIQQ", data, 32 + 24 * i) for i in range(5)]
    _, _, off, length = entries[4]
    assert data[off:off + length] == (u32(1) + struct.pack("<IIQQ", 3, 4096, record.offset, 1024)
                                      + hashlib.sha256(bytes(range(256)) * 4).digest())


def linked_blob(record: bytes) -> bytes:
    """linked_contents with its LINKED_DATA body replaced by `record` (resealed)."""
    good = blob.pack(linked_contents())
    sections = []
    for i in range(5):
        kind, _, off, length = struct.unpack_from("<IIQQ", good, 32 + 24 * i)
        sections.append((kind, record if kind == LINKED else good[off:off + length]))
    return assemble(sections, version=blob.FORMAT_VERSION)


def test_linked_data_records_are_checked():
    digest = bytes(32)
    far = 1 << 20
    cases = [
        (u32(1) + struct.pack("<IIQQ", 9, 4096, far, 1024) + digest,
         "refers to artifact 9, but there are 6"),
        (u32(1) + struct.pack("<IIQQ", 2, 4096, far, 13) + digest,
         "host/host.c) is not a linked native stub"),
        (u32(1) + struct.pack("<IIQQ", 3, 4096, far, 1000) + digest,
         "length 1000 differs from the size 1024"),
        (u32(1) + struct.pack("<IIQQ", 3, 3000, far, 1024) + digest,
         "chunk size 3000; expected a power of two"),
        (u32(1) + struct.pack("<IIQQ", 3, 4096, 40, 1024) + digest,
         "offset 40 lies inside the blob"),
        (u32(1) + struct.pack("<IIQQ", 3, 4096, far, 1024),
         "linked data 0 digests needs 32 bytes"),
        (u32(2) + (struct.pack("<IIQQ", 3, 4096, far, 1024) + digest) * 2,
         "artifact 3 is listed twice"),
        (u32(0xFFFFFF), "linked data count is 16777215"),
    ]
    for record, message in cases:
        expect_error(linked_blob(record), message)


def test_a_version_1_blob_may_not_hold_linked_data():
    good = blob.pack(linked_contents())
    sections = []
    for i in range(5):
        kind, _, off, length = struct.unpack_from("<IIQQ", good, 32 + 24 * i)
        sections.append((kind, good[off:off + length]))
    expect_error(assemble(sections, version=1), "section 4 has unknown kind 5",
                 "expected one of [1, 2, 3, 4]")
    expect_error(assemble(sections[:4], version=2), "missing section(s) LINKED_DATA")
    expect_error(assemble(sections[:4], version=3), "missing section(s) LINKED_DATA")
    # Without it, version 1 reads, with no linked data: the golden v1 file
    # (tests/artifact/test_artifact_golden.py, test_blob_v1_golden_has_no_linked_data).


def test_pack_refuses_inconsistent_linked_data():
    c = linked_contents()
    bad = BlobContents(c.artifacts, c.modules, c.row_ptr, c.child_indices, c.metadata,
                       (blob.LinkedData(2, 4096, 13, 4096, bytes(32)),))  # host.c: source
    with pytest.raises(ValueError, match="is not a linked native stub"):
        blob.pack(bad)


def test_unpack_skips_metadata_entries_and_borrows_contents():
    import json

    from kiln.runtime.lazy_graphs import LazyGraphs
    graphs = {"main": {"tensors": ["}{\"", [1]], "kernels": []}}
    meta = {"prefix": "p_", "graphs": graphs, "functions": {"f": {"graphs": 1}}}
    art = Artifact("host", "native", "host.c", b"int x;\n")
    data = blob.pack(blob.build_contents(ArtifactSet([art]), meta))
    whole = blob.unpack(data)
    lean = blob.unpack(memoryview(data), copy=False, skip=("graphs",))
    assert dict(lean.metadata) == {k: v for k, v in whole.metadata.items() if k != "graphs"}
    content = next(iter(lean.artifacts)).content
    assert isinstance(content, memoryview) and bytes(content) == b"int x;\n"
    # the entry as text, parsed (once) when read
    rest, raw = blob.split_entry(json.dumps(meta), "graphs")
    assert json.loads(rest) == {k: v for k, v in meta.items() if k != "graphs"}
    lazy = LazyGraphs(raw or "", json.loads)
    assert lazy == graphs and lazy["main"]["tensors"][0] == "}{\""

"""The .tar artifact archive: round trip, atomic writes, and hostile archives."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile

import pytest
from artifact_strategies import artifact_sets, metadata
from hypothesis import given, settings

from kiln.artifact import Artifact, ArtifactSet, InMemoryArtifact, archive, load_with_metadata
from kiln.artifact.archive import manifest_checksum, read_tar, write_tar
from kiln.errors import ExportError, FormatError


def sample_set() -> ArtifactSet:
    return ArtifactSet([
        Artifact("c", "native", "kernels.c", b"int f(void) { return 1; }\n",
                 {"cflags": ["-O2"]}),
        Artifact("c", "native", "constants.bin", bytes(range(256)),
                 {"symbol": "kiln__consts", "align": 64}),
        Artifact("llvm", "none", "kernels.bc", b"BC\xc0\xde"),
        Artifact("jit", "llvmjit", "k\u00e9rnels.bc", b"BC"),
    ])


META = {"format": "kiln.library", "prefix": "kiln_", "functions": {}}


def test_round_trip_and_layout(tmp_path):
    path = tmp_path / "model.tar"
    write_tar(path, sample_set(), META)
    arts, meta = read_tar(path)
    assert arts == sample_set() and meta == META
    assert load_with_metadata(path) == (sample_set(), META)
    with tarfile.open(path) as tar:
        names = tar.getnames()
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        kernels = tar.extractfile("c/kernels.c").read()  # type: ignore[union-attr]
        members = tar.getmembers()
    assert names == ["manifest.json", "c/kernels.c", "c/constants.bin", "llvm/kernels.bc",
                     "jit/k\u00e9rnels.bc"]
    assert kernels == b"int f(void) { return 1; }\n"
    assert all(m.isreg() and m.mode == 0o644 and m.mtime == 0 for m in members)
    assert manifest["format"] == "kiln.artifacts" and manifest["version"] == 2
    assert manifest["metadata"] == META
    assert manifest["artifacts"][1] == {
        "codegen_id": "c", "loader": "native", "file_name": "constants.bin", "target_key": "",
        "size": 256,
        "sha256": hashlib.sha256(bytes(range(256))).hexdigest(),
        "metadata": {"symbol": "kiln__consts", "align": 64}}
    assert manifest["checksum"] == manifest_checksum(manifest)
    assert os.stat(path).st_mode & 0o777 == 0o644


def test_writes_are_deterministic(tmp_path):
    write_tar(tmp_path / "a.tar", sample_set(), META)
    write_tar(tmp_path / "b.tar", sample_set(), META)
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()


@settings(max_examples=40, deadline=None)
@given(artifact_sets(max_size=5), metadata)
def test_random_sets_round_trip(arts, meta):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "x.tar")
        write_tar(path, arts, meta)
        assert read_tar(path) == (arts, meta)


def test_in_memory_artifact_is_refused_before_writing(tmp_path):
    s = sample_set()
    s.add(InMemoryArtifact("jit", "llvmjit", "engine", object()))
    path = tmp_path / "x.tar"
    with pytest.raises(ExportError, match="jit/engine lives in memory"):
        write_tar(path, s, META)
    assert list(tmp_path.iterdir()) == []


def test_write_is_atomic_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "x.tar"
    write_tar(path, sample_set(), META)
    before = path.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(archive, "add_file", boom)
    with pytest.raises(OSError, match="disk full"):
        write_tar(path, ArtifactSet([Artifact("a", "none", "b", b"new")]), {})
    assert path.read_bytes() == before            # old archive untouched
    assert [p.name for p in tmp_path.iterdir()] == ["x.tar"]  # no temp file left


def test_bad_metadata_and_reserved_codegen_id(tmp_path):
    with pytest.raises(ValueError, match="library metadata"):
        write_tar(tmp_path / "x.tar", sample_set(), {"x": object()})
    with pytest.raises(ValueError, match="collides with the archive manifest"):
        write_tar(tmp_path / "x.tar", ArtifactSet([Artifact("manifest.json", "none", "a", b"")]),
                  {})


# -- hostile or damaged archives ---------------------------------------------------

def good_manifest(arts: ArtifactSet = None) -> dict:  # type: ignore[assignment]
    items = list(arts if arts is not None else sample_set())
    return archive.build_manifest(items, META)  # type: ignore[arg-type]


def build_tar(path, entries) -> None:
    """entries: (TarInfo-or-name, bytes) pairs written in order, no checks."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            if isinstance(info, str):
                info = tarfile.TarInfo(info)
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)


def manifest_entry(manifest: dict) -> tuple[str, bytes]:
    return ("manifest.json", json.dumps(manifest).encode())


def members_of(arts: ArtifactSet) -> list[tuple[str, bytes]]:
    return [(f"{a.codegen_id}/{a.file_name}", a.content) for a in arts]


def expect(path, *fragments) -> None:
    with pytest.raises(FormatError) as info:
        read_tar(path)
    msg = str(info.value)
    assert msg.startswith(f"archive {path}: "), msg
    for f in fragments:
        assert f in msg, msg


def test_hand_built_archive_is_accepted(tmp_path):
    # Directory entries for codegen ids (as `tar cf` adds them) are fine.
    d = tarfile.TarInfo("c/")
    d.type = tarfile.DIRTYPE
    p = tmp_path / "ok.tar"
    build_tar(p, [manifest_entry(good_manifest()), (d, None), *members_of(sample_set())])
    assert read_tar(p)[0] == sample_set()


def link(name: str, target: str, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info


def test_unsafe_members_are_rejected(tmp_path):
    good = [manifest_entry(good_manifest()), *members_of(sample_set())]
    dev = tarfile.TarInfo("c/dev")
    dev.type = tarfile.CHRTYPE
    fifo = tarfile.TarInfo("c/fifo")
    fifo.type = tarfile.FIFOTYPE
    stray_dir = tarfile.TarInfo("elsewhere")
    stray_dir.type = tarfile.DIRTYPE
    cases = [
        ([*good, ("/etc/passwd", b"x")], "member '/etc/passwd' has an absolute path"),
        ([*good, ("c/../../evil", b"x")], "member 'c/../../evil' contains '..'"),
        ([*good, ("c//x", b"x")], "is not a normalized relative path"),
        ([*good, ("./c/x", b"x")], "is not a normalized relative path"),
        ([*good, (link("c/sym", "/etc/passwd", tarfile.SYMTYPE), None)],
         "member 'c/sym' is a link (to '/etc/passwd')"),
        ([*good, (link("c/hard", "c/kernels.c", tarfile.LNKTYPE), None)], "is a link"),
        ([*good, (dev, None)], "member 'c/dev' is a device"),
        ([*good, (fifo, None)], "member 'c/fifo' is a device, FIFO"),
        ([*good, ("c/kernels.c", b"again")], "member 'c/kernels.c' appears more than once"),
        ([*good, ("c/extra.c", b"x")], "file(s) not listed in manifest.json: c/extra.c"),
        ([*good, (stray_dir, None)], "directory entries not matching any codegen_id: elsewhere"),
        (good[1:], "no manifest.json"),
        (good[:-1], "manifest.json lists 'jit/k\u00e9rnels.bc' but the archive has no such file"),
    ]
    for i, (entries, message) in enumerate(cases):
        p = tmp_path / f"bad{i}.tar"
        build_tar(p, entries)
        expect(p, message)


def test_content_and_manifest_tampering(tmp_path):
    arts = sample_set()
    members = members_of(arts)
    p = tmp_path / "hash.tar"
    tampered = [(n, d.replace(b"return 1", b"return 2")) for n, d in members]
    build_tar(p, [manifest_entry(good_manifest()), *tampered])
    expect(p, "'c/kernels.c' sha256 mismatch", "changed or damaged")

    p = tmp_path / "size.tar"
    build_tar(p, [manifest_entry(good_manifest()), ("c/kernels.c", b"short"), *members[1:]])
    expect(p, "'c/kernels.c' is 5 bytes, the manifest says 26")

    m = good_manifest()
    m["artifacts"][0]["loader"] = "none"  # checksum not updated
    p = tmp_path / "edit.tar"
    build_tar(p, [manifest_entry(m), *members])
    expect(p, "manifest.json checksum mismatch")


def resealed(m: dict) -> dict:
    m["checksum"] = manifest_checksum(m)
    return m


def test_manifest_schema_and_versions(tmp_path):
    members = members_of(sample_set())
    cases = []
    m = good_manifest()
    m["version"] = 3
    cases.append((resealed(m), "archive format version 3 is newer", "upgrade kiln"))
    m = good_manifest()
    m["version"] = 1  # version 1 entries have no target_key
    cases.append((resealed(m), "artifacts[0].target_key: expected no such key"))
    m = good_manifest()
    m["version"] = 0
    cases.append((resealed(m), "archive format version 0 is too old"))
    m = good_manifest()
    m["version"] = "1"
    cases.append((resealed(m), "expected an integer 'version', found '1'"))
    m = good_manifest()
    m["format"] = "tvm.mlf"
    cases.append((resealed(m), "expected format 'kiln.artifacts', found 'tvm.mlf'"))
    m = good_manifest()
    m["extra"] = 1
    cases.append((resealed(m), "manifest.json: extra: expected no such key"))
    m = good_manifest()
    del m["metadata"]
    cases.append((resealed(m), 'expected an object with key "metadata"'))
    m = good_manifest()
    m["artifacts"][0]["size"] = -1
    cases.append((resealed(m), "artifacts[0].size: expected an int >= 0, got -1"))
    m = good_manifest()
    m["artifacts"][0]["sha256"] = "XYZ"
    cases.append((resealed(m), "artifacts[0].sha256: expected 64 lowercase hex digits"))
    m = good_manifest()
    m["artifacts"][0]["file_name"] = "../kernels.c"
    cases.append((resealed(m), "manifest.json artifact 0: file_name", "path separator"))
    m = good_manifest()
    m["artifacts"][1] = dict(m["artifacts"][0])
    cases.append((resealed(m), "lists 'c/kernels.c' twice"))
    for i, (manifest, *fragments) in enumerate(cases):
        p = tmp_path / f"m{i}.tar"
        build_tar(p, [manifest_entry(manifest), *members])
        expect(p, *fragments)

    p = tmp_path / "json.tar"
    build_tar(p, [("manifest.json", b"{not json"), *members])
    expect(p, "manifest.json: expected a JSON object, found invalid JSON")


def test_not_a_tar_and_truncated(tmp_path):
    p = tmp_path / "x.tar"
    p.write_bytes(b"hello world" * 100)
    expect(p, "not a readable uncompressed tar archive")
    write_tar(p, sample_set(), META)
    data = p.read_bytes()
    for cut in (600, 1200, 2600, len(data) - 8000):
        p.write_bytes(data[:cut])
        expect(p)
    p.write_bytes(b"")
    expect(p, "not a readable uncompressed tar archive")


def test_gzip_archives_are_not_accepted(tmp_path):
    import gzip

    p = tmp_path / "x.tar"
    write_tar(p, sample_set(), META)
    gz = tmp_path / "x.tar.gz"
    gz.write_bytes(gzip.compress(p.read_bytes()))
    expect(gz, "not a readable uncompressed tar archive")

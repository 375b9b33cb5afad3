"""Artifact, InMemoryArtifact and ArtifactSet: validation and collection behaviour."""

from __future__ import annotations

import copy
import json
import os
import pickle
import re
import subprocess
import sys
import textwrap

import pytest

from kiln.artifact import Artifact, ArtifactSet, InMemoryArtifact
from kiln.errors import ExportError


def art(codegen_id: str = "llvm", loader: str = "native", file_name: str = "kernels.o",
        content: bytes = b"\x7fELF", metadata: dict | None = None) -> Artifact:
    return Artifact(codegen_id, loader, file_name, content, metadata or {})


# -- Artifact validation ------------------------------------------------------

@pytest.mark.parametrize("field,value,message", [
    ("codegen_id", "", "codegen_id must not be empty"),
    ("codegen_id", "a/b", "codegen_id 'a/b' is not a valid name"),
    ("codegen_id", "..", "codegen_id '..' is not a valid name"),
    ("codegen_id", "x" * 65, "is not a valid name"),
    ("codegen_id", 3, "codegen_id must be a str, got int"),
    ("loader", "", "loader must not be empty"),
    ("loader", "my loader", "loader 'my loader' is not a valid name"),
    ("loader", None, "loader must be a str, got NoneType"),
    ("file_name", "", "file_name must not be empty"),
    ("file_name", "a/b.o", "contains a path separator"),
    ("file_name", "a\\b.o", "contains a path separator"),
    ("file_name", "..", "must not be '.' or contain '..'"),
    ("file_name", ".", "must not be '.' or contain '..'"),
    ("file_name", "x..o", "must not be '.' or contain '..'"),
    ("file_name", "a\0b", "contains a NUL character"),
    ("file_name", "a\nb", "contains a control character"),
    ("file_name", "\ud800.o", "is not encodable as UTF-8"),
    ("file_name", "x" * 256, "longer than 255"),
])
def test_invalid_names_raise_value_error_naming_the_field(field, value, message):
    kwargs = {"codegen_id": "llvm", "loader": "native", "file_name": "k.o",
              "content": b"", "metadata": {}}
    kwargs[field] = value
    with pytest.raises(ValueError, match="^" + field) as info:
        Artifact(**kwargs)
    assert message in str(info.value)


def test_valid_names_are_accepted():
    a = Artifact("ethos-u.v2", "dsp_loader", "cmd stream #1.bin", b"x")
    assert (a.codegen_id, a.loader, a.file_name) == ("ethos-u.v2", "dsp_loader",
                                                     "cmd stream #1.bin")
    assert a.extension == ".bin"
    assert Artifact("c", "native", "Makefile", b"").extension == ""
    assert Artifact("c", "native", ".hidden", b"").extension == ""


@pytest.mark.parametrize("content,message", [
    ("int x;", "content must be bytes, got str; encode text"),
    ([1, 2], "content must be bytes, got list"),
    (None, "content must be bytes, got NoneType"),
])
def test_content_must_be_bytes(content, message):
    with pytest.raises(ValueError, match=r"^content") as info:
        Artifact("c", "native", "k.c", content)
    assert message in str(info.value)


def test_bytes_like_content_is_copied_to_bytes():
    buf = bytearray(b"abc")
    a = Artifact("c", "native", "k.c", buf)
    buf[0] = ord("z")
    assert a.content == b"abc" and type(a.content) is bytes
    assert Artifact("c", "native", "k.c", memoryview(b"xy")).content == b"xy"


@pytest.mark.parametrize("metadata,message", [
    ({"x": {1, 2}}, "metadata['x']: a set is not JSON-able"),
    ({"x": b"raw"}, "metadata['x']: a bytes is not JSON-able"),
    ({1: "a"}, "metadata: key 1 is a int; JSON object keys must be str"),
    ({"x": [1, float("nan")]}, "metadata['x'][1]: nan is not valid JSON"),
    ({"x": float("inf")}, "inf is not valid JSON"),
    ([("a", 1)], "metadata must be a mapping"),
])
def test_metadata_must_be_json(metadata, message):
    with pytest.raises(ValueError) as info:
        Artifact("c", "native", "k.c", b"", metadata)
    assert message in str(info.value)


def test_metadata_cycle_is_a_value_error_not_recursion_error():
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match="nested deeper than"):
        Artifact("c", "native", "k.c", b"", {"x": cyclic})


def test_metadata_is_a_read_only_deep_copy_that_still_behaves_like_json():
    source = {"cflags": ["-O2"], "nested": {"a": [1, {"b": 2}]}, "n": 3}
    a = Artifact("c", "native", "k.c", b"", source)
    source["cflags"].append("-g")
    assert a.metadata == {"cflags": ["-O2"], "nested": {"a": [1, {"b": 2}]}, "n": 3}
    assert a.metadata["cflags"] + ["-fPIC"] == ["-O2", "-fPIC"]
    assert json.loads(json.dumps(a.metadata)) == a.metadata
    for mutate in (lambda: a.metadata.__setitem__("n", 4),
                   lambda: a.metadata["cflags"].append("-g"),
                   lambda: a.metadata["nested"]["a"].pop(),
                   lambda: a.metadata.update(x=1)):
        with pytest.raises(TypeError, match="read-only"):
            mutate()
    assert a.metadata["n"] == 3


def test_numpy_scalars_in_metadata_become_python_numbers():
    np = pytest.importorskip("numpy")
    a = Artifact("c", "native", "k.c", b"", {"align": np.int64(64), "scale": np.float32(0.5)})
    assert a.metadata == {"align": 64, "scale": 0.5}
    assert type(a.metadata["align"]) is int


def test_artifact_is_frozen_hashable_and_picklable():
    a = art(metadata={"cflags": ["-O2"]})
    with pytest.raises(AttributeError):
        a.loader = "none"  # type: ignore[misc]
    b = art(metadata={"cflags": ["-O2"]})
    assert a == b and hash(a) == hash(b)
    assert a != art(content=b"other")
    assert pickle.loads(pickle.dumps(a)) == a
    # Equal metadata hashes alike whatever the key order or int/float spelling.
    c = Artifact("c", "native", "k.c", b"", {"a": 1, "b": [2.0, {"x": None}]})
    d = Artifact("c", "native", "k.c", b"", {"b": [2, {"x": None}], "a": 1.0})
    assert c == d and hash(c) == hash(d)
    assert copy.deepcopy(a) == a
    assert a.serializable is True
    assert a.size == 4 and len(a.sha256()) == 64
    assert "<4 bytes>" in repr(a)


# -- InMemoryArtifact -----------------------------------------------------------

def test_in_memory_artifact_cannot_give_content():
    fn = lambda x: x  # noqa: E731
    a = InMemoryArtifact("torch", "python", "model.py", fn, {"entry": "main"})
    assert a.serializable is False and a.value is fn and a.size is None
    with pytest.raises(ExportError) as info:
        _ = a.content
    msg = str(info.value)
    assert msg.startswith("artifact torch/model.py lives in memory (loader 'python') "
                          "and cannot be exported")
    assert "jit()" in msg


def test_in_memory_artifact_validates_names_and_compares_by_identity():
    with pytest.raises(ValueError, match=r"^file_name"):
        InMemoryArtifact("torch", "python", "../x", object())
    a = InMemoryArtifact("torch", "python", "m", [1])
    b = InMemoryArtifact("torch", "python", "m", [1])
    assert a == a and a != b


# -- ArtifactSet ---------------------------------------------------------------

def sample_set() -> ArtifactSet:
    return ArtifactSet([
        art("llvm", "native", "kernels.o"),
        art("llvm", "none", "kernels.bc", b"BC"),
        art("host", "native", "host.c", b"int x;"),
        art("jit", "llvmjit", "k.bc", b"BC"),
        art("llvm", "native", "constants.bin", b"\0" * 8, {"symbol": "kiln__consts"}),
    ])


def test_artifact_set_keeps_order_and_groups():
    s = sample_set()
    assert len(s) == 5
    assert [a.file_name for a in s] == ["kernels.o", "kernels.bc", "host.c", "k.bc",
                                        "constants.bin"]
    assert list(s.by_loader()) == ["native", "none", "llvmjit"]
    assert [a.file_name for a in s.by_loader()["native"]] == ["kernels.o", "host.c",
                                                              "constants.bin"]
    assert list(s.by_codegen()) == ["llvm", "host", "jit"]
    assert s[2].file_name == "host.c" and s[-1].file_name == "constants.bin"


def test_artifact_set_rejects_duplicates_and_non_artifacts():
    s = sample_set()
    with pytest.raises(ValueError, match=re.escape("duplicate artifact llvm/kernels.o")):
        s.add(art("llvm", "none", "kernels.o", b"different"))
    with pytest.raises(TypeError, match="got str"):
        s.add("kernels.o")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="duplicate"):
        ArtifactSet([art(), art()])
    # Same file name under another codegen is fine.
    s.add(art("c", "native", "kernels.o"))
    assert len(s) == 6


def test_artifact_set_lookup_contains_and_filter():
    s = sample_set()
    assert s.get("host", "host.c") == art("host", "native", "host.c", b"int x;")
    assert s.get("host", "nope.c") is None
    assert ("llvm", "kernels.bc") in s and ("llvm", "x") not in s
    assert art("host", "native", "host.c", b"int x;") in s
    assert art("host", "native", "host.c", b"changed") not in s
    assert "host.c" not in s
    native_llvm = s.filter(loader="native", codegen_id="llvm")
    assert [a.file_name for a in native_llvm] == ["kernels.o", "constants.bin"]
    assert len(s.filter(loader="none")) == 1 and len(s.filter()) == 5
    assert s.filter(codegen_id="missing") == ArtifactSet()


def test_artifact_set_equality_is_ordered():
    items = list(sample_set())
    assert ArtifactSet(items) == ArtifactSet(items)
    assert ArtifactSet(items) != ArtifactSet(reversed(items))
    assert ArtifactSet(items) != items


def test_to_manifest_is_json_with_hashes():
    s = sample_set()
    s.add(InMemoryArtifact("jit", "llvmjit", "engine", object()))
    manifest = s.to_manifest()
    json.dumps(manifest)  # JSON-able
    assert manifest[2] == {
        "codegen_id": "host", "loader": "native", "file_name": "host.c",
        "serializable": True, "size": 6,
        "sha256": "e13e332bd08e13cbe2aee094e130ed23878b3b554be5b9a665a83e63caa987ae",
        "metadata": {}}
    assert manifest[-1]["serializable"] is False and manifest[-1]["sha256"] is None
    assert s.serializable is False and sample_set().serializable is True


def test_inspect_table_lists_every_artifact():
    s = sample_set()
    s.add(InMemoryArtifact("jit", "llvmjit", "engine", object()))
    s.add(Artifact("llvm", "native", "big.o", b"", {"linked": True, "size": 45_000_000}))
    lines = s.inspect().splitlines()
    assert lines[0].split() == ["codegen_id", "loader", "file_name", "size", "metadata"]
    assert set(lines[1]) == {"-", " "}
    rows = {line.split()[2]: line for line in lines[2:-1]}
    assert rows["host.c"].split()[:4] == ["host", "native", "host.c", "6"]
    assert "symbol=kiln__consts" in rows["constants.bin"]
    assert "in-memory" in rows["engine"]
    assert "45000000 (linked)" in rows["big.o"] and "linked=" not in rows["big.o"]
    assert lines[-1] == "7 artifact(s), 22 bytes stored"


# -- layering -------------------------------------------------------------------

def test_kiln_artifact_imports_nothing_from_the_compiler(tmp_path):
    """A deploy host reads artifacts without llvmlite, onnx or the IR (docs/runtime.md)."""
    script = textwrap.dedent(f"""
        import sys
        for name in ("llvmlite", "llvmlite.binding", "onnx"):
            sys.modules[name] = None  # any import of them now fails
        import kiln.artifact as ka
        s = ka.ArtifactSet([ka.Artifact("llvm", "none", "k.bc", b"BC", {{"a": 1}}),
                            ka.Artifact("host", "native", "host.c", b"int x;")])
        ka.archive.write_tar({str(tmp_path / "a.tar")!r}, s, {{"m": 1}})
        assert ka.load({str(tmp_path / "a.tar")!r}) == s
        data = ka.blob.pack(ka.blob.build_contents(s, {{"m": 1}}))
        assert ka.blob.unpack(data).artifacts == s
        text = ka.inspect_artifact(s.get("llvm", "k.bc"), "ll")
        assert "llvmlite is not installed" in text, text
        bad = sorted(m for m in sys.modules if m.startswith(
            ("kiln.ir", "kiln.codegen", "kiln.transform", "kiln.frontend", "kiln.driver"))
            or (m.split(".")[0] in ("llvmlite", "onnx") and sys.modules[m] is not None))
        assert not bad, bad
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONWARNINGS": "error"}, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_deeply_nested_json_text_is_refused_before_parsing():
    """json.loads recurses per level; a hostile text 100,000 brackets deep is measured
    first and refused with the same clear error, strings with brackets are not counted."""
    from kiln.artifact._json import MAX_DEPTH, parse_json_object

    deep = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(ValueError, match=r"^meta: expected a JSON object, found invalid JSON "
                                         rf"\(nested 100001 levels deep, "
                                         rf"deeper than {MAX_DEPTH}\)"):
        parse_json_object(deep, "meta", ValueError)
    ok = '{"s": "' + "[" * 1000 + '", "a": ' + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "}"
    assert parse_json_object(ok, "meta", ValueError)["s"] == "[" * 1000


def test_frozen_metadata_is_taken_as_is_and_still_checked():
    """Metadata frozen once is reused, not walked again, when it is handed on (an
    artifact's stub, a blob's contents); a FrozenDict built by hand is checked like any
    mapping, and a frozen value nested past MAX_DEPTH is refused as its walk would be."""
    from kiln.artifact._json import MAX_DEPTH, FrozenDict, freeze, freeze_object

    meta = freeze_object({"kernels": [{"name": "k0", "args": [1, 2.5, None, True]}]}, "m")
    again = freeze_object({**meta, "linked": True}, "m")
    assert again["kernels"] is meta["kernels"]
    assert again == {"kernels": [{"name": "k0", "args": [1, 2.5, None, True]}], "linked": True}
    assert art(metadata=meta).metadata == meta
    with pytest.raises(ValueError, match=r"^m\['a'\]\['x'\]: a set is not JSON-able"):
        freeze_object({"a": FrozenDict({"x": {1, 2}})}, "m")
    deep = freeze([[[]]], "d")  # three levels of containers
    freeze(deep, "d", MAX_DEPTH - 2)
    with pytest.raises(ValueError, match=f"nested deeper than {MAX_DEPTH} levels"):
        freeze(deep, "d", MAX_DEPTH - 1)

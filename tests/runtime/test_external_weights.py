"""Weights beside the library (export_library(weights="external")), libraries loaded
from bytes, and one mapping per weights content in a process.

One small dense model (two matmuls, ~60 KiB of weights) is compiled once per
codegen; every library below is exported from it (or from a second model with
other weights, for the mismatched file). Results are compared bit for bit with
the library that embeds its weights, and with numpy.
"""

from __future__ import annotations

import gc
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.artifact import Artifact, blob, weights_file
from kiln.artifact.elf import find_blob_symbol
from kiln.artifact.integrity import chunk_digests
from kiln.errors import ExportError, FormatError, MissingFileError, UsageError
from kiln.ir import IRBuilder, IRModule
from kiln.ir import graph as g
from kiln.runtime import external_weights, load_module
from kiln.runtime.library import export_library
from support.c_programs import EXAMPLES, build_c_program
from support.processes import run_python
from support.toolchains import c_compiler

RNG = np.random.default_rng(60)
X = RNG.standard_normal((2, 40)).astype(np.float32)


def dense(seed: int) -> tuple[IRModule, np.ndarray]:
    """main(x) = relu(x @ W1) @ W2 with weights from `seed`, and numpy's answer on X."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((40, 96)).astype(np.float32)
    w2 = rng.standard_normal((96, 64)).astype(np.float32)
    ib = IRBuilder()
    with ib.function("main"):
        x = ib.param("x", X.shape, "float32")
        h = ib.emit(kiln.ops.call("matmul", x, g.Constant(w1, "w1")), "h")
        h = ib.emit(kiln.ops.call("relu", h), "hr")
        ib.ret(ib.emit(kiln.ops.call("matmul", h, g.Constant(w2, "w2")), "y"))
    return ib.get(), np.maximum(X @ w1, 0) @ w2


@pytest.fixture(scope="module", params=["llvm", "c"])
def libs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
         ) -> dict[str, Path]:
    """The model's library exported embedded and external, plus an external library of
    other weights (same shapes), for codegen `request.param`."""
    tmp = tmp_path_factory.mktemp(f"weights_{request.param}")
    mod, _ = dense(1)
    ex = kiln.compile(mod, target=request.param)
    other = kiln.compile(dense(2)[0], target=request.param)
    return {"embedded": ex.export_library(tmp / "emb.so"),
            "external": ex.export_library(tmp / "ext.so", weights="external"),
            "other": other.export_library(tmp / "other.so", weights="external"),
            "tar": tmp / "lib.tar", "ex": ex}  # type: ignore[dict-item]


def copy_library(libs: dict[str, Path], dest: Path, weights: bool = True) -> Path:
    """A copy of the external library (and its weights file) in `dest`."""
    so = Path(shutil.copy(libs["external"], dest / "ext.so"))
    if weights:
        shutil.copy(str(libs["external"]) + ".weights", dest / "ext.so.weights")
    return so


def blob_of(so: Path) -> tuple[int, blob.BlobContents]:
    """Where a library's blob starts in its file, and what it holds."""
    with open(so, "rb") as f:
        sym = find_blob_symbol(f, str(so))
    data = so.read_bytes()
    size = blob.blob_length(data[sym.file_offset:sym.file_offset + blob.HEADER_SIZE])
    return sym.file_offset, blob.unpack(data[sym.file_offset:sym.file_offset + size])


def embedded_weights_at(so: Path) -> int:
    """Where the first weights of a library that embeds them start in its file."""
    start, contents = blob_of(so)
    return start + contents.linked[0].offset


def patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_external_weights_compute_what_the_embedded_library_does(libs):
    weights = Path(str(libs["external"]) + ".weights")
    assert weights.is_file()
    # the weights left the .so (its file size says little: the linker pads segments to
    # pages): the embedded library's first weights are in the weights file, not in it
    start = embedded_weights_at(libs["embedded"])
    sample = libs["embedded"].read_bytes()[start:start + 4096]
    assert sample in weights.read_bytes()
    assert sample not in libs["external"].read_bytes()
    with load_module(libs["embedded"]) as emb, load_module(libs["external"]) as ext:
        want, got = emb["main"](X), ext["main"](X)
        assert got.tobytes() == want.tobytes()
        np.testing.assert_allclose(got, dense(1)[1], rtol=1e-4, atol=1e-4)
        meta = ext.weights.header
        assert meta.content_hash == ext.weights.content_hash
        assert [t.name for t in meta.tensors] == ["constants.bin"]
        assert all(t.offset % weights_file.ALIGN == 0 for t in meta.tensors)


def test_a_fresh_process_loads_the_external_library(libs, tmp_path):
    so = copy_library(libs, tmp_path)
    np.save(tmp_path / "x.npy", X)
    code = ("import sys, numpy as np\nfrom kiln.runtime import load_module\n"
            "m = load_module(sys.argv[1])\nnp.save(sys.argv[3], m['main'](np.load(sys.argv[2])))\n")
    proc = run_python(code, str(so), str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))
    assert proc.returncode == 0, proc.stderr
    with load_module(libs["embedded"]) as emb:
        assert np.load(tmp_path / "y.npy").tobytes() == emb["main"](X).tobytes()


def test_weights_elsewhere_are_named_with_weights_path(libs, tmp_path):
    gc.collect()  # no library of these weights is open: the file must be found
    so = copy_library(libs, tmp_path, weights=False)
    with pytest.raises(MissingFileError, match=r"weights file .*ext\.so\.weights.* weights=PATH"):
        load_module(so)
    moved = Path(shutil.copy(str(libs["external"]) + ".weights", tmp_path / "w.bin"))
    with load_module(so, weights=moved) as m:
        assert m["main"](X).shape == (2, 64)
    with pytest.raises(UsageError, match="embedded"):
        load_module(libs["embedded"], weights=moved)


def _refused(so: Path, match: str, **kw) -> None:
    """Loading `so` raises FormatError matching `match` and leaves nothing cached."""
    gc.collect()
    before = set(external_weights.mapped_hashes())
    with pytest.raises(FormatError, match=match):
        load_module(so, **kw)
    gc.collect()
    assert set(external_weights.mapped_hashes()) <= before


def test_a_damaged_truncated_or_foreign_weights_file_is_refused(libs, tmp_path):
    so = copy_library(libs, tmp_path)
    weights = Path(str(so) + ".weights")
    good = weights.read_bytes()
    _refused(so, "is not this library's weights file", weights=str(libs["other"]) + ".weights")
    weights.write_bytes(good[:-100])
    _refused(so, "truncated")
    weights.write_bytes(good)
    patch(weights, 8, struct.pack("<I", 7))
    _refused(so, "format version 7; this kiln reads version 1")
    weights.write_bytes(good)
    patch(weights, 0, b"NOTKILN!")
    _refused(so, "not a kiln weights file")
    weights.write_bytes(good)
    patch(weights, weights_file.PREAMBLE.size + 20, b"9")  # inside the index
    _refused(so, "damaged header|inconsistent|unreadable")


@pytest.mark.parametrize("weights", ["embedded", "external"])
def test_a_library_without_the_check_table_is_checked_by_its_sha256s(libs, tmp_path, weights):
    """As a library exported before the weights check record: the SHA-256s, as before."""
    ex = libs["ex"]
    if ex.target.kind.name != "llvm":
        pytest.skip("one codegen is enough for the older path")
    so = export_library(ex.artifacts, ex.metadata, tmp_path / "old.so", prefix=ex.prefix,
                        weights=weights, weights_check=False)
    assert "weights_check" not in blob_of(so)[1].metadata
    assert "weights_check" in blob_of(libs[weights])[1].metadata
    if weights == "external":
        patch(Path(str(so) + ".weights"), weights_file.ALIGN + 100, b"\xff")
    else:
        patch(so, embedded_weights_at(so) + 100, b"\xff")
    with load_module(so) as m, pytest.raises(FormatError, match="SHA-256 mismatch"):
        m["main"](X)


@pytest.mark.parametrize("hash_name, words", [("lane64", r"checksum \(kiln.lane64/1\)"),
                                              ("sha256", "SHA-256")])
def test_damaged_weight_data_never_reaches_a_result(libs, tmp_path, monkeypatch, hash_name,
                                                    words):
    monkeypatch.setenv("KILN_WEIGHTS_HASH", hash_name)  # the library's table, or the file's
    so = copy_library(libs, tmp_path)
    weights = Path(str(so) + ".weights")
    data_at = weights_file.ALIGN  # the first tensor
    patch(weights, data_at + 100, b"\xff\xff\xff\xff")
    _refused(so, rf"tensor 'constants.bin': {words} mismatch in bytes \[0, ", verify_weights=True)
    with load_module(so) as m:  # lazy: the first call checks, and every call refuses
        for _ in range(2):
            with pytest.raises(FormatError, match=f"{words} mismatch"):
                m["main"](X)


def test_libraries_of_one_weights_content_share_one_mapping(libs, tmp_path):
    ex = libs["ex"]
    second = ex.export_library(tmp_path / "again.so", weights="external")
    with load_module(libs["external"]) as a, load_module(second) as b:
        assert a.weights is b.weights  # one mapping, opened once
        assert a["main"](X).tobytes() == b["main"](X).tobytes()
        # both libraries' weight pages are the one file's pages (its page cache)
        inode = os.stat(a.weights.path).st_ino
        maps = Path("/proc/self/maps").read_text() if Path("/proc/self/maps").exists() else ""
        if maps:
            assert sum(f" {inode} " in line for line in maps.splitlines()) >= 3
        key = a.weights.content_hash
    del a, b
    gc.collect()
    assert key not in external_weights.mapped_hashes()  # weak: gone with its libraries


def test_a_library_loads_from_bytes(libs):
    if not hasattr(os, "memfd_create"):
        pytest.skip("load_module(bytes) needs memfd_create (Linux)")
    with load_module(libs["embedded"]) as emb:
        want = emb["main"](X)
    data = libs["embedded"].read_bytes()
    with load_module(data) as m, load_module(memoryview(data)) as m2:
        assert m["main"](X).tobytes() == want.tobytes() == m2["main"](X).tobytes()
    ext = libs["external"].read_bytes()
    with pytest.raises(UsageError, match="weights=PATH"):
        load_module(ext)
    with load_module(bytearray(ext), weights=str(libs["external"]) + ".weights") as m:
        assert m["main"](X).tobytes() == want.tobytes()
    with pytest.raises(FormatError, match="no ELF header"):
        load_module(b"not a library")


def test_external_weights_need_a_shared_library(libs, tmp_path):
    ex = libs["ex"]
    for name in ("lib.tar", "lib.a"):
        with pytest.raises(UsageError, match=r"only a \.so maps a weights file"):
            ex.export_library(tmp_path / name, weights="external")
    with pytest.raises(UsageError, match="embedded, external"):
        ex.export_library(tmp_path / "x.so", weights="outside")


def test_a_failed_export_leaves_no_weights_file(libs, tmp_path):
    def broken_link(out, objects, options):
        raise ExportError("the link failed")

    with pytest.raises(ExportError, match="the link failed"):
        libs["ex"].export_library(tmp_path / "f.so", weights="external", fcompile=broken_link)
    assert list(tmp_path.iterdir()) == []  # neither the library nor its weights file


def test_a_c_program_maps_the_weights_file(libs, tmp_path):
    if libs["ex"].target.kind.name != "c":
        pytest.skip("one codegen is enough for the C host")
    prog = build_c_program(EXAMPLES / "deploy.c", tmp_path / "deploy")
    so = copy_library(libs, tmp_path)
    X.tofile(tmp_path / "x.bin")
    args = [str(prog), str(so), libs["ex"].prefix, str(tmp_path / "x.bin"), "2,40",
            str(tmp_path / "y.bin"), "2,64"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    with load_module(libs["embedded"]) as emb:
        assert (tmp_path / "y.bin").read_bytes() == emb["main"](X).tobytes()
    env = {**os.environ, "KILN_WEIGHTS": str(libs["other"]) + ".weights"}
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 1 and "(-3)" in proc.stderr
    # A damaged weight, in the file or embedded: the program's check refuses it.
    patch(Path(str(so) + ".weights"), weights_file.ALIGN + 100, b"\xff")
    emb = tmp_path / "emb.so"
    data = bytearray(libs["embedded"].read_bytes())
    data[embedded_weights_at(libs["embedded"]) + 100] ^= 0x01
    emb.write_bytes(bytes(data))
    for lib in (so, emb):
        args[1] = str(lib)
        proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1 and "weights are damaged (4 MiB chunk 0)" in proc.stderr


def test_the_weights_loader_is_warning_free_c(tmp_path):
    """kiln_weights.c as export_library writes it compiles with every warning an error."""
    data = Artifact("llvm", "native", "constants.bin", bytes(range(256)) * 40,
                    {"symbol": "m_consts", "align": 64})
    loader, entry = external_weights.export_weights(
        [(data, 4096, chunk_digests(data.content, 4096))], "m", tmp_path / "m.so.weights")
    assert entry["file"] == "m.so.weights" and entry["tensors"][0]["size"] == 10240
    src = tmp_path / "kiln_weights.c"
    src.write_bytes(bytes(loader.content))
    subprocess.run([c_compiler(), "-std=c99", "-Wall", "-Wextra", "-Werror", "-fPIC", "-c",
                    str(src), "-o", str(tmp_path / "w.o")], check=True, timeout=120)

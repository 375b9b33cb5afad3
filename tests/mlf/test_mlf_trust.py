"""kiln.mlf.load verifies before it trusts: metadata.json is checked against the compiled
code (library metadata, header constants, symbols), inputs are never cast, and the
archive reader is bounded. Loads of bad archives run in child processes, so a check
that failed open would show as a signal, not as a passing test."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlf_mutants import archive_files, resealed, run_in_workers, with_metadata, write_archive
from test_mlf import IN_SHAPE, _cnn

import kiln
from kiln.artifact import safe_tar
from kiln.errors import CallError, FormatError


@pytest.fixture(scope="module")
def cnn_mlf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    """(archive, input, output of the archive as exported)."""
    tmp = tmp_path_factory.mktemp("mlf_trust")
    _cnn(tmp / "cnn.onnx")
    ex = kiln.compile(kiln.frontend.from_onnx(str(tmp / "cnn.onnx")), "c")
    archive = kiln.export_model_library_format(ex, tmp / "cnn.tar", model_name="cnn")
    x = np.random.default_rng(5).standard_normal(IN_SHAPE).astype(np.float32)
    model = kiln.mlf.load(archive)
    try:
        (y,) = model(x)
    finally:
        model.close()
    return archive, x, y


def _set(path: str, value: Any) -> Any:
    """An edit of metadata.json setting the value at a dotted path ("outputs.0.shape")."""
    *parents, last = path.split(".")

    def edit(meta: dict[str, Any]) -> None:
        node: Any = meta
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return edit


# (edit of metadata.json, what the FormatError must say)
DISAGREEMENTS = [
    (_set("outputs.0.shape", [1, 5]), "outputs[0].shape is [1, 5], the compiled main has [1, 10]"),
    (_set("outputs.0.shape", [1, 100000]), "outputs[0].shape is [1, 100000]"),
    (_set("outputs.0.dtype", "float64"), 'outputs[0].dtype is "float64", the compiled main has '
                                         '"float32"'),
    (_set("inputs.0.dtype", "int8"), 'inputs[0].dtype is "int8"'),
    (_set("inputs.0.shape", [1, 3, 16]), "inputs[0].shape is [1, 3, 16]"),
    (_set("inputs.0.name", "y"), 'inputs[0].name is "y", the compiled main has "x"'),
    (_set("inputs", []), "inputs lists 0 tensors, the compiled main has 1"),
    (_set("memory.main.workspace_bytes", 0), "memory.main.workspace_bytes is 0, but the "
                                             "compiled code has CNN_WORKSPACE_BYTES = "),
    (_set("memory.main.workspace_bytes", 64), "CNN_WORKSPACE_BYTES"),
    (_set("memory.main.io_bytes", 3), "memory.main.io_bytes is 3, but the inputs and outputs "
                                      "take 3112 bytes"),
    (_set("memory.main.constants_bytes", 1), "parameters/cnn.params holds"),
    (_set("model_name", "other"), "model_name is 'other', but the archive has no "
                                  "codegen/host/include/other.h"),
    (_set("prefix", "other_"), "no symbol 'other__metadata'"),
    (_set("outputs.0.shape.1", "x"), 'outputs[0].shape[1]: expected an int >= 0, got "x"'),
    (_set("memory.main.workspace_bytes", -1), "memory.main.workspace_bytes: expected an int"),
    (_set("model_name", "kiln_x"), "model_name: expected a C identifier not starting with"),
    (_set("build.include_dirs", ["/usr/include"]), "build.include_dirs[0]: expected a "
                                                   "relative path"),
    (_set("build.libs", ["-Wl,-rpath,/tmp"]), "build.libs[0]: expected a -l<library> flag"),
    (_set("version", 5), "Model Library Format version 5 is not one this kiln reads"),
    (lambda m: m["build"]["cflags"].pop("codegen/host/src/kernels.c"),
     "build.cflags does not list codegen/host/src/kernels.c, which the archive holds"),
]


def test_metadata_that_disagrees_with_the_compiled_code_is_refused(
        cnn_mlf: tuple[Path, np.ndarray, np.ndarray], tmp_path: Path) -> None:
    archive, x, y = cnn_mlf
    bad = [with_metadata(archive, tmp_path / f"bad{i}.tar", edit)
           for i, (edit, _) in enumerate(DISAGREEMENTS)]
    results = run_in_workers(bad, x, y, tmp_path)
    for path, (_, message) in zip(bad, DISAGREEMENTS):
        kind, detail = results[path]
        assert kind == "kiln:FormatError" and message in detail, (path.name, kind, detail)
        assert f"{path}: metadata.json" in detail


def test_inputs_are_never_cast(cnn_mlf: tuple[Path, np.ndarray, np.ndarray]) -> None:
    archive, x, y = cnn_mlf
    model = kiln.mlf.load(archive)
    try:
        with pytest.raises(CallError, match=r"input 'x': expected dtype float32 .*got <f8"):
            model(x.astype(np.float64))
        with pytest.raises(CallError, match="got >f4"):
            model(x.astype(">f4"))
        with pytest.raises(CallError, match=r"expected shape \[1, 3, 16, 16\], got \[3, 16, 16\]"):
            model(x[0])
        with pytest.raises(CallError, match="expected 1 inputs, got 2"):
            model(x, x)
        (again,) = model(np.asfortranarray(x))  # layout is not dtype: copied, not refused
        np.testing.assert_array_equal(again, y)
    finally:
        model.close()


def _tar_with(path: Path, entries: list[tarfile.TarInfo], data: bytes = b"") -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for info in entries:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def test_sparse_links_and_devices_are_refused(tmp_path: Path) -> None:
    sparse = tarfile.TarInfo("metadata.json")
    sparse.type = tarfile.GNUTYPE_SPARSE
    link = tarfile.TarInfo("metadata.json")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    dev = tarfile.TarInfo("metadata.json")
    dev.type = tarfile.CHRTYPE
    for i, (info, message) in enumerate([(sparse, "is a sparse file"), (link, "is a link"),
                                         (dev, "is a device")]):
        with pytest.raises(FormatError, match=message):
            kiln.mlf.load(_tar_with(tmp_path / f"t{i}.tar", [info]))


def test_archive_limits(cnn_mlf: tuple[Path, np.ndarray, np.ndarray], tmp_path: Path,
                        monkeypatch: pytest.MonkeyPatch) -> None:
    archive, _, _ = cnn_mlf
    files = archive_files(archive)
    largest = max(len(d) for d in files.values())
    monkeypatch.setattr(safe_tar, "MAX_MEMBERS", len(files) - 1)
    with pytest.raises(FormatError, match=f"more than {len(files) - 1} members"):
        kiln.mlf.load(archive)
    monkeypatch.undo()
    monkeypatch.setattr(safe_tar, "MAX_MEMBER_BYTES", largest - 1)
    with pytest.raises(FormatError, match=f"over the {largest - 1}-byte limit"):
        kiln.mlf.load(archive)
    monkeypatch.undo()
    total = sum(len(d) for d in files.values())
    monkeypatch.setattr(safe_tar, "MAX_TOTAL_BYTES", total - 1)
    with pytest.raises(FormatError, match=f"members total more than {total - 1} bytes"):
        kiln.mlf.load(archive)


def test_compressed_archives_are_refused_by_load(cnn_mlf: tuple[Path, np.ndarray, np.ndarray],
                                                 tmp_path: Path) -> None:
    archive, _, _ = cnn_mlf
    gz = tmp_path / "cnn.tar.gz"
    gz.write_bytes(gzip.compress(archive.read_bytes()))
    with pytest.raises(FormatError, match="gzip-compressed; decompress it first"):
        kiln.mlf.load(gz)


def test_a_compression_bomb_is_stopped_while_decompressing(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    # 64 MiB of zeros in one member compresses to ~64 KiB; kiln inspect accepts .tar.gz
    # and counts the decompressed stream.
    from kiln.cli.inspect import describe

    plain = write_archive(tmp_path / "bomb.tar", {"metadata.json": b"{}",
                                                   "zeros.bin": bytes(64 << 20)})
    bomb = tmp_path / "bomb.tar.gz"
    bomb.write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    assert bomb.stat().st_size < 1 << 20
    monkeypatch.setattr(safe_tar, "MAX_STREAM_BYTES", 8 << 20)
    with pytest.raises(FormatError, match="decompresses to more than"):
        describe(str(bomb))


def test_a_header_claiming_a_huge_member_is_refused_before_reading(tmp_path: Path) -> None:
    info = tarfile.TarInfo("metadata.json")
    info.size = 10 << 30
    header = info.tobuf(tarfile.GNU_FORMAT)
    path = tmp_path / "huge.tar.gz"
    path.write_bytes(gzip.compress(header + bytes(4096)))
    from kiln.cli.inspect import describe

    with pytest.raises(FormatError, match="over the 4294967296-byte limit"):
        describe(str(path))


def test_a_repacked_archive_with_dot_prefixes_still_loads(
        cnn_mlf: tuple[Path, np.ndarray, np.ndarray], tmp_path: Path) -> None:
    archive, x, y = cnn_mlf
    files = archive_files(archive)
    repacked = write_archive(tmp_path / "dot.tar", {f"./{n}": d for n, d in files.items()})
    model = kiln.mlf.load(repacked)
    try:
        np.testing.assert_array_equal(model(x)[0], y)
    finally:
        model.close()


def test_reloading_reuses_objects_and_a_changed_file_builds_again(
        cnn_mlf: tuple[Path, Any, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Objects built from the same archive files and flags are reused within a process
    (kiln.runtime.object_cache); an archive with any other file builds again."""
    from kiln.runtime import native, object_cache

    archive, x, y = cnn_mlf
    compiled: list[str] = []
    run = native.run

    def recording(cmd: list[str], what: str) -> None:
        if "-c" in cmd:
            compiled.append(Path(cmd[cmd.index("-c") + 1]).name)
        run(cmd, what)

    def output(path: Path) -> np.ndarray:
        model = kiln.mlf.load(path)
        try:
            (out,) = model(x)
        finally:
            model.close()
        return np.asarray(out)

    monkeypatch.setattr(native, "run", recording)
    object_cache.clear()
    np.testing.assert_array_equal(output(archive), y)
    built = sorted(compiled)
    assert {"kernels.c", "cnn_mlf.c", "kiln_mlf_probe.c"} <= set(built)
    compiled.clear()
    np.testing.assert_array_equal(output(archive), y)
    assert compiled == []  # every object reused; only the link ran
    files = archive_files(archive)
    files["codegen/host/include/cnn.h"] += b"\n/* another header: every object again */\n"
    changed = write_archive(tmp_path / "changed.tar", resealed(files))
    np.testing.assert_array_equal(output(changed), y)
    assert sorted(compiled) == built

"""MLF versions and checksums: the golden archive of every version loads and answers
(those before version 3, which record no checksums, with an UncheckedArchiveWarning;
version 3, which records no per-weight SHA-256, with an UncheckedParametersWarning);
from version 3 a damaged member or metadata.json is a FormatError naming it and both
digests, from version 4 a damaged weight one naming the weight, raised before anything
is compiled; a member below a file is a FormatError naming both members."""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlf_mutants import ADDRELU_BIAS, archive_files, sealed, write_archive

import kiln
from kiln.errors import ArgumentTypeError, FormatError
from kiln.export.mlf import MLF_VERSION
from kiln.mlf import UncheckedArchiveWarning, UncheckedParametersWarning

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
GOLDEN_V1 = GOLDEN / "mlf_v1_2026-11-23.tar"
GOLDEN_V2 = GOLDEN / "mlf_v2_2026-11-27.tar"
GOLDEN_V3 = GOLDEN / "mlf_v3_2026-11-27.tar"
GOLDEN_V4 = GOLDEN / "mlf_v4_2026-11-27.tar"
PARAMS = "parameters/addrelu.params"


def _answer(archive: Path) -> tuple[int, np.ndarray]:
    """(version, output on a fixed input) of a loaded archive."""
    model = kiln.mlf.load(archive)
    try:
        (y,) = model(np.array([1.0, 0.5, -3.0, 0.1], np.float32))
        return model.metadata["version"], y
    finally:
        model.close()


def _want() -> np.ndarray:
    return np.maximum(np.array([1.0, 0.5, -3.0, 0.1], np.float32) + ADDRELU_BIAS, 0)


@pytest.mark.parametrize("golden", [GOLDEN_V1, GOLDEN_V2], ids=["v1", "v2"])
def test_an_archive_without_checksums_loads_with_a_warning(golden: Path) -> None:
    """Version 1 (weights as a C array, the allocator inside addrelu_mlf.c) and version 2
    (weights binary), written by kiln's MLF writer of their time for y = relu(x + b)."""
    with pytest.warns(UncheckedArchiveWarning, match=r"no content checksums.*re-export it"):
        version, y = _answer(golden)
    assert version == int(golden.name.split("_")[1][1:])
    np.testing.assert_array_equal(y, _want())


def test_an_archive_without_per_weight_checksums_loads_with_a_warning(tmp_path: Path) -> None:
    """Version 3 checksums its members (damage is refused) but not each weight."""
    with pytest.warns(UncheckedParametersWarning, match=r"no per-tensor checksums of its "
                      r"parameters.*re-export it"):
        version, y = _answer(GOLDEN_V3)
    assert version == 3
    np.testing.assert_array_equal(y, _want())
    bad = write_archive(tmp_path / "v3.tar", _flipped(archive_files(GOLDEN_V3), PARAMS, 5))
    with pytest.warns(UncheckedParametersWarning):
        assert f"member '{PARAMS}' is damaged" in _refused(bad, tmp_path)


def test_the_current_version_has_a_golden_that_loads_without_a_warning() -> None:
    # pytest runs with -W error: a warning here fails the test.
    goldens = sorted(GOLDEN.glob(f"mlf_v{MLF_VERSION}_*.tar"))
    assert goldens == [GOLDEN_V4], "a new MLF version needs its golden (make_mlf_golden.py)"
    version, y = _answer(GOLDEN_V4)
    assert version == MLF_VERSION
    np.testing.assert_array_equal(y, _want())
    meta = json.loads(archive_files(GOLDEN_V4)["metadata.json"])
    members = set(archive_files(GOLDEN_V4)) - {"metadata.json"}
    assert set(meta["checksums"]["chunk_sha256"]) == members
    assert meta["parameters"] == [{"name": "b", "dtype": "float32", "shape": [4], "offset": 0,
                                   "bytes": 16, "sha256": hashlib.sha256(
                                       ADDRELU_BIAS.tobytes()).hexdigest()}]


def test_a_flipped_bit_in_a_weight_is_refused_naming_it(tmp_path: Path) -> None:
    digest = hashlib.sha256(ADDRELU_BIAS.tobytes()).hexdigest()
    for at in (0, 5, 15):
        path = write_archive(tmp_path / f"w{at}.tar",
                             _flipped(archive_files(GOLDEN_V4), PARAMS, at))
        message = _refused(path, tmp_path)
        assert message.startswith(f"{path}: Model Library Format archive: parameter tensor "
                                  f"'b' (float32[4], bytes [0, 16) of {PARAMS}) is damaged: "
                                  f"expected SHA-256 {digest} (metadata.json, parameters), "
                                  "found "), message


def _flipped(files: dict[str, bytes], member: str, at: int) -> dict[str, bytes]:
    data = bytearray(files[member])
    data[at] ^= 0x10
    return {**files, member: bytes(data)}


def _refused(path: Path, tmp_path: Path) -> str:
    with pytest.raises(FormatError) as info:
        kiln.mlf.extract_checked(path, tmp_path / f"{path.stem}_tree")
    return str(info.value)


def test_a_flipped_bit_in_any_member_is_refused_naming_it(tmp_path: Path) -> None:
    files = archive_files(GOLDEN_V4)
    digests = json.loads(files["metadata.json"])["checksums"]["chunk_sha256"]
    host = files["codegen/host/src/host.c"]
    comment = host.index(b"/*") + 3  # inside a comment: the build would not notice
    for member, at in [("codegen/host/src/host.c", comment),
                       ("codegen/host/include/addrelu.h", 40), ("runtime/include/kiln/kiln.h",
                                                                 100)]:
        path = write_archive(tmp_path / f"{member.replace('/', '_')}.tar",
                             _flipped(files, member, at))
        message = _refused(path, tmp_path)
        assert f"member '{member}' is damaged: expected SHA-256 {digests[member]}" in message
        assert "found " in message and message.startswith(str(path))


def test_load_refuses_a_damaged_member_before_compiling(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln.runtime import native

    def no_compiler(cmd: list[str], what: str) -> None:
        raise AssertionError(f"ran the compiler ({what})")

    monkeypatch.setattr(native, "run", no_compiler)
    path = write_archive(tmp_path / "bad.tar", _flipped(archive_files(GOLDEN_V4), PARAMS, 0))
    with pytest.raises(FormatError, match=r"parameter tensor 'b' .* is damaged"):
        kiln.mlf.load(path)


def test_damaged_metadata_and_missing_or_extra_members_are_refused(tmp_path: Path) -> None:
    files = archive_files(GOLDEN_V4)
    text = files["metadata.json"]
    cases = [
        # a bit the schema accepts: version 4 -> 3 (kiln reads 3) and "-O3" -> "-O2"
        ({**files, "metadata.json": text.replace(b'"version": 4', b'"version": 3')},
         "metadata.json is damaged: expected SHA-256 "),
        ({**files, "metadata.json": text.replace(b'"-O3"', b'"-O2"', 1)},
         "metadata.json is damaged"),
        ({k: v for k, v in files.items() if k != "runtime/include/kiln/kiln_mlf.h"},
         "checksums.chunk_sha256 lists 'runtime/include/kiln/kiln_mlf.h', which is not in "
         "the archive"),
        ({**files, "parameters/stdint.h": b"#define X 1\n"},
         "member 'parameters/stdint.h' has no checksum in metadata.json"),
    ]
    assert b'"-O3"' in text
    for i, (case, message) in enumerate(cases):
        assert message in _refused(write_archive(tmp_path / f"c{i}.tar", case), tmp_path)
    for key, what in [("checksums", "file"), ("parameters", "weight")]:
        meta = json.loads(text)
        del meta[key]
        missing = write_archive(tmp_path / f"no_{key}.tar", {**files, "metadata.json":
                                                             json.dumps(meta).encode()})
        assert f"{key}: missing (a version-4 archive records the SHA-256 of every {what}" in \
            _refused(missing, tmp_path)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t[0].update(offset=8), "parameters[0] ('b'): bytes [8, 24) overlap the weight "
                                      "before it or lie outside parameters/addrelu.params "
                                      "(16 bytes)"),
    (lambda t: t.append(dict(t[0])), "parameters[1]: the name 'b' comes twice"),
    (lambda t: t[0].update(sha256="0" * 64), "parameter tensor 'b' (float32[4], bytes [0, 16)"),
], ids=["outside", "twice", "other-hash"])
def test_a_parameter_table_that_does_not_fit_the_file_is_refused(
        tmp_path: Path, edit: Any, message: str) -> None:
    """metadata.json edited and resealed on purpose: the table itself is checked."""
    files = archive_files(GOLDEN_V4)
    meta = json.loads(files["metadata.json"])
    edit(meta["parameters"])
    files["metadata.json"] = json.dumps(sealed(meta, files)).encode()
    assert message in _refused(write_archive(tmp_path / "t.tar", files), tmp_path)


def test_damage_in_a_large_member_names_the_byte_range(tmp_path: Path) -> None:
    files = archive_files(GOLDEN_V4)
    files["src/addrelu.py"] = bytes(range(256)) * 64  # 16 KiB: four 4 KiB chunks
    files["metadata.json"] = json.dumps(sealed(json.loads(files["metadata.json"]), files,
                                               chunk=4096)).encode()
    kiln.mlf.extract_checked(write_archive(tmp_path / "ok.tar", files), tmp_path / "ok")
    message = _refused(write_archive(tmp_path / "bad.tar",
                                     _flipped(files, "src/addrelu.py", 9000)), tmp_path)
    assert "member 'src/addrelu.py' is damaged in bytes [8192, 12288): expected SHA-256" \
        in message


def test_extract_checked_takes_paths_only(tmp_path: Path) -> None:
    for path, into in [(1, tmp_path), (GOLDEN_V4, "a\x00b")]:
        with pytest.raises(ArgumentTypeError, match=r"must be a str or os\.PathLike"):
            kiln.mlf.extract_checked(path, into)  # type: ignore[arg-type]


def _tar(path: Path, entries: list[tuple[str, bytes | None]]) -> Path:
    """A tar of files (bytes) and folders (None), in order."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.parametrize("entries, message", [
    ([("codegen/host/src/host.c", b"x"), ("codegen/host/src/host.c/x", b"y")],
     "member 'codegen/host/src/host.c/x' lies below member 'codegen/host/src/host.c', "
     "which is a file"),
    ([("a", b"x"), ("a/b/c", b"y")], "member 'a/b/c' lies below member 'a', which is a file"),
    ([("a/b", b"y"), ("a", b"x")], "member 'a' is a file, but member 'a/b' lies below it"),
    ([("a", b"x"), ("a", None)], "member 'a' appears twice, as a file and as a folder"),
    ([("a", None), ("a", b"x")], "member 'a' appears twice, as a file and as a folder"),
    ([("a", b"x"), ("a", b"x")], "member 'a' appears more than once"),
], ids=["below-file", "deep-below-file", "file-above-member", "file-then-folder",
        "folder-then-file", "twice"])
def test_a_member_below_a_file_is_a_format_error_naming_both(
        tmp_path: Path, entries: list[tuple[str, bytes | None]], message: str) -> None:
    path = _tar(tmp_path / "clash.tar", entries)
    with pytest.raises(FormatError, match=re.escape(f"{path}: Model Library Format archive: "
                                                    f"{message}")):
        kiln.mlf.load(path)
    with pytest.raises(FormatError, match=re.escape(message)):
        kiln.mlf.extract_checked(path, tmp_path / "tree")


def test_folders_and_files_below_them_in_any_order_extract(tmp_path: Path) -> None:
    files = archive_files(GOLDEN_V4)
    entries: list[tuple[str, bytes | None]] = [("codegen", None), ("codegen/host", None)]
    entries += [(name, data) for name, data in files.items()]
    entries += [("codegen/host/", None), ("parameters", None)]
    meta = kiln.mlf.extract_checked(_tar(tmp_path / "dirs.tar", entries), tmp_path / "t")
    assert meta["model_name"] == "addrelu"

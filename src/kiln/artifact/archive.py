"""The `.tar` artifact archive: an ArtifactSet as ordinary files plus a manifest.

Layout (docs/format.md): `manifest.json` first, then one regular file per
artifact at `<codegen_id>/<file_name>`. The manifest names the format and its
version and lists every artifact with its loader, metadata, size and SHA-256,
plus the library metadata; it carries a SHA-256 of its own canonical form.
Anyone can unpack it with `tar xf` and read the generated code.

`read_tar` never extracts to disk and trusts no member: links, devices,
sparse members, absolute or `..` paths, duplicates, unlisted files and hash
mismatches are all FormatErrors, and the member count and sizes are bounded
(`kiln.artifact.safe_tar`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from kiln import __version__
from kiln.artifact import safe_tar
from kiln.artifact._json import canonical_json, freeze_object, parse_json_object, thaw
from kiln.artifact.artifact import Artifact, ArtifactSet, require_serializable
from kiln.artifact.schema import Anything, Int, ListOf, Obj, Schema, Str, check
from kiln.artifact.segments import Content, content_parts
from kiln.errors import ArtifactError, ExportError, FormatError

ARCHIVE_FORMAT = "kiln.artifacts"
MANIFEST_NAME = "manifest.json"

# Archive format versions. Readers accept MIN_SUPPORTED_VERSION..FORMAT_VERSION.
# Bump for any change an older reader would misread (v1 readers reject unknown
# manifest keys), add a dated line, and check in a new golden archive.
#
# 1 (2026-11-21): first version. manifest.json {format, version, kiln_version,
#   artifacts: [{codegen_id, loader, file_name, size, sha256, metadata}],
#   metadata, checksum} followed by <codegen_id>/<file_name> members.
# 2 (2026-11-22): every artifact entry has "target_key" ("" for host code; see
#   docs/artifacts.md). Version-1 archives are still read (target_key "").
FORMAT_VERSION = 2
MIN_SUPPORTED_VERSION = 1

# A manifest is a few KB; refuse to read an absurd one into memory.
MAX_MANIFEST_SIZE = safe_tar.MAX_JSON_BYTES
# Members from this size on are read into memory aligned to ALIGNED_READ bytes (the
# constant pool's alignment): see read_tar.
ALIGNED_FROM = 1 << 20
ALIGNED_READ = 64

# manifest.json per version (the artifacts' names are checked by Artifact itself, the
# library metadata by kiln.artifact.library_schema when a library is loaded).
_ENTRY_V1 = {"codegen_id": Str(), "loader": Str(), "file_name": Str(), "size": Int(0),
             "sha256": Str(r"[0-9a-f]{64}", 64, "64 lowercase hex digits"),
             "metadata": Obj(extra=Anything())}
_ENTRY_V2 = {**_ENTRY_V1, "target_key": Str()}


def _manifest_schema(entry: dict[str, Schema]) -> Obj:
    return Obj(required={"format": Str(), "version": Int(0), "kiln_version": Str(max_len=64),
                         "artifacts": ListOf(Obj(required=entry)),
                         "metadata": Obj(extra=Anything()),
                         "checksum": Str(r"sha256:[0-9a-f]{64}", 71, "sha256:<64 hex digits>")})


MANIFEST_SCHEMAS = {1: _manifest_schema(_ENTRY_V1), 2: _manifest_schema(_ENTRY_V2)}

_Fail = Callable[[str], NoReturn]


def manifest_checksum(manifest: Mapping[str, Any]) -> str:
    """`sha256:<hex>` of the canonical JSON of `manifest` without its checksum key."""
    body = {k: v for k, v in manifest.items() if k != "checksum"}
    return "sha256:" + hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()


def member_name(artifact: Artifact) -> str:
    """Path of `artifact` inside the archive."""
    return f"{artifact.codegen_id}/{artifact.file_name}"


def build_manifest(artifacts: list[Artifact], metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest object of an archive holding `artifacts`."""

    manifest: dict[str, Any] = {
        "format": ARCHIVE_FORMAT,
        "version": FORMAT_VERSION,
        "kiln_version": __version__,
        "artifacts": [
            {"codegen_id": a.codegen_id, "loader": a.loader, "file_name": a.file_name,
             "target_key": a.target_key, "size": a.size, "sha256": a.sha256(),
             "metadata": thaw(a.metadata)}
            for a in artifacts
        ],
        "metadata": thaw(metadata),
    }
    manifest["checksum"] = manifest_checksum(manifest)
    return manifest


def _check_sizes(arts: list[Artifact], path: str) -> None:
    """Refuse to write what `read_tar` would refuse (safe_tar's limits): say so now."""
    total = 0
    for a in arts:
        total += a.size
        if a.size > safe_tar.MAX_MEMBER_BYTES or total > safe_tar.MAX_TOTAL_BYTES:
            raise ExportError(
                f"cannot write {path!r}: {a.codegen_id}/{a.file_name} is {a.size} bytes and "
                f"the artifacts {total} so far; an archive member holds at most "
                f"{safe_tar.MAX_MEMBER_BYTES} and an archive {safe_tar.MAX_TOTAL_BYTES} "
                "(docs/security.md, 'Archive limits'): export a .so, with its weights "
                "embedded or weights='external'")


def write_tar(path: str | os.PathLike[str], artifacts: ArtifactSet,
              metadata: Mapping[str, Any]) -> None:
    """Write `artifacts` and the library `metadata` to a `.tar` at `path`, atomically.

    The archive is built in a temporary file next to `path` and renamed over
    it, so readers never see half an archive. Members have fixed owner, mode
    and mtime, so equal inputs give equal bytes. An InMemoryArtifact raises
    ExportError before anything is written.
    """
    arts = [require_serializable(a) for a in artifacts]
    for a in arts:
        if a.codegen_id == MANIFEST_NAME:
            raise ArtifactError(
                f"codegen_id {a.codegen_id!r} collides with the archive manifest")
    _check_sizes(arts, os.fspath(path))
    meta = freeze_object(metadata, "library metadata")
    manifest = build_manifest(arts, meta)
    manifest_bytes = (json.dumps(manifest, indent=2, ensure_ascii=False, allow_nan=False)
                      + "\n").encode("utf-8")

    path = os.fspath(path)
    if os.path.isdir(path):
        raise ExportError(f"cannot write the archive to {path!r}: it is a directory")
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            with tarfile.open(fileobj=f, mode="w", format=tarfile.PAX_FORMAT) as tar:
                add_file(tar, MANIFEST_NAME, manifest_bytes)
                for a in arts:
                    add_file(tar, member_name(a), a.content)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def add_file(tar: tarfile.TarFile, name: str, data: Content) -> None:
    """Add `data` to `tar` as the regular file `name` (fixed owner, mode 0644 and mtime
    0, so equal inputs give equal bytes), streamed from memory without a copy."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, _PartsReader(data))


class _PartsReader(io.RawIOBase):
    """A file over content already in memory, read piece by piece (io.BytesIO would
    copy a memoryview, and a Segments content is never joined)."""

    def __init__(self, data: Content) -> None:
        self.parts = content_parts(data)
        self.view = memoryview(b"")

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        out = []
        want = -1 if size is None or size < 0 else size
        while want:
            if not len(self.view):
                part = next(self.parts, None)
                if part is None:
                    break
                self.view = memoryview(part).cast("B")
                continue
            take = len(self.view) if want < 0 else min(want, len(self.view))
            out.append(bytes(self.view[:take]))
            self.view = self.view[take:]
            want = want - take if want > 0 else want
        return b"".join(out)


def read_tar(path: str | os.PathLike[str]) -> tuple[ArtifactSet, dict[str, Any]]:
    """Read an archive written by `write_tar`: (artifacts, library metadata).

    Nothing is extracted to disk. Every member is checked; anything unexpected
    raises FormatError naming the archive and the member.
    """
    path = os.fspath(path)
    where = f"archive {path}"

    def fail(message: str) -> NoReturn:
        raise FormatError(f"{where}: {message}")

    members: dict[str, bytes | memoryview] = {}
    dirs: set[str] = set()
    for member, reader in safe_tar.members(path, where):
        name = member.name
        if name in members or name in dirs:
            fail(f"member '{name}' appears more than once")
        if reader is None:
            dirs.add(name)
            continue
        if name == MANIFEST_NAME and member.size > MAX_MANIFEST_SIZE:
            fail(f"{MANIFEST_NAME} is {member.size} bytes, over the "
                 f"{MAX_MANIFEST_SIZE}-byte limit")
        # Large members (the weights) land 64-byte aligned: a `jit`-style load reads
        # them in place (kiln.runtime.jit_constants) instead of writing them again.
        members[name] = (safe_tar.read_aligned(reader, member, fail, ALIGNED_READ)
                         if member.size >= ALIGNED_FROM and name != MANIFEST_NAME else
                         safe_tar.read_exactly(reader, member, fail))

    if MANIFEST_NAME not in members:
        fail(f"no {MANIFEST_NAME}: expected a kiln artifact archive")
    manifest = parse_json_object(bytes(members.pop(MANIFEST_NAME)), f"{where}: {MANIFEST_NAME}",
                                 FormatError)
    entries, metadata = _check_manifest(manifest, fail, f"{where}: {MANIFEST_NAME}")

    artifacts = ArtifactSet()
    expected_dirs: set[str] = set()
    expected_keys: set[tuple[str, str]] = set()
    for i, entry in enumerate(entries):
        try:
            art = Artifact(entry["codegen_id"], entry["loader"], entry["file_name"], b"",
                           entry["metadata"], entry.get("target_key", ""))
        except ValueError as err:
            fail(f"{MANIFEST_NAME} artifact {i}: {err}")
        name = member_name(art)
        if art.key in expected_keys:
            fail(f"{MANIFEST_NAME} lists '{name}' twice")
        expected_keys.add(art.key)
        expected_dirs.add(art.codegen_id)
        if name not in members:
            fail(f"{MANIFEST_NAME} lists '{name}' but the archive has no such file")
        data = members.pop(name)
        if len(data) != entry["size"]:
            fail(f"'{name}' is {len(data)} bytes, the manifest says {entry['size']}")
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["sha256"]:
            fail(f"'{name}' sha256 mismatch: manifest says {entry['sha256'][:16]}..., "
                 f"content hashes to {digest[:16]}... (the file was changed or damaged)")
        try:
            artifacts.add(Artifact(art.codegen_id, art.loader, art.file_name, data,
                                   art.metadata, art.target_key))
        except ValueError as err:
            fail(f"{MANIFEST_NAME} artifact {i}: {err}")
    if members:
        fail(f"file(s) not listed in {MANIFEST_NAME}: {', '.join(sorted(members)[:8])}")
    stray_dirs = dirs - expected_dirs
    if stray_dirs:
        fail(f"directory entries not matching any codegen_id: {', '.join(sorted(stray_dirs))}")
    return artifacts, metadata


def _check_manifest(manifest: Mapping[str, Any], fail: _Fail,
                    where: str) -> tuple[list[Mapping[str, Any]], dict[str, Any]]:
    fmt = manifest.get("format")
    if fmt != ARCHIVE_FORMAT:
        fail(f"{MANIFEST_NAME}: expected format '{ARCHIVE_FORMAT}', found {fmt!r}")
    version = manifest.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        fail(f"{MANIFEST_NAME}: expected an integer 'version', found {version!r}")
    if version > FORMAT_VERSION:
        fail(f"archive format version {version} is newer than this kiln {__version__} "
             f"supports (versions {MIN_SUPPORTED_VERSION}..{FORMAT_VERSION}); "
             "upgrade kiln to read it")
    if version < MIN_SUPPORTED_VERSION:
        fail(f"archive format version {version} is too old: this kiln reads versions "
             f"{MIN_SUPPORTED_VERSION}..{FORMAT_VERSION}")
    manifest = check(MANIFEST_SCHEMAS[version], thaw(manifest), where)
    checksum = manifest["checksum"]
    expected = manifest_checksum(manifest)
    if checksum != expected:
        fail(f"{MANIFEST_NAME} checksum mismatch: it says {str(checksum)[:24]}..., "
             f"its content hashes to {expected[:24]}... (the manifest was changed or damaged)")
    return list(manifest["artifacts"]), manifest["metadata"]

"""`kiln.artifact.load`: the ArtifactSet inside a `.so`, a `.tar` or a raw blob file.

Reading never executes the file: a shared library is parsed as ELF and its
`{prefix}_blob` symbol is read from disk.
"""

from __future__ import annotations

import os
from typing import Any

from kiln.artifact import archive, blob, elf
from kiln.artifact._json import thaw
from kiln.artifact.artifact import ArtifactSet
from kiln.errors import ArgumentTypeError, FormatError, MissingFileError


def load(path: str | os.PathLike[str], *, prefix: str | None = None) -> ArtifactSet:
    """The artifacts stored in `path` (see `load_with_metadata`)."""
    return load_with_metadata(path, prefix=prefix)[0]


def load_with_metadata(path: str | os.PathLike[str], *,
                       prefix: str | None = None) -> tuple[ArtifactSet, dict[str, Any]]:
    """(artifacts, library metadata) stored in a `.so`, a `.tar` or a raw blob file.

    The kind of file is told by its first bytes, not its name. From a `.so`,
    native artifacts that are linked into the library come back as stubs
    (empty content, `metadata["linked"] = True`, `metadata["size"]`).
    `prefix` picks the blob symbol `{prefix}_blob` of a library when it has
    several. A file of any other kind raises FormatError naming it.
    """
    head = _head(path)
    path = os.fspath(path)
    if head.startswith(elf.ELF_MAGIC):
        contents = _unpack(elf.read_blob(path, prefix=prefix), path)
        return contents.artifacts, thaw(contents.metadata)
    if head.startswith(blob.MAGIC):
        with open(path, "rb") as f:
            data = f.read()
        contents = _unpack(data, path)
        return contents.artifacts, thaw(contents.metadata)
    if _looks_like_tar(head) or path.endswith(".tar"):
        return archive.read_tar(path)
    what = ("it is a NumPy .npy array, an input rather than a model or library; "
            if head.startswith(b"\x93NUMPY") else f"it starts with {head[:8]!r}; ")
    raise FormatError(
        f"{path}: not a kiln library, archive or blob ({what}expected an ELF shared library "
        f"({elf.ELF_MAGIC!r}), a tar archive, or a blob ({blob.MAGIC!r}); an .onnx model is "
        "read by `kiln inspect model.onnx` and compiled by `kiln compile`)")


def _head(path: Any) -> bytes:
    """The first bytes of the file at `path`: a KilnError naming it when it cannot be read."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"kiln.artifact.load: path must be a str or os.PathLike, got "
                                f"{type(path).__name__}")
    try:
        with open(path, "rb") as f:
            return f.read(512)
    except (FileNotFoundError, ValueError):  # ValueError: a NUL in the name
        raise MissingFileError(f"{os.fspath(path)!r}: no such file") from None
    except OSError as exc:
        raise FormatError(f"{os.fspath(path)}: cannot read it ({exc.strerror or exc})") from None


def _unpack(data: bytes, path: str) -> blob.BlobContents:
    try:
        return blob.unpack(data)
    except FormatError as err:
        raise FormatError(f"{path}: {err}") from None


def _looks_like_tar(head: bytes) -> bool:
    # POSIX/GNU tar headers carry "ustar" at offset 257.
    return len(head) >= 262 and head[257:262] == b"ustar"

"""The one reader of untrusted tar files, with the limits every archive reader shares.

`members(path, where)` walks a tar member by member and refuses, with a
`FormatError` naming the file and the member, anything a kiln archive never
holds and anything that would make reading it unbounded:

- names that escape (absolute, `..`, drive letters, backslashes, NUL, empty or
  `.` components);
- links, devices, FIFOs and sparse members (a sparse member's holes expand
  on extraction: a few bytes in the file, gigabytes on disk);
- more than MAX_MEMBERS members, a member over MAX_MEMBER_BYTES, members
  totalling more than MAX_TOTAL_BYTES;
- a compressed file, unless the caller allows it: then the decompressed
  stream itself is counted as it is read and refused past MAX_STREAM_BYTES,
  before tarfile can read (or allocate) more, so a compression bomb costs at
  most that much work and no memory beyond one member.

The artifact archive (`read_tar`), `kiln.mlf.load` and `kiln inspect` on an
MLF archive read through here; docs/security.md lists the numbers.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, NoReturn

from kiln.artifact.segments import aligned_buffer
from kiln.errors import FormatError

# The limits of every archive reader. A kiln archive holds a handful of members
# (an MLF: about ten); the largest member is the weights (or, in an MLF, the
# weights written out as C, ~6 bytes per weight byte).
MAX_MEMBERS = 10_000
MAX_MEMBER_BYTES = 4 << 30
MAX_TOTAL_BYTES = 8 << 30
# A decompressed stream holds the members plus a 512-byte header (and PAX
# records) per member and padding: this much room over the members' total.
MAX_STREAM_BYTES = MAX_TOTAL_BYTES + (64 << 20)
# What the JSON of a manifest or an MLF metadata.json may take at most.
MAX_JSON_BYTES = 64 << 20

_COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}


def compression_of(head: bytes) -> str | None:
    """The compression whose magic number starts `head` ("gzip", "bzip2", "xz"), or None."""
    return next((name for magic, name in _COMPRESSED.items() if head.startswith(magic)), None)


@dataclass(frozen=True)
class Member:
    """A checked member: its normalized name, whether it is a directory, its size."""

    name: str
    is_dir: bool
    size: int


class _Reader(io.RawIOBase):
    """A read-only raw stream: subclasses implement `read`."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self.read(len(buffer))
        memoryview(buffer).cast("B")[:len(data)] = data
        return len(data)


class _Bounded(_Reader):
    """A read-only stream that refuses to deliver more than `limit` bytes in total."""

    def __init__(self, raw: IO[bytes], limit: int, fail: Callable[[str], NoReturn]) -> None:
        self.raw, self.left, self.fail = raw, limit, fail

    def read(self, size: int | None = -1) -> bytes:
        # Checked before reading: a header may ask tarfile to read 10 GB in one call.
        if size is None or size < 0 or size > self.left:
            want = self.left + 1 if size is None or size < 0 else size
            data = self.raw.read(min(want, self.left + 1))
            if len(data) > self.left:
                self.fail(f"decompresses to more than {MAX_STREAM_BYTES} bytes "
                          "(a compression bomb?)")
        else:
            data = self.raw.read(size)
        self.left -= len(data)
        return data


def looks_like_tar(path: str | os.PathLike[str]) -> bool:
    """Whether `path` starts with a POSIX (ustar) tar header, compressed or not.

    Reads at most one header block (through the decompressor, bounded), never a
    member: unlike `tarfile.is_tarfile`, which reads the first member's extended
    header whatever its size.
    """
    def fail(message: str) -> NoReturn:
        raise FormatError(message)

    try:
        handle, stream, _ = _open(os.fspath(path), True, fail)
        with handle:
            block = stream.read(512)
    except (*_READ_ERRORS, FormatError):
        return False
    return len(block) == 512 and block[257:262] == b"ustar"


# What tarfile and the decompressors raise on damaged input.
_READ_ERRORS = (OSError, tarfile.TarError, EOFError, lzma.LZMAError, zlib.error)


class MemberReader(_Reader):
    """A member's bytes, with damage found while reading them (a truncated archive, a
    corrupt compressed stream) reported as a FormatError naming the member."""

    def __init__(self, raw: IO[bytes], name: str, fail: Callable[[str], NoReturn]) -> None:
        self.raw, self.name, self.fail = raw, name, fail

    def read(self, size: int | None = -1) -> bytes:
        try:
            return self.raw.read(-1 if size is None or size < 0 else size)
        except _READ_ERRORS as err:
            self.fail(f"member '{self.name}' cannot be read: the archive is truncated or "
                      f"damaged ({err})")

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        """Read into `buffer` (without an intermediate copy); how many bytes (0 at the
        member's end)."""
        try:
            return self.raw.readinto(buffer)  # type: ignore[attr-defined]
        except _READ_ERRORS as err:
            self.fail(f"member '{self.name}' cannot be read: the archive is truncated or "
                      f"damaged ({err})")


def check_member_name(raw: str, fail: Callable[[str], NoReturn]) -> str:
    """The member name without a trailing '/', after refusing unsafe paths."""
    if raw.startswith("/") or re.match(r"[A-Za-z]:", raw):
        fail(f"member '{raw}' has an absolute path")
    if "\\" in raw or "\0" in raw:
        fail(f"member '{raw}' contains a backslash or NUL")
    name = raw[:-1] if raw.endswith("/") else raw
    parts = name.split("/")
    if ".." in parts:
        fail(f"member '{raw}' contains '..'")
    if any(p in ("", ".") for p in parts):
        fail(f"member '{raw}' is not a normalized relative path")
    return name


def _open(path: str, allow_compressed: bool,
          fail: Callable[[str], NoReturn]) -> tuple[IO[bytes], IO[bytes], bool]:
    """(file to close, stream to read the tar from, compressed?)."""
    f = open(path, "rb")  # noqa: SIM115 - closed by `members`
    kind = compression_of(f.read(6))
    f.seek(0)
    if kind is None:
        return f, f, False
    if not allow_compressed:
        f.close()
        fail(f"not a readable uncompressed tar archive (it is {kind}-compressed; "
             "decompress it first)")
    opener = {"gzip": gzip.GzipFile, "bzip2": bz2.BZ2File, "xz": lzma.LZMAFile}[kind]
    stream = opener(fileobj=f, mode="rb")
    return f, io.BufferedReader(_Bounded(stream, MAX_STREAM_BYTES, fail)), True


def members(path: str | os.PathLike[str], where: str, *, allow_compressed: bool = False,
            dot_prefix: bool = False) -> Iterator[tuple[Member, MemberReader | None]]:
    """Each member of the tar at `path` with a reader of its bytes (None for a directory).

    Read a member's bytes before asking for the next one (the tar is read as a
    stream). Every refusal is a FormatError starting with `where`. With
    `dot_prefix`, names may start with "./" (what `tar cf x.tar .` writes): it is
    dropped, and the "." entry itself skipped.
    """
    path = os.fspath(path)

    def fail(message: str) -> NoReturn:
        raise FormatError(f"{where}: {message}")

    try:
        file_size = os.path.getsize(path)
        handle, stream, compressed = _open(path, allow_compressed, fail)
    except OSError as err:
        fail(f"cannot read it ({err.strerror or err})")
    count = total = 0
    try:
        with handle, tarfile.open(fileobj=stream, mode="r|") as tar:
            for info in tar:
                count += 1
                if count > MAX_MEMBERS:
                    fail(f"more than {MAX_MEMBERS} members")
                raw = info.name
                if dot_prefix and raw in (".", "./") and info.isdir():
                    continue
                if dot_prefix and raw.startswith("./"):
                    raw = raw[2:]
                name = check_member_name(raw, fail)
                if info.isdir():
                    yield Member(name, True, 0), None
                    continue
                _check_file(info, name, fail, None if compressed else file_size)
                total += info.size  # counted before reading: the sizes are the header's word
                if total > MAX_TOTAL_BYTES:
                    fail(f"members total more than {MAX_TOTAL_BYTES} bytes")
                data = tar.extractfile(info)
                if data is None:  # pragma: no cover - regular members always extract
                    fail(f"member '{name}' has no data")
                yield Member(name, False, info.size), MemberReader(data, name, fail)
    except FormatError:
        raise
    except (*_READ_ERRORS, UnicodeError, ValueError) as err:
        # tarfile and the decompressors report malformed input with all of these.
        fail(f"not a readable {'compressed' if compressed else 'uncompressed'} tar archive "
             f"({err})")


def _check_file(info: tarfile.TarInfo, name: str, fail: Callable[[str], NoReturn],
                file_size: int | None) -> None:
    """Refuse a member that is not a regular file of bounded size."""
    if info.issym() or info.islnk():
        fail(f"member '{name}' is a link (to '{info.linkname}'); "
             "archives hold regular files only")
    if info.issparse():
        fail(f"member '{name}' is a sparse file (its holes would expand on extraction); "
             "archives hold regular files only")
    if not info.isreg():
        fail(f"member '{name}' is a device, FIFO or other special file; "
             "archives hold regular files only")
    if file_size is not None and info.size > file_size:
        fail(f"member '{name}' claims {info.size} bytes, more than the whole "
             f"file ({file_size}); the archive is damaged")
    if info.size > MAX_MEMBER_BYTES:
        fail(f"member '{name}' is {info.size} bytes, over the {MAX_MEMBER_BYTES}-byte limit")


def read_exactly(data: MemberReader, member: Member, fail: Callable[[str], NoReturn]) -> bytes:
    """All of a member's bytes; a FormatError if the archive ends before them."""
    out = data.read()
    if len(out) != member.size:
        fail(f"member '{member.name}' is truncated: expected {member.size} bytes, "
             f"found {len(out)}")
    return out


def read_aligned(data: MemberReader, member: Member, fail: Callable[[str], NoReturn],
                 align: int) -> memoryview:
    """`read_exactly`'s bytes, read-only, starting at a multiple of `align` in memory (a
    library linked from them in this process reads its constants there in place)."""
    view = aligned_buffer(member.size, align)
    done = 0
    while done < member.size:
        got = data.readinto(view[done:])
        if not got:
            break
        done += got
    if done != member.size or data.read(1):
        fail(f"member '{member.name}' is truncated: expected {member.size} bytes, "
             f"found {done}")
    return view.toreadonly()


__all__ = ["MAX_JSON_BYTES", "MAX_MEMBERS", "MAX_MEMBER_BYTES", "MAX_STREAM_BYTES",
           "MAX_TOTAL_BYTES", "Member", "MemberReader", "check_member_name", "compression_of",
           "looks_like_tar", "members", "read_aligned", "read_exactly"]

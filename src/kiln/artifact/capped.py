"""Reading a file kiln was pointed at, never more than a limit.

A path on a command line can name anything: a multi-gigabyte file, `/dev/zero`, a
pipe. `read_capped` checks the size the file system reports before reading, then
reads in blocks and stops one byte past the limit, so a device, a pipe or a file
that grows while it is read costs at most the limit (docs/security.md, "Limits").
"""

from __future__ import annotations

import os
import re
from typing import BinaryIO

from kiln.errors import KilnError, MissingFileError, UsageError

#: Bytes read per call while reading up to a limit.
BLOCK = 1 << 20


def read_capped(path: str | os.PathLike[str], limit: int, what: str,
                error: type[KilnError]) -> bytes:
    """The bytes of the file at `path`, refused with `error` (naming `what`, e.g.
    "tuning database x.json") when it holds more than `limit` bytes; MissingFileError
    when it does not exist, `error` when it cannot be read."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise error(too_large(what, size, limit))
            return _read_up_to(f, limit, what, error)
    except FileNotFoundError:
        raise MissingFileError(f"{what} does not exist") from None
    except OSError as exc:
        raise error(f"cannot read {what}: {exc.strerror or exc}") from None


def _read_up_to(f: BinaryIO, limit: int, what: str, error: type[KilnError]) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = f.read(min(BLOCK, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:  # a device, a pipe, or a file that grew while read
            raise error(too_large(what, None, limit))


def too_large(what: str, size: int | None, limit: int) -> str:
    """The message for a file over its limit (`size` None: it did not end there)."""
    found = "goes on past" if size is None else f"holds {human_bytes(size)}, more than"
    return f"{what} {found} the {human_bytes(limit)} it may hold (docs/security.md, \"Limits\")"


def human_bytes(n: int) -> str:
    """`n` bytes as `123 bytes`, `1.5 KiB`, ... `20.0 GiB` (powers of 1024)."""
    if n < 1024:
        return f"{n} bytes"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}".replace(".0 ", " ")


_SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from "500M", "2G", "1.5g", "300KiB", "123" (powers of 1024); UsageError otherwise.
    The size limits kiln reads from the environment ($KILN_CACHE_MAX,
    $KILN_MAX_MODEL_BYTES, ...) are spelled this way."""
    m = _SIZE_RE.fullmatch(text)
    if m is None:
        raise UsageError(f"cannot read {text!r} as a size: use bytes or a number with K, M, G "
                         "or T (powers of 1024), e.g. 500M or 2G")
    scale = 1024 ** ("kmgt".find(m.group(2).lower()) + 1) if m.group(2) else 1
    return int(float(m.group(1)) * scale)


__all__ = ["BLOCK", "human_bytes", "parse_size", "read_capped", "too_large"]

"""The per-weight check of a Model Library Format archive (version 4 and later).

metadata.json's `parameters` lists every weight array of `parameters/<model>.params`:
its name, dtype, shape, byte offset and size in that file, and the SHA-256 of those
bytes (written by the MLF exporter). `check_parameters` reads the file once,
tensor by tensor, and refuses the first damaged weight with a FormatError naming it and
its byte range: a flipped bit in a weight never reaches an answer, and the error says
which weight the damage hit. The member's chunk SHA-256s (`checksums`) still cover the
whole file, the padding between weights included. Standard library only.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from kiln.artifact.library_schema import DTYPE, NAME
from kiln.artifact.schema import Int, ListOf, Obj, Str
from kiln.errors import FormatError

# From this version on metadata.json must carry `parameters`.
PARAMETERS_SINCE = 4
# More weights than this is not an archive kiln wrote (a model has thousands at most).
MAX_PARAMETERS = 1 << 20
# Bytes hashed per read: a large weight is never read into memory whole.
READ_BYTES = 1 << 20

PARAMETER_SCHEMA = Obj(required={
    "name": NAME, "dtype": DTYPE,
    "shape": ListOf(Int(0), max_len=64), "offset": Int(0), "bytes": Int(0),
    "sha256": Str(r"[0-9a-f]{64}", 64, "a SHA-256 as 64 lowercase hex digits")})
PARAMETERS_SCHEMA = ListOf(PARAMETER_SCHEMA, max_len=MAX_PARAMETERS)


def params_member(meta: dict[str, Any]) -> str:
    """The archive member that holds the weights."""
    return f"parameters/{meta['model_name']}.params"


def _check_places(table: list[dict[str, Any]], size: int, member: str, where: str) -> None:
    """FormatError unless the weights have distinct names and lie, in order and without
    overlapping, inside the `size` bytes of `member`."""
    names: set[str] = set()
    end = 0
    for i, t in enumerate(table):
        if t["name"] in names:
            raise FormatError(f"{where}: parameters[{i}]: the name {t['name']!r} comes twice")
        names.add(t["name"])
        if t["offset"] < end or t["offset"] + t["bytes"] > size:
            raise FormatError(f"{where}: parameters[{i}] ({t['name']!r}): bytes "
                              f"[{t['offset']}, {t['offset'] + t['bytes']}) overlap the "
                              f"weight before it or lie outside {member} ({size} bytes)")
        end = t["offset"] + t["bytes"]


def _digest(f: Any, offset: int, count: int) -> str:
    """SHA-256 (hex) of `count` bytes of the open file `f` from `offset`."""
    h = hashlib.sha256()
    f.seek(offset)
    while count:
        piece = f.read(min(count, READ_BYTES))
        if not piece:
            break  # the caller checked the size: only a file changed meanwhile ends early
        h.update(piece)
        count -= len(piece)
    return h.hexdigest()


def check_parameters(meta: dict[str, Any], root: Path, archive: Path) -> None:
    """FormatError naming the first weight whose bytes in the extracted archive at `root`
    differ from the SHA-256 metadata.json's `parameters` records (or a table that does
    not fit the file)."""
    table: list[dict[str, Any]] = meta["parameters"]
    member = params_member(meta)
    where = f"{archive}: metadata.json"
    path = root / member
    if not path.is_file():
        # A file the checksums list but the archive lacks, or a model_name that names
        # none, is refused by the member checks after this one, with those words.
        return
    _check_places(table, path.stat().st_size, member, where)
    with open(path, "rb") as f:
        for t in table:
            found = _digest(f, t["offset"], t["bytes"])
            if found != t["sha256"]:
                raise FormatError(
                    f"{archive}: Model Library Format archive: parameter tensor {t['name']!r} "
                    f"({t['dtype']}{t['shape']}, bytes [{t['offset']}, "
                    f"{t['offset'] + t['bytes']}) of {member}) is damaged: expected SHA-256 "
                    f"{t['sha256']} (metadata.json, parameters), found {found}")


__all__ = ["MAX_PARAMETERS", "PARAMETERS_SCHEMA", "PARAMETERS_SINCE", "PARAMETER_SCHEMA",
           "check_parameters", "params_member"]

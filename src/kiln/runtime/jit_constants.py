"""The constants of a library linked for this process, read where they already lie.

`Executable.jit()` links the artifacts into a private library and loads it in the
process that compiled them, where the constants already lie in memory: the ONNX
importer's arena, the weights the compiler packed. Writing them into the library only
for the process to read them back through the file's pages costs a second copy of
every byte (on a virtual machine a fresh page costs about 0.3-0.4 s per 100 MB the
first time it is written: docs/performance.md), and a second copy in memory. Kernels
that read each constant's address from the library's `{prefix}_const_table` need
neither: the library is linked with the constants' room left a hole of its file, and
each slot is pointed at the constant's bytes in memory, which the loaded module keeps
alive. A constant whose bytes are not aligned as the kernels assume (the artifact's
`align`) or not in one piece is written into the library as before, its slot left home.

Before anything rewrites the library's own constants (`swap_weights`), `reclaim` writes
the rest into the library's file (its mapping, private but never written, shows the
file's pages) and points every slot home, its calls paused.

The same holds for any ArtifactSet linked and loaded here (`load_module("x.tar")`
reads its large members into aligned memory: kiln.artifact.archive.read_tar).

Only a build for one target qualifies (no artifact carries a device's target key): a
split build's other kernels may address the constants without the table.
"""

from __future__ import annotations

import bisect
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kiln.artifact.artifact import NATIVE, AnyArtifact
from kiln.artifact.segments import Segments, content_parts
from kiln.runtime.library import LinkedData, fill_linked_data, linked_places
from kiln.runtime.shared_constants import checked_table, table_slots

TABLE_FILE = "const_table.c"  # the artifact defining that table (docs/abi.md)


@dataclass
class InPlace:
    """The plan for one jit library: each table slot's constant (offset, bytes) and its
    address in memory (None: written into the library), and what keeps those bytes alive."""

    prefix: str
    symbol: str  # the constants' data symbol, `{prefix}_consts`
    entries: list[tuple[int, int]]
    addresses: list[int | None]
    unplaced: list[tuple[int, memoryview]]  # (offset, bytes) of those without an address
    keep: Any  # the constants artifact's content: the arrays the slots point into
    left: list[LinkedData] = field(default_factory=list)  # reserved, not yet written

    def fill(self, library: Path, deferred: Sequence[LinkedData]) -> None:
        """`export_library`'s `fill`: write every reserved datum but the constants read
        in place (of those, only the ones with no address)."""
        own = [d for d in deferred if d.symbol == self.symbol]
        others = [d for d in deferred if d.symbol != self.symbol]
        if others:
            fill_linked_data(library, self.prefix, others)
        if not own:
            return
        with open(library, "r+b") as f:
            (start, _content), = linked_places(f, library, self.prefix, own)
            for offset, view in self.unplaced:
                _write_at(f.fileno(), view, start + offset)
        self.left = own


_LOCK = threading.Lock()
_LENT: weakref.WeakKeyDictionary[Any, tuple[InPlace, Any, list[int]]] = \
    weakref.WeakKeyDictionary()


def plan(artifacts: Sequence[AnyArtifact], prefix: str) -> InPlace | None:
    """How the library linked from `artifacts` reads its constants in place; None when
    it cannot (no table, a split build, bytes not in this process)."""
    if any(getattr(a, "target_key", None) for a in artifacts):
        return None
    if not any(a.loader == NATIVE and a.file_name == TABLE_FILE for a in artifacts):
        return None
    symbol = f"{prefix}_consts"
    data = [a for a in artifacts if a.loader == NATIVE and a.extension == ".bin"
            and a.metadata.get("symbol") == symbol and "table" in a.metadata]
    if len(data) != 1 or not getattr(data[0], "serializable", True):
        return None
    art = data[0]
    entries = checked_table(art.metadata["table"], len(art.content), art.file_name)
    align = int(art.metadata.get("align", 1))
    pieces = _pieces(art.content)
    starts = [at for at, _view, _address in pieces]
    addresses: list[int | None] = []
    unplaced: list[tuple[int, memoryview]] = []
    for offset, size in entries:
        address = None
        if size:
            k = bisect.bisect_right(starts, offset) - 1
            if k < 0:
                return None
            at, view, base = pieces[k]
            if offset < at or offset + size > at + len(view):
                return None  # not one array's bytes (never made by the pool)
            if (base + offset - at) % align == 0:
                address = base + offset - at
            else:
                unplaced.append((offset, view[offset - at:offset - at + size]))
        addresses.append(address)
    if not any(addresses):
        return None
    return InPlace(prefix, symbol, [(o, n) for o, n in entries], addresses, unplaced,
                   art.content)


def _pieces(content: Any) -> list[tuple[int, memoryview, int]]:
    """(offset, bytes, address) of each non-empty piece of a constants artifact's content."""
    out, at = [], 0
    for view in Segments(content_parts(content)).parts():  # byte views, empty ones dropped
        out.append((at, view, int(np.frombuffer(view, np.uint8).ctypes.data)))
        at += len(view)
    return out


def _write_at(fd: int, view: memoryview, offset: int) -> None:
    while len(view):
        done = os.pwrite(fd, view, offset)
        view, offset = view[done:], offset + done


def attach(lib: Any, place: InPlace) -> None:
    """Point `lib`'s table slots at the constants in memory (before its first call)."""
    slots, home = table_slots(lib, len(place.addresses))
    for i, at in enumerate(place.addresses):
        if at is not None:
            slots[i] = at
    with _LOCK:
        _LENT[lib] = (place, slots, home)
    lib.on_close(lambda: _forget(lib))


def _forget(lib: Any) -> None:
    with _LOCK:
        _LENT.pop(lib, None)


def reclaim(lib: Any) -> None:
    """`lib` reads its own constants from now on: the ones read in place are written
    into its file and its slots pointed home, its calls paused (nothing if none lent)."""
    with _LOCK:
        lent = _LENT.pop(lib, None)
    if lent is None:
        return
    place, slots, home = lent
    with lib.calls_paused():
        if place.left:
            fill_linked_data(Path(lib.path), place.prefix, place.left)
        for i, at in enumerate(home):
            slots[i] = at


def placement(lib: Any) -> list[tuple[int, int, int]] | None:
    """(address in the library, address read, bytes) of each table slot of `lib` while
    its kernels read constants in this process's memory, else None (for inspection)."""
    with _LOCK:
        lent = _LENT.get(lib)
    if lent is None:
        return None
    place, slots, home = lent
    return [(at, int(slots[i] or 0), n) for i, (at, (_o, n)) in enumerate(zip(home, place.entries))]


__all__ = ["InPlace", "attach", "placement", "plan", "reclaim"]

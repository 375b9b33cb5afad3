"""Constants read through another library's mapping: one copy per process, in RSS too.

Two builds of one model (a batch-1 and a batch-32 build) exported with external weights
hold mostly equal bytes. `lend_chunks` (kiln.runtime.external_weights) already maps the
64 KiB chunks they share from one file, so the page cache holds them once (PSS); but each
library's kernels read them through its own region, and RSS counts a page once per
mapping. Kernels built by the llvm and c backends read each constant's address from the
library's `{prefix}_const_table` (`{prefix}_const_slots()`, docs/abi.md):
here, a constant of a library lying wholly in bytes it shares with an open library (the
same weights file, or a run of lent chunks at one displacement: equal bytes) gets the
other library's address of that constant in its slot, so the process reads those pages
through one mapping. The borrower's own pages of them are dropped (`MADV_DONTNEED`) once
its weight check has read them.

What keeps it exact: a borrower's calls first run the lender's pending weight check (a
damaged weight never reaches a result); a lender that swaps its weights or closes first
points its borrowers back at their own bytes, with their calls paused; a borrower that
swaps points itself back first (kiln.runtime.swap). Libraries without a table (older
ones) share pages only, as before.
"""

from __future__ import annotations

import bisect
import ctypes
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kiln.errors import FormatError
from kiln.runtime import ctypes_abi
from kiln.runtime.gathered_pages import drop_pages
from kiln.runtime.weights import CheckOnce

if TYPE_CHECKING:
    from kiln.runtime.external_weights import Lent, SharedWeights
    from kiln.runtime.module import LibraryModule

def slots_symbol(prefix: str) -> str:
    """`const uint8_t** {prefix}_const_slots(uint32_t* count)`: the table's address."""
    return f"{prefix}_const_slots"


@dataclass(eq=False)
class Tabled:
    """A loaded library whose kernels read constants through its table."""

    lib: weakref.ref[Any]
    slots: Any  # ctypes array of c_void_p: the table itself
    home: list[int]  # each slot's first value: the constant in the library's own region
    sizes: list[int]
    shared: SharedWeights  # its weights file
    by_place: dict[int, int]  # file offset of a constant -> its index
    lending: bool = True  # False once it swapped: its bytes no longer equal its file's
    borrowed: dict[int, tuple[Tabled, int]] = field(default_factory=dict)
    borrowers: weakref.WeakSet[Tabled] = field(default_factory=weakref.WeakSet)


_LOCK = threading.RLock()
_TABLED: weakref.WeakKeyDictionary[Any, Tabled] = weakref.WeakKeyDictionary()


def checked_table(entries: Any, size: int, where: str) -> list[list[int]]:
    """A constants artifact's `table` metadata ([offset, bytes] per slot), each constant
    within the `size` bytes of its pool; FormatError naming `where` otherwise."""
    if not isinstance(entries, list) or not all(
            isinstance(e, list) and len(e) == 2 and all(isinstance(v, int) and v >= 0
                                                        for v in e) and e[0] + e[1] <= size
            for e in entries):
        raise FormatError(f"{where}: the constants' 'table' metadata is malformed or out of "
                          f"the pool's {size} bytes")
    return entries


def table_slots(lib: Any, count: int) -> tuple[Any, list[int]]:
    """`lib`'s table of constant addresses (`{prefix}_const_slots`, a ctypes array of
    `count` pointers) and each slot's first value (the constant in the library's own
    region); FormatError when the library has no table or one of another length."""
    try:
        slots_fn = ctypes_abi.bind(lib.cdll, slots_symbol(lib.prefix), "const_slots")
    except AttributeError:
        raise FormatError(f"{lib.path}: its constants metadata lists a table but the library "
                          f"exports no {slots_symbol(lib.prefix)}") from None
    found = ctypes.c_uint32(0)
    address = slots_fn(ctypes.byref(found))
    if not address or found.value != count:
        raise FormatError(f"{lib.path}: its constant table holds {found.value} slots, its "
                          f"metadata {count}")
    slots = (ctypes.c_void_p * count).from_address(address)
    return slots, [int(slots[i] or 0) for i in range(count)]


def _table_entries(artifacts: Sequence[Any], symbol: str) -> Any:
    return next((a.metadata["table"] for a in artifacts
                 if getattr(a, "metadata", {}).get("symbol") == symbol
                 and "table" in a.metadata), None)


def attach_table(lib: LibraryModule, shared: SharedWeights, entry: Mapping[str, Any],
                 artifacts: Sequence[Any], lent: Sequence[Lent]) -> Tabled | None:
    """Register `lib` (external weights `shared`, its blob's `entry` and `artifacts`) and
    point the slots of the constants it shares with an open library there; None when
    its kernels have no table."""
    symbol = f"{lib.prefix}_consts"
    entries = _table_entries(artifacts, symbol)
    name = next((t.get("name") for t in entry.get("tensors", ())
                 if t.get("symbol") == symbol), None)
    tensor = shared.header.tensor(name) if isinstance(name, str) else None
    if entries is None or tensor is None:
        return None
    entries = checked_table(entries, tensor.size, str(lib.path))
    slots, home = table_slots(lib, len(entries))
    me = Tabled(weakref.ref(lib), slots, home, [n for _o, n in entries], shared,
                {tensor.offset + o: i for i, (o, _n) in enumerate(entries)})
    runs = [(r.start, r.length, r.source, r.offset) for r in lent if r.tensor == name]
    with _LOCK:
        same_file = _lender_of(shared)
        if same_file is not None:  # the same weights file: every constant at its place
            runs.append((0, tensor.size, shared, tensor.offset))
        _borrow(me, entries, runs)
        _TABLED[lib] = me
    lib.on_close(lambda: _forget(me))
    return me


def _forget(me: Tabled) -> None:
    """`me`'s library is closing: its borrowers read their own bytes again, and it is no
    one's borrower (its slots go with it)."""
    with _LOCK:
        me.lending = False
        unshare_borrowers(me)
        for lender, _j in me.borrowed.values():
            lender.borrowers.discard(me)
        me.borrowed.clear()
        lib = me.lib()
        if lib is not None:
            _TABLED.pop(lib, None)


def _lender_of(shared: SharedWeights) -> Tabled | None:
    for t in _TABLED.values():
        lib = t.lib()
        if t.shared is shared and t.lending and lib is not None and not lib.closed:
            return t
    return None


def _borrow(me: Tabled, entries: list[list[int]], runs: list[tuple[int, int, Any, int]]
            ) -> None:
    starts = [o for o, _n in entries]
    order = sorted(range(len(entries)), key=starts.__getitem__)
    sorted_starts = [starts[i] for i in order]
    for start, length, source, offset in runs:
        lender = _lender_of(source)
        if lender is None:
            continue
        k = bisect.bisect_left(sorted_starts, start)
        while k < len(order) and sorted_starts[k] < start + length:
            i = order[k]
            o, n = entries[i]
            k += 1
            j = lender.by_place.get(offset + (o - start))
            if n == 0 or o + n > start + length or j is None or lender.sizes[j] != n \
                    or i in me.borrowed:
                continue
            owner = lender  # the library whose region holds it (a lender may borrow too)
            while j in owner.borrowed:
                owner, j = owner.borrowed[j]
            me.slots[i] = owner.slots[j]
            me.borrowed[i] = (owner, j)
            owner.borrowers.add(me)


def drop_own_pages(me: Tabled) -> None:
    """Drop the borrower's own resident pages of what it reads elsewhere (MADV_DONTNEED on
    the whole pages inside each borrowed constant: they refault from its file if needed)."""
    for i in list(me.borrowed):
        drop_pages(me.home[i], me.sizes[i])


def unshare(me: Tabled) -> None:
    """Point `me`'s borrowed slots back at its own region (its calls paused)."""
    with _LOCK:
        if not me.borrowed:
            return
        lib = me.lib()
        if lib is None or lib.closed:
            me.borrowed.clear()
            return
        with lib.calls_paused():
            for i, (lender, _j) in me.borrowed.items():
                me.slots[i] = me.home[i]
                lender.borrowers.discard(me)
            me.borrowed.clear()


def unshare_borrowers(lender: Tabled) -> None:
    """Every library reading `lender`'s constants reads its own again."""
    with _LOCK:
        for borrower in list(lender.borrowers):
            unshare(borrower)


def before_swap(lib: Any) -> None:
    """`lib` is about to rewrite its constants: nobody reads them through it from now on,
    and it reads only its own (kiln.runtime.swap calls this first)."""
    with _LOCK:
        me = _TABLED.get(lib)
        if me is None:
            return
        me.lending = False
        unshare_borrowers(me)
        unshare(me)


def tabled(lib: Any) -> Tabled | None:
    """`lib`'s table record (None: no table, or not loaded with external weights)."""
    return _TABLED.get(lib)


class BorrowingCheck(CheckOnce):
    """A borrower's weight check: the lenders' pending checks first (the borrower reads
    their bytes), then its own; afterwards its own pages of borrowed constants go."""

    def __init__(self, me: Tabled, inner: CheckOnce) -> None:
        super().__init__()
        self.me = me
        self.inner = inner
        self.done = False

    def check(self) -> None:
        for lender, _j in list(self.me.borrowed.values()):
            lib = lender.lib()
            if lib is not None and not lib.closed:
                lib.run_weight_checks()
        self.inner.run()
        drop_own_pages(self.me)

    def start(self, keep: Any = None) -> None:
        self.inner.start(keep)

    def stop(self) -> None:
        self.inner.stop()


__all__ = ["BorrowingCheck", "Tabled", "attach_table", "before_swap", "checked_table",
           "drop_own_pages", "slots_symbol", "table_slots", "tabled", "unshare",
           "unshare_borrowers"]

"""The check of a loaded library's weights against the chunk hashes it carries.

A library exported by kiln (blob format 2 on, docs/format.md) carries its native
data (the weights) right after the blob and records, in the blob's LINKED_DATA
section, where each lies and the SHA-256 of each 4 MiB chunk. The blob itself
is checksummed, so once it is read the weights can be checked against it. A
library exported since the weights check record also links a table of each
chunk's kiln.lane64 hash and `{prefix}_check_weights` (kiln.runtime.weights_check),
a hash at memory bandwidth: its chunks are checked through that entry (a ctypes
call, without the GIL), the SHA-256s otherwise (or with $KILN_WEIGHTS_HASH=sha256).

`load_module(path, verify_weights=...)` picks when:

- `"lazy"` (the default): in the background, from load on. A thread started at
  load hashes the chunks one by one; a call waits only while chunks are left,
  and hashes those the thread has not reached itself, beside it (so a call
  right after load pays at most the part not yet checked, split over two
  threads, and a call after the check is done pays nothing);
- `True`: while loading (the background thread and the loading thread together);
- `False`: never, for files you trust (the blob and its code are still checked).

`$KILN_VERIFY_WEIGHTS` (`lazy`, `1`/`load`, `0`/`off`) sets the default.
Damage raises `FormatError` naming the library, the artifact and the byte range;
with `"lazy"` every call of the library then raises it, and no kernel runs: a
call never starts before every chunk is checked. The thread is a daemon (it
never holds up interpreter exit), `close()` stops it before the library is
unmapped, and a child process made by `fork` hashes itself what the parent's
thread had not finished (the thread does not exist there).
Version-1 blobs carry no hashes: their weights are not checked.
"""

from __future__ import annotations

import _thread
import abc
import ctypes
import hashlib
import os
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kiln.artifact.integrity import DIGEST_SIZE, LANE64, chunk_count
from kiln.errors import FormatError, UsageError
from kiln.runtime.weights_check import LaneRegion, lane_regions

if TYPE_CHECKING:
    from kiln.artifact.blob import BlobContents
    from kiln.runtime.gathered_pages import GatheredPages
    from kiln.runtime.module import LibraryModule

_OFF = ("0", "off", "false", "no", "never")
_LOAD = ("1", "on", "true", "yes", "load")
# Threads a waiting call hashes with, itself and the background thread included.
_MAX_THREADS = 4


def verify_mode(value: bool | str | None) -> bool | str:
    """The mode for `verify_weights`: True, False or "lazy" (None: $KILN_VERIFY_WEIGHTS)."""
    if value is None:
        env = os.environ.get("KILN_VERIFY_WEIGHTS", "lazy").strip().lower()
        return False if env in _OFF else True if env in _LOAD else "lazy"
    if isinstance(value, bool) or value == "lazy":
        return value
    raise UsageError(f"verify_weights must be True, False or 'lazy', got {value!r}")


class CheckOnce(abc.ABC):
    """A check that runs once, on the first `run()`; remembers and re-raises a failure.

    Subclasses set `done` (True: nothing to check) and define `check()`.
    """

    done: bool

    def __init__(self) -> None:
        self.error: FormatError | None = None
        self._lock = threading.Lock()

    @abc.abstractmethod
    def check(self) -> None:
        """Check everything; FormatError on a mismatch."""

    def run(self) -> None:
        """`check()` once; FormatError (the same one each time) if it failed."""
        if self.done:
            return
        with self._lock:
            if self.error is not None:
                raise self.error
            if self.done:
                return
            try:
                self.check()
            except FormatError as exc:
                self.error = exc
                raise
            self.done = True

    def start(self, keep: Any = None) -> None:
        """Begin checking in the background, holding `keep` meanwhile (a no-op unless a
        subclass can)."""
        del keep  # nothing runs in the background here

    def stop(self) -> None:
        """Stop the background work; `run()` still checks what is left (a no-op here)."""
        return


@dataclass(frozen=True)
class Region:
    """Bytes to check: `view` against `digests`, one SHA-256 per `chunk_size` piece;
    or, with `intact`, chunk k by `intact(k)` (the library's kiln.lane64 check,
    kiln.runtime.weights_check; `digests` unused)."""

    view: memoryview
    digests: bytes
    chunk_size: int
    what: str  # how an error names it
    intact: Callable[[int], bool] | None = None


class ChunkCheck(CheckOnce):
    """Checks regions chunk by chunk: a background thread and the callers of `run()`
    take chunks from one list, so a caller waits only while chunks are left.

    Subclasses define `regions()` (called once, when the first chunk is taken) and
    set `done` (True: nothing to check).
    """

    def __init__(self) -> None:
        super().__init__()
        self._cond = threading.Condition()
        self._regions: list[Region] | None = None
        self._todo: list[tuple[int, int]] | None = None  # (region, chunk), last first
        self._busy: set[tuple[int, int]] = set()  # taken, being hashed
        self._stopped = False
        self._active = False  # the background thread runs
        self._ended = threading.Event()  # set when it returns
        self._ident: int | None = None  # its thread id
        self._keep: Any = None  # what the mapped bytes live in, while the thread reads
        _LIVE.add(self)

    @abc.abstractmethod
    def regions(self) -> list[Region]:
        """The bytes to check (FormatError if a record cannot describe them)."""

    def check(self) -> None:
        """Hash every chunk not taken yet here, wait for the others; FormatError on damage."""
        extra = max(0, min(_MAX_THREADS, os.cpu_count() or 1) - 2)
        helpers = [threading.Thread(target=self._work, args=(False,), daemon=True)
                   for _ in range(extra)]
        for t in helpers:
            t.start()
        self._work(False)
        for t in helpers:
            t.join()
        with self._cond:
            while self._busy and self.error is None:
                self._cond.wait()
            if self.error is not None:
                raise self.error

    def run(self) -> None:
        """Check whatever is left (several callers share the work); FormatError, the
        same each time, if any chunk is damaged."""
        if self.done:
            return
        if self.error is not None:
            raise self.error
        self.check()
        self.done = True

    def start(self, keep: Any = None) -> None:
        """Start the background thread (once; again after `stop()`), which holds
        `keep` (the owner of the mapped bytes) until it ends. It is a daemon: the
        interpreter's exit does not wait for it."""
        with self._cond:
            if self.done or self.error is not None or self._active:
                return
            self._stopped = False
            self._keep = keep
            self._active = True
            self._ended = threading.Event()
            # Not threading.Thread: its start() waits until the new thread runs, a
            # scheduling delay that a loaded host adds to every load (25 ms measured).
            _thread.start_new_thread(self._background, ())

    def join(self) -> None:
        """Wait until the background thread has ended (every chunk hashed, or stopped)."""
        self._ended.wait()

    def stop(self) -> None:
        """Stop the background thread and wait for it (one chunk at most); a later
        `run()` hashes what it left."""
        with self._cond:
            self._stopped = True
            active = self._active
        if active and self._ident != _thread.get_ident():
            self._ended.wait()

    def _background(self) -> None:
        self._ident = _thread.get_ident()
        try:
            self._work(True)
        finally:
            with self._cond:
                self._keep = None  # the owner may go now
                self._active = False
                self._ended.set()

    def _work(self, background: bool) -> None:
        while (item := self._take(background)) is not None:
            error = self._hash(item)
            with self._cond:
                self._busy.discard(item)
                if error is not None and self.error is None:
                    self.error = error
                if not self._busy and (self.error is not None or not self._todo):
                    self._finish()
                self._cond.notify_all()

    def _take(self, background: bool) -> tuple[int, int] | None:
        with self._cond:
            if self._todo is None:
                try:
                    self._plan()
                except FormatError as exc:
                    self.error = exc
                    return None
            if self.error is not None or not self._todo or (background and self._stopped):
                return None
            item = self._todo.pop()
            self._busy.add(item)
            return item

    def _plan(self) -> None:
        regions = self.regions()
        for r in regions:
            if r.intact is None and \
                    len(r.digests) != chunk_count(len(r.view), r.chunk_size) * DIGEST_SIZE:
                raise FormatError(f"{r.what}: {len(r.view)} bytes need "
                                  f"{chunk_count(len(r.view), r.chunk_size)} chunk digests, "
                                  f"the record has {len(r.digests) // DIGEST_SIZE}")
        self._regions = regions
        self._todo = [(i, k) for i, r in enumerate(regions)
                      for k in range(chunk_count(len(r.view), r.chunk_size))][::-1]

    def _hash(self, item: tuple[int, int]) -> FormatError | None:
        assert self._regions is not None
        r = self._regions[item[0]]
        start = item[1] * r.chunk_size
        end = min(start + r.chunk_size, len(r.view))
        if r.intact is not None:  # a ctypes call: the GIL is released meanwhile
            if r.intact(item[1]):
                return None
            return FormatError(f"{r.what}: checksum ({LANE64}) mismatch in bytes [{start}, "
                               f"{end}) of {len(r.view)} (the data is damaged)")
        with r.view[start:end] as piece:  # hashlib releases the GIL on large data
            digest = hashlib.sha256(piece).digest()
        if digest == r.digests[item[1] * DIGEST_SIZE:(item[1] + 1) * DIGEST_SIZE]:
            return None
        return FormatError(f"{r.what}: SHA-256 mismatch in bytes [{start}, {end}) of "
                           f"{len(r.view)} (the data is damaged)")

    def _finish(self) -> None:
        """Every chunk is hashed (or one failed; nothing is hashed after that): drop the
        views of the mapped bytes, which may be unmapped once the owner goes."""
        for r in self._regions or ():
            r.view.release()
        self._regions = []
        self._todo = []

    def _after_fork(self) -> None:
        """In a child: the parent's threads are gone; their chunks go back on the list."""
        self._cond = threading.Condition()
        self._lock = threading.Lock()
        self._active = False
        self._ended = threading.Event()
        self._ended.set()
        if self._todo is not None:
            self._todo.extend(self._busy)
        self._busy = set()


# Every ChunkCheck alive, for the fork handler.
_LIVE: weakref.WeakSet[ChunkCheck] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for check in list(_LIVE):
        check._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class WeightCheck(ChunkCheck):
    """Hashes a library's linked data once; remembers and re-raises a failure.

    With `lanes` (kiln.runtime.weights_check.lane_regions of the blob's
    `weights_check` record) each datum is checked through the library's
    `{prefix}_check_weights`; otherwise against the blob's SHA-256s. With `pages`, the
    pages of its gathered constants are handed back chunk by chunk once hashed.
    """

    def __init__(self, lib: LibraryModule, address: int, symbol_size: int,
                 contents: BlobContents, lanes: list[LaneRegion] | None = None,
                 pages: GatheredPages | None = None) -> None:
        super().__init__()
        items = list(contents.artifacts)
        by_name = {str(r.get("artifact")): (chunk, intact) for r, chunk, intact in lanes or ()}
        self.where = str(lib.path)
        self.spans = []
        self.pages = pages if pages is not None and pages.ranges else None
        for d in contents.linked:
            a = items[d.artifact]
            name = f"{a.codegen_id}/{a.file_name}"
            what = f"{lib.path}: linked data {name}"
            if d.offset + d.length > symbol_size:
                raise FormatError(f"{what} ends at byte {d.offset + d.length} of the blob "
                                  f"symbol, which holds only {symbol_size} (damaged file)")
            if lanes is not None and name not in by_name:
                raise FormatError(f"{what} is missing from the blob's 'weights_check' record "
                                  "(damaged file)")
            chunk, intact = by_name.get(name, (d.chunk_size, None))
            self.spans.append((address + d.offset, d.length, chunk, d.digests, what, intact))
        self.done = not self.spans

    def _hash(self, item: tuple[int, int]) -> FormatError | None:
        """Check one chunk, then hand back its pages of gathered constants
        (kiln.runtime.gathered_pages): no kernel has run yet (a call waits for the whole
        check, a swap runs it to its end first). Those pages leave the page cache, so
        the kernels' faults read the rows they pick from the file."""
        failed = super()._hash(item)
        if self.pages is not None and failed is None:
            address, length, chunk = self.spans[item[0]][:3]
            start = address + item[1] * chunk
            self.pages.hand_back(start, min(start + chunk, address + length))
        return failed

    def regions(self) -> list[Region]:
        """The linked data, read in place in the mapped library."""
        return [Region(memoryview((ctypes.c_uint8 * length).from_address(address)).cast("B"),
                       digests, chunk, what, intact)
                for address, length, chunk, digests, what, intact in self.spans]


class RegionsCheck(ChunkCheck):
    """Checks the regions it is given; `then()` runs once all are intact."""

    def __init__(self, given: list[Region], then: Callable[[], None] | None = None) -> None:
        super().__init__()
        self._given = given
        self._then = then
        self.done = not given

    def regions(self) -> list[Region]:
        """The regions given."""
        return self._given

    def run(self) -> None:
        """ChunkCheck.run, then `then()` (once everything is intact)."""
        super().run()
        if self._then is not None:
            self._then()


class _CheckedEntry:
    """Stands in for a native entry: waits for the weight check, then runs the entry."""

    def __init__(self, c_func: Any, check: CheckOnce) -> None:
        self.c_func = c_func
        self.check = check

    def __call__(self, *args: Any) -> Any:
        if not self.check.done:
            self.check.run()
        return self.c_func(*args)


def hash_choice() -> str:
    """`$KILN_WEIGHTS_HASH`: "lane64" (the default: a library's kiln.lane64 table where
    it has one, else its SHA-256s) or "sha256" (the SHA-256s always; slower)."""
    value = os.environ.get("KILN_WEIGHTS_HASH", "lane64").strip().lower()
    if value not in ("lane64", "sha256"):
        raise UsageError(f"$KILN_WEIGHTS_HASH must be 'lane64' or 'sha256', got {value!r}")
    return value


def lane_record(lib: LibraryModule, metadata: Mapping[str, Any]) -> list[LaneRegion] | None:
    """The library's kiln.lane64 regions to check by (None: check the SHA-256s)."""
    if "weights_check" not in metadata or hash_choice() == "sha256":
        return None
    return lane_regions(lib.cdll, metadata["weights_check"], str(lib.path))


def check_weights(lib: LibraryModule, address: int, symbol_size: int,
                  contents: BlobContents, mode: bool | str | None,
                  pages: GatheredPages | None = None) -> None:
    """Check `lib`'s weights now, or in the background and before its first call, per
    `mode`. `address` is where the blob symbol is mapped and `symbol_size` its ELF size;
    `pages`, its gathered constants, handed back as the check goes.
    """
    if verify_mode(mode) is False or not contents.linked:
        return
    lanes = lane_record(lib, contents.metadata)
    check = WeightCheck(lib, address, symbol_size, contents, lanes, pages)
    arm_check(lib, check, mode, keep=lib)


def arm_check(lib: LibraryModule, check: CheckOnce, mode: bool | str | None, *,
              keep: Any = None) -> None:
    """Run `check` now, or start it in the background and make every call of `lib`'s
    functions wait for it, per `mode` (see verify_mode); False: never. `keep` is what
    the checked bytes live in (held by the background thread); `lib.close()` stops it."""
    mode = verify_mode(mode)
    if mode is False or check.done:
        return
    entries = [fn for name in lib.function_names()
               if (fn := lib.get_function(name, query_imports=False)) is not None]
    lib.on_close(check.stop)
    check.start(keep)
    if mode is True or not entries or not all(hasattr(fn, "c_func") for fn in entries):
        try:
            check.run()
        except FormatError:
            check.stop()
            raise
        return
    for fn in entries:
        fn.c_func = _CheckedEntry(fn.c_func, check)  # type: ignore[attr-defined]


__all__ = ["CheckOnce", "ChunkCheck", "Region", "RegionsCheck", "WeightCheck", "arm_check",
           "check_weights", "hash_choice", "lane_record", "verify_mode"]

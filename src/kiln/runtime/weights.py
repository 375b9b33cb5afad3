"""The check of a loaded library's weights against the chunk hashes in its blob.

A library exported by kiln (blob format 2, docs/format.md) carries its native
data (the weights) right after the blob and records, in the blob's LINKED_DATA
section, where each lies and the SHA-256 of each 4 MiB chunk. The blob itself
is checksummed, so once it is read the weights can be checked against it.

`load_module(path, verify_weights=...)` picks when:

- `"lazy"` (the default): before the first call of any function of the library
  (loading stays a few milliseconds; the first call pays the hashing, which it
  would mostly pay anyway in page faults, as it reads the weights);
- `True`: while loading;
- `False`: never, for files you trust (the blob and its code are still checked).

`$KILN_VERIFY_WEIGHTS` (`lazy`, `1`/`load`, `0`/`off`) sets the default.
Damage raises `FormatError` naming the library, the artifact and the byte range;
with `"lazy"` every call of the library then raises it, and no kernel runs.
Version-1 blobs carry no hashes: their weights are not checked.
"""

from __future__ import annotations

import abc
import ctypes
import os
import threading
from typing import TYPE_CHECKING, Any

from kiln.artifact.integrity import verify
from kiln.errors import FormatError, UsageError

if TYPE_CHECKING:
    from kiln.artifact.blob import BlobContents
    from kiln.runtime.module import LibraryModule

_OFF = ("0", "off", "false", "no", "never")
_LOAD = ("1", "on", "true", "yes", "load")


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


class WeightCheck(CheckOnce):
    """Hashes a library's linked data once; remembers and re-raises a failure."""

    def __init__(self, lib: LibraryModule, address: int, symbol_size: int,
                 contents: BlobContents) -> None:
        super().__init__()
        items = list(contents.artifacts)
        self.where = str(lib.path)
        self.regions = []
        for d in contents.linked:
            a = items[d.artifact]
            what = f"{lib.path}: linked data {a.codegen_id}/{a.file_name}"
            if d.offset + d.length > symbol_size:
                raise FormatError(f"{what} ends at byte {d.offset + d.length} of the blob "
                                  f"symbol, which holds only {symbol_size} (damaged file)")
            self.regions.append((address + d.offset, d.length, d.chunk_size, d.digests, what))
        self.done = not self.regions

    def check(self) -> None:
        """Check every region against its chunk hashes."""
        for address, length, chunk, digests, what in self.regions:
            view = memoryview((ctypes.c_uint8 * length).from_address(address)).cast("B")
            try:
                verify(view, digests, chunk, what)
            finally:
                view.release()


class _CheckedEntry:
    """Stands in for a native entry: runs the weight check, then the entry."""

    def __init__(self, c_func: Any, check: CheckOnce) -> None:
        self.c_func = c_func
        self.check = check

    def __call__(self, *args: Any) -> Any:
        if not self.check.done:
            self.check.run()
        return self.c_func(*args)


def check_weights(lib: LibraryModule, address: int, symbol_size: int,
                  contents: BlobContents, mode: bool | str | None) -> None:
    """Check `lib`'s weights now, or arm the check before its first call, per `mode`.

    `address` is where the blob symbol is mapped and `symbol_size` its ELF size.
    """
    if verify_mode(mode) is False or not contents.linked:
        return
    arm_check(lib, WeightCheck(lib, address, symbol_size, contents), mode)


def arm_check(lib: LibraryModule, check: CheckOnce, mode: bool | str | None) -> None:
    """Run `check` now, or before the first call of
    any of `lib`'s functions, per `mode` (see verify_mode); False: never."""
    mode = verify_mode(mode)
    if mode is False:
        return
    entries = [fn for name in lib.function_names()
               if (fn := lib.get_function(name, query_imports=False)) is not None]
    wrappable = all(hasattr(fn, "c_func") for fn in entries)
    if mode is True or not wrappable or not entries:
        check.run()
        return
    for fn in entries:
        fn.c_func = _CheckedEntry(fn.c_func, check)  # type: ignore[attr-defined]


__all__ = ["CheckOnce", "WeightCheck", "arm_check", "check_weights", "verify_mode"]

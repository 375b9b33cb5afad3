"""CallGuard: lets `close()` wait for the calls in flight instead of unmapping their code.

Each call registers itself while it runs; `close()` marks the guard closed, so no
new call starts, then waits until no call is registered before the owner releases
its code. A call after that raises `CallError` naming the closed owner.

A call registers by appending to a list and leaves by popping from it: both are
atomic in CPython (under the GIL, and with the free-threaded build's per-object
locks), and together cost a fifth of acquiring a lock twice, which for a small
model's call is a measurable share (bench/call_overhead.py). The order makes it
safe without a lock: a call appends first and then reads `closed`; `close()`
sets `closed` first and then reads the list. So either the call sees `closed`
(and leaves without running) or `close()` sees the call (and waits for it).
"""

from __future__ import annotations

import threading

from kiln.errors import CallError


class CallGuard:
    """Counts calls in flight on one library or JIT module; `close()` waits for them."""

    __slots__ = ("_calls", "_close_lock", "_idle", "closed", "owner")

    def __init__(self, owner: str) -> None:
        self.owner = owner  # how error messages name the library
        self.closed = False
        self._calls: list[None] = []  # one entry per call in flight
        self._idle = threading.Event()  # set once closed and no call is running
        self._close_lock = threading.Lock()  # one close() is the first

    def enter(self, function: str) -> None:
        """Start a call of `function`; CallError if the owner is closed."""
        self._calls.append(None)
        if self.closed:
            self.exit()
            raise CallError(f"{function}: {self.owner} is closed; load it again to call it")

    def exit(self) -> None:
        """End a call started with `enter`."""
        self._calls.pop()
        if self.closed and not self._calls:
            self._idle.set()

    def close(self) -> bool:
        """Refuse new calls and wait for running ones; True the first time."""
        with self._close_lock:
            first = not self.closed
            self.closed = True
        if not self._calls:
            self._idle.set()
        self._idle.wait()
        return first

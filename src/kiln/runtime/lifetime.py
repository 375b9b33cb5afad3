"""CallGuard: lets `close()` wait for the calls in flight instead of unmapping their code.

Each call registers itself while it runs; `close()` marks the guard closed, so no
new call starts, then waits until no call is registered before the owner releases
its code. A call after that raises `CallError` naming the closed owner.

A call registers by appending to a list and leaves by popping from it: under the
GIL both are atomic and ordered, and together cost a fifth of taking a lock twice,
a measurable share of a small model's call (bench/call_overhead.py). The order
makes it safe without a lock: a call appends first and then reads `closed`;
`close()` sets `closed` first and then reads the list, so either the call sees
`closed` (and leaves without running) or `close()` sees the call (and waits for
it). `pause()` uses the same order to stop the calls for a moment (`swap_weights`
installs new weights between calls): a call that meets a paused guard waits for
`resume()` and starts then. A free-threaded interpreter gives no such order between
two threads' plain reads and writes, so there every step takes the guard's lock.
"""

from __future__ import annotations

import sys
import threading

from kiln.errors import CallError

# False on a free-threaded interpreter running without the GIL (PEP 703).
_GIL = bool(getattr(sys, "_is_gil_enabled", lambda: True)())


class CallGuard:
    """Counts calls in flight on one library or JIT module; `close()` waits for them."""

    __slots__ = ("_calls", "_idle", "_lock", "_paused", "_resumed", "closed", "owner")

    def __init__(self, owner: str) -> None:
        self.owner = owner  # how error messages name the library
        self.closed = False
        self._calls: list[None] = []  # one entry per call in flight
        self._idle = threading.Event()  # set once closed and no call is running
        self._lock = threading.Lock()  # close(); every step without the GIL
        self._paused = False  # closed by pause(), reopened by resume()
        self._resumed: threading.Event | None = None  # set by resume(); calls wait on it

    def enter(self, function: str) -> None:
        """Start a call of `function`; CallError if the owner is closed."""
        self._calls.append(None)
        if self.closed:
            self._calls.pop()
            if not self._calls:
                self._idle.set()
            resumed = self._resumed
            if resumed is not None:  # paused, not closed: wait, then start
                resumed.wait()
                return self.enter(function)
            if not self.closed:  # a pause ended meanwhile
                return self.enter(function)
            raise CallError(f"{function}: {self.owner} is closed; load it again to call it")

    def exit(self) -> None:
        """End a call started with `enter`."""
        self._calls.pop()
        if self.closed and not self._calls:
            self._idle.set()

    if not _GIL:  # the same steps, each under the lock
        _enter_unlocked, _exit_unlocked = enter, exit

        def enter(self, function: str) -> None:
            """Start a call of `function`; CallError if the owner is closed."""
            while True:
                with self._lock:
                    resumed = self._resumed if self.closed else None
                    if resumed is None:  # not paused: never waits under the lock
                        self._enter_unlocked(function)
                        return
                resumed.wait()

        def exit(self) -> None:
            """End a call started with `enter`."""
            with self._lock:
                self._exit_unlocked()

    def close(self) -> bool:
        """Refuse new calls and wait for running ones; True the first time."""
        with self._lock:
            first = not self.closed or self._paused
            self.closed = True
            self._paused = False  # a pause in progress ends closed
            if not self._calls:
                self._idle.set()
        self._idle.wait()
        return first

    def pause(self) -> None:
        """Hold new calls (they wait for `resume()`) and wait for the running ones to end.
        CallError if the owner is closed. One pause at a time (the caller serialises)."""
        with self._lock:
            if self.closed:
                raise CallError(f"{self.owner} is closed; load it again")
            self._resumed = threading.Event()
            self._paused = True
            self.closed = True
            if not self._calls:
                self._idle.set()
        self._idle.wait()

    def resume(self) -> None:
        """Let calls run again after `pause()` (unless `close()` came meanwhile)."""
        with self._lock:
            if self._paused:  # reopen before dropping the event: see enter()
                self._paused = False
                self._idle.clear()
                self.closed = False
            resumed, self._resumed = self._resumed, None
        if resumed is not None:
            resumed.set()

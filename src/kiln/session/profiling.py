"""`SessionOptions.enable_profiling`: onnxruntime's profile file, from kiln's timers.

A session with profiling on compiles its model with `profile=True` (per-kernel timers,
kiln.runtime.profile). Every run reads the counters before and after; the profile is
onnxruntime's JSON: a list of Chrome-trace events ("ph": "X", "ts" and "dur" in
microseconds since the session started), "Session" events for the session's start and
each `model_run`, and one "Node" event per kernel each run called (kiln's kernels are
its fused ops: "op_name" is the kernel's name, e.g. "fused_matmul_packed_relu"). The
kernels of one run are laid end to end from the run's start, in timer-site order. A
library built without timers (a .so compiled without --profile) gets the Session
events only. `end_profiling()` writes the file and returns its path.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kiln.runtime.profile import ProfileRow

T = TypeVar("T")
PROVIDER = "CPUExecutionProvider"


class SessionProfiler:
    """The events of one session's profile, from its creation to `end()`."""

    def __init__(self, prefix: str, read: Callable[[], list[ProfileRow]] | None) -> None:
        self.start_ns = time.time_ns()
        self._origin = time.perf_counter_ns()
        self._prefix = prefix
        self.read = read
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _event(self, cat: str, name: str, began: int, ended: int,
               args: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"cat": cat, "pid": self._pid, "tid": threading.get_native_id(),
                "dur": max(0, (ended - began) // 1000), "ts": (began - self._origin) // 1000,
                "ph": "X", "name": name, "args": args or {}}

    def initialized(self) -> None:
        """Record the session's start, from the profiler's creation to now."""
        self._events.append(self._event("Session", "session_initialization", self._origin,
                                        time.perf_counter_ns()))

    def run(self, call: Callable[[], T]) -> T:
        """`call()` with its time (and its kernels', when the library has timers) kept."""
        before = self.read() if self.read is not None else []
        began = time.perf_counter_ns()
        result = call()
        ended = time.perf_counter_ns()
        after = self.read() if self.read is not None else []
        events = self._node_events(before, after, began)
        events.append(self._event("Session", "model_run", began, ended))
        with self._lock:
            self._events.extend(events)
        return result

    def _node_events(self, before: list[ProfileRow], after: list[ProfileRow],
                     began: int) -> list[dict[str, Any]]:
        out, at = [], began
        for index, (old, new) in enumerate(zip(before, after)):
            if new.kernel is None or new.calls == old.calls:
                continue  # the whole call's site, or a kernel this run did not call
            spent = new.total_ns - old.total_ns
            out.append(self._event("Node", f"{new.kernel}_kernel_time", at, at + spent, {
                "op_name": new.kernel, "provider": PROVIDER, "node_index": str(index),
                "function": new.function, "calls": str(new.calls - old.calls)}))
            at += spent
        return out

    def end(self) -> str:
        """Write the profile as onnxruntime names it (`{prefix}_{date}_{time}.json`, in
        the current directory unless the prefix has one) and return its path."""
        now = time.time()
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now))
        path = Path(f"{self._prefix}_{stamp}_{int(now * 1000) % 1000:03d}.json")
        with self._lock:
            events = list(self._events)
        path.write_text(json.dumps(events, indent=0), encoding="utf-8")
        return str(path)


__all__ = ["SessionProfiler"]

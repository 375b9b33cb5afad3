"""The progress of a compile: what the compiler is doing, shown on a terminal or reported.

`CompileProgress` is a pass instrument (kiln.transform.instruments): every
pass run and backend step (`timed_step`: codegen, object emission, export,
link) updates one line drawn by rich (a spinner, the current pass or step,
how many passes ran, the elapsed time). The line appears only once a compile
has taken longer than a second, only when stderr is a terminal, and is erased
when the compile ends; piped or redirected output never sees it. `kiln compile`
shows it; `kiln.InferenceSession` shows it too, or, off a terminal, hands each
change to a callback (`report`, a `ProgressEvent` each) (docs/session.md).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from kiln.ir.module import IRModule
from kiln.transform.instruments import PassInstrument
from kiln.transform.pass_base import Pass

# Seconds of silence before the display appears (short compiles never show it).
SHOW_AFTER = 1.0


def _console(out: IO[str]) -> Any:
    """A rich console writing to `out`, or None when rich is not installed (an install
    without it compiles without the display)."""
    try:
        from rich.console import Console  # optional: rich (the compiler extra)
    except ImportError:
        return None
    return Console(file=out)


@dataclass(frozen=True)
class ProgressEvent:
    """One change of a compile's progress, as `CompileProgress(report=...)` hands it.

    Attributes:
        what: what is compiled (e.g. the model file's name).
        stage: what runs now: "importing the ONNX model", "pass fuse-ops", "codegen",
            "export.link", ..., and "done" last.
        passes: how many passes have run.
        elapsed: seconds since the compile began.
    """

    what: str
    stage: str
    passes: int
    elapsed: float


class CompileProgress(PassInstrument):
    """A one-line live display of the running pass or backend step.

    Use it as a context manager around the compile, with the instrument in the
    PassContext; `stage(text)` names a phase outside the passes (e.g. the import).
    `report`, if given, is called with a `ProgressEvent` at every change (and the
    display is off: `display=False`).
    """

    def __init__(self, what: str, *, stream: IO[str] | None = None,
                 show_after: float = SHOW_AFTER,
                 report: Callable[[ProgressEvent], None] | None = None,
                 display: bool = True) -> None:
        self.what = what
        self.report = report
        self._start = time.perf_counter()
        out = stream if stream is not None else sys.stderr
        self.console: Any = None
        if display and out.isatty():
            self.console = _console(out)
        self.enabled = bool(self.console is not None and self.console.is_terminal
                            and not self.console.is_dumb_terminal)
        self.show_after = show_after
        self.passes = 0
        self.current = "starting"
        self._progress: Any = None
        self._task: Any = None
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._steps: list[str] = []  # what was shown before each open step

    def __enter__(self) -> CompileProgress:
        if self.enabled:
            self._timer = threading.Timer(self.show_after, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.stage("done")
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self._progress is not None:
                self._progress.stop()

    def _show(self) -> None:
        from rich.progress import (  # optional: rich (the compiler extra)
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )

        with self._lock:
            if self._closed:
                return
            self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                      TimeElapsedColumn(), console=self.console,
                                      transient=True)
            self._task = self._progress.add_task(self._text(), total=None)
            self._progress.start()

    def _text(self) -> str:
        from rich.markup import escape  # optional: rich (the compiler extra)

        return escape(f"compiling {self.what}: {self.current} ({self.passes} passes done)")

    def stage(self, text: str) -> None:
        """Show (and report) `text` as the current phase."""
        with self._lock:
            self.current = text
            if self._progress is not None:
                self._progress.update(self._task, description=self._text())
        if self.report is not None:
            self.report(ProgressEvent(self.what, text, self.passes,
                                      time.perf_counter() - self._start))

    # -- PassInstrument hooks
    def run_before_pass(self, mod: IRModule, p: Pass) -> None:
        if not p.is_container:
            self.stage(f"pass {p.name}")

    def run_after_pass(self, mod: IRModule, p: Pass) -> None:
        if not p.is_container:
            self.passes += 1

    def enter_step(self, name: str, depth: int) -> None:
        self._steps.append(self.current)
        self.stage(name)

    def record_step(self, name: str, depth: int, seconds: float) -> None:
        if self._steps:  # back to what ran before this step (the enclosing step)
            self.stage(self._steps.pop())

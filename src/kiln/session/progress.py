"""A session's compile progress: a line on a terminal, a callback or the `kiln` logger.

`kiln.InferenceSession` over an ONNX file that misses the compile cache compiles it,
which takes seconds to minutes. Where the progress goes:

- `SessionOptions.progress`, when set: the callable gets a
  `kiln.driver.progress.ProgressEvent` at every change (the pass or backend step now
  running, the passes done, the seconds elapsed), and nothing is drawn;
- else, when stderr is a terminal (and rich is installed): the one-line display of
  `kiln compile` (kiln.driver.progress), erased at the end;
- else: the `logging` logger "kiln": the import, the code generation, the link and the
  end at INFO, each pass and backend sub-step at DEBUG.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from kiln.driver.progress import CompileProgress, ProgressEvent

LOGGER = logging.getLogger("kiln")


def progress_for(what: str, options: Any) -> CompileProgress:
    """The progress instrument of a session compiling `what` with `options`."""
    callback = getattr(options, "progress", None)
    if callback is not None:
        return CompileProgress(what, report=callback, display=False)
    terminal = bool(getattr(sys.stderr, "isatty", lambda: False)())
    progress = CompileProgress(what, display=terminal)
    if not progress.enabled:
        progress.report = StageLog()
    return progress


class StageLog:
    """One compile's events to the `kiln` logger: a pass or a sub-step ("export.link") at
    DEBUG, any other stage at INFO once in a row (a step's sub-steps return to it). One
    per compile: a stage left logged by another compile (one that failed in its import)
    must not hide this one's first line."""

    def __init__(self) -> None:
        self.stage = ""

    def __call__(self, event: ProgressEvent) -> None:
        detail = event.stage.startswith("pass ") or "." in event.stage
        if not detail and event.stage == self.stage:
            return
        if not detail:
            self.stage = event.stage
        LOGGER.log(logging.DEBUG if detail else logging.INFO,
                   "compiling %s: %s (%d passes, %.1f s)", event.what, event.stage,
                   event.passes, event.elapsed)

"""Timed compile steps: how the code generators report a step without importing passes.

The compiler times its work outside the pass pipelines (`codegen.lower`,
`codegen.emit_object`, ...) as steps that the current PassContext's instruments hear
about (`kiln.transform.instruments.timed_step`, docs/compile.md "Timing a build").
The code generators never import kiln.transform, so they time a step through
`timed_step` here, which hands it to the timer kiln.transform registered when it was
imported (`register_step_timer`). Before that no PassContext, hence no instrument,
exists: `timed_step` then times nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

# `timer(name)`: a context manager around one step.
StepTimer = Callable[[str], contextlib.AbstractContextManager[None]]

_TIMER: list[StepTimer] = []  # the registered timer, if any


def register_step_timer(timer: StepTimer) -> None:
    """Have `timer` time every later `timed_step` (kiln.transform.instruments does on
    import); it replaces the one registered before."""
    _TIMER[:] = [timer]


def timed_step(name: str) -> contextlib.AbstractContextManager[None]:
    """Time the compile step `name` with the registered timer (nothing when none is)."""
    return _TIMER[0](name) if _TIMER else contextlib.nullcontext()


__all__ = ["StepTimer", "register_step_timer", "timed_step"]

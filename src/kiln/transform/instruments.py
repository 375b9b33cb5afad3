"""Pass instruments: hooks around every pass run (timing, IR dumps, custom checks)."""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kiln.ir.module import IRModule
from kiln.ir.steps import register_step_timer
from kiln.transform.context import PassContext
from kiln.transform.pass_base import Pass


class PassInstrument:
    """Base of instruments; every hook is optional (the defaults do nothing)."""

    def enter_pass_ctx(self) -> None:
        """Called when the PassContext holding this instrument is entered."""

    def exit_pass_ctx(self) -> None:
        """Called when that PassContext exits."""

    def should_run(self, mod: IRModule, p: Pass) -> bool:
        """Return False to skip `p` (every instrument must agree to run it)."""
        return True

    def run_before_pass(self, mod: IRModule, p: Pass) -> None:
        """Called just before `p` runs on `mod`."""

    def run_after_pass(self, mod: IRModule, p: Pass) -> None:
        """Called with the module `p` returned."""

    def enter_step(self, name: str, depth: int) -> None:
        """Called when a backend step (codegen, link, export, ...) starts; see `timed_step`."""

    def record_step(self, name: str, depth: int, seconds: float) -> None:
        """Called when a backend step (codegen, link, export, ...) ends; see `timed_step`."""


_STEPS = threading.local()  # per thread: how many steps are open


@contextlib.contextmanager
def timed_step(name: str) -> Iterator[None]:
    """Time a compile step outside the pass pipelines and tell the current instruments.

    kiln wraps its backend steps in this: `fingerprint`, `cache.lookup`,
    `codegen` (with `codegen.<backend step>` inside, e.g. `codegen.emit_object`),
    `cache.store`, and `export` (with `export.check`, `export.compile`, `export.data`,
    `export.link`). Steps nest (depth counts the enclosing steps). A step that
    raises is not reported. The code generators, which do not import kiln.transform,
    reach this through `kiln.ir.steps.timed_step`.
    """

    instruments = PassContext.current().instruments
    if not instruments:
        yield
        return
    depth = getattr(_STEPS, "depth", 0)
    for inst in instruments:
        inst.enter_step(name, depth)
    _STEPS.depth = depth + 1
    start = time.perf_counter()
    try:
        yield
    finally:
        _STEPS.depth = depth
    seconds = time.perf_counter() - start
    for inst in instruments:
        inst.record_step(name, depth, seconds)


# The code generators time their steps through kiln.ir.steps, which cannot import this.
register_step_timer(timed_step)


@dataclass(frozen=True)
class PassTiming:
    """One pass run: its name, nesting depth (0 = top level) and wall time."""

    name: str
    depth: int
    seconds: float


class TimingInstrument(PassInstrument):
    """Measures the wall time of every pass run and backend step; `report()` prints a table.

    Nested passes (the members of a Sequential) are indented under it; their
    times are included in the container's. `steps` holds the backend steps
    (`timed_step`: codegen, object emission, cache, link, export) in the order
    they ended.
    """

    def __init__(self) -> None:
        self.timings: list[PassTiming] = []
        self.steps: list[PassTiming] = []
        self._open: list[tuple[int, float]] = []  # (index into timings, start time)

    def enter_pass_ctx(self) -> None:
        self.timings.clear()
        self.steps.clear()
        self._open.clear()

    def record_step(self, name: str, depth: int, seconds: float) -> None:
        self.steps.append(PassTiming(name, depth, seconds))

    def step_seconds(self, name: str) -> float:
        """Total seconds of every run of the step `name` (0.0 if it never ran)."""
        return sum(x.seconds for x in self.steps if x.name == name)

    def run_before_pass(self, mod: IRModule, p: Pass) -> None:
        self.timings.append(PassTiming(p.name, len(self._open), 0.0))
        self._open.append((len(self.timings) - 1, time.perf_counter()))

    def run_after_pass(self, mod: IRModule, p: Pass) -> None:
        index, start = self._open.pop()
        entry = self.timings[index]
        self.timings[index] = PassTiming(entry.name, entry.depth, time.perf_counter() - start)

    def total(self) -> float:
        """Seconds spent in top-level passes."""
        return sum(x.seconds for x in self.timings if x.depth == 0)

    def report(self) -> str:
        """A text table: pass (indented by nesting), milliseconds, share of the total."""
        total = self.total() or 1e-12
        rows = [(("  " * x.depth) + x.name, x.seconds) for x in self.timings]
        width = max([len(r[0]) for r in rows] + [4])
        lines = [f"{'pass':<{width}}  {'ms':>9}  {'%':>6}"]
        lines += [f"{name:<{width}}  {sec * 1e3:9.3f}  {100 * sec / total:6.1f}"
                  for name, sec in rows]
        lines.append(f"{'total':<{width}}  {self.total() * 1e3:9.3f}  {100.0:6.1f}")
        if self.steps:
            steps = [(("  " * x.depth) + x.name, x.seconds) for x in self.steps]
            w = max([len(r[0]) for r in steps] + [4])
            lines.append("")
            lines.append(f"{'step':<{w}}  {'ms':>9}")
            lines += [f"{name:<{w}}  {sec * 1e3:9.3f}" for name, sec in steps]
        return "\n".join(lines)


DumpCallback = Callable[[str, str], None]


class DumpIRInstrument(PassInstrument):
    """Dumps the module after each pass, as kiln.script text.

    Args:
        dest: a directory (files `NNN_<pass>.py`, numbered in run order) or a
            callback `fn(pass_name, text)`.
        include_containers: also dump after a Sequential (its members are
            dumped anyway).

    Falls back to `repr(mod)` plus each function's repr when kiln.script
    cannot print the module.
    """

    def __init__(self, dest: str | Path | DumpCallback, *, include_containers: bool = False
                 ) -> None:
        self.dest = dest
        self.include_containers = include_containers
        self.count = 0
        self.files: list[Path] = []

    def run_after_pass(self, mod: IRModule, p: Pass) -> None:
        if p.is_container and not self.include_containers:
            return
        text = module_text(mod)
        if callable(self.dest):
            self.dest(p.name, text)
        else:
            directory = Path(self.dest)
            directory.mkdir(parents=True, exist_ok=True)
            safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", p.name) or "pass"
            path = directory / f"{self.count:03d}_{safe}.py"
            path.write_text(text, encoding="utf-8")
            self.files.append(path)
        self.count += 1


def module_text(mod: IRModule) -> str:
    """The module as kiln.script text, or a repr-based fallback if printing fails."""
    try:
        return mod.script()
    except Exception as exc:  # the printer is optional for dumps: never fail a build
        lines = [f"# kiln.script could not print this module ({type(exc).__name__}: {exc})",
                 f"# {mod!r}"]
        lines += [f"# {name} = {fn!r}" for name, fn in mod.items()]
        return "\n".join(lines) + "\n"

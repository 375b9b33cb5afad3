"""Pass instruments: hooks around every pass run (timing, IR dumps, custom checks)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kiln.ir.module import IRModule
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


@dataclass(frozen=True)
class PassTiming:
    """One pass run: its name, nesting depth (0 = top level) and wall time."""

    name: str
    depth: int
    seconds: float


class TimingInstrument(PassInstrument):
    """Measures the wall time of every pass run; `report()` prints a table.

    Nested passes (the members of a Sequential) are indented under it; their
    times are included in the container's.
    """

    def __init__(self) -> None:
        self.timings: list[PassTiming] = []
        self._open: list[tuple[int, float]] = []  # (index into timings, start time)

    def enter_pass_ctx(self) -> None:
        self.timings.clear()
        self._open.clear()

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

"""PassContext: the settings every pass run sees (instruments, config, disabled passes).

    with PassContext(instruments=[TimingInstrument()], config={"kiln.cache": False}):
        ex = kiln.compile(mod, "llvm")

Contexts nest per thread; `PassContext.current()` is the innermost one, or a
default context when none was entered.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from kiln.errors import CompileError, KilnError
from kiln.ir.module import IRModule

if TYPE_CHECKING:
    from kiln.transform.instruments import PassInstrument
    from kiln.transform.pass_base import Pass

_LOCAL = threading.local()

# Every kiln error (FrontendError, FormatError, IRError, CompileError, ...) already
# names what is at fault and keeps its type; anything else a pass raises is a bug
# in the pass and is wrapped in a CompileError naming the pass.
_KNOWN_ERRORS = (KilnError,)


class PassContext:
    """Instruments, free-form config and disabled pass names for pass runs.

    Args:
        instruments: objects with the `PassInstrument` hooks, called around
            every pass in order.
        config: options read by passes and the driver, e.g. `"kiln.cache": False`.
        disabled_passes: names of passes to skip.
    """

    def __init__(
        self, instruments: Iterable[PassInstrument] = (), config: Mapping[str, Any] | None = None,
        disabled_passes: Iterable[str] = (),
    ) -> None:
        self.instruments: list[PassInstrument] = list(instruments)
        self.config: dict[str, Any] = dict(config or {})
        self.disabled_passes: frozenset[str] = frozenset(disabled_passes)

    # ------------------------------------------------------------------ scope

    @staticmethod
    def current() -> PassContext:
        """The innermost entered context on this thread (a default one if none)."""
        stack = _stack()
        if stack:
            return stack[-1]
        default: PassContext | None = getattr(_LOCAL, "default", None)
        if default is None:
            default = PassContext()
            _LOCAL.default = default
        return default

    def __enter__(self) -> PassContext:
        _stack().append(self)
        for inst in self.instruments:
            inst.enter_pass_ctx()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack = _stack()
        if not stack or stack[-1] is not self:
            raise CompileError("PassContext scopes must be exited in the order they were entered")
        stack.pop()
        for inst in self.instruments:
            inst.exit_pass_ctx()

    # ------------------------------------------------------------------ running

    def run_pass(self, p: Pass, mod: IRModule) -> IRModule:
        """Run `p` on `mod` with this context's instruments; checks the result type."""
        if not isinstance(mod, IRModule):
            raise CompileError(
                f"pass '{p.name}' expects an IRModule, got {type(mod).__name__}")
        if p.name in self.disabled_passes:
            return mod
        if not all(inst.should_run(mod, p) for inst in self.instruments):
            return mod
        for inst in self.instruments:
            inst.run_before_pass(mod, p)
        try:
            out = p.run(mod)
        except _KNOWN_ERRORS:
            raise
        except Exception as exc:
            raise CompileError(f"pass '{p.name}' failed: {type(exc).__name__}: {exc}") from exc
        if not isinstance(out, IRModule):
            raise CompileError(
                f"pass '{p.name}' returned {type(out).__name__}; a pass must return an IRModule")
        for inst in self.instruments:
            inst.run_after_pass(out, p)
        return out

    def __repr__(self) -> str:
        return (f"PassContext(instruments={self.instruments!r}, config={self.config!r}, "
                f"disabled_passes={sorted(self.disabled_passes)!r})")


def _stack() -> list[PassContext]:
    stack: list[PassContext] | None = getattr(_LOCAL, "stack", None)
    if stack is None:
        stack = []
        _LOCAL.stack = stack
    return stack

"""onnxruntime's module-level settings that scripts call before making a session.

kiln has no onnxruntime logger and sends no telemetry: the logging and telemetry
calls check their argument and do nothing. `set_global_thread_pool_sizes` sets kiln's
process-wide thread count (`kiln.runtime.set_num_threads`).
"""

from __future__ import annotations

from kiln.errors import ArgumentTypeError, UsageError
from kiln.runtime import threads


def _level(value: object, what: str, top: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ArgumentTypeError(f"{what} must be an int, got {type(value).__name__}")
    if not 0 <= value <= top:
        raise UsageError(f"{what} must be 0 to {top}, got {value}")
    return value


def set_default_logger_severity(severity: int) -> None:
    """Accepted as onnxruntime's (0 verbose .. 4 fatal); kiln logs nothing at run time."""
    _level(severity, "set_default_logger_severity: severity", 4)


def set_default_logger_verbosity(verbosity: int) -> None:
    """Accepted as onnxruntime's; kiln logs nothing at run time."""
    _level(verbosity, "set_default_logger_verbosity: verbosity", 1 << 30)


def set_global_thread_pool_sizes(intra_op_num_threads: int = 0,
                                 inter_op_num_threads: int = 0) -> None:
    """The threads of every kiln library of this process (kiln.runtime.set_num_threads;
    0: one per online CPU). kiln runs one op at a time, so inter_op_num_threads is
    checked and has no effect."""
    _level(inter_op_num_threads, "inter_op_num_threads", threads.MAX_THREADS)
    n = _level(intra_op_num_threads, "intra_op_num_threads", threads.MAX_THREADS)
    threads.set_num_threads(n or None)


def disable_telemetry_events() -> None:
    """Nothing to do: kiln sends no telemetry."""


def enable_telemetry_events() -> None:
    """Nothing to do: kiln sends no telemetry."""


__all__ = ["disable_telemetry_events", "enable_telemetry_events", "set_default_logger_severity",
           "set_default_logger_verbosity", "set_global_thread_pool_sizes"]

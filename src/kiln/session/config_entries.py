"""onnxruntime's session configuration entries (`SessionOptions.add_session_config_entry`)
and what kiln does with each.

Keys kiln knows are checked and mapped (KNOWN: the key -> what it does in kiln);
any other key is kept, so `get_session_config_entry` answers it as onnxruntime does,
and listed by `SessionOptions.unused_session_config_entries()`: kiln reads nothing
of it (a warning says so once per key).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from kiln.errors import ArgumentTypeError, UsageError

# key -> what it does in kiln (docs/session.md's table).
KNOWN: dict[str, str] = {
    "session.intra_op.allow_spinning":
        "'0': the library's threads sleep at once after a parallel loop "
        "(Module.set_spin_us(0)); '1' (default): they spin first",
    "session.inter_op.allow_spinning": "accepted: kiln has no inter-op threads",
    "session.disable_prepacking": "accepted: kiln packs weights at compile time",
    "session.use_env_allocators": "accepted: kiln's library plans its own workspace",
    "session.load_model_format": "'ONNX' only: kiln reads ONNX models (compiled libraries "
                                 "are opened by their suffix)",
    "session.set_denormal_as_zero": "accepted: kiln keeps the CPU's floating-point mode",
    "session.use_device_allocator_for_initializers": "accepted: weights are in the library",
}
_FLAGS = ("0", "1")


def check(key: Any, value: Any) -> None:
    """A key and value as `add_session_config_entry` takes them; a known key's value
    checked (UsageError naming the values it takes)."""
    if not isinstance(key, str) or not isinstance(value, str):
        raise ArgumentTypeError("add_session_config_entry takes two strings (key, value), got "
                                f"{type(key).__name__}, {type(value).__name__}")
    if key.endswith("allow_spinning") and key in KNOWN and value not in _FLAGS:
        raise UsageError(f"session config {key}: '0' or '1', got {value!r}")
    if key == "session.load_model_format" and value.upper() != "ONNX":
        raise UsageError(f"session config {key}={value!r}: kiln reads ONNX models only; "
                         "an .ort model cannot be compiled (export the ONNX file instead)")
    if key not in KNOWN:
        warnings.warn(f"session config entry {key!r} is kept but kiln does not use it (kiln "
                      f"maps: {', '.join(sorted(KNOWN))})", UserWarning, stacklevel=3)


def spin_us(entries: Mapping[str, str]) -> int | None:
    """The spin window `session.intra_op.allow_spinning` asks for: 0 for '0', else None
    (the library's default)."""
    return 0 if entries.get("session.intra_op.allow_spinning") == "0" else None


def unused(entries: Mapping[str, str]) -> list[str]:
    """The keys of `entries` kiln does not read."""
    return sorted(k for k in entries if k not in KNOWN)


__all__ = ["KNOWN", "check", "spin_us", "unused"]

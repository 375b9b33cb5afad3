"""kiln.generate's greedy loop run by the library itself: `{prefix}_generate_{fn}`.

A decoder library (metadata version 8 on) exports its loop in C (kiln_generate.c,
docs/abi.md "Generation"); running it through ctypes saves the Python of every step
(feeds, argmax, the cache's arrays). `on_token` still sees each step's tokens: the
entry calls back through a ctypes function pointer. Numpy and ctypes only, as the rest
of the runtime.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from kiln.errors import CallError
from kiln.runtime import ctypes_abi

# The first library metadata version whose generation entry takes the token callback.
TOKEN_CALLBACK_VERSION = 8


def c_generate_entry(fn: Any) -> Any | None:
    """`fn`'s C generation entry bound through ctypes, or None when its library has none
    this runtime can call (an in-process function, an older library, a decoder with
    other inputs)."""
    owner: Any = getattr(fn, "owner", None)
    symbol = getattr(fn, "signature", {}).get("generate_symbol")
    cdll = getattr(owner, "cdll", None)
    if not symbol or cdll is None or getattr(fn, "guard", None) is None:
        return None
    if owner.metadata.get("version", 0) < TOKEN_CALLBACK_VERSION:
        return None
    try:
        return ctypes_abi.bind(cdll, str(symbol), "generate")
    except AttributeError:
        return None


def c_loop(fn: Any, entry: Any, ids: np.ndarray, steps: int, stops: np.ndarray, pad: int,
           on_token: Callable[[np.ndarray], object] | None) -> np.ndarray:
    """Greedy generation of up to `steps` tokens after each row of `ids` through `entry`
    (c_generate_entry's): the tokens kiln.generation's Python loop chooses, int64
    [batch, steps run]. `on_token(tokens)` gets each step's tokens; a true result ends
    the loop after that step, as an exception does (raised here after the call)."""
    prompt = np.ascontiguousarray(ids, np.int64)
    batch, prompt_len = prompt.shape
    stops = np.ascontiguousarray(stops, np.int64)
    out = np.zeros((batch, max(steps, 1)), np.int64)
    done = ctypes.c_int64(0)
    raised: list[BaseException] = []
    # A callback even without on_token: Python code each step runs the signal handlers
    # (Ctrl-C stops the loop after a step, as it does the Python loop).
    step, callback = _token_callback(on_token, raised)
    guard = fn.guard
    guard.enter(fn.name)
    try:
        with _unraisable_into(step, raised):
            status = entry(prompt.ctypes.data, batch, prompt_len, steps,
                           stops.ctypes.data if stops.size else None, int(stops.size), pad,
                           out.ctypes.data, ctypes.byref(done), callback, None)
        # Read on this thread, before close() may unload the library.
        message = (fn.last_error() or f"{fn.name}: generate failed with code {status}"
                   if status != 0 else "")
    finally:
        guard.exit()
    if raised:
        raise raised[0]
    if status != 0:
        raise CallError(message)
    return out[:, :done.value].copy()


def _token_callback(on_token: Callable[[np.ndarray], object] | None,
                    raised: list[BaseException]) -> tuple[Callable[..., int], Any]:
    """The Python function and the KilnTokenFunc calling it, which calls `on_token` (if
    any) with a copy of each step's tokens; what it raises goes to `raised` and stops
    the loop (an exception cannot unwind through C)."""

    def step(tokens: Any, rows: int, _step: int, _user: Any) -> int:
        if raised:  # caught by _unraisable_into at the last step's start
            return 1
        try:
            return 1 if on_token is not None and on_token(
                np.ctypeslib.as_array(tokens, (rows,)).copy()) else 0
        except BaseException as exc:
            raised.append(exc)
            return 1

    return step, ctypes_abi.TOKEN_FUNC(step)


@contextlib.contextmanager
def _unraisable_into(step: Callable[..., int], raised: list[BaseException]) -> Iterator[None]:
    """Keep what `step` raises before its `try` in `raised`: a signal handler (Ctrl-C's
    KeyboardInterrupt) runs as the callback's frame starts, and ctypes reports such an
    exception to sys.unraisablehook and returns 0 (go on) instead of raising it."""
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if unraisable.object is step and unraisable.exc_value is not None:
            raised.append(unraisable.exc_value)
        else:
            previous(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        if sys.unraisablehook is hook:  # unless someone replaced it meanwhile
            sys.unraisablehook = previous


__all__ = ["TOKEN_CALLBACK_VERSION", "c_generate_entry", "c_loop"]

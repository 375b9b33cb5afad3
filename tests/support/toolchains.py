"""Probes for the external tools some tests need (C compilers, cross compilers,
emulators, wasm and CUDA toolchains): a missing tool skips the test with a reason."""

from __future__ import annotations

import os
import shutil

import pytest


def find_tool(*names: str) -> str | None:
    """The path of the first of `names` on PATH, or None."""
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    return None


def require_tool(*names: str, why: str = "") -> str:
    """The path of the first of `names` on PATH; skips the test when there is none."""
    path = find_tool(*names)
    if path is None:
        pytest.skip(f"needs {' or '.join(names)} on PATH" + (f" ({why})" if why else ""))
    return path


def c_compiler() -> str:
    """The host C compiler ($CC, else cc); skips the test when there is none."""
    return require_tool(os.environ.get("CC", "cc"))


def needs(*tools: str | tuple[str, ...], why: str = "") -> pytest.MarkDecorator:
    """A skipif mark: the test runs only when every tool is on PATH (a tuple entry is
    alternatives, any one will do); the reason names the missing ones."""
    missing = [" or ".join(t) if isinstance(t, tuple) else t for t in tools
               if find_tool(*(t if isinstance(t, tuple) else (t,))) is None]
    reason = f"needs {', '.join(missing)} on PATH" + (f" ({why})" if why else "")
    return pytest.mark.skipif(bool(missing), reason=reason)

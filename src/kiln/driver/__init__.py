"""kiln.driver: `kiln.compile` and the `Executable` it returns (see docs/compile.md).

    ex = kiln.compile(mod, "llvm")       # passes + codegen (or the compile cache)
    y = ex["main"](x)                    # jit: link, dlopen, call
    ex.export_library("model.so")        # deploy the same artifacts

The names load on first use, so `kiln.driver.cache` (which a session's cache hit
reads, kiln/session/start.py) comes without the compiler.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kiln.driver.cache import STATS as CACHE_STATS
    from kiln.driver.compiler import compile, executable_metadata
    from kiln.driver.executable import Executable

# public name -> "module:attribute", resolved on first access.
_LAZY = {
    "CACHE_STATS": "kiln.driver.cache:STATS",
    "compile": "kiln.driver.compiler:compile",
    "executable_metadata": "kiln.driver.compiler:executable_metadata",
    "Executable": "kiln.driver.executable:Executable",
}

__all__ = ["CACHE_STATS", "Executable", "compile", "executable_metadata"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, _, attr = _LAZY[name].partition(":")
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kiln.driver' has no attribute {name!r}")

"""kiln.driver: `kiln.compile` and the `Executable` it returns (see docs/compile.md).

    ex = kiln.compile(mod, "llvm")       # passes + codegen (or the compile cache)
    y = ex["main"](x)                    # jit: link, dlopen, call
    ex.export_library("model.so")        # deploy the same artifacts
"""

from kiln.driver.cache import STATS as CACHE_STATS
from kiln.driver.compiler import compile, executable_metadata
from kiln.driver.executable import Executable

__all__ = ["CACHE_STATS", "Executable", "compile", "executable_metadata"]

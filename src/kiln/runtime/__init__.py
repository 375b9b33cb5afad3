"""kiln's runtime: load compiled libraries and call their functions.

    lib = kiln.runtime.load_module("model.so")     # or "model.tar"
    y = lib["main"](x)                              # numpy / DLPack in, numpy out

This package imports nothing from the compiler side (no llvmlite, no onnx): a
deploy host installs kiln and numpy and runs exported libraries. The C ABI is
in docs/abi.md and `include_dir()/kiln/kiln.h`; the code-loading process in
docs/runtime.md.
"""

from kiln.runtime.function import (
    NativeFunction,
    PackedFunction,
    PreparedCall,
    RawKernelFunction,
)
from kiln.runtime.loaders import LOADERS, LoadContext, get_loader, register_loader
from kiln.runtime.loading import load_artifacts, load_module
from kiln.runtime.module import FunctionTableModule, HostModule, LibraryModule, Module
from kiln.runtime.native import include_dir
from kiln.runtime.terminate import TerminateFlag
from kiln.runtime.threads import PoolStats, set_num_threads, set_spin_us

__all__ = [
    "LOADERS", "FunctionTableModule", "HostModule", "LibraryModule", "LoadContext", "Module",
    "NativeFunction", "PackedFunction", "PoolStats", "PreparedCall", "RawKernelFunction",
    "TerminateFlag", "get_loader", "include_dir", "load_artifacts", "load_module",
    "register_loader", "set_num_threads", "set_spin_us",
]

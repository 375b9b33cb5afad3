"""kiln: a Python-first tensor compiler.

    mod = kiln.frontend.from_onnx("model.onnx")
    ex = kiln.compile(mod)                  # for this machine ("host")
    ex.export_library("model.so")
    lib = kiln.runtime.load_module("model.so")
    y = lib["main"](x)

    sess = kiln.InferenceSession("model.onnx")   # onnxruntime's API
    y, = sess.run(None, {"x": x})

Submodules load lazily, so `import kiln.runtime` on a deploy host pulls in
neither llvmlite nor onnx.
"""

from __future__ import annotations

import importlib as _importlib
from typing import Any as _Any

from kiln.errors import (
    ArgumentTypeError,
    ArtifactError,
    CallError,
    CompileError,
    ExportError,
    FormatError,
    FrontendError,
    IRError,
    KilnError,
    MissingDependencyError,
    MissingFileError,
    TargetError,
    UnsafePathError,
    UsageError,
)

__version__ = "0.1.0"  # the one version source (pyproject reads it)

# public name -> "module:attribute", resolved on first access.
_LAZY = {
    "Target": "kiln.target:Target",
    "IRModule": "kiln.ir:IRModule",
    "Artifact": "kiln.artifact:Artifact",
    "ArtifactSet": "kiln.artifact:ArtifactSet",
    "compile": "kiln.driver:compile",
    "from_torch": "kiln.frontend.pytorch:from_torch",
    "Executable": "kiln.driver:Executable",
    "evaluate": "kiln.ops:evaluate",
    "export_model_library_format": "kiln.export.mlf:export_model_library_format",
    "cuda": "kiln.runtime.cuda_device:cuda",
    "InferenceSession": "kiln.session:InferenceSession",
    "SessionOptions": "kiln.session:SessionOptions",
    "RunOptions": "kiln.session:RunOptions",
}
_SUBMODULES = (
    "artifact", "cli", "codegen", "export", "frontend", "ir", "mlf", "ops", "runtime",
    "script", "session", "target", "transform",
)

__all__ = [
    "ArgumentTypeError", "ArtifactError", "CallError", "CompileError", "ExportError",
    "FormatError", "FrontendError", "IRError", "KilnError", "MissingDependencyError",
    "MissingFileError", "TargetError", "UnsafePathError", "UsageError", "__version__",
    *_LAZY, *_SUBMODULES,
]


def __getattr__(name: str) -> _Any:
    if name in _LAZY:
        module, _, attr = _LAZY[name].partition(":")
        value = getattr(_importlib.import_module(module), attr)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return _importlib.import_module(f"kiln.{name}")
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API only (what `__all__` lists), so `dir(kiln)` shows what to use."""
    return sorted(__all__)

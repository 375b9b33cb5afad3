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
import importlib.util as _importlib_util
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
    UnprovenEqualError,
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
    "generate": "kiln.runtime.generation:generate",
    "export_model_library_format": "kiln.export.mlf:export_model_library_format",
    "cuda": "kiln.runtime.cuda_device:cuda",
    "InferenceSession": "kiln.session:InferenceSession",
    "SessionOptions": "kiln.session:SessionOptions",
    "RunOptions": "kiln.session:RunOptions",
}
# onnxruntime's Python API (docs/session.md): `import kiln as rt` runs its scripts.
_LAZY.update({name: f"kiln.session:{name}" for name in (
    "ExecutionMode", "ExecutionOrder", "GraphOptimizationLevel", "IOBinding", "ModelMetadata",
    "NodeArg", "OrtValue", "disable_telemetry_events", "enable_telemetry_events",
    "get_all_providers", "get_available_providers", "get_device",
    "set_default_logger_severity", "set_default_logger_verbosity",
    "set_global_thread_pool_sizes")})
_SUBMODULES = (
    "artifact", "cli", "codegen", "export", "frontend", "ir", "mlf", "ops", "runtime",
    "script", "session", "target", "transform",
)

__all__ = [
    "ArgumentTypeError", "ArtifactError", "CallError", "CompileError", "ExportError",
    "FormatError", "FrontendError", "IRError", "KilnError", "MissingDependencyError",
    "MissingFileError", "TargetError", "UnprovenEqualError", "UnsafePathError", "UsageError",
    "__version__",
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
    # Python's own probes (__wrapped__, __path__ ...), and a submodule not imported yet
    # (`from kiln import dim_expr` asks here first, maybe while kiln is half imported).
    if name.startswith("_") or _importlib_util.find_spec(f"kiln.{name}") is not None:
        raise AttributeError(f"module 'kiln' has no attribute {name!r}")
    # onnxruntime's names kiln lacks raise a KilnError saying what to use instead.
    from kiln.session import ort_names  # lazy: a light table, only for a missing name

    raise ort_names.missing(None, name)


def __dir__() -> list[str]:
    """The public API only (what `__all__` lists), so `dir(kiln)` shows what to use."""
    return sorted(__all__)

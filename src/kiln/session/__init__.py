"""An onnxruntime-shaped door to kiln: `kiln.InferenceSession` (docs/session.md).

    sess = kiln.InferenceSession("model.onnx")      # or "model.so", an Executable
    names = [o.name for o in sess.get_outputs()]
    y, = sess.run(None, {"x": x})

A script written for `onnxruntime.InferenceSession` runs by changing its import:
the names of onnxruntime's Python API that scripts use are here (and on `kiln`), and
the others raise a KilnError saying what to use (kiln.session.ort_names).
Over a compiled library this package needs only numpy (the compiler is imported
only to compile an ONNX file).
"""

from typing import Any

from kiln.session import ort_names
from kiln.session.inference import InferenceSession
from kiln.session.io_binding import IOBinding
from kiln.session.node_arg import ModelMetadata, NodeArg
from kiln.session.ort_enums import ExecutionMode, ExecutionOrder, GraphOptimizationLevel
from kiln.session.ort_globals import (
    disable_telemetry_events,
    enable_telemetry_events,
    set_default_logger_severity,
    set_default_logger_verbosity,
    set_global_thread_pool_sizes,
)
from kiln.session.ort_value import OrtValue
from kiln.session.providers import get_all_providers, get_available_providers, get_device
from kiln.session.run_options import RunOptions
from kiln.session.session_options import SessionOptions

__all__ = ["ExecutionMode", "ExecutionOrder", "GraphOptimizationLevel", "IOBinding",
           "InferenceSession", "ModelMetadata", "NodeArg", "OrtValue", "RunOptions",
           "SessionOptions", "disable_telemetry_events", "enable_telemetry_events",
           "get_all_providers", "get_available_providers", "get_device",
           "set_default_logger_severity", "set_default_logger_verbosity",
           "set_global_thread_pool_sizes"]


def __getattr__(name: str) -> Any:
    """onnxruntime's names that kiln does not have: a KilnError saying what to use."""
    raise ort_names.missing(None, name)

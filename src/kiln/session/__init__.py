"""An onnxruntime-shaped door to kiln: `kiln.InferenceSession` (docs/session.md).

    sess = kiln.InferenceSession("model.onnx")      # or "model.so", an Executable
    names = [o.name for o in sess.get_outputs()]
    y, = sess.run(None, {"x": x})

A script written for `onnxruntime.InferenceSession` runs by changing its import.
Over a compiled library this package needs only numpy (the compiler is imported
only to compile an ONNX file).
"""

from kiln.session.inference import InferenceSession, RunOptions
from kiln.session.io_binding import IOBinding
from kiln.session.node_arg import ModelMetadata, NodeArg, SessionOptions

__all__ = ["IOBinding", "InferenceSession", "ModelMetadata", "NodeArg", "RunOptions",
           "SessionOptions"]

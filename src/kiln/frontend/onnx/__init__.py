"""The ONNX frontend: `from_onnx(model_or_path, shape_dict=None) -> IRModule`."""

from kiln.frontend.onnx.importer import SUPPORTED_OPSETS, from_onnx

__all__ = ["SUPPORTED_OPSETS", "from_onnx"]

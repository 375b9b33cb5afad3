"""Model importers: model file -> IRModule."""

from __future__ import annotations

from typing import Any


def from_onnx(model: Any, shape_dict: dict[str, Any] | None = None) -> Any:
    """Import an ONNX model (path, bytes or ModelProto); see kiln.frontend.onnx."""
    from kiln.frontend.onnx import from_onnx as _from_onnx

    return _from_onnx(model, shape_dict)


__all__ = ["from_onnx"]

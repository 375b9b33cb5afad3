"""Model importers: model file -> IRModule."""

from __future__ import annotations

from typing import Any


def from_onnx(model: Any, shape_dict: dict[str, Any] | None = None, **options: Any) -> Any:
    """Import an ONNX model (path, bytes or ModelProto); see kiln.frontend.onnx
    (`options`: `max_fold_bytes`, the constant-folding budget; `check=False`
    skips onnx's full checker)."""
    from kiln.errors import missing_dependency

    try:
        from kiln.frontend.onnx import from_onnx as _from_onnx

        return _from_onnx(model, shape_dict, **options)
    except ImportError as exc:  # onnx (or protobuf) absent: say which package to install
        missing = missing_dependency(exc, "importing an ONNX model")
        if missing is None:
            raise
        raise missing from exc


__all__ = ["from_onnx"]

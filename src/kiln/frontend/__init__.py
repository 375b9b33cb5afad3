"""Model importers: model file -> IRModule."""

from __future__ import annotations

from typing import Any

from kiln.errors import missing_dependency


def from_onnx(model: Any, shape_dict: dict[str, Any] | None = None, **options: Any) -> Any:
    """Import an ONNX model (path, bytes or ModelProto); see kiln.frontend.onnx
    (`options`: `max_fold_bytes`, the constant-folding budget; `check=False`
    skips onnx's full checker)."""

    try:
        from kiln.frontend.onnx import (
            from_onnx as _from_onnx,  # cycle: kiln.frontend.onnx imports this module
        )

        return _from_onnx(model, shape_dict, **options)
    except ImportError as exc:  # onnx (or protobuf) absent: say which package to install
        missing = missing_dependency(exc, "importing an ONNX model")
        if missing is None:
            raise
        raise missing from exc


def from_torch(module: Any, example_inputs: Any, dynamic_shapes: Any = None,
               **options: Any) -> Any:
    """Import a PyTorch module through `torch.onnx.export` in memory; see
    kiln.frontend.pytorch (torch is the optional extra `kiln-tensor[torch]`)."""
    from kiln.frontend.pytorch import (
        from_torch as _from_torch,  # cycle: kiln.frontend.pytorch imports this module
    )

    return _from_torch(module, example_inputs, dynamic_shapes, **options)


__all__ = ["from_onnx", "from_torch"]

"""The small value types of a session: NodeArg, ModelMetadata (SessionOptions lives in
kiln.session.session_options and is importable from here too)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kiln.session.session_options import SessionOptions

# kiln dtype -> the element type name onnxruntime prints inside "tensor(...)".
_ORT_ELEMENT = {
    "float32": "float", "float64": "double", "float16": "float16", "bfloat16": "bfloat16",
    "int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64",
    "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64",
    "bool": "bool",
}


def ort_type(dtype: str) -> str:
    """The onnxruntime type string of a kiln dtype: "float32" -> "tensor(float)"."""
    return f"tensor({_ORT_ELEMENT.get(dtype, dtype)})"


@dataclass(frozen=True)
class NodeArg:
    """An input or output as onnxruntime describes it.

    Attributes:
        name: the ONNX name, the key of `run`'s input feed.
        shape: a list of ints and, for symbolic dimensions, their names (strings).
        type: onnxruntime's spelling, e.g. "tensor(float)", "tensor(int64)".
    """

    name: str
    shape: list[int | str]
    type: str

    @staticmethod
    def of(param: dict[str, Any]) -> NodeArg:
        """The NodeArg of one parameter or result of a library signature."""
        shape = [d if isinstance(d, int) else str(d) for d in param["shape"]]
        return NodeArg(str(param["name"]), shape, ort_type(str(param["dtype"])))


@dataclass(frozen=True)
class ModelMetadata:
    """What `get_modelmeta()` returns: the ONNX model's own fields, empty over a library
    (a compiled library does not keep them)."""

    producer_name: str = ""
    graph_name: str = ""
    domain: str = ""
    description: str = ""
    graph_description: str = ""
    version: int = 0
    custom_metadata_map: dict[str, str] = field(default_factory=dict)


__all__ = ["ModelMetadata", "NodeArg", "SessionOptions", "ort_type"]

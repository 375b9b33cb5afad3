"""The small value types of a session: NodeArg, ModelMetadata, SessionOptions."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

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


class SessionOptions:
    """Session settings, named as in onnxruntime.

    Attributes:
        intra_op_num_threads: threads of the library's thread pool, the caller included;
            0 (default) = the process default (`kiln.runtime.set_num_threads`, else
            `KILN_NUM_THREADS`, else one per online CPU). Applied to this session's
            library only (`Module.set_num_threads`, docs/runtime.md).
        inter_op_num_threads: accepted for compatibility; kiln runs one op at a time.
        max_loop_iterations: kiln's own: the most iterations an ONNX Loop may run when
            the session compiles the model (`kiln.compile(..., max_loop_iterations=)`);
            a run whose Loop would run more raises CallError naming the Loop node.
            None (default): no limit, as onnxruntime.
        progress: kiln's own: None, or a callable given a
            `kiln.driver.progress.ProgressEvent` at every step of a compile (a session
            over an ONNX file that misses the compile cache); None shows a line on a
            terminal, else logs to the `logging` logger "kiln" (docs/session.md).
        shape_dict: kiln's own: pins or bounds of the model's symbolic dimensions when
            the session compiles an ONNX model, as `kiln.frontend.from_onnx` takes them
            (`{"past_seq": range(0, 4097)}` bounds, `{"batch": 1}` pins). None
            (default): every symbolic dimension takes any size from 0 up.
    """

    def __init__(self) -> None:
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.max_loop_iterations: int | None = None
        self.progress: Callable[[Any], None] | None = None
        self.shape_dict: dict[str, Any] | None = None

"""The "python" backend: kiln's reference interpreter behind the usual runtime API.

`codegen_python` hands back the lowered IRModule itself as an in-memory
artifact (loader "python"); `load_python` turns it into a runtime Module whose
functions check and bind their arguments exactly like native ones (same
signature metadata, same error messages, graph outputs allocated for you) and
then run `kiln.ir.evaluate`. Slow, but needs no toolchain: a reference for
tests and a way to debug a lowering. Graph functions left unlowered (e.g.
`graph_pipeline=None`) run at graph level, operator calls included. It lives
in memory only: exporting it raises ExportError.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from kiln.artifact import InMemoryArtifact
from kiln.codegen.constants import ConstantPool
from kiln.codegen.naming import library_metadata
from kiln.codegen.registry import graph_signature
from kiln.errors import FormatError
from kiln.ir.graph import Function
from kiln.ir.module import IRModule
from kiln.ops import evaluate
from kiln.runtime import abi, ctypes_abi
from kiln.runtime import function as rf
from kiln.runtime.function import PackedFunction
from kiln.runtime.module import FunctionTableModule

CODEGEN_ID = "python"
LOADER = "python"
FILE_NAME = "module.kir"


def codegen_python(mod: IRModule, target: Any, *, prefix: str,
                   pool: ConstantPool | None = None) -> list[Any]:
    """One InMemoryArtifact holding the module and its library metadata."""

    graph = mod.graph_funcs()
    metadata = library_metadata(mod.without(*graph) if graph else mod, prefix)
    for name, fn in graph.items():
        metadata["functions"][name] = graph_signature(name, fn, prefix)
    return [InMemoryArtifact(CODEGEN_ID, LOADER, FILE_NAME, value=mod,
                             metadata={"metadata": metadata})]


def load_python(artifacts: list[Any], ctx: Any) -> Any:
    """The runtime loader "python" (registered by kiln.codegen on import): a Module of
    interpreted functions."""

    functions: dict[str, Any] = {}
    for art in artifacts:
        mod = getattr(art, "value", None)
        if not isinstance(mod, IRModule):
            raise FormatError(
                f"python loader: artifact {art.codegen_id}/{art.file_name} does not hold an "
                f"IRModule (got {type(mod).__name__})")
        meta = dict(art.metadata).get("metadata") or library_metadata(mod, ctx.prefix)
        for name, sig in dict(meta["functions"]).items():
            functions[name] = InterpretedFunction(_thaw(sig), mod)
    return FunctionTableModule(LOADER, functions, metadata=dict(ctx.metadata),
                               artifacts=artifacts)


def _thaw(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_thaw(v) for v in value]
    return value


class InterpretedFunction(PackedFunction):
    """A PackedFunction that runs `kiln.ir.evaluate` on the checked arguments."""

    def __init__(self, signature: dict[str, Any], mod: IRModule) -> None:
        super().__init__(signature)
        self.module = mod

    def _invoke(self, values: list[Any], wheres: list[Any]) -> None:
        args: list[Any] = []
        for value, param, where in zip(values, self.params + self.results, wheres):
            if param["kind"] == "tensor":
                args.append(rf._checked_tensor(value, param, where))
            else:
                args.append(_scalar(value, param, where))
        if not isinstance(self.module[self.name], Function):
            evaluate(self.module, self.name, *args)
            return
        n = len(self.params)
        result = evaluate(self.module, self.name, *args[:n])
        for out, value in zip(args[n:], _flatten(result)):
            np.copyto(out, value)


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, tuple):
        return [x for v in value for x in _flatten(v)]
    return [value]


def _scalar(value: Any, param: dict[str, Any], where: Any) -> Any:
    rf._check_type_code(ctypes_abi.type_code_of(value), param, where, value)
    if abi.is_float_dtype(param["dtype"]):
        return float(value)
    if param["dtype"] == "bool":
        return bool(value)
    return operator.index(value) if not isinstance(value, np.generic) else value.item()

"""The schema of the library metadata (docs/abi.md), for every reader that takes it from a file.

The metadata comes out of `{prefix}_metadata()` of a loaded library, the
METADATA section of a blob, an artifact archive's manifest and (reshaped) an
MLF `metadata.json`. Readers that draw on it (`kiln inspect`, its `--report`
page, `kiln.mlf.load`, the runtime) check it here first, so they index and
iterate without guarding each access. The schema types what readers use and
lets everything else through: a newer kiln may add keys (docs/abi.md,
"Versions"), and the runtime's own signature checks
(`kiln.runtime.module._check_signature`) stay the authority on what it calls.
"""

from __future__ import annotations

from typing import Any

from kiln.artifact.schema import (
    AnyOf,
    Anything,
    Bool,
    Int,
    ListOf,
    MapOf,
    Null,
    Obj,
    Str,
    check,
    identifier,
    optional,
)
from kiln.errors import FormatError

# A dimension: a size, or the text of a symbolic one (checked by the runtime's
# dimension parser where it is evaluated).
DIM = AnyOf((Int(0), Str(max_len=1024, what="a dimension text")))
SHAPE = ListOf(DIM, max_len=64)
# Names are the model's own (ONNX names, function names: any Unicode, any length; the
# compiler mangles long ones into symbols): bounded only by the metadata's size limit.
NAME_MAX = 1 << 20
NAME = Str(max_len=NAME_MAX, what="a name")
DTYPE = Str(r"[a-z][a-z0-9_]*", 32, "a dtype name")
#: The longest text of a symbolic size the metadata holds (longer ones are written null:
#: a deep network's workspace is a max over its planned buffers, thousands of characters).
SIZE_TEXT_MAX = 4096
SIZE = AnyOf((Int(0), Str(max_len=SIZE_TEXT_MAX, what="a size text"), Null()))

PARAM = Obj(required={"name": NAME},
            optional={"kind": Str(max_len=64), "shape": SHAPE, "dtype": DTYPE,
                      "written": Bool(), "in_place_of": Int(0)},
            extra=Anything())
FUNCTION = Obj(optional={"name": NAME, "symbol": identifier(), "kind": Str(max_len=64),
                         "params": ListOf(PARAM, max_len=4096),
                         "results": ListOf(PARAM, max_len=4096), "tuple_result": Bool(),
                         "dims": ListOf(Obj(required={"name": NAME},
                                            optional={"min": Int(0), "max": optional(Int(0))},
                                            extra=Anything())),
                         "workspace_bytes": SIZE, "output_shapes_symbol": identifier(),
                         "terminate": Bool()},
               extra=Anything())
GRAPH_TENSOR = Obj(required={"name": NAME, "kind": Str(max_len=64)},
                   optional={"shape": SHAPE, "dtype": DTYPE, "bytes": optional(Int(0)),
                             "offset": AnyOf((Int(0), Str(max_len=4096)))},
                   extra=Anything())
GRAPH = Obj(required={"tensors": ListOf(GRAPH_TENSOR), "kernels": ListOf(Obj(
                required={"name": NAME, "inputs": ListOf(Int(0)), "outputs": ListOf(Int(0))},
                extra=Anything()))},
            optional={"workspace_bytes": SIZE}, extra=Anything())
DEPENDENCY = Obj(optional={"short_name": Str(), "url": optional(Str()), "url_type": Str(),
                           "version_spec": Str()}, extra=Anything())
# A kernel a symbolic size left on its generic loops (kiln.kernels.specialisation).
GENERIC_KERNEL = Obj(required={"node": NAME, "op": Str(max_len=256), "kernel": Str(max_len=256),
                               "hint": Str(max_len=NAME_MAX)},
                     optional={"shapes": ListOf(Str(max_len=NAME_MAX), max_len=64),
                               "pins": ListOf(Anything(), max_len=64)},
                     extra=Anything())
LIBRARY_METADATA = Obj(
    optional={"format": Str(max_len=64), "version": Int(0), "kiln_version": Str(max_len=64),
              "prefix": Str(max_len=256), "functions": MapOf(FUNCTION, NAME),
              "graphs": MapOf(GRAPH, NAME),
              "profile": Obj(optional={"sites": ListOf(Anything())}, extra=Anything()),
              "external_dependencies": ListOf(DEPENDENCY),
              "swap": Obj(optional={"symbol": NAME, "weight_symbol": NAME}, extra=Anything()),
              "generic_kernels": ListOf(GENERIC_KERNEL)},
    extra=Anything())


def check_library_metadata(meta: Any, where: str) -> dict[str, Any]:
    """`meta` if it is library metadata every reader can walk; else a FormatError naming
    `where` and the JSON path. Beyond types, a graph summary's kernel calls must index
    its tensors."""
    check(LIBRARY_METADATA, meta, where)
    for fname, graph in (meta.get("graphs") or {}).items():
        count = len(graph["tensors"])
        for k, call in enumerate(graph["kernels"]):
            for role in ("inputs", "outputs"):
                for i, t in enumerate(call[role]):
                    if t >= count:
                        raise FormatError(
                            f"{where}: graphs.{fname}.kernels[{k}].{role}[{i}]: expected a "
                            f"tensor index below {count}, got {t}")
    result: dict[str, Any] = meta
    return result


__all__ = ["DIM", "DTYPE", "LIBRARY_METADATA", "NAME", "PARAM", "SHAPE", "check_library_metadata"]

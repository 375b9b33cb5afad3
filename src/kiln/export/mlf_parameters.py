"""metadata.json's `parameters` (MLF version 4): where each weight lies in
`parameters/<model>.params` and its SHA-256, so that `kiln.mlf.load` refuses a damaged
weight naming it (docs/mlf.md, "Parameters").

The `.params` file is the executable's constant pool image (`{prefix}_consts`); the
pool is rebuilt from the executable's IR (`ConstantPool.from_module`, as the compiler
built it) for the places of the arrays, and checked against the artifact's recorded
chunk hashes before any place is written: a table that does not describe the bytes it
sits beside would make every load fail.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from kiln.artifact.segments import Content
from kiln.codegen.constants import ConstantPool
from kiln.errors import ExportError
from kiln.ir.tensor import AllocConst
from kiln.ir.visitor import iter_stmts


def _named_arrays(executable: Any) -> list[tuple[str, Any, np.ndarray]]:
    """(name, buffer, array) of every distinct constant array of the executable's IR, in
    the order the pool meets them; a name two different arrays share gets `#2`, `#3`..."""
    seen: set[int] = set()
    counts: dict[str, int] = {}
    out = []
    for fn in executable.ir.prim_funcs().values():
        for node in iter_stmts(fn.body):
            if not isinstance(node, AllocConst) or id(node.data) in seen:
                continue
            seen.add(id(node.data))
            base = str(node.buffer.name)
            counts[base] = counts.get(base, 0) + 1
            out.append((base if counts[base] == 1 else f"{base}#{counts[base]}", node.buffer,
                        node.data))
    return out


def parameter_table(executable: Any, consts: Content, record: Mapping[str, Any]
                    ) -> list[dict[str, Any]]:
    """metadata.json's `parameters`: per weight array, sorted by offset, its name,
    dtype, shape, byte offset and size in the `.params` file `consts`, and the SHA-256
    (hex) of those bytes. `record` is the constants artifact's metadata (its chunk
    hashes, when it has them, prove the rebuilt pool is the same bytes)."""
    if not len(consts):
        return []
    pool = ConstantPool.from_module(executable.ir)
    known = record.get("chunk_sha256")
    if pool.size != len(consts) or (isinstance(known, str)
                                    and known != pool.chunk_digests().hex()):
        raise ExportError("Model Library Format: the executable's IR does not describe its "
                          f"weights ({pool.size} bytes of constants in the IR, "
                          f"{len(consts)} in the constants artifact); compile it again")
    table = []
    for name, buffer, data in _named_arrays(executable):
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        table.append({"name": name, "dtype": str(buffer.dtype),
                      "shape": [int(d) for d in buffer.shape], "offset": pool.offset(data),
                      "bytes": int(raw.nbytes), "sha256": hashlib.sha256(raw.data).hexdigest()})
    return sorted(table, key=lambda t: (t["offset"], t["name"]))


__all__ = ["parameter_table"]

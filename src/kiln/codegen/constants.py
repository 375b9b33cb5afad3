"""ConstantPool: gathers the AllocConst data of a module into one read-only blob.

Every backend places weights the same way: one `constants.bin` artifact (loader
`native`) that the linker turns into a read-only, 64-byte aligned symbol
`{prefix}_consts`; kernels address a constant as `{prefix}_consts + offset`.
The loader maps it with the library: nothing copies it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.ir.module import IRModule
from kiln.ir.tensor import AllocConst
from kiln.ir.visitor import iter_stmts

CONST_ALIGN = 64
CONSTANTS_FILE = "constants.bin"


class ConstantPool:
    """Offsets of constant arrays inside one blob; the same array is stored once."""

    def __init__(self) -> None:
        self._offsets: dict[int, int] = {}
        self._chunks: list[np.ndarray] = []
        self._keep: list[np.ndarray] = []  # keeps ids stable while the pool lives
        self.size = 0

    def add(self, data: np.ndarray) -> int:
        """Byte offset of `data` in the blob (adding it on first sight)."""
        key = id(data)
        if key in self._offsets:
            return self._offsets[key]
        offset = -(-self.size // CONST_ALIGN) * CONST_ALIGN
        self._offsets[key] = offset
        self._keep.append(data)
        self._chunks.append(np.ascontiguousarray(data))
        self.size = offset + data.nbytes
        return offset

    def artifact(self, codegen_id: str, prefix: str, loader: str = "native") -> Any:
        """The pool as a `constants.bin` Artifact with its symbol and alignment."""
        from kiln.artifact import Artifact
        from kiln.codegen.naming import consts_symbol

        return Artifact(codegen_id, loader, CONSTANTS_FILE, self.to_bytes(),
                        {"symbol": consts_symbol(prefix), "align": CONST_ALIGN,
                         "count": len(self)})

    def offset(self, data: np.ndarray) -> int:
        return self._offsets[id(data)]

    def __len__(self) -> int:
        return len(self._chunks)

    def to_bytes(self) -> bytes:
        out = bytearray(self.size)
        for chunk, data in zip(self._chunks, self._keep):
            off = self._offsets[id(data)]
            out[off:off + chunk.nbytes] = chunk.tobytes()
        return bytes(out)

    @classmethod
    def from_module(cls, mod: IRModule) -> ConstantPool:
        """A pool holding every AllocConst of every tensor-level function, in order."""
        pool = cls()
        for fn in mod.prim_funcs().values():
            for node in iter_stmts(fn.body):
                if isinstance(node, AllocConst):
                    pool.add(node.data)
        return pool

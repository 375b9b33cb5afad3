"""ConstantPool: gathers the AllocConst data of a module into one read-only blob.

Every backend places weights the same way: one `constants.bin` artifact (loader
`native`) that the linker turns into a read-only, 64-byte aligned symbol
`{prefix}_consts`; kernels address a constant as `{prefix}_consts + offset`.
The loader maps it with the library: nothing copies it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from kiln.ir.module import IRModule
from kiln.ir.tensor import AllocConst
from kiln.ir.visitor import iter_stmts

CONST_ALIGN = 64
CONSTANTS_FILE = "constants.bin"


class ConstantPool:
    """Offsets of constant arrays inside one blob; the same array is stored once.

    The blob is built once (`to_bytes`: one copy of the weights, joined straight
    from the arrays' memory) and hashed once in chunks (`chunk_digests`); the
    driver reuses both for the cache key, the cache and the library's weight
    check (kiln.artifact.integrity).
    """

    def __init__(self) -> None:
        self._offsets: dict[int, int] = {}
        self._keep: list[np.ndarray] = []  # keeps ids stable while the pool lives
        self.size = 0
        self._bytes: bytes | None = None
        self._digests: bytes | None = None

    def add(self, data: np.ndarray) -> int:
        """Byte offset of `data` in the blob (adding it on first sight)."""
        key = id(data)
        if key in self._offsets:
            return self._offsets[key]
        offset = -(-self.size // CONST_ALIGN) * CONST_ALIGN
        self._offsets[key] = offset
        self._keep.append(data)
        self.size = offset + data.nbytes
        self._bytes = self._digests = None  # the blob changed
        return offset

    def artifact(self, codegen_id: str, prefix: str, loader: str = "native") -> Any:
        """The pool as a `constants.bin` Artifact with its symbol, alignment and chunk hashes."""
        from kiln.artifact import Artifact
        from kiln.codegen.naming import consts_symbol

        return Artifact(codegen_id, loader, CONSTANTS_FILE, self.to_bytes(),
                        {"symbol": consts_symbol(prefix), "align": CONST_ALIGN,
                         "count": len(self), **self.integrity()})

    def offset(self, data: np.ndarray) -> int:
        return self._offsets[id(data)]

    def find(self, data: object) -> int | None:
        """Offset of this very array object in the pool, or None."""
        return self._offsets.get(id(data))

    def __len__(self) -> int:
        return len(self._keep)

    def to_bytes(self) -> bytes:
        """The blob: every array at its offset, zero padding between (built once)."""
        if self._bytes is None:
            parts: list[Any] = []
            end = 0
            for off, view in self._pieces():
                if off > end:
                    parts.append(bytes(off - end))
                # A view of the array's memory: b"".join copies it once, into the result.
                parts.append(view)
                end = off + len(view)
            self._bytes = b"".join(parts)
        return self._bytes

    def chunk_digests(self) -> bytes:
        """Chunked SHA-256 of the blob (kiln.artifact.integrity), computed once.

        Hashed straight from the arrays when the blob is not built yet, so the
        driver can key the cache before codegen without holding a second copy
        of the weights during it.
        """
        from kiln.artifact.integrity import chunk_digests

        if self._digests is None:
            self._digests = (chunk_digests(self._bytes) if self._bytes is not None
                             else self._stream_digests())
        return self._digests

    def _pieces(self) -> Iterator[tuple[int, memoryview]]:
        """(offset, bytes) of every array, in blob order, without copying."""
        for data in self._keep:
            view = np.ascontiguousarray(data).reshape(-1).view(np.uint8).data
            yield self._offsets[id(data)], view

    def _stream_digests(self) -> bytes:
        import hashlib

        from kiln.artifact.integrity import CHUNK_SIZE

        out = []
        h = hashlib.sha256()
        pos = 0  # bytes of the blob fed to the hashes so far

        def feed(piece: memoryview | bytes) -> None:
            nonlocal h, pos
            while len(piece):
                room = CHUNK_SIZE - pos % CHUNK_SIZE
                h.update(piece[:room])
                pos += min(room, len(piece))
                piece = piece[room:]
                if pos % CHUNK_SIZE == 0:
                    out.append(h.digest())
                    h = hashlib.sha256()

        for offset, view in self._pieces():
            while pos < offset:  # zero padding, at most CONST_ALIGN bytes
                feed(bytes(offset - pos))
            feed(view)
        if pos % CHUNK_SIZE:
            out.append(h.digest())
        return b"".join(out)

    def integrity(self) -> dict[str, Any]:
        """Artifact metadata recording the blob's chunk hashes (docs/format.md)."""
        from kiln.artifact.integrity import CHUNK_SIZE

        return {"chunk_size": CHUNK_SIZE, "chunk_sha256": self.chunk_digests().hex()}

    def fingerprint(self) -> str:
        """Hex digest naming the blob's content (its chunk hashes and size)."""
        from kiln.artifact.integrity import tree_digest

        return tree_digest(self.chunk_digests(), self.size)

    @classmethod
    def from_module(cls, mod: IRModule) -> ConstantPool:
        """A pool holding every AllocConst of every tensor-level function, in order."""
        pool = cls()
        for fn in mod.prim_funcs().values():
            for node in iter_stmts(fn.body):
                if isinstance(node, AllocConst):
                    pool.add(node.data)
        return pool

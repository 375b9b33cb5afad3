"""ConstantPool: gathers the AllocConst data of a module into one read-only blob.

Every backend places weights the same way: one `constants.bin` artifact (loader
`native`) that the linker turns into a read-only, 64-byte aligned symbol
`{prefix}_consts`; kernels address a constant as `{prefix}_consts + offset`.
The loader maps it with the library: nothing copies it.

The artifact's content is the arrays themselves (`Segments`: views of the
importer's arena and of the arrays the compiler packed, with zero padding
between), or one view of the arena when every constant lies in it: the
weights are never joined into a second full copy while compiling; the library,
archive and cache writers stream the pieces.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import numpy as np

from kiln.artifact import Artifact
from kiln.artifact.integrity import CHUNK_SIZE, chunk_digests, tree_digest
from kiln.artifact.segments import Segments
from kiln.codegen.gathered_constants import gathered_constants
from kiln.codegen.host import HOST_FILE
from kiln.codegen.naming import consts_symbol
from kiln.codegen.swap_program import program_artifacts, runtime_artifact
from kiln.ir import weight_origin as wo
from kiln.ir.module import IRModule
from kiln.ir.tensor import AllocConst
from kiln.ir.visitor import iter_stmts
from kiln.runtime.native import precompile_c

CONST_ALIGN = 64
CONSTANTS_FILE = "constants.bin"
# A pool larger than this is addressed through a base pointer read at run time, and
# placed where large data goes (x86-64 `.lrodata`/`.lbss`): an offset folded into a
# 32-bit PC-relative relocation reaches only +-2 GiB (the small code model), and the
# code, the blob and the other data must stay within that of each other. Tests lower
# it to force the path on a small model.
LARGE_CONSTS_BYTES = 1 << 30
# An arena becomes the blob only if the module's constants fill this much of it.
ARENA_MIN_USE = 0.99


def _owner(data: np.ndarray) -> np.ndarray | None:
    """The outermost array `data` is a view of (numpy collapses view chains to it): the
    one owning the memory, or one over a buffer (the importer's arena lies on a mapping,
    kiln.ops.pack_memory); None when `data` is not a view of an array."""
    base = data.base
    if not isinstance(base, np.ndarray):
        return None
    while isinstance(base.base, np.ndarray):
        base = base.base
    return base


class ConstantPool:
    """Offsets of constant arrays inside one blob; the same array is stored once.

    The blob is never built while compiling (`content`: the arrays' memory as
    pieces) and hashed once in chunks (`chunk_digests`); the driver reuses the
    hashes for the cache key, the cache and the library's weight check
    (kiln.artifact.integrity).
    """

    def __init__(self) -> None:
        self._offsets: dict[int, int] = {}
        self._keep: list[np.ndarray] = []  # keeps ids stable while the pool lives
        self.size = 0
        self._arena: memoryview | None = None  # the adopted arena (see _adopt_arena)
        self._digests: bytes | None = None
        self._hashing: Future[bytes] | None = None  # hash_in_background's digests
        # The model's named weights (kiln.ir.weight_origin.ATTR_WEIGHTS), from from_module.
        self.named_weights: tuple[tuple[Any, ...], ...] | None = None
        self._index: dict[int, int] = {}
        # Whether kernels read the constants through `{prefix}_const_table` (the llvm
        # lowering sets it; kiln.codegen.const_table).
        self.table = False
        # The ids of the constants read only by gathers (from_module; "gathered").
        self.gathered: set[int] = set()

    def add(self, data: np.ndarray) -> int:
        """Byte offset of `data` in the blob (adding it on first sight)."""
        key = id(data)
        if key in self._offsets:
            return self._offsets[key]
        self._arena = None  # from now on the arrays are pieces of their own
        offset = -(-self.size // CONST_ALIGN) * CONST_ALIGN
        self._offsets[key] = offset
        self._index[key] = len(self._keep)
        self._keep.append(data)
        self.size = offset + data.nbytes
        self._digests = self._hashing = None  # the blob changed
        return offset

    @property
    def large(self) -> bool:
        """Whether kernels address the pool through a base pointer (LARGE_CONSTS_BYTES)."""
        return self.size > LARGE_CONSTS_BYTES

    def artifact(self, codegen_id: str, prefix: str, loader: str = "native") -> Any:
        """The pool as a `constants.bin` Artifact with its symbol, alignment and chunk hashes
        (`large`: placed in the large data sections, kiln.runtime.library)."""

        return Artifact(codegen_id, loader, CONSTANTS_FILE, self.content(),
                        {"symbol": consts_symbol(prefix), "align": CONST_ALIGN,
                         "count": len(self), **({"large": True} if self.large else {}),
                         **({"table": self.table_entries()} if self.table else {}),
                         **({"gathered": ranges} if (ranges := self.gathered_ranges()) else {}),
                         **self.integrity()})

    def with_replay(self, artifacts: Iterable[Any], prefix: str) -> list[Any]:
        """`artifacts` with this pool's replay record in the metadata of its constants
        artifact (`replay`), when the module named its weights. Added after code
        generation, so a build from the compile cache gets the record of this module's
        names (the cache keys the weights' bytes, not their names)."""
        out = list(artifacts)
        if self.named_weights is None:
            return out
        record = self.replay_record()
        symbol = consts_symbol(prefix)
        out = [replace(a, metadata={**a.metadata, "replay": record})
               if isinstance(a, Artifact) and a.file_name == CONSTANTS_FILE
               and a.metadata.get("symbol") == symbol else a for a in out]
        return out + _swap_program(out, record, prefix)

    def replay_record(self) -> dict[str, Any]:
        """How to rebuild every constant from the model's named weights (docs/format.md,
        "The replay record"): what `Module.swap_weights` runs."""
        return replay_record(
            ((self._offsets[id(d)], d) for d in self._keep), self.size, self.named_weights or ())

    def offset(self, data: np.ndarray) -> int:
        return self._offsets[id(data)]

    def index(self, data: np.ndarray) -> int:
        """The pool entry of `data` (added already): its slot in `{prefix}_const_table`."""
        return self._index[id(data)]

    def table_entries(self) -> list[list[int]]:
        """(offset, bytes) of every entry, by index: the table's slots."""
        return [[self._offsets[id(d)], int(d.nbytes)] for d in self._keep]

    def gathered_ranges(self) -> list[list[int]]:
        """[offset, bytes] of each constant read only by gathers
        (kiln.codegen.gathered_constants), by offset: the weight check hands their pages
        back once hashed (docs/format.md, "Gathered constants")."""
        return sorted([self._offsets[id(d)], int(d.nbytes)] for d in self._keep
                      if id(d) in self.gathered and d.nbytes > 0)

    def find(self, data: object) -> int | None:
        """Offset of this very array object in the pool, or None."""
        return self._offsets.get(id(data))

    def __len__(self) -> int:
        return len(self._keep)

    def content(self) -> memoryview | Segments:
        """The blob without a copy: a read-only view of the arena when `from_module`
        adopted one, else `Segments` of the arrays' memory and the padding between."""
        return self._arena if self._arena is not None else Segments(self.parts())

    def to_bytes(self) -> bytes | memoryview:
        """The blob as one buffer: every array at its offset, zero padding between
        (joined on each call: a full copy, unless it is the adopted arena's view)."""
        return self._arena if self._arena is not None else b"".join(self.parts())

    def parts(self) -> Iterator[bytes | memoryview]:
        """The blob in order as zero padding and views of the arrays (nothing joined),
        for writing it out without building it (e.g. into the compile cache)."""
        if self._arena is not None:
            yield self._arena
            return
        end = 0
        for off, view in self._pieces():
            if off > end:
                yield bytes(off - end)
            yield view
            end = off + len(view)

    def chunk_digests(self) -> bytes:
        """Chunked SHA-256 of the blob (kiln.artifact.integrity), computed once.

        Hashed straight from the arrays when the blob is not built yet, so the
        driver can key the cache before codegen without holding a second copy
        of the weights during it.
        """

        if self._digests is None:
            hashing = self._hashing
            self._digests = (hashing.result() if hashing is not None
                             else chunk_digests(self.content()))
        return self._digests

    def hash_in_background(self) -> None:
        """Start `chunk_digests` on threads of its own (one per CPU but one, at least
        one), for a caller with other work to do before it needs the digests: the
        compile driver when the compile cache cannot hold this build (kiln.driver.
        compiler), whose lowering then runs beside the hashing on the core left to it.
        `chunk_digests` waits for them."""
        if self._digests is not None or self._hashing is not None:
            return
        content = self.content()
        threads = max(1, min(4, (os.cpu_count() or 1) - 1))
        hashing: Future[bytes] = Future()

        def run() -> None:
            try:
                hashing.set_result(chunk_digests(content, threads=threads))
            except BaseException as exc:  # handed to the caller of chunk_digests
                hashing.set_exception(exc)

        self._hashing = hashing
        threading.Thread(target=run, name="kiln-weights-hash", daemon=True).start()

    def _pieces(self) -> Iterator[tuple[int, memoryview]]:
        """(offset, bytes) of every array, in blob order, without copying."""
        for data in self._keep:
            view = np.ascontiguousarray(data).reshape(-1).view(np.uint8).data.toreadonly()
            yield self._offsets[id(data)], view

    def integrity(self) -> dict[str, Any]:
        """Artifact metadata recording the blob's chunk hashes (docs/format.md)."""

        return {"chunk_size": CHUNK_SIZE, "chunk_sha256": self.chunk_digests().hex()}

    def fingerprint(self) -> str:
        """Hex digest naming the blob's content (its chunk hashes and size)."""

        return tree_digest(self.chunk_digests(), self.size)

    @classmethod
    def from_module(cls, mod: IRModule) -> ConstantPool:
        """A pool holding every AllocConst of every tensor-level function, in order
        (or at their places in the arena they all live in, see `_adopt_arena`)."""
        pool = cls()
        for fn in mod.prim_funcs().values():
            for node in iter_stmts(fn.body):
                if isinstance(node, AllocConst):
                    pool.add(node.data)
        pool._adopt_arena()
        pool.gathered = gathered_constants(mod)
        named = mod.attrs.get(wo.ATTR_WEIGHTS)
        pool.named_weights = tuple(named) if named is not None else None
        return pool

    def _adopt_arena(self) -> None:
        """Use the arena the arrays live in as the blob, when it already is one.

        The ONNX importer reads all weights into one aligned arena
        (kiln.frontend.onnx.raw_data). When every array of the pool is a
        contiguous view of one such buffer at a CONST_ALIGN-aligned place, no
        two overlap, and they fill most of it (little data the module dropped),
        the arena is the blob as it stands: the weights are not copied again.
        """
        if not self._keep:
            return
        root = _owner(self._keep[0])
        if root is None or root.dtype != np.uint8 or root.ndim != 1 or \
                not root.flags.c_contiguous:
            return
        skip = -root.ctypes.data % CONST_ALIGN  # the blob starts at the first aligned byte
        base = root.ctypes.data + skip
        places = []
        for data in self._keep:
            if _owner(data) is not root or not data.flags.c_contiguous:
                return
            start = data.ctypes.data - base
            if start % CONST_ALIGN or start < 0 or skip + start + data.nbytes > root.nbytes:
                return
            places.append((start, data.nbytes, id(data)))
        places.sort()
        end = used = 0
        for start, nbytes, _ in places:
            if start < end:
                return  # overlapping views
            end, used = start + nbytes, used + nbytes
        if used < ARENA_MIN_USE * end:
            return
        self._offsets = {key: start for start, _, key in places}
        self.size = end
        view = root[skip:skip + end].view()
        view.flags.writeable = False
        self._arena = view.data
        self._digests = self._hashing = None


def _swapping_host(artifacts: Iterable[Any]) -> Artifact | None:
    """The native host.c among `artifacts` whose entry runs a swap program, or None."""
    host = next((a for a in artifacts if isinstance(a, Artifact) and a.file_name == HOST_FILE
                 and a.loader == "native"), None)
    return host if host is not None and b"#define KILN_HOST_SWAP 1" in bytes(host.content) \
        else None


def precompile_swap_runtime(pool: ConstantPool, host: Artifact, prefix: str) -> None:
    """Start compiling the swap program's interpreter (`swap_runtime.c`, the same for every
    model) while the kernels compile, where `with_replay` will add it: a module that names
    its weights, built with a swapping `host`. `with_replay` finds the object started (the
    load waited for its compile, which began only after the kernels, on an idle core)."""
    if pool.named_weights is not None and len(pool) and _swapping_host([host]) is not None:
        precompile_c(runtime_artifact(prefix, host.codegen_id, host.metadata.get("cflags", ())))


def _swap_program(artifacts: list[Any], record: dict[str, Any], prefix: str) -> list[Any]:
    """The swap program's artifacts (kiln.codegen.swap_program) beside a native host.c
    whose entry runs them (none when the record has no program, or no host.c is native)."""
    host = _swapping_host(artifacts)
    if host is None:
        return []
    made = program_artifacts(record, prefix, host.codegen_id, host.metadata.get("cflags", ()))
    for artifact in made:  # compiled meanwhile, as host.c is: a load finds the objects
        precompile_c(artifact)
    return made


REPLAY_VERSION = 1


def replay_record(constants: Iterator[tuple[int, np.ndarray]] | Any, size: int,
                  named: Any) -> dict[str, Any]:
    """The replay record of a pool of `size` bytes holding `constants` (offset, array),
    given the model's named weights (`kiln.ir.weight_origin.table_row`s)."""
    entries = []
    used: set[str] = set()
    for offset, data in sorted(constants, key=lambda c: c[0]):
        origin = wo.origin_of(data)
        used.update(w.name for w in wo.leaves(origin))
        entries.append({"offset": offset, "dtype": data.dtype.name,
                        "shape": [int(d) for d in data.shape], **wo.to_json(origin)})
    weights: dict[str, Any] = {}
    for name, dtype, shape, baked, digest in named:
        row: dict[str, Any] = {"dtype": dtype, "shape": list(shape)}
        if name not in used or baked:
            row["fixed"] = True  # not rebuilt (unused, or read into the code): must not change
            row["sha256"] = digest
        weights[name] = row
    return {"version": REPLAY_VERSION, "size": size, "weights": weights, "constants": entries}

"""Read an ONNX model file with its weights read once, into one aligned arena.

`onnx.load` reads the file (one copy of the weights), parses it (a second copy,
inside the protobuf message) and `numpy_helper.to_array` makes a third; for a
model of hundreds of megabytes that triples the memory and the time. Here the
file's structure is scanned with small positioned reads (the protobuf wire
format is a public, stable encoding:
https://protobuf.dev/programming-guides/encoding/), the message is parsed
without the initializers' `raw_data` fields (a few kilobytes), and each
`raw_data` is read from the file straight into its slot of one arena, at a
64-byte aligned offset, in file order. The arrays are read-only views of the
arena: when a compiled module keeps them all, kiln's constant pool uses the
arena itself as the library's weight blob (kiln.codegen.constants), so the
weights exist once in memory from the file to the library. A plain tensor's
external data is read the same way, into an aligned array of its own, and never
into the protobuf message (which cannot hold 2 GiB: a 4.5 GiB model's tensors
could not load). Anything else (another element type, data outside `raw_data`,
a second `graph` field) keeps onnx's own decoding, so the result equals
`onnx.load` + `to_array` (a test compares).
"""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO

import numpy as np

from kiln.errors import FrontendError
from kiln.frontend.onnx.file_limits import check_external_data
from kiln.ops import pack_memory

# ModelProto.graph, GraphProto.initializer, TensorProto.raw_data (onnx.proto).
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5

# TensorProto.DataType values whose raw_data is plain little-endian numpy data.
_PLAIN_DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16,
                 6: np.int32, 7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64,
                 12: np.uint32, 13: np.uint64}


class _WireError(Exception):
    """The bytes do not scan as the protobuf layout expected (onnx decodes them instead)."""


class _File:
    """Positioned reads of an open file, with one cached block for the scan's bytes."""

    BLOCK = 1 << 16

    def __init__(self, f: BinaryIO) -> None:
        self.fd = f.fileno()
        self.size = os.fstat(self.fd).st_size
        self.block_at = -1
        self.block = b""

    def byte(self, pos: int) -> int:
        if not self.block_at <= pos < self.block_at + len(self.block):
            self.block_at = pos
            self.block = os.pread(self.fd, self.BLOCK, pos)
            if not self.block:
                raise _WireError
        return self.block[pos - self.block_at]

    def read(self, start: int, stop: int) -> bytes:
        out = bytearray()
        while len(out) < stop - start:
            part = os.pread(self.fd, stop - start - len(out), start + len(out))
            if not part:
                raise _WireError
            out += part
        return bytes(out)

    def read_into(self, start: int, out: memoryview) -> None:
        done = 0
        while done < len(out):
            n = os.preadv(self.fd, [out[done:]], start + done)
            if n <= 0:
                raise _WireError
            done += n


def _varint(buf: _File, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _WireError
        byte = buf.byte(pos)
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _fields(buf: _File, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """(field number, field start, payload start, field end) of each field in [start, end)."""
    out = []
    pos = start
    while pos < end:
        key, body = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == _VARINT:
            _, stop = _varint(buf, body, end)
        elif wire == _I64:
            stop = body + 8
        elif wire == _I32:
            stop = body + 4
        elif wire == _LEN:
            length, body = _varint(buf, body, end)
            stop = body + length
        else:  # groups (deprecated) and invalid wire types
            raise _WireError
        if stop > end:
            raise _WireError
        out.append((number, pos, body, stop))
        pos = stop
    return out


def _strip(buf: _File) -> tuple[bytes, list[tuple[int, int] | None]]:
    """The model without its initializers' raw_data, and where each one's data is."""
    top = _fields(buf, 0, buf.size)
    graphs = [f for f in top if f[0] == _MODEL_GRAPH]
    if len(graphs) != 1:
        raise _WireError  # protobuf merges repeated message fields: leave that to onnx
    out = bytearray()
    where: list[tuple[int, int] | None] = []
    for number, start, body, stop in top:
        if number != _MODEL_GRAPH:
            out += buf.read(start, stop)
            continue
        graph = bytearray()
        for g_number, g_start, g_body, g_stop in _fields(buf, body, stop):
            if g_number != _GRAPH_INITIALIZER:
                graph += buf.read(g_start, g_stop)
                continue
            tensor = bytearray()
            found = None
            for t_number, t_start, t_body, t_stop in _fields(buf, g_body, g_stop):
                if t_number == _TENSOR_RAW_DATA and found is None:
                    found = (t_body, t_stop - t_body)
                else:
                    tensor += buf.read(t_start, t_stop)
            where.append(found)
            graph += _encode_varint(_GRAPH_INITIALIZER << 3 | _LEN)
            graph += _encode_varint(len(tensor)) + tensor
        out += _encode_varint(_MODEL_GRAPH << 3 | _LEN) + _encode_varint(len(graph)) + graph
    return bytes(out), where


ARENA_ALIGN = 64
# Weights are read in pieces of this size, on two threads when there are this many
# bytes: the copy from the page cache and the first touch of the fresh arena's pages
# (most of an import of hundreds of megabytes) are shared by two cores.
_READ_PIECE = 8 << 20
_PARALLEL_READ_MIN = 32 << 20


def load_with_views(path: str) -> tuple[Any, dict[int, np.ndarray]]:
    """`(ModelProto, {initializer index: array})` for the ONNX file at `path`, its
    external data loaded (`read_with_views`, then `load_external_data`)."""
    proto, views = read_with_views(path)
    load_external_data(proto, path, views)
    return proto, views


def read_with_views(path: str) -> tuple[Any, dict[int, np.ndarray]]:
    """`(ModelProto, {initializer index: array})` for the ONNX file at `path`, its
    external data not loaded yet (the tensors still name their files).

    The arrays are read-only views of one arena holding every plain `raw_data`,
    each 64-byte aligned, read from the file once; initializers not in the dict
    (and the whole model when the scan does not apply) are left to onnx.
    Raises OSError for an unreadable file and the protobuf/onnx errors of a
    damaged one, like `onnx.load`. The caller has checked the file's size
    (kiln.frontend.onnx.file_limits.check_model_file); its external data's is checked by
    `load_external_data`.
    """
    import onnx  # optional: onnx (the compiler extra)


    with open(path, "rb") as f:
        if sys.byteorder != "little":
            return onnx.load_from_string(f.read()), {}
        buf = _File(f)
        try:
            stripped, where = _strip(buf)
        except _WireError:
            f.seek(0)
            return onnx.load_from_string(f.read()), {}
        proto = onnx.load_from_string(stripped)
        inits = proto.graph.initializer
        if len(inits) != len(where):
            raise FrontendError(f"{path!r}: the initializers did not parse consistently")
        slots: list[tuple[int, int, int, Any]] = []  # (index, file offset, arena offset, dtype)
        end = 0
        for i, (init, found) in enumerate(zip(inits, where)):
            if found is None:
                continue
            offset, length = found
            dtype = _PLAIN_DTYPES.get(init.data_type)
            count = int(np.prod(init.dims, dtype=np.int64)) if len(init.dims) else 1
            if dtype is None or init.data_location == init.EXTERNAL or \
                    length != count * np.dtype(dtype).itemsize:
                init.raw_data = buf.read(offset, offset + length)  # onnx decodes or rejects it
                continue
            slots.append((i, offset, end, dtype))
            end = -(-(end + length) // ARENA_ALIGN) * ARENA_ALIGN
        arena = _aligned_bytes(end)
        views: dict[int, np.ndarray] = {}
        reads: list[tuple[int, int, memoryview]] = []  # (initializer, file offset, its slot)
        for i, offset, at, dtype in slots:
            shape = tuple(inits[i].dims)
            nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
            reads += [(i, offset + j, arena[at + j:at + min(j + _READ_PIECE, nbytes)].data)
                      for j in range(0, nbytes, _READ_PIECE)]
            views[i] = arena[at:at + nbytes].view(dtype).reshape(shape)
        short = _read_pieces(buf, reads, end)
        if short is not None:
            raise FrontendError(f"{path!r}: initializer {inits[short].name!r}: the file ends "
                                "inside its data (truncated?)")
        arena.flags.writeable = False
        for v in views.values():
            v.flags.writeable = False
    return proto, views


def _read_pieces(buf: _File, reads: list[tuple[int, int, memoryview]], total: int
                 ) -> int | None:
    """Fill each `(initializer, file offset, slot)` of `reads` from the file; the first
    initializer whose data the file ends inside of, or None."""

    def one(read: tuple[int, int, memoryview]) -> int | None:
        try:
            buf.read_into(read[1], read[2])
        except _WireError:
            return read[0]
        return None

    if total < _PARALLEL_READ_MIN or (os.cpu_count() or 1) < 2:
        results = map(one, reads)
        return next((i for i in results if i is not None), None)
    with ThreadPoolExecutor(max_workers=2) as pool:  # preadv releases the GIL
        return next((i for i in pool.map(one, reads) if i is not None), None)


def load_external_data(proto: Any, path: str, views: dict[int, np.ndarray] | None = None
                       ) -> None:
    """Load into `proto`, read from the ONNX file at `path`, the data of its tensors
    kept in external files (after checking their locations and sizes).

    With `views` (read_with_views' dict), a plain initializer's external data is read
    straight into an aligned array added there instead (once in memory, and never
    inside the protobuf message, which cannot hold 2 GiB or more)."""
    if views is not None and any(t.data_location == t.EXTERNAL
                                 for t in proto.graph.initializer):
        check_external_data(proto, os.path.dirname(os.path.abspath(path)), repr(path))
        _read_external_views(proto, os.path.dirname(os.path.abspath(path)), views)
    if any(t.data_location == t.EXTERNAL for t in proto.graph.initializer):
        from onnx.external_data_helper import (
            load_external_data_for_model,  # optional: onnx (the compiler extra)
        )

        check_external_data(proto, os.path.dirname(os.path.abspath(path)), repr(path))
        load_external_data_for_model(proto, os.path.dirname(os.path.abspath(path)))


def _read_external_views(proto: Any, directory: str, views: dict[int, np.ndarray]) -> None:
    """Read each plain initializer's external data into an array of `views` and mark it
    loaded; anything else (another type, a location outside `directory`, a length
    other than the shape's, a short file) is left to onnx, which decodes or refuses it."""
    for i, t in enumerate(proto.graph.initializer):
        dtype = _PLAIN_DTYPES.get(t.data_type)
        if t.data_location != t.EXTERNAL or dtype is None or i in views:
            continue
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        parts = location.replace("\\", "/").split("/")
        if not location or os.path.isabs(location) or ".." in parts or set(info) - {
                "location", "offset", "length", "checksum"}:
            continue
        count = int(np.prod(t.dims, dtype=np.int64)) if len(t.dims) else 1
        nbytes = count * np.dtype(dtype).itemsize
        try:
            offset = int(info.get("offset") or 0)
            if info.get("length") and int(info["length"]) != nbytes:
                continue
        except ValueError:
            continue
        data = _aligned_bytes(nbytes)
        with open(os.path.join(directory, location), "rb") as f:
            if offset < 0 or os.fstat(f.fileno()).st_size < offset + nbytes:
                continue
            f.seek(offset)
            done = 0
            while done < nbytes:  # readinto may stop short (at most 2 GiB per call)
                n = f.readinto(data[done:].data)
                if not n:
                    break
                done += n
        if done != nbytes:
            continue
        data.flags.writeable = False
        views[i] = data.view(dtype).reshape(tuple(t.dims))
        t.data_location = t.DEFAULT
        del t.external_data[:]


def _aligned_bytes(size: int) -> np.ndarray:
    """`size` uint8 of fresh memory starting at an ARENA_ALIGN boundary, on small pages
    from pack_memory's threshold on: the arena is written once in order by the reads,
    and the first touch of numpy's large pages costs several times more on a VM
    (docs/performance.md, "Compile time, round twenty")."""
    raw = pack_memory.empty((size + ARENA_ALIGN,), np.uint8)
    start = -raw.ctypes.data % ARENA_ALIGN
    return raw[start:start + size]


__all__ = ["ARENA_ALIGN", "load_external_data", "load_with_views", "read_with_views"]

"""The named weights (initializers) of an ONNX model, read with numpy only.

`Module.swap_weights` takes an ONNX file of the same graph on a deploy host, where the
`onnx` package is not installed (the runtime imports numpy only), so this reads the
few protobuf fields it needs by hand: `ModelProto.graph` (7), `GraphProto.initializer`
(5), and per `TensorProto` its dims (1), data_type (2), typed data (4, 5, 7, 10, 11),
name (8), raw_data (9), external_data (13) and data_location (14). Everything else is
skipped by its wire type. External data is read relative to the model's directory.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import FormatError

# TensorProto.DataType -> numpy dtype (bfloat16, strings and complex are not weights
# this reader takes).
_DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32,
           7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32,
           13: np.uint64}
# The typed field each data type's values are stored in when not in raw_data.
_TYPED = {1: 4, 2: 5, 3: 5, 4: 5, 5: 5, 6: 5, 9: 5, 10: 5, 7: 7, 11: 10, 12: 11, 13: 11}


def _varint(buf: bytes | memoryview, pos: int, where: str) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise FormatError(f"{where}: truncated or malformed protobuf")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def fields(buf: bytes | memoryview, where: str) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of each field of one protobuf message: an int for
    varints and fixed-width fields, the bytes (a view of `buf`'s, when it is a
    memoryview: no copy) for length-delimited ones."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos, where)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, pos = _varint(buf, pos, where)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            value = int.from_bytes(bytes(buf[pos:pos + size]), "little")
            pos += size
        elif wire == 2:
            length, pos = _varint(buf, pos, where)
            value = buf[pos:pos + length]
            if len(value) != length:
                raise FormatError(f"{where}: truncated protobuf")
            pos += length
        else:
            raise FormatError(f"{where}: unsupported protobuf wire type {wire}")
        yield number, wire, value


def _packed_ints(items: list[tuple[int, Any]], where: str) -> list[int]:
    out: list[int] = []
    for wire, value in items:
        if wire == 2:
            pos = 0
            while pos < len(value):
                v, pos = _varint(value, pos, where)
                out.append(v)
        else:
            out.append(value)
    return out


def _tensor(buf: memoryview, where: str, base: Path | None) -> tuple[str, np.ndarray]:
    seen: dict[int, list[tuple[int, Any]]] = {}
    for number, wire, value in fields(buf, where):
        seen.setdefault(number, []).append((wire, value))
    name = bytes(seen.get(8, [(2, b"")])[-1][1]).decode("utf-8", "replace")
    what = f"{where}: initializer {name!r}"
    dims = [d - (1 << 64) if d >= 1 << 63 else d for d in _packed_ints(seen.get(1, []), what)]
    code = seen.get(2, [(0, 0)])[-1][1]
    dtype = _DTYPES.get(code)
    if dtype is None:
        raise FormatError(f"{what}: data type {code} is not one swap_weights reads")
    count = int(np.prod(dims)) if dims else 1
    if 9 in seen:
        data = np.frombuffer(seen[9][-1][1], dtype=np.dtype(dtype).newbyteorder("<"))
    elif seen.get(14, [(0, 0)])[-1][1] == 1:
        data = _external(seen.get(13, []), dtype, what, base)
    elif code == 1 or code == 11:
        fmt = "<f" if code == 1 else "<d"
        raw = b"".join(bytes(v) if w == 2 else struct.pack(fmt[:1] + ("I" if code == 1 else "Q"), v)
                       for w, v in seen.get(_TYPED[code], []))
        data = np.frombuffer(raw, dtype=np.dtype(fmt))
    else:
        ints = _packed_ints(seen.get(_TYPED[code], []), what)
        if code == 10:  # float16 bits in int32_data
            data = np.array(ints, np.uint16).view(np.float16)
        else:
            data = np.array([i - (1 << 64) if i >= 1 << 63 and code not in (13,) else i
                             for i in ints]).astype(dtype)
    if data.size != count:
        raise FormatError(f"{what}: holds {data.size} values, its shape {dims} needs {count}")
    return name, data.astype(dtype, copy=False).reshape(dims)


def _external(entries: list[tuple[int, Any]], dtype: Any, what: str,
              base: Path | None) -> np.ndarray:
    info: dict[str, str] = {}
    for _wire, entry in entries:
        kv = {n: bytes(v).decode("utf-8", "replace") for n, _w, v in fields(entry, what)}
        info[kv.get(1, "")] = kv.get(2, "")
    if base is None or "location" not in info:
        raise FormatError(f"{what}: external data needs the model's file path")
    path = (base / info["location"]).resolve()
    if base.resolve() not in path.parents:
        raise FormatError(f"{what}: external data {info['location']!r} lies outside the "
                          "model's directory")
    offset = int(info.get("offset", 0))
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.read(int(info["length"])) if "length" in info else f.read()
    return np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"))


def read_onnx_weights(model: bytes, where: str, base: Path | None = None
                      ) -> dict[str, np.ndarray]:
    """name -> array of every initializer of the ONNX model `model` (serialized bytes);
    `base` is the model file's directory (external data). FormatError if malformed.
    The arrays are read-only views of `model`'s bytes where their data is raw."""
    graphs = [v for n, w, v in fields(memoryview(model), where) if n == 7 and w == 2]
    if not graphs:
        raise FormatError(f"{where}: not an ONNX model (no graph)")
    out = {}
    for number, wire, value in fields(graphs[-1], where):
        if number == 5 and wire == 2:
            name, data = _tensor(value, where, base)
            out[name] = data
    return out


__all__ = ["fields", "read_onnx_weights"]

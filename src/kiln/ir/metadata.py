"""Constants that the printed text refers to as `meta["name"]`.

Large constants (graph `Constant` data, `AllocConst` weights) would drown the
text, so the printer writes a reference and keeps the array in a metadata
table. The table travels in one of three ways:

- in the text itself, as a trailing `meta = {...}` section (base64 of the raw
  little-endian bytes, with dtype and shape) — `print_module(metadata="auto")`;
- as a dict beside the text (`ScriptText.metadata`), for
  `from_source(text, metadata=...)` — `print_module(metadata="reference")`;
- as a `.npz` side file (`save_metadata` / `load_metadata`).
"""

from __future__ import annotations

import base64
import os
import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir.dtype import from_numpy, to_numpy
from kiln.ir.literals import literal, quote

Metadata = dict[str, np.ndarray]
MetadataLike = Mapping[str, np.ndarray] | str | os.PathLike[str] | None

# Width of the base64 lines in a printed metadata section.
_B64_LINE = 96


class ScriptText(str):
    """Printed DSL text that also carries the constants it refers to.

    A plain `str` in every way; `.metadata` maps each `meta["name"]` reference
    in the text to its array (empty when everything is inline or the text has
    its own metadata section).
    """

    metadata: Metadata

    def __new__(cls, text: str, metadata: Mapping[str, np.ndarray] | None = None) -> ScriptText:
        obj = super().__new__(cls, text)
        obj.metadata = dict(metadata or {})
        return obj

    def save_metadata(self, path: str | os.PathLike[str]) -> None:
        """Write `.metadata` to a `.npz` side file (see `load_metadata`)."""
        save_metadata(self.metadata, path)


def save_metadata(metadata: Mapping[str, np.ndarray], path: str | os.PathLike[str]) -> None:
    """Write a metadata table to `path` as an uncompressed `.npz` archive."""
    arrays: dict[str, Any] = {}
    for key, arr in metadata.items():
        arr = np.asarray(arr)
        if arr.dtype.kind == "V" or arr.dtype.hasobject:
            raise IRError(f"metadata {key!r}: dtype {arr.dtype} cannot be stored in .npz")
        arrays[key] = arr
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load_metadata(path: str | os.PathLike[str]) -> Metadata:
    """Read a metadata table written by `save_metadata`."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {key: npz[key] for key in npz.files}
    except (OSError, ValueError) as exc:
        raise IRError(f"cannot read metadata file {os.fspath(path)!r}: {exc}") from exc


def resolve_metadata(metadata: MetadataLike) -> Metadata:
    """A metadata argument (dict, `.npz` path or None) as a dict of arrays."""
    if metadata is None:
        return {}
    if isinstance(metadata, (str, os.PathLike)):
        return load_metadata(metadata)
    if not isinstance(metadata, Mapping):
        raise IRError(
            f"metadata must be a dict of numpy arrays or a .npz path, "
            f"not {type(metadata).__name__}"
        )
    out: Metadata = {}
    for key, value in metadata.items():
        if not isinstance(key, str):
            raise IRError(f"metadata keys must be strings, got {key!r}")
        out[key] = np.asarray(value)
    return out


def _little_endian(arr: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(arr)
    if sys.byteorder == "big" and arr.dtype.byteorder not in ("|", "<"):
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return arr


def encode_entry(arr: np.ndarray) -> dict[str, Any]:
    """The printed form of one array: dtype, shape and base64 of its bytes."""
    return {
        "dtype": from_numpy(arr.dtype),
        "shape": tuple(int(d) for d in arr.shape),
        "base64": base64.b64encode(_little_endian(arr).tobytes()).decode("ascii"),
    }


def decode_entry(key: str, entry: Any) -> np.ndarray:
    """Inverse of `encode_entry`; raises IRError naming `key` on a malformed entry."""
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "base64"}:
        raise IRError(
            f"metadata {key!r} must be a dict with keys 'dtype', 'shape', 'base64'"
        )
    dtype, shape, text = entry["dtype"], entry["shape"], entry["base64"]
    if not isinstance(text, str):
        raise IRError(f"metadata {key!r}: 'base64' must be a string")
    if not isinstance(shape, (tuple, list)) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise IRError(f"metadata {key!r}: 'shape' must be a tuple of non-negative ints")
    np_dtype = to_numpy(dtype)
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise IRError(f"metadata {key!r}: bad base64 data ({exc})") from None
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    expected = count * np_dtype.itemsize
    if len(raw) != expected:
        raise IRError(
            f"metadata {key!r}: {len(raw)} bytes of data for shape {tuple(shape)} "
            f"{dtype} (expected {expected})"
        )
    stored = np_dtype if sys.byteorder == "little" else np_dtype.newbyteorder("<")
    arr = np.frombuffer(raw, dtype=stored).reshape(tuple(shape))
    return arr.astype(np_dtype)  # a writable copy in native byte order


def format_section(metadata: Mapping[str, np.ndarray]) -> str:
    """The trailing `meta = {...}` section of printed text."""
    lines = [
        "# Constants referenced as meta[...]: dtype, shape and the base64 of the",
        "# little-endian bytes. from_source() reads this section back.",
        "meta = {",
    ]
    for key, arr in metadata.items():
        entry = encode_entry(arr)
        text = entry["base64"]
        chunks = [text[i:i + _B64_LINE] for i in range(0, len(text), _B64_LINE)] or [""]
        head = (f"    {quote(key)}: {{\"dtype\": {quote(entry['dtype'])}, "
                f"\"shape\": {literal(entry['shape'])}, ")
        if len(chunks) == 1:
            lines.append(f"{head}\"base64\": {quote(chunks[0])}}},")
        else:
            lines.append(f"{head}\"base64\": (")
            lines.extend(f"        {quote(c)}" for c in chunks)
            lines.append("    )},")
    lines.append("}")
    return "\n".join(lines) + "\n"

"""How large an ONNX model kiln reads: checked from the file system before reading.

- **The .onnx file**: at most `max_model_bytes()`, by default `MAX_MODEL_BYTES`
  (2 GiB): protobuf's limit for one serialized message, so no standard ONNX writer
  produces a larger file (`onnx.save` refuses; a larger model keeps its weights in
  external data files). `$KILN_MAX_MODEL_BYTES` changes it ("500M", "4G", plain
  bytes; "0": no limit).
- **External data** (tensors whose bytes live in files next to the model): at most
  `max_external_data_bytes()` in all, by default `MAX_EXTERNAL_DATA_BYTES` (8 GiB:
  the weights a kiln archive can carry, kiln.artifact.safe_tar's total), from
  regular files only; `$KILN_MAX_EXTERNAL_DATA_BYTES` changes it. The `onnx` package
  reads each such tensor into memory, so this bounds what a model's references cost.

A model is read from a regular file only: a device (`/dev/zero`) or a pipe has no
size to check. docs/security.md, "Limits", lists every limit.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from typing import Any

from kiln.artifact.capped import human_bytes, parse_size, read_capped, too_large
from kiln.errors import FrontendError, MissingFileError, UsageError, shown

#: The largest .onnx file read by default: protobuf's 2 GiB message limit.
MAX_MODEL_BYTES = 2 << 30
#: The most external data bytes one model may reference by default.
MAX_EXTERNAL_DATA_BYTES = 8 << 30
MODEL_BYTES_VAR = "KILN_MAX_MODEL_BYTES"
EXTERNAL_DATA_BYTES_VAR = "KILN_MAX_EXTERNAL_DATA_BYTES"


def _limit(var: str, default: int) -> int | None:
    """`$var` as a size (None for "0": no limit), else `default`."""
    text = os.environ.get(var, "").strip()
    if not text:
        return default
    try:
        return parse_size(text) or None
    except UsageError as exc:
        raise UsageError(f"${var}: {exc}") from None


def max_model_bytes() -> int | None:
    """The largest .onnx file kiln reads ($KILN_MAX_MODEL_BYTES, else MAX_MODEL_BYTES;
    None: no limit)."""
    return _limit(MODEL_BYTES_VAR, MAX_MODEL_BYTES)


def max_external_data_bytes() -> int | None:
    """The most external data one model may reference ($KILN_MAX_EXTERNAL_DATA_BYTES,
    else MAX_EXTERNAL_DATA_BYTES; None: no limit)."""
    return _limit(EXTERNAL_DATA_BYTES_VAR, MAX_EXTERNAL_DATA_BYTES)


def check_model_file(path: str | os.PathLike[str], what: str | None = None) -> int:
    """The size of the ONNX model file at `path`, checked before anything reads it:
    MissingFileError when it does not exist, FrontendError when it is not a regular
    file or is larger than `max_model_bytes()`. `what` names it in errors (default:
    "ONNX model file PATH")."""
    what = what or f"ONNX model file {os.fspath(path)}"
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise MissingFileError(f"{what} does not exist") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise FrontendError(f"cannot read {what}: {getattr(exc, 'strerror', None) or exc}"
                            ) from None
    if not stat.S_ISREG(st.st_mode):
        raise FrontendError(f"{what} is not a regular file (a directory, a device or a "
                            "pipe); kiln reads a model from a file whose size it can check")
    limit = max_model_bytes()
    if limit is not None and st.st_size > limit:
        raise FrontendError(f"{too_large(what, st.st_size, limit)}; a larger model keeps "
                            f"its weights in external data files, or set ${MODEL_BYTES_VAR}")
    return st.st_size


def read_model_file(path: str | os.PathLike[str], what: str | None = None) -> bytes:
    """The bytes of the ONNX model file at `path`, after `check_model_file` (and read
    no further than its limit, should the file grow meanwhile)."""
    what = what or f"ONNX model file {os.fspath(path)}"
    size = check_model_file(path, what)
    return read_capped(path, max_model_bytes() or size, what, FrontendError)


def check_external_data(model: Any, directory: str, what: str) -> int:
    """The external data bytes the tensors of `model` (an onnx.ModelProto, its
    subgraphs and attributes included) reference in files under `directory`, checked
    before `onnx` reads them: FrontendError naming `what` and the tensor when a file is
    not a regular one or the total passes `max_external_data_bytes()`. A reference
    `onnx` refuses anyway (a missing file, an offset past its end) is left to it."""
    limit = max_external_data_bytes()
    total = 0
    for tensor in _tensors(model.graph):
        if tensor.data_location != tensor.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        path = os.path.join(directory, info.get("location", ""))
        try:
            st = os.stat(path)
            offset = int(info.get("offset") or 0)
            length = int(info["length"]) if info.get("length") else st.st_size - offset
        except (OSError, ValueError):
            continue
        if not stat.S_ISREG(st.st_mode):
            raise FrontendError(f"{what}: tensor {shown(tensor.name)} keeps its data in "
                                f"{shown(info.get('location'))}, which is not a regular file")
        total += max(length, 0)
        if limit is not None and total > limit:
            raise FrontendError(
                f"{what}: its external data (up to tensor {shown(tensor.name)}) holds "
                f"{human_bytes(total)}, more than the {human_bytes(limit)} a model may "
                f"reference (docs/security.md, \"Limits\"); set ${EXTERNAL_DATA_BYTES_VAR} "
                "to allow more")
    return total


def external_data_locations(model: Any) -> list[str]:
    """The files (relative to the model's folder) the tensors of `model`, an
    onnx.ModelProto loaded without its external data, keep their data in, each once,
    in order of first use."""
    seen: dict[str, None] = {}
    for tensor in _tensors(model.graph):
        if tensor.data_location == tensor.EXTERNAL:
            info = {e.key: e.value for e in tensor.external_data}
            seen.setdefault(str(info.get("location", "")), None)
    return list(seen)


def _tensors(graph: Any) -> Iterator[Any]:
    """Every TensorProto of `graph`: initializers, sparse initializers' parts and
    attribute tensors, in subgraphs too (iteratively: nesting costs no stack)."""
    graphs = [graph]
    while graphs:
        g = graphs.pop()
        yield from g.initializer
        for sparse in g.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        for node in g.node:
            for attr in node.attribute:
                if attr.HasField("t"):
                    yield attr.t
                yield from attr.tensors
                if attr.HasField("g"):
                    graphs.append(attr.g)
                graphs.extend(attr.graphs)


__all__ = ["EXTERNAL_DATA_BYTES_VAR", "MAX_EXTERNAL_DATA_BYTES", "MAX_MODEL_BYTES",
           "MODEL_BYTES_VAR", "check_external_data", "check_model_file", "external_data_locations",
           "max_external_data_bytes", "max_model_bytes", "read_model_file"]

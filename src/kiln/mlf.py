"""Read a Model Library Format archive back, build it for this machine, run it.

    model = kiln.mlf.load("model.mlf.tar")
    (y,) = model(x)

`load` extracts the archive safely (regular files and directories only, no
absolute paths or `..`, bounded sizes), checks `metadata.json` (its `version`
must be one kiln reads), compiles the sources with the flags the metadata
lists plus `-fPIC`, links them with the objects and the parameters into a
shared library in a temporary directory, and calls `<model>_run` through
ctypes with a workspace numpy allocates. The C compiler is `$CC` or `cc`.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import FormatError

READ_VERSIONS = (1,)
MAX_MEMBER_BYTES = 1 << 32
MAX_MEMBERS = 10_000


def _extract(path: Path, into: Path) -> None:
    try:
        with tarfile.open(path, "r:") as tar:
            _extract_members(tar, path, into)
    except (OSError, tarfile.TarError) as exc:
        raise FormatError(f"{path}: not a readable Model Library Format tar: {exc}") from None


def _extract_members(tar: tarfile.TarFile, path: Path, into: Path) -> None:
    members = tar.getmembers()
    if len(members) > MAX_MEMBERS:
        raise FormatError(f"{path}: {len(members)} members, more than {MAX_MEMBERS}")
    for m in members:
        parts = Path(m.name).parts
        if m.name.startswith("/") or ".." in parts or not parts:
            raise FormatError(f"{path}: member {m.name!r} escapes the archive")
        if not (m.isfile() or m.isdir()):
            raise FormatError(f"{path}: member {m.name!r} is not a regular file")
        if m.size > MAX_MEMBER_BYTES:
            raise FormatError(f"{path}: member {m.name!r} is too large")
        target = into.joinpath(*parts)
        if m.isdir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        src = tar.extractfile(m)
        assert src is not None
        with src, open(target, "wb") as out:
            shutil.copyfileobj(src, out)


def _metadata(root: Path, path: Path) -> dict[str, Any]:
    try:
        meta = json.loads((root / "metadata.json").read_text())
    except (OSError, ValueError) as exc:
        raise FormatError(f"{path}: metadata.json missing or not JSON: {exc}") from None
    if not isinstance(meta, dict) or meta.get("version") not in READ_VERSIONS:
        raise FormatError(f"{path}: Model Library Format version "
                          f"{meta.get('version') if isinstance(meta, dict) else '?'} is not "
                          f"one this kiln reads ({', '.join(map(str, READ_VERSIONS))})")
    for key in ("model_name", "prefix", "inputs", "outputs", "memory", "build"):
        if key not in meta:
            raise FormatError(f"{path}: metadata.json has no '{key}'")
    return meta


class MLFModel:
    """A Model Library Format archive built for this machine: call it with the inputs."""

    def __init__(self, library: Path, meta: dict[str, Any], workdir: str) -> None:
        self.metadata = meta
        self._workdir = workdir
        self._lib = ctypes.CDLL(str(library))
        name = meta["model_name"]
        self._run = getattr(self._lib, f"{name}_run")
        self._run.restype = ctypes.c_int32
        self._error = getattr(self._lib, f"{meta['prefix']}_last_error")
        self._error.restype = ctypes.c_char_p
        ws = int(meta["memory"]["main"]["workspace_bytes"])
        self._workspace = np.zeros(ws + 64, np.uint8)

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        specs_in, specs_out = self.metadata["inputs"], self.metadata["outputs"]
        if len(inputs) != len(specs_in):
            raise ValueError(f"expected {len(specs_in)} inputs, got {len(inputs)}")
        args = []
        for x, spec in zip(inputs, specs_in):
            arr = np.ascontiguousarray(x, dtype=spec["dtype"])
            if list(arr.shape) != list(spec["shape"]):
                raise ValueError(f"input {spec['name']!r}: expected shape {spec['shape']}, "
                                 f"got {list(arr.shape)}")
            args.append(arr)
        outs = [np.empty(spec["shape"], spec["dtype"]) for spec in specs_out]
        ws = self._workspace
        aligned = ws[-ws.ctypes.data % 64:]
        status = self._run(*(ctypes.c_void_p(a.ctypes.data) for a in [*args, *outs]),
                           ctypes.c_void_p(aligned.ctypes.data))
        if status != 0:
            from kiln.errors import CallError

            raise CallError((self._error() or b"").decode("utf-8", "replace"))
        return outs

    def close(self) -> None:
        shutil.rmtree(self._workdir, ignore_errors=True)


def load(path: str | os.PathLike[str], *, cc: str | None = None) -> MLFModel:
    """Extract, build for this machine and load a Model Library Format archive."""
    from kiln.runtime import native

    archive = Path(path)
    workdir = tempfile.mkdtemp(prefix="kiln-mlf-")
    try:
        root = Path(workdir) / "mlf"
        root.mkdir()
        _extract(archive, root)
        meta = _metadata(root, archive)
        build = meta["build"]
        includes = [f"-I{root / d}" for d in build.get("include_dirs", [])]
        objects = [str(p) for p in sorted((root / "codegen/host/lib").glob("*.o"))]
        for member, flags in sorted(build.get("cflags", {}).items()):
            src = root / member
            if not src.is_file() or ".." in Path(member).parts:
                raise FormatError(f"{archive}: metadata lists {member!r}, which is not in it")
            obj = Path(workdir) / (member.replace("/", "_") + ".o")
            native.run([*native.cc_command(cc), *map(str, flags), "-fPIC", *includes, "-c",
                        str(src), "-o", str(obj)], f"compiling {member}")
            objects.append(str(obj))
        library = Path(workdir) / "model.so"
        native.run([*native.cc_command(cc), "-shared", "-o", str(library), *objects,
                    *map(str, build.get("libs", ["-lm"]))], "linking the archive")
        return MLFModel(library, meta, workdir)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise


__all__ = ["MLFModel", "load"]

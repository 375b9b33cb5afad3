"""Object files compiled from C in this process, remembered by what determines them.

An Executable exported as `.so` and then as `.a` (or run with `jit()` and then
exported) would compile the same C sources with the same compiler and flags
again, and loading a Model Library Format archive again (kiln.runtime.mlf) would
build the same sources. `compile_native` and the MLF loader ask here first. The
key is a SHA-256 over the compiler (its resolved path, size and mtime), the full
command with the output and source paths replaced by the source's file name (what
the compiler records of it), the working directory where a flag asks for debug or
coverage data (which record it; without one, the same compile from another directory
writes the same bytes, so a CLI build or a fresh process elsewhere reuses the object),
the environment variables GCC reads for its search paths and timestamps, and the
source bytes (for an archive, also every file its compiles may include).
The objects are kept in memory, least recently used first out beyond `MAX_BYTES`, and
on disk under the key (`$KILN_CACHE_DIR/objects`, else `~/.cache/kiln/objects`; off
with `KILN_CACHE=0`, as the compile cache), so a new process finds them too: the C
every library carries beside its model (host.c's prelude, the weights check, the swap
interpreter) and a model's host.c built again from the compile cache. Each file holds a magic, the
SHA-256 of the object and the object: one that does not match is ignored.

A compile may also be started ahead (`start`): the llvm codegen starts host.c's while
LLVM compiles the kernels (kiln.runtime.native.precompile_c), and the `lookup` of its
key then waits for that compiler instead of running another. One that fails is
forgotten: the caller compiles the source itself and reports the error.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol


class Folder(Protocol):
    """What a started compile writes in: removed (`cleanup`) when it is done."""

    def cleanup(self) -> None: ...

MAX_BYTES = 64 << 20
# What GCC reads from the environment that can change an object.
_ENVIRONMENT = ("CPATH", "C_INCLUDE_PATH", "COMPILER_PATH", "GCC_EXEC_PREFIX",
                "SOURCE_DATE_EPOCH", "GCC_COMPARE_DEBUG")
# Flags whose output records the working directory (DWARF's comp_dir, the paths of
# coverage and profile data); an object compiled without any of them does not.
_RECORDS_CWD = ("-g", "--coverage", "-fprofile", "-ftest-coverage")

_objects: OrderedDict[str, bytes] = OrderedDict()
_size = 0
_lock = threading.Lock()
# Compiles started ahead: key -> (the compiler, the object it writes, its directory)
_pending: dict[str, tuple[subprocess.Popen[bytes], Path, Folder]] = {}


def _compiler_identity(program: str) -> str:
    found = shutil.which(program)
    if found is None:
        return program
    path = os.path.realpath(found)
    st = os.stat(path)
    return f"{path}\0{st.st_size}\0{st.st_mtime_ns}"


def object_key(command: Sequence[str], source: bytes, source_path: str, object_path: str,
               *, roots: Sequence[str] = ()) -> str:
    """The key of the object `command` (which reads `source_path`, holding `source`, and
    writes `object_path`) compiles. Each of `roots` (directories that differ from one
    build to the next, e.g. an extracted archive) is replaced by a placeholder in the
    command: `source` must then cover every file under them the compiler may read."""
    name = os.path.basename(source_path)
    args = [name if a in (source_path, object_path) else a for a in command[1:]]
    for i, root in enumerate(roots):
        args = [a.replace(root, f"<root {i}>") for a in args]
    cwd = [os.getcwd()] if any(a.startswith(_RECORDS_CWD) for a in args) else []
    h = hashlib.sha256()
    for part in (_compiler_identity(command[0]), *args, *cwd,
                 *(f"{v}={os.environ.get(v, '')}" for v in _ENVIRONMENT)):
        h.update(part.encode("utf-8", "surrogateescape") + b"\0")
    h.update(source)
    return h.hexdigest()


def lookup(key: str) -> bytes | None:
    """The object stored under `key` (waiting for a compile `start`ed for it), or None."""
    with _lock:
        data = _objects.get(key)
        if data is not None:
            _objects.move_to_end(key)
            return data
        pending = _pending.pop(key, None)
    if pending is not None:
        return _finish(key, *pending)
    data = _disk_read(key)
    if data is not None:
        _remember(key, data)
    return data


def started(key: str) -> bool:
    """Whether `key` is stored (in memory or on disk) or being compiled."""
    with _lock:
        if key in _objects or key in _pending:
            return True
    data = _disk_read(key)
    if data is not None:
        _remember(key, data)
    return data is not None


def start(key: str, process: subprocess.Popen[bytes], obj: Path,
          folder: Folder) -> None:
    """Remember the compile `process`, writing `obj` (in `folder`, removed when it is
    done), as the object of `key`; compiles started before and done are collected."""
    with _lock:
        done = [k for k, (p, _o, _f) in _pending.items() if p.poll() is not None]
        finished = [(k, *_pending.pop(k)) for k in done]
        _pending[key] = (process, obj, folder)
    for args in finished:
        _finish(*args)


def _finish(key: str, process: subprocess.Popen[bytes], obj: Path,
            folder: Folder) -> bytes | None:
    try:
        data = obj.read_bytes() if process.wait() == 0 else None
    except OSError:
        data = None
    finally:
        folder.cleanup()
    if data is not None:
        store(key, data)
    return data


def store(key: str, data: bytes) -> None:
    """Remember `data` under `key`, in memory (dropping the least recently used beyond
    MAX_BYTES) and on disk."""
    if len(data) > MAX_BYTES:
        return
    _remember(key, data)
    _disk_write(key, data)


def _remember(key: str, data: bytes) -> None:
    global _size
    with _lock:
        old = _objects.pop(key, None)
        _size += len(data) - (len(old) if old is not None else 0)
        _objects[key] = data
        while _size > MAX_BYTES:
            _key, dropped = _objects.popitem(last=False)
            _size -= len(dropped)


def clear() -> None:
    """Forget every object, in memory and on disk."""
    global _size
    with _lock:
        _objects.clear()
        _size = 0
    folder = _disk_folder()
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


_OFF = ("0", "off", "false", "no")  # KILN_CACHE's off-like values, as the compile cache's
_MAGIC = b"kiln-object-1\0"


def _disk_folder() -> Path | None:
    """Where objects are kept on disk; None when KILN_CACHE is off."""
    if os.environ.get("KILN_CACHE", "").strip().lower() in _OFF:
        return None
    root = os.environ.get("KILN_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "kiln")
    return Path(root) / "objects"


def _disk_read(key: str) -> bytes | None:
    folder = _disk_folder()
    if folder is None:
        return None
    try:
        raw = (folder / key[:2] / key).read_bytes()
    except OSError:
        return None
    head = len(_MAGIC) + 32
    data = raw[head:]
    if raw[:len(_MAGIC)] != _MAGIC or hashlib.sha256(data).digest() != raw[len(_MAGIC):head]:
        return None  # damaged or another format: compiled again (and rewritten)
    return data


def _disk_write(key: str, data: bytes) -> None:
    folder = _disk_folder()
    if folder is None:
        return
    try:
        (folder / key[:2]).mkdir(parents=True, exist_ok=True)
        # written aside, then renamed: a reader sees no object or a whole one
        tmp = folder / key[:2] / f".{key}.{os.getpid()}.{threading.get_ident()}"
        tmp.write_bytes(_MAGIC + hashlib.sha256(data).digest() + data)
        os.replace(tmp, folder / key[:2] / key)
    except OSError:  # a read-only or full disk: memory only
        pass


__all__ = ["MAX_BYTES", "clear", "lookup", "object_key", "start", "started", "store"]

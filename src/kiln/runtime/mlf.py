"""Read a Model Library Format archive back, build it for this machine, run it.

    model = kiln.mlf.load("model.mlf.tar")     # kiln.runtime.mlf.load: the same function
    (y,) = model(x)

Part of the runtime: it needs numpy and a C compiler, nothing of the compiler.

`load` extracts the archive through `kiln.artifact.safe_tar` (regular files
and directories only, no absolute paths or `..`, bounded member count and
sizes), checks `metadata.json` against `METADATA_SCHEMA` and, before
anything is compiled, the SHA-256s its `checksums` record (of every member
and of metadata.json itself; an archive of a version before 3 has none and
gets an `UncheckedArchiveWarning`) and the SHA-256 of every weight its
`parameters` record (kiln.runtime.mlf_parameters: a damaged weight is refused
by name; a version-3 archive records none and gets an
`UncheckedParametersWarning`); `extract_checked` does this much alone),
compiles the sources with the flags the metadata lists plus `-fPIC`, links them with the
objects and the parameters into a shared library in a temporary directory,
and then **checks metadata.json against the compiled code before trusting
it**: the buffers `MLFModel` allocates are sized from metadata.json, and a
wrong size there is a heap overflow. The compiled code carries its own
description: the library metadata of `{prefix}_metadata()` (main's
parameters and results: names, shapes, dtypes) and the constants of the
generated header `<model>.h` (`<MODEL>_WORKSPACE_BYTES`, the input and
output counts and byte sizes), which `load` compiles into a small probe next
to the archive's sources. Any difference is a FormatError naming the field.
Calls refuse inputs of another dtype or shape with CallError (never a silent
cast). The C compiler is `$CC` or `cc`.

An MLF archive is code: building and loading it runs the compiler with the
archive's flags and then the archive's code (docs/security.md).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import shutil
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.artifact import safe_tar
from kiln.artifact.integrity import (
    DIGEST_SIZE,
    MAX_CHUNK_SIZE,
    MIN_CHUNK_SIZE,
    chunk_count,
    stream_digests,
)
from kiln.artifact.library_schema import DTYPE, NAME, check_library_metadata
from kiln.artifact.schema import (
    Anything,
    Enum,
    Int,
    ListOf,
    MapOf,
    Obj,
    Str,
    check,
    identifier,
    parse,
)
from kiln.errors import ArgumentTypeError, CallError, FormatError, MissingFileError, shown
from kiln.runtime import native, object_cache
from kiln.runtime.mlf_parameters import PARAMETERS_SCHEMA, PARAMETERS_SINCE, check_parameters
from kiln.runtime.native import reads_other_files
from kiln.runtime.private_dirs import make_private_dir, remove_private_dir

# 1: weights as a C array; 2: weights as binary assembled by parameters/<model>_params.S,
# the allocator in runtime/src/kiln_mlf.c; 3: `checksums` of every member and of
# metadata.json; 4: `parameters`, each weight's place and SHA-256 (the writer's changelog:
# kiln/export/mlf.py, MLF_VERSION). The reader builds them all the same way: compile
# every listed source with its flags.
READ_VERSIONS = (1, 2, 3, 4)
# From this version on metadata.json must carry `checksums`.
CHECKSUMS_SINCE = 3
# A firmware model's workspace; more than this is not a Model Library Format archive
# kiln wrote (and numpy would fail to allocate it).
MAX_WORKSPACE_BYTES = 1 << 40

# A path inside the archive: relative, no `..`, no odd characters.
_MEMBER_PATH = Str(r"(?!(.*/)?\.\.(/|$))[A-Za-z0-9_.+-]+(/[A-Za-z0-9_.+-]+)*", 1024,
                   "a relative path inside the archive")
_TENSOR = Obj(required={"name": NAME, "shape": ListOf(Int(0), max_len=64), "dtype": DTYPE})
_SHA256 = Str(r"[0-9a-f]{64}", 64, "a SHA-256 as 64 lowercase hex digits")
# A member's chunk SHA-256s, concatenated (none for an empty member); a member is at most
# safe_tar.MAX_MEMBER_BYTES, so at most that many chunks of the smallest chunk size.
_CHUNK_SHA256 = Str(r"([0-9a-f]{64})*",
                    2 * DIGEST_SIZE * (safe_tar.MAX_MEMBER_BYTES // MIN_CHUNK_SIZE),
                    "chunk SHA-256s as lowercase hex")
CHECKSUMS_SCHEMA = Obj(required={
    "chunk_size": Int(MIN_CHUNK_SIZE, MAX_CHUNK_SIZE),
    "chunk_sha256": MapOf(_CHUNK_SHA256, key=_MEMBER_PATH, max_len=safe_tar.MAX_MEMBERS),
    "metadata_sha256": _SHA256})
METADATA_SCHEMA = Obj(
    required={
        "version": Enum(READ_VERSIONS),
        "model_name": Str(r"(?!kiln)[A-Za-z_][A-Za-z0-9_]*", 128,
                          "a C identifier not starting with 'kiln'"),
        "prefix": identifier(128),
        "inputs": ListOf(_TENSOR, max_len=1024),
        "outputs": ListOf(_TENSOR, max_len=1024, min_len=1),
        "memory": Obj(required={"main": Obj(required={
            "workspace_bytes": Int(0, MAX_WORKSPACE_BYTES), "constants_bytes": Int(0),
            "io_bytes": Int(0)})}),
        "build": Obj(required={
            "cflags": MapOf(ListOf(Str(r"-\S+", 4096, "a compiler flag"), max_len=256),
                            key=_MEMBER_PATH, max_len=1024),
            "include_dirs": ListOf(_MEMBER_PATH, max_len=64),
            "libs": ListOf(Str(r"-l[A-Za-z0-9_.+-]+", 256, "a -l<library> flag"),
                           max_len=64)}),
    },
    # `checksums` is required from version CHECKSUMS_SINCE on, `parameters` from
    # PARAMETERS_SINCE on (read_metadata checks).
    optional={"kiln_version": Str(max_len=64), "export_datetime": Str(max_len=64),
              "target": Obj(extra=Anything()), "external_dependencies": ListOf(Anything()),
              "checksums": CHECKSUMS_SCHEMA, "parameters": PARAMETERS_SCHEMA},
    # A newer writer may add keys; nothing here reads them.
    extra=Anything())

PROBE_SYMBOL = "kiln_mlf_probe"


class UncheckedArchiveWarning(UserWarning):
    """An MLF archive written before version 3 records no checksums: `load` cannot tell
    damaged weights or sources from good ones. Re-export it with this kiln."""


class UncheckedParametersWarning(UncheckedArchiveWarning):
    """An MLF archive of version 3 records the checksum of its parameters file as a whole
    but no SHA-256 per weight: damage is still refused, without the weight's name.
    Re-export it with this kiln."""


def _extract(path: Path, into: Path) -> None:
    where = f"{path}: Model Library Format archive"
    # Each path extracted so far (a member, or a folder above one) -> (is a folder, the
    # member that made it), so that a member below a file is named, not an OSError.
    made: dict[str, tuple[bool, str]] = {}
    for member, data in safe_tar.members(path, where, dot_prefix=True):
        _claim(made, member, where)
        target = into.joinpath(*member.name.split("/"))
        try:
            if data is None:
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "xb") as out:
                shutil.copyfileobj(data, out)
            size = target.stat().st_size
        except OSError as err:
            raise FormatError(f"{where}: member '{member.name}' cannot be extracted "
                              f"({err.strerror or err})") from None
        if size != member.size:
            raise FormatError(f"{where}: member '{member.name}' is truncated")


def _claim(made: dict[str, tuple[bool, str]], member: safe_tar.Member, where: str) -> None:
    """Record `member` and the folders above it in `made`; FormatError naming both members
    when it lies below a file, is a file where a folder is, or comes twice."""
    parts = member.name.split("/")
    for depth in range(1, len(parts)):
        folder = "/".join(parts[:depth])
        is_dir, owner = made.setdefault(folder, (True, member.name))
        if not is_dir:
            raise FormatError(f"{where}: member '{member.name}' lies below member '{owner}', "
                              "which is a file")
    if member.name not in made:
        made[member.name] = (member.is_dir, member.name)
        return
    is_dir, owner = made[member.name]
    if is_dir and member.is_dir:
        return
    if is_dir and owner != member.name:
        raise FormatError(f"{where}: member '{member.name}' is a file, but member '{owner}' "
                          "lies below it")
    if is_dir or member.is_dir:
        raise FormatError(f"{where}: member '{member.name}' appears twice, as a file and as "
                          "a folder")
    raise FormatError(f"{where}: member '{member.name}' appears more than once")


def read_metadata(text: bytes, where: str) -> dict[str, Any]:
    """metadata.json checked against METADATA_SCHEMA (FormatError naming the JSON path)."""
    if len(text) > safe_tar.MAX_JSON_BYTES:
        raise FormatError(f"{where}: {len(text)} bytes, over the "
                          f"{safe_tar.MAX_JSON_BYTES}-byte limit")
    meta: dict[str, Any] = parse(text, Obj(extra=Anything()), where)
    version = meta.get("version")
    if version not in READ_VERSIONS or isinstance(version, bool):
        raise FormatError(f"{where}: Model Library Format version {json.dumps(version)[:40]} "
                          f"is not one this kiln reads ({', '.join(map(str, READ_VERSIONS))})")
    check(METADATA_SCHEMA, meta, where)
    if version >= CHECKSUMS_SINCE and "checksums" not in meta:
        raise FormatError(f"{where}: checksums: missing (a version-{version} archive records "
                          "the SHA-256 of every file; this one is damaged)")
    if version >= PARAMETERS_SINCE and "parameters" not in meta:
        raise FormatError(f"{where}: parameters: missing (a version-{version} archive records "
                          "the SHA-256 of every weight; this one is damaged)")
    return meta


def _metadata(root: Path, path: Path) -> dict[str, Any]:
    where = f"{path}: metadata.json"
    try:
        text = (root / "metadata.json").read_bytes()
    except OSError:
        raise FormatError(f"{where}: missing (not a Model Library Format archive, or its tar "
                          "is damaged before metadata.json)") from None
    return read_metadata(text, where)


def metadata_digest(meta: dict[str, Any]) -> str:
    """The SHA-256 (hex) that `checksums.metadata_sha256` records: of metadata.json's
    content without that field, as canonical JSON (sorted keys, no spaces, ASCII), so it
    does not depend on how the file is laid out."""
    body = dict(meta)
    if isinstance(body.get("checksums"), dict):
        body["checksums"] = {k: v for k, v in body["checksums"].items()
                             if k != "metadata_sha256"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def _check_checksums(meta: dict[str, Any], root: Path, archive: Path) -> None:
    """FormatError unless metadata.json and every member match `checksums`; an archive
    without them gets an UncheckedArchiveWarning (shown at the caller of `load` or
    `extract_checked`, three frames up)."""
    checksums = meta.get("checksums")
    if checksums is None:
        warnings.warn(f"{archive}: Model Library Format version {meta['version']} archive "
                      "has no content checksums, so damage to its weights or sources cannot "
                      "be detected; re-export it with this kiln (version "
                      f"{CHECKSUMS_SINCE} and later record them)", UncheckedArchiveWarning,
                      stacklevel=4)
        return
    found = metadata_digest(meta)
    if found != checksums["metadata_sha256"]:
        raise FormatError(f"{archive}: metadata.json is damaged: expected SHA-256 "
                          f"{checksums['metadata_sha256']} (checksums.metadata_sha256), "
                          f"found {found}")
    if "parameters" in meta:  # first: a damaged weight is named, not only its file
        check_parameters(meta, root, archive)
    else:
        warnings.warn(f"{archive}: Model Library Format version {meta['version']} archive "
                      "has no per-tensor checksums of its parameters: damage to a weight is "
                      "refused without its name; re-export it with this kiln (version "
                      f"{PARAMETERS_SINCE} and later record them)", UncheckedParametersWarning,
                      stacklevel=4)
    where = f"{archive}: Model Library Format archive"
    listed = checksums["chunk_sha256"]
    held = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    for member in sorted(held - {"metadata.json"} - set(listed)):
        raise FormatError(f"{where}: member '{member}' has no checksum in metadata.json "
                          "(checksums.chunk_sha256): the archive is damaged or was changed "
                          "after export")
    for member, expected in sorted(listed.items()):
        if member not in held:
            raise FormatError(f"{where}: metadata.json's checksums.chunk_sha256 lists "
                              f"'{member}', which is not in the archive (damaged or "
                              "truncated)")
        _check_member(root / member, member, expected, checksums["chunk_size"], where)


def _check_member(path: Path, member: str, expected: str, chunk_size: int, where: str
                  ) -> None:
    """FormatError naming `member`, the damaged byte range and both digests unless the
    file's chunk SHA-256s are `expected` (hex)."""
    with open(path, "rb") as f:  # read in 1 MiB pieces, whatever the chunk size
        found = stream_digests(iter(lambda: f.read(1 << 20), b""), chunk_size).hex()
    if found == expected:
        return
    size = path.stat().st_size
    step = 2 * DIGEST_SIZE
    if len(found) != len(expected):
        raise FormatError(f"{where}: member '{member}' is damaged: it holds {size} bytes "
                          f"({chunk_count(size, chunk_size)} chunks of {chunk_size}), "
                          f"metadata.json records {len(expected) // step} chunk SHA-256s")
    first = next(i for i in range(0, len(found), step)
                 if found[i:i + step] != expected[i:i + step])
    start = first // step * chunk_size
    span = f" in bytes [{start}, {min(start + chunk_size, size)})" if size > chunk_size else ""
    raise FormatError(f"{where}: member '{member}' is damaged{span}: expected SHA-256 "
                      f"{expected[first:first + step]} (metadata.json, checksums.chunk_sha256),"
                      f" found {found[first:first + step]}")


def _check_members(meta: dict[str, Any], root: Path, archive: Path) -> None:
    """FormatError unless the files metadata.json names for its model are in the archive."""
    name = meta["model_name"]
    where = f"{archive}: metadata.json"
    for member in (f"codegen/host/include/{name}.h", f"codegen/host/src/{name}_mlf.c"):
        if not (root / member).is_file():
            raise FormatError(f"{where}: model_name is {name!r}, but the archive has no "
                              f"{member}")
    if f"codegen/host/src/{name}_mlf.c" not in meta["build"]["cflags"]:
        raise FormatError(f"{where}: build.cflags does not list codegen/host/src/{name}_mlf.c, "
                          "the model's C interface")
    for member in meta["build"]["cflags"]:
        if not (root / member).is_file():
            raise FormatError(f"{where}: build.cflags lists {member!r}, which is not in the "
                              "archive")
    # A source left out of the build would only show as an undefined symbol at link time.
    for folder in ("codegen/host/src", "parameters", "runtime/src"):
        sources = [*(root / folder).glob("*.c"), *(root / folder).glob("*.S")]
        for source in sorted(sources):
            member = f"{folder}/{source.name}"
            if member not in meta["build"]["cflags"]:
                raise FormatError(f"{where}: build.cflags does not list {member}, which the "
                                  "archive holds")


def _nbytes(spec: dict[str, Any]) -> int:
    return math.prod(spec["shape"]) * _numpy_dtype(spec).itemsize


def _numpy_dtype(spec: dict[str, Any]) -> np.dtype[Any]:
    try:
        return np.dtype(spec["dtype"])
    except TypeError:
        raise FormatError(f"tensor '{spec['name']}': dtype {spec['dtype']!r} is not one "
                          "numpy knows") from None


def probe_source(meta: dict[str, Any]) -> str:
    """C that exports the header's constants as `uint64_t kiln_mlf_probe[]`: the workspace,
    the input and output counts, then each input's and output's byte size (a macro the
    header lacks reads as UINT64_MAX, which no check accepts)."""
    names = _probe_macros(meta)
    values = [f"#ifdef {n}\n  (uint64_t)({n}),\n#else\n  UINT64_MAX,\n#endif" for n in names]
    return "\n".join([
        "/* Written by kiln.mlf.load: what the archive's header tells the compiled code. */",
        "#include <stdint.h>", f'#include "{meta["model_name"]}.h"',
        f"const uint64_t {PROBE_SYMBOL}[{len(names)}] = {{", *values, "};", ""])


def _expected_probe(meta: dict[str, Any]) -> list[tuple[str, int]]:
    """(field of metadata.json, value) in the probe's order."""
    ins, outs = meta["inputs"], meta["outputs"]
    return [("memory.main.workspace_bytes", meta["memory"]["main"]["workspace_bytes"]),
            ("inputs (count)", len(ins)), ("outputs (count)", len(outs)),
            *((f"inputs[{i}] (bytes)", _nbytes(p)) for i, p in enumerate(ins)),
            *((f"outputs[{i}] (bytes)", _nbytes(p)) for i, p in enumerate(outs))]


def _symbol(lib: ctypes.CDLL, name: str, where: str) -> Any:
    try:
        return getattr(lib, name)
    except AttributeError:
        raise FormatError(f"{where}: the compiled code has no symbol '{name}' "
                          "(metadata.json names a model or prefix the archive does not "
                          "build)") from None


def verify(lib: ctypes.CDLL, meta: dict[str, Any], root: Path, where: str) -> None:
    """FormatError unless metadata.json agrees with what the compiled code says of itself."""
    read = _symbol(lib, f"{meta['prefix']}_metadata", where)
    read.restype = ctypes.c_char_p
    lib_where = f"{where}: the library metadata of {meta['prefix']}_metadata()"
    raw = read()
    library = check_library_metadata(parse(raw or b"", Obj(extra=Anything()), lib_where),
                                     lib_where)
    if library.get("prefix") not in (None, meta["prefix"]):
        raise FormatError(f"{where}: prefix is {meta['prefix']!r}, the compiled code's is "
                          f"{library.get('prefix')!r}")
    main = (library.get("functions") or {}).get("main")
    if main is None:
        raise FormatError(f"{lib_where}: no function 'main'")
    for role, key in (("inputs", "params"), ("outputs", "results")):
        compiled = [{"name": p.get("name"), "shape": p.get("shape"), "dtype": p.get("dtype")}
                    for p in main.get(key, [])]
        _compare(meta[role], compiled, role, where)
    _symbol(lib, PROBE_SYMBOL, where)
    expected = _expected_probe(meta)
    values = (ctypes.c_uint64 * len(expected)).in_dll(lib, PROBE_SYMBOL)
    header = f"codegen/host/include/{meta['model_name']}.h"
    for (field, want), got, macro in zip(expected, values, _probe_macros(meta)):
        if got != want:
            shown = "undefined" if got == 2**64 - 1 else got
            raise FormatError(f"{where}: {field} is {want}, but the compiled code has "
                              f"{macro} = {shown} ({header})")
    consts = root / "parameters" / f"{meta['model_name']}.params"
    size = consts.stat().st_size if consts.is_file() else None
    if size != meta["memory"]["main"]["constants_bytes"]:
        raise FormatError(f"{where}: memory.main.constants_bytes is "
                          f"{meta['memory']['main']['constants_bytes']}, but "
                          f"parameters/{meta['model_name']}.params holds {size} bytes")
    io_bytes = sum(_nbytes(p) for p in [*meta["inputs"], *meta["outputs"]])
    if io_bytes != meta["memory"]["main"]["io_bytes"]:
        raise FormatError(f"{where}: memory.main.io_bytes is "
                          f"{meta['memory']['main']['io_bytes']}, but the inputs and outputs "
                          f"take {io_bytes} bytes")


def _probe_macros(meta: dict[str, Any]) -> list[str]:
    """The header's macros the probe reads, in order."""
    upper = meta["model_name"].upper()
    return [f"{upper}_WORKSPACE_BYTES", f"{upper}_NUM_INPUTS", f"{upper}_NUM_OUTPUTS",
            *(f"{upper}_INPUT{i}_BYTES" for i in range(len(meta["inputs"]))),
            *(f"{upper}_OUTPUT{i}_BYTES" for i in range(len(meta["outputs"])))]


def _compare(listed: list[dict[str, Any]], compiled: list[dict[str, Any]], role: str,
             where: str) -> None:
    if len(listed) != len(compiled):
        raise FormatError(f"{where}: {role} lists {len(listed)} tensors, the compiled main "
                          f"has {len(compiled)}")
    for i, (mine, theirs) in enumerate(zip(listed, compiled)):
        for field in ("name", "dtype", "shape"):
            if mine[field] != theirs[field]:
                raise FormatError(f"{where}: {role}[{i}].{field} is "
                                  f"{json.dumps(mine[field])[:60]}, the compiled main has "
                                  f"{json.dumps(theirs[field])[:60]}")


class MLFModel:
    """A Model Library Format archive built for this machine: call it with the inputs.

    Built by `load`, which has checked `metadata` against the compiled code.
    """

    def __init__(self, library: Path, meta: dict[str, Any], workdir: str,
                 archive: str = "") -> None:
        self.metadata = meta
        # The build directory goes with the model, or at interpreter exit at the latest.
        self._remove_workdir = weakref.finalize(self, remove_private_dir, workdir)
        where = f"{archive or library}: metadata.json"
        try:
            self._lib = ctypes.CDLL(str(library))
        except OSError as exc:
            raise FormatError(f"{where}: the built library does not load: {exc}") from None
        verify(self._lib, meta, Path(workdir) / "mlf", where)
        self._run = _symbol(self._lib, f"{meta['model_name']}_run", where)
        self._run.restype = ctypes.c_int32
        self._error = _symbol(self._lib, f"{meta['prefix']}_last_error", where)
        self._error.restype = ctypes.c_char_p
        self._dtypes = [_numpy_dtype(p) for p in meta["inputs"]]
        self._out_dtypes = [_numpy_dtype(p) for p in meta["outputs"]]
        ws = meta["memory"]["main"]["workspace_bytes"]
        try:
            self._workspace = np.zeros(ws + 64, np.uint8)
        except MemoryError:
            raise FormatError(f"{where}: a workspace of {ws} bytes cannot be "
                              "allocated") from None

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        specs_in, specs_out = self.metadata["inputs"], self.metadata["outputs"]
        name = self.metadata["model_name"]
        if len(inputs) != len(specs_in):
            raise CallError(f"{name}: expected {len(specs_in)} inputs, got {len(inputs)}")
        args = []
        for x, spec, dtype in zip(inputs, specs_in, self._dtypes):
            arr = np.asarray(x)
            # No silent cast: a float64 array handed to a float32 model is the caller's bug.
            if arr.dtype != dtype:
                raise CallError(f"{name}: input {spec['name']!r}: expected dtype {dtype} "
                                f"(native byte order), got {arr.dtype.str}")
            if list(arr.shape) != list(spec["shape"]):
                raise CallError(f"{name}: input {spec['name']!r}: expected shape "
                                f"{spec['shape']}, got {list(arr.shape)}")
            args.append(np.ascontiguousarray(arr))
        try:
            outs = [np.empty(spec["shape"], dtype) for spec, dtype in zip(specs_out,
                                                                          self._out_dtypes)]
        except MemoryError:
            raise CallError(f"{name}: the outputs do not fit in memory") from None
        ws = self._workspace
        aligned = ws[-ws.ctypes.data % 64:]
        status = self._run(*(ctypes.c_void_p(a.ctypes.data) for a in [*args, *outs]),
                           ctypes.c_void_p(aligned.ctypes.data))
        if status != 0:
            raise CallError((self._error() or b"").decode("utf-8", "replace"))
        return outs

    def close(self) -> None:
        self._remove_workdir()


def _build_inputs(root: Path, workdir: str, build: dict[str, Any]) -> _BuildInputs | None:
    """What the compiles of an extracted archive read besides their command: every file
    of the archive but metadata.json (whose build flags are in each command). None (no
    reuse) when a flag may read files elsewhere or a file names metadata.json."""

    if any(reads_other_files(flags) for flags in build["cflags"].values()):
        return None
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        member = file.relative_to(root).as_posix()
        if member == "metadata.json":
            continue
        data = file.read_bytes()
        if b"metadata.json" in data:
            return None
        digest.update(member.encode("utf-8", "surrogateescape") + b"\0")
        digest.update(len(data).to_bytes(8, "little") + data)
    return _BuildInputs(digest.digest(), (str(root), workdir))


@dataclass(frozen=True)
class _BuildInputs:
    digest: bytes            # of every archive file the compiles may read
    roots: tuple[str, ...]   # the extraction and build directories (differ per load)


def _compile(inputs: _BuildInputs | None, cmd: list[str], src: Path, obj: Path,
             what: str) -> None:
    """Run the compile `cmd` of `src` into `obj`, or reuse the object this process built
    from the same command and archive files (kiln.runtime.object_cache)."""

    key = None if inputs is None else object_cache.object_key(
        cmd, inputs.digest + src.read_bytes(), str(src), str(obj), roots=inputs.roots)
    cached = None if key is None else object_cache.lookup(key)
    if cached is not None:
        obj.write_bytes(cached)
        return
    native.run(cmd, what)
    if key is not None:
        object_cache.store(key, obj.read_bytes())


def _unpack(archive: Path, root: Path) -> dict[str, Any]:
    _extract(archive, root)
    meta = _metadata(root, archive)
    _check_checksums(meta, root, archive)
    _check_members(meta, root, archive)
    return meta


def extract_checked(path: str | os.PathLike[str], into: str | os.PathLike[str]
                    ) -> dict[str, Any]:
    """Extract the archive at `path` into the empty folder `into` and check it as `load`
    does before it runs the compiler; return its checked metadata.json.

    Checked: the tar (`kiln.artifact.safe_tar`), metadata.json (`METADATA_SCHEMA`), the
    SHA-256s of metadata.json and of every member (`checksums`; an archive of a version
    before 3 has none and gets an `UncheckedArchiveWarning`), and the files metadata.json
    names. A FormatError names what is wrong. Files that pass are the exported bytes.
    """
    return _unpack(_path_argument(path, "path"), _path_argument(into, "into"))


def _path_argument(value: Any, name: str) -> Path:
    """`value` as a Path; ArgumentTypeError unless it is a str or PathLike without NUL."""
    if not isinstance(value, (str, os.PathLike)) or "\x00" in os.fsdecode(value):
        raise ArgumentTypeError(f"kiln.mlf.extract_checked: {name} must be a str or "
                                f"os.PathLike without NUL, got {shown(value, 80)}")
    return Path(os.fsdecode(value))


def load(path: str | os.PathLike[str], *, cc: str | None = None) -> MLFModel:
    """Extract, build for this machine, check and load a Model Library Format archive.

    FormatError for a damaged archive or a metadata.json that disagrees with the
    compiled code; CompileError if its sources do not build.
    """

    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"kiln.mlf.load: path must be a str or os.PathLike, got "
                                f"{type(path).__name__}")
    archive = Path(path)
    if "\x00" in str(archive):  # open() would raise ValueError
        raise MissingFileError(f"{str(archive)!r}: no such archive (its name holds a NUL)")
    workdir = make_private_dir("kiln-mlf-")
    try:
        root = Path(workdir) / "mlf"
        root.mkdir()
        meta = _unpack(archive, root)
        build = meta["build"]
        includes = [f"-I{root / d}" for d in build["include_dirs"]]
        build_inputs = _build_inputs(root, workdir, build)
        objects = [str(p) for p in sorted((root / "codegen/host/lib").glob("*.o"))]
        iface_flags: list[str] = []
        for member, flags in sorted(build["cflags"].items()):
            src = root / member
            if member == f"codegen/host/src/{meta['model_name']}_mlf.c":
                iface_flags = flags
            obj = Path(workdir) / (member.replace("/", "_") + ".o")
            _compile(build_inputs, [*native.cc_command(cc), *flags, "-fPIC", *includes, "-c",
                                    str(src), "-o", str(obj)], src, obj, f"compiling {member}")
            objects.append(str(obj))
        # The probe reads the header the interface was compiled with, with its flags.
        probe = Path(workdir) / "kiln_mlf_probe.c"
        probe.write_text(probe_source(meta))
        _compile(build_inputs, [*native.cc_command(cc), *iface_flags, "-fPIC",
                                f"-I{root / 'codegen/host/include'}", *includes, "-c",
                                str(probe), "-o", str(probe.with_suffix(".o"))],
                 probe, probe.with_suffix(".o"), "compiling the header probe")
        objects.append(str(probe.with_suffix(".o")))
        library = Path(workdir) / "model.so"
        native.run([*native.cc_command(cc), "-shared", "-o", str(library), *objects,
                    *build["libs"]], "linking the archive")
        return MLFModel(library, meta, workdir, str(archive))
    except BaseException:
        remove_private_dir(workdir)
        raise


__all__ = ["CHECKSUMS_SCHEMA", "CHECKSUMS_SINCE", "METADATA_SCHEMA", "MLFModel",
           "UncheckedArchiveWarning", "UncheckedParametersWarning", "extract_checked", "load",
           "metadata_digest", "probe_source", "read_metadata", "verify"]

"""How a session starts from an `.onnx` file: the compile cache, asked before the import.

The key is found from the file's bytes (a chunked SHA-256, hashed on several threads
from a read-only mapping; serialized bytes and an onnx.ModelProto's `SerializeToString()`
the same way, an IRModule by its structural fingerprint) and from everything else that
changes the library: the session options that reach the compiler (not the providers:
every session runs on the CPU), this machine's CPU (what LLVM resolves `host` from:
/proc/cpuinfo's identity and flags, `$KILN_HOST_CPU`), kiln's version and sources,
llvmlite's version, the C compiler and the `KILN_*` environment variables a compile
reads. A hit is the linked library
itself (kiln.driver.cache.store_library), checked byte for byte and dlopen'ed where it
lies: no import, no pass, no link. Beside it the entry keeps what the session answers
from the model file (`get_modelmeta()`) and the external data files the model read,
with their hashes: a changed data file is a miss. A miss reads the model once
(kiln.frontend.onnx.importer.load_onnx), compiles, reporting its progress
(kiln.session.progress), links the library into the cache and loads it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import shutil
import time
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kiln import __version__
from kiln.artifact.integrity import CHUNK_SIZE, chunk_digests, tree_digest
from kiln.driver import cache
from kiln.errors import ArgumentTypeError, FormatError, MissingFileError, UsageError
from kiln.runtime.loading import load_shared_library
from kiln.runtime.module import LibraryModule
from kiln.runtime.private_dirs import make_private_dir, remove_private_dir
from kiln.session.node_arg import ModelMetadata, SessionOptions
from kiln.target.host import llvmlite_version

# 1 (2026-11-27): the first format: key fields below, entry metadata {"model",
# "external_data", "source"}.
# 2 (2026-11-27): providers and provider_options out of the key (every session
# compiles for the CPU; another provider falls back with a warning).
SESSION_CACHE_FORMAT = 2
# Options that change how the library runs, never what is compiled: out of the key.
RUNTIME_OPTIONS = frozenset({
    "intra_op_num_threads", "inter_op_num_threads", "progress", "_config",
    # onnxruntime's fields that kiln accepts and does not compile by (session_options.py)
    "graph_optimization_level", "execution_mode", "execution_order",
    "optimized_model_filepath", "profile_file_prefix", "log_severity_level",
    "log_verbosity_level", "logid", "enable_cpu_mem_arena", "enable_mem_pattern",
    "enable_mem_reuse", "use_deterministic_compute", "use_per_session_threads"})
# KILN_* variables read at run time or by the cache itself, never by a compile.
RUNTIME_VARIABLES = frozenset({
    "KILN_NUM_THREADS", "KILN_SPIN_US", "KILN_PIN_THREADS", "KILN_SERIAL_NS",
    "KILN_VERIFY_WEIGHTS", "KILN_SKIP_CPU_CHECK", "KILN_CACHE", "KILN_CACHE_DIR",
    "KILN_CACHE_MAX", "KILN_WORKSPACE_CACHE", "KILN_POOL_STATS", "KILN_MALLOC", "KILN_FREE",
})
# /proc/cpuinfo lines that differ between the cores of one CPU or from second to second.
_VOLATILE_CPU_KEYS = frozenset({"processor", "cpu mhz", "bogomips", "core id", "apicid",
                                "initial apicid", "physical id", "siblings", "cpu cores"})

# The cached libraries this process has loaded, by path: a second session of one model
# gets its own copy (a library's thread pool and settings are per loaded file).
_LOADED: dict[str, weakref.WeakSet[LibraryModule]] = {}


def file_digest(path: str | os.PathLike[str]) -> str:
    """The SHA-256 tree digest of a file's bytes (4 MiB chunks, hashed on several threads),
    or the one the cache remembers of this very file, unchanged since
    (kiln.driver.cache.remembered_digest)."""
    where = Path(os.path.abspath(path))
    before = os.stat(where)
    known = cache.remembered_digest(where, before)
    if known is not None:
        return known
    began = time.time()
    digest = tree_digest(cache.file_chunk_digests(where, before.st_size), before.st_size,
                         CHUNK_SIZE)
    if cache.stat_identity(os.stat(where)) == cache.stat_identity(before):
        cache.remember_digest(where, before, digest, began)
    return digest


def bytes_digest(data: bytes | bytearray) -> str:
    """The SHA-256 tree digest of `data`, as `file_digest` hashes a file of these bytes."""
    return tree_digest(chunk_digests(data, CHUNK_SIZE), len(data), CHUNK_SIZE)


def session_key(path: Path, options: SessionOptions) -> str:
    """The cache key of a session over the ONNX file at `path` (see the module docstring)."""
    return _key("onnx-session", file_digest(path), options)


def bytes_session_key(data: bytes | bytearray, options: SessionOptions) -> str:
    """The cache key of a session over serialized ONNX bytes (an onnx.ModelProto's:
    `SerializeToString()`). Another kind than a file's: a model in memory reads no
    external data from a folder, a file's entry may list some."""
    return _key("onnx-bytes-session", bytes_digest(data), options)


def module_session_key(mod: Any, options: SessionOptions) -> str:
    """The cache key of a session over an IRModule: its structural fingerprint
    (kiln.driver.fingerprint: every op, attribute, name hint and constant byte), exact
    and cheap beside a compile (one hash of the weights)."""
    from kiln.driver.fingerprint import (
        module_fingerprint,  # heavy: kiln.driver's IR walk, only for an IRModule
    )

    return _key("ir-session", module_fingerprint(mod), options)


def _key(kind: str, model_digest: str, options: SessionOptions) -> str:
    fields = {
        "format": SESSION_CACHE_FORMAT, "kind": kind, "model": model_digest,
        "options": _canonical({k: v for k, v in sorted(vars(options).items())
                               if k not in RUNTIME_OPTIONS}),
        "cpu": host_identity(), "kiln": __version__,
        "kiln_source": cache.kiln_source_fingerprint(), "llvmlite": llvmlite_version(),
        "cc": _compiler_identity(), "env": compile_environment()}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _canonical(value: Any) -> Any:
    """`value` as JSON that changes whenever it does (a repr holding an address only
    costs a miss, never a wrong hit)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return [type(value).__name__, value]
    if isinstance(value, range):
        return ["range", value.start, value.stop, value.step]
    if isinstance(value, Mapping):
        return ["map", sorted([str(k), _canonical(v)] for k, v in value.items())]
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [_canonical(v) for v in value]]
    return [f"{type(value).__module__}.{type(value).__qualname__}", repr(value)]


def host_identity() -> Any:
    """What LLVM resolves `host` from: this CPU's /proc/cpuinfo identity and flags and
    `$KILN_HOST_CPU` (read without llvmlite: a hit never imports the compiler); where
    /proc/cpuinfo cannot be read, the resolved target itself."""
    fields: dict[str, str] = {"machine": platform.machine(),
                              "host_cpu": os.environ.get("KILN_HOST_CPU", "").strip()}
    first = _first_cpu()
    if first is None:
        from kiln.target import Target  # heavy: llvmlite, only without /proc/cpuinfo

        fields["target"] = Target.from_host().fingerprint()
    else:
        fields.update(first)
    return fields


@functools.cache
def _first_cpu() -> dict[str, str] | None:
    """The first CPU's block of /proc/cpuinfo without the lines that change by core or
    by second; None when there is none. Read once per process, and only that block (on
    a machine of hundreds of cores the whole file takes a while to generate)."""
    text = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            while "\n\n" not in text:
                piece = f.read(4096)
                if not piece:
                    break
                text += piece
    except OSError:
        return None
    fields = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        name, _, value = line.partition(":")
        if name.strip().lower() not in _VOLATILE_CPU_KEYS:
            fields[name.strip()] = " ".join(value.split())
    return fields or None


def compile_environment() -> dict[str, str]:
    """The KILN_* environment variables a compile may read (all but the run-time ones)."""
    return {k: v for k, v in sorted(os.environ.items())
            if k.startswith("KILN_") and k not in RUNTIME_VARIABLES}


def _compiler_identity() -> str:
    """The C compiler that links the library: $CC or cc, its resolved path, size, mtime."""
    program = (os.environ.get("CC") or "cc").split()[0]
    found = shutil.which(program)
    if found is None:
        return program
    st = os.stat(os.path.realpath(found))
    return f"{os.path.realpath(found)}\0{st.st_size}\0{st.st_mtime_ns}"


# ------------------------------------------------------------------ hit

def cached_session(key: str, path: Path | None, threads: int) -> tuple[LibraryModule,
                                                                         ModelMetadata] | None:
    """The library and metadata of a hit on `key` (the ONNX file at `path`; None: bytes
    or a proto in memory), or None."""
    hit = cache.lookup_library(key)
    if hit is None:
        return None
    meta = hit.metadata
    try:
        external = meta.get("external_data", [])
        if external and (path is None or not _external_data_unchanged(external, path.parent)):
            return None
        model = ModelMetadata(**meta["model"])
        return load_cached(hit.path, threads, hashed=hit.hashed), model
    except (FormatError, OSError, KeyError, TypeError) as exc:
        cache.STATS.errors += 1
        _refuse(f"cache entry {key} for {_shown_name(path)} cannot be used ({exc})")
        return None


def _shown_name(source: Any) -> str:
    """How progress and warnings name a session's model: a file by its name."""
    if isinstance(source, Path):
        return source.name
    if isinstance(source, (bytes, bytearray)) or source is None:
        return "the model bytes"
    if type(source).__name__ == "IRModule":
        return "the IRModule"
    return f"the ONNX ModelProto {getattr(source.graph, 'name', '')!r}"


def _refuse(message: str) -> None:
    warnings.warn(f"kiln compile cache: {message}; compiling instead", cache.CacheWarning,
                  stacklevel=4)


def _external_data_unchanged(files: Sequence[Mapping[str, Any]], folder: Path) -> bool:
    """Whether every external data file the model read still holds the same bytes."""
    for item in files:
        where = folder / str(item["location"])
        try:
            if where.stat().st_size != item["size"] or file_digest(where) != item["sha256"]:
                return False
        except OSError:
            return False
    return True


def load_cached(library: Path, threads: int, *, hashed: bool = True) -> LibraryModule:
    """dlopen a checked library of the cache, or a private copy of it when this process
    has it open already (a session's thread settings are its library's). Its weights are
    checked as any library's (lazily by default, kiln.runtime.weights) unless every byte
    of it was `hashed` just now."""
    name = str(library)
    live = [m for m in _LOADED.get(name, ()) if not m.closed]
    verify = False if hashed else None
    if not live:
        module = load_shared_library(library, verify_weights=verify,
                                     num_threads=threads or None)
        _LOADED.setdefault(name, weakref.WeakSet()).add(module)
        return module
    folder = make_private_dir("kiln-session-")
    try:
        copy = Path(folder) / "lib.so"
        shutil.copyfile(library, copy)
        return load_shared_library(copy, cleanup_dir=folder, verify_weights=verify,
                                   num_threads=threads or None)
    except BaseException:
        remove_private_dir(folder)
        raise


# ------------------------------------------------------------------ miss

def external_data_files(locations: Sequence[str], folder: Path) -> list[dict[str, Any]]:
    """The external data files a model reads (`locations`, under `folder`), each with
    its size and digest (what a hit checks again)."""
    out = []
    for location in locations:
        where = folder / location
        with_bytes = where.is_file()
        out.append({"location": location, "size": where.stat().st_size if with_bytes else -1,
                    "sha256": file_digest(where) if with_bytes else ""})
    return out


def entry_metadata(model_meta: ModelMetadata, external: list[dict[str, Any]],
                   source: str) -> dict[str, Any]:
    """What a session entry keeps beside its library (`source`: the model's name)."""
    return {"model": asdict(model_meta), "external_data": external, "source": source}


def require_file(path: Path) -> None:
    """MissingFileError when no ONNX model file is at `path`."""
    if not os.path.exists(path):  # os.path: a name too long to stat is absent, not an OSError
        raise MissingFileError(f"no ONNX model at {path}")


def compile_arguments(options: SessionOptions) -> dict[str, Any]:
    """The keyword arguments of `kiln.compile` that a session's options give: every
    compile a session makes (of a file, bytes or an IRModule) takes them."""
    return {"max_loop_iterations": options.max_loop_iterations,
            "profile": bool(options.enable_profiling)}  # timers for end_profiling()


def with_shape_dict(model: Any, options: SessionOptions) -> Any:
    """`model` (an ONNX file, its proto or an IRModule) imported with the options'
    `shape_dict` when one is given, else `model` as it is."""
    if options.shape_dict is None:
        return model
    if type(model).__name__ == "IRModule":
        raise UsageError("SessionOptions.shape_dict applies when the session imports an ONNX "
                         "model (a file or its bytes); an IRModule is imported already: pass "
                         "shape_dict to kiln.frontend.from_onnx")
    from kiln.frontend import from_onnx  # heavy: the ONNX front end, only to compile

    return from_onnx(model, _shape_dict(options))


def _shape_dict(options: SessionOptions) -> dict[str, Any] | None:
    """The options' `shape_dict` as `from_onnx` takes it (ArgumentTypeError when it is
    not a dict)."""
    shape_dict = options.shape_dict
    if shape_dict is None:
        return None
    if not isinstance(shape_dict, Mapping):
        raise ArgumentTypeError("SessionOptions.shape_dict must be a dict of pins and ranges "
                                f"or None, got {type(shape_dict).__name__}")
    return dict(shape_dict)


def compiled_session(source: Path | bytes | Any, key: str | None, options: SessionOptions,
                     threads: int, metadata_of: Any) -> tuple[Any, ModelMetadata]:
    """Compile `source` (the ONNX file at a path, serialized ONNX bytes, an
    onnx.ModelProto or an IRModule), read once, for `host` with its progress shown or reported
    (kiln.session.progress), link it (into the cache under `key`, unless None) and load
    it; the library and the model's metadata (`metadata_of(proto)`)."""
    from kiln.driver.compiler import (
        compile as compile_model,  # heavy: the compiler, only on a miss
    )
    from kiln.frontend import from_onnx  # heavy: the ONNX front end, only on a miss
    from kiln.session.progress import progress_for  # heavy: kiln.transform, only on a miss
    from kiln.transform.context import PassContext  # heavy: the compiler, only on a miss

    name = _shown_name(source)
    with progress_for(name, options) as progress:
        progress.stage("importing the ONNX model")
        model, proto, external = _read_once(source)  # FrontendError when it is not ONNX
        # before the import, which may fill the proto's data; an IRModule has none
        meta = ModelMetadata() if proto is None else metadata_of(proto)
        outer = PassContext.current()
        # The session's entry holds the weights (in its library): not the codegen's too.
        # The kernels still come from (and go to) the kernel cache: another model's
        # session, or this one's with other options, compiles only kernels it lacks.
        config = {**outer.config, "kiln.cache": False,
                  "kiln.kernel_cache": cache.kernel_cache_enabled(outer.config)} \
            if key is not None else outer.config
        with PassContext([*outer.instruments, progress], config, outer.disabled_passes):
            imported = model if proto is None else from_onnx(model, _shape_dict(options))
            ex = compile_model(imported, "host", **compile_arguments(options))
            if key is None:
                return ex.jit(), meta
            stored = entry_metadata(meta, external, name)
            return _link_and_store(ex, key, stored, threads), meta


def _read_once(source: Path | bytes | Any) -> tuple[Any, Any, list[dict[str, Any]]]:
    """What `from_onnx` imports of `source`, its onnx.ModelProto (for the metadata) and
    the external data files it read (a file's, each with its digest): the model's bytes
    parsed once. An IRModule is imported already: itself, no proto, no files."""
    from kiln.frontend.onnx.importer import (  # heavy: the ONNX front end, only on a miss
        load_onnx,
        parse_onnx,
    )

    if isinstance(source, Path):
        loaded = load_onnx(source)
        return loaded, loaded.proto, external_data_files(loaded.external_data, source.parent)
    if isinstance(source, (bytes, bytearray)):
        proto = parse_onnx(source)
        return proto, proto, []
    if type(source).__name__ == "IRModule":
        return source, None, []
    return source, source, []


def _link_and_store(ex: Any, key: str, metadata: dict[str, Any], threads: int) -> Any:
    """Link `ex` into the cache as the entry of `key` and load it from there; linked
    into a private directory and loaded when the cache cannot take it."""
    staging = cache.staging_dir()
    if staging is None:
        return ex.jit()
    try:
        linked = staging / cache.LIBRARY_FILE
        ex.export_library(linked)
        stored = cache.store_library(key, linked, metadata)
        if stored is None:  # the cache refused it: load it from the staging directory
            module = load_shared_library(linked, cleanup_dir=str(staging),
                                         verify_weights=False, num_threads=threads or None)
            staging = None  # removed with the module
            return module
        return load_cached(stored, threads)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)

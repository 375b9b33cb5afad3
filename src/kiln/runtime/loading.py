"""The code-loading process: ArtifactSet or library file -> runtime Module tree.

There is one path (docs/runtime.md):

1. `load_artifacts` links every "native" artifact into one real shared library
   with the system toolchain -- by calling `export_library` to a private
   directory, the very function that writes deployable `.so` files -- and then
   loads that file with `load_module`. `Executable.jit()` therefore runs what
   deploys.
2. `load_module(".so")` dlopens the library (a `LibraryModule`, the root), reads
   the embedded blob from the mapped `{prefix}_blob` symbol, hands every other
   loader group to its registered loader, and imports the results into the root
   following the blob's import tree.
3. `load_module(".tar")` reads the archive and runs step 1.

Without native artifacts the root is an empty `HostModule`. In-memory
artifacts (a JIT engine, a Python callable) cannot go through a file; they are
handed to their loader directly and imported into the root.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import shutil
import tempfile
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from kiln.artifact.archive import read_tar
from kiln.artifact.artifact import NATIVE, NONE, AnyArtifact, Artifact, ArtifactSet
from kiln.artifact.blob import HEADER_SIZE, BlobContents, blob_length, unpack
from kiln.artifact.elf import host_machine, machine_name
from kiln.errors import ArgumentTypeError, FormatError, MissingFileError, UsageError
from kiln.runtime import jit_constants
from kiln.runtime.blob_view import BlobView
from kiln.runtime.cpu_features import check_library
from kiln.runtime.dynsym import BlobSymbol, find_blob_symbol
from kiln.runtime.external_weights import attach, file_check, lent_chunks
from kiln.runtime.gathered_pages import GatheredPages, gathered_in_blob
from kiln.runtime.large_folios import reread_small_folios
from kiln.runtime.library import export_library
from kiln.runtime.loaders import LoadContext, run_loader
from kiln.runtime.memory_library import memory_file
from kiln.runtime.module import HostModule, LibraryModule, Module
from kiln.runtime.page_advice import advise_streamed
from kiln.runtime.private_dirs import make_private_dir, remove_private_dir
from kiln.runtime.shared_constants import BorrowingCheck, attach_table
from kiln.runtime.weights import CheckOnce, arm_check, check_weights

LIBRARY_SUFFIXES = (".so", ".tar")
# The next step for a file given where a library goes, by its suffix.
_NOT_A_LIBRARY = {
    ".onnx": (" (an .onnx model is compiled first: `kiln compile MODEL.onnx -o MODEL.so`, "
              "or opened with kiln.InferenceSession)"),
    ".npy": (" (a .npy array is an input, the library comes first: `kiln run MODEL.so "
             "--input NAME=FILE.npy`; an .onnx model is compiled first with `kiln compile`)"),
    ".npz": (" (a .npz holds inputs, the library comes first: `kiln run MODEL.so --inputs "
             "FILE.npz`; an .onnx model is compiled first with `kiln compile`)"),
}


def load_module(path: str | os.PathLike[str] | bytes | bytearray | memoryview | mmap.mmap,
                *, prefix: str | None = None,
                verify_weights: bool | str | None = None,
                num_threads: int | None = None, weights: Any = None) -> Module:
    """Load a library written by `export_library`: a `.so` or a `.tar`, or a `.so` in memory.

    `prefix` picks the library when one `.so` holds several kiln libraries.
    A damaged file or an unknown suffix raises FormatError. `verify_weights`
    says when a `.so`'s weights are checked against the hashes in its blob:
    "lazy" (before the first call; the default), True (now) or False (never,
    for trusted files); see kiln.runtime.weights. `num_threads` is the thread count of
    the library's parallel loops, the calling thread included (None: the process
    default, kiln.runtime.set_num_threads, else $KILN_NUM_THREADS, else one per CPU).

    A library exported with `weights="external"` maps its weights file: `weights`
    (a path) names it, else the file the library records, beside it; a file
    of other content, version or size raises FormatError (kiln.runtime.external_weights).
    `path` may also be the bytes of a `.so` (`bytes`, `bytearray`, `memoryview`,
    `mmap`): they are placed in an anonymous memory file (Linux `memfd_create`)
    that the dynamic loader maps; kiln.runtime.memory_library.
    """
    if isinstance(path, (bytes, bytearray, memoryview, mmap.mmap)):
        return load_from_memory(path, prefix=prefix, verify_weights=verify_weights,
                                num_threads=num_threads, weights=weights)
    p = _library_path(path)
    if prefix is not None and not isinstance(prefix, str):
        raise ArgumentTypeError(f"load_module: prefix must be a str or None, got "
                                f"{type(prefix).__name__}")
    suffix = p.suffix.lower()
    if suffix == ".tar":
        if weights is not None:
            raise UsageError(f"{p}: weights= applies to a .so exported with "
                             "weights='external', not to an archive")
        artifacts, metadata = read_tar(p)
        tar_prefix = metadata.get("prefix")
        if not isinstance(tar_prefix, str):
            raise FormatError(f"{p}: the archive's library metadata has no 'prefix'")
        return load_artifacts(artifacts, metadata=metadata, prefix=tar_prefix,
                              num_threads=num_threads)
    return load_shared_library(p, prefix=prefix, verify_weights=verify_weights,
                               num_threads=num_threads, weights=weights)


def load_from_memory(data: Any, *, prefix: str | None = None,
                     verify_weights: bool | str | None = None,
                     num_threads: int | None = None, weights: Any = None) -> LibraryModule:
    """`load_module` of a `.so` given as bytes (kiln.runtime.memory_library)."""
    fd, path = memory_file(data)
    try:
        root = load_shared_library(path, prefix=prefix, verify_weights=verify_weights,
                                   num_threads=num_threads, weights=weights)
    except BaseException:
        os.close(fd)
        raise
    weakref.finalize(root, os.close, fd)  # the memory file lives as long as the module
    return root


def _library_path(path: Any) -> Path:
    """`path` as the path of an existing library file, a KilnError naming it otherwise."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"load_module: path must be a str or os.PathLike, got "
                                f"{type(path).__name__}")
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in LIBRARY_SUFFIXES:
        raise FormatError(f"{p}: cannot load a {suffix or 'suffix-less'} file; kiln loads "
                          f"{' and '.join(LIBRARY_SUFFIXES)} files written by export_library"
                          f"{_NOT_A_LIBRARY.get(suffix, _NOT_A_LIBRARY['.onnx'])}")
    # os.path's tests: a name too long for the filesystem is absent, not an OSError
    if os.path.isdir(p):
        raise FormatError(f"{p}: is a directory, not a library file")
    if not os.path.isfile(p):
        raise MissingFileError(f"{p}: no such library file")
    return p


def load_artifacts(
    artifacts: Iterable[AnyArtifact], *, metadata: Mapping[str, Any], prefix: str,
    workspace_dir: str | os.PathLike[str] | None = None, cc: Any = None,
    fcompile: Any = None, num_threads: int | None = None,
) -> Module:
    """THE code-loading process over an ArtifactSet (see the module docstring).

    The native library is written to a fresh directory (inside `workspace_dir`
    if given, then kept; otherwise a temporary one removed when the module is
    closed or collected) so the loaded file stays on disk while it is mapped.
    `cc` and `fcompile` are passed to `export_library`; `num_threads` as in load_module.
    """
    arts = artifacts if isinstance(artifacts, ArtifactSet) else ArtifactSet(artifacts)
    stored = ArtifactSet(a for a in arts if a.serializable)
    in_memory = [a for a in arts if not a.serializable]
    meta = dict(metadata)

    if any(a.loader == NATIVE for a in stored):
        if workspace_dir is not None:
            Path(workspace_dir).mkdir(parents=True, exist_ok=True)
        load_dir = (make_private_dir("kiln-load-") if workspace_dir is None
                    else tempfile.mkdtemp(prefix="kiln-load-", dir=workspace_dir))
        try:
            so_path = Path(load_dir) / "lib.so"
            build_dir = Path(load_dir) / "build"
            # The constants the kernels can read where they lie are not written (a hole),
            # unless the library is kept (`workspace_dir`): a file to be used elsewhere.
            in_place = jit_constants.plan(list(stored), prefix) if workspace_dir is None \
                else None
            export_library(stored, meta, so_path, prefix=prefix, workspace_dir=build_dir, cc=cc,
                           fcompile=fcompile, weights_check=False,  # never checked, below
                           fill=None if in_place is None else in_place.fill)
            if workspace_dir is None:
                shutil.rmtree(build_dir, ignore_errors=True)
            # Just linked from artifacts in memory: nothing to check the weights against.
            root: Module = load_shared_library(
                so_path, prefix=prefix,
                cleanup_dir=load_dir if workspace_dir is None else None, verify_weights=False,
                num_threads=num_threads)
            if in_place is not None:
                try:
                    jit_constants.attach(root, in_place)
                except BaseException:
                    root.close()
                    raise
        except BaseException:
            if workspace_dir is None:
                remove_private_dir(load_dir)
            raise
    else:
        inspect_only = [a for a in stored if a.loader == NONE]
        root = HostModule(metadata=meta, artifacts=inspect_only)
        ctx = LoadContext(prefix, meta, root, _path_or_none(workspace_dir))
        try:
            for loader, group in stored.by_loader().items():
                if loader != NONE:
                    root.import_module(run_loader(loader, group, ctx))
        except BaseException:
            root.close()
            raise

    if in_memory:
        ctx = LoadContext(prefix, root.metadata, root, _path_or_none(workspace_dir))
        try:
            for loader, group in ArtifactSet(in_memory).by_loader().items():
                root.import_module(run_loader(loader, group, ctx))
        except BaseException:
            root.close()
            raise
    return root


def _path_or_none(path: str | os.PathLike[str] | None) -> Path | None:
    return Path(path) if path is not None else None


def load_shared_library(path: Path, *, prefix: str | None = None,
                        cleanup_dir: str | None = None,
                        verify_weights: bool | str | None = None,
                        num_threads: int | None = None, weights: Any = None) -> LibraryModule:
    """dlopen a kiln `.so`, unpack its blob, run its loader groups, build the tree.

    The prefix is the name of the library's one `{prefix}_blob` data symbol
    (found in the ELF dynamic symbol table, without running the file).
    `weights` as in load_module.
    """
    found = find_blob_symbol(str(path), prefix=prefix)
    symbol, lib_prefix = found.name, found.prefix
    _check_machine(found.machine, path)
    root = LibraryModule(path, lib_prefix, cleanup_dir=cleanup_dir, num_threads=num_threads)
    try:
        contents = _read_blob(root, found)
        blob_prefix = contents.metadata.get("prefix")
        if blob_prefix is not None and blob_prefix != lib_prefix:
            raise FormatError(f"{path}: blob symbol {symbol} belongs to prefix '{lib_prefix}' "
                              f"but the blob's metadata says '{blob_prefix}'")
        _check_cpu_features(root, contents, path)
        _build_tree(root, contents)
        address = ctypes.addressof(ctypes.c_uint8.in_dll(root.cdll, symbol))
        gathered = gathered_in_blob(contents, address, found.size, str(path))
        advise_streamed(address, found.size, gathered)  # before the check's first reads
        reread_small_folios(str(path), address, found.size, found.file_offset, gathered)
        delta = None if found.file_offset is None else address - found.file_offset
        check_weights(root, address, found.size, contents, verify_weights,
                      GatheredPages(gathered, str(path), delta))
        if "weights" in contents.metadata:  # exported with weights="external"
            root.weights = attach(root, contents.metadata["weights"], weights)
            check: CheckOnce = file_check(root, root.weights, contents.metadata)
            table = attach_table(root, root.weights, contents.metadata["weights"],
                                 list(contents.artifacts), lent_chunks(root))
            if table is not None and table.borrowed:
                check = BorrowingCheck(table, check)
            arm_check(root, check, verify_weights, keep=root.weights)  # holds the mapping
        elif weights is not None:
            raise UsageError(f"{path}: weights={weights!r} given, but the library's weights "
                             "are embedded in it")
    except BaseException:
        root.close()
        raise
    return root


def _check_machine(machine: int, path: Path) -> None:
    """A library for another instruction set cannot be dlopen'ed: say so before trying
    (the dynamic loader's own message is a misleading "No such file or directory")."""
    host = host_machine()
    if host is not None and machine != host:
        raise FormatError(
            f"{path}: built for {machine_name(machine)}, but this machine is "
            f"{machine_name(host)}; run it on {machine_name(machine)} hardware (or under "
            f"qemu-{machine_name(machine)} with that target's sysroot), or compile for this "
            "machine's target")


def _check_cpu_features(lib: LibraryModule, contents: BlobContents, path: Path) -> None:
    """Refuse native code needing CPU features this machine lacks, before any call: the
    library's own `{prefix}_cpu_missing` reads the CPU (kiln.runtime.cpu_features)."""
    required: list[str] = []
    triple = ""
    for art in contents.artifacts:
        meta = art.metadata
        if art.loader == NATIVE and isinstance(meta.get("requires_features"), (list, tuple)):
            required += [str(f) for f in meta["requires_features"]]
            triple = triple or str(meta.get("triple", ""))
    check_library(lib.cdll, lib.prefix, required, triple, path.name)


def _read_blob(lib: LibraryModule, found: BlobSymbol) -> BlobContents:
    """Unpack the blob of the library `lib`, `found` its blob symbol.

    The symbol's ELF size bounds what is read, whatever the (possibly damaged)
    blob header claims. The blob is read from the file through a mapping of its
    own (kiln.runtime.blob_view): the inspection artifacts stay views of it, and
    its pages, resident after the checksum, are handed back once it is unpacked.
    A blob whose place in the file is unknown is read from the loaded library
    and copied out, so nothing keeps pointing into it after dlclose.
    """
    symbol, size = found.name, found.size
    if size < HEADER_SIZE:
        raise FormatError(f"{lib.path}: blob symbol {symbol} is {size} bytes, smaller than "
                          f"a blob header ({HEADER_SIZE} bytes)")
    try:
        address = ctypes.addressof(ctypes.c_uint8.in_dll(lib.cdll, symbol))
    except ValueError as exc:  # ctypes: the dynamic loader's lookup failed
        raise FormatError(f"{lib.path}: the ELF symbol table lists {symbol}, but the dynamic "
                          f"loader cannot find it ({exc}); the file is damaged") from None
    try:
        length = blob_length(ctypes.string_at(address, HEADER_SIZE))
        if length > size:
            raise FormatError(f"blob header gives {length} bytes, but symbol {symbol} "
                              f"holds only {size}")
        if found.file_offset is not None and found.section_end is not None \
                and found.file_offset + length <= found.section_end:
            mapped = BlobView(lib.path, found.file_offset, length)
            try:
                return unpack(mapped.view, copy=False, skip=("graphs",))
            finally:
                mapped.drop()
        view = memoryview((ctypes.c_uint8 * length).from_address(address)).cast("B")
        try:
            return unpack(view)
        finally:
            view.release()
    except FormatError as exc:
        raise FormatError(f"{lib.path}: {exc}") from None


def _owned(artifacts: list[Artifact]) -> list[AnyArtifact]:
    """`artifacts` with contents of their own: a loader may keep them, whatever the
    lifetime of the blob's mapping they were read from."""
    return [replace(a, content=bytes(a.content)) if isinstance(a.content, memoryview) else a
            for a in artifacts]


def _build_tree(root: LibraryModule, contents: BlobContents) -> None:
    """Load modules 1.. with their loaders and import them following the CSR tree."""
    if contents.modules[0].artifacts and not root.has_native:
        raise FormatError(f"{root.path}: the blob lists native artifacts but the library "
                          f"exports no {root.prefix}_metadata; the file is damaged")
    items = list(contents.artifacts)
    inspect_only = [items[i] for m in contents.modules if m.loader == NONE for i in m.artifacts]
    root.artifacts = [*contents.module_artifacts(0), *inspect_only]
    if not root.metadata:
        root.metadata = dict(contents.metadata)
    else:
        # Known only after code generation (the dependencies) or after the passes (the
        # kernels a symbolic size left generic): the blob's metadata carries them.
        for key in ("external_dependencies", "generic_kernels"):
            if key in contents.metadata:
                root.metadata.setdefault(key, contents.metadata[key])

    loaded: dict[int, Module] = {0: root}
    ctx: LoadContext | None = None
    for index in range(1, len(contents.modules)):
        node = contents.modules[index]
        if node.loader == NONE:
            continue
        if ctx is None:
            ctx = LoadContext(root.prefix, root.metadata, root, None)
        group = _owned(contents.module_artifacts(index))
        loaded[index] = run_loader(node.loader, group, ctx)

    def import_children(parent: Module, index: int, seen: set[int]) -> None:
        for child in contents.children(index):
            if child in seen:
                continue
            seen.add(child)
            if child in loaded:
                if loaded[child] not in parent.imports:
                    parent.import_module(loaded[child])
            else:  # a skipped ("none") module: its children attach to the parent
                import_children(parent, child, seen)

    for index, module in loaded.items():
        import_children(module, index, {index})

"""export_library: an ArtifactSet as one deployable file (.so, .tar or .a).

- `.so`: the "native" code artifacts are compiled (kiln.runtime.native); one
  more object holds the blob (`{prefix}_blob`: the whole ArtifactSet minus the
  bytes already linked in, plus the import tree) and, right after it in the
  same read-only section, the native data artifacts (`.bin`: the weights, as
  `{prefix}_consts`). The blob's LINKED_DATA section records where each lies
  and the SHA-256 of each 4 MiB chunk, so `load_module` can check the weights
  (docs/format.md). Everything is linked with `cc -shared`; only the ABI
  symbols (docs/abi.md) are exported. Without native artifacts the `.so`
  holds just the blob, for the loaders.
- `.tar`: the artifact archive (kiln.artifact.archive), readable with `tar xf`.
- `.a`: the same objects as the `.so`, combined into one relocatable object
  whose only global symbols are the ABI symbols, archived with `ar`; next to
  it a header `<name>.h` declaring the prefixed entry points, so libraries with
  different `system_lib_prefix`es link into one C program.

Every output is written to a temporary file in the target directory and
renamed into place: a failed export leaves no partial file behind.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.artifact.archive import write_tar
from kiln.artifact.artifact import (
    NATIVE,
    AnyArtifact,
    Artifact,
    ArtifactSet,
    require_serializable,
)
from kiln.artifact.blob import build_contents, pack, place_linked
from kiln.artifact.elf import SHT_SYMTAB, find_blob_symbol, read_symbols
from kiln.artifact.integrity import CHUNK_SIZE, DIGEST_SIZE, chunk_count, chunk_digests
from kiln.artifact.segments import Content, write_content, write_content_in_blocks
from kiln.errors import ArgumentTypeError, CompileError, ExportError, UsageError
from kiln.escape import c_comment, is_c_identifier
from kiln.runtime import native
from kiln.runtime.data_object import (
    EM_X86_64,
    LARGE_PAGE_BYTES,
    DataSymbol,
    machine_of,
    write_data_object,
)
from kiln.runtime.external_weights import (
    SHARE_CHUNK,
    WEIGHTS_MODES,
    default_weights_path,
    export_weights,
    map_symbols,
)
from kiln.runtime.mapped_fill import fill_mapped
from kiln.runtime.private_dirs import make_private_dir, remove_private_dir
from kiln.runtime.threads import POOL_EXPORTS
from kiln.runtime.toolchain import default_compiler
from kiln.runtime.weights_check import check_artifact, check_symbols

SUFFIXES = {".so": "shared library", ".tar": "artifact archive",
            ".a": "static library + header"}
BLOB_ALIGN = 16
# Linked data at least this large (the weights of a model worth streaming) starts on the
# machine's large page (data_object.LARGE_PAGE_BYTES), so does its section, and the linker
# keeps the file offset congruent to the address: the kernel can map the weights with 2 MiB
# entries instead of 4 KiB ones (fewer TLB misses while a decode step streams them all).
# Tests lower it to take the path on a small model.
LARGE_PAGE_DATA_BYTES = 16 << 20

FCompile = Callable[[Path, list[Path], Sequence[str]], None]
# Writes the data a linked `.so` only reserved (the library, its LinkedData records).
FillData = Callable[[Path, Sequence["LinkedData"]], None]


def export_library(
    artifacts: Iterable[AnyArtifact], metadata: Mapping[str, Any],
    file_name: str | os.PathLike[str], *, prefix: str, fcompile: FCompile | None = None,
    workspace_dir: str | os.PathLike[str] | None = None, cc: Any = None,
    options: Sequence[str] | None = None, weights: str = "embedded",
    weights_path: str | os.PathLike[str] | None = None, weights_check: bool = True,
    fill: FillData | None = None,
) -> Path:
    """Write `artifacts` as the library `file_name`; the suffix picks the kind.

    `metadata` is the library metadata (docs/abi.md); `prefix` the
    `system_lib_prefix`. `cc` is the C compiler (default $CC, else the one the
    artifacts' target needs: kiln.runtime.toolchain), `options`
    extra flags for compiling C artifacts, `fcompile(out_path, objects,
    options)` replaces the `.so` link step. Intermediate files go to
    `workspace_dir` (kept) or a temporary directory (removed). An in-memory
    artifact raises ExportError, as does a `file_name` that is a directory or
    cannot be written; an unknown suffix raises UsageError.

    `weights="external"` (a `.so` only) writes the weights to a file of their own,
    `weights_path` (default `<file_name>.weights`), whose content hash the library
    records (kiln.runtime.external_weights, docs/format.md); "embedded" (the
    default) keeps them inside the library.

    `weights_check=False` leaves out the table of chunk hashes the weights are
    checked by (kiln.runtime.weights_check), for a library only this process loads
    without checking it (`Executable.jit()`); its weights cannot be checked.
    """
    if not isinstance(file_name, (str, os.PathLike)):
        raise ArgumentTypeError(f"export_library: file_name must be a str or os.PathLike, "
                                f"got {type(file_name).__name__}")
    path = Path(file_name)
    if path.is_dir():
        raise ExportError(f"cannot export to {os.fspath(path)!r}: it is a directory; give the "
                          f"library's file name, e.g. {os.fspath(path / 'model.so')!r}")
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        valid = ", ".join(f"{s} ({what})" for s, what in SUFFIXES.items())
        raise UsageError(f"cannot export to {path.name!r}: unknown suffix "
                         f"{suffix or '(none)'!r}; valid suffixes: {valid}")
    _check_prefix(prefix, metadata)
    arts = ArtifactSet(require_serializable(a) for a in artifacts)
    external = _weights_mode(weights, suffix, path, arts)
    if cc is None and not os.environ.get("CC") and suffix != ".tar":
        cc = default_compiler(arts)  # a cross compiler for another target
    if isinstance(options, str):
        options = shlex.split(options)
    _check_writable(path)
    if suffix == ".tar":
        write_tar(path, arts, metadata)
        return path

    native_arts = [a for a in arts if a.loader == NATIVE]
    if not native_arts and suffix == ".a":
        loaders = sorted({a.loader for a in arts}) or ["(no artifacts)"]
        raise ExportError(
            f"cannot export {path.name!r}: there is no native code to link into a static "
            f"library (artifact loaders: {', '.join(loaders)}); export a .so or .tar, whose "
            "blob carries these artifacts to their loaders")
    weights_file = _weights_file(external, native_arts, prefix, path, weights_path)
    with weights_file as outside, _workspace(workspace_dir) as work, _step("export"):
        code, metadata, extra_exports = _code_to_compile(native_arts, metadata, prefix, outside,
                                                         weights_check)
        with _step("export.compile"):
            objects = native.compile_native(code, work / "native", prefix=prefix, cc=cc,
                                            options=options)
        # A .so linked here gets its data written after the link (no second copy on disk).
        deferred: list[LinkedData] | None = [] if suffix == ".so" and fcompile is None \
            else None
        with _step("export.data"):
            objects.append(blob_object(arts, metadata, prefix, work, cc=cc, like=objects,
                                       deferred=deferred, embed_data=not external))
        # Without native code the library only carries the blob (for the loaders).
        exports = (abi_symbols(metadata, prefix) + native.native_exports(native_arts)
                   + extra_exports if native_arts else [f"{prefix}_blob"])
        _check_symbols(exports)
        if suffix == ".so":
            with _atomic(path, 0o755) as tmp, _step("export.link"):
                if fcompile is not None:
                    fcompile(tmp, objects, list(options or ()))
                else:
                    native.link_shared(objects, tmp, cc=cc, exports=exports,
                                       libs=native.native_libs(native_arts),
                                       options=LINK_OPTIONS)
                    if deferred:
                        if fill is not None:
                            fill(tmp, deferred)
                        else:
                            fill_linked_data(tmp, prefix, deferred)
        else:
            header = path.with_suffix(".h")
            with _atomic(path, 0o644) as tmp_a, _atomic(header, 0o644) as tmp_h:
                native.archive_static(objects, tmp_a, cc=cc, exports=exports, workdir=work,
                                      member=f"{path.stem}.o")
                tmp_h.write_text(static_header(metadata, prefix, header.name, path.name,
                                               native.native_libs(native_arts)))
    return path


def _code_to_compile(native_arts: Sequence[AnyArtifact], metadata: Mapping[str, Any],
                     prefix: str, outside: tuple[Artifact, dict[str, Any]] | None,
                     weights_check: bool
                     ) -> tuple[list[AnyArtifact], Mapping[str, Any], list[str]]:
    """The native code to compile: the artifacts', the loader of an external weights
    file (`outside`) and the weights' check (kiln.runtime.weights_check); the
    metadata with their records; the symbols they export besides the ABI's."""
    code: list[AnyArtifact] = [a for a in native_arts if a.extension != ".bin"]
    exports: list[str] = []
    if outside is not None:  # the weights go to their own file; a loader comes in
        code.append(outside[0])
        metadata = {**metadata, "weights": outside[1]}
        exports += map_symbols(prefix)
    with _step("export.check"):  # the chunk hashes the library checks its weights by
        checked = check_artifact([require_serializable(a) for a in native_arts
                                  if a.extension == ".bin"], prefix) if weights_check else None
    if checked is not None:
        code.extend(checked[0])
        metadata = {**metadata, "weights_check": checked[1]}
        exports += check_symbols(prefix)
    return code, metadata, exports


@contextlib.contextmanager
def _weights_file(external: bool, native_arts: Sequence[AnyArtifact], prefix: str, path: Path,
                  weights_path: str | os.PathLike[str] | None
                  ) -> Iterator[tuple[Artifact, dict[str, Any]] | None]:
    """With `external`, write the weights file (under a temporary name, renamed into
    place only when the library was written too) and give (its C loader artifact, the
    blob metadata entry); otherwise None."""
    if not external:
        yield None
        return
    target = Path(weights_path) if weights_path is not None else default_weights_path(path)
    _check_writable(target)
    data = [require_serializable(a) for a in native_arts if a.extension == ".bin"]
    with _atomic(target, 0o644) as tmp:
        yield export_weights([(a, SHARE_CHUNK, chunk_digests(a.content, SHARE_CHUNK))
                              for a in data], prefix, tmp, name=target.name)


def _weights_mode(weights: Any, suffix: str, path: Path, arts: ArtifactSet) -> bool:
    """Whether `weights` asks for an external weights file (UsageError if it cannot be)."""
    if weights not in WEIGHTS_MODES:
        raise UsageError(f"export_library: weights must be one of {', '.join(WEIGHTS_MODES)}, "
                         f"got {weights!r}")
    if weights == "embedded":
        return False
    if suffix != ".so":
        raise UsageError(f"cannot export {path.name!r} with weights='external': only a .so "
                         "maps a weights file; export a .so, or keep the weights embedded")
    if not any(a.loader == NATIVE and a.extension == ".bin" for a in arts):
        raise UsageError(f"cannot export {path.name!r} with weights='external': the library "
                         "has no weights (no native data artifact); keep weights='embedded'")
    return True


def _check_writable(path: Path) -> None:
    """Make `path`'s directory and try a file there, before any work: an ExportError
    naming `path` and the system's reason when the library could not be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(prefix=f".{path.name}.", suffix=".tmp",
                                         dir=path.parent):
            pass
    except OSError as exc:
        raise ExportError(f"cannot write {os.fspath(path)!r}: {exc.strerror or exc}; "
                          "export to a directory you can write") from exc


# Times the steps of export_library when set (`set_step_timer`); None: untimed.
_STEP_TIMER: list[Callable[[str], contextlib.AbstractContextManager[None]]] = []


def set_step_timer(timer: Callable[[str], contextlib.AbstractContextManager[None]] | None
                   ) -> None:
    """Have `timer(name)`, a context manager, time the steps of `export_library`
    ("export", "export.compile", "export.check", "export.data", "export.link"); None: time nothing.
    The compiler sets its instruments' timer when it is imported; the runtime alone
    (a deploy host) times nothing."""
    _STEP_TIMER[:] = [] if timer is None else [timer]


def _step(name: str) -> contextlib.AbstractContextManager[None]:
    """The timer of step `name` (`set_step_timer`), or nothing."""
    return _STEP_TIMER[0](name) if _STEP_TIMER else contextlib.nullcontext()


def _digests(a: Artifact) -> tuple[int, bytes]:
    """(chunk size, chunk SHA-256s) of a data artifact: from its metadata, else computed."""
    meta = a.metadata
    size, hexed = meta.get("chunk_size"), meta.get("chunk_sha256")
    if isinstance(size, int) and isinstance(hexed, str):
        with contextlib.suppress(ValueError):
            digests = bytes.fromhex(hexed)
            if len(digests) == chunk_count(a.size, size) * DIGEST_SIZE:
                return size, digests
    return CHUNK_SIZE, chunk_digests(a.content)


def _asm_path(path: Path) -> str:
    text = str(path.resolve())
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def blob_object(arts: ArtifactSet, metadata: Mapping[str, Any], prefix: str, work: Path, *,
                cc: Any = None, like: Sequence[Path] = (),
                deferred: list[LinkedData] | None = None, embed_data: bool = True) -> Path:
    """One object: `{prefix}_blob`, then the native data artifacts, in one section.

    The data (`.bin`, e.g. the weights) follows the blob at the offsets its
    LINKED_DATA section records; the blob symbol's size spans both, so the
    runtime reads the data within the symbol it found. When `like` holds a
    64-bit little-endian ELF object of the same library, the object is written
    directly (kiln.runtime.data_object: the weights hit the disk once);
    otherwise the assembler builds it with `.incbin`.

    With `deferred` (a list) and a directly written object, the data is not
    written at all: the object only reserves room for it (a NOBITS section,
    which the linker lays out as a hole of the library file) and `deferred`
    receives a LinkedData per artifact for `fill_linked_data` to write into
    the linked library: the weights reach the disk once, in the library.

    With `embed_data` False (external weights) the data artifacts stay stubs in
    the blob and are not placed: kiln_weights.c defines their symbols.
    """
    contents = build_contents(arts, metadata)
    data: list[tuple[int, Artifact]] = []
    align = BLOB_ALIGN
    for i, a in enumerate(arts):
        art = require_serializable(a)
        if art.loader != NATIVE or art.extension != ".bin" or not embed_data:
            continue
        symbol = art.metadata.get("symbol")
        if not isinstance(symbol, str) or not symbol.replace("_", "a").isidentifier():
            raise CompileError(f"{art.codegen_id}/{art.file_name}: a native .bin artifact "
                               "needs metadata['symbol'], a C identifier")
        a_align = int(art.metadata.get("align", native.DEFAULT_ALIGN))
        if a_align < 1 or a_align & (a_align - 1):
            raise CompileError(f"{art.codegen_id}/{art.file_name}: alignment {a_align} "
                               "is not a power of two")
        align = max(align, a_align)
        data.append((i, art))
    machine = next((m for o in like if (m := machine_of(o)) is not None), None)
    if machine is not None and sum(a.size for _i, a in data) >= LARGE_PAGE_DATA_BYTES:
        align = max(align, LARGE_PAGE_BYTES.get(machine.machine, align))
    contents, end = place_linked(
        contents, [(i, a.size, *_digests(a)) for i, a in data], align)
    packed = pack(contents)
    name = f"{prefix}_blob"
    end = max(end, len(packed))
    if machine is not None:
        obj = work / "blob.o"
        symbols = [DataSymbol(name, 0, end, hidden=False)]
        pieces: list[tuple[int, Content]] = [(0, packed)]
        for record, (_i, art) in zip(contents.linked, data):
            symbol = str(art.metadata["symbol"])
            symbols.append(DataSymbol(symbol, record.offset, record.length,
                                      hidden=not art.metadata.get("exported")))
            if deferred is None:
                pieces.append((record.offset, art.content))
            else:
                deferred.append(LinkedData(symbol, record.offset, art.content))
        reserved = -(-len(packed) // align) * align if deferred else None
        large = machine.machine == EM_X86_64 and any(a.metadata.get("large") for _i, a in data)
        write_data_object(obj, machine, f".{'l' if large else ''}rodata.{name}", align, pieces,
                          symbols, end, reserved_from=reserved, large=large)
        return obj
    blob_file = work / "blob.bin"
    blob_file.write_bytes(packed)
    lines = [f'\t.section .rodata.{name},"a",%progbits', f"\t.balign {align}",
             f"\t.globl {name}", f"\t.type {name},%object", f"{name}:",
             f"\t.incbin {_asm_path(blob_file)}"]
    pos = blob_file.stat().st_size
    for record, (i, art) in zip(contents.linked, data):
        data_file = work / f"data{i}.bin"
        with open(data_file, "wb") as f:
            write_content(f, art.content)
        symbol = str(art.metadata["symbol"])
        lines += [f"\t.skip {record.offset - pos}", f"\t.globl {symbol}",
                  *([] if art.metadata.get("exported") else [f"\t.hidden {symbol}"]),
                  f"\t.type {symbol},%object", f"{symbol}:",
                  f"\t.incbin {_asm_path(data_file)}", f"\t.size {symbol}, {record.length}"]
        pos = record.offset + record.length
    lines += [f"\t.size {name}, {end}", '\t.section .note.GNU-stack,"",%progbits', ""]
    stub = work / "blob.s"
    stub.write_text("\n".join(lines))
    obj = work / "blob.o"
    native.run([*native.cc_command(cc), "-c", "-o", str(obj), str(stub)],
               f"assembling {name} and the linked data")
    return obj


@dataclass(frozen=True)
class LinkedData:
    """A data artifact (e.g. the weights) to write into a linked library:
    its symbol, its offset from the blob symbol and its bytes."""

    symbol: str
    offset: int
    content: Content


def fill_linked_data(library: Path, prefix: str, deferred: Sequence[LinkedData]) -> None:
    """Write the data `blob_object` only reserved into the linked `library`, at its
    offsets from the `{prefix}_blob` symbol (checked against the data symbols'
    addresses where the library keeps its symbol table)."""

    block = _host_large_page()
    with open(library, "r+b") as f:
        items = linked_places(f, library, prefix, deferred)
        if fill_mapped(f.fileno(), items, block):
            return
        for start, content in items:  # where the file cannot be mapped or reserved
            f.seek(start)
            write_content_in_blocks(f, content, block)


def linked_places(f: Any, library: Path, prefix: str, deferred: Sequence[LinkedData]
                  ) -> list[tuple[int, Content]]:
    """(file offset, bytes) of each of `deferred` in the linked `library` (open as `f`);
    ExportError where the linker did not place a data symbol where the blob says."""
    path = os.fspath(library)
    sym = find_blob_symbol(f, path, prefix=prefix)
    table = {s.name: s.value for s in read_symbols(f.fileno(), path, (SHT_SYMTAB,)).symbols}
    blob_at = table.get(sym.name)
    items: list[tuple[int, Content]] = []
    for item in deferred:
        start = sym.file_offset + item.offset
        placed = table.get(item.symbol)
        if start + len(item.content) > sym.section_end or (
                blob_at is not None and placed is not None and
                placed - blob_at != item.offset):
            raise ExportError(f"{library.name}: the linker did not place '{item.symbol}' "
                              f"{item.offset} bytes after '{sym.name}' in section "
                              f"{sym.section}; cannot write the linked data")
        items.append((start, item.content))
    return items


def _host_large_page() -> int:
    """The size of this host's large (PMD) page, which `fill_linked_data` writes in so
    the page cache keeps the weights in folios that large; 2 MiB where the kernel does
    not say (no transparent huge pages, not Linux)."""
    try:
        size = int(Path("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size").read_text())
    except (OSError, ValueError):
        return 2 << 20
    return size if size > 0 and not size & (size - 1) else 2 << 20


# Make the link fail (instead of the later dlopen) when a listed ABI symbol is
# missing or some reference stays undefined: a kiln library is self-contained.
LINK_CHECKS = ("-Wl,--no-undefined-version", "-Wl,-z,defs")
# No build ID: the linker would hash the whole output, weights included (seconds
# for a large model, and it reads the reserved weights' hole back); the blob's
# own hashes identify the library.
LINK_OPTIONS = (*LINK_CHECKS, "-Wl,--build-id=none")


def abi_symbols(metadata: Mapping[str, Any], prefix: str) -> list[str]:
    """The symbols a kiln library exports (docs/abi.md): entries, error, metadata, the CPU
    check, blob."""
    functions = metadata.get("functions", {})
    symbols = [str(sig.get("symbol", f"{prefix}{name}")) for name, sig in functions.items()]
    # graph functions with symbolic dimensions: the entry telling C callers result shapes
    symbols += [str(sig["output_shapes_symbol"]) for sig in functions.values()
                if sig.get("output_shapes_symbol")]
    # decoders with a cache: the greedy generation loop in C (docs/abi.md, "Generation")
    symbols += [str(sig["generate_symbol"]) for sig in functions.values()
                if sig.get("generate_symbol")]
    if metadata.get("profile"):  # built with profile=True: the counters' accessors
        symbols += [f"{prefix}_{name}" for name in ("profile_read", "profile_reset")]
    symbols += [f"{prefix}_{name}" for name in POOL_EXPORTS]  # the thread pool's controls
    swap = metadata.get("swap") or {}  # kiln_swap.c's entries (a library with constants)
    symbols += [str(swap[k]) for k in ("symbol", "weight_symbol") if swap.get(k)]
    return [*symbols, f"{prefix}_last_error", f"{prefix}_metadata", f"{prefix}_cpu_missing",
            f"{prefix}_blob"]


def _check_symbols(symbols: Iterable[str]) -> None:
    """Exported names reach the linker's version script: ASCII C identifiers only."""
    for symbol in symbols:
        if not is_c_identifier(symbol):
            raise ExportError(f"cannot export symbol {symbol!r}: not an ASCII C identifier "
                              "(the library metadata is malformed)")


def _check_prefix(prefix: str, metadata: Mapping[str, Any]) -> None:
    if not is_c_identifier(prefix):
        raise UsageError(f"prefix {prefix!r} must be a non-empty C identifier (ASCII)")
    meta_prefix = metadata.get("prefix")
    if meta_prefix is not None and meta_prefix != prefix:
        raise UsageError(f"prefix {prefix!r} does not match the library metadata's prefix "
                         f"{meta_prefix!r}")


@contextlib.contextmanager
def _workspace(workspace_dir: str | os.PathLike[str] | None) -> Iterator[Path]:
    if workspace_dir is not None:
        work = Path(workspace_dir)
        work.mkdir(parents=True, exist_ok=True)
        yield work
        return
    tmp = make_private_dir("kiln-export-")
    try:
        yield Path(tmp)
    finally:
        remove_private_dir(tmp)


@contextlib.contextmanager
def _atomic(path: Path, mode: int) -> Iterator[Path]:
    """A temporary path next to `path`, renamed onto it if the block succeeds."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        if not tmp.is_file() or tmp.stat().st_size == 0:
            raise ExportError(f"exporting {path}: the link step produced no output")
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ------------------------------------------------------------------ the .a header
def _describe(p: Mapping[str, Any]) -> str:
    if p.get("kind") == "tensor":
        return f"{p['name']}: {p['dtype']}[{', '.join(str(d) for d in p['shape'])}]"
    return f"{p['name']}: {p['dtype']}"


def static_header(metadata: Mapping[str, Any], prefix: str, header_name: str,
                  archive_name: str, libs: Sequence[str] = ()) -> str:
    """C declarations of a static kiln library's entry points (all prefixed).

    Names from the metadata appear only in comments, through kiln.escape.c_comment;
    declared symbols must be ASCII C identifiers (ExportError otherwise).
    """
    guard = re.sub(r"[^A-Za-z0-9]", "_", f"kiln_{prefix}_{header_name}").upper() + "_"
    lines = [
        f"/* {c_comment(header_name)}: entry points of the kiln static library "
        f"{c_comment(archive_name)}.",
        " * Generated by kiln's export_library; the calling convention is",
        " * described in <kiln/kiln.h> (compile with -I$(python -c 'import kiln.runtime;",
        " * print(kiln.runtime.include_dir())')).",
        f" * Link with: {c_comment(' '.join([archive_name, *native.with_libm(libs)]), limit=1000)}",
        " */",
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        "#include <kiln/kiln.h>",
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
    ]
    for name, sig in metadata.get("functions", {}).items():
        params = ", ".join(_describe(p) for p in sig.get("params", []))
        results = ", ".join(_describe(r) for r in sig.get("results", []))
        text = f"{name}({params})" + (f" -> ({results})" if results else "")
        note = ("graph function: inputs, then one preallocated DLTensor* per result"
                if sig.get("kind") == "graph" else "tensor function: exactly its parameters")
        symbol = str(sig.get("symbol", prefix + name))
        _check_symbols([symbol])
        lines += [f"/* {c_comment(text)}", f" * {note}. */",
                  f"int32_t {symbol}(const KilnValue *args, "
                  "const int32_t *type_codes, int32_t num_args);", ""]
    lines += [
        "/* Message of the last failed call on this thread. */",
        f"const char *{prefix}_last_error(void);",
        "/* Library metadata (JSON, docs/abi.md). */",
        f"const char *{prefix}_metadata(void);",
        "/* How many CPU features the code needs that this CPU lacks; their names go",
        " * into out (docs/abi.md, \"CPU features\"). */",
        f"int32_t {prefix}_cpu_missing(char *out, int32_t size);",
        "/* The thread pool of parallel loops (docs/abi.md, \"Threads\"): threads, the",
        " * caller included (0: the default); the spin window of idle workers in",
        " * microseconds (-1: the default); its counters. 0, or -1 and last_error. */",
        f"int32_t {prefix}_set_num_threads(int32_t n);",
        f"int32_t {prefix}_num_threads(void);",
        f"int32_t {prefix}_set_spin_us(int32_t us);",
        f"int32_t {prefix}_pool_stats(int64_t *out, int32_t size);",
        "",
    ]
    if metadata.get("weights_check"):
        lines += [
            "/* The weights' check (docs/runtime.md, \"Checking the weights\"): -1 if",
            " * chunks [first, first + count) are intact, else the first damaged one. */",
            f"int64_t {prefix}_check_weights(int64_t first, int64_t count);",
            f"int64_t {prefix}_weights_chunks(void);",
            f"uint64_t {prefix}_hash64(const void *data, uint64_t n);",
            "/* A swap of the library's own rewrites these bytes of the weights: phase 0",
            " * before, 1 after (docs/runtime.md, \"Swapping weights\"). */",
            f"int64_t {prefix}_rehash_weights(const void *data, uint64_t size, int32_t phase);",
            "",
        ]
    if metadata.get("profile"):
        lines += [
            "/* Per-kernel timings (built with profile=True; docs/abi.md, \"Profiling\"). */",
            f"int32_t {prefix}_profile_read(int32_t site, const char **function, "
            "const char **kernel, uint64_t *calls, uint64_t *total_ns);",
            f"void {prefix}_profile_reset(void);",
            "",
        ]
    lines += [
        "#ifdef __cplusplus",
        "}",
        "#endif",
        "",
        f"#endif /* {guard} */",
        "",
    ]
    return "\n".join(lines)


__all__ = ["SUFFIXES", "abi_symbols", "export_library", "set_step_timer", "static_header"]

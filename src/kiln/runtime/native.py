"""The native linker: "native" artifacts -> object files -> one shared or static library.

The system toolchain (`cc`, `ar`, `objcopy`) does the work, at export time and at
load time alike:

- `.o` artifacts are written as they are;
- `.c` artifacts are compiled `cc -c -std=c99 -O2 -fPIC -fvisibility=hidden
  -I<kiln include dir> <metadata cflags> <options>`, once per process for the same
  source, compiler and flags (kiln.runtime.object_cache: exporting `.so` then `.a`
  compiles once); a host.c with a prelude (PRELUDE_KEY) as two objects, its
  prelude's shared by every library whose host.c starts with the same bytes;
- `.bin` artifacts become read-only data symbols through a generated assembler
  stub (`.incbin`), named `metadata["symbol"]` and aligned to `metadata["align"]`;
- `link_shared` links the objects with `cc -shared` and a version script that
  exports exactly the ABI symbols (docs/abi.md), `archive_static` makes a `.a`.

Every toolchain failure raises CompileError quoting the command and its stderr.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.artifact.segments import write_content
from kiln.errors import CompileError
from kiln.runtime import object_cache
from kiln.runtime.private_dirs import make_private_dir, remove_private_dir

if TYPE_CHECKING:
    from kiln.artifact import AnyArtifact

CFLAGS = ("-std=c99", "-O2", "-fPIC", "-fvisibility=hidden")
# Metadata of a C artifact whose first bytes (this many) compile alone: host.c's
# #defines and kiln_host.c, the same for many models. They are compiled apart, as
# PRELUDE_FILE with -DKILN_HOST_PRELUDE_ONLY, and the whole file with
# -DKILN_HOST_MODEL_ONLY (only declarations of the prelude), so the object cache
# holds the prelude's object once for all of them.
PRELUDE_KEY = "prelude"
PRELUDE_FILE = "kiln_host.c"
# The rest is compiled -O1 where the artifact asks for -O2 or -O3 (before the options,
# which may override it): the entries' checks call the prelude's helpers, and -O1
# compiles them a third faster with no call measurably slower (docs/performance.md,
# "Compile time"). A size-minded -Os stays.
MODEL_UNIT_LEVEL = "-O1"
DEFAULT_ALIGN = 16
NATIVE_SUFFIXES = (".o", ".c", ".bin")


def include_dir() -> str:
    """The directory holding `kiln/kiln.h` (pass it to your compiler with -I)."""
    return str(Path(__file__).resolve().parent / "include")


def cc_command(cc: str | Sequence[str] | None = None) -> list[str]:
    """The C compiler command: `cc`, else $CC, else "cc" (a string may hold arguments)."""
    if cc is None:
        cc = os.environ.get("CC") or "cc"
    return shlex.split(cc) if isinstance(cc, str) else list(cc)


def binutil(cc: Sequence[str], tool: str) -> str:
    """The binutils `tool` matching a compiler: aarch64-linux-gnu-gcc -> aarch64-linux-gnu-ar."""
    base = os.path.basename(cc[0])
    for compiler in ("gcc", "clang", "cc"):
        if base.endswith("-" + compiler):
            return base[: -len(compiler)] + tool
    return tool


def run(cmd: Sequence[str], what: str) -> None:
    """Run a toolchain command; CompileError with the command and stderr if it fails."""
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    except FileNotFoundError:
        raise CompileError(f"{what}: '{cmd[0]}' not found (command: {shlex.join(cmd)}); "
                           "install a C toolchain (gcc, binutils) or pass cc=") from None
    if proc.returncode != 0:
        raise CompileError(f"{what} failed (exit {proc.returncode}): {shlex.join(cmd)}\n"
                           f"{(proc.stderr or proc.stdout).strip()}")


def _run_all(jobs: list[tuple[list[str], str]]) -> None:
    """Run independent commands concurrently (a few at a time); report the first failure."""
    limit = max(1, os.cpu_count() or 1)
    pending = list(jobs)
    running: list[tuple[subprocess.Popen[str], list[str], str]] = []
    failure: str | None = None
    while pending or running:
        while pending and len(running) < limit and failure is None:
            cmd, what = pending.pop(0)
            try:
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
            except FileNotFoundError:
                failure = (f"{what}: '{cmd[0]}' not found (command: {shlex.join(cmd)}); "
                           "install a C toolchain (gcc, binutils) or pass cc=")
                break
            running.append((proc, cmd, what))
        if not running:
            break
        proc, cmd, what = running.pop(0)
        out, err = proc.communicate()
        if proc.returncode != 0 and failure is None:
            failure = (f"{what} failed (exit {proc.returncode}): {shlex.join(cmd)}\n"
                       f"{(err or out).strip()}")
    if failure is not None:
        raise CompileError(failure)


# ------------------------------------------------------------------ objects
def _asm_string(path: Path) -> str:
    text = str(path.resolve())
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def data_object_source(symbol: str, data_file: Path, *, align: int, exported: bool) -> str:
    """Assembler source placing `data_file`'s bytes in .rodata as `symbol`."""
    if not symbol.replace("_", "a").isidentifier():
        raise CompileError(f"data symbol {symbol!r} is not a C identifier")
    if align < 1 or align & (align - 1):
        raise CompileError(f"alignment {align} of symbol {symbol} is not a power of two")
    lines = [
        f'\t.section .rodata.{symbol},"a",%progbits',
        f"\t.balign {align}",
        f"\t.globl {symbol}",
        *([] if exported else [f"\t.hidden {symbol}"]),
        f"\t.type {symbol},%object",
        f"{symbol}:",
        f"\t.incbin {_asm_string(data_file)}",
        f"\t.size {symbol}, . - {symbol}",
        '\t.section .note.GNU-stack,"",%progbits',
        "",
    ]
    return "\n".join(lines)


def data_object(data_file: Path, symbol: str, out_obj: Path, *, align: int = DEFAULT_ALIGN,
                exported: bool = False, cc: str | Sequence[str] | None = None) -> Path:
    """Assemble `data_file` into an object defining the read-only symbol `symbol`."""
    stub = out_obj.with_suffix(".s")
    stub.write_text(data_object_source(symbol, data_file, align=align, exported=exported))
    run([*cc_command(cc), "-c", "-o", str(out_obj), str(stub)], f"assembling {symbol}")
    return out_obj


def _cflags(metadata: Mapping[str, Any], key: str, where: str) -> list[str]:
    value = metadata.get(key, ())
    if isinstance(value, str):
        return shlex.split(value)
    if not all(isinstance(v, str) for v in value):
        raise CompileError(f"{where}: metadata[{key!r}] must be a list of strings")
    return list(value)


def compile_native(
    artifacts: Iterable[AnyArtifact], workdir: str | os.PathLike[str], *, prefix: str,
    cc: str | Sequence[str] | None = None, options: Sequence[str] | None = None,
) -> list[Path]:
    """Object files for the "native" artifacts, written under `workdir`.

    `.o` files are written as is, `.c` files compiled, `.bin` files turned into
    data symbols. Any other suffix is a CompileError.
    """
    cc_cmd = cc_command(cc)
    root = Path(workdir)
    objects: list[Path] = []
    jobs: list[tuple[list[str], str]] = []
    compiled: list[tuple[str, Path]] = []  # (object cache key, object) of each job compiling C
    for a in artifacts:
        where = f"{a.codegen_id}/{a.file_name}"
        folder = root / a.codegen_id
        folder.mkdir(parents=True, exist_ok=True)
        src = folder / a.file_name
        with open(src, "wb") as f:
            write_content(f, a.content)
        suffix = a.extension
        if suffix == ".o":
            objects.append(src)
        elif suffix == ".c":
            for cmd, key, obj in _c_units(a, cc_cmd, src, options):
                objects.append(obj)
                cached = None if key is None else object_cache.lookup(key)
                if cached is not None:
                    obj.write_bytes(cached)
                    continue
                jobs.append((cmd, f"compiling {where}"))
                if key is not None:
                    compiled.append((key, obj))
        elif suffix == ".bin":
            symbol = a.metadata.get("symbol")
            if not isinstance(symbol, str):
                raise CompileError(f"{where}: a native .bin artifact needs metadata['symbol']")
            align = int(a.metadata.get("align", DEFAULT_ALIGN))
            obj = folder / (a.file_name + ".o")
            stub = folder / (a.file_name + ".s")
            stub.write_text(data_object_source(
                symbol, src, align=align, exported=bool(a.metadata.get("exported", False))))
            jobs.append(([*cc_cmd, "-c", "-o", str(obj), str(stub)], f"assembling {where}"))
            objects.append(obj)
        else:
            raise CompileError(
                f"{where}: cannot link a native artifact with suffix {suffix or '(none)'!r}; "
                f"native artifacts are {', '.join(NATIVE_SUFFIXES)}")
    _run_all(jobs)
    for key, obj in compiled:
        object_cache.store(key, obj.read_bytes())
    return objects


def _c_command(a: AnyArtifact, cc_cmd: list[str], src: Path, obj: Path,
               options: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """The command compiling C artifact `a` (written to `src`) to `obj`, and its flags."""
    flags = [*_cflags(a.metadata, "cflags", f"{a.codegen_id}/{a.file_name}"),
             *(options or ())]
    return [*cc_cmd, "-c", *CFLAGS, f"-I{include_dir()}", *flags, "-o", str(obj),
            str(src)], flags


def _c_units(a: AnyArtifact, cc_cmd: list[str], src: Path,
             options: Sequence[str] | None) -> list[tuple[list[str], str | None, Path]]:
    """(command, object cache key or None, object) of each compile of C artifact `a`,
    written to `src`: one, or for a host.c with a prelude (PRELUDE_KEY) two, the
    prelude alone (written next to `src` as PRELUDE_FILE) and the rest."""
    data = src.read_bytes()
    size = a.metadata.get(PRELUDE_KEY)
    units: list[tuple[Path, tuple[str, ...]]] = [(src, ())]
    if isinstance(size, int) and 0 < size < len(data):
        prelude = src.with_name(PRELUDE_FILE)
        prelude.write_bytes(data[:size])
        levels = [f for f in _cflags(a.metadata, "cflags", str(src)) if f.startswith("-O")]
        lower = (MODEL_UNIT_LEVEL,) if levels[-1:] in (["-O2"], ["-O3"]) else ()
        units = [(src, ("-DKILN_HOST_MODEL_ONLY", *lower)),
                 (prelude, ("-DKILN_HOST_PRELUDE_ONLY",))]
    out: list[tuple[list[str], str | None, Path]] = []
    for unit, defines in units:
        obj = unit.with_name(unit.name + ".o")
        cmd, flags = _c_command(a, cc_cmd, unit, obj, [*defines, *(options or ())])
        key = None if reads_other_files(flags) else object_cache.object_key(
            cmd, data if unit == src else data[:size], str(unit), str(obj))
        out.append((cmd, key, obj))
    return out


def precompile_c(artifact: AnyArtifact, cc: str | Sequence[str] | None = None) -> None:
    """Start compiling the C artifact `artifact` in the background, as `compile_native`
    with `cc` and no options will (kiln.runtime.object_cache.start): the llvm codegen
    starts host.c's compile while LLVM compiles the kernels, on another core. Does
    nothing when the compile would not be cached or the compiler cannot start."""
    cc_cmd = cc_command(cc)
    folder = make_private_dir("kiln-cc-")
    src = Path(folder) / artifact.file_name
    with open(src, "wb") as f:
        write_content(f, artifact.content)
    units = [(cmd, key, obj) for cmd, key, obj in _c_units(artifact, cc_cmd, src, None)
             if key is not None and not object_cache.started(key)]
    shared = _SharedFolder(folder, len(units))  # removed when the last compile is done
    for cmd, key, obj in units:
        try:
            process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL)
        except OSError:  # no compiler: compile_native will say so
            shared.cleanup()
            continue
        object_cache.start(key, process, obj, shared)
    if not units:
        remove_private_dir(folder)


class _SharedFolder:
    """A temporary folder that the compiles started in it share: removed by the last
    `cleanup`."""

    def __init__(self, folder: str, users: int) -> None:
        self.folder = folder
        self.users = users
        self.lock = threading.Lock()

    def cleanup(self) -> None:
        with self.lock:
            self.users -= 1
            last = self.users == 0
        if last:
            remove_private_dir(self.folder)

# Flags that make the compiler read files besides the source and kiln's headers (which
# the object cache's key does not cover): such compiles are never reused.
_FILE_FLAGS = ("-I", "-i", "@", "--sysroot", "-B", "-specs", "--specs", "-fplugin")


def reads_other_files(flags: Sequence[str]) -> bool:
    """Whether compiler `flags` name files to read (include paths, response files, ...)."""
    return any(f.startswith(_FILE_FLAGS) for f in flags)


def c_to_assembly(artifact: AnyArtifact, cc: str | Sequence[str] | None = None) -> str:
    """The assembly `cc -S` makes of a C source artifact, with the flags it is built with."""

    where = f"{artifact.codegen_id}/{artifact.file_name}"
    with tempfile.TemporaryDirectory(prefix="kiln-asm-") as tmp:
        src = Path(tmp) / artifact.file_name
        with open(src, "wb") as f:
            write_content(f, artifact.content)
        out = Path(tmp) / "out.s"
        run([*cc_command(cc), "-S", *CFLAGS, f"-I{include_dir()}",
             *_cflags(artifact.metadata, "cflags", where), "-o", str(out), str(src)],
            f"compiling {where} to assembly")
        return f"# ---- {where}\n" + out.read_text(errors="replace")


def native_libs(artifacts: Iterable[AnyArtifact]) -> list[str]:
    """Linker inputs the artifacts ask for (metadata["libs"]): "m" -> -lm, "-l..."/paths as is."""
    libs: list[str] = []
    for a in artifacts:
        for lib in _cflags(a.metadata, "libs", f"{a.codegen_id}/{a.file_name}"):
            flag = lib if lib.startswith("-") or "/" in lib else f"-l{lib}"
            if flag not in libs:
                libs.append(flag)
    return libs


def with_libm(libs: Sequence[str]) -> list[str]:
    """`libs` plus -lm (generated code may call libm), each named once."""
    return [*libs, "-lm"] if "-lm" not in libs else list(libs)


def native_exports(artifacts: Iterable[AnyArtifact]) -> list[str]:
    """Extra symbols artifacts export: exported `.bin` symbols and metadata["exports"]."""
    names: list[str] = []
    for a in artifacts:
        if a.extension == ".bin" and a.metadata.get("exported") and "symbol" in a.metadata:
            names.append(str(a.metadata["symbol"]))
        names.extend(str(s) for s in a.metadata.get("exports", ()))
    return names


# ------------------------------------------------------------------ libraries
def _version_script(exports: Iterable[str], path: Path) -> Path:
    body = "".join(f"    {name};\n" for name in sorted(set(exports)))
    path.write_text(f"{{\n  global:\n{body}  local: *;\n}};\n")
    return path


def link_shared(
    objects: Sequence[Path], out_path: str | os.PathLike[str], *,
    cc: str | Sequence[str] | None = None, libs: Sequence[str] = (),
    exports: Iterable[str] | None = None, options: Sequence[str] = (),
) -> Path:
    """Link `objects` into the shared library `out_path` (`cc -shared ... -lm`).

    With `exports`, a version script makes exactly those symbols visible.
    """
    out = Path(out_path)
    cmd = [*cc_command(cc), "-shared", *options, "-o", str(out), *map(str, objects)]
    if exports is not None:
        script = _version_script(exports, out.parent / (out.name + ".map"))
        cmd.append(f"-Wl,--version-script={script}")
    try:
        run([*cmd, *with_libm(libs)], f"linking {out.name}")
    finally:
        if exports is not None:
            script.unlink(missing_ok=True)
    return out


def archive_static(
    objects: Sequence[Path], out_path: str | os.PathLike[str], *,
    cc: str | Sequence[str] | None = None, exports: Iterable[str] | None = None,
    workdir: str | os.PathLike[str] | None = None, member: str = "kiln_library.o",
) -> Path:
    """Archive `objects` into the static library `out_path` with `ar rcs`.

    With `exports`, the objects are first combined into one relocatable object
    (`cc -r`, written to `workdir` as `member`) in which every other defined
    symbol is made local (`objcopy --keep-global-symbols`), so two kiln libraries
    with different prefixes link into one program without clashing on internal
    helper names.
    """
    out = Path(out_path)
    cc_cmd = cc_command(cc)
    members = [Path(o) for o in objects]
    if exports is not None:
        scratch = Path(workdir) if workdir is not None else out.parent
        combined = scratch / member
        keep = scratch / (member + ".keep")
        try:
            run([*cc_cmd, "-r", "-nostdlib", "-o", str(combined), *map(str, members)],
                f"combining objects for {out.name}")
            keep.write_text("".join(f"{name}\n" for name in sorted(set(exports))))
            run([binutil(cc_cmd, "objcopy"), f"--keep-global-symbols={keep}", str(combined)],
                f"localizing internal symbols of {out.name}")
            out.unlink(missing_ok=True)
            run([binutil(cc_cmd, "ar"), "rcs", str(out), str(combined)], f"archiving {out.name}")
        finally:
            combined.unlink(missing_ok=True)
            keep.unlink(missing_ok=True)
        return out
    out.unlink(missing_ok=True)  # ar would add to an existing archive
    run([binutil(cc_cmd, "ar"), "rcs", str(out), *map(str, members)], f"archiving {out.name}")
    return out

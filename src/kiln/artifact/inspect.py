"""Inspectors: human-readable views of artifacts.

An inspector offers one or more named *views* of an artifact, e.g. the `.bc`
inspector shows LLVM bitcode as IR text (`"ll"`) or as target assembly
(`"asm"`). Inspectors are registered by codegen id, file extension or loader;
`inspect_artifact` looks them up in that order and falls back to a size +
hexdump view, so every artifact can be looked at.

Built-in views need no compiler at import time: a bitcode or LLVM IR view runs
llvmlite in a child process (LLVM aborts on malformed bitcode, and an artifact
may come from an untrusted file), and its absence gives an explanatory text.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kiln._registry import Registry
from kiln.artifact._json import MAX_DEPTH, canonical_json, text_depth
from kiln.artifact.artifact import AnyArtifact, Artifact, ArtifactSet, InMemoryArtifact
from kiln.errors import ArgumentTypeError, ArtifactError, FormatError, UsageError, install_hint

View = Callable[[AnyArtifact], str]

# The view names the built-in inspectors use; custom inspectors may add others.
STANDARD_VIEWS = ("c", "ll", "asm", "json", "hex", "symbols")


@dataclass(frozen=True)
class Inspector:
    """Named views of an artifact; `default` names the view used when none is asked for."""

    views: Mapping[str, View]
    default: str

    def __post_init__(self) -> None:
        if not self.views:
            raise ArtifactError("an inspector needs at least one view")
        if self.default not in self.views:
            raise ArtifactError(f"default view {self.default!r} is not one of {list(self.views)}")


INSPECTORS: Registry[Inspector] = Registry("artifact inspector")


def _key(kind: str, name: str) -> str:
    return f"{kind}:{name}"


def register_inspector(
    views: View | Mapping[str, View], *, ext: str | Iterable[str] | None = None,
    codegen_id: str | None = None, loader: str | None = None, default: str | None = None,
    override: bool = False,
) -> None:
    """Register an inspector for a file extension, a codegen id or a loader.

    `views` is a mapping view name -> `fn(artifact) -> str`, or one function
    (registered as the view "text"). `default` is the view shown when
    `inspect_artifact` gets no `fmt` (the first view if omitted). Give exactly
    one of `ext` (e.g. ".json" or several), `codegen_id`, `loader`. A second
    registration for the same key raises RegistryError unless `override=True`.
    """
    if sum(x is not None for x in (ext, codegen_id, loader)) != 1:
        raise ArtifactError("register_inspector needs exactly one of ext=, codegen_id=, loader=")
    table = dict(views) if isinstance(views, Mapping) else {"text": views}
    for name, fn in table.items():
        if not isinstance(name, str) or not name or not callable(fn):
            raise ArtifactError(f"inspector view {name!r} must map a non-empty name to a callable")
    inspector = Inspector(table, default or next(iter(table)))
    keys: list[str]
    if ext is not None:
        exts = [ext] if isinstance(ext, str) else list(ext)
        for e in exts:
            if not isinstance(e, str) or not e.startswith(".") or len(e) < 2:
                raise ArtifactError(f"extension {e!r} must look like '.json'")
        keys = [_key("ext", e.lower()) for e in exts]
    elif codegen_id is not None:
        keys = [_key("codegen", codegen_id)]
    else:
        assert loader is not None
        keys = [_key("loader", loader)]
    for k in keys:
        INSPECTORS.register(k, inspector, override=override)


def _extensions(file_name: str) -> list[str]:
    """Candidate extensions, longest first: 'a.tar.gz' -> ['.tar.gz', '.gz']."""
    name = file_name.lower()
    out = []
    start = name.find(".", 1)
    while start != -1:
        out.append(name[start:])
        start = name.find(".", start + 1)
    return out


def _candidates(a: AnyArtifact) -> list[Inspector]:
    keys = [_key("codegen", a.codegen_id)]
    if isinstance(a, Artifact):  # extension inspectors read bytes; in-memory ones have none
        keys += [_key("ext", e) for e in _extensions(a.file_name)]
    keys.append(_key("loader", a.loader))
    found = [INSPECTORS.get(k) for k in keys if k in INSPECTORS]
    found.append(_FALLBACK_MEMORY if isinstance(a, InMemoryArtifact) else _FALLBACK)
    return found


def inspect_artifact(a: AnyArtifact, fmt: str | None = None) -> str:
    """A human-readable view of `a`.

    `fmt` picks the view: None (the inspector's default), "c", "ll", "asm",
    "json", "hex", "symbols", or a view a custom inspector defines. The first
    inspector (codegen id, then extension, then loader, then the fallback)
    that offers the view is used; none offering it is a UsageError (a ValueError)
    listing the views this artifact has.
    """
    if not isinstance(a, (Artifact, InMemoryArtifact)):
        raise ArgumentTypeError(f"inspect_artifact expects an artifact, got {type(a).__name__}")
    if isinstance(a, Artifact) and a.metadata.get("linked") is True and not a.content:
        return (f"{a.codegen_id}/{a.file_name}: content not stored here -- it is linked into "
                f"the library ({a.metadata.get('size', '?')} bytes, loader {a.loader})")
    candidates = _candidates(a)
    if fmt is None:
        inspector = candidates[0]
        return inspector.views[inspector.default](a)
    for inspector in candidates:
        if fmt in inspector.views:
            return inspector.views[fmt](a)
    available = sorted({v for c in candidates for v in c.views})
    raise UsageError(f"artifact {a.codegen_id}/{a.file_name} has no {fmt!r} view; "
                     f"available: {', '.join(available)}")


def available_views(a: AnyArtifact) -> list[str]:
    """Names of every view `inspect_artifact` can show for `a`."""
    seen: dict[str, None] = {}
    for c in _candidates(a):
        seen.update(dict.fromkeys(c.views))
    return list(seen)


# --------------------------------------------------------------------------
# the summary table of an ArtifactSet
# --------------------------------------------------------------------------

def summary_table(artifacts: ArtifactSet, *, meta_width: int = 48) -> str:
    """Plain-text table of an ArtifactSet: one row per artifact."""
    rows = [("codegen_id", "loader", "file_name", "size", "metadata")]
    for a in artifacts:
        if isinstance(a, InMemoryArtifact):
            size = "in-memory"
        elif a.metadata.get("linked") is True and not a.content:
            size = f"{a.metadata.get('size', '?')} (linked)"
        else:
            size = str(a.size)
        shown = {k: v for k, v in a.metadata.items()
                 if not (size.endswith("(linked)") and k in ("linked", "size"))}
        rows.append((a.codegen_id, a.loader, a.file_name, size, _summarize(shown, meta_width)))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[i].rjust(widths[i]) if i == 3 and n else row[i].ljust(widths[i])
                 for i in range(5)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    total = sum(a.size for a in artifacts if isinstance(a, Artifact))
    lines.append(f"{len(artifacts)} artifact(s), {total} bytes stored")
    return "\n".join(lines)


def _summarize(metadata: Mapping[str, Any], width: int) -> str:
    parts = []
    for k, v in metadata.items():
        text = v if isinstance(v, str) else canonical_json(v)
        parts.append(f"{k}={text}")
    out = ", ".join(parts)
    return out if len(out) <= width else out[:width - 3] + "..."


# --------------------------------------------------------------------------
# built-in views
# --------------------------------------------------------------------------

def hexdump(data: bytes, limit: int = 256) -> str:
    """Classic 16-bytes-per-line hexdump of the first `limit` bytes."""
    lines = []
    for off in range(0, min(len(data), limit), 16):
        chunk = data[off:off + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{off:08x}  {hexes:<47}  |{text}|")
    if len(data) > limit:
        lines.append(f"... ({len(data) - limit} more bytes)")
    return "\n".join(lines)


def _content(a: AnyArtifact) -> bytes:
    return bytes(a.content)  # raises ExportError for in-memory artifacts


def _name(a: AnyArtifact) -> str:
    return f"{a.codegen_id}/{a.file_name}"


def _hex_view(a: AnyArtifact) -> str:
    data = _content(a)
    extra = ""
    if "symbol" in a.metadata:
        extra = f", symbol {a.metadata['symbol']}"
    if "align" in a.metadata:
        extra += f", align {a.metadata['align']}"
    head = f"{_name(a)}: {len(data)} bytes (loader {a.loader}{extra})"
    return head + ("\n" + hexdump(data) if data else "")


def _repr_view(a: AnyArtifact) -> str:
    value = a.value if isinstance(a, InMemoryArtifact) else None
    return f"{_name(a)}: in-memory {type(value).__name__} (loader {a.loader})\n{value!r}"


def _text(a: AnyArtifact, what: str) -> str:
    try:
        return _content(a).decode("utf-8")
    except UnicodeDecodeError as err:
        raise FormatError(f"{_name(a)}: expected UTF-8 {what}, found an invalid byte at "
                          f"offset {err.start}") from None


def _json_view(a: AnyArtifact) -> str:
    text = _text(a, "JSON")
    # json.loads and json.dumps recurse per level: a crafted file must not raise
    # RecursionError, so measure the nesting first, without recursion.
    depth = text_depth(text)
    if depth > MAX_DEPTH:
        raise FormatError(f"{_name(a)}: not valid JSON (nested {depth} levels deep, "
                          f"deeper than {MAX_DEPTH})")
    try:
        value = json.loads(text)
    except ValueError as err:
        raise FormatError(f"{_name(a)}: not valid JSON ({err})") from None
    return json.dumps(value, indent=2, ensure_ascii=False)


def _c_view(a: AnyArtifact) -> str:
    return _text(a, "C source")


def _ll_text_view(a: AnyArtifact) -> str:
    return _text(a, "LLVM IR")


def _asm_text_view(a: AnyArtifact) -> str:
    return _text(a, "assembly")


# -- LLVM (in a child process) --------------------------------------------------
#
# LLVM's readers assert (abort the process) on malformed bitcode rather than
# report an error, and an artifact may come from an untrusted file. So LLVM
# parses and prints in a child interpreter: a crash there becomes a FormatError
# here (docs/security.md).

_NO_LLVMLITE = ("llvmlite is not installed, so LLVM {what} cannot be shown as text "
                f"({install_hint('llvmlite')}). The artifact holds {{size}} bytes; use "
                "fmt='hex' to see them.")

# Exit codes of _LLVM_CHILD besides 0 (its stdout is the view).
_PARSE_FAILED, _NO_TARGET = 3, 4

# argv: path of the input, view ("ll" or "asm"). Bitcode starts with "BC" or with
# the bitcode wrapper magic 0x0B17C0DE; anything else is read as LLVM IR text.
_LLVM_CHILD = """
import sys
import llvmlite.binding as llvm
path, view = sys.argv[1], sys.argv[2]
with open(path, "rb") as f:
    data = f.read()
try:
    if data[:2] == b"BC" or data[:4] == b"\\xde\\xc0\\x17\\x0b":
        mod = llvm.parse_bitcode(data)
    else:
        mod = llvm.parse_assembly(data.decode("utf-8"))
    if view == "asm":
        mod.verify()
except (RuntimeError, UnicodeDecodeError) as err:
    sys.stderr.write(str(err))
    sys.exit(3)
if view == "ll":
    sys.stdout.write(str(mod))
    sys.exit(0)
llvm.initialize_all_targets()
llvm.initialize_all_asmprinters()
triple = mod.triple or llvm.get_process_triple()
try:
    target = llvm.Target.from_triple(triple)
except RuntimeError as err:
    sys.stderr.write(f"LLVM has no target for triple {triple!r} ({err})")
    sys.exit(4)
machine = target.create_target_machine(reloc="pic", codemodel="default")
sys.stdout.write(str(machine.emit_assembly(mod)))
"""


def _has_llvmlite() -> bool:
    return importlib.util.find_spec("llvmlite") is not None


def _llvm_view(a: AnyArtifact, view: str) -> str:
    """LLVM's text ("ll") or assembly ("asm") of a .bc/.ll artifact, made in a child process."""

    data = _content(a)
    with tempfile.TemporaryDirectory(prefix="kiln-inspect-") as tmp:
        path = os.path.join(tmp, "input")
        with open(path, "wb") as f:
            f.write(data)
        try:
            proc = subprocess.run([sys.executable, "-c", _LLVM_CHILD, path, view],
                                  capture_output=True, text=True, timeout=300, check=False)
        except subprocess.TimeoutExpired:
            raise FormatError(f"{_name(a)}: LLVM did not finish reading it in 300 s") from None
    if proc.returncode == 0:
        return proc.stdout
    detail = proc.stderr.strip()
    if proc.returncode == _PARSE_FAILED:
        raise FormatError(f"{_name(a)}: LLVM could not parse it ({detail})")
    if proc.returncode == _NO_TARGET:
        raise UsageError(f"{_name(a)}: {detail}")
    if proc.returncode < 0:
        try:
            how = signal.Signals(-proc.returncode).name
        except ValueError:
            how = f"signal {-proc.returncode}"
        last = detail.splitlines()[-1][:300] if detail else "no message"
        raise FormatError(f"{_name(a)}: LLVM crashed reading it ({how}: {last}); the file "
                          "is damaged or crafted")
    raise FormatError(f"{_name(a)}: the LLVM reader failed (exit {proc.returncode}): "
                      f"{detail[-300:]}")


def _bitcode_ll_view(a: AnyArtifact) -> str:
    if not _has_llvmlite():
        return _NO_LLVMLITE.format(what="bitcode", size=len(_content(a)))
    return _llvm_view(a, "ll")


def _llvm_asm_view(a: AnyArtifact) -> str:
    if not _has_llvmlite():
        return _NO_LLVMLITE.format(what="code", size=len(_content(a)))
    return _llvm_view(a, "asm")


# -- object files ------------------------------------------------------------

def _object_symbols(a: AnyArtifact) -> str:
    from elftools.elf.elffile import ELFFile  # optional: elftools (the compiler extra)
    from elftools.elf.sections import SymbolTableSection  # optional: elftools (the compiler extra)

    data = _content(a)
    if data[:4] != b"\x7fELF":
        return f"{_name(a)}: not an ELF object (starts with {data[:4]!r}); no symbol list"
    try:
        elf = ELFFile(io.BytesIO(data))
        rows = []
        for section in elf.iter_sections():
            if not isinstance(section, SymbolTableSection):
                continue
            for sym in section.iter_symbols():
                if not sym.name or sym["st_info"]["type"] in ("STT_FILE", "STT_SECTION"):
                    continue
                shndx = sym["st_shndx"]
                where = (elf.get_section(shndx).name if isinstance(shndx, int)
                         else str(shndx).removeprefix("SHN_"))
                rows.append((f"{sym['st_value']:016x}", str(sym["st_size"]),
                             sym["st_info"]["type"].removeprefix("STT_"),
                             sym["st_info"]["bind"].removeprefix("STB_"), where, sym.name))
        machine = elf["e_machine"]
    except Exception as err:
        # pyelftools raises many exception types on malformed input.
        raise FormatError(f"{_name(a)}: malformed ELF object ({type(err).__name__}: {err})") \
            from None
    header = ("value", "size", "type", "bind", "section", "name")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(6)]
    lines = [f"symbols of {_name(a)} ({machine}):"]
    for r in [header, *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)


# ELF e_machine -> GNU binutils prefix of a cross objdump, tried after llvm-objdump.
_CROSS_OBJDUMP = {
    "EM_AARCH64": ["aarch64-linux-gnu-objdump"],
    "EM_ARM": ["arm-none-eabi-objdump", "arm-linux-gnueabihf-objdump"],
    "EM_RISCV": ["riscv64-linux-gnu-objdump", "riscv64-unknown-elf-objdump"],
}


def _llvm_objdumps() -> list[str]:
    found = [shutil.which("llvm-objdump")]
    for version in range(30, 9, -1):
        found.append(shutil.which(f"llvm-objdump-{version}"))
    return [f for f in found if f]


def _disassemblers(data: bytes) -> list[str]:
    """objdump first for host-architecture ELF, LLVM's for anything else."""
    host = _host_machine()
    machine = _elf_machine(data)
    gnu = [t for t in [shutil.which("objdump")] if t]
    cross = [p for n in _CROSS_OBJDUMP.get(machine or "", []) if (p := shutil.which(n))]
    if machine is not None and machine == host:
        return gnu + _llvm_objdumps()
    return _llvm_objdumps() + cross + gnu


def _elf_machine(data: bytes) -> str | None:
    if data[:4] != b"\x7fELF":
        return None

    from elftools.elf.elffile import ELFFile  # optional: elftools (the compiler extra)

    try:
        return str(ELFFile(io.BytesIO(data))["e_machine"])
    except Exception:  # malformed: let the disassembler report it
        return None


@functools.cache
def _host_machine() -> str | None:
    return {"x86_64": "EM_X86_64", "amd64": "EM_X86_64", "aarch64": "EM_AARCH64",
            "arm64": "EM_AARCH64", "riscv64": "EM_RISCV"}.get(platform.machine().lower())


def _disassembly(a: AnyArtifact) -> str:
    data = _content(a)
    tools = _disassemblers(data)
    if not tools:
        return (f"{_name(a)}: no disassembler found (install binutils for objdump, or LLVM "
                "for llvm-objdump)")
    errors = []
    with tempfile.TemporaryDirectory(prefix="kiln-inspect-") as tmp:
        path = os.path.join(tmp, a.file_name)
        with open(path, "wb") as f:
            f.write(data)
        for tool in tools:
            try:
                proc = subprocess.run([tool, "-d", path], capture_output=True, text=True,
                                      timeout=120, check=False)
            except (OSError, subprocess.TimeoutExpired) as err:
                errors.append(f"{os.path.basename(tool)}: {err}")
                continue
            if proc.returncode == 0 and "Disassembly of section" in proc.stdout:
                return proc.stdout.replace(path, _name(a)).strip("\n")
            msg = (proc.stderr.strip() or "no disassembly produced").replace(path, _name(a))
            errors.append(f"{os.path.basename(tool)}: {msg}")
    return f"{_name(a)}: could not disassemble:\n  " + "\n  ".join(errors)


def _object_view(a: AnyArtifact) -> str:
    return _object_symbols(a) + "\n\n" + _disassembly(a)


# -- registration -------------------------------------------------------------

_FALLBACK = Inspector({"hex": _hex_view}, "hex")
_FALLBACK_MEMORY = Inspector({"repr": _repr_view}, "repr")


def _register_builtins() -> None:
    register_inspector({"json": _json_view}, ext=".json")
    register_inspector({"c": _c_view}, ext=(".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".cu"))
    register_inspector({"ll": _bitcode_ll_view, "asm": _llvm_asm_view}, ext=".bc")
    register_inspector({"ll": _ll_text_view, "asm": _llvm_asm_view}, ext=".ll")
    register_inspector({"asm": _asm_text_view}, ext=(".s", ".asm", ".ptx"))
    register_inspector({"object": _object_view, "asm": _disassembly,
                        "symbols": _object_symbols}, ext=".o")
    register_inspector({"hex": _hex_view}, ext=".bin")


_register_builtins()

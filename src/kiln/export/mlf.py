"""Model Library Format: a compiled model as a tree of sources for firmware builds.

`export_model_library_format(executable, path)` writes an uncompressed tar
(layout and metadata in docs/mlf.md):

    metadata.json                     version, model, target, memory, I/O, deps, build,
                                      checksums (SHA-256s of every member and of itself)
    codegen/host/src/*.c              generated C (kernels.c with the c target, host.c)
                                      and <model>_mlf.c, the plain C interface
    codegen/host/lib/*.o              generated objects (llvm targets)
    codegen/host/include/<model>.h    the plain C interface
    parameters/<model>.params         the weights: the `{prefix}_consts` image, binary
                                      (metadata.json's `parameters`: each weight's place
                                      and SHA-256)
    parameters/<model>_params.S       assembles that file (`.incbin`) into `.rodata`
    runtime/src/kiln_mlf.c            the workspace allocator (-DKILN_MLF_PREFIX=<model>)
    runtime/include/kiln/*.h          kiln.h and kiln_mlf.h
    src/<model>.py                    the compiled IR as kiln DSL text (source=True only)

The interface allocates nothing: `<model>_run(inputs..., outputs..., workspace)`
takes a caller-provided 64-byte aligned workspace of `<MODEL>_WORKSPACE_BYTES`
(or, built with `-D<MODEL>_STATIC_WORKSPACE`, uses a static one for NULL), and
the kernels' heap buffers come from that workspace through the stack allocator
of kiln_mlf.c (`KILN_MALLOC`/`KILN_FREE` of kernels.c), so with the c target the archive's
code references neither malloc nor free. Entries run serially
(`-DKILN_NO_THREADS`).
"""

from __future__ import annotations

import datetime
import json
import os
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln import __version__
from kiln.artifact.archive import add_file
from kiln.artifact.artifact import NATIVE, Artifact
from kiln.artifact.integrity import CHUNK_SIZE, DIGEST_SIZE, chunk_count, chunk_digests
from kiln.artifact.segments import Content
from kiln.errors import ExportError
from kiln.escape import c_comment, int64_literal, is_c_identifier
from kiln.export.dependencies import collect_dependencies
from kiln.export.mlf_parameters import parameter_table
from kiln.ir import dtype as dt
from kiln.ir.tensor import Allocate
from kiln.ir.visitor import iter_stmts
from kiln.runtime.abi import C_DTYPE_MACROS
from kiln.runtime.mlf import metadata_digest
from kiln.runtime.native import include_dir

# The format's versions (docs/mlf.md, "Versions"; kiln.mlf.load reads every one):
# 1 (2026-11-22): weights as a C array, the allocator generated into <model>_mlf.c.
# 2 (2026-11-23): weights as binary (`<model>.params` + `<model>_params.S`), the allocator
#   in runtime/src/kiln_mlf.c, the DSL source optional.
# 3 (2026-11-27): `checksums` in metadata.json: the chunk SHA-256s of every member and the
#   SHA-256 of metadata.json's own content, checked by kiln.mlf.load before it compiles.
# 4 (2026-11-27): `parameters` in metadata.json: each weight's name, dtype, shape, place in
#   `<model>.params` and SHA-256, checked by kiln.mlf.load, which names a damaged one.
MLF_VERSION = 4
# kiln_mlf.h's KILN_MLF_ALIGN: the workspace's and every buffer's alignment.
WORKSPACE_ALIGN = 64
# The model-independent allocator, copied into the archive as is.
ALLOCATOR_SOURCE = "runtime/src/kiln_mlf.c"


def _heap_bytes(executable: Any) -> int:
    """Bytes the kernels' heap buffers need at most: main's own (the arena) plus the
    largest total of any one kernel it calls (each frees its buffers before returning),
    with alignment slack per buffer."""

    totals: dict[str, int] = {}
    for name, fn in executable.ir.prim_funcs().items():
        total = 0
        for s in iter_stmts(fn.body):
            if isinstance(s, Allocate) and s.buffer.scope == "global":
                count = 1
                for d in s.buffer.shape:
                    if not isinstance(d, int):
                        raise ExportError(
                            f"Model Library Format: buffer '{s.buffer.name}' of '{name}' has a "
                            "symbolic size; firmware gets one workspace of fixed size, so pin "
                            "the model's dimensions (from_onnx(..., shape_dict=...), kiln "
                            "compile --shape; docs/dynamic-shapes.md)")
                    count *= d
                total += max(count * dt.itemsize(s.buffer.dtype), 1) + WORKSPACE_ALIGN
        totals[name] = total
    main = totals.pop("main", 0)
    return main + max(totals.values(), default=0)


def _signature(metadata: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    main = metadata.get("functions", {}).get("main")
    if main is None or main.get("kind") != "graph":
        raise ExportError("Model Library Format needs a graph function 'main' (a model "
                          "imported with kiln.frontend.from_onnx has one)")
    if main.get("runtime_dims"):
        names = ", ".join(str(d.get("name")) for d in main["runtime_dims"])
        raise ExportError(f"Model Library Format: main's results have data-dependent sizes "
                          f"({names}), which its fixed interface cannot return; export a "
                          "library (export_library) instead")
    ins = [dict(p) for p in main.get("params", [])]
    outs = [dict(r) for r in main.get("results", [])]
    for p in [*ins, *outs]:
        if p.get("kind") != "tensor" or p.get("dtype") not in C_DTYPE_MACROS:
            raise ExportError(f"Model Library Format: main's '{p.get('name')}' is not a "
                              "tensor of a supported dtype")
    return ins, outs


def _nbytes(p: Mapping[str, Any]) -> int:
    count = 1
    for d in p["shape"]:
        count *= int(d)
    return count * dt.itemsize(p["dtype"])


def interface_header(model: str, prefix: str, ins: Sequence[Mapping[str, Any]],
                     outs: Sequence[Mapping[str, Any]], workspace: int) -> str:
    """`<model>.h`: sizes and `<model>_run`."""
    upper = model.upper()
    params = [f"const void* in{i} /* {c_comment(str(p['name']))}: {p['dtype']}"
              f"{list(p['shape'])} */" for i, p in enumerate(ins)]
    params += [f"void* out{i} /* {c_comment(str(p['name']))}: {p['dtype']}"
               f"{list(p['shape'])} */" for i, p in enumerate(outs)]
    lines = [
        f"/* {model}.h -- plain C interface of a kiln Model Library Format archive.",
        " * Nothing is allocated: pass a workspace of "
        f"{upper}_WORKSPACE_BYTES bytes, {WORKSPACE_ALIGN}-byte aligned",
        f" * (or build {model}_mlf.c with -D{upper}_STATIC_WORKSPACE and pass NULL).",
        f" * Returns 0, or non-zero with the message in {prefix}_last_error(). */",
        f"#ifndef {upper}_MLF_H_", f"#define {upper}_MLF_H_", "",
        "#include <stdint.h>", "",
        "#ifdef __cplusplus", 'extern "C" {', "#endif", "",
        f"#define {upper}_WORKSPACE_BYTES {workspace}",
        f"#define {upper}_NUM_INPUTS {len(ins)}",
        f"#define {upper}_NUM_OUTPUTS {len(outs)}",
        *(f"#define {upper}_INPUT{i}_BYTES {_nbytes(p)}" for i, p in enumerate(ins)),
        *(f"#define {upper}_OUTPUT{i}_BYTES {_nbytes(p)}" for i, p in enumerate(outs)),
        "",
        f"int32_t {model}_run({', '.join([*params, 'void* workspace'])});",
        f"const char* {prefix}_last_error(void);",
        "",
        "#ifdef __cplusplus", "}", "#endif", f"#endif /* {upper}_MLF_H_ */", "",
    ]
    return "\n".join(lines)


def interface_source(model: str, prefix: str, ins: Sequence[Mapping[str, Any]],
                     outs: Sequence[Mapping[str, Any]]) -> str:
    """`<model>_mlf.c`: `<model>_run`, which points the allocator of kiln_mlf.c (built
    with `-DKILN_MLF_PREFIX=<model>`) at the workspace and calls the packed main."""
    upper = model.upper()
    n = len(ins) + len(outs)
    shapes, tensors = [], []
    for i, p in enumerate([*ins, *outs]):
        kind, k = ("in", i) if i < len(ins) else ("out", i - len(ins))
        dims = ", ".join(int64_literal(int(d)) for d in p["shape"]) or "0"
        shapes.append(f"  static int64_t shape{i}[{max(len(p['shape']), 1)}] = {{{dims}}};")
        cast = "(void*)" if kind == "in" else ""
        tensors.append(f"  t[{i}] = kiln_tensor({cast}{kind}{k}, {len(p['shape'])}, shape{i}, "
                       f"{C_DTYPE_MACROS[p['dtype']]});")
        tensors.append(f"  kiln_set_tensor(args, codes, {i}, &t[{i}]);")
    params = [f"const void* in{i}" for i in range(len(ins))]
    params += [f"void* out{i}" for i in range(len(outs))]
    return "\n".join([
        f"/* {model}_mlf.c -- generated by kiln: the plain C interface of {model}.h. */",
        "#include <stddef.h>", "#include <stdint.h>", "", "#include <kiln/kiln.h>",
        f"#define KILN_MLF_PREFIX {model}", "#include <kiln/kiln_mlf.h>",
        f'#include "{model}.h"', "",
        f"int32_t {prefix}main(const KilnValue* args, const int32_t* type_codes, "
        "int32_t num_args);", "",
        f"#ifdef {upper}_STATIC_WORKSPACE",
        f"static _Alignas({WORKSPACE_ALIGN}) uint8_t "
        f"{model}_static_workspace[{upper}_WORKSPACE_BYTES];",
        "#endif", "",
        f"int32_t {model}_run({', '.join([*params, 'void* workspace'])}) {{",
        f"  KilnValue args[{n}];", f"  int32_t codes[{n}];", f"  DLTensor t[{n}];",
        *shapes,
        f"#ifdef {upper}_STATIC_WORKSPACE",
        f"  if (workspace == NULL) workspace = {model}_static_workspace;",
        "#endif",
        f"  {model}_mlf_reset(workspace, {upper}_WORKSPACE_BYTES);",
        *tensors,
        f"  return {prefix}main(args, codes, {n});",
        "}", "",
    ])


def params_source(prefix: str, params_file: str, size: int) -> str:
    """`<model>_params.S`: the weights file `params_file` (found through `-Iparameters`,
    which gcc and clang pass to the assembler) as the read-only, 64-byte aligned symbol
    `{prefix}_consts` in `.rodata` (flash on a microcontroller), bytes as they are."""
    symbol = f"{prefix}_consts"
    return "\n".join([
        "/* Generated by kiln: the model's weights (the .params file next to this one),",
        "   assembled as they are. Preprocessed (.S) for the object format's spelling. */",
        "#if defined(__APPLE__)",
        f"#define KILN_CONSTS _{symbol}",
        "\t.const",
        "#elif defined(_WIN32)",
        f"#define KILN_CONSTS {symbol}",
        '\t.section .rdata,"dr"',
        "#else",
        f"#define KILN_CONSTS {symbol}",
        '\t.section .rodata,"a",%progbits',
        "#endif",
        f"\t.balign {WORKSPACE_ALIGN}",
        "\t.globl KILN_CONSTS",
        "KILN_CONSTS:",
        f'\t.incbin "{params_file}"',
        *(["\t.byte 0  /* no weights: the symbol still has a byte */"] if size == 0 else []),
        "#if defined(__ELF__)",
        "\t.type KILN_CONSTS, %object",
        "\t.size KILN_CONSTS, . - KILN_CONSTS",
        '\t.section .note.GNU-stack,"",%progbits',
        "#endif",
        "",
    ])


def _checksums(files: Mapping[str, Content], records: Mapping[str, Mapping[str, Any]]
               ) -> dict[str, Any]:
    """metadata.json's `checksums` (docs/mlf.md), all but `metadata_sha256`: the chunk
    SHA-256s (kiln.artifact.integrity) of every member, as hex. A member whose artifact
    recorded its chunk hashes (the weights: hashed once, when the pool was built) reuses
    them."""
    digests = {}
    for name, content in sorted(files.items()):
        record = records.get(name, {})
        known = record.get("chunk_sha256")
        if (record.get("chunk_size") == CHUNK_SIZE and isinstance(known, str)
                and len(known) == 2 * DIGEST_SIZE * chunk_count(len(content))):
            digests[name] = known
        else:
            digests[name] = chunk_digests(content).hex()
    return {"chunk_size": CHUNK_SIZE, "chunk_sha256": digests}


def _export_datetime() -> str:
    """`export_datetime`: `$SOURCE_DATE_EPOCH` (the reproducible-builds convention) when
    set, else the epoch, so that exporting one model twice gives identical archives."""
    raw = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    seconds = int(raw) if raw.isdigit() else 0
    stamp = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Members:
    """An archive's members by path (large ones, weights and objects, stay the artifacts'
    own memory), the C flags of each C source, and the weights with their artifact's
    metadata."""

    files: dict[str, Content] = field(default_factory=dict)
    cflags: dict[str, list[str]] = field(default_factory=dict)
    consts: Content = b""
    consts_record: Mapping[str, Any] = field(default_factory=dict)


def _artifact_members(arts: Sequence[Any], model_name: str) -> _Members:
    """The members the artifacts give: a device's code, the generated C (with its flags)
    and objects, and the weights."""
    m = _Members()
    for a in arts:
        if a.loader != NATIVE:
            if a.target_key and isinstance(a, Artifact):  # a device's code (e.g. CUDA PTX)
                m.files[f"codegen/{a.codegen_id}/{a.file_name}"] = a.content
            continue
        if a.file_name == "constants.bin":
            m.consts, m.consts_record = a.content, a.metadata
        elif a.extension == ".c":
            member = f"codegen/host/src/{a.file_name}"
            m.files[member] = a.content
            # The archive's own allocator replaces a library's (below).
            flags = [f for f in a.metadata.get("cflags", []) if f != "-fPIC"
                     and not f.startswith(("-DKILN_MALLOC=", "-DKILN_FREE="))]
            # A device's file names start with its target key (docs/artifacts.md).
            # kernels.c's heap buffers, and host.c's workspace functions (which LLVM-built
            # kernels call), come from the archive's workspace.
            flags += [f"-DKILN_MALLOC={model_name}_mlf_malloc",
                      f"-DKILN_FREE={model_name}_mlf_free"]
            if a.file_name.removeprefix(f"{a.target_key}_") != "kernels.c":
                flags += ["-DKILN_NO_THREADS"]
            m.cflags[member] = sorted(set(flags), key=flags.index)
        elif a.extension == ".o":
            m.files[f"codegen/host/lib/{a.file_name}"] = a.content
        else:
            raise ExportError(f"Model Library Format: no place for native artifact "
                              f"{a.codegen_id}/{a.file_name}")
    return m


def _archive_metadata(executable: Any, model_name: str, ins: Sequence[Mapping[str, Any]],
                      outs: Sequence[Mapping[str, Any]], workspace: int, arts: Sequence[Any],
                      m: _Members) -> dict[str, Any]:
    """metadata.json's content (docs/mlf.md) for the members `m` hold so far, its own
    digest included."""

    io_bytes = sum(_nbytes(p) for p in [*ins, *outs])
    metadata = {
        "version": MLF_VERSION,
        "model_name": model_name,
        "kiln_version": __version__,
        "export_datetime": _export_datetime(),
        "target": executable.target.export(),
        "prefix": executable.prefix,
        "memory": {"main": {"workspace_bytes": workspace, "constants_bytes": len(m.consts),
                            "io_bytes": io_bytes}},
        "inputs": [{"name": p["name"], "shape": list(p["shape"]), "dtype": p["dtype"]}
                   for p in ins],
        "outputs": [{"name": p["name"], "shape": list(p["shape"]), "dtype": p["dtype"]}
                    for p in outs],
        "external_dependencies": [d.to_json() for d in collect_dependencies(arts)],
        "parameters": parameter_table(executable, m.consts, m.consts_record),
        "build": {"cflags": m.cflags,
                  "include_dirs": ["codegen/host/include", "runtime/include", "parameters"],
                  "libs": ["-lm"]},
        "checksums": _checksums(m.files,
                                {f"parameters/{model_name}.params": m.consts_record}),
    }
    metadata["checksums"]["metadata_sha256"] = metadata_digest(metadata)
    return metadata


def _write_tar(out: Path, files: Mapping[str, Content]) -> Path:
    """Write `files` as an uncompressed tar at `out`, sorted by path, all or nothing
    (through a temporary file beside it)."""

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(files):
                add_file(tar, name, files[name])
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def export_model_library_format(executable: Any, path: str | os.PathLike[str], *,
                                model_name: str = "model", source: bool = False) -> Path:
    """Write `executable` as a Model Library Format tar at `path` (docs/mlf.md).

    The weights go in as they are (`parameters/<model>.params`, assembled by
    `<model>_params.S`), streamed from the executable's memory. `source=True` adds
    the compiled IR as kiln DSL text (`src/<model>.py`; `kiln compile --mlf-source`).
    """
    if not is_c_identifier(model_name) or model_name.startswith("kiln"):
        raise ExportError(f"model_name {model_name!r} must be a C identifier not starting "
                          "with 'kiln'")

    prefix = executable.prefix
    arts = list(executable.artifacts)
    if any(not a.serializable for a in arts):
        raise ExportError("Model Library Format needs a native target (llvm or c); this "
                          "executable holds in-memory artifacts")
    ins, outs = _signature(executable.metadata)
    workspace = _heap_bytes(executable)
    m = _artifact_members(arts, model_name)
    files, build = m.files, m.cflags
    include = Path(include_dir()) / "kiln"
    files[f"codegen/host/include/{model_name}.h"] = interface_header(
        model_name, prefix, ins, outs, workspace).encode()
    iface = f"codegen/host/src/{model_name}_mlf.c"
    files[iface] = interface_source(model_name, prefix, ins, outs).encode()
    build[iface] = ["-std=c11"]
    files[ALLOCATOR_SOURCE] = (include / "kiln_mlf.c").read_bytes()
    build[ALLOCATOR_SOURCE] = ["-std=c11", f"-DKILN_MLF_PREFIX={model_name}"]
    files[f"parameters/{model_name}.params"] = m.consts
    params_s = f"parameters/{model_name}_params.S"
    files[params_s] = params_source(prefix, f"{model_name}.params", len(m.consts)).encode()
    build[params_s] = []
    if source:
        files[f"src/{model_name}.py"] = executable.ir.script().encode()
    for header in ("kiln.h", "kiln_mlf.h"):
        files[f"runtime/include/kiln/{header}"] = (include / header).read_bytes()
    metadata = _archive_metadata(executable, model_name, ins, outs, workspace, arts, m)
    files["metadata.json"] = (json.dumps(metadata, indent=2, sort_keys=True) + "\n").encode()
    return _write_tar(Path(path), files)


__all__ = ["ALLOCATOR_SOURCE", "MLF_VERSION", "export_model_library_format", "interface_header",
           "interface_source", "params_source"]

"""`kiln inspect`: what a kiln `.so`, `.tar`, `.a` or MLF tar holds, without running it."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from kiln.cli.inspect_weights import library_weights, mlf_weights, weights_lines
from kiln.cli.targets import format_table
from kiln.errors import FormatError, UsageError

AR_MAGIC = b"!<arch>\n"


def _ar_members(path: str) -> list[bytes]:
    """The contents of the members of a Unix `ar` archive (the common System V/GNU layout)."""
    with open(path, "rb") as f:
        data = f.read()
    members, pos = [], len(AR_MAGIC)
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        if header[58:60] != b"`\n":
            raise FormatError(f"{path}: damaged ar member header at byte {pos}")
        try:
            size = int(header[48:58].decode("ascii").strip())
        except ValueError:
            raise FormatError(f"{path}: damaged ar member size at byte {pos}") from None
        name = header[:16].decode("ascii", "replace").strip()
        body = data[pos + 60:pos + 60 + size]
        if name not in ("/", "//", "/SYM64/"):  # symbol and long-name tables
            members.append(body)
        pos += 60 + size + (size & 1)
    return members


def report_metadata(path: str) -> dict[str, Any]:
    """The metadata `kiln inspect --report` draws: the library's, or an MLF archive's."""
    mlf = _mlf_members(path)
    if mlf is not None:
        return mlf_metadata(mlf, path)
    return _library_metadata(path, load_any(path)[1])


def _library_metadata(path: str, metadata: dict[str, Any] | None) -> dict[str, Any]:
    """The library metadata of `path`, checked (`kiln.artifact.library_schema`): the
    report and the description walk it without guarding each access."""
    from kiln.artifact.library_schema import (
        check_library_metadata,  # heavy: kept off the cli's startup (kiln --help)
    )

    return check_library_metadata(metadata or {}, f"{path}: library metadata")


def load_any(path: str) -> tuple[Any, dict[str, Any], str]:
    """(artifacts, library metadata, file kind) of a kiln `.so`, `.tar`, blob or `.a`."""
    from kiln.artifact import load_with_metadata  # heavy: kept off the cli's startup (kiln --help)
    from kiln.artifact.elf import ELF_MAGIC  # heavy: kept off the cli's startup (kiln --help)

    with open(path, "rb") as f:
        head = f.read(8)
    if not head.startswith(AR_MAGIC):
        artifacts, metadata = load_with_metadata(path)
        from kiln.artifact.blob import MAGIC  # heavy: kept off the cli's startup (kiln --help)

        kind = ("shared library" if head.startswith(ELF_MAGIC)
                else "blob" if head.startswith(MAGIC) else "artifact archive")
        return artifacts, metadata, kind
    # A static library: kiln puts its blob symbol into one of the objects.
    for body in _ar_members(path):
        if not body.startswith(ELF_MAGIC):
            continue
        with tempfile.NamedTemporaryFile(suffix=".o", delete=False) as tmp:
            tmp.write(body)
        try:
            artifacts, metadata = load_with_metadata(tmp.name)
        except FormatError:
            continue
        finally:
            os.unlink(tmp.name)
        return artifacts, metadata, "static library"
    raise FormatError(f"{path}: a static library with no kiln blob in any of its objects")


MLF_KIND = "Model Library Format archive"


@dataclass
class MLFFiles:
    """What `kiln inspect` reads of an MLF tar: every file's size, and the bytes of
    metadata.json and of the one file asked for (never the whole archive in memory)."""

    sizes: dict[str, int]
    data: dict[str, bytes]


def _mlf_members(path: str, keep: str | None = None) -> MLFFiles | None:
    """The files of a Model Library Format tar (docs/mlf.md), or None if `path` is not
    one (not a tar, or a tar without MLF's metadata.json). The tar may be compressed;
    it is read through `kiln.artifact.safe_tar`, with its limits."""
    from kiln.artifact import safe_tar  # heavy: kept off the cli's startup (kiln --help)

    if not safe_tar.looks_like_tar(path):
        return None
    sizes: dict[str, int] = {}
    data: dict[str, bytes] = {}
    fail = _failer(f"{path}: Model Library Format archive")
    for member, reader in safe_tar.members(path, f"{path}: tar archive", allow_compressed=True,
                                           dot_prefix=True):
        if reader is None:
            continue
        if member.name in sizes:
            fail(f"member '{member.name}' appears more than once")
        sizes[member.name] = member.size
        if member.name == "metadata.json" and member.size > safe_tar.MAX_JSON_BYTES:
            fail(f"metadata.json is {member.size} bytes, over the "
                 f"{safe_tar.MAX_JSON_BYTES}-byte limit")
        if member.name in ("metadata.json", keep):
            data[member.name] = safe_tar.read_exactly(reader, member, fail)
    if "metadata.json" not in sizes or "manifest.json" in sizes:
        return None
    return MLFFiles(sizes, data)


def _failer(where: str) -> Callable[[str], NoReturn]:
    def fail(message: str) -> NoReturn:
        raise FormatError(f"{where}: {message}")
    return fail


def mlf_metadata(files: MLFFiles, path: str) -> dict[str, Any]:
    """The MLF metadata.json, checked (`kiln.mlf.METADATA_SCHEMA`), with its model's entry
    point as a library-style "functions"."""
    from kiln.artifact.library_schema import (
        check_library_metadata,  # heavy: kept off the cli's startup (kiln --help)
    )
    from kiln.runtime.mlf import read_metadata  # heavy: kept off the cli's startup (kiln --help)

    meta = read_metadata(files.data["metadata.json"], f"{path}: metadata.json")
    # Only what the schema checked reaches the report: no "functions" or "graphs" that
    # metadata.json carries beside it.
    meta = {k: v for k, v in meta.items() if k not in ("functions", "graphs")}
    meta["functions"] = {"main": {"kind": "graph", "params": meta["inputs"],
                                  "results": meta["outputs"]}}
    return check_library_metadata(meta, f"{path}: metadata.json")


def _describe_mlf(path: str, files: MLFFiles) -> dict[str, Any]:
    meta = mlf_metadata(files, path)
    functions = {name: {"kind": fn.get("kind"),
                        "inputs": [_tensor(p) for p in fn.get("params", [])],
                        "outputs": [_tensor(p) for p in fn.get("results", [])]}
                 for name, fn in meta["functions"].items()}
    target = meta.get("target") or {}
    return {
        "file": path, "kind": MLF_KIND, "format": "mlf", "format_version": meta.get("version"),
        "kiln_version": meta.get("kiln_version"), "prefix": meta.get("prefix"),
        "targets": [{"codegen": str(target.get("kind", "?")),
                     "triple": str(target.get("mtriple", "")),
                     "cpu": str(target.get("mcpu", ""))}] if target else [],
        "functions": functions,
        "artifacts": [{"codegen": "mlf", "loader": "none", "name": name, "size": size,
                       "linked": False} for name, size in files.sizes.items()],
        "weight_bytes": sum(size for n, size in files.sizes.items()
                            if n.startswith("parameters/") and n.endswith(".params")),
        "weights": mlf_weights(meta, files.sizes),
        "external_dependencies": list(meta.get("external_dependencies") or []),
        "profile_sites": 0,  # MLF's metadata.json does not list them
    }


def _show_mlf(path: str, files: MLFFiles, member: str) -> str:
    if member not in files.data:
        raise UsageError(f"no file {member!r} in {path}; it has: {', '.join(files.sizes)}")
    try:
        return files.data[member].decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{path}: {member} is binary ({files.sizes[member]} bytes); "
                         "extract it with tar") from None


def _tensor(p: dict[str, Any]) -> dict[str, Any]:
    return {"name": p.get("name"), "shape": p.get("shape"), "dtype": p.get("dtype")}


def describe(path: str) -> dict[str, Any]:
    """Everything `kiln inspect` reports about `path`, as plain JSON-able data."""
    mlf = _mlf_members(path)
    if mlf is not None:
        return _describe_mlf(path, mlf)
    artifacts, raw_metadata, kind = load_any(path)
    metadata = _library_metadata(path, raw_metadata)
    functions = {}
    for name, fn in (metadata.get("functions") or {}).items():
        params = fn.get("params", [])
        functions[name] = {
            "kind": fn.get("kind"),
            "inputs": [_tensor(p) for p in params if not p.get("written")],
            "outputs": ([_tensor(p) for p in fn.get("results", [])]
                        + [_tensor(p) for p in params if p.get("written")]),
            # symbolic dimensions: the sizes each call reads from its inputs, and their bounds
            "dims": [{"name": d.get("name"), "min": d.get("min"), "max": d.get("max")}
                     for d in fn.get("dims") or []],
        }
    rows, targets, weight_bytes = [], [], 0
    for a in artifacts:
        meta = dict(a.metadata)
        linked = meta.get("size")  # a linked stub's size (its bytes are in the library)
        size = linked if meta.get("linked") and isinstance(linked, int) else a.size
        rows.append({"codegen": a.codegen_id, "loader": a.loader, "name": a.file_name,
                     "size": size, "linked": bool(meta.get("linked"))})
        if "chunk_sha256" in meta:  # the constants blob: the model's weights
            weight_bytes += size
        if "triple" in meta:
            t = {"codegen": a.codegen_id, "triple": str(meta["triple"]),
                 "cpu": str(meta.get("cpu", ""))}
            if t not in targets:
                targets.append(t)
    return {
        "file": path, "kind": kind, "format": metadata.get("format"),
        "format_version": metadata.get("version"), "kiln_version": metadata.get("kiln_version"),
        "prefix": metadata.get("prefix"), "targets": targets, "functions": functions,
        "artifacts": rows, "weight_bytes": weight_bytes,
        # weights="external": the weights file the library maps (docs/format.md)
        "weights_file": metadata.get("weights") if isinstance(metadata.get("weights"), dict)
        else None,
        "weights": library_weights(path, artifacts, metadata),
        "external_dependencies": list(metadata.get("external_dependencies") or []),
        "profile_sites": len((metadata.get("profile") or {}).get("sites", [])),
        "tuning": metadata.get("tuning"),
        "generic_kernels": list(metadata.get("generic_kernels") or []),
    }


def _shape(t: dict[str, Any]) -> str:
    shape = t.get("shape")
    return "?" if shape is None else "(" + ", ".join(str(d) for d in shape) + ")"


def as_text(info: dict[str, Any], weights: bool = False) -> str:
    """The human-readable report of `describe`; `weights` lists every weight tensor with
    its SHA-256."""

    lines = [f"{info['file']}: kiln {info['kind']}",
             f"  format:   {info['format']} version {info['format_version']} "
             f"(written by kiln {info['kiln_version']}), symbol prefix {info['prefix']!r}"]
    for t in info["targets"]:
        lines.append(f"  target:   {t['codegen']}" + (f": {t['triple']}" if t["triple"] else "")
                     + (f" cpu={t['cpu']}" if t["cpu"] else ""))
    lines.append(f"  weights:  {info['weight_bytes']} bytes")
    external = info.get("weights_file")
    if external:
        lines[-1] += (f" in the weights file {external.get('file')!r} beside the library "
                      f"(content sha256 {str(external.get('content_sha256'))[:16]}...)")
    if info.get("profile_sites"):
        lines.append(f"  profile:  {info['profile_sites']} timer sites (kiln run --profile)")
    tuning = info.get("tuning")
    if isinstance(tuning, dict):
        lines.append(f"  tuning:   database sha256 {tuning.get('fingerprint')}, "
                     f"{len(tuning.get('kernels') or {})} kernel(s) tuned for "
                     f"{tuning.get('target')}, "
                     + ("checked in this model" if tuning.get("checked_in_model")
                        else "not checked in this model"))
    for d in info["external_dependencies"]:
        lines.append(f"  depends:  {d.get('short_name')} {d.get('version_spec', '')} "
                     f"({d.get('url_type')}: {d.get('url') or '-'})")
    lines.append("functions:")
    for name, fn in info["functions"].items():
        lines.append(f"  {name} ({fn['kind']})")
        for role in ("inputs", "outputs"):
            for t in fn[role]:
                lines.append(f"    {role[:-1]:<7}{t['name']:<12}{_shape(t):<15} {t['dtype']}")
        for d in fn.get("dims", []):
            high = "" if d["max"] is None else f" <= {d['max']}"
            lines.append(f"    {'dim':<7}{d['name']:<12}{d['min']} <= {d['name']}{high}")
    lines.extend(_generic_lines(info.get("generic_kernels") or []))
    lines.extend(weights_lines(info["weights"], info["kind"], weights))
    lines.append("artifacts:")
    rows = [(a["codegen"], a["loader"], a["name"],
             f"{a['size']}" + (" (linked)" if a["linked"] else ""))
            for a in info["artifacts"]]
    table = format_table(("codegen", "loader", "name", "size"), rows)
    lines.extend("  " + line for line in table.splitlines())
    return "\n".join(lines)


def _generic_lines(found: list[dict[str, Any]]) -> list[str]:
    """The block listing kernels a symbolic size left on their generic loops (the
    library metadata's "generic_kernels", kiln.driver.generic_kernels), with each pin."""
    if not found:
        return []
    from kiln.artifact import generic_kernels  # lazy: kept off the cli's startup (kiln --help)

    lines = [f"generic kernels: {len(found)} run their generic loops because a size is "
             "symbolic (pinned, a hand-built kernel takes them):"]
    for e in found:
        lines.append(f"  {generic_kernels.where(e)} -> {e.get('kernel')} with {e.get('hint')}")
    return lines


def cmd_inspect(path: str, artifact: str | None, fmt: str | None,
                weights: bool = False) -> str:
    """The output of `kiln inspect` (see the command's --help); `weights` lists each
    weight tensor with its SHA-256 in the text report (the JSON one always has them)."""
    if artifact is None:
        if fmt not in (None, "text", "json"):
            raise UsageError(f"--format {fmt!r} without --artifact: use text or json")
        info = describe(path)
        return json.dumps(info, indent=2) if fmt == "json" else as_text(info, weights)
    if weights:
        raise UsageError("--weights goes with the report, not with --show")
    from kiln.artifact import inspect_artifact  # heavy: kept off the cli's startup (kiln --help)

    mlf = _mlf_members(path, keep=artifact)
    if mlf is not None:
        return _show_mlf(path, mlf, artifact)
    artifacts, _, _ = load_any(path)
    codegen_id, _, file_name = artifact.partition("/")
    found = artifacts.get(codegen_id, file_name)
    if found is None:
        names = ", ".join(f"{a.codegen_id}/{a.file_name}" for a in artifacts)
        raise UsageError(f"no artifact {artifact!r} in {path}; it has: {names}")
    text: str = inspect_artifact(found, fmt)
    return text

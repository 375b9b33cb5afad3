"""`kiln inspect`: what a kiln `.so`, `.tar`, `.a` or MLF tar holds, without running it."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from kiln.errors import FormatError

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
    return load_any(path)[1] or {}


def load_any(path: str) -> tuple[Any, dict[str, Any], str]:
    """(artifacts, library metadata, file kind) of a kiln `.so`, `.tar`, blob or `.a`."""
    from kiln.artifact import load_with_metadata
    from kiln.artifact.elf import ELF_MAGIC

    with open(path, "rb") as f:
        head = f.read(8)
    if not head.startswith(AR_MAGIC):
        artifacts, metadata = load_with_metadata(path)
        from kiln.artifact.blob import MAGIC

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


def _mlf_members(path: str) -> dict[str, bytes] | None:
    """The files of a Model Library Format tar (docs/mlf.md) by path, or None if `path`
    is not one (not a tar, or a tar without MLF's metadata.json)."""
    import tarfile

    if not tarfile.is_tarfile(path):
        return None
    with tarfile.open(path) as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isfile()}
        if "metadata.json" not in members or "manifest.json" in members:
            return None
        files = {}
        for name, member in members.items():
            f = tar.extractfile(member)
            if f is not None:
                files[name] = f.read()
    return files


def mlf_metadata(files: dict[str, bytes], path: str) -> dict[str, Any]:
    """The MLF metadata.json, with its model's entry point as a library-style "functions"."""
    try:
        meta: dict[str, Any] = json.loads(files["metadata.json"])
    except ValueError as exc:
        raise FormatError(f"{path}: metadata.json is not JSON: {exc}") from None
    if not isinstance(meta, dict) or "model_name" not in meta:
        raise FormatError(f"{path}: metadata.json has no model_name: not a Model Library "
                          "Format archive")
    meta.setdefault("functions", {"main": {"kind": "graph", "params": meta.get("inputs", []),
                                           "results": meta.get("outputs", [])}})
    return meta


def _describe_mlf(path: str, files: dict[str, bytes]) -> dict[str, Any]:
    meta = mlf_metadata(files, path)
    functions = {name: {"kind": fn.get("kind"),
                        "inputs": [_tensor(p) for p in fn.get("params", [])],
                        "outputs": [_tensor(p) for p in fn.get("results", [])]}
                 for name, fn in meta["functions"].items()}
    target = meta.get("target") or {}
    return {
        "file": path, "kind": MLF_KIND, "format": "mlf", "format_version": meta.get("version"),
        "kiln_version": meta.get("kiln_version"), "prefix": meta.get("prefix"),
        "targets": [{"codegen": target.get("kind", "?"), "triple": target.get("mtriple", ""),
                     "cpu": target.get("mcpu", "")}] if target else [],
        "functions": functions,
        "artifacts": [{"codegen": "mlf", "loader": "none", "name": name, "size": len(data),
                       "linked": False} for name, data in files.items()],
        "weight_bytes": sum(len(d) for n, d in files.items()
                            if n.startswith("parameters/") and n.endswith(".params")),
        "external_dependencies": list(meta.get("external_dependencies") or []),
        "profile_sites": 0,  # MLF's metadata.json does not list them
    }


def _show_mlf(path: str, files: dict[str, bytes], member: str) -> str:
    if member not in files:
        raise ValueError(f"no file {member!r} in {path}; it has: {', '.join(files)}")
    try:
        return files[member].decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: {member} is binary ({len(files[member])} bytes); "
                         "extract it with tar") from None


def _tensor(p: dict[str, Any]) -> dict[str, Any]:
    return {"name": p.get("name"), "shape": p.get("shape"), "dtype": p.get("dtype")}


def describe(path: str) -> dict[str, Any]:
    """Everything `kiln inspect` reports about `path`, as plain JSON-able data."""
    mlf = _mlf_members(path)
    if mlf is not None:
        return _describe_mlf(path, mlf)
    artifacts, metadata, kind = load_any(path)
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
        size = int(meta.get("size", a.size)) if meta.get("linked") else a.size
        rows.append({"codegen": a.codegen_id, "loader": a.loader, "name": a.file_name,
                     "size": size, "linked": bool(meta.get("linked"))})
        if "chunk_sha256" in meta:  # the constants blob: the model's weights
            weight_bytes += size
        if "triple" in meta:
            t = {"codegen": a.codegen_id, "triple": meta["triple"], "cpu": meta.get("cpu", "")}
            if t not in targets:
                targets.append(t)
    return {
        "file": path, "kind": kind, "format": metadata.get("format"),
        "format_version": metadata.get("version"), "kiln_version": metadata.get("kiln_version"),
        "prefix": metadata.get("prefix"), "targets": targets, "functions": functions,
        "artifacts": rows, "weight_bytes": weight_bytes,
        "external_dependencies": list(metadata.get("external_dependencies") or []),
        "profile_sites": len((metadata.get("profile") or {}).get("sites", [])),
    }


def _shape(t: dict[str, Any]) -> str:
    shape = t.get("shape")
    return "?" if shape is None else "(" + ", ".join(str(d) for d in shape) + ")"


def as_text(info: dict[str, Any]) -> str:
    """The human-readable report of `describe`."""
    from kiln.cli.targets import format_table

    lines = [f"{info['file']}: kiln {info['kind']}",
             f"  format:   {info['format']} version {info['format_version']} "
             f"(written by kiln {info['kiln_version']}), symbol prefix {info['prefix']!r}"]
    for t in info["targets"]:
        lines.append(f"  target:   {t['codegen']}" + (f": {t['triple']}" if t["triple"] else "")
                     + (f" cpu={t['cpu']}" if t["cpu"] else ""))
    lines.append(f"  weights:  {info['weight_bytes']} bytes")
    if info.get("profile_sites"):
        lines.append(f"  profile:  {info['profile_sites']} timer sites (kiln run --profile)")
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
    lines.append("artifacts:")
    rows = [(a["codegen"], a["loader"], a["name"],
             f"{a['size']}" + (" (linked)" if a["linked"] else ""))
            for a in info["artifacts"]]
    table = format_table(("codegen", "loader", "name", "size"), rows)
    lines.extend("  " + line for line in table.splitlines())
    return "\n".join(lines)


def cmd_inspect(path: str, artifact: str | None, fmt: str | None) -> str:
    """The output of `kiln inspect` (see the command's --help)."""
    if artifact is None:
        if fmt not in (None, "text", "json"):
            raise ValueError(f"--format {fmt!r} without --artifact: use text or json")
        info = describe(path)
        return json.dumps(info, indent=2) if fmt == "json" else as_text(info)
    from kiln.artifact import inspect_artifact

    mlf = _mlf_members(path)
    if mlf is not None:
        return _show_mlf(path, mlf, artifact)
    artifacts, _, _ = load_any(path)
    codegen_id, _, file_name = artifact.partition("/")
    found = artifacts.get(codegen_id, file_name)
    if found is None:
        names = ", ".join(f"{a.codegen_id}/{a.file_name}" for a in artifacts)
        raise ValueError(f"no artifact {artifact!r} in {path}; it has: {names}")
    text: str = inspect_artifact(found, fmt)
    return text

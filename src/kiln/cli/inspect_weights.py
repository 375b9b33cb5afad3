"""The "weights" section of `kiln inspect`: where a library's or MLF archive's weights
live, how many tensors and bytes, their SHA-256s, and which weight transforms the file
can replay (docs/cli.md, "kiln inspect").

A library's weights are embedded (native data artifacts linked into it, each recorded
with its chunk SHA-256s) or external (a weights file, docs/format.md "The weights
file": its name, content hash and tensors are in the library metadata, and the file is
looked for beside the library, its header read and its content hash compared; the data
itself is checked by `load_module`, lazily). An MLF archive's weights are its
`parameters/<model>.params` member; from MLF version 4 metadata.json records each
weight's SHA-256 (`parameters`).

The transforms a library can replay are those of its replay record (docs/format.md,
"The replay record": the steps and numpy functions that rebuild its constants from the
model's named weights, what `Module.swap_weights` runs); none when it has no record, or
when some constant has no replay (swap_weights refuses, the note says how many).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kiln.errors import KilnError

# What the section says when nothing can be replayed: a library without a replay record
# (compiled from IR without named weights, or before swap_weights), or an MLF archive
# (compiled on the device's host: new weights need a new archive).
REPLAYABLE_NOTE = "none (no replay record: new weights need a compile)"
MLF_NOTE = "none (an MLF archive: new weights need a new archive)"


def replayable(artifacts: Sequence[Any]) -> tuple[list[str], str]:
    """(the steps and functions of the library's replay record, sorted; "" or why none)."""
    records = [dict(a.metadata)["replay"] for a in artifacts
               if isinstance(dict(a.metadata).get("replay"), Mapping)]
    if not records:
        return [], REPLAYABLE_NOTE
    kinds: set[str] = set()
    unknown = 0
    for record in records:
        for c in record.get("constants") or []:
            unknown += isinstance(c, Mapping) and "unknown" in c
            todo = [c]
            while todo:
                node = todo.pop()
                if not isinstance(node, Mapping):
                    continue
                if isinstance(node.get("op"), str):
                    kinds.add(str(node["fn"]) if node["op"] == "apply" else node["op"])
                todo.append(node.get("x"))
                todo.extend(node.get("args") or [])
    if unknown:
        return [], (f"none ({unknown} constant(s) made by transforms without a replay: "
                    "swap_weights refuses; new weights need a compile)")
    return sorted(kinds), ""


def _tree_sha256(chunks: Any, size: int, chunk_size: Any) -> str | None:
    """The tree digest (kiln.artifact.integrity) of recorded chunk hashes, or None when
    the record is not one."""
    from kiln.artifact.integrity import (  # heavy: kept off the cli's startup (kiln --help)
        chunk_count,
        tree_digest,
    )

    if not isinstance(chunks, str) or not isinstance(chunk_size, int) or chunk_size <= 0:
        return None
    try:
        digests = bytes.fromhex(chunks)
    except ValueError:
        return None
    if len(digests) != 32 * chunk_count(size, chunk_size):
        return None
    return tree_digest(digests, size, chunk_size)


def _embedded(artifacts: Sequence[Any]) -> dict[str, Any]:
    """The weights of the native data artifacts linked into a library."""
    tensors = []
    for a in artifacts:
        meta = dict(a.metadata)
        if "chunk_sha256" not in meta:
            continue
        linked = meta.get("size")  # a linked stub's size (its bytes are in the library)
        size = linked if meta.get("linked") and isinstance(linked, int) else a.size
        tensors.append({"name": f"{a.codegen_id}/{a.file_name}", "bytes": size,
                        "arrays": meta.get("count"),
                        "chunked_sha256": _tree_sha256(meta["chunk_sha256"], size,
                                               meta.get("chunk_size"))})
    return {"where": "embedded", "tensors": tensors}


def _external(path: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """The weights file a library records: found beside it or not, and whether its
    header's content hash is the one the library was built with."""
    from kiln.artifact.weights_file import (
        read_header,  # heavy: kept off the cli's startup (kiln --help)
    )

    file = Path(path).resolve().parent / str(entry.get("file"))
    wanted = str(entry.get("content_sha256"))
    info: dict[str, Any] = {
        "where": "external", "file": str(file), "content_sha256": wanted,
        "found": file.is_file(), "hash_matches": None, "problem": None,
        "tensors": [{"name": t.get("name"), "bytes": t.get("size"),
                     "chunked_sha256": t.get("sha256")}
                    for t in entry.get("tensors") or [] if isinstance(t, Mapping)]}
    if not info["found"]:
        info["problem"] = "not found (load_module(..., weights=PATH) points elsewhere)"
        return info
    try:
        fd = os.open(file, os.O_RDONLY)
    except OSError as exc:
        info["problem"] = f"found, but cannot be opened: {exc.strerror or exc}"
        return info
    try:
        found = read_header(fd, str(file)).content_hash
    except KilnError as exc:
        info["hash_matches"], info["problem"] = False, f"found, but refused: {exc}"
        return info
    finally:
        os.close(fd)
    info["hash_matches"] = found == wanted
    if found != wanted:
        info["problem"] = (f"found, but holds other weights: content sha256 {found}, the "
                           f"library's is {wanted}")
    return info


def library_weights(path: str, artifacts: Sequence[Any], metadata: Mapping[str, Any]
                    ) -> dict[str, Any]:
    """The "weights" section of a library's report."""
    entry = metadata.get("weights")
    info = _external(path, entry) if isinstance(entry, Mapping) else _embedded(artifacts)
    info["transforms_replayable"], info["replay_note"] = replayable(artifacts)
    # the library's own C entry, where it carries its swap program (docs/format.md)
    program = any(getattr(a, "file_name", None) == "swap_program.c" for a in artifacts)
    symbol = (metadata.get("swap") or {}).get("symbol")
    info["swap_entry"] = symbol if program and symbol else None
    return _totals(info)


def mlf_weights(meta: Mapping[str, Any], sizes: Mapping[str, int]) -> dict[str, Any]:
    """The "weights" section of an MLF archive's report, from its (checked) metadata.json
    and its members' sizes."""
    member = f"parameters/{meta['model_name']}.params"
    size = sizes.get(member, 0)
    checksums = meta.get("checksums") or {}
    table = meta.get("parameters")
    info: dict[str, Any] = {
        "where": "embedded", "file": member, "file_bytes": size,
        "file_chunked_sha256": _tree_sha256((checksums.get("chunk_sha256") or {}).get(member), size,
                                    checksums.get("chunk_size")),
        "per_tensor_sha256": table is not None,
        "tensors": [{"name": t["name"], "dtype": t["dtype"], "shape": t["shape"],
                     "offset": t["offset"], "bytes": t["bytes"], "sha256": t["sha256"]}
                    for t in table or []]}
    if table is None:  # before version 4: the file as a whole
        info.update(count=None, bytes=size)
    info["transforms_replayable"], info["replay_note"] = [], MLF_NOTE
    return _totals(info)


def _totals(info: dict[str, Any]) -> dict[str, Any]:
    info.setdefault("count", len(info["tensors"]))
    info.setdefault("bytes", sum(t["bytes"] for t in info["tensors"]
                                 if isinstance(t["bytes"], int)))
    return info


def _where(info: Mapping[str, Any], kind: str) -> str:
    if info["where"] == "external":
        state = (info["problem"] if info["problem"] else
                 f"found, content sha256 {info['content_sha256']} matches the library's")
        return f"external: {info['file']} ({state})"
    if "file" in info:  # an MLF archive
        digest = info["file_chunked_sha256"]
        return (f"embedded in the archive: {info['file']}, {info['file_bytes']} bytes, "
                "assembled into .rodata" + (f" (chunked sha256 {digest})" if digest else ""))
    return f"embedded in the {kind}"


def _tensor_line(t: Mapping[str, Any]) -> str:
    """One tensor: an MLF weight (dtype, shape, offset, SHA-256 of its bytes) or a
    library's weights blob (its constant arrays, its chunked SHA-256)."""
    if "dtype" in t:
        return (f"  tensor   {t['name']}: {t['dtype']}{list(t['shape'])} at {t['offset']}, "
                f"{t['bytes']} bytes, sha256 {t['sha256']}")
    arrays = f" holding {t['arrays']} constant array(s)" if t.get("arrays") else ""
    return (f"  tensor   {t['name']}: {t['bytes']} bytes{arrays}, "
            f"chunked sha256 {t['chunked_sha256'] or 'not recorded'}")


def weights_lines(info: Mapping[str, Any], kind: str, per_tensor: bool) -> list[str]:
    """The text block of the "weights" section; `per_tensor` lists each tensor's hash."""
    count = "not recorded (this MLF version has no per-tensor SHA-256s; re-export it)" \
        if info["count"] is None else info["count"]
    lines = ["weights:", f"  where:    {_where(info, kind)}",
             f"  tensors:  {count}, {info['bytes']} bytes"]
    replay = info["transforms_replayable"]
    lines.append("  transforms replayable: " + (
        f"{', '.join(replay)} (Module.swap_weights rebuilds every constant)" if replay
        else info.get("replay_note") or REPLAYABLE_NOTE))
    if replay:
        lines.append("  swap from C: " + (
            f"{info['swap_entry']} (the library runs its swap program)"
            if info.get("swap_entry") else "none (Module.swap_weights replays with numpy)"))
    if per_tensor:
        lines.extend(_tensor_line(t) for t in info["tensors"])
    elif info["tensors"]:
        lines.append("  (--weights lists each tensor with its SHA-256)")
    return lines


__all__ = ["MLF_NOTE", "REPLAYABLE_NOTE", "library_weights", "mlf_weights", "replayable",
           "weights_lines"]

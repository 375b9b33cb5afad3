"""kiln.artifact: what codegens produce, as plain data, and every on-disk form of it.

    arts = kiln.artifact.load("model.so")      # reads the embedded blob, runs nothing
    print(arts.inspect())                       # codegen_id | loader | file_name | size | ...
    print(kiln.artifact.inspect_artifact(arts.get("llvm", "kernels.bc"), "asm"))

Modules: `artifact` (Artifact, InMemoryArtifact, ArtifactSet), `inspect`
(inspector registry and built-in views), `blob` (the library blob format),
`archive` (the .tar format), `elf` (finding the blob in a .so), `loading`
(`load`). Nothing here imports the compiler (llvmlite, onnx, kiln.ir): a
deploy host can read artifacts with the runtime alone. See docs/artifacts.md
and docs/format.md.
"""

from __future__ import annotations

from kiln.artifact import archive, blob, elf
from kiln.artifact.artifact import (
    NATIVE,
    NONE,
    AnyArtifact,
    Artifact,
    ArtifactSet,
    InMemoryArtifact,
)
from kiln.artifact.inspect import available_views, inspect_artifact, register_inspector
from kiln.artifact.loading import load, load_with_metadata

__all__ = [
    "NATIVE",
    "NONE",
    "AnyArtifact",
    "Artifact",
    "ArtifactSet",
    "InMemoryArtifact",
    "archive",
    "available_views",
    "blob",
    "elf",
    "inspect_artifact",
    "load",
    "load_with_metadata",
    "register_inspector",
]

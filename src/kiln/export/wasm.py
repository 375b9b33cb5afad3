"""A standalone WebAssembly module of a model compiled for a wasm32 target.

`export_wasm(executable, "model.wasm")` links the kernels LLVM built for
`wasm32-unknown-unknown` (the `web/wasm32` tag) with the weights (an LLVM data
object defining `{prefix}_consts`) using `wasm-ld` (Debian: `lld`). The
module exports its memory, `__heap_base`, its function table and the raw
kernels `{prefix}_kernel_<name>` (docs/abi.md: one pointer per buffer
parameter, inputs then outputs, returning 0 on success); it imports from `env`
what a C library would give: `malloc`, `calloc`, `free`, and
`{prefix}_parallel_for(n, body, context)`, which a single-threaded host runs as
`body(0, n, context)` through the table. There is no host.c (it needs a C
library): the embedder checks shapes itself. `examples/wasm/run.mjs` is such
an embedder for Node; docs/deploy.md shows it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import ExportError, MissingDependencyError


def _consts_object(prefix: str, data: bytes, triple: str) -> bytes:
    from kiln.codegen.llvm.target_machine import (
        llvm_binding,  # heavy: kiln.codegen.llvm.target_machine imports llvmlite
    )

    llvm = llvm_binding()
    # each byte as LLVM's string escape \hh, built by numpy: a Python loop over the
    # bytes took most of the export of a model with 100 MB of weights
    hexes = np.frombuffer(data.hex().encode("ascii"), dtype=np.uint8).reshape(-1, 2)
    escaped = np.empty((len(data), 3), dtype=np.uint8)
    escaped[:, 0] = ord("\\")
    escaped[:, 1:] = hexes
    body = escaped.tobytes().decode("ascii")
    text = (f'target triple = "{triple}"\n'
            f'@{prefix}_consts = hidden constant [{len(data)} x i8] c"{body}", align 64\n')
    mod = llvm.parse_assembly(text)
    tm = llvm.Target.from_triple(triple).create_target_machine(reloc="static")
    return bytes(tm.emit_object(mod))


def export_wasm(executable: Any, path: str | os.PathLike[str], *,
                wasm_ld: str | None = None) -> Path:
    """Link `executable` (compiled for a wasm32 target) into the module `path`."""
    arts = {a.file_name: a for a in executable.artifacts}
    kernels = arts.get("kernels.o")
    triple = str(kernels.metadata.get("triple", "")) if kernels is not None else ""
    if kernels is None or not triple.startswith("wasm32"):
        raise ExportError("export_wasm needs an executable compiled for a wasm32 llvm target "
                          f"(e.g. 'web/wasm32'), got {triple or 'no LLVM kernels'}")
    linker = wasm_ld or shutil.which("wasm-ld") or shutil.which("wasm-ld-14")
    if linker is None:
        raise MissingDependencyError("export_wasm needs wasm-ld (Debian/Ubuntu: apt-get "
                                     "install lld)")
    prefix = executable.prefix
    consts = arts.get("constants.bin")
    exports = [*kernels.metadata.get("functions", []), "__heap_base"]
    out = Path(path)
    with tempfile.TemporaryDirectory(prefix="kiln-wasm-") as tmp:
        objects = [Path(tmp) / "kernels.o"]
        objects[0].write_bytes(bytes(kernels.content))
        data = bytes(consts.content) if consts is not None else b"\0"
        objects.append(Path(tmp) / "consts.o")
        objects[1].write_bytes(_consts_object(prefix, data, triple))
        cmd = [linker, "--no-entry", "--allow-undefined", "--export-table",
               *(f"--export={name}" for name in exports), "-o", str(out),
               *map(str, objects)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ExportError(f"wasm-ld failed: {proc.stderr.strip()}")
    return out


__all__ = ["export_wasm"]

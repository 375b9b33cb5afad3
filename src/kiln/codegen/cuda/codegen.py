"""The `cuda` code generator: device kernels -> kernels.cu, kernels.ptx, kernels.json, launch.c.

It receives the kernels a heterogeneous build assigned to a `cuda` target
(kiln.driver.split; graph functions stay with the host's codegen), each
scheduled by `bind-gpu-threads`, and returns:

| file | loader | what |
|---|---|---|
| `kernels.cu` | cuda | CUDA C source (C backend printer; kiln.codegen.cuda.source) |
| `kernels.ptx` | cuda | PTX from llvmlite's NVPTX backend (kiln.codegen.cuda.ptx) |
| `kernels.json` | cuda | the function table: entries, parameter types, launch dimensions |
| `launch.c` | native | host-side launch stubs linked into the library |

Each is inspectable alone (`kiln inspect --show cuda/kernels.ptx`).
"""

from __future__ import annotations

import json
from typing import Any

from kiln.artifact import Artifact
from kiln.codegen.constants import ConstantPool
from kiln.codegen.cuda.kernels import thread_functions
from kiln.codegen.cuda.launch_stubs import (
    STUB_CFLAGS,
    STUBS_FILE,
    launch_stubs,
    set_launcher_symbol,
)
from kiln.codegen.cuda.ptx import device_ptx
from kiln.codegen.cuda.source import SOURCE_FILE, emit_cuda_source
from kiln.codegen.cuda.table import TABLE_FILE, function_table
from kiln.errors import CompileError
from kiln.ir.module import IRModule

CODEGEN_ID = "cuda"
LOADER = "cuda"
PTX_FILE = "kernels.ptx"


def codegen_cuda(mod: IRModule, target: Any, *, prefix: str, pool: ConstantPool) -> list[Any]:
    """The artifacts of the device kernels `mod` for `target` (kind `cuda`)."""

    arch = str(target.get("arch") or "")
    if not arch:
        raise CompileError("target kind 'cuda' needs an 'arch' (e.g. sm_90) to generate PTX")
    threads, launches = thread_functions(mod)
    order = list(launches)
    table = function_table(mod, launches, prefix=prefix, arch=arch, ptx_file=PTX_FILE,
                           source_file=SOURCE_FILE)
    source = emit_cuda_source(threads, launches, prefix=prefix, pool=pool)
    ptx = device_ptx(threads, launches, prefix=prefix, arch=arch, pool=pool)
    meta = {"arch": arch, "kernels": order}
    return [
        Artifact(CODEGEN_ID, LOADER, SOURCE_FILE, source.encode("utf-8"),
                 {**meta, "language": "cuda"}),
        Artifact(CODEGEN_ID, LOADER, PTX_FILE, ptx.encode("utf-8"), {**meta, "format": "ptx"}),
        Artifact(CODEGEN_ID, LOADER, TABLE_FILE,
                 json.dumps(table, indent=1, sort_keys=True).encode("utf-8"),
                 {**meta, "format": "kiln-cuda-functions"}),
        Artifact(CODEGEN_ID, "native", STUBS_FILE,
                 launch_stubs(mod, order, prefix=prefix).encode("utf-8"),
                 {"cflags": list(STUB_CFLAGS), "exports": [set_launcher_symbol(prefix)]}),
    ]

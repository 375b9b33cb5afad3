"""The function table (`kernels.json`): what a loader needs to launch the kernels.

    {"format": "kiln-cuda-functions", "version": 1, "arch": "sm_90",
     "ptx": "kernels.ptx", "source": "kernels.cu",
     "kernels": [{"name": "fused_conv2d_relu", "entry": "kiln__kernel_..._global",
                  "grid": [4, 1, 1], "block": [256, 1, 1], "shared_bytes": 0,
                  "params": [{"name": "x0", "kind": "buffer", "dtype": "float32",
                              "shape": [1, 3, 64, 64], "nbytes": 49152, "access": "read"},
                             ...]}]}

Kernels are listed in launch-index order: the host's launch stubs
(kiln.codegen.cuda.launch_stubs) pass a kernel's index to the loader's launcher.
`access` is "read", "write" or "readwrite" (what the kernel does with a buffer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kiln.codegen.cuda.kernels import CudaLaunchConfig
from kiln.codegen.cuda.ptx import kernel_entry
from kiln.ir.aliasing import analyze
from kiln.ir.module import IRModule
from kiln.ir.tensor import Buffer, Load
from kiln.ir.visitor import iter_nodes

TABLE_FORMAT = "kiln-cuda-functions"
TABLE_VERSION = 1
TABLE_FILE = "kernels.json"


def function_table(mod: IRModule, launches: Mapping[str, CudaLaunchConfig], *, prefix: str,
                   arch: str, ptx_file: str, source_file: str) -> dict[str, Any]:
    """The table of the device kernels `mod` (the scheduled kernels, not per-thread)."""
    written = analyze(mod.prim_funcs()).written
    kernels = []
    for name, launch in launches.items():
        fn = mod.prim_funcs()[name]
        read = _read_buffers(fn)
        params = []
        for index, p in enumerate(fn.params):
            if isinstance(p, Buffer):
                access = ("readwrite" if p in read else "write") if index in written[name] \
                    else "read"
                params.append({"name": p.name, "kind": "buffer", "dtype": p.dtype,
                               "shape": list(p.shape), "nbytes": p.nbytes(), "access": access})
            else:
                params.append({"name": p.name, "kind": "scalar", "dtype": p.dtype})
        kernels.append({"name": name, "entry": kernel_entry(prefix, name),
                        "grid": [launch.grid, 1, 1], "block": [launch.block, 1, 1],
                        "shared_bytes": 0, "params": params})
    return {"format": TABLE_FORMAT, "version": TABLE_VERSION, "arch": arch,
            "ptx": ptx_file, "source": source_file, "kernels": kernels}


def _read_buffers(fn: Any) -> set[Buffer]:
    return {node.buffer for node in iter_nodes(fn.body) if isinstance(node, Load)}

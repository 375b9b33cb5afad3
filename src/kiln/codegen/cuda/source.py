"""CUDA C source (`kernels.cu`) of the device kernels, printed by the C backend's printer.

The per-thread functions (kiln.codegen.cuda.kernels) are printed by the C
backend's kernel printer (kiln.codegen.c, on the shared C-family layer) in
`CUDA_DIALECT`, so the CUDA source has the C backend's tested semantics; the
dialect holds what differs in CUDA C++:

- the raw kernels and the `static inline` helpers are `__device__` functions;
- C99's `restrict` is spelled `__restrict__`;
- one `extern "C" __global__` entry per kernel calls its per-thread function with
  blockIdx.x and threadIdx.x, with `__launch_bounds__` set to its block size.

Heap buffers (kernels launched as one thread by `bind-gpu-threads`) use
the CUDA device heap (`malloc` in device code). `nvcc -c -arch=sm_NN kernels.cu`
compiles the result; the driver can also take the PTX artifact instead.
"""

from __future__ import annotations

from collections.abc import Mapping

from kiln.codegen.c.codegen import emit_kernels
from kiln.codegen.cfamily.dialect import CDialect
from kiln.codegen.cfamily.signature import param_ctype, qualifiers
from kiln.codegen.constants import ConstantPool
from kiln.codegen.cuda.kernels import CudaLaunchConfig
from kiln.codegen.cuda.ptx import kernel_entry
from kiln.codegen.naming import kernel_symbol
from kiln.escape import c_comment
from kiln.ir.module import IRModule

CUDA_DIALECT = CDialect(
    name="cuda backend",
    file_name="kernels.cu",
    about=("One __device__ function per kernel for one thread (the C backend's raw kernel",
           "with the block and thread index as its last two arguments) and one",
           'extern "C" __global__ entry per kernel that passes blockIdx.x and threadIdx.x.'),
    linkage="/* Raw kernels run on the device. */\n#define KILN_HIDDEN static __device__",
    helper_qualifiers="static __device__ inline",
    restrict="__restrict__",
    entry_qualifiers='extern "C" __global__',
    block_index="blockIdx.x",
    thread_index="threadIdx.x",
)
SOURCE_FILE = CUDA_DIALECT.file_name


def emit_cuda_source(mod: IRModule, launches: Mapping[str, CudaLaunchConfig], *, prefix: str,
                     pool: ConstantPool) -> str:
    """kernels.cu for the per-thread functions `mod` and their `launches`."""
    dialect = CUDA_DIALECT
    source, _ = emit_kernels(mod, prefix=prefix, pool=pool, dialect=dialect)
    out = [source.rstrip("\n"), "", "/* Entry points (launch: grid x block threads, 1-D). */"]
    quals = qualifiers(mod.prim_funcs())
    for name, launch in launches.items():
        fn = mod.prim_funcs()[name]
        params = fn.params[:-2]
        decls = [f"{param_ctype(p, i, quals[name], dialect.restrict)} p{i}"
                 for i, p in enumerate(params)]
        args = [f"p{i}" for i in range(len(params))]
        out += [
            f"/* {c_comment(name)}: grid {launch.grid}, block {launch.block} */",
            f"{dialect.entry_qualifiers} void __launch_bounds__({launch.block}) "
            f"{kernel_entry(prefix, name)}(",
            "    " + (",\n    ".join(decls) if decls else "void") + ") {",
            f"  (void){kernel_symbol(prefix, name)}("
            + "".join(f"{a}, " for a in args)
            + f"(int64_t){dialect.block_index}, (int64_t){dialect.thread_index});",
            "}",
            "",
        ]
    return "\n".join(out)

"""Device kernels as per-thread functions: the shared first step of the CUDA source and
the PTX.

A kernel scheduled by `bind-gpu-threads` (kiln.ir.gpu_launch) is

    for bx in T.block_x(G):
        for tx in T.thread_x(B):
            body

Its per-thread function is `body` with `bx` and `tx` as two trailing int64
parameters: the raw kernel of docs/abi.md for one thread, which both C-family and
LLVM lowering already know how to print. A `__global__` wrapper (CUDA C) or a
`ptx_kernel` wrapper (LLVM IR) calls it with blockIdx.x and threadIdx.x.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.errors import CompileError
from kiln.ir.attrs import ATTR_GRAPH
from kiln.ir.gpu_launch import bound_loops, launch_shape
from kiln.ir.module import IRModule
from kiln.ir.tensor import AllocConst, CallExtern, CallFunc, PrimFunc
from kiln.ir.visitor import iter_nodes


@dataclass(frozen=True)
class CudaLaunchConfig:
    """How a kernel is launched: grid and block size (1-D), the per-thread function's name."""

    name: str
    grid: int
    block: int


def thread_functions(mod: IRModule) -> tuple[IRModule, dict[str, CudaLaunchConfig]]:
    """(module of per-thread functions, launch of each kernel) for the kernels of `mod`."""
    funcs: dict[str, PrimFunc] = {}
    launches: dict[str, CudaLaunchConfig] = {}
    for name, fn in mod.prim_funcs().items():
        if fn.attrs.get(ATTR_GRAPH):
            raise CompileError(f"the cuda codegen compiles kernels only; graph function "
                               f"'{name}' belongs to the host (compile for a target with "
                               "a host, e.g. {'kind': 'cuda', 'host': {'kind': 'llvm'}})")
        _check_device_code(name, fn)
        block_loop, thread_loop = bound_loops(fn)
        grid, block = launch_shape(fn)
        attrs = {k: v for k, v in fn.attrs.items() if k != "target"}
        funcs[name] = PrimFunc((*fn.params, block_loop.var, thread_loop.var),
                               thread_loop.body, attrs)
        launches[name] = CudaLaunchConfig(name, grid, block)
    return IRModule(funcs, mod.attrs), launches


def _check_device_code(name: str, fn: PrimFunc) -> None:
    for node in iter_nodes(fn.body):
        if isinstance(node, CallFunc):
            raise CompileError(f"device kernel '{name}' calls '{node.func}': a GPU kernel "
                               "cannot call another kernel")
        if isinstance(node, AllocConst):
            raise CompileError(f"device kernel '{name}' holds constant '{node.buffer.name}': "
                               "constants reach GPU kernels as parameters only")
        if isinstance(node, CallExtern) and node.dependency is not None:
            raise CompileError(f"device kernel '{name}' calls external library function "
                               f"'{node.name}', which has no GPU version")

"""A device kernel's launch shape, as `bind-gpu-threads` leaves it.

The pass (kiln.transform.gpu_schedule, `BindGpuThreads`) makes every device kernel's
body start with two loops

    for bx in T.block_x(G):
        for tx in T.thread_x(B):
            <the kernel body for one thread>

naming the grid and block size of its CUDA launch (1-D). The CUDA code generator
reads them here (`bound_loops`, `launch_shape`) and turns them into reads of
blockIdx.x and threadIdx.x.
"""

from __future__ import annotations

from kiln.errors import CompileError
from kiln.ir.tensor import Const, For, PrimFunc, Stmt

# The loop kinds (kiln.ir.tensor.FOR_KINDS) bound to CUDA's blockIdx.x and threadIdx.x.
BLOCK_LOOP = "block_x"
THREAD_LOOP = "thread_x"


def starts_with_bound_loops(body: Stmt) -> bool:
    """Whether a kernel body starts with a block loop holding a thread loop (the
    kernel is scheduled already)."""
    return (isinstance(body, For) and body.kind == BLOCK_LOOP
            and isinstance(body.body, For) and body.body.kind == THREAD_LOOP)


def bound_loops(func: PrimFunc) -> tuple[For, For]:
    """The block and thread loops at the top of a kernel scheduled by BindGpuThreads."""
    if not starts_with_bound_loops(func.body):
        raise CompileError("a device kernel must be scheduled by the bind-gpu-threads pass "
                           "(its body starts with T.block_x and T.thread_x loops)")
    block = func.body
    assert isinstance(block, For) and isinstance(block.body, For)
    return block, block.body


def launch_shape(func: PrimFunc) -> tuple[int, int]:
    """(grid, block): the extents of a scheduled kernel's block and thread loops."""
    block, thread = bound_loops(func)
    if not isinstance(block.extent, Const) or not isinstance(thread.extent, Const):
        raise CompileError("a device kernel's launch shape must be constant")
    return int(block.extent.value), int(thread.extent.value)


__all__ = ["BLOCK_LOOP", "THREAD_LOOP", "bound_loops", "launch_shape", "starts_with_bound_loops"]

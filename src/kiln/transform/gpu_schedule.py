"""BindGpuThreads: give every device kernel a CUDA launch shape (blocks x threads).

Runs after `parallelize` in the tensor pipeline of GPU targets
(`gpu_tensor_pipeline`), on every PrimFunc that is not a lowered graph
function (those stay on the host and launch the kernels). Each kernel ends up
as

    for bx in T.block_x(G):
        for tx in T.thread_x(B):
            <the kernel body for one thread>

the two outermost loops naming the grid and block size of its launch; the
device codegen turns them into reads of blockIdx.x and threadIdx.x, and
anywhere else (kiln's reference interpreter, the CPU backends) they run as
serial loops, so the scheduled IR keeps its meaning and can be checked
against a reference. The code generators read the launch shape through
kiln.ir.gpu_launch (`bound_loops`, `launch_shape`).

Which loop is bound: the kernel body must be local declarations followed by one
loop nest whose loops, from the top, are perfectly nested down to a `parallel`
loop with constant bounds (parallelize proved its iterations independent).
That loop's iteration `i` goes to global thread `bx * B + tx`, behind a bounds
guard `if bx * B + tx < extent` (the last block is partial); the serial loops
above it, and the local declarations, move inside the thread, which runs them
for its own `i` only. The elementwise tail fused into the kernel (FuseOps) stays
in the loop body, so it runs in the same thread. Inner loops that parallelize
marked stay serial within the thread.

Any other kernel (several loop nests that depend on each other, a heap
allocation, nothing parallel) is launched as one block of one thread: correct,
not fast. Shared-memory tiling of matrix products and convolutions is not done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kiln.errors import CompileError
from kiln.ir.aliasing import analyze
from kiln.ir.analysis.loop_dependence import Storage, loop_is_parallelizable
from kiln.ir.attrs import ATTR_GRAPH
from kiln.ir.gpu_launch import BLOCK_LOOP, THREAD_LOOP, starts_with_bound_loops
from kiln.ir.module import IRModule
from kiln.ir.tensor import (
    INDEX_DTYPE,
    Allocate,
    Cast,
    Const,
    For,
    IfThenElse,
    LetStmt,
    PrimFunc,
    SeqStmt,
    Stmt,
    Var,
    binary,
    compare,
    const,
    seq,
)
from kiln.ir.visitor import StmtMutator, iter_stmts
from kiln.transform.pass_base import Pass


@dataclass(frozen=True)
class BindGpuThreads(Pass):
    """Bind each kernel's parallel loop to CUDA blocks and threads (module docstring)."""

    name = "bind-gpu-threads"
    # Threads per block: a multiple of the warp size that every CUDA GPU allows.
    threads_per_block: int = 256

    def __post_init__(self) -> None:
        if not 1 <= self.threads_per_block <= 1024:
            raise CompileError(f"bind-gpu-threads: threads_per_block must be in 1..1024, "
                               f"got {self.threads_per_block}")

    def run(self, mod: IRModule) -> IRModule:
        funcs = mod.prim_funcs()
        info = analyze(dict(funcs))
        changed: dict[str, PrimFunc] = {}
        for name, fn in funcs.items():
            if fn.attrs.get(ATTR_GRAPH) or starts_with_bound_loops(fn.body):
                continue
            # Kernels some call passes overlapping memory: their parameters may alias.
            storage = Storage(fn, info.noalias[name] != info.written[name])
            bound = _bind(fn.body, self.threads_per_block, storage)
            if bound is None:
                bound = _launch(1, 1, _Serialize().visit_stmt(fn.body))
            changed[name] = fn.with_body(bound)
        if not changed:
            return mod
        return IRModule({n: changed.get(n, f) for n, f in mod.functions.items()}, mod.attrs)


class _Serialize(StmtMutator):
    """Inner `parallel` loops run serially within one GPU thread."""

    def visit_for(self, s: For) -> Stmt:
        new = super().visit_for(s)
        assert isinstance(new, For)
        if new.kind in ("parallel", BLOCK_LOOP, THREAD_LOOP):
            return For(new.var, new.start, new.extent, "serial", new.body)
        return new


def _launch(grid: int, block: int, body: Stmt | Callable[[Var, Var], Stmt]) -> Stmt:
    """`for bx in T.block_x(grid): for tx in T.thread_x(block): body(bx, tx)`."""
    bx = Var("bx", INDEX_DTYPE)
    tx = Var("tx", INDEX_DTYPE)
    inner = body(bx, tx) if callable(body) else body
    return For(bx, const(0, INDEX_DTYPE), const(grid, INDEX_DTYPE), BLOCK_LOOP,
               For(tx, const(0, INDEX_DTYPE), const(block, INDEX_DTYPE), THREAD_LOOP, inner))


def _bind(body: Stmt, threads: int, storage: Storage) -> Stmt | None:
    """The bound body, or None when the kernel has no loop to bind."""
    items = list(body.body) if isinstance(body, SeqStmt) else [body]
    if any(isinstance(s, Allocate) and s.buffer.scope != "local"
           for s in iter_stmts(body)):
        return None  # a heap buffer per thread would not be shared: run it on one thread
    head, nest = items[:-1], items[-1]
    if not isinstance(nest, For) or not all(
            isinstance(s, Allocate) for s in head):
        return None
    chain: list[For] = []
    loop: Stmt = nest
    while isinstance(loop, For):
        chain.append(loop)
        if loop.kind == "parallel":
            break
        loop = loop.body
    target = chain[-1]
    if target.kind != "parallel" or not all(_constant(c) for c in chain):
        return None
    # The loops perfectly nested in the parallel one whose iterations are independent
    # too fuse with it into one flat index, the innermost varying fastest (so adjacent
    # threads touch adjacent elements: coalesced loads and stores).
    fused = [target]
    while isinstance(fused[-1].body, For):
        inner = fused[-1].body
        if not (_constant(inner) and loop_is_parallelizable(inner, storage)):
            break
        fused.append(inner)
    extent = 1
    for loop in fused:
        extent *= int(loop.extent.value)  # type: ignore[attr-defined]
    if extent < 1 or extent >= 2**31:
        return None
    block = min(threads, extent)
    grid = -(-extent // block)
    original = _Serialize().visit_stmt(fused[-1].body)

    def thread_body(bx: Var, tx: Var) -> Stmt:
        flat = binary("add", binary("mul", bx, const(block, INDEX_DTYPE)), tx)
        lets: list[Stmt] = []
        stride = extent
        for loop in fused:
            size = int(loop.extent.value)  # type: ignore[attr-defined]
            stride //= size
            index = binary("div", flat, const(stride, INDEX_DTYPE)) if stride > 1 else flat
            if loop is not target:
                index = binary("mod", index, const(size, INDEX_DTYPE))
            if int(loop.start.value):  # type: ignore[attr-defined]
                index = binary("add", index, loop.start)
            if loop.var.dtype != INDEX_DTYPE:
                index = Cast(loop.var.dtype, index)
            lets.append(LetStmt(loop.var, index))
        inner: Stmt = seq(*lets, original)
        if grid * block != extent:
            inner = IfThenElse(compare("lt", flat, const(extent, INDEX_DTYPE)), inner)
        for outer in reversed(chain[:-1]):
            inner = For(outer.var, outer.start, outer.extent, "serial", inner)
        return seq(*head, inner)

    return _launch(grid, block, thread_body)


def _constant(loop: For) -> bool:
    return isinstance(loop.start, Const) and isinstance(loop.extent, Const)

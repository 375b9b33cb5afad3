"""Optimise and emit a large kernel module as several LLVM modules, on threads.

LLVM's optimizer and code generator take most of a large model's compile (a
ResNet-50's kernels: seconds). The kernels are independent functions, so
`split_module_text` cuts the lowered module into parts of similar size: each
part's text defines its share of the non-internal functions and only declares
the others (their symbols stay hidden: the parts' objects are linked into one
library, where hidden symbols resolve to each other), with the internal
helpers its share uses (the parallel loop bodies; one used by two parts is
defined in both, privately). Each part gets its own LLVMContext and
TargetMachine, which LLVM allows to work concurrently.

llvmlite serialises every call into LLVM with one process-wide lock (its
`ffi.lib` wrappers), so the long calls (running the pass pipeline, emitting an
object) are made through the underlying ctypes functions, which release the
GIL, on objects no other thread touches. Every other call keeps the lock.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from ctypes import string_at
from typing import Any, TypeVar

from kiln.codegen.llvm.target_machine import (
    MachineConfig,
    llvm_binding,
    parse_and_verify,
    pipeline,
)
from kiln.errors import CompileError

# Below this many LLVM instructions one module is compiled: a second thread would
# save less than the duplicated declarations and the merge of the bitcode cost.
SPLIT_MIN_INSTRUCTIONS = 4_000
# Parts per thread: the optimizer's time per part is hard to predict from its size,
# so the threads take the parts from a queue (largest first) to even out.
PARTS_PER_THREAD = 3
_LOCAL_LINKAGES = ("internal", "private")

T = TypeVar("T")
R = TypeVar("R")


def compile_threads() -> int:
    """How many modules to compile at once: the CPUs this process may use, at most 2
    (1 when this llvmlite does not expose its unlocked ctypes functions)."""
    if not _has_unlocked_calls():
        return 1
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(2, cpus))


def _size(fn: Any) -> int:
    return sum(len(block.instructions) for block in fn.blocks)


def _work(fn: Any) -> int:
    """A function's share of the optimizer's work: its instructions but calls (the
    graph entry, mostly calls of kernels, is quick to optimise however long)."""
    return sum(1 for block in fn.blocks for instr in block.instructions
               if getattr(instr, "opname", "") != "call")


def _uses(fn: Any, names: Any) -> set[str]:
    """The functions named in `names` that `fn`'s instructions refer to."""
    return {op.name for block in fn.blocks for instr in block.instructions
            for op in getattr(instr, "operands", ()) if getattr(op, "name", None) in names}


def split_module_text(module: Any, parts: int) -> list[str]:
    """The llvmlite `ir.Module` as `parts` module texts (fewer when it has fewer
    non-internal functions), each defining a share of them of similar size, the
    largest first. A part defines the internal functions its share uses (their
    parallel loop bodies) and declares every other function."""
    defined = [f for f in module.functions if f.blocks]
    local = {f.name: f for f in defined if f.linkage in _LOCAL_LINKAGES}
    shared = [f for f in defined if f.linkage not in _LOCAL_LINKAGES]

    def closure(fns: list[Any]) -> set[str]:
        seen: set[str] = set()
        todo = [name for f in fns for name in _uses(f, local)]
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo += _uses(local[name], local)
        return seen

    def weight(fn: Any) -> int:
        return _work(fn) + sum(_work(local[name]) for name in closure([fn]))

    from llvmlite import ir

    if any(isinstance(v, ir.GlobalVariable) and v.initializer is not None
           and v.linkage not in _LOCAL_LINKAGES for v in module.global_values):
        parts = 1  # a global variable the parts would each define: keep one module
    parts = max(1, min(parts, len(shared)))
    groups: list[list[Any]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for fn in sorted(shared, key=weight, reverse=True):
        i = loads.index(min(loads))
        groups[i].append(fn)
        loads[i] += weight(fn)
    if parts == 1:
        return [str(module)]
    texts = []
    # the heaviest first: threads taking parts in this order end close together
    for _, group in sorted(zip(loads, groups), key=lambda lg: -lg[0]):
        mine = {id(f) for f in group} | {id(local[n]) for n in closure(group)}
        others = [f for f in defined if id(f) not in mine]
        saved = [(f.blocks, f.linkage) for f in others]
        try:
            for f in others:  # printed as an external declaration
                f.blocks = []
                if f.linkage in _LOCAL_LINKAGES:
                    f.linkage = ""
            texts.append(str(module))
        finally:
            for f, (blocks, linkage) in zip(others, saved):
                f.blocks, f.linkage = blocks, linkage
    return texts


def module_instructions(module: Any) -> int:
    """LLVM instructions in the llvmlite `ir.Module` (its size for `SPLIT_MIN_INSTRUCTIONS`)."""
    return sum(_size(f) for f in module.functions)


def _has_unlocked_calls() -> bool:
    """Whether llvmlite's wrappers still expose their ctypes functions (`_cfn`, an
    internal of llvmlite 0.50): without them the parts compile one after another."""
    from llvmlite.binding import ffi

    return all(hasattr(getattr(ffi.lib, name, None), "_cfn") for name in
               ("LLVMPY_RunNewModulePassManager", "LLVMPY_TargetMachineEmitToMemory"))


def _unlocked(name: str) -> Callable[..., Any]:
    """llvmlite's ctypes function `name`, called without llvmlite's global lock (the
    locked wrapper when this llvmlite has no `_cfn`; `compile_threads` is then 1)."""
    from llvmlite.binding import ffi

    fn = getattr(ffi.lib, name)
    return getattr(fn, "_cfn", fn)


class Part:
    """One part: its own context, module and target machine (touched by one thread)."""

    def __init__(self, text: str, config: MachineConfig, where: str) -> None:
        llvm = llvm_binding()
        self.context = llvm.create_context()
        self.module = parse_and_verify(text, where, context=self.context)
        self.machine = config.target_machine()

    def optimize(self, opt_level: int) -> None:
        pb = pipeline(self.machine, opt_level)
        _unlocked("LLVMPY_RunNewModulePassManager")(pb.getModulePassManager(), self.module, pb)
        self.module.verify()

    def emit_object(self) -> bytes:
        from llvmlite.binding import ffi

        with ffi.OutputString() as err:
            buf = _unlocked("LLVMPY_TargetMachineEmitToMemory")(self.machine, self.module, 1,
                                                                err)
            if not buf:
                raise CompileError(f"LLVM could not emit the object code: {err}")
        try:
            return string_at(ffi.lib.LLVMPY_GetBufferStart(buf),
                             ffi.lib.LLVMPY_GetBufferSize(buf))
        finally:
            ffi.lib.LLVMPY_DisposeMemoryBuffer(buf)


def run_all(fn: Callable[[T], R], items: Sequence[T], threads: int) -> list[R]:
    """`fn` over `items` on `threads` threads (in this thread when there is one)."""
    if threads == 1 or len(items) == 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return list(pool.map(fn, items))


def merged_bitcode(parts: Sequence[Part]) -> bytes:
    """The parts linked back into one module, as bitcode (the inspectable kernels.bc)."""
    if len(parts) == 1:
        return bytes(parts[0].module.as_bitcode())
    llvm = llvm_binding()
    context = llvm.create_context()
    whole = llvm.parse_bitcode(parts[0].module.as_bitcode(), context=context)
    for part in parts[1:]:
        whole.link_in(llvm.parse_bitcode(part.module.as_bitcode(), context=context))
    return bytes(whole.as_bitcode())

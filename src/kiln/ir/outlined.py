"""Outlined parallel loops: what a module looks like after `outline-parallel-loops`.

The pass (kiln.transform.outline, `OutlineParallelLoops`) turns a loop
`for i in [start, start + extent) parallel: body` of kernel `f` into

- a *loop body* `f_parallel0(begin: int64, end: int64, <captured buffers>,
  <captured scalars>)`: a private PrimFunc marked `kiln.parallel_loop_of` (the
  kernel) and `kiln.parallel_loop_var` (the loop variable's name hint), and
- in `f`, a *launch*: `CallFunc("f_parallel0", (0, extent, <captured...>))`,
  which the backends print as `{prefix}_parallel_for(extent, <trampoline>,
  &context)` on the library's thread pool (docs/abi.md, "Parallel loops").

This module is that contract, shared by the pass and the code generators (which
never import the pass): the launch's argument layout (`COUNT_ARG`,
`FIRST_CAPTURE`), the launch sites recovered from the attributes
(`outlined_launches`), and which functions are the library's own
(`kernel_funcs`: loop bodies are never public functions).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from kiln.errors import CompileError
from kiln.ir import dtype as dt
from kiln.ir.attrs import ATTR_PARALLEL_OF, ATTR_PARALLEL_VAR
from kiln.ir.module import BaseFunc, IRModule
from kiln.ir.tensor import CallFunc, For, PrimFunc
from kiln.ir.visitor import iter_stmts

# The registered name of the pass that outlines (kiln.transform.outline).
OUTLINE_PASS = "outline-parallel-loops"

# A launch CallFunc's arguments: (0, iteration count, captured values...), matching
# the loop body's parameters (begin, end, captured...).
COUNT_ARG = 1
FIRST_CAPTURE = 2


@dataclass(frozen=True)
class Launch:
    """One outlined parallel loop: its body function and the loop it came from."""

    body: str       # name of the outlined loop-body function
    parent: str     # the kernel holding the loop
    var: str        # the loop variable's name hint


@dataclass
class Outlined:
    """The module with its parallel loops outlined, and the launch sites."""

    mod: IRModule
    # Launch CallFunc node (by identity) -> what it launches.
    launches: dict[CallFunc, Launch] = field(default_factory=dict)

    @property
    def bodies(self) -> tuple[str, ...]:
        """Names of the outlined loop-body functions, in outlining order: code generators
        emit them in this order, so it must not depend on hashing (reproducible builds)."""
        return tuple(dict.fromkeys(launch.body for launch in self.launches.values()))


def is_loop_body(fn: BaseFunc) -> bool:
    """Whether `fn` is an outlined parallel loop body (private to the library: never an
    entry, never in the metadata)."""
    return isinstance(fn, PrimFunc) and ATTR_PARALLEL_OF in fn.attrs


def kernel_funcs(mod: IRModule) -> dict[str, PrimFunc]:
    """The module's PrimFuncs but outlined loop bodies: the library's functions."""
    return {name: fn for name, fn in mod.prim_funcs().items() if not is_loop_body(fn)}


def parallel_loops(mod: IRModule) -> Iterator[tuple[str, For]]:
    """(function name, loop) of every loop of kind `parallel` in the module's PrimFuncs,
    nested ones included."""
    for name, fn in mod.prim_funcs().items():
        for s in iter_stmts(fn.body):
            if isinstance(s, For) and s.kind == "parallel":
                yield name, s


def is_outlinable(loop: For) -> bool:
    """Whether the pass outlines this parallel loop: integer loops with matching bound
    dtypes; anything else is left to the backend's serial path, which reports the
    problem."""
    return (dt.is_int(loop.var.dtype) and loop.start.dtype == loop.var.dtype
            and loop.extent.dtype == loop.var.dtype)


def has_parallel_loops(mod: IRModule) -> bool:
    """True if some kernel runs a loop on the thread pool: a loop of kind `parallel`, or
    one already outlined (host.c then defines the thread pool, which the kernels call)."""
    return (any(True for _ in parallel_loops(mod))
            or any(is_loop_body(fn) for fn in mod.functions.values()))


def outlined_launches(mod: IRModule, who: str = "codegen") -> Outlined:
    """The launch sites of a module `outline-parallel-loops` produced, recovered from its
    loop bodies' attributes; CompileError if a parallel loop is left to outline (the
    backends consume outlined IR only). `who` names the consumer in the error."""
    for name, loop in parallel_loops(mod):
        if is_outlinable(loop) and not is_loop_body(mod.functions[name]):
            raise CompileError(
                f"{who} of '{name}': parallel loop '{loop.var.name}' was not outlined; run "
                f"the pass '{OUTLINE_PASS}' before codegen (kiln.compile does "
                "for the targets that need it)")
    bodies = {name: fn for name, fn in mod.functions.items() if is_loop_body(fn)}
    launches: dict[CallFunc, Launch] = {}
    for fn in mod.prim_funcs().values():
        for s in iter_stmts(fn.body):
            if isinstance(s, CallFunc) and s.func in bodies:
                attrs = bodies[s.func].attrs
                launches[s] = Launch(s.func, attrs[ATTR_PARALLEL_OF], attrs[ATTR_PARALLEL_VAR])
    return Outlined(mod, launches)


__all__ = [
    "COUNT_ARG",
    "FIRST_CAPTURE",
    "OUTLINE_PASS",
    "Launch",
    "Outlined",
    "has_parallel_loops",
    "is_loop_body",
    "is_outlinable",
    "kernel_funcs",
    "outlined_launches",
    "parallel_loops",
]

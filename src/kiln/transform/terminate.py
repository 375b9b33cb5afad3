"""TerminateChecks: let the caller stop a running call (docs/abi.md, "Stopping a call").

`kiln.compile` runs this pass after the pipelines when the code generator's library
carries host.c (llvm, c), whose packed entries pass the flag (the Executable keeps the
module before it, as it keeps the one before outlining). Each lowered graph function
(`kiln.graph`) takes one more parameter, `terminate`: a 0-d int32 buffer, the
caller's flag (host.c's entry passes the caller's, or a flag of its own that is never
set). It comes after the results and the buffer of run-time dimensions, before the
dimension scalars (attribute `kiln.terminate_flag`). The function polls it

    terminate_check(terminate[()])      # before every kernel call
    while ...:
        <body>
        terminate_check(terminate[()])  # at the end of every loop body: the back-edge

`terminate_check` is one load of the flag and one branch; the kernels themselves
never read it, so a model pays one load and branch per kernel call and per loop
iteration, none inside a kernel's loops. A function that finds the flag set returns
ERROR_TERMINATED (kiln.ir.kernel_errors) after freeing its workspace, as a failed
check does, and host.c reports "terminated: the caller set the call's terminate flag".
The backends find the flag parameter through kiln.ir.terminate (`terminate_flag`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.ir import tensor as t
from kiln.ir.analysis.tensor_queries import calls
from kiln.ir.attrs import ATTR_GRAPH, ATTR_TERMINATE_FLAG
from kiln.ir.module import IRModule
from kiln.ir.shape_expr import graph_dims
from kiln.ir.visitor import StmtMutator
from kiln.transform.pass_base import Pass

FLAG_NAME = "terminate"


def terminate_check(flag: t.Buffer) -> t.Stmt:
    """`terminate_check(flag[()])`: leave with ERROR_TERMINATED when the flag is set."""
    return t.Evaluate(t.Intrin(t.TERMINATE_CHECK, (t.Load(flag, ()),)))


class _PollFlag(StmtMutator):
    """A check before every kernel call and at the end of every loop body."""

    def __init__(self, flag: t.Buffer) -> None:
        self.flag = flag

    def visit_call_func(self, s: t.CallFunc) -> t.Stmt:
        return t.seq(terminate_check(self.flag), s)

    def visit_while(self, s: t.While) -> t.Stmt:
        body = self.visit_stmt(s.body)
        return t.While(s.cond, t.seq(body, terminate_check(self.flag)))


def with_terminate_flag(fn: t.PrimFunc) -> t.PrimFunc:
    """Lowered graph function `fn` taking the terminate flag and polling it."""
    flag = t.Buffer(FLAG_NAME, (), "int32")
    dims = graph_dims(fn)
    head = fn.params[:len(fn.params) - len(dims)]
    body = _PollFlag(flag).visit_stmt(fn.body)
    return t.PrimFunc((*head, flag, *dims), body, {**fn.attrs, ATTR_TERMINATE_FLAG: True})


@dataclass(frozen=True)
class TerminateChecks(Pass):
    """Give every lowered graph function the caller's terminate flag, and poll it."""

    name = "terminate-checks"

    def run(self, mod: IRModule) -> IRModule:
        prims = mod.prim_funcs()
        # A graph function another function calls (a hand-written module may call one
        # as a kernel; the graph lowering never does) stays a kernel: its caller polls
        # before the call, and the call passes no flag.
        called = {c.func for fn in prims.values() for c in calls(fn.body)}
        graphs = {name: fn for name, fn in prims.items()
                  if fn.attrs.get(ATTR_GRAPH) and not fn.attrs.get(ATTR_TERMINATE_FLAG)
                  and name not in called}
        if not graphs:
            return mod
        funcs = {**mod.functions, **{name: with_terminate_flag(fn) for name, fn in graphs.items()}}
        return IRModule(funcs, mod.attrs)


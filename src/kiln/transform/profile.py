"""ProfileKernelCalls: time every kernel call of the lowered graph functions.

`kiln.compile(..., profile=True)` runs this pass after the pipelines, before the
code generator; registered as `profile-kernel-calls`, a tensor pipeline spelled
by names may end with it instead (docs/passes.md). In each
PrimFunc that calls kernels (`CallFunc`: the lowered graph `main`), every call
becomes

    let t = profile_start(site)      # monotonic clock, nanoseconds
    call kernel(...)
    profile_stop(site, t)            # counters[site] += 1 call, now - t ns

and the whole body is wrapped the same way under one more site, so the
library also measures the whole call (without the argument checks of its
packed entry). Sites are numbered across the module in order; the pass records
them in the module attribute `kiln.profile_sites`: one `(function, kernel)`
pair per site, kernel None for the whole call. The counters and the clock live
in host.c (docs/abi.md, "Profiling"); without this pass no timer code exists.
A call that fails (a kernel's non-zero status) leaves before its stop: only
successful calls are counted. The backends read the sites through kiln.ir.profiling
(`profile_sites`).
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.ir import tensor as t
from kiln.ir.attrs import ATTR_PROFILE_SITES
from kiln.ir.module import IRModule
from kiln.ir.profiling import ProfileSite
from kiln.ir.visitor import StmtMutator, iter_stmts
from kiln.transform.pass_base import Pass


def _timed(body: t.Stmt, site: int) -> t.Stmt:
    """`body` between a start and a stop of the timer of `site`."""
    start = t.Var("profile_t0", "int64")
    ident = t.const(site, "int64")
    stop = t.Evaluate(t.Intrin(t.PROFILE_STOP, (ident, start)))
    return t.seq(t.LetStmt(start, t.Intrin(t.PROFILE_START, (ident,))), body, stop)


class _TimeCalls(StmtMutator):
    def __init__(self, function: str, sites: list[ProfileSite]) -> None:
        self.function = function
        self.sites = sites

    def visit_call_func(self, s: t.CallFunc) -> t.Stmt:
        self.sites.append((self.function, s.func))
        return _timed(s, len(self.sites) - 1)


@dataclass(frozen=True)
class ProfileKernelCalls(Pass):
    """Wrap each kernel call (and each calling function's whole body) in timers."""

    name = "profile-kernel-calls"

    def run(self, mod: IRModule) -> IRModule:
        sites: list[ProfileSite] = []
        funcs = dict(mod.functions)
        for name, fn in mod.prim_funcs().items():
            if not any(isinstance(s, t.CallFunc) for s in iter_stmts(fn.body)):
                continue
            body = _TimeCalls(name, sites).visit_stmt(fn.body)
            sites.append((name, None))
            funcs[name] = fn.with_body(_timed(body, len(sites) - 1))
        return IRModule(funcs, {**mod.attrs, ATTR_PROFILE_SITES: tuple(sites)})

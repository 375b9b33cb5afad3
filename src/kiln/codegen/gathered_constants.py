"""Which constants the kernels read only at places that data picks (a Gather's table).

An embedding table is read one row per token: a run touches few of its pages. Every
other weight is streamed whole (a GEMV reads all of it each step). The loader's weight
check reads every page once, so the pages of a gathered constant that no token selects
would stay resident for nothing: the constants artifact lists these constants
(`"gathered"`, docs/format.md) and the check hands their pages back once hashed
(kiln.runtime.weights), leaving the streamed weights' pages as they are.

A constant is *gathered* when every read of it, in every function it is passed to,
is a `Load` whose indices depend on loaded data (directly, or through `let` variables
bound to such values). Anything else it meets (an affine load, a call of an external
kernel, a view of it) makes it streamed: the test errs on keeping pages.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir import tensor as t
from kiln.ir.module import IRModule
from kiln.ir.visitor import iter_exprs, iter_nodes, iter_stmts, operands


def gathered_constants(mod: IRModule) -> set[int]:
    """The `id`s of the AllocConst arrays of `mod` that are read only by gathers."""
    funcs = mod.prim_funcs()
    memo: dict[tuple[str, int], bool] = {}

    def param_gathered(name: str, index: int) -> bool:
        key = (name, index)
        if key not in memo:
            memo[key] = False  # a recursive call reads it as streamed
            fn = funcs.get(name)
            param = fn.params[index] if fn is not None and index < len(fn.params) else None
            if fn is not None and isinstance(param, t.Buffer):
                memo[key] = _only_gathered(fn.body, param, param_gathered)
        return memo[key]

    verdict: dict[int, bool] = {}
    for fn in funcs.values():
        for node in iter_stmts(fn.body):
            if isinstance(node, t.AllocConst):
                key = id(node.data)
                verdict[key] = verdict.get(key, True) and _only_gathered(
                    fn.body, node.buffer, param_gathered)
    return {key for key, gathered in verdict.items() if gathered}


def _only_gathered(body: t.Stmt, buf: t.Buffer,
                   param_gathered: Callable[[str, int], bool]) -> bool:
    """Whether every use of `buf` in `body` is a data-indexed load (or a call passing it
    to a parameter that is, `param_gathered(function, index)`)."""
    data_vars: set[t.Var] = set()
    for node in iter_nodes(body):
        if isinstance(node, t.LetStmt) and _data_dependent((node.value,), data_vars):
            data_vars.add(node.var)
        if not any(x is buf for x in operands(node)):
            continue
        if isinstance(node, t.Load):
            if not _data_dependent(node.indices, data_vars):
                return False
        elif isinstance(node, t.CallFunc):
            if not all(param_gathered(node.func, i) for i, a in enumerate(node.args)
                       if a is buf):
                return False
        else:
            return False
    return True


def _data_dependent(exprs: tuple[t.PrimExpr, ...], data_vars: set[t.Var]) -> bool:
    return any(isinstance(e, t.Load) or (isinstance(e, t.Var) and e in data_vars)
               for e in iter_exprs(*exprs))


__all__ = ["gathered_constants"]

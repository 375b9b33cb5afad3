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

from kiln.ir import tensor as t
from kiln.ir.module import IRModule
from kiln.ir.visitor import iter_exprs, iter_nodes, iter_stmts, operands


def gathered_constants(mod: IRModule) -> set[int]:
    """The `id`s of the AllocConst arrays of `mod` that are read only by gathers."""
    funcs = mod.prim_funcs()
    uses = {name: _uses(fn.body) for name, fn in funcs.items()}  # one walk per function
    memo: dict[tuple[str, int], bool] = {}

    def gathered(name: str, buf: t.Buffer) -> bool:
        return all(param_gathered(*use) if isinstance(use, tuple) else use
                   for use in uses[name].get(buf, ()))

    def param_gathered(name: str, index: int) -> bool:
        key = (name, index)
        if key not in memo:
            memo[key] = False  # a recursive call reads it as streamed
            fn = funcs.get(name)
            param = fn.params[index] if fn is not None and index < len(fn.params) else None
            if isinstance(param, t.Buffer):
                memo[key] = gathered(name, param)
        return memo[key]

    verdict: dict[int, bool] = {}
    for name, fn in funcs.items():
        for node in iter_stmts(fn.body):
            if isinstance(node, t.AllocConst):
                key = id(node.data)
                verdict[key] = verdict.get(key, True) and gathered(name, node.buffer)
    return {key for key, ok in verdict.items() if ok}


# A use of a buffer: True (a data-indexed load), False (any other read), or the
# (function, parameter index) a call passes it to.
_Use = bool | tuple[str, int]


def _uses(body: t.Stmt) -> dict[t.Buffer, list[_Use]]:
    """Every use of every buffer in `body`."""
    data_vars: set[t.Var] = set()  # `let` variables bound to loaded data
    out: dict[t.Buffer, list[_Use]] = {}
    for node in iter_nodes(body):
        if isinstance(node, t.LetStmt) and _data_dependent((node.value,), data_vars):
            data_vars.add(node.var)
        for i, x in enumerate(operands(node)):
            if not isinstance(x, t.Buffer):
                continue
            if isinstance(node, t.Load):
                use: _Use = _data_dependent(node.indices, data_vars)
            elif isinstance(node, t.CallFunc):
                use = (node.func, i)
            else:
                use = False
            out.setdefault(x, []).append(use)
    return out


def _data_dependent(exprs: tuple[t.PrimExpr, ...], data_vars: set[t.Var]) -> bool:
    return any(isinstance(e, t.Load) or (isinstance(e, t.Var) and e in data_vars)
               for e in iter_exprs(*exprs))


__all__ = ["gathered_constants"]

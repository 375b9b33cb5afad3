"""DeadCodeElimination: drop unused graph bindings and unreferenced private functions.

Graph-level bindings have no side effects (a CallTensor writes only the
outputs the caller allocates for it), so a binding the result does not need,
directly or through other bindings, is removed. A function marked private
(attribute `kiln.private`, set by LegalizeOps) that no public function reaches
through CallTensor / CallFunc is removed from the module.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.ir import graph as g
from kiln.ir.analysis.graph_uses import called_functions, graph_vars_used
from kiln.ir.attrs import ATTR_PRIVATE
from kiln.ir.module import BaseFunc, IRModule
from kiln.transform.pass_base import Pass


@dataclass(frozen=True)
class DeadCodeElimination(Pass):
    """Remove dead bindings (`bindings=True`) and unreachable private functions."""

    name = "dead-code-elimination"
    bindings: bool = True
    functions: bool = True

    def run(self, mod: IRModule) -> IRModule:
        funcs: dict[str, BaseFunc] = dict(mod.functions)
        changed = False
        if self.bindings:
            for name, fn in mod.graph_funcs().items():
                new = remove_dead_bindings(fn)
                if new is not fn:
                    funcs[name] = new
                    changed = True
        if self.functions:
            live = reachable_functions(funcs)
            dead = [n for n, f in funcs.items() if f.attrs.get(ATTR_PRIVATE) and n not in live]
            for n in dead:
                del funcs[n]
            changed = changed or bool(dead)
        return IRModule(funcs, mod.attrs) if changed else mod


def remove_dead_bindings(fn: g.Function) -> g.Function:
    """`fn` without the bindings its result does not depend on (same object if none)."""
    needed: set[g.Var] = set(graph_vars_used(fn.result))
    keep: list[g.Binding] = []
    for b in reversed(fn.bindings):
        if b.var in needed:
            keep.append(b)
            needed.update(graph_vars_used(b.value))
    if len(keep) == len(fn.bindings):
        return fn
    return g.Function(fn.params, tuple(reversed(keep)), fn.result, dict(fn.attrs))


def reachable_functions(funcs: dict[str, BaseFunc]) -> set[str]:
    """Names reachable from the public (non-private) functions, themselves included."""
    todo = [n for n, f in funcs.items() if not f.attrs.get(ATTR_PRIVATE)]
    seen: set[str] = set(todo)
    while todo:
        name = todo.pop()
        for callee in called_functions(funcs[name]):
            if callee in funcs and callee not in seen:
                seen.add(callee)
                todo.append(callee)
    return seen

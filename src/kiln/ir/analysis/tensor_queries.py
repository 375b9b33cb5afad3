"""Read-only queries over tensor-level IR: what a statement references, reads, calls.

The backends ask them before printing:

C warns about unused locals and parameters (`-Wall -Wextra -Werror`), so the
printer must know up front which variables and buffers are referenced; it also
hoists the pointers of heap workspaces and needs every external function's
prototype.
"""

from __future__ import annotations

from collections.abc import Iterator

from kiln.ir.tensor import (
    PROFILE_INTRINSICS,
    Allocate,
    Buffer,
    CallExtern,
    CallFunc,
    DeclBuffer,
    Intrin,
    Load,
    PrimExpr,
    Stmt,
    Store,
    Var,
)
from kiln.ir.visitor import iter_nodes, iter_stmts

Node = PrimExpr | Stmt


def referenced(root: Node) -> set[object]:
    """Vars and Buffers that some expression or statement under `root` reads or writes.

    A DeclBuffer view that is referenced makes its source referenced too.
    """
    refs: set[object] = set()
    views: list[DeclBuffer] = []
    for node in iter_nodes(root):
        if isinstance(node, Var):
            refs.add(node)
        elif isinstance(node, (Load, Store)):
            refs.add(node.buffer)
        elif isinstance(node, (CallExtern, CallFunc)):
            refs.update(a for a in node.args if isinstance(a, Buffer))
        elif isinstance(node, DeclBuffer):
            views.append(node)
    changed = True
    while changed:
        changed = False
        for view in views:
            if view.buffer in refs and view.source not in refs:
                refs.add(view.source)
                changed = True
    return refs


def read_buffers(root: Node) -> set[Buffer]:
    """Buffers whose contents or address something reads: loads, call arguments and
    the sources of DeclBuffer views. A buffer outside this set is only stored to."""
    out: set[Buffer] = set()
    for node in iter_nodes(root):
        if isinstance(node, Load):
            out.add(node.buffer)
        elif isinstance(node, (CallExtern, CallFunc)):
            out.update(a for a in node.args if isinstance(a, Buffer))
        elif isinstance(node, DeclBuffer):
            out.add(node.source)
    return out


def has_side_effects(expr: PrimExpr) -> bool:
    """True when `expr` calls an external function or reads a profiling timer."""
    return any(isinstance(n, CallExtern)
               or (isinstance(n, Intrin) and n.name in PROFILE_INTRINSICS)
               for n in iter_nodes(expr))


def _statements(root: Node) -> Iterator[Stmt]:
    """The statements under `root` in order: for a query about statements only, the
    expressions (most of the nodes) need no walk."""
    return iter_stmts(root) if isinstance(root, Stmt) else iter(())


def heap_allocations(root: Node) -> list[Allocate]:
    """Every `global` (heap) Allocate under `root`, each buffer once, in order."""
    seen: dict[Buffer, Allocate] = {}
    for node in _statements(root):
        if isinstance(node, Allocate) and node.buffer.scope == "global":
            seen.setdefault(node.buffer, node)
    return list(seen.values())


def calls(root: Node) -> list[CallFunc]:
    return [n for n in _statements(root) if isinstance(n, CallFunc)]


def extern_calls(root: Node) -> list[CallExtern]:
    return [n for n in iter_nodes(root) if isinstance(n, CallExtern)]

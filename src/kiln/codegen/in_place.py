"""Which results of a lowered graph function may be one of its parameters' own buffer.

A kernel marked `ATTR_IN_PLACE` (input k, output o) compares its two buffers' addresses
and, when they are one, writes only what changes (kiln.ops.kv_cache: a key/value cache's
new rows). The graph function passes that overlap on to its caller when the kernel's
input k is one of its parameters, its output o one of its results, and nothing else of
the function reads the parameter (so no kernel sees it after the result was written):
the result is `in_place_of` the parameter in the metadata (docs/abi.md, "A result in
place of a parameter"), and the runtime allows exactly that overlap, the same address.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from kiln.codegen.naming import packed_params
from kiln.ir.attrs import ATTR_IN_PLACE, ATTR_NUM_OUTPUTS
from kiln.ir.tensor import (
    Buffer,
    CallExtern,
    CallFunc,
    Const,
    DeclBuffer,
    Load,
    PrimFunc,
    SeqStmt,
    Stmt,
    Store,
)
from kiln.ir.visitor import iter_nodes


def in_place_results(fn: PrimFunc, funcs: Mapping[str, PrimFunc]) -> dict[int, int]:
    """{result index: parameter index} of `fn` (a lowered graph function; `funcs` the
    module's functions): each result a marked kernel may write over a parameter. The
    kernel's call must be a statement of the function's body itself (not in a loop,
    which would run the statements before it again), the parameter's last use and the
    result's first (no kernel writes the buffer before or reads the past after it)."""
    n_out = int(fn.attrs.get(ATTR_NUM_OUTPUTS, 0))
    params = packed_params(fn)
    if not n_out:
        return {}
    split = len(params) - n_out
    inputs = {p: i for i, p in enumerate(params[:split]) if isinstance(p, Buffer)}
    results = {p: j for j, p in enumerate(params[split:]) if isinstance(p, Buffer)}
    body = fn.body.body if isinstance(fn.body, SeqStmt) else (fn.body,)
    decls: dict[object, DeclBuffer] = {}
    views: dict[object, object] = {}  # views of the function's storage, by their root
    for stmt in body:
        if isinstance(stmt, DeclBuffer):
            decls.setdefault(stmt.buffer, stmt)
            views[stmt.buffer] = views.get(stmt.source, stmt.source)

    def whole(buf: object) -> object:
        """The parameter a view at its offset 0 is, else the buffer itself."""
        decl = decls.get(buf)
        if decl is None or not _is_zero(decl.byte_offset):
            return buf
        return whole(decl.source)

    first_use: dict[object, int] = {}
    last_use: dict[object, int] = {}
    for k, stmt in enumerate(body):
        for buf in _uses(stmt):
            first_use.setdefault(views.get(buf, buf), k)
            last_use[views.get(buf, buf)] = k
    found: dict[int, int] = {}
    for k, stmt in enumerate(body):
        if not isinstance(stmt, CallFunc) or stmt.func not in funcs:
            continue
        marked = funcs[stmt.func].attrs.get(ATTR_IN_PLACE)
        if marked is None:
            continue
        source, target = (whole(stmt.args[a]) for a in marked)
        if (isinstance(source, Buffer) and isinstance(target, Buffer)
                and source in inputs and target in results and last_use.get(source) == k
                and first_use.get(target) == k
                and sum(a is source for a in stmt.args) == 1
                and source.dtype == target.dtype and len(source.shape) == len(target.shape)):
            found[results[target]] = inputs[source]
    return found


def _is_zero(offset: object) -> bool:
    if isinstance(offset, Const):
        return bool(offset.value == 0)
    return isinstance(offset, int) and offset == 0


def _uses(stmt: Stmt) -> Iterator[object]:
    """The buffers `stmt` reads, writes or passes on (a view is its own: declaring one
    touches nothing)."""
    for node in iter_nodes(stmt):
        if isinstance(node, (Load, Store)):
            yield node.buffer
        elif isinstance(node, (CallFunc, CallExtern)):
            yield from (a for a in node.args if isinstance(a, Buffer))


__all__ = ["in_place_results"]

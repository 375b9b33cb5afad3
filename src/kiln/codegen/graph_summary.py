"""The "graphs" entry of the library metadata: what `kiln inspect --report` draws.

For every lowered graph function (a PrimFunc that calls kernels with
`CallFunc`), the summary lists its tensors and its kernel calls in order:

    {"tensors": [{"name": "relu", "shape": [1, 8, 16, 16], "dtype": "float32",
                  "bytes": 8192, "kind": "workspace", "offset": 0}, ...],
     "kernels": [{"name": "fused_conv2d_relu", "inputs": [0, 1, 2], "outputs": [3]}, ...],
     "workspace_bytes": 10240}

`kind` is "input" or "output" (the function's parameters and results),
"weight" (AllocConst), "workspace" (a view at `offset` bytes into the planned
workspace arena, transform/memory_plan.py), or "buffer" (any other
allocation). Kernel inputs and outputs index `tensors`; an argument the callee
writes (kiln.ir.aliasing) is an output. Scalars are left out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from kiln.codegen.naming import packed_params, param_info
from kiln.ir.attrs import ATTR_NUM_OUTPUTS, ATTR_WORKSPACE_BYTES
from kiln.ir.outlined import is_loop_body
from kiln.ir.shape_expr import dim_text, simplify_dim
from kiln.ir.tensor import (
    Allocate,
    AllocConst,
    Buffer,
    CallFunc,
    DeclBuffer,
    Load,
    PrimFunc,
    Select,
    Stmt,
    Var,
    as_expr,
)
from kiln.ir.types import Dim
from kiln.ir.visitor import iter_exprs, iter_stmts


def _size(buf: Buffer) -> int | None:
    return buf.nbytes() if all(isinstance(d, int) for d in buf.shape) else None


def _per_iteration(s: DeclBuffer) -> bool:
    """Whether the view's offset is not a dimension expression (it reads loop state)."""
    return not isinstance(s.byte_offset, int) and any(
        isinstance(e, (Select, Load)) or (isinstance(e, Var) and e.name == "iteration")
        for e in iter_exprs(s.byte_offset))


def _statements(fn: PrimFunc, funcs: Mapping[str, PrimFunc]) -> Iterator[Stmt]:
    """`fn`'s statements in order, each launch of an outlined parallel loop
    (kiln.ir.outlined) replaced by the loop body's statements: the summary is
    the same whether the loops were outlined or not."""
    for s in iter_stmts(fn.body):
        callee = funcs.get(s.func) if isinstance(s, CallFunc) else None
        if callee is not None and is_loop_body(callee):
            yield from iter_stmts(callee.body)  # the kernel's own buffers: same objects
        else:
            yield s


def graph_summary(fn: PrimFunc, written: Mapping[str, frozenset[int]],
                  funcs: Mapping[str, PrimFunc] | None = None) -> dict[str, Any] | None:
    """The summary of `fn` (see the module docstring), None if it calls no kernel;
    `funcs`, the module's PrimFuncs, lets outlined parallel loops count as in place."""
    index: dict[Buffer, int] = {}
    tensors: list[dict[str, Any]] = []

    def add(buf: Buffer, kind: str, offset: Dim | None = None) -> None:
        index[buf] = len(tensors)
        entry: dict[str, Any] = {"name": buf.name, "shape": param_info(buf)["shape"],
                                 "dtype": buf.dtype, "bytes": _size(buf), "kind": kind}
        if offset is not None:  # bytes, or the text of an expression (symbolic sizes)
            entry["offset"] = offset if isinstance(offset, int) else dim_text(offset)
        tensors.append(entry)

    # the caller's tensors: not the data-dependent sizes' values nor the terminate flag
    buffers = [p for p in packed_params(fn) if isinstance(p, Buffer)]
    n_out = int(fn.attrs.get(ATTR_NUM_OUTPUTS, 0))
    for k, buf in enumerate(buffers):
        add(buf, "output" if k >= len(buffers) - n_out else "input")
    # Byte offset into the arena of every buffer placed in it (views of views add up).
    statements = list(_statements(fn, funcs or {}))
    placed: dict[Buffer, Dim] = {s.buffer: 0 for s in statements if isinstance(s, Allocate)}
    kernels: list[dict[str, Any]] = []
    for s in statements:
        if isinstance(s, AllocConst):
            add(s.buffer, "weight")
        elif isinstance(s, DeclBuffer):
            if s.source in placed and _per_iteration(s):
                # a loop's view that moves with the iteration (ping-pong state, scan slice)
                add(s.buffer, "workspace")
            elif s.source in placed:
                placed[s.buffer] = simplify_dim(as_expr(placed[s.source], "int64")
                                                + s.byte_offset)
                add(s.buffer, "workspace", placed[s.buffer])
            else:
                add(s.buffer, "buffer")
        elif isinstance(s, CallFunc):
            writes = written.get(s.func, frozenset())
            call: dict[str, Any] = {"name": s.func, "inputs": [], "outputs": []}
            for k, arg in enumerate(s.args):
                if isinstance(arg, Buffer):
                    if arg not in index:
                        add(arg, "buffer")
                    call["outputs" if k in writes else "inputs"].append(index[arg])
            kernels.append(call)
    if not kernels:
        return None
    return {"tensors": tensors, "kernels": kernels,
            # an int, or the text of an expression of the dimension variables
            "workspace_bytes": fn.attrs.get(ATTR_WORKSPACE_BYTES, 0)}


def graph_summaries(funcs: Mapping[str, PrimFunc],
                    written: Mapping[str, frozenset[int]]) -> dict[str, Any]:
    """The summaries of every function of `funcs` that calls kernels, by name (outlined
    loop bodies count as part of their kernel)."""
    out = {}
    for name, fn in funcs.items():
        if is_loop_body(fn):
            continue
        summary = graph_summary(fn, written, funcs)
        if summary is not None:
            out[name] = summary
    return out

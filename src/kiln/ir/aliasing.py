"""Which buffer parameters of a kernel may carry LLVM's `noalias`.

`noalias` on a pointer parameter promises that, during the call, memory
reached through it is not reached through any other pointer. It lets LLVM
vectorize without runtime overlap checks. kiln's rule (docs/codegen-llvm.md):

- A buffer parameter the kernel may *write* (stores, through a view, in a
  called kernel, or handed to an external C function) is `noalias`; read-only
  parameters get nothing (two inputs may share memory).
- Callers outside the module (the packed entries) must not pass overlapping
  outputs and inputs: docs/abi.md already says results and inputs may not
  alias.
- Inside the module, every `CallFunc` is checked: if two buffer arguments may
  overlap (same storage and intersecting byte ranges, or unknown ranges) and
  the callee writes one of them, that callee gets no `noalias` at all. The same
  happens to callees of such a kernel that receive two of its parameters.

With symbolic dims (docs/dynamic-shapes.md) a view's offset into a workspace and its
size are expressions of the dim variables: two views are apart when one provably ends
before the other starts for every non-negative value of the dims
(kiln.ir.shape_expr.dim_at_least), as the workspace planner lays them out. Without
that, every kernel of a symbolic build that writes one workspace view while reading
another lost `noalias`, and with it the vector code of its loops (a layer norm's
output pass ran a float at a time, 8x its static build).
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.errors import IRError
from kiln.ir.amx import is_amx_call
from kiln.ir.attrs import ATTR_EXTERN_READS
from kiln.ir.dtype import itemsize
from kiln.ir.identity_cache import IdentityCache
from kiln.ir.shape_expr import dim_at_least, dim_product
from kiln.ir.structural import structural_equal
from kiln.ir.tensor import (
    Allocate,
    AllocConst,
    BinaryOp,
    Buffer,
    CallExtern,
    CallFunc,
    DeclBuffer,
    For,
    IfThenElse,
    PrimExpr,
    PrimFunc,
    Select,
    SeqStmt,
    Stmt,
    Store,
    While,
)
from kiln.ir.types import Dim
from kiln.ir.visitor import expr_children, iter_exprs


@dataclass(frozen=True)
class Region:
    """Bytes of one storage: `root` is the param/allocation, offset/size None if unknown,
    an expression of the dim variables where symbolic."""

    root: object
    offset: Dim | None
    size: Dim | None

    def may_overlap(self, other: Region) -> bool:
        if self.root is not other.root:
            return False
        if None in (self.offset, self.size, other.offset, other.size):
            return True
        assert self.offset is not None and self.size is not None
        assert other.offset is not None and other.size is not None
        # A loop's state slots sit at `Select(even, a, b)`: apart when every choice of
        # branches both offsets can take at once is (the same condition, the same branch)
        for taken_a, a in _alternatives(self.offset):
            for taken_b, b in _alternatives(other.offset):
                if not _contradict(taken_a, taken_b) and _may_meet(a, self.size, b,
                                                                   other.size):
                    return True
        return False


def _may_meet(a: Dim, a_size: Dim, b: Dim, b_size: Dim) -> bool:
    """Whether bytes `a .. a + a_size` may meet bytes `b .. b + b_size`."""
    if all(isinstance(d, int) for d in (a, a_size, b, b_size)):
        return bool(a < b + b_size and b < a + a_size)
    try:
        return not (dim_at_least(b, a + a_size) or dim_at_least(a, b + b_size))
    except IRError:  # an offset that is no dim expression (a loop's counter in it)
        return True


#: The branches an offset takes: (condition, whether it holds) for each Select chosen.
Taken = tuple[tuple[PrimExpr, bool], ...]


def _alternatives(offset: Dim) -> list[tuple[Taken, Dim]]:
    """The values `offset` may take, each with the branches of its Selects that give it
    (a loop's slots double-buffered at `Select(iteration % 2 == 0, a, b)`, plus a view's
    own offset); an offset without a Select is its only value."""
    if isinstance(offset, Select):
        return [((*taken, (offset.cond, holds)), value)
                for holds, arm in ((True, offset.true_value), (False, offset.false_value))
                for taken, value in _alternatives(arm)]
    if isinstance(offset, BinaryOp) and offset.op == "add":
        left, right = _alternatives(offset.a), _alternatives(offset.b)
        if len(left) > 1 or len(right) > 1:
            return [((*ta, *tb), a + b) for ta, a in left for tb, b in right]
    return [((), offset)]


def _contradict(a: Taken, b: Taken) -> bool:
    """Whether branch choices `a` and `b` cannot hold together: one condition taken
    both ways (the current slot and the next one of a loop's state)."""
    return any(ha != hb and structural_equal(ca, cb) for ca, ha in a for cb, hb in b)


@dataclass
class _CallSite:
    callee: str
    args: list[Region | None]  # None for scalar arguments


@dataclass
class _Summary:
    """What one kernel does to its parameters, before looking at callees."""

    params: dict[object, int]  # param buffer -> parameter index
    stored: set[object]  # roots stored to (or handed to external code)
    calls: list[_CallSite]
    extern_reads: frozenset[object] = frozenset()  # params external calls only read


@dataclass(frozen=True)
class AliasInfo:
    """Per kernel: parameter indices it may write, and those that may be `noalias`."""

    written: dict[str, frozenset[int]]
    noalias: dict[str, frozenset[int]]


def analyze(funcs: dict[str, PrimFunc]) -> AliasInfo:
    """Which buffer parameters each kernel writes and which may be marked `noalias`."""
    summaries = {name: _SUMMARIES.get_or_compute(fn, _summarize) for name, fn in funcs.items()}
    written = _written_params(summaries)
    unsafe = _kernels_with_aliasing_calls(summaries, written)
    return AliasInfo(
        written={name: frozenset(w) for name, w in written.items()},
        noalias={name: frozenset() if name in unsafe else frozenset(written[name])
                 for name in funcs})


def _written_params(summaries: dict[str, _Summary]) -> dict[str, set[int]]:
    written: dict[str, set[int]] = {
        name: {s.params[r] for r in s.stored if r in s.params} for name, s in summaries.items()
    }
    changed = True
    while changed:
        changed = False
        for name, s in summaries.items():
            for call in s.calls:
                callee_written = written.get(call.callee, set())
                for index, region in enumerate(call.args):
                    if region is None or index not in callee_written:
                        continue
                    param = s.params.get(region.root)
                    if param is not None and param not in written[name]:
                        written[name].add(param)
                        changed = True
    return written


def _kernels_with_aliasing_calls(
    summaries: dict[str, _Summary], written: dict[str, set[int]],
) -> set[str]:
    unsafe: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, s in summaries.items():
            for call in s.calls:
                if call.callee in unsafe or call.callee not in summaries:
                    continue
                if _call_may_alias(call, written[call.callee], s, caller_unsafe=name in unsafe):
                    unsafe.add(call.callee)
                    changed = True
    return unsafe


def _call_may_alias(call: _CallSite, callee_written: set[int], caller: _Summary,
                    caller_unsafe: bool) -> bool:
    buffers = [(i, r) for i, r in enumerate(call.args) if r is not None]
    for a, (i, ri) in enumerate(buffers):
        for j, rj in buffers[a + 1:]:
            if i not in callee_written and j not in callee_written:
                continue
            if ri.may_overlap(rj):
                return True
            # Two parameters of a kernel without noalias may be the same memory.
            if caller_unsafe and ri.root in caller.params and rj.root in caller.params:
                return True
    return False


# ------------------------------------------------------------------ summarizing


def _static_nbytes(buf: Buffer) -> int | None:
    try:
        return buf.nbytes()
    except IRError:
        return None


def _nbytes(buf: Buffer) -> Dim | None:
    """`buf`'s size in bytes, an expression of the dim variables where symbolic."""
    size = _static_nbytes(buf)
    if size is not None:
        return size
    try:
        return dim_product((*buf.shape, itemsize(buf.dtype)))
    except IRError:
        return None


# Several passes and both backends ask about the same (immutable) kernels.
_SUMMARIES: IdentityCache[PrimFunc, _Summary] = IdentityCache()


def _summarize(fn: PrimFunc) -> _Summary:
    params: dict[object, int] = {p: i for i, p in enumerate(fn.params) if isinstance(p, Buffer)}
    regions = {p: Region(p, 0, _static_nbytes(p)) for p in fn.params if isinstance(p, Buffer)}
    reads = set(fn.attrs.get(ATTR_EXTERN_READS, ()))
    summary = _Summary(params, set(), [], frozenset(p for p in params
                                                    if getattr(p, "name", None) in reads))
    _visit(fn.body, regions, summary)
    return summary


def _region(buf: Buffer, regions: dict[Buffer, Region]) -> Region:
    # A buffer not bound in this kernel is ill-formed IR; treat it as its own storage.
    return regions.get(buf) or Region(buf, None, None)


def _visit(stmt: Stmt, regions: dict[Buffer, Region], out: _Summary) -> None:
    # External functions may write the buffers handed to them (an AMX block writes only
    # its first, the float32 tile: kiln.ir.amx).
    for sub in iter_exprs(*(e for e in expr_children(stmt) if isinstance(e, PrimExpr))):
        if isinstance(sub, CallExtern):
            for arg in sub.args[:1] if is_amx_call(sub.name) else sub.args:
                if isinstance(arg, Buffer):
                    root = _region(arg, regions).root
                    if root not in out.extern_reads:
                        out.stored.add(root)
    if isinstance(stmt, Store):
        out.stored.add(_region(stmt.buffer, regions).root)
    elif isinstance(stmt, SeqStmt):
        # A declaration's region holds for the rest of this list.
        inner = dict(regions)
        for s in stmt.body:
            _declare(s, inner)
            _visit(s, inner, out)
    elif isinstance(stmt, (For, While)):
        _visit(stmt.body, regions, out)
    elif isinstance(stmt, IfThenElse):
        _visit(stmt.then_body, regions, out)
        if stmt.else_body is not None:
            _visit(stmt.else_body, regions, out)
    elif isinstance(stmt, CallFunc):
        out.calls.append(_CallSite(stmt.func, [
            _region(a, regions) if isinstance(a, Buffer) else None for a in stmt.args]))


def _declare(stmt: Stmt, regions: dict[Buffer, Region]) -> None:
    """Add the region of the buffer `stmt` declares, if it is a declaration."""
    if isinstance(stmt, (Allocate, AllocConst)):
        regions[stmt.buffer] = Region(stmt.buffer, 0, None)
    elif isinstance(stmt, DeclBuffer):
        src = _region(stmt.source, regions)
        offset = None if src.offset is None else src.offset + stmt.byte_offset
        regions[stmt.buffer] = Region(src.root, offset, _nbytes(stmt.buffer))

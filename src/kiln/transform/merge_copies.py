"""MergeCopies: one copy for a chain of reshapes and transposes, none for a transposed B.

Every `reshape` and `transpose` the importer emits becomes a kernel that reads and
writes the whole tensor. Two patterns cost most of them:

- **a transpose feeding a matrix product's B** (attention's `Q @ K^T`, where the
  exporter transposes K's heads as `[seq, heads, dim] -> [heads, dim, seq]`): a
  transpose `p` of B whose last two axes swap those of a permutation `q` becomes
  `matmul(a, transpose(x, q), transpose_b=True)`, and the transpose disappears when
  `q` is the identity. The product's packing reads B `[N][K]` rows as they are
  (kiln.kernels.gemm.families); what remains of the transpose (`[seq, heads, dim] ->
  [heads, seq, dim]`) moves whole rows of `dim` elements instead of single ones;
- **chains of static reshapes and transposes** whose intermediate values are read once
  (ShuffleNet's channel shuffle `reshape -> transpose -> reshape`, the heads split
  `reshape -> transpose` and merge `transpose -> reshape` of attention): the chain
  becomes one `reshape`, one `transpose`, or one `reshape_transpose(x, inner, perm,
  shape)` (kiln.ops.manip), one copy instead of two or three.

A grouped-query attention's head expansion read by a product is read in place instead
(kiln.transform.grouped_heads).

A unary elementwise op between two reshapes that undo each other (Whisper's Conv1d, a
2-D convolution of height 1 between views, then GELU, then the next Conv1d's view:
`reshape(gelu(reshape(y)))` with the result of `y`'s shape) runs on `y` itself, so the
convolutions and the op are one chain of 4-D values (fused, and one NCHW{b}c region:
kiln.transform.nchwc_layout).

A chain over symbolic sizes is merged when each of them is carried by the chain as it
is (the batch of an attention's heads split, `[batch, seq, 512] -> [batch, seq, 8, 64]
-> [batch, 8, seq, 64]`): the merged op names it by the input dimension it copies
(kiln.ops.reshape_dims), and a chain whose merged op would not have the last op's type
is left as it is. An intermediate read elsewhere stops the chain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.analysis.graph_uses import var_use_counts
from kiln.ir.module import IRModule
from kiln.ir.types import Dim, TensorType
from kiln.ops import call
from kiln.ops.registry import get_op
from kiln.ops.reshape_dims import reshape_attr, reshape_target
from kiln.transform.channel_shuffles import fold_shuffles
from kiln.transform.grouped_heads import read_grouped_heads
from kiln.transform.pass_base import FunctionPass
from kiln.transform.splice import splice

COPY_OPS = ("reshape", "transpose", "reshape_transpose")
Shape = tuple[Dim, ...]
Perm = tuple[int, ...]


@dataclass(frozen=True)
class _Chain:
    """`reshape(src, inner) -> transpose(perm) -> reshape(shape)`."""

    src: g.Expr
    inner: Shape
    perm: Perm
    shape: Shape

    @property
    def moved(self) -> Shape:
        """The shape after the transpose."""
        return tuple(self.inner[a] for a in self.perm)

    def then_reshape(self, shape: Shape) -> _Chain:
        return _Chain(self.src, self.inner, self.perm, shape)

    def then_transpose(self, perm: Perm) -> _Chain | None:
        """This chain followed by `transpose(perm)`, when one chain expresses both."""
        if self.shape == self.moved:      # no reshape between the two transposes
            composed = tuple(self.perm[a] for a in perm)
            return _Chain(self.src, self.inner, composed, tuple(self.inner[a] for a in composed))
        if self.perm == tuple(range(len(self.perm))):  # a plain reshape so far
            return _Chain(self.src, self.shape, perm, tuple(self.shape[a] for a in perm))
        return None

    def call(self) -> g.Call:
        """The one op that copies the chain (IRError when a symbolic size of it has no
        spelling over the input's)."""
        src_type = self.src.type
        assert isinstance(src_type, TensorType)
        src = tuple(src_type.shape)
        if self.perm == tuple(range(len(self.perm))):
            return call("reshape", self.src, shape=reshape_attr(src, self.shape))
        if self.inner == src and self.shape == self.moved:
            return call("transpose", self.src, perm=self.perm)
        return call("reshape_transpose", self.src, inner=reshape_attr(src, self.inner),
                    perm=self.perm, shape=reshape_attr(src, self.shape))


def _dims(t: Any) -> Shape | None:
    return tuple(t.shape) if isinstance(t, TensorType) else None


def _perm_of(value: g.Call, ndim: int) -> Perm:
    perm = cast("Sequence[int] | None", value.attrs.get("perm"))
    return tuple(range(ndim))[::-1] if perm is None else tuple(int(a) for a in perm)


def _steps(value: g.Call) -> list[tuple[str, Any]] | None:
    """A copy op as steps ("reshape", shape) / ("transpose", perm), else None."""
    src, out = _dims(value.args[0].type), _dims(value.ret_type)
    if src is None or out is None:
        return None
    if value.op == "reshape":
        return [("reshape", out)]
    if value.op == "transpose":
        return [("transpose", _perm_of(value, len(src)))]
    inner = reshape_target(src, cast("Sequence[int | str]", value.attrs["inner"]))
    return [("reshape", inner), ("transpose", _perm_of(value, len(inner))), ("reshape", out)]


def _extend(chain: _Chain, steps: Sequence[tuple[str, Any]]) -> _Chain | None:
    for kind, arg in steps:
        nxt = chain.then_reshape(arg) if kind == "reshape" else chain.then_transpose(arg)
        if nxt is None:
            return None
        chain = nxt
    return chain


def _start(value: g.Call) -> _Chain | None:
    """The chain of one copy op."""
    steps = _steps(value)
    src = _dims(value.args[0].type)
    if steps is None or src is None:
        return None
    return _extend(_Chain(value.args[0], src, tuple(range(len(src))), src), steps)


@dataclass(frozen=True)
class MergeCopies(FunctionPass):
    """Read transposed B operands in place; merge reshape/transpose chains into one copy."""

    name = "merge-copies"
    level = "graph"

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> g.Function:
        assert isinstance(func, g.Function)
        bindings = _transposed_b(func)
        items = list(func.bindings) if bindings is None else bindings
        grouped = read_grouped_heads(items, var_use_counts(
            g.Function(func.params, tuple(items), func.result)))
        bindings = grouped if grouped is not None else bindings
        bindings = _unary_between_views(func, bindings)
        bindings = _merge_chains(func, bindings)
        merged = func if bindings is None else g.Function(
            func.params, tuple(bindings), func.result, dict(func.attrs))
        return fold_shuffles(merged)


SCALAR_OPS = ("multiply", "divide", "add", "subtract")


def _scalar_step(value: g.Expr) -> tuple[g.Call, int] | None:
    """(call, position of its tensor operand) for an elementwise op of a tensor and a
    one-element constant (`k * 1.0`, the exporters' split of attention's scale), which
    commutes with any transpose of the tensor."""
    if not (isinstance(value, g.Call) and value.op in SCALAR_OPS and len(value.args) == 2):
        return None
    for pos in (0, 1):
        c = value.args[1 - pos]
        if isinstance(c, g.Constant) and c.data.size == 1 and c.data.ndim == 0 and \
                isinstance(value.args[pos], g.Var):
            return value, pos
    return None


def _transposed_b(func: g.Function) -> list[g.Binding] | None:
    """`matmul(a, transpose(x, p))` -> `matmul(a, transpose(x, q), transpose_b=True)`
    where `q` is `p` with its last two axes swapped (no transpose when `q` is the
    identity), when `p` makes x's last axis B's rows (K^T, not attention's V, whose
    transpose keeps it last) and the transpose has no other reader. Scalar elementwise ops
    between the transpose and the product (`transpose(k) * 1.0`) move with it."""
    uses = var_use_counts(func)
    defs = {b.var: b.value for b in func.bindings}
    replaced: dict[int, list[g.Binding]] = {}  # id(the matmul's var) -> its new bindings
    dropped: set[int] = set()                   # id(var)
    for b in func.bindings:
        v = b.value
        if not (isinstance(v, g.Call) and v.op == "matmul" and len(v.args) == 2):
            continue
        bt = v.args[1]
        scalars: list[tuple[g.Call, int]] = []   # from the product down to the transpose
        path: list[g.Var] = []
        t: g.Expr | None = None
        while isinstance(bt, g.Var) and uses[bt] == 1 and bt in defs:
            path.append(bt)
            t = defs[bt]
            step = _scalar_step(t)
            if step is None:
                break
            scalars.append(step)
            bt = step[0].args[step[1]]
        if not (isinstance(t, g.Call) and t.op == "transpose" and path):
            continue
        x_type = t.args[0].type
        if not isinstance(x_type, TensorType) or x_type.ndim < 2:
            continue
        p = _perm_of(t, x_type.ndim)
        if p[-2] != x_type.ndim - 1:
            continue  # x's rows would no longer be B's rows: transpose_b would not help
        q = (*p[:-2], p[-1], p[-2])
        stmts: list[g.Binding] = []
        b_new: g.Expr = t.args[0]
        if q != tuple(range(len(q))):
            b_new = _bind(stmts, f"{b.var.name}_b", call("transpose", b_new, perm=q))
        for op, pos in reversed(scalars):
            args = [b_new, op.args[1]] if pos == 0 else [op.args[0], b_new]
            b_new = _bind(stmts, f"{b.var.name}_b", call(op.op, *args, **dict(op.attrs)))
        attrs = dict(v.attrs)
        attrs["transpose_b"] = not bool(attrs.get("transpose_b"))
        if not attrs["transpose_b"]:
            del attrs["transpose_b"]
        new = call("matmul", v.args[0], b_new, **attrs)
        if new.ret_type != v.ret_type:
            continue
        replaced[id(b.var)] = [*stmts, g.Binding(b.var, new)]
        dropped.update(id(v) for v in path)
    if not replaced:
        return None
    return splice(func.bindings, dropped, replaced)


def _bind(stmts: list[g.Binding], hint: str, value: g.Call) -> g.Var:
    var = g.Var(hint, value.ret_type)
    stmts.append(g.Binding(var, value))
    return var


def _copies(chain: _Chain, var: g.Var) -> bool:
    """Whether `chain`'s one op computes `var`'s type (a symbolic size may have no
    spelling over the chain's input, or another form than the last op's)."""
    try:
        return chain.call().ret_type == var.type
    except IRError:
        return False


def _current(func: g.Function, bindings: list[g.Binding] | None
             ) -> tuple[bool, list[g.Binding], Counter[g.Var]]:
    """Whether an earlier step changed `func` (`bindings` not None), the bindings as they
    are now, and each variable's count of readers among them."""
    items = list(func.bindings) if bindings is None else bindings
    return bindings is not None, items, var_use_counts(
        g.Function(func.params, tuple(items), func.result))


def _copy_ops(items: list[g.Binding]) -> list[tuple[g.Binding, g.Call]]:
    """The bindings of copy ops (`COPY_OPS`), each with its call."""
    return [(b, b.value) for b in items
            if isinstance(b.value, g.Call) and b.value.op in COPY_OPS]


def _unary_between_views(func: g.Function,
                         bindings: list[g.Binding] | None) -> list[g.Binding] | None:
    """`c(u(reshape(y)))` for a unary elementwise op `u` and a copy op `c`, the reshape and
    `u` read once: `u(y)` when `c` is a reshape back to `y`'s type, else
    `c(reshape(u(y)))` (one copy after `_merge_chains`), so `u` fuses into `y`'s
    producer."""
    changed, items, uses = _current(func, bindings)
    defs = {b.var: b.value for b in items}
    replaced: dict[int, list[g.Binding]] = {}  # id(var) -> its new bindings
    dropped: set[int] = set()                   # id(var)
    for b, outer in _copy_ops(items):
        u = outer.args[0]
        op = defs.get(u) if isinstance(u, g.Var) and uses[u] == 1 else None
        if not (isinstance(op, g.Call) and len(op.args) == 1
                and get_op(op.op).pattern == "elemwise"):
            continue
        inner = op.args[0]
        view = defs.get(inner) if isinstance(inner, g.Var) and uses[inner] == 1 else None
        if not (isinstance(view, g.Call) and view.op == "reshape"):
            continue
        assert isinstance(u, g.Var) and isinstance(inner, g.Var)
        y = view.args[0]
        stmts: list[g.Binding] = []
        if outer.op == "reshape" and y.type == b.var.type:
            last = call(op.op, y, **dict(op.attrs))
        else:
            moved = _bind(stmts, u.name, call(op.op, y, **dict(op.attrs)))
            again = _bind(stmts, inner.name, call("reshape", moved, **dict(view.attrs)))
            last = call(outer.op, again, **dict(outer.attrs))
        if last.ret_type != b.var.type:
            continue
        replaced[id(b.var)] = [*stmts, g.Binding(b.var, last)]
        dropped.update((id(u), id(inner)))
    if not replaced:
        return items if changed else None
    return splice(items, dropped, replaced)


def _merge_chains(func: g.Function, bindings: list[g.Binding] | None) -> list[g.Binding] | None:
    """Each copy op read only by another copy op is merged into its reader."""
    changed, items, uses = _current(func, bindings)
    chains: dict[g.Var, _Chain] = {}      # var -> the chain its copy op computes
    absorbed: set[g.Var] = set()
    for b, v in _copy_ops(items):
        src = v.args[0]
        prev = chains.get(src) if isinstance(src, g.Var) and uses[src] == 1 else None
        steps = _steps(v)
        merged = _extend(prev, steps) if prev is not None and steps is not None else None
        if merged is not None and _copies(merged, b.var):
            assert isinstance(src, g.Var)
            chains[b.var] = merged
            absorbed.add(src)
            continue
        start = _start(v)
        if start is not None:
            chains[b.var] = start
    if not absorbed:
        return items if changed else None
    out: list[g.Binding] = []
    for b in items:
        if b.var in absorbed:
            continue
        chain = chains.get(b.var)
        value = b.value
        if chain is not None and isinstance(value, g.Call) and value.args[0] is not chain.src:
            new = chain.call()   # the chain's result has the last op's type by construction
            assert new.ret_type == b.var.type, (new.ret_type, b.var.type)
            out.append(g.Binding(b.var, new))
            continue
        out.append(b)
    return out

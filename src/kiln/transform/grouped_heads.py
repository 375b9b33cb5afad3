"""Grouped-query attention's key/value heads read in place by the attention's products.

Exporters write a GQA layer's head expansion (`repeat_kv`) as
`reshape(broadcast_to(reshape(kv, [b, g, 1, t, d]), [b, g, r, t, d]), [b, g * r, t, d])`:
two copies of the whole cache at every decode step (the broadcast and the reshape that
merges its axes), each `r` times the cache's size, only for the scores' and the values'
products to read them. A product `matmul(a, expanded)` (B possibly scaled by a scalar,
`transpose_b` or not) becomes

    reshape(matmul(reshape(a, [b, g, r, s, k]), kv5), [b, g * r, s, n])

with `kv5 = reshape(kv, [b, g, 1, t, d])` the expansion's own first step: the product
broadcasts B's head axis of 1 over the `r` query heads of each group (numpy's batch
broadcasting), so the cache is read where it lies. The two new reshapes copy A and the
result (one query row a head in a decode step) instead of the cache. The rewrite runs
in `MergeCopies` after the transposed-B rule, which has already turned attention's
`K^T` into `transpose_b`.

torch's dynamo export transposes the expanded keys through a 3-D view
(`reshape [b * h, t, d] -> transpose(0, 2, 1) -> reshape [b, h, d, t]`, after the
transposed-B rule has run, which sees no transpose right under the product): that view
is the keys' `K^T` all the same, so the product reads the expansion with `transpose_b`
flipped, and then reads the cache in place as above.
"""

from __future__ import annotations

from typing import Any

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.shape_expr import dims_equal
from kiln.ir.types import TensorType
from kiln.ops import call
from kiln.ops.reshape_dims import reshape_attr

#: Elementwise ops with a one-element constant that may sit between the expansion and
#: the product (the exporters' split of attention's scale: `k * c`).
SCALAR_OPS = ("multiply", "divide", "add", "subtract")


def _scalar(value: object) -> int | None:
    """The position of the tensor operand of `value` when it is a scalar op."""
    if not (isinstance(value, g.Call) and value.op in SCALAR_OPS and len(value.args) == 2):
        return None
    for pos in (0, 1):
        c = value.args[1 - pos]
        if isinstance(c, g.Constant) and c.data.size == 1 and c.data.ndim == 0:
            return pos
    return None


def _tensor(x: g.Expr) -> TensorType | None:
    return x.type if isinstance(x.type, TensorType) else None


def _expansion(var: g.Expr, defs: dict[g.Var, Any], uses: Any) -> tuple[g.Var, int] | None:
    """(`kv5`, the repeat `r`) when `var` is `reshape(broadcast_to(kv5, [b, g, r, t, d]),
    [b, g * r, t, d])` read once, `kv5` of shape `[b, g, 1, t, d]`."""
    if not (isinstance(var, g.Var) and uses[var] == 1):
        return None
    merged = defs.get(var)
    if not (isinstance(merged, g.Call) and merged.op == "reshape"):
        return None
    wide = merged.args[0]
    if not (isinstance(wide, g.Var) and uses[wide] == 1):
        return None
    bcast = defs.get(wide)
    if not (isinstance(bcast, g.Call) and bcast.op == "broadcast_to"):
        return None
    kv5 = bcast.args[0]
    t5, w5, t4 = _tensor(kv5), _tensor(wide), _tensor(var)
    if not isinstance(kv5, g.Var) or t5 is None or w5 is None or t4 is None:
        return None
    if t5.ndim != 5 or w5.ndim != 5 or t4.ndim != 4 or t5.shape[2] != 1:
        return None
    groups, rep = w5.shape[1], w5.shape[2]
    if not (isinstance(groups, int) and isinstance(rep, int) and t4.shape[1] == groups * rep):
        return None
    same = [(t5.shape[i], w5.shape[i]) for i in (0, 1, 3, 4)]
    same += [(w5.shape[0], t4.shape[0]), (w5.shape[3], t4.shape[2]), (w5.shape[4], t4.shape[3])]
    return (kv5, rep) if all(dims_equal(x, y) is True for x, y in same) else None


def _swapped_view(var: g.Var, defs: dict[g.Var, Any], uses: Any
                  ) -> tuple[g.Expr, list[g.Var]] | None:
    """(x, the view's vars) when `var` is `reshape(transpose(reshape(x, [b * h, t, d]),
    (0, 2, 1)), [b, h, d, t])` with `x` of shape [b, h, t, d], its steps read once: x
    with its last two axes swapped (dynamo's `K^T` of an expanded cache)."""
    steps: list[g.Var] = []
    x: g.Expr = var
    for op in ("reshape", "transpose", "reshape"):
        value = defs.get(x) if isinstance(x, g.Var) and uses[x] == 1 else None
        if not (isinstance(value, g.Call) and value.op == op):
            return None
        if op == "transpose" and value.attrs.get("perm") != (0, 2, 1):
            return None
        assert isinstance(x, g.Var)
        steps.append(x)
        x = value.args[0]
    tx, flat, out = _tensor(x), _tensor(steps[2]), _tensor(var)
    if tx is None or flat is None or out is None or tx.ndim != 4 or flat.ndim != 3 \
            or out.ndim != 4:
        return None
    # a reshape keeps the element count: with t, d and b, h in place, flat is [b * h, ...]
    same = [(flat.shape[1], tx.shape[2]), (flat.shape[2], tx.shape[3]),
            (out.shape[0], tx.shape[0]), (out.shape[1], tx.shape[1]),
            (out.shape[2], tx.shape[3]), (out.shape[3], tx.shape[2])]
    return (x, steps) if all(dims_equal(p, q) is True for p, q in same) else None


def _operand(v: g.Call, defs: dict[g.Var, Any], uses: Any
             ) -> tuple[g.Expr, list[tuple[g.Call, int]], list[g.Var], bool]:
    """Product `v`'s B below the scalar ops and swapped views read only by it: (that
    operand, the scalar ops from the product down, the vars passed, whether B is the
    operand with its last two axes swapped)."""
    scalars: list[tuple[g.Call, int]] = []
    operand, dead, swapped = v.args[1], [], False
    while isinstance(operand, g.Var) and uses[operand] == 1:
        if (pos := _scalar(defs.get(operand))) is not None:
            dead.append(operand)
            scalars.append((defs[operand], pos))
            operand = defs[operand].args[pos]
        elif (view := _swapped_view(operand, defs, uses)) is not None:
            operand, steps = view
            dead += steps
            swapped = not swapped
        else:
            break
    return operand, scalars, dead, swapped


def _rewrite(b: g.Binding, defs: dict[g.Var, Any], uses: Any
             ) -> tuple[list[g.Binding], list[g.Var]] | None:
    """The bindings that replace product `b` and the ones it leaves unread (the
    expansion, the scalar ops and swapped views on it), or None where it reads no
    expansion."""
    v = b.value
    if not (isinstance(v, g.Call) and v.op == "matmul" and len(v.args) == 2):
        return None
    operand, scalars, dead, swapped = _operand(v, defs, uses)
    found = _expansion(operand, defs, uses)
    at = _tensor(v.args[0])
    if found is None or at is None or at.ndim != 4 or not isinstance(operand, g.Var):
        return None
    kv5, rep = found
    groups = (at.shape[1] // rep) if isinstance(at.shape[1], int) else 0
    if groups * rep != at.shape[1] or groups < 1:
        return None
    stmts: list[g.Binding] = []

    def bind(hint: str, value: g.Call) -> g.Var:
        var = g.Var(f"{b.var.name}_{hint}", value.ret_type)
        stmts.append(g.Binding(var, value))
        return var

    try:
        ash = at.shape
        a5 = bind("q", call("reshape", v.args[0], shape=reshape_attr(
            ash, (ash[0], groups, rep, ash[2], ash[3]))))
        bnew: g.Expr = kv5
        for scalar, pos in reversed(scalars):
            args = [bnew, scalar.args[1]] if pos == 0 else [scalar.args[0], bnew]
            bnew = bind("kv", call(scalar.op, *args, **dict(scalar.attrs)))
        attrs = dict(v.attrs)
        if swapped:  # B is the expansion transposed: read it with transpose_b flipped
            attrs["transpose_b"] = not bool(attrs.get("transpose_b"))
            if not attrs["transpose_b"]:
                del attrs["transpose_b"]
        m5 = bind("grouped", call("matmul", a5, bnew, **attrs))
        mt = _tensor(m5)
        assert mt is not None
        msh = mt.shape
        out = call("reshape", m5, shape=reshape_attr(msh, (msh[0], groups * rep, msh[3],
                                                          msh[4])))
    except IRError:
        return None  # a symbolic size with no spelling over the new operands: left as is
    if out.ret_type != v.ret_type:
        return None
    expanded = defs[operand].args[0]  # the broadcast_to's var, read by the reshape only
    return [*stmts, g.Binding(b.var, out)], [*dead, operand, expanded]


def read_grouped_heads(items: list[g.Binding], uses: Any) -> list[g.Binding] | None:
    """`items` with each product of an expanded GQA cache reading the cache in place
    (module docstring), or None where there is none."""
    defs = {b.var: b.value for b in items}
    replaced: dict[g.Var, list[g.Binding]] = {}
    unread: set[g.Var] = set()
    for b in items:
        new = _rewrite(b, defs, uses)
        if new is not None:
            replaced[b.var] = new[0]
            unread.update(new[1])
    if not replaced:
        return None
    out: list[g.Binding] = []
    for b in items:
        if b.var not in unread:
            out.extend(replaced.get(b.var, [b]))
    return out

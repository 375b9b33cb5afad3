"""A unary elementwise op over a concatenation, moved onto its inputs.

`relu(concat(a, b))` is `concat(relu(a), relu(b))`. ShuffleNet's stride-2 units
concatenate an average pool and a convolution and apply ReLU to the result: computed
after the concatenation, the ReLU is a kernel of its own that reads and writes the
whole tensor again. Moved onto the inputs, each ReLU follows its producer, FuseOps
applies it as the producer stores (kiln.transform.fuse_ops), and the concatenation's
inputs are still views of its output (kiln.transform.concat_views): no copy at all.

Taken when the op (one argument, pattern `elemwise`) is the concatenation's only
reader, and each input is computed by a call of the function, read only by the
concatenation and not a result: then every moved op has a producer to join and no
value is computed twice.
"""

from __future__ import annotations

from collections import Counter

from kiln.ir import graph as g
from kiln.ir.analysis.graph_uses import var_use_counts
from kiln.ops import call
from kiln.ops.registry import get_op
from kiln.transform.splice import splice

CONCAT = "concat"


def unary_elementwise(value: g.Expr) -> bool:
    """Whether `value` is a call of an elementwise op of one argument (a ReLU)."""
    if not isinstance(value, g.Call) or len(value.args) != 1:
        return False
    try:
        return get_op(value.op).pattern == "elemwise"
    except KeyError:
        return False


def move_onto_concat_inputs(fn: g.Function) -> g.Function:
    """`fn` with every unary elementwise op over a concatenation that qualifies (module
    docstring) applied to the concatenation's inputs instead, each right after the
    input's binding (where FuseOps joins it to the producer)."""
    uses: Counter[g.Var] = var_use_counts(fn)
    results = fn.result.fields if isinstance(fn.result, g.Tuple) else (fn.result,)
    returned = {id(r) for r in results}
    bound = {id(b.var): b.value for b in fn.bindings}

    def single_call_value(x: g.Expr) -> bool:
        return (isinstance(x, g.Var) and isinstance(bound.get(id(x)), g.Call)
                and uses[x] == 1 and id(x) not in returned)

    after: dict[int, g.Binding] = {}     # id(input var) -> its moved op's binding
    replaced: dict[int, g.Binding] = {}  # id(op var) -> the concat bound to it
    dropped: set[int] = set()            # id(concat var)
    for b in fn.bindings:
        op = b.value
        if not unary_elementwise(op):
            continue
        assert isinstance(op, g.Call)
        cat = op.args[0]
        concat = bound.get(id(cat))
        if not (isinstance(concat, g.Call) and concat.op == CONCAT
                and single_call_value(cat)
                and all(single_call_value(x) for x in concat.args)):
            continue
        moved = []
        for x in concat.args:
            assert isinstance(x, g.Var)
            value = call(op.op, x, **dict(op.attrs))
            var = g.Var(f"{x.name}_{op.op}", value.type)
            after[id(x)] = g.Binding(var, value)
            moved.append(var)
        replaced[id(b.var)] = g.Binding(b.var, call(CONCAT, *moved, **dict(concat.attrs)))
        dropped.add(id(cat))
    if not replaced:
        return fn
    bindings = splice(fn.bindings, dropped, {k: (v,) for k, v in replaced.items()}, after)
    return g.Function(fn.params, tuple(bindings), fn.result, dict(fn.attrs))

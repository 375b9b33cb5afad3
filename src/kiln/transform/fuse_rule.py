"""FuseOps' rule of which bindings join a group (kiln.transform.fuse_ops), in one place
for the passes that must predict its groups (kiln.transform.bf16_words).

A group starts at an op call and grows while the next binding is an elementwise or
broadcast call reading the group's values at its own shape (`extends`); it is then cut
back until no value but its outputs is read outside it (`closed`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import cast

from kiln.ir import graph as g
from kiln.ir.shape_expr import shapes_equal
from kiln.ir.types import TensorType
from kiln.kernels.lowering import lowering_for
from kiln.ops import get_op

FUSABLE_TAIL = ("elemwise", "broadcast")
# The most ops fused into one kernel (the FuseOps option `max_group`).
MAX_FUSED_OPS = 8
# Group heads a dtype-changing elementwise op may join (see `extends`).
_CASTS_JOIN = ("elemwise", "broadcast", "injective")


def pattern(op: str) -> str | None:
    """The op's pattern, None for an op not registered."""
    try:
        return get_op(op).pattern
    except KeyError:
        return None


def extends(group: Sequence[g.Binding], value: g.Expr) -> bool:
    """Whether `value` is an elementwise/broadcast call reading one of the group's values,
    each at the call's own shape (no broadcast re-reads). A value may be read several
    times in the group (GELU's `x * (erf(x / sqrt 2) + 1) / 2`)."""
    if not (isinstance(value, g.Call) and pattern(value.op) in FUSABLE_TAIL
            and isinstance(value.ret_type, TensorType)):
        return False
    members = {id(b.var): b.var for b in group}
    read = [a for a in value.args if id(a) in members]
    if not read or any(not isinstance(a.type, TensorType)
                       or not shapes_equal(a.type.shape, value.ret_type.shape) for a in read):
        return False
    first = group[0]
    assert isinstance(first.value, g.Call)
    if any(cast(TensorType, a.type).dtype != value.ret_type.dtype for a in read) \
            and pattern(first.value.op) not in _CASTS_JOIN:
        # a dtype change (quantize_linear, dequantize_linear, cast) joins elementwise and
        # layout chains (DenseNet's concat -> quantize -> dequantize -> BatchNorm ->
        # quantize: one kernel, not three); an anchor's hand-built epilogue keeps its
        # own dtype
        return False
    # The first value is read once unless a hand-written kernel applies the tail to its
    # accumulator: a tensor-expression anchor (a reduction) would be recomputed per read.
    calls = [b.value for b in group[1:] if isinstance(b.value, g.Call)] + [value]
    reads = sum(a is first.var for c in calls for a in c.args)
    return reads <= 1 or has_hand_kernel(first.value)


def has_hand_kernel(call: g.Call) -> bool:
    """Whether `call`'s kernel is built by hand (it applies the tail to a value in
    registers, however often the tail reads it)."""
    lowering = lowering_for(call.op)
    return lowering is not None and lowering.builds(call)


def closed(group: Sequence[g.Binding], uses: Counter[g.Var]) -> bool:
    """Whether every group value but the last is read only inside the group (the kernel
    writes only the last)."""
    inside: Counter[int] = Counter()
    for b in group:
        assert isinstance(b.value, g.Call)
        for a in b.value.args:
            inside[id(a)] += 1
    return all(inside[id(b.var)] == uses[b.var] for b in group[:-1])


def chain(bindings: Sequence[g.Binding], k: int, uses: Counter[g.Var], head: str,
          most: int) -> int | None:
    """The index of the `head` op call whose group (of at most `most` bindings) binding
    `k` closes, with `k` its last output; None where FuseOps groups `k` otherwise."""
    for j in range(k, max(k - most, -1), -1):
        value = bindings[j].value
        if not isinstance(value, g.Call):
            return None
        if pattern(value.op) not in FUSABLE_TAIL:
            group = bindings[j:k + 1]
            ok = (value.op == head and closed(group, uses)
                  and all(extends(group[:i], group[i].value) for i in range(1, len(group))))
            return j if ok else None
    return None

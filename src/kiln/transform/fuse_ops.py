"""FuseOps: fuse elementwise chains into their producer (conv+bias+relu, matmul+add+gelu).

A group starts at any operator call with a tensor result and grows while the
next binding is an elementwise or broadcast op that reads the group's values
at its own shape; it is then cut back until no value but the last is read
outside the group. A value may be read by several ops of the group (GELU's
`x * (erf(x / sqrt 2) + 1) / 2`): inlined, it is recomputed per reader, which
for elementwise values costs less than writing and reading it back. The group becomes one
PrimFunc: the ops' tensor-expression definitions are chained (`kiln.ops.te`
inlines each intermediate into its consumer) and lowered once, and the group's
bindings are replaced by one `CallTensor`. Single-op groups are left to
LegalizeOps.

A row op (an OpDef with `fuses_producers`: softmax, log_softmax, layer_norm,
the reductions, kiln.kernels.rows) also joins a group of elementwise ops whose value is
its first argument and read nowhere else: its kernel computes that chain as it
reads each row (the attention's scale and mask before softmax, the residual
add before layer_norm), and the group goes on growing past it as usual.

A concat whose inputs lowering makes views of its output (kiln.transform.concat_views)
heads no group: its copy disappears anyway, and the tail after it (DenseNet's BatchNorm
and ReLU) reads the output in one loop, where a fused kernel has one loop per input
(`partition-loops`), each compiled apart, over the same bytes.

A unary elementwise op whose only operand is a concat (ShuffleNet's ReLU after the
concatenation of a stride-2 unit) is first moved onto the concat's inputs, each right
after its producer, where it joins the producer's group (kiln.transform.concat_tails).
A channel shuffle of a grouped 1x1 convolution on the bfloat16 nest becomes that
convolution's stores (kiln.transform.channel_shuffles). A bfloat16 convolution's output
read only by bfloat16 convolutions is stored as their words (its `bf16_words` joins
the group: kiln.transform.bf16_words).

A group holds at most `max_group` ops (default `MAX_FUSED_OPS`): the fused
kernel's expression nests one level per op, so the cap keeps every expression
shallow however long the chain is (a 5,000-op elementwise chain becomes many
kernels, not one 5,000-deep expression that no recursive walk could handle).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from kiln.ir import graph as g
from kiln.ir.analysis.graph_uses import var_use_counts
from kiln.ir.attrs import ATTR_ARG_DIMS, ATTR_PRIVATE
from kiln.ir.module import BaseFunc, IRModule
from kiln.ir.shape_expr import is_static
from kiln.ir.tensor import PrimFunc
from kiln.ir.types import TensorType
from kiln.kernels import specialisation
from kiln.kernels.conv.run_time_width import TilesKey
from kiln.kernels.lowering import lowering_for
from kiln.ops import get_op, te
from kiln.target.isa import ISA
from kiln.transform.bf16_words import store_words, words_tail
from kiln.transform.channel_shuffles import fold_shuffles, shuffled_stores
from kiln.transform.concat_tails import move_onto_concat_inputs
from kiln.transform.fuse_rule import FUSABLE_TAIL, MAX_FUSED_OPS, closed, extends, pattern
from kiln.transform.kernel_isa import kernel_isa
from kiln.transform.pass_base import Pass
from kiln.transform.run_time_channels import RunTimeChannels, run_time_channels

#: Binary ops whose operands a group's key takes in either order: IEEE addition and
#: multiplication (and integer ones) give the same result either way.
COMMUTATIVE = frozenset({"add", "multiply"})


@dataclass(frozen=True)
class FuseOps(Pass):
    """Fuse elementwise/broadcast consumers into their producing operator."""

    name = "fuse-ops"
    max_group: int = MAX_FUSED_OPS

    def run(self, mod: IRModule) -> IRModule:
        functions: dict[str, BaseFunc] = dict(mod.functions)
        cache: dict[Any, str] = {}
        changed = False
        isa = kernel_isa()  # the pipeline's target, read once for every hand-built kernel
        for fname, fn in mod.graph_funcs().items():
            new = _fuse_function(fn, functions, cache, self.max_group, isa)
            if new is not fn:
                functions[fname] = new
                changed = True
        return IRModule(functions, mod.attrs) if changed else mod


def _fuse_function(fn: g.Function, functions: dict[str, BaseFunc], cache: dict[Any, str],
                   max_group: int, isa: ISA) -> g.Function:
    fn = fold_shuffles(move_onto_concat_inputs(fn), shuffled_stores(isa))
    fn = store_words(fn, isa)
    groups = _groups(fn.bindings, var_use_counts(fn), max_group, _concat_pieces(fn))
    if not any(len(grp) > 1 for grp in groups):
        return fn
    shared = _shared_channels(groups)
    bindings: list[g.Binding] = []
    for grp in groups:
        if len(grp) <= 1:
            bindings.extend(grp)
            continue
        bindings.append(_fuse_group(grp, functions, cache, isa, shared))
    return g.Function(fn.params, tuple(bindings), fn.result, dict(fn.attrs))


def _groups(bindings: tuple[g.Binding, ...], uses: Counter[g.Var],
            max_group: int, pieces: frozenset[int]) -> list[list[g.Binding]]:
    """Consecutive bindings cut into groups: an op call with a tensor result, then the
    elementwise/broadcast calls after it that read the group's values (`extends`), cut
    back to the longest start whose inner values nothing outside reads (`closed`)."""
    groups: list[list[g.Binding]] = []
    i = 0
    while i < len(bindings):
        value = bindings[i].value
        if not (isinstance(value, g.Call) and isinstance(value.ret_type, TensorType)
                and pattern(value.op) is not None) or _viewed_concat(value, pieces):
            groups.append([bindings[i]])
            i += 1
            continue
        grp = [bindings[i]]
        while i + len(grp) < len(bindings) and len(grp) < max_group:
            nxt = bindings[i + len(grp)].value
            if not (extends(grp, nxt) or words_tail(grp, nxt) or (
                    isinstance(nxt, g.Call) and _fuses_producers(nxt.op)
                    and _feeds_row_op(grp, nxt, uses))):
                break
            # an elementwise tail, or the chain a row op (softmax, layer_norm) computes
            # as it reads its rows
            grp.append(bindings[i + len(grp)])
        while not closed(grp, uses):
            grp.pop()
        groups.append(grp)
        i += len(grp)
    return groups


def _concat_pieces(fn: g.Function) -> frozenset[int]:
    """id() of the values a concat of `fn` may take as views of its output
    (kiln.transform.concat_views): computed by a call of `fn`, not one of its results."""
    results = fn.result.fields if isinstance(fn.result, g.Tuple) else (fn.result,)
    returned = {id(r) for r in results}
    return frozenset(id(b.var) for b in fn.bindings
                     if isinstance(b.value, g.Call) and id(b.var) not in returned)


def _viewed_concat(call: g.Call, pieces: frozenset[int]) -> bool:
    """Whether `call` is a concat whose inputs lowering lays out as views of its output
    (kiln.transform.concat_views): a concat at batch 1 along an axis with only size-1
    dimensions before it, of distinct `pieces`. It heads no group: its copy
    disappears, and an elementwise tail (DenseNet's BatchNorm and ReLU) reads its output
    as one run, one loop instead of one per input over the same bytes."""
    if call.op != "concat" or not isinstance(call.ret_type, TensorType):
        return False
    shape = call.ret_type.shape
    if not is_static(shape):
        return False
    axis = call.attrs.get("axis", 0)
    if not isinstance(axis, int):
        return False
    axis = axis % len(shape) if shape else 0
    args = [id(a) for a in call.args]
    return (len(set(args)) == len(args) and all(a in pieces for a in args)
            and all(d == 1 for d in shape[:axis]))


def _fuses_producers(op: str) -> bool:
    lowering = lowering_for(op)
    return lowering is not None and lowering.fuses_producers


def _feeds_row_op(group: list[g.Binding], call: g.Call, uses: Counter[g.Var]) -> bool:
    """Whether `group` is an elementwise chain whose value is `call`'s first argument
    only (a row op such as softmax or layer_norm then computes it as it reads a row)."""
    last = group[-1]
    if not all(isinstance(b.value, g.Call) and pattern(b.value.op) in FUSABLE_TAIL
               for b in group):
        return False
    if not call.args or call.args[0] is not last.var or uses[last.var] != 1:
        return False
    if not isinstance(call.ret_type, TensorType):
        return False
    # A chain that expands its inputs (broadcast_to a huge shape) stays materialized: the
    # memory plan then checks its size, and the row op never loops over more elements
    # than some input of the chain holds.
    for b in group:
        assert isinstance(b.value, g.Call)
        size = _numel(b.var.type)
        inputs = [_numel(a.type) for a in b.value.args]
        if size is None or not inputs or None in inputs or size > max(n or 0 for n in inputs):
            return False
    return True


def _numel(t: object) -> int | None:
    """Elements of a static tensor type; None for anything else."""
    if not isinstance(t, TensorType):
        return None
    n = 1
    for d in t.shape:
        if not isinstance(d, int):
            return None
        n *= d
    return n


def _shared_channels(groups: list[list[g.Binding]]) -> frozenset[Any]:
    """The keys over a run-time channel count (kiln.transform.run_time_channels) that
    groups of different static operands share: only their kernels take the count at run
    time (a group of its own keeps its static kernel)."""
    seen: dict[Any, set[tuple[Any, ...]]] = {}
    for grp in groups:
        if len(grp) <= 1:
            continue
        _, externals, _, key_parts = _group_refs(grp)
        wide = run_time_channels(grp, externals)
        if wide is not None:
            seen.setdefault((tuple(key_parts), wide.key), set()).add(
                tuple(e.type for e in externals))
    return frozenset(k for k, static in seen.items() if len(static) > 1)


def _group_refs(group: list[g.Binding]) -> tuple[dict[int, int], list[g.Expr],
                                                  dict[int, int], list[Any]]:
    """The group's positions of its own values, its external operands (and their
    positions), and its ops as a key: each op, its attributes and its arguments'
    references (a group value's position or an operand's)."""
    inside = {id(b.var): k for k, b in enumerate(group)}
    externals: list[g.Expr] = []
    ext_index: dict[int, int] = {}
    key_parts: list[Any] = []
    for b in group:
        assert isinstance(b.value, g.Call)
        refs = []
        for a in b.value.args:
            if id(a) in inside:
                refs.append(("int", inside[id(a)]))
            else:
                if id(a) not in ext_index:
                    ext_index[id(a)] = len(externals)
                    externals.append(a)
                refs.append(("ext", ext_index[id(a)]))
        if b.value.op in COMMUTATIVE:
            # add(conv, residual) and add(residual, conv) compute the same bits: one kernel
            # (ResNet-50's first stage adds one way in its first bottleneck, the other
            # way in the next two)
            refs.sort()
        key_parts.append((b.value.op, tuple(b.value.attrs.items()), tuple(refs)))
    return inside, externals, ext_index, key_parts


def _fuse_group(group: list[g.Binding], functions: dict[str, BaseFunc],
                cache: dict[Any, str], isa: ISA, shared: frozenset[Any] = frozenset()
                ) -> g.Binding:

    inside, externals, ext_index, key_parts = _group_refs(group)
    operands, width = _operand_key(group, externals, ext_index, isa)
    wide = run_time_channels(group, externals) if shared and width is None else None
    if wide is not None and (tuple(key_parts), wide.key) in shared:
        operands = wide.key
    else:
        wide = None
    if width is not None:  # attributes that only say the width: its key stands for them
        anchor = _anchor(group)
        op, attrs, refs = key_parts[anchor]
        unkeyed = getattr(lowering_for(op), "width_attrs", ())
        key_parts[anchor] = (op, tuple(kv for kv in attrs if kv[0] not in unkeyed), refs)
    key: Any = (tuple(key_parts), operands, width)
    try:
        hash(key)
    except TypeError:  # an unhashable attribute: do not share
        key = ("unshared", id(group[0]))
    name = cache.get(key)
    if name is None:
        name = _unique(functions, "fused_" + "_".join(
            b.value.op for b in group if isinstance(b.value, g.Call)))
        functions[name] = _lower_group(group, externals, inside, name, isa, wide)
        cache[key] = name
    last = group[-1]
    return g.Binding(last.var, g.CallTensor(name, tuple(externals), last.var.type))


def _operand_key(group: list[g.Binding], externals: list[g.Expr], ext_index: dict[int, int],
                 isa: ISA) -> tuple[tuple[Any, ...], Any]:
    """The operands' types, as the group's kernel is built for them, and None: or, for a
    kernel that takes its input channel count at run time (its lowering's `width_key`,
    kiln.kernels.conv.run_time_width), the types with its input's and weight's left
    out, and that key, so that layers of every width share it (a lowering with
    `width_operands` 1, the NCHW{b}c pool, keys its one operand so, and only for a group
    of itself alone; one with `width_reads_anchor_only`, the NCHW{b}c depthwise kernel,
    only for a group that reads nothing but its anchor's operands). Not where the group
    reads either of them elsewhere (those reads would be of the static width). Where the key
    is a `TilesKey` (the output channel tiles and image size at run time too), the
    bias (the anchor's third argument) and the operands shaped like the output are
    keyed by their dtype alone as well (`TilesKey.takes`)."""
    types: list[Any] = [e.type for e in externals]
    anchor = group[_anchor(group)].value
    assert isinstance(anchor, g.Call)
    lowering = lowering_for(anchor.op)
    width_key = getattr(lowering, "width_key", None)
    count = getattr(lowering, "width_operands", 2)
    operands = anchor.args[:count]
    if width_key is None or len(operands) < count or any(id(a) not in ext_index
                                                         for a in operands):
        return tuple(types), None
    if count == 1 and len(group) > 1:  # a one-operand kernel (a pool) is shared alone
        return tuple(types), None
    if getattr(lowering, "width_reads_anchor_only", False) and \
            any(all(e is not a for a in anchor.args) for e in externals):
        return tuple(types), None  # a fused op reads an operand of its own
    reads = Counter(id(a) for b in group if isinstance(b.value, g.Call) for a in b.value.args)
    if any(reads[id(a)] != 1 for a in operands):
        return tuple(types), None
    key = width_key(anchor, isa)
    if key is None:
        return tuple(types), None
    for k, a in enumerate(operands):
        types[ext_index[id(a)]] = ("run-time width", k)
    if isinstance(key, TilesKey):  # the output channel tiles and image size at run time
        bias = anchor.args[2] if len(anchor.args) > 2 else None
        for e in externals:
            i = ext_index[id(e)]
            t = types[i]
            if isinstance(t, TensorType) and key.takes(t.shape, e is bias):
                types[i] = ("run-time size", t.dtype)
    return tuple(types), key


def lone_call_key(call: g.Call, isa: ISA) -> Any:
    """The key under which the kernel of `call`, alone, is shared with other such calls
    (kiln.transform.legalize_ops), where its lowering builds it over run-time sizes
    (`_operand_key` of a group of one: ResNet-50's four 1x1 layers with a bias alone
    share one kernel); None: keyed by its types."""
    externals: list[g.Expr] = []
    ext_index: dict[int, int] = {}
    for a in call.args:
        if id(a) not in ext_index:
            ext_index[id(a)] = len(externals)
            externals.append(a)
    group = [g.Binding(g.Var("lone", call.ret_type), call)]
    types, width = _operand_key(group, externals, ext_index, isa)
    if width is None:
        return None
    unkeyed = getattr(lowering_for(call.op), "width_attrs", ())
    attrs = tuple(kv for kv in call.attrs.items() if kv[0] not in unkeyed)
    return "run-time sizes", call.op, attrs, tuple(ext_index[id(a)] for a in call.args), \
        types, width


def _anchor(group: list[g.Binding]) -> int:
    """The group's op whose kernel takes the rest as its epilogue (`_lower_group`)."""
    return next((k for k, b in enumerate(group) if isinstance(b.value, g.Call)
                 and pattern(b.value.op) not in FUSABLE_TAIL), 0)


def _lower_group(group: list[g.Binding], externals: list[g.Expr], inside: dict[int, int],
                 name: str, isa: ISA, wide: RunTimeChannels | None = None) -> PrimFunc:
    placeholders = []
    for k, e in enumerate(externals):
        t = e.type if wide is None else wide.types[k]
        assert isinstance(t, TensorType)
        placeholders.append(te.placeholder(t.shape, t.dtype, f"x{k}"))
    ext_pos = {id(e): k for k, e in enumerate(externals)}
    values: list[Any] = []
    arguments: list[list[Any]] = []
    for b in group:
        assert isinstance(b.value, g.Call)
        args = [values[inside[id(a)]] if id(a) in inside else placeholders[ext_pos[id(a)]]
                for a in b.value.args]
        out = get_op(b.value.op).compute(args, b.value.attrs)
        values.append(out)
        arguments.append(args)
    # An op with a hand-written kernel may build it with the group as its epilogue (and,
    # for a row op, the elementwise chain before it as its prologue, in its arguments).
    k = _anchor(group)
    first = group[k].value
    assert isinstance(first, g.Call)
    lowering = lowering_for(first.op)
    # Hand-built kernels assume static shapes unless they say otherwise; the others take
    # the te definitions.
    static = all(is_static(e.type.shape) for e in externals if isinstance(e.type, TensorType))
    arg_dims = {} if wide is None else {ATTR_ARG_DIMS: wide.dims}  # read at each call
    if lowering is not None and (static or lowering.supports_symbolic or wide is not None):
        fused = lowering.lower_fused(placeholders, arguments[k], first.attrs, values[k],
                                     values[-1], name, isa)
        if fused is not None:  # hand-built kernels may leave the dim scalars to us
            return te.with_dim_params(fused).with_attrs(**{ATTR_PRIVATE: True}, **arg_dims)
    if lowering is not None and not static and specialisation.active():
        with specialisation.naming(group[k].var):
            specialisation.note_lowering(first, lowering)
    prim: PrimFunc = te.lower(placeholders, [values[-1]], name)
    return prim.with_attrs(**{ATTR_PRIVATE: True}, **arg_dims)


def _unique(functions: dict[str, BaseFunc], base: str) -> str:
    name, n = base[:60], 0
    while name in functions:
        n += 1
        name = f"{base[:60]}_{n}"
    return name

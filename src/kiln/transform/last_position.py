"""LastPosition: a decoder's companion that computes its logits for the last position only.

A generation loop's prompt call (kiln.generate, `{prefix}_generate_{fn}`) reads only
each row's last logits, yet a decoder computes them for every position: its row-wise
tail (the final norm, the LM head's product, a softcap, casts; on a Llama of 0.5B, the
LM head alone is ~6% of the prompt's multiply-adds) runs over the whole prompt. For
each graph function whose signature has a decoder's roles
(kiln.runtime.generation.DecoderRoles), this pass adds a companion function: the same
bindings, but the logits' row-wise producers computed on the last position, the slice
(a `gather` of index -1 along the sequence axis) taken where the tail meets a value
something else reads too. The decoder keeps its contract (logits [batch, seq, vocab]);
the companion returns logits [batch, 1, vocab] and the same presents. Each output row
of a row-wise op reads its input's row alone, so the last position's logits are the
decoder's last row, to rounding: a product's kernel adds a row's terms in an order that
depends on how many rows the call has (a symbolic M's last rows on a short tile,
kiln.kernels.gemm.micro_kernel.row_tile; a 4-bit product's one-row GEMV against its
GEMM), as two calls of the decoder over different lengths already differ.

The companion shares every binding before the tail (the same expressions), so fusion
and legalization hand both functions the same kernels (their caches key on operators
and types), and the same constants, which the library stores once (kiln.codegen.
constants keys them by identity). It runs after the passes that rewrite weights
(fold-constants, block-matmuls) so that no weight is rewritten twice. The decoder
names its companion (`kiln.last_position`), the companion its decoder
(`kiln.last_position_of`); the library metadata carries the first (docs/abi.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from kiln.errors import UsageError
from kiln.ir import graph as g
from kiln.ir.analysis.graph_uses import graph_vars_used
from kiln.ir.attrs import ATTR_GIVEN_OUTPUT_NAMES, ATTR_LAST_POSITION, ATTR_LAST_POSITION_OF
from kiln.ir.module import IRModule
from kiln.ir.names import unique_name
from kiln.ir.shape_expr import dim_text
from kiln.ir.types import Dim, TensorType
from kiln.ops.reduce import norm_axes
from kiln.ops.registry import get_op
from kiln.runtime.generation import DecoderRoles
from kiln.transform.pass_base import Pass

#: Matrix products whose first operand holds the rows and whose others are weights.
ROW_PRODUCTS = frozenset({"matmul", "matmul_packed", "matmul_nbits", "matmul_nbits_packed",
                          "matmul_packed_bf16", "matmul_packed_f16", "matmul_tiled",
                          "matmul_tiled_bf16", "dynamic_quant_matmul",
                          "dynamic_quant_matmul_packed"})
#: The suffix of a companion's name (made unique in the module).
SUFFIX = "_last_position"


@dataclass(frozen=True)
class LastPosition(Pass):
    """Give each decoder graph function a companion computing only its last position's
    logits (module docstring)."""

    name = "last-position"

    def run(self, mod: IRModule) -> IRModule:
        functions = dict(mod.functions)
        for name, fn in mod.graph_funcs().items():
            if ATTR_LAST_POSITION in fn.attrs or ATTR_LAST_POSITION_OF in fn.attrs:
                continue
            companion = last_position_companion(fn, name)
            if companion is None:
                continue
            other = unique_name(name + SUFFIX, functions)
            functions[name] = fn.with_attrs(**{ATTR_LAST_POSITION: other})
            functions[other] = companion.with_attrs(**{ATTR_LAST_POSITION_OF: name})
        return mod if len(functions) == len(mod.functions) else IRModule(functions, mod.attrs)


def last_position_companion(fn: g.Function, name: str) -> g.Function | None:
    """`fn` with its logits computed for each row's last position, or None when `fn` is
    no decoder or its logits' producer is not row-wise (nothing to save)."""
    found = _logits(fn, name)
    if found is None:
        return None
    index, logits, rows = found
    producers = {b.var: b for b in fn.bindings}
    if logits not in producers or not _row_wise(producers[logits].value, rows) or any(
            logits in set(graph_vars_used(b.value)) for b in fn.bindings) or sum(
            f is logits for f in fn.result.fields) != 1:  # type: ignore[attr-defined]
        return None  # read elsewhere too: the full logits are needed
    tail = _tail(fn, logits, rows)
    bindings: list[g.Binding] = []
    sliced: dict[g.Var, g.Var] = {}
    for b in fn.bindings:
        if b.var not in tail:
            bindings.append(b)
            continue
        assert isinstance(b.value, g.Call)
        args: list[g.Expr] = []
        for a in b.value.args:
            if isinstance(a, g.Var) and a in tail:
                args.append(sliced[a])
            elif _is_rows(a, rows):
                if a not in sliced:
                    assert isinstance(a, g.Var)
                    sliced[a] = _last(a, bindings)
                args.append(sliced[a])
            else:
                args.append(a)
        ty = _last_type(b.var.type)
        sliced[b.var] = g.Var(b.var.name, ty)
        bindings.append(g.Binding(sliced[b.var], g.Call(b.value.op, tuple(args),
                                                        b.value.attrs, ty)))
    assert isinstance(fn.result, g.Tuple)
    fields = list(fn.result.fields)
    fields[index] = sliced[logits]
    return g.Function(fn.params, tuple(bindings), g.Tuple(tuple(fields)), dict(fn.attrs))


def _logits(fn: g.Function, name: str) -> tuple[int, g.Var, tuple[Dim, Dim]] | None:
    """(result index, variable, (batch, seq) dims) of `fn`'s logits when `fn` is a decoder
    (kiln.runtime.generation.DecoderRoles) returning them as a bound variable."""
    if not isinstance(fn.result, g.Tuple) or not all(
            isinstance(p.type, TensorType) for p in fn.params):
        return None
    fields = fn.result.fields
    names = list(fn.attrs.get(ATTR_GIVEN_OUTPUT_NAMES, ()) or ())
    if len(names) != len(fields) or not all(isinstance(f.type, TensorType) for f in fields):
        return None
    try:
        roles = DecoderRoles.of(SimpleNamespace(
            name=name, params=[_signature(p.name, p.type) for p in fn.params],
            results=[_signature(n, f.type) for n, f in zip(names, fields, strict=True)]))
    except UsageError:
        return None
    ids = next(p for p in fn.params if p.name == roles.ids["name"])
    logits = fields[roles.logits]
    assert isinstance(ids.type, TensorType)
    rows = (ids.type.shape[0], ids.type.shape[1])
    if not isinstance(logits, g.Var) or not _is_rows(logits, rows) or isinstance(rows[1], int):
        return None
    return roles.logits, logits, rows


def _signature(name: str, ty: Any) -> dict[str, Any]:
    """A parameter's or result's entry as the library metadata writes it."""
    return {"name": name, "kind": "tensor", "dtype": ty.dtype,
            "shape": [d if isinstance(d, int) else dim_text(d) for d in ty.shape]}


def _tail(fn: g.Function, logits: g.Var, rows: tuple[Dim, Dim]) -> set[g.Var]:
    """The logits and the values only they need, through row-wise operators: what the
    companion computes on the last position. Reads are counted in reverse binding order,
    so every reader of a value is decided before the value."""
    readers: dict[g.Var, list[g.Var | None]] = {}
    for b in fn.bindings:
        for v in set(graph_vars_used(b.value)):
            readers.setdefault(v, []).append(b.var)
    for v in set(graph_vars_used(fn.result)):
        readers.setdefault(v, []).append(None)  # a result: read by the caller
    tail: set[g.Var] = set()
    for b in reversed(fn.bindings):
        if b.var is logits or (_is_rows(b.var, rows) and b.var in readers
                               and all(r in tail for r in readers[b.var])
                               and _row_wise(b.value, rows)):
            tail.add(b.var)
    return tail


def _row_wise(value: g.Expr, rows: tuple[Dim, Dim]) -> bool:
    """Whether each [batch, seq] row of `value`'s result reads only the same row of its
    arguments holding rows (the others broadcast along the sequence)."""
    if not isinstance(value, g.Call) or not _is_rows(value, rows):
        return False
    rank = len(value.ret_type.shape)  # type: ignore[union-attr]
    if value.op in ROW_PRODUCTS:
        first, *weights = value.args
        return _is_rows(first, rows, rank) and all(_seq_free(w, rows) for w in weights)
    try:
        pattern = get_op(value.op).pattern
    except KeyError:
        return False
    if pattern == "reduce" and value.op.startswith("reduce_"):
        axes = norm_axes(value.attrs.get("axes") or (), rank)
        if not axes or not all(a >= 2 for a in axes):
            return False
    elif value.op == "layer_norm":
        if norm_axes(value.attrs.get("axis", -1), rank)[0] < 2:
            return False
    elif pattern not in ("elemwise", "broadcast"):
        return False
    return all(_is_rows(a, rows, rank) or _broadcasts(a, rows, rank) for a in value.args)


def _is_rows(expr: g.Expr, rows: tuple[Dim, Dim], rank: int | None = None) -> bool:
    """Whether `expr` is a tensor [batch, seq, ...] of the decoder's rows (of `rank`
    dimensions, if given)."""
    ty = expr.type
    return isinstance(ty, TensorType) and len(ty.shape) >= 2 and \
        (ty.shape[0], ty.shape[1]) == rows and rank in (None, len(ty.shape))


def _seq_free(expr: g.Expr, rows: tuple[Dim, Dim]) -> bool:
    """Whether `expr` is a tensor with no sequence dimension (a weight)."""
    ty = expr.type
    return isinstance(ty, TensorType) and all(d != rows[1] for d in ty.shape)


def _broadcasts(expr: g.Expr, rows: tuple[Dim, Dim], rank: int) -> bool:
    """Whether `expr` is the same for every position: no sequence dimension, and size 1
    (or absent) where it meets a result of `rank` dimensions' sequence axis."""
    if not _seq_free(expr, rows):
        return False
    shape = expr.type.shape  # type: ignore[union-attr]
    seq_axis = 1 - (rank - len(shape))
    return seq_axis < 0 or shape[seq_axis] == 1


def _last_type(ty: Any) -> TensorType:
    assert isinstance(ty, TensorType)
    return TensorType((ty.shape[0], 1, *ty.shape[2:]), ty.dtype)


def _last(value: g.Var, bindings: list[g.Binding]) -> g.Var:
    """`value`'s last position [batch, 1, ...] (a gather of index -1 along the sequence),
    bound at the end of `bindings`."""
    ty = _last_type(value.type)
    var = g.Var(value.name + "_last", ty)
    index = g.Constant(np.array([-1], np.int64), "last_position")
    bindings.append(g.Binding(var, g.Call("gather", (value, index), {"axis": 1}, ty)))
    return var


__all__ = ["LastPosition", "last_position_companion"]

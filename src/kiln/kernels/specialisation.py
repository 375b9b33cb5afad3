"""Which kernels a symbolic size left on a generic path, and the pin that avoids it.

A hand-built kernel family may refuse a call only because one of its dimensions is
symbolic (a tile planned from a static size, a lowering without symbolic support). The
call then runs its tensor-expression loops, correct but slower. kiln never slows down
silently: while `kiln.compile` runs (`recording`), every such refusal is checked
against the same call with its variables pinned (`pins`); when a family would take the
pinned call, a `GenericKernel` is recorded, naming the value the call computes (the
binding, set by the passes with `naming`) and the ONNX node it was imported from
(kiln.ir.source_nodes), the op, the family that would take it, and the pin.
kiln.driver.compiler warns (`kiln.errors.GenericKernelWarning`) and
writes them to the library metadata ("generic_kernels"), which `kiln inspect` and
`kiln.InferenceSession` read back.

Nothing here changes a kernel: the probes only ask families whether they apply.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from kiln.ir import graph as g
from kiln.ir.pin_hint import is_batch_name
from kiln.ir.shape_expr import dim_vars, eval_dim, is_static, shape_text
from kiln.ir.source_nodes import SourceNode, source_of
from kiln.ir.types import TensorType, TupleType, Type
from kiln.target.isa import ISA

#: The size a variable without a typical value or bound is probed at (never shown: the
#: hint then asks for the size served, by name).
_PROBE_SIZE = 64


@dataclass(frozen=True)
class GenericKernel:
    """One call left on its generic loops by a symbolic size (see the module docstring)."""

    node: str                    # the value the call computes (its ONNX output name)
    op: str                      # the graph op
    kernel: str                  # the hand-built family / kernel that takes it pinned
    shapes: tuple[str, ...]      # the operands' shapes, as text
    pins: tuple[tuple[str, int | None], ...]  # variable -> suggested size (None: yours)
    source: SourceNode | None = None  # the model's node it was imported from, if known

    def pin_text(self) -> str:
        """`shape_dict={...}` and the CLI spelling; a variable without a typical size
        or bound reads as its name in capitals (the size you serve)."""
        py = ", ".join(f'"{n}": {v if v is not None else n.upper()}' for n, v in self.pins)
        cli = " ".join(f"--shape {n}={v if v is not None else n.upper()}"
                       for n, v in self.pins)
        return f"shape_dict={{{py}}} (CLI: kiln compile ... {cli})"

    def as_json(self) -> dict[str, Any]:
        """The entry of the library metadata's "generic_kernels"."""
        entry: dict[str, Any] = {"node": self.node, "op": self.op, "kernel": self.kernel,
                                 "shapes": list(self.shapes),
                                 "pins": [{"name": n, "size": v} for n, v in self.pins],
                                 "hint": self.pin_text()}
        if self.source is not None:  # what the user knows: the ONNX node
            entry.update(onnx_node=self.source.name, onnx_op=self.source.op_type,
                         onnx_output=self.source.output)
        return entry


@dataclass
class _Recorder:
    bounds: Mapping[str, tuple[int, int | None]]
    found: dict[tuple[str, str], GenericKernel] = field(default_factory=dict)


_RECORDER: ContextVar[_Recorder | None] = ContextVar("kiln_generic_kernels", default=None)
_NODE: ContextVar[g.Var | str] = ContextVar("kiln_generic_node", default="")


@contextmanager
def recording(bounds: Mapping[str, tuple[int, int | None]]) -> Iterator[list[GenericKernel]]:
    """Record the generic kernels of the compile run inside (into the list yielded,
    filled on exit); `bounds` are the variables' `(min, max)` (kiln.ir.shape_expr.dim_bounds)."""
    rec = _Recorder(bounds)
    token = _RECORDER.set(rec)
    out: list[GenericKernel] = []
    try:
        yield out
    finally:
        _RECORDER.reset(token)
        out.extend(rec.found.values())


@contextmanager
def naming(node: g.Var | str) -> Iterator[None]:
    """The calls probed inside compute the value `node` (a binding's variable, which
    may know its ONNX node, or a name)."""
    token = _NODE.set(node)
    try:
        yield
    finally:
        _NODE.reset(token)


def current_node() -> str:
    """How a message names the value being rewritten now (inside `naming`): the ONNX
    node it was imported from (`node 'conv1' (Conv)`) when known, else its name
    (`value 'conv2d'`); "" outside `naming`."""
    value = _NODE.get()
    if not isinstance(value, g.Var):
        return f"value {value!r}" if value else ""
    source = source_of(value)
    return source.label() if source is not None else f"value {value.name!r}"


def active() -> bool:
    """Whether a compile run is recording (probes cost a family check each)."""
    return _RECORDER.get() is not None


def symbolic(call: g.Call) -> bool:
    """Whether an operand or the result of `call` has a symbolic dimension."""
    return any(not _static(t) for t in (*(a.type for a in call.args), call.type))


def _static(t: Type) -> bool:
    if isinstance(t, TupleType):
        return all(_static(f) for f in t.fields)
    return not isinstance(t, TensorType) or is_static(t.shape)


def _variables(call: g.Call) -> list[str]:
    names: set[str] = set()
    for t in (*(a.type for a in call.args), call.type):
        for f in (t.fields if isinstance(t, TupleType) else (t,)):
            if isinstance(f, TensorType):
                names.update(v.name for v in dim_vars(f.shape))
    return sorted(names)


def pins(names: list[str], bounds: Mapping[str, tuple[int, int | None]]
         ) -> tuple[tuple[str, int | None], ...]:
    """The size suggested for each variable: 1 for a batch, else its upper bound, else
    None (no typical value: the user's own size)."""
    out: list[tuple[str, int | None]] = []
    for n in names:
        low, high = bounds.get(n, (1, None))
        if is_batch_name(n) and low <= 1 and (high is None or high >= 1):
            out.append((n, 1))
        else:
            out.append((n, high))
    return tuple(out)


def _pin_type(t: Type, values: Mapping[str, int]) -> Type:
    if isinstance(t, TupleType):
        return TupleType(tuple(_pin_type(f, values) for f in t.fields))
    if isinstance(t, TensorType) and not is_static(t.shape):
        return TensorType(tuple(eval_dim(d, values) for d in t.shape), t.dtype)
    return t


def pinned_call(call: g.Call, values: Mapping[str, int]) -> g.Call:
    """`call` with its variables at `values`: constants kept (families read weights),
    every other operand a fresh variable of the pinned type."""
    args = tuple(a if isinstance(a, g.Constant) else g.Var(getattr(a, "name", "x") or "x",
                                                          _pin_type(a.type, values))
                 for a in call.args)
    return g.Call(call.op, args, call.attrs, _pin_type(call.ret_type, values))


def _probe(call: g.Call, accepts: Any) -> tuple[str, tuple[tuple[str, int | None], ...]] | None:
    """(kernel, pins) when `accepts(pinned call)` names a kernel, else None."""
    rec = _RECORDER.get()
    if rec is None or not symbolic(call):
        return None
    suggested = pins(_variables(call), rec.bounds)
    values = {n: v if v is not None else _PROBE_SIZE for n, v in suggested}
    try:
        kernel = accepts(pinned_call(call, values))
    except Exception:  # a probe never fails a compile: a family may assert on its input
        return None
    return (kernel, suggested) if kernel else None


def _record(call: g.Call, kernel: str, suggested: tuple[tuple[str, int | None], ...]) -> None:
    rec = _RECORDER.get()
    assert rec is not None
    value = _NODE.get()
    source = source_of(value) if isinstance(value, g.Var) else None
    node = (value.name if isinstance(value, g.Var) else value) or call.op
    shapes = tuple(_shape_text(a.type) for a in call.args if not isinstance(a, g.Constant))
    # One entry per source node and op (a node's helper values share its name hint).
    where = source.label() if source is not None else node
    rec.found.setdefault((where, call.op), GenericKernel(node, call.op, kernel, shapes,
                                                         suggested, source))


def _shape_text(t: Type) -> str:
    return shape_text(t.shape) if isinstance(t, TensorType) else str(t)


def note_unselected(call: g.Call, isa: ISA, select: Any) -> None:
    """Record `call`, which no family took, when one (`select`, the registry's) takes it
    with its variables pinned."""
    found = _probe(call, lambda c: getattr(select(c, isa), "name", None))
    if found is not None:
        _record(call, *found)


def note_lowering(call: g.Call, lowering: Any) -> None:
    """Record `call`, whose hand-built `lowering` declined it (generic loops instead),
    when the lowering takes it with its variables pinned. A lowering that takes symbolic
    sizes and claims `call` declined something else (a fused chain): not recorded, the
    pinned build would decline it too."""
    if lowering.supports_symbolic and lowering.builds(call):
        return
    found = _probe(call, lambda c: c.op if lowering.builds(c) else None)
    if found is not None:
        _record(call, *found)


__all__ = ["GenericKernel", "active", "current_node", "naming", "note_lowering", "note_unselected",
           "pinned_call", "pins", "recording", "symbolic"]

"""ONNX If, Loop and Scan: graph-level `If` / `Loop` (kiln.ir.graph) over body functions.

Each subgraph becomes a private graph function of the module, imported by a nested
importer with the same converters. A subgraph may read values of the enclosing
graphs by name (implicit inputs): constants are used in place; every other such
value becomes an explicit parameter of the body function (after its own inputs),
passed by the If (`args`) or the Loop (`captures`).

- If: both branches take the same parameters (the outer values either one reads)
  and must return the same types; branches whose outputs differ in shape are
  refused (a data-dependent output shape).
- Loop: the body function takes `(iteration, cond, *states, *captures)` and returns
  `(cond, *states, *scan_values)`. A loop-carried value keeps its type. A scan
  output's length is the trip count: it must be known (a constant, or a size
  computed from symbolic dimensions) and the loop must not stop early (no
  condition, or a body that returns its condition unchanged or true); otherwise
  the node is refused (data-dependent output size).
- Scan (opset 9+) is imported as a Loop over the scan axis: the body gathers slice
  `i` (or `L - 1 - i` for a reverse direction) of each scan input, and each scan
  output is reversed and/or moved to its axis after the loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.errors import FrontendError
from kiln.frontend.onnx.converters.registry import LoopStep
from kiln.ir import graph as g
from kiln.ir.attrs import ATTR_PRIVATE, ATTR_SOURCE_NODE
from kiln.ir.shape_expr import dims_equal, shape_text
from kiln.ir.types import Dim, TensorType, TupleType

if TYPE_CHECKING:
    from kiln.frontend.onnx.importer import GraphImporter

CONTROL_FLOW_OPS = ("If", "Loop", "Scan")

_BOOL0 = TensorType((), "bool")
_INT0 = TensorType((), "int64")

# (name of the outer value or None, the outer expression) of each captured parameter
_Captures = list[tuple[str | None, g.Expr]]
# (the nested importer, the leading parameters, the captured parameters) -> values of
# the subgraph's input names
_Bind = Callable[["GraphImporter", list[g.Var], list[g.Var]], dict[str, g.Expr]]
_Finish = Callable[["GraphImporter", list[g.Var], list[g.Expr]], list[g.Expr]]


def convert(imp: GraphImporter, node: Any, inputs: Sequence[g.Expr | None]) -> list[g.Expr]:
    """The outputs of control-flow node `node` (If, Loop or Scan)."""
    op = str(node.op_type)
    if op == "If":
        return _convert_if(imp, node, inputs)
    if op == "Loop":
        return _convert_loop(imp, node, inputs)
    return _convert_scan(imp, node, inputs)


# --------------------------------------------------------------------------- helpers


def _graph_attr(node: Any, name: str) -> Any:
    for attr in node.attribute:
        if attr.name == name:
            if attr.type != attr.GRAPH:
                raise FrontendError(f"attribute {name!r} is not a graph")
            return attr.g
    raise FrontendError(f"the subgraph attribute {name!r} is missing")


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper  # optional: onnx (the compiler extra)

    return {a.name: helper.get_attribute_value(a) for a in node.attribute
            if a.type not in (a.GRAPH, a.GRAPHS)}


def implicit_inputs(graph: Any) -> list[str]:
    """Names a subgraph (and the subgraphs nested in it) reads from enclosing graphs."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    out: list[str] = []

    def need(name: str) -> None:
        if name and name not in defined and name not in out:
            out.append(name)

    for node in graph.node:
        for name in node.input:
            need(name)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == attr.GRAPH else
                        list(attr.graphs) if attr.type == attr.GRAPHS else []):
                for name in implicit_inputs(sub):
                    need(name)
        defined.update(node.output)
    return out


def _captures(imp: GraphImporter, graphs: Sequence[Any]) -> tuple[_Captures, dict[str, g.Expr]]:
    """The outer values the subgraphs read: non-constant ones are captured as
    parameters, constants are used in place."""
    captured: _Captures = []
    consts: dict[str, g.Expr] = {}
    for graph in graphs:
        for name in implicit_inputs(graph):
            if name not in imp.values:
                raise FrontendError(f"a subgraph reads {name!r}, which no enclosing graph "
                                    "defines before this node")
            value = imp.values[name]
            if isinstance(value, g.Constant):
                consts[name] = value
            elif all(name != n for n, _ in captured):
                captured.append((name, value))
    return captured, consts


def _fresh_name(imp: GraphImporter, node: Any, role: str) -> str:
    return fresh_function_name(imp, str(node.name or node.op_type), role)


def fresh_function_name(imp: GraphImporter, base: str, role: str) -> str:
    """A function name from `base` and `role` that no function of the module has yet."""
    base = "".join(c if c.isalnum() or c == "_" else "_" for c in base).strip("_") or "body"
    if base[0].isdigit():
        base = f"n{base}"
    name, k = f"{base}_{role}", 0
    while name in imp.function_names:  # a nested body may be imported before its parent
        k += 1
        name = f"{base}_{role}_{k}"
    imp.function_names.add(name)
    return name


def _type_key(ty: Any) -> Any:
    if isinstance(ty, TupleType):
        return tuple(_type_key(f) for f in ty.fields)
    return (shape_text(ty.shape), ty.dtype)


def _scalar(imp: GraphImporter, x: g.Expr, dtype: str, what: str) -> g.Expr:
    """`x` as a 0-d tensor of `dtype` (ONNX allows a one-element 1-d tensor)."""
    ty = imp.tensor_type(x)
    if ty.dtype != dtype:
        raise FrontendError(f"{what} has dtype {ty.dtype}; ONNX makes it {dtype}")
    if ty.shape == ():
        return x
    if ty.shape != (1,):
        raise FrontendError(f"{what} has shape {shape_text(ty.shape)}; it must hold one "
                            "element")
    return imp.call("reshape", x, shape=())


def _build_body(imp: GraphImporter, graph: Any, name: str, role: str,
                leading: list[tuple[str, TensorType]], captures: _Captures,
                consts: dict[str, g.Expr], bind: _Bind, finish: _Finish) -> g.Function:
    """Import subgraph `graph` as private graph function `name` with parameters
    `leading + captures`; `bind` maps the subgraph's input names to values, `finish`
    turns its outputs into the function's results."""
    from onnx import numpy_helper  # optional: onnx (the compiler extra)

    from kiln.transform.dead_code import (
        remove_dead_bindings,  # lazy: kiln.transform.registry loads it on first use
    )

    sub = imp.sub_importer(graph)
    try:
        with sub.ib.function(name):
            lead = [sub.ib.param(hint, ty) for hint, ty in leading]
            caps: list[g.Var] = []
            for outer_name, value in captures:
                p = sub.ib.param(outer_name or "captured", value.type)
                caps.append(p)
                sub.params.add(p)
                if outer_name is not None:
                    sub.values[outer_name] = p
                if value in imp.shape_values:
                    sub.shape_values[p] = imp.shape_values[value]
            sub.values.update(consts)
            sub.values.update(bind(sub, lead, caps))
            for init in graph.initializer:
                sub.values[init.name] = g.Constant(numpy_helper.to_array(init), init.name)
            for k, inner in enumerate(graph.node):
                sub._convert(inner, k)
            outs = []
            for out in graph.output:
                if out.name not in sub.values:
                    raise FrontendError(f"output {out.name!r} is produced by no node")
                outs.append(sub.values[out.name])
            results = finish(sub, lead, outs)
            sub.ib.func_attr(ATTR_PRIVATE, True)
            sub.ib.ret(g.Tuple(tuple(results)))
    except FrontendError as exc:
        raise FrontendError(f"{imp.where}: {role} subgraph: {exc}") from exc
    fn = sub.ib.get()[name]
    assert isinstance(fn, g.Function)
    fn = remove_dead_bindings(fn)
    imp.functions[name] = fn
    return fn


def _bind_inputs(graph: Any, first: int = 0) -> _Bind:
    """Bind the subgraph's inputs, in order, to the leading parameters from `first` on."""
    def bind(sub: GraphImporter, lead: list[g.Var], caps: list[g.Var]) -> dict[str, g.Expr]:
        names = [i.name for i in graph.input]
        return {n: p for n, p in zip(names, lead[first:])}
    return bind


def _check_states(outs: Sequence[g.Expr], states: Sequence[g.Expr], imp: GraphImporter) -> None:
    for k, (out, init) in enumerate(zip(outs, states)):
        got, want = imp.tensor_type(out), imp.tensor_type(init)
        if _type_key(got) != _type_key(want):
            raise FrontendError(
                f"loop-carried value {k} changes from {want.dtype}{shape_text(want.shape)} to "
                f"{got.dtype}{shape_text(got.shape)} in an iteration; kiln keeps a "
                "loop-carried value's shape and dtype")


# --------------------------------------------------------------------------- If


def _convert_if(imp: GraphImporter, node: Any, inputs: Sequence[g.Expr | None]) -> list[g.Expr]:
    if not inputs or inputs[0] is None:
        raise FrontendError("If needs its condition input")
    cond = _scalar(imp, inputs[0], "bool", "the If condition")
    then_g, else_g = _graph_attr(node, "then_branch"), _graph_attr(node, "else_branch")
    if len(then_g.output) != len(else_g.output):
        raise FrontendError(f"the branches return {len(then_g.output)} and "
                            f"{len(else_g.output)} values")
    captures, consts = _captures(imp, [then_g, else_g])

    def finish(sub: GraphImporter, lead: list[g.Var], outs: list[g.Expr]) -> list[g.Expr]:
        return outs

    fns = [_build_body(imp, graph, _fresh_name(imp, node, role), f"{role}_branch", [],
                       captures, consts, lambda sub, lead, caps: {}, finish)
           for graph, role in ((then_g, "then"), (else_g, "else"))]
    then_t, else_t = fns[0].ret_type, fns[1].ret_type
    assert isinstance(then_t, TupleType) and isinstance(else_t, TupleType)
    for k, (a, b) in enumerate(zip(then_t.fields, else_t.fields)):
        if _type_key(a) != _type_key(b):
            assert isinstance(a, TensorType) and isinstance(b, TensorType)
            raise FrontendError(
                f"output {k} ({node.output[k]!r}) is {a.dtype}{shape_text(a.shape)} in the "
                f"then branch but {b.dtype}{shape_text(b.shape)} in the else branch; kiln "
                "does not import an If whose output shape depends on the condition")
    names = [n for n, f in imp.functions.items() if f is fns[0] or f is fns[1]]
    assert len(names) == 2
    expr = g.If(cond, tuple(v for _, v in captures), names[0], names[1], then_t)
    out = imp.ib.emit(expr, "if_out")
    return [imp.item(out, k) for k in range(len(then_t.fields))]


# --------------------------------------------------------------------------- Loop


def _stops_early(cond_in: g.Expr | None, body: g.Function) -> bool:
    """Whether the loop may end before its trip count: a condition is given and the body
    does not return it unchanged (or true)."""
    if cond_in is None:
        return False
    result = body.result
    assert isinstance(result, g.Tuple)
    cond_out = result.fields[0]
    if cond_out is body.params[1]:
        return False
    return not (isinstance(cond_out, g.Constant) and bool(np.all(cond_out.data)))


def _trip_length(imp: GraphImporter, m: g.Expr | None) -> Dim | None:
    """The trip count as a dimension (int, or a size from symbolic dims), else None."""
    if m is None:
        return None
    dims = imp.dims(m)
    if dims is None or dims.size != 1:
        return None
    value = dims.reshape(-1)[0]
    return int(value) if isinstance(value, (int, np.integer)) else value


def _convert_loop(imp: GraphImporter, node: Any, inputs: Sequence[g.Expr | None]) -> list[g.Expr]:
    m_in = inputs[0] if len(inputs) > 0 else None
    c_in = inputs[1] if len(inputs) > 1 else None
    states = list(inputs[2:])
    if any(s is None for s in states):
        raise FrontendError("a loop-carried initial value is missing")
    inits = [s for s in states if s is not None]
    if m_in is None and c_in is None:
        raise FrontendError("the Loop has neither a trip count nor a condition: it would "
                            "never end")
    trip = None if m_in is None else _scalar(imp, m_in, "int64", "the trip count M")
    cond = None if c_in is None else _scalar(imp, c_in, "bool", "the loop condition")
    body_g = _graph_attr(node, "body")
    n = len(inits)
    if len(body_g.input) != 2 + n or len(body_g.output) < 1 + n:
        raise FrontendError(f"the body takes {len(body_g.input)} inputs and returns "
                            f"{len(body_g.output)} outputs; with {n} loop-carried values it "
                            f"takes {2 + n} and returns at least {1 + n}")
    captures, consts = _captures(imp, [body_g])
    leading = [("iteration", _INT0), ("cond", _BOOL0),
               *((f"state{k}", imp.tensor_type(s)) for k, s in enumerate(inits))]

    def finish(sub: GraphImporter, lead: list[g.Var], outs: list[g.Expr]) -> list[g.Expr]:
        c = _scalar(sub, outs[0], "bool", "the body's condition output")
        _check_states(outs[1:1 + n], inits, imp)
        return [c, *outs[1:]]

    name = _fresh_name(imp, node, "body")
    body = _build_body(imp, body_g, name, "body", leading, captures, consts,
                       _bind_inputs(body_g), finish)
    if node.name:  # the loop's errors (its iteration limit) name the node
        body = imp.functions[name] = body.with_attrs(**{ATTR_SOURCE_NODE: str(node.name)})
    ret = body.ret_type
    assert isinstance(ret, TupleType)
    scan_types = list(ret.fields[1 + n:])
    fields: list[TensorType] = [imp.tensor_type(s) for s in inits]
    if scan_types:
        length = _trip_length(imp, m_in)
        early = _stops_early(c_in, body)
        if length is None or early:
            why = ("the trip count is not known at compile time" if length is None else
                   "the loop condition can stop it before its trip count")
            raise FrontendError(
                f"scan output {node.output[n]!r} has a data-dependent length ({why}); kiln "
                "does not import a Loop whose scan outputs have a run-time length yet")
        for ty in scan_types:
            assert isinstance(ty, TensorType)
            fields.append(TensorType((length, *ty.shape), ty.dtype))
    expr = g.Loop(name, trip, cond, tuple(inits), tuple(v for _, v in captures),
                  TupleType(tuple(fields)))
    out = imp.ib.emit(expr, "loop_out")
    return [imp.item(out, k) for k in range(len(fields))]


# ------------------------------------------------------------ loops built by converters

def converter_loop(imp: GraphImporter, hint: str, trip: g.Expr, states: Sequence[g.Expr],
                   length: Dim, step: LoopStep) -> list[g.Expr]:
    """A Loop of `trip` iterations (0-d int64) whose body `step` builds with the
    converters' own code in a nested importer (a recurrent op over a symbolic sequence
    length): the final `states`, then each scan value stacked along a new leading axis
    of `length`. The body reads values of this graph through `outer`
    (kiln.frontend.onnx.converters.registry.GraphContext), which captures them as
    parameters."""
    from kiln.transform.dead_code import (
        remove_dead_bindings,  # lazy: kiln.transform.registry loads it on first use
    )

    name = fresh_function_name(imp, hint, "body")
    sub = imp.sub_importer(None)
    sub.enclosing = imp
    sub.where = imp.where
    with sub.ib.function(name):
        iteration = sub.ib.param("iteration", _INT0)
        cond = sub.ib.param("cond", _BOOL0)
        carried: list[g.Expr] = [sub.ib.param(f"state{k}", imp.tensor_type(s))
                                 for k, s in enumerate(states)]
        new_states, scans = step(sub, iteration, carried)
        _check_states(new_states, states, imp)
        sub.ib.func_attr(ATTR_PRIVATE, True)
        sub.ib.ret(g.Tuple((cond, *new_states, *scans)))
    fn = sub.ib.get()[name]
    assert isinstance(fn, g.Function)
    imp.functions[name] = remove_dead_bindings(fn)
    fields = [imp.tensor_type(s) for s in states]
    fields += [TensorType((length, *sub.tensor_type(v).shape), sub.tensor_type(v).dtype)
               for v in scans]
    loop = imp.ib.emit(g.Loop(name, trip, None, tuple(states), tuple(sub.captured),
                              TupleType(tuple(fields))), "loop_out")
    return [imp.item(loop, k) for k in range(len(fields))]


# --------------------------------------------------------------------------- Scan


def _axis(a: int, ndim: int, what: str) -> int:
    if not -ndim <= a < ndim:
        raise FrontendError(f"{what} {a} is out of range for rank {ndim}")
    return a + ndim if a < 0 else a


def _convert_scan(imp: GraphImporter, node: Any, inputs: Sequence[g.Expr | None]) -> list[g.Expr]:
    if imp.opset < 9:
        raise FrontendError("Scan before opset 9 (batch axis, sequence_lens) is not supported")
    attrs = _attrs(node)
    body_g = _graph_attr(node, "body")
    n_scan = int(attrs["num_scan_inputs"])
    if any(x is None for x in inputs):
        raise FrontendError("an input is missing")
    xs = [x for x in inputs if x is not None]
    n = len(xs) - n_scan
    if n < 0 or n_scan < 1:
        raise FrontendError(f"num_scan_inputs={n_scan} does not fit {len(xs)} inputs")
    inits, scans = xs[:n], xs[n:]
    k_out = len(body_g.output) - n
    in_axes = list(attrs.get("scan_input_axes") or [0] * n_scan)
    in_dirs = list(attrs.get("scan_input_directions") or [0] * n_scan)
    out_axes = list(attrs.get("scan_output_axes") or [0] * k_out)
    out_dirs = list(attrs.get("scan_output_directions") or [0] * k_out)
    if len(in_axes) != n_scan or len(in_dirs) != n_scan or len(out_axes) != k_out \
            or len(out_dirs) != k_out or k_out < 0:
        raise FrontendError("scan_input/output_axes/directions do not match the number of "
                            "scan inputs and outputs")
    if len(body_g.input) != n + n_scan:
        raise FrontendError(f"the body takes {len(body_g.input)} inputs; expected "
                            f"{n + n_scan}")
    axes = [_axis(int(a), imp.tensor_type(x).ndim, "scan_input_axes")
            for a, x in zip(in_axes, scans)]
    length: Dim = imp.tensor_type(scans[0]).shape[axes[0]]
    for x, a in zip(scans[1:], axes[1:]):
        if dims_equal(imp.tensor_type(x).shape[a], length) is not True:
            raise FrontendError(f"the scan inputs have different lengths: "
                                f"{shape_text((length,))} and "
                                f"{shape_text((imp.tensor_type(x).shape[a],))}")
    first = scans[0]
    if isinstance(length, int):
        trip: g.Expr = imp.const(np.array(length, np.int64))
    else:
        trip = imp.call("reshape", imp.call("shape_of", first, start=axes[0],
                                            end=axes[0] + 1), shape=())
    captures, consts = _captures(imp, [body_g])
    captures = [(None, x) for x in scans] + captures
    leading = [("iteration", _INT0), ("cond", _BOOL0),
               *((f"state{k}", imp.tensor_type(s)) for k, s in enumerate(inits))]

    def bind(sub: GraphImporter, lead: list[g.Var], caps: list[g.Var]) -> dict[str, g.Expr]:
        full = caps[:n_scan]  # the scan inputs come first among the captures
        names = [i.name for i in body_g.input]
        out: dict[str, g.Expr] = dict(zip(names[:n], lead[2:]))
        i = lead[0]
        for name, x, a, d in zip(names[n:], full, axes, in_dirs):
            idx: g.Expr = i
            if int(d):
                last = (sub.const(np.array(length - 1, np.int64)) if isinstance(length, int)
                        else sub.call("subtract", sub.call("reshape", sub.call(
                            "shape_of", x, start=a, end=a + 1), shape=()),
                            sub.const(np.array(1, np.int64))))
                idx = sub.call("subtract", last, i)
            out[name] = sub.call("gather", x, idx, axis=a)
        return out

    def finish(sub: GraphImporter, lead: list[g.Var], outs: list[g.Expr]) -> list[g.Expr]:
        _check_states(outs[:n], inits, imp)
        return [lead[1], *outs]

    name = _fresh_name(imp, node, "body")
    body = _build_body(imp, body_g, name, "body", leading, captures, consts, bind, finish)
    ret = body.ret_type
    assert isinstance(ret, TupleType)
    fields: list[TensorType] = [imp.tensor_type(s) for s in inits]
    for ty in ret.fields[1 + n:]:
        assert isinstance(ty, TensorType)
        fields.append(TensorType((length, *ty.shape), ty.dtype))
    expr = g.Loop(name, trip, None, tuple(inits), tuple(v for _, v in captures),
                  TupleType(tuple(fields)))
    loop = imp.ib.emit(expr, "scan_out")
    outs = [imp.item(loop, k) for k in range(len(fields))]
    for k in range(k_out):
        y = outs[n + k]
        if int(out_dirs[k]):
            y = imp.call("strided_slice", y, starts=(-1,), ends=(-(2 ** 62),), axes=(0,),
                         steps=(-1,))
        rank = imp.tensor_type(y).ndim
        a = _axis(int(out_axes[k]), rank, "scan_output_axes")
        if a:
            perm = (*range(1, a + 1), 0, *range(a + 1, rank))
            y = imp.call("transpose", y, perm=perm)
        outs[n + k] = y
    return outs

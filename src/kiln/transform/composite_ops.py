"""recognize-composites: exporters' spelled-out GELU and LayerNorm as the ops kiln has.

Older exports (and models written against opsets without `Gelu` or
`LayerNormalization`) spell these out in elementwise ops:

- tanh GELU (GPT-2's): `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, ten or so
  nodes in whatever order the exporter wrote the products, `x^3` as `Pow` or as
  products;
- erf GELU (BERT's): `0.5 x (1 + erf(x / sqrt(2)))`, computed as `gelu` computes it,
  `(0.5 x) (1 + erf(x sqrt(1/2)))`, as onnxruntime's Gelu fusion does (with the same
  erf, kiln.kernels.math, the results are onnxruntime's bit for bit);
- layer norm: `d = x - mean(x)`, `d / sqrt(mean(d^2) + eps)`, then optionally
  `* gamma + beta`, the means over the last axis.

Each match becomes one call, `gelu(x[, approximate="tanh"])` or `layer_norm(x, gamma,
beta, axis=-1, epsilon=eps)`: the GELU's input is then read once, so fuse-ops puts
the whole activation in the epilogue of the matrix product before it (spelled out,
its intermediate values are read by several nodes and the group is cut after the
bias add), and the layer norm is one row kernel (kiln.kernels.rows) instead of
two reductions and five elementwise kernels. Any other `Pow` by a constant 2 or 3
becomes products: `pow` is a scalar libm call that no loop vectorizer widens. A
`matmul` of operands scaled by scalar constants (attention's `q * s`, `k^T * s`)
becomes the product of the unscaled operands times `s s'`, which fuse-ops puts in the
matrix product's epilogue: one kernel per scaled operand less.

In a function that quantizes activations at run time (dynamic quantization:
`dynamic_quant_matmul`, `dynamic_quantize_linear`), a layer norm whose input is the sum
of two tensors of its shape (a residual connection) is marked `residual=True`: its row
kernel then computes as onnxruntime's SkipLayerNormalization does (Welford's
statistics), the sum being fused either into it or into the product before it. There
an ulp of difference moves values across quantization steps and compounds over the
layers; elsewhere the faster two-pass kernel stays.
The other layer norms of such a function, and every layer norm of a function that
quantizes activations statically (`quantize_linear`, quantize-ops' `qlinear_*` ops: a
QDQ or QOperator model), are marked `like_onnxruntime=True`: onnxruntime's
LayerNormalization arithmetic where the target runs MLAS's AVX2 kernel
(kiln.kernels.rows.layer_norm_onnxruntime.layer_norm_mlas_row), for the same reason.

A pattern matches only when none of its intermediate values is read outside it,
its input has the result's shape (no broadcasting inside) and its constants
equal the formula's to float32 precision. The rewritten results agree with the
spelled-out graph to float32 rounding, not bit for bit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.ir import graph as g
from kiln.ir import weight_origin as wo
from kiln.ir.analysis.graph_uses import graph_vars_used, var_use_counts
from kiln.ir.dtype import is_float
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType
from kiln.ops import quant_dynamic
from kiln.transform.dead_code import remove_dead_bindings
from kiln.transform.pass_base import FunctionPass

SQRT_2_OVER_PI = 0.7978845608028654
GELU_CUBIC = 0.044715
SQRT_HALF = 0.7071067811865476
#: Ops that quantize activations at run time: where residual layer norms are marked.
RUNTIME_QUANTIZATION = (quant_dynamic.DYNAMIC, quant_dynamic.PACKED, "dynamic_quantize_linear")
# Powers written out as products (pow(x, 2) = x * x is exact; x * x * x rounds twice).
SMALL_POWERS = (2, 3)
# Constants match the formula's when this close (float32 spellings of sqrt(2/pi) ...).
RTOL = 1e-5


@dataclass(frozen=True)
class RecognizeComposites(FunctionPass):
    """Rewrite spelled-out tanh GELU and layer norm into `gelu` and `layer_norm`, small
    constant powers into products, and scalar scales of matmul operands into one scale
    of the product."""

    name = "recognize-composites"
    level = "graph"

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> g.Function:
        assert isinstance(func, g.Function)
        graph = _Graph(func)
        new: dict[g.Var, list[g.Binding]] = {}  # a binding -> those that replace it
        for b in func.bindings:
            for match in (_gelu_tanh, _gelu_erf, _layer_norm):
                graph.pending.clear()
                found = match(graph, b) if b.var not in graph.absorbed else None
                if found is not None:
                    new[found.var] = [found]
                    graph.absorbed.update(graph.pending)
                    break
        for b in func.bindings:  # powers left outside any pattern; scaled matmul operands
            if b.var not in new and b.var not in graph.absorbed:
                rewritten = _products_for_power(graph, b) or _scaled_matmul(graph, b, new)
                if rewritten:
                    new[b.var] = rewritten
        quantizes = any(isinstance(b.value, g.Call) and b.value.op in RUNTIME_QUANTIZATION
                        for b in func.bindings)
        for b in func.bindings if quantizes else ():  # layer norms of residual sums
            if b.var not in new and b.var not in graph.absorbed:
                marked = _residual_layer_norm(graph, b)
                if marked:
                    new[b.var] = [marked]
        if quantizes or any(isinstance(b.value, g.Call) and _quantizes_statically(b.value.op)
                            for b in func.bindings):
            for b in func.bindings:  # the other layer norms: onnxruntime's LayerNormalization
                marked = _like_onnxruntime(new[b.var][-1] if b.var in new else b)
                if marked:
                    new[b.var] = [*new.get(b.var, [])[:-1], marked]
        if not new:
            return func
        bindings = [r for b in func.bindings for r in new.get(b.var, [b])]
        return remove_dead_bindings(g.Function(func.params, tuple(bindings), func.result,
                                               dict(func.attrs)))


@dataclass
class _Graph:
    """The function's bindings by variable, its use counts, and the variables the
    pattern being matched would absorb."""

    func: g.Function
    defs: dict[g.Var, g.Expr] = field(default_factory=dict)
    uses: Counter[g.Var] = field(default_factory=Counter)
    consumers: dict[g.Var, list[g.Binding]] = field(default_factory=dict)
    pending: set[g.Var] = field(default_factory=set)
    absorbed: set[g.Var] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.uses = var_use_counts(self.func)
        for b in self.func.bindings:
            self.defs[b.var] = b.value
            for v in set(graph_vars_used(b.value)):
                self.consumers.setdefault(v, []).append(b)

    def call(self, e: g.Expr, *ops: str) -> g.Call | None:
        """The call bound to `e` when it is one of `ops` and not yet absorbed."""
        value = self.defs.get(e) if isinstance(e, g.Var) else None
        if isinstance(value, g.Call) and value.op in ops and e not in self.absorbed:
            return value
        return None

    def inner(self, e: g.Expr, *ops: str) -> g.Call | None:
        """Like `call`, for a value read only once (by the pattern), which it absorbs."""
        value = self.call(e, *ops)
        if value is None or self.uses[e] != 1:  # type: ignore[index]
            return None
        assert isinstance(e, g.Var)
        self.pending.add(e)
        return value

    def consumer(self, v: g.Var, op: str) -> g.Binding | None:
        """The one binding reading `v`, when `v` is read once, by a call of `op`."""
        readers = self.consumers.get(v, [])
        if self.uses[v] != 1 or len(readers) != 1:
            return None
        value = readers[0].value
        return readers[0] if isinstance(value, g.Call) and value.op == op else None


def _scalar(e: g.Expr) -> float | None:
    """The value of a one-element float constant."""
    if isinstance(e, g.Constant) and e.data.size == 1 and is_float(e.type.dtype):
        return float(e.data.reshape(()))
    return None


def _close(value: float | None, want: float) -> bool:
    return value is not None and abs(value - want) <= RTOL * abs(want)


def _small_power(c: g.Call) -> int | None:
    exponent = _scalar(c.args[1])
    return int(exponent) if exponent in SMALL_POWERS else None


def _product(graph: _Graph, e: g.Expr, root: bool = False) -> tuple[float, list[g.Expr]]:
    """`e` as a constant times a product of factors, through multiplies, divisions by
    constants and small constant powers whose values only the product reads (`root`: `e`
    itself may be read elsewhere)."""
    c = _scalar(e)
    if c is not None:
        return c, []
    step = graph.call(e, "multiply", "divide", "power") if root else \
        graph.inner(e, "multiply", "divide", "power")
    if step is None:
        return 1.0, [e]
    a, b = step.args
    if step.op == "multiply":
        ca, fa = _product(graph, a)
        cb, fb = _product(graph, b)
        return ca * cb, fa + fb
    divisor = _scalar(b)
    if step.op == "divide" and divisor:
        ca, fa = _product(graph, a)
        return ca / divisor, fa
    n = _small_power(step) if step.op == "power" else None
    if n is not None:
        ca, fa = _product(graph, a)
        return ca ** n, fa * n
    assert isinstance(e, g.Var)
    graph.pending.discard(e)
    return 1.0, [e]


def _add_terms(graph: _Graph, e: g.Expr) -> tuple[g.Expr, g.Expr] | None:
    """The operands of the add bound to `e` (absorbed), the constant one second if any."""
    add = graph.inner(e, "add")
    if add is None:
        return None
    a, b = add.args
    return (b, a) if _scalar(a) is not None else (a, b)


def _same_shape(x: g.Expr, out: g.Var) -> bool:
    return isinstance(x.type, TensorType) and x.type == out.type and is_float(x.type.dtype)


def _half_x_one_plus(graph: _Graph, b: g.Binding, op: str) -> Iterator[tuple[g.Expr, g.Call]]:
    """`(x, f)` for each reading of `b` as `0.5 x (1 + f)`, `f` a call of `op` (absorbed)."""
    if graph.call(b.var, "multiply") is None:
        return
    half, factors = _product(graph, b.var, root=True)
    if not _close(half, 0.5) or len(factors) != 2:
        return
    for x, other in (factors, factors[::-1]):
        terms = _add_terms(graph, other)
        f = graph.inner(terms[0], op) if terms and _close(_scalar(terms[1]), 1.0) else None
        if f is not None:
            yield x, f


def _gelu_tanh(graph: _Graph, b: g.Binding) -> g.Binding | None:
    """`gelu(x, approximate="tanh")` when `b` is `0.5 x (1 + tanh(k (x + c x^3)))`."""
    for x, tanh in _half_x_one_plus(graph, b, "tanh"):
        k, inner = _product(graph, tanh.args[0])
        sum_terms = _add_terms(graph, inner[0]) if len(inner) == 1 else None
        if not _close(k, SQRT_2_OVER_PI) or sum_terms is None:
            continue
        for lin, cubic in (sum_terms, sum_terms[::-1]):
            c, cube = _product(graph, cubic)
            if lin is x and _close(c, GELU_CUBIC) and cube == [x, x, x] and _same_shape(x, b.var):
                return g.Binding(b.var, g.Call("gelu", (x,), {"approximate": "tanh"},
                                               b.var.type))
    return None


def _gelu_erf(graph: _Graph, b: g.Binding) -> g.Binding | None:
    """`gelu(x)` when `b` is `0.5 x (1 + erf(x / sqrt(2)))` (the products in any order,
    `/ sqrt(2)` or `* sqrt(1/2)`): the formula onnxruntime's Gelu fusion computes,
    `(0.5 x) (1 + erf(x sqrt(1/2)))`, so both round alike."""
    for x, erf in _half_x_one_plus(graph, b, "erf"):
        k, inner = _product(graph, erf.args[0])
        if _close(k, SQRT_HALF) and inner == [x] and _same_shape(x, b.var):
            return g.Binding(b.var, g.Call("gelu", (x,), {}, b.var.type))
    return None


def _residual_layer_norm(graph: _Graph, b: g.Binding) -> g.Binding | None:
    """`b`'s layer_norm marked `residual=True` when its input is the sum of two tensors of
    its shape (a residual connection): onnxruntime runs that pair as one
    SkipLayerNormalization, whose arithmetic the marked kernel repeats
    (kiln.kernels.rows.layer_norm_onnxruntime.layer_norm_welford_rows)."""
    ln = graph.call(b.var, "layer_norm")
    if ln is None or ln.attrs.get("residual") or not ln.args:
        return None
    add = graph.call(ln.args[0], "add")
    if add is None or not all(_same_shape(a, b.var) for a in add.args):
        return None
    return g.Binding(b.var, g.Call("layer_norm", ln.args, {**ln.attrs, "residual": True},
                                   b.var.type))


def _quantizes_statically(op: str) -> bool:
    """Whether `op` quantizes activations with constant parameters (QDQ's QuantizeLinear,
    quantize-ops' integer ops: a static model's)."""
    return op == "quantize_linear" or op.startswith("qlinear_")


def _like_onnxruntime(b: g.Binding) -> g.Binding | None:
    """`b`'s layer_norm marked `like_onnxruntime=True` (kiln.kernels.rows: onnxruntime's
    LayerNormalization arithmetic where the target runs MLAS's kernel), unless it is
    marked already or a residual one (SkipLayerNormalization's)."""
    ln = b.value
    if not isinstance(ln, g.Call) or ln.op != "layer_norm" or ln.attrs.get("residual") \
            or ln.attrs.get("like_onnxruntime"):
        return None
    return g.Binding(b.var, g.Call("layer_norm", ln.args, {**ln.attrs, "like_onnxruntime": True},
                                   ln.type))


def _last_axis_mean(graph: _Graph, e: g.Expr) -> g.Call | None:
    """The mean over the last axis (dimensions kept) bound to `e`, absorbed."""
    mean = graph.inner(e, "reduce_mean")
    if mean is None or not bool(mean.attrs.get("keepdims", True)):
        return None
    x = mean.args[0]
    axes = mean.attrs.get("axes")
    ndim = len(x.type.shape) if isinstance(x.type, TensorType) else 0
    return mean if isinstance(axes, tuple) and axes in ((-1,), (ndim - 1,)) else None


def _layer_norm(graph: _Graph, b: g.Binding) -> g.Binding | None:
    """`layer_norm(x, gamma, beta, axis=-1, epsilon=eps)` when `b` is the last of
    `(x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) [* gamma] [+ beta]`."""
    div = graph.call(b.var, "divide")
    if div is None or b.var in graph.absorbed:
        return None
    centred, std = div.args
    sub = graph.call(centred, "subtract")
    sqrt = graph.inner(std, "sqrt")
    if sub is None or sqrt is None:
        return None
    x, mean = sub.args
    first = _last_axis_mean(graph, mean)
    if first is None or first.args[0] is not x:
        return None
    terms = _add_terms(graph, sqrt.args[0])
    var = _last_axis_mean(graph, terms[0]) if terms else None
    eps = _scalar(terms[1]) if terms else None
    if var is None or eps is None or not _same_shape(x, b.var):
        return None
    assert isinstance(x.type, TensorType)
    dim = x.type.shape[-1]
    one, square = _product(graph, var.args[0])
    # the centred value is read by the square and the division, nothing else
    if not _close(one, 1.0) or square != [centred, centred] or \
            graph.uses[centred] != 1 + sum(  # type: ignore[index]
                1 for a in _read_by(graph, var.args[0]) if a is centred):
        return None
    assert isinstance(centred, g.Var)
    graph.pending.add(centred)
    return _with_affine(graph, b, x, eps, dim if isinstance(dim, int) else None)


def _read_by(graph: _Graph, e: g.Expr) -> list[g.Expr]:
    """The operands read by the multiplies/powers under `e` that the pattern absorbed."""
    call = graph.defs.get(e) if isinstance(e, g.Var) else None
    if not isinstance(call, g.Call) or e not in graph.pending:
        return [e]
    return [r for a in call.args for r in _read_by(graph, a)]


def _with_affine(graph: _Graph, b: g.Binding, x: g.Expr, eps: float,
                 dim: int | None) -> g.Binding:
    """The layer norm of `x`, taking in a following `* gamma` and `+ beta` by constant
    vectors over the last axis (of static size `dim`; the binding that ends the chain
    gets the call)."""
    end, found = b, {}
    for op in ("multiply", "add"):  # `* gamma`, then `+ beta`, each optional
        step = graph.consumer(end.var, op)
        if step is None or dim is None or not _same_shape(x, step.var):
            continue
        vector = _row_vector(step.value, end.var, dim)
        if vector is not None:
            graph.pending.add(end.var)
            end, found[op] = step, vector
    scale, shift = found.get("multiply"), found.get("add")
    args: tuple[g.Expr, ...] = (x,)
    if shift is not None and scale is None:  # layer_norm takes a bias only after a scale
        scale = g.Constant(np.ones(shift.data.shape, shift.data.dtype))
        wo.record(scale.data, wo.LITERAL)
    if scale is not None:
        args = (x, scale) if shift is None else (x, scale, shift)
    return g.Binding(end.var, g.Call("layer_norm", args, {"axis": -1, "epsilon": eps},
                                     end.var.type))


def _row_vector(call: g.Expr, v: g.Var, dim: int) -> g.Constant | None:
    """The constant `call` combines `v` with, when it is a vector over the last axis."""
    assert isinstance(call, g.Call)
    a, c = call.args
    other = c if a is v else a
    if not isinstance(other, g.Constant) or other.type.dtype != call.ret_type.dtype:  # type: ignore[union-attr]
        return None
    data = other.data
    if data.size != dim or any(d != 1 for d in data.shape[:-1]) or data.shape[-1:] != (dim,):
        return None
    vector = g.Constant(data.reshape(dim), other.name)
    wo.record(vector.data, wo.step("reshape", wo.origin_of(data), shape=(dim,)))
    return vector


def _products_for_power(graph: _Graph, b: g.Binding) -> list[g.Binding] | None:
    """`x * x` or `x * x * x` for `pow(x, 2|3)` with the result's shape."""
    call = graph.call(b.var, "power")
    n = _small_power(call) if call is not None else None
    if call is None or n is None or not _same_shape(call.args[0], b.var):
        return None
    x = call.args[0]
    if n == 2:
        return [g.Binding(b.var, g.Call("multiply", (x, x), {}, b.var.type))]
    square = g.Var(f"{b.var.name}_sq", b.var.type)
    return [g.Binding(square, g.Call("multiply", (x, x), {}, b.var.type)),
            g.Binding(b.var, g.Call("multiply", (square, x), {}, b.var.type))]


def _scaled_matmul(graph: _Graph, b: g.Binding, replaced: Mapping[g.Var, Any]
                   ) -> list[g.Binding] | None:
    """`matmul(a, c) * (s t)` for `matmul(a * s, c * t)` with scalar constants `s`, `t`
    (either may be absent): attention's scaled queries and keys. The product is then
    scaled in the matrix product's epilogue instead of by a kernel per operand. An
    operand `replaced` by a composite (a GELU's `... * 0.5`) keeps it: taking its scale
    would make the product read the spelled-out values again, undoing the match."""
    call = graph.call(b.var, "matmul")
    if call is None or len(call.args) != 2 or not isinstance(b.var.type, TensorType) or \
            not is_float(b.var.type.dtype):
        return None
    scale, args = 1.0, []
    factors: list[wo.Origin | None] = []  # the replay of `scale` (Module.swap_weights)
    for operand in call.args:
        alone = graph.uses[operand] == 1 and operand not in replaced  # type: ignore[index]
        mul = graph.call(operand, "multiply") if alone else None
        x, s = mul.args if mul is not None else (operand, operand)
        if _scalar(x) is not None:
            x, s = s, x
        factor = _scalar(s)
        if mul is None or factor is None or x.type != operand.type:
            args.append(operand)
            continue
        scale *= factor
        assert isinstance(s, g.Constant)  # `_scalar` took its value
        factors.append(wo.step("reshape", wo.step("astype", wo.operand(s.data), dtype="float64"),
                               shape=()))
        args.append(x)
    if all(a is o for a, o in zip(args, call.args)):
        return None
    out = b.var.type
    product = g.Var(f"{b.var.name}_unscaled", out)
    factor_const = g.Constant(np.array(scale, out.dtype))
    replay = factors[0]
    for f in factors[1:]:
        replay = wo.apply("multiply", [replay, f], "float64")
    wo.record(factor_const.data, wo.step("astype", replay, dtype=factor_const.data.dtype.name))
    return [g.Binding(product, g.Call("matmul", tuple(args), call.attrs, out)),
            g.Binding(b.var, g.Call("multiply", (product, factor_const), {}, out))]

"""Reductions and normalisations: reduce_{sum,mean,max,min,prod,l2}, softmax, log_softmax,
layer_norm. `axes` are non-negative and sorted (the frontend normalises them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.tensor import Cast, PrimExpr, intrin
from kiln.ir.types import TensorType, Type
from kiln.ops import te
from kiln.ops.onnx_map import Converter, GraphContext, onnx_op
from kiln.ops.registry import register_op

Attrs = Mapping[str, Any]


def norm_axes(axes: Any, ndim: int) -> tuple[int, ...]:
    """Axes as sorted non-negative ints; None means all axes."""
    if axes is None:
        return tuple(range(ndim))
    items = axes if isinstance(axes, (tuple, list)) else (axes,)
    out = []
    for a in items:
        a = int(a)
        if not -ndim <= a < ndim:
            raise IRError(f"axis {a} is out of range for a {ndim}-d tensor")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise IRError(f"repeated axis in {tuple(items)}")
    return tuple(sorted(out))


def _reduced_shape(shape: Sequence[int], axes: Sequence[int], keepdims: bool) -> tuple[int, ...]:
    return tuple(1 if k in axes else d for k, d in enumerate(shape)
                 if keepdims or k not in axes)


def _compute_dtype(dtype: str) -> str:
    return "float32" if dtype in ("float16", "bfloat16") else dtype


def _register_reduce(name: str, kind: str, post: Callable[[PrimExpr, int], PrimExpr] | None,
                     pre: Callable[[PrimExpr], PrimExpr] | None,
                     ref: Callable[..., np.ndarray]) -> None:
    def infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
        x = types[0]
        axes = norm_axes(attrs.get("axes"), x.ndim)
        return TensorType(_reduced_shape(x.shape, axes, bool(attrs.get("keepdims", True))),  # type: ignore[arg-type]
                          x.dtype)

    def compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
        (x,) = inputs
        axes = norm_axes(attrs.get("axes"), x.ndim)
        keep = bool(attrs.get("keepdims", True))
        out_shape = _reduced_shape(x.shape, axes, keep)
        extents = tuple(x.shape[a] for a in axes)
        count = int(np.prod(extents)) if extents else 1
        acc = _compute_dtype(x.dtype)

        def element(*i: PrimExpr) -> PrimExpr:
            kept = iter(i)
            outer: list[PrimExpr | None] = []
            for k in range(x.ndim):
                if k in axes:
                    if keep:
                        next(kept)
                    outer.append(None)
                else:
                    outer.append(next(kept))

            def body(*r: PrimExpr) -> PrimExpr:
                rit = iter(r)
                idx = tuple(next(rit) if o is None else o for o in outer)
                v = x[idx]
                v = v if v.dtype == acc else Cast(acc, v)
                return pre(v) if pre else v

            total = te.reduce(kind, body, extents, acc)
            total = post(total, count) if post else total
            return total if acc == x.dtype else Cast(x.dtype, total)

        return te.compute(out_shape, element, x.dtype, name)

    def reference(x: np.ndarray, **attrs: Any) -> np.ndarray:
        axes = norm_axes(attrs.get("axes"), x.ndim)
        keep = bool(attrs.get("keepdims", True))
        return np.asarray(ref(x, axis=axes, keepdims=keep)).astype(x.dtype)

    register_op(name, pattern="reduce", infer=infer, compute=compute, reference=reference)


def _mean_post(total: PrimExpr, count: int) -> PrimExpr:
    return total / count


_register_reduce("reduce_sum", "sum", None, None, np.sum)
_register_reduce("reduce_mean", "sum", _mean_post, None, np.mean)
_register_reduce("reduce_max", "max", None, None, np.max)
_register_reduce("reduce_min", "min", None, None, np.min)
_register_reduce("reduce_prod", "prod", None, None, np.prod)
_register_reduce("reduce_l2", "sum", lambda t, n: intrin("sqrt", t), lambda v: v * v,
                 lambda x, axis, keepdims: np.sqrt(np.sum(x.astype(np.float64) ** 2, axis=axis,
                                                          keepdims=keepdims)))


# --------------------------------------------------------------------------- softmax

def _same_type(types: Sequence[TensorType], attrs: Attrs) -> Type:
    norm_axes(attrs.get("axis", -1), types[0].ndim)
    return types[0]


def _softmax_compute(log: bool) -> Callable[[Sequence[te.Tensor], Attrs], te.Tensor]:
    def compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
        (x,) = inputs
        (axis,) = norm_axes(attrs.get("axis", -1), x.ndim)
        n = x.shape[axis]
        acc = _compute_dtype(x.dtype)
        outer = tuple(d for k, d in enumerate(x.shape) if k != axis)

        def at(i: Sequence[PrimExpr], r: PrimExpr) -> PrimExpr:
            idx = list(i)
            idx.insert(axis, r)
            v = x[tuple(idx)]
            return v if v.dtype == acc else Cast(acc, v)

        mx = te.compute(outer, lambda *i: te.reduce("max", lambda r: at(i, r), (n,), acc),
                        acc, "row_max", materialize=True)
        total = te.compute(outer, lambda *i: te.reduce(
            "sum", lambda r: intrin("exp", at(i, r) - mx[i]), (n,), acc),
            acc, "row_sum", materialize=True)

        def element(*i: PrimExpr) -> PrimExpr:
            rest = i[:axis] + i[axis + 1:]
            shifted = at(rest, i[axis]) - mx[rest]
            v = shifted - intrin("log", total[rest]) if log else \
                intrin("exp", shifted) / total[rest]
            return v if acc == x.dtype else Cast(x.dtype, v)

        return te.compute(x.shape, element, x.dtype, "log_softmax" if log else "softmax")

    return compute


def _softmax_ref(x: np.ndarray, axis: int = -1, **attrs: Any) -> np.ndarray:
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


def _log_softmax_ref(x: np.ndarray, axis: int = -1, **attrs: Any) -> np.ndarray:
    x64 = x.astype(np.float64)
    s = x64 - x64.max(axis=axis, keepdims=True)
    return (s - np.log(np.exp(s).sum(axis=axis, keepdims=True))).astype(x.dtype)


register_op("softmax", pattern="opaque", infer=_same_type, compute=_softmax_compute(False),
            reference=_softmax_ref)
register_op("log_softmax", pattern="opaque", infer=_same_type, compute=_softmax_compute(True),
            reference=_log_softmax_ref)


# --------------------------------------------------------------------------- layer norm

def _layer_norm_infer(types: Sequence[TensorType], attrs: Attrs) -> Type:
    x = types[0]
    axis = norm_axes(attrs.get("axis", -1), x.ndim)[0]
    norm_shape = tuple(x.shape[axis:])
    for t in types[1:]:
        if len(t.shape) > len(norm_shape) or \
                tuple(t.shape) != norm_shape[len(norm_shape) - len(t.shape):]:
            raise IRError(f"layer_norm: scale/bias shape {t.shape} does not fit {norm_shape}")
    return x


def _layer_norm_compute(inputs: Sequence[te.Tensor], attrs: Attrs) -> te.Tensor:
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    axis = norm_axes(attrs.get("axis", -1), x.ndim)[0]
    eps = float(attrs.get("epsilon", 1e-5))
    acc = _compute_dtype(x.dtype)
    outer = x.shape[:axis]
    inner = x.shape[axis:]
    count = int(np.prod(inner))

    def at(o: Sequence[PrimExpr], r: Sequence[PrimExpr]) -> PrimExpr:
        v = x[tuple(o) + tuple(r)]
        return v if v.dtype == acc else Cast(acc, v)

    mean = te.compute(outer, lambda *o: te.reduce("sum", lambda *r: at(o, r), inner, acc)
                      / count, acc, "mean", materialize=True)
    var = te.compute(outer, lambda *o: te.reduce(
        "sum", lambda *r: (at(o, r) - mean[o]) * (at(o, r) - mean[o]), inner, acc) / count,
        acc, "var", materialize=True)

    def element(*i: PrimExpr) -> PrimExpr:
        o, r = i[:axis], i[axis:]
        norm = (at(o, r) - mean[o]) * intrin("rsqrt", var[o] + eps)
        s = scale[r[len(r) - scale.ndim:]]
        v = norm * (s if s.dtype == acc else Cast(acc, s))
        if bias is not None:
            b = bias[r[len(r) - bias.ndim:]]
            v = v + (b if b.dtype == acc else Cast(acc, b))
        return v if acc == x.dtype else Cast(x.dtype, v)

    return te.compute(x.shape, element, x.dtype, "layer_norm")


def _layer_norm_ref(x: np.ndarray, scale: np.ndarray, bias: np.ndarray | None = None,
                    **attrs: Any) -> np.ndarray:
    axis = norm_axes(attrs.get("axis", -1), x.ndim)[0]
    axes = tuple(range(axis, x.ndim))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    var = ((x64 - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x64 - mean) / np.sqrt(var + float(attrs.get("epsilon", 1e-5))) * scale
    if bias is not None:
        y = y + bias
    return y.astype(x.dtype)


register_op("layer_norm", pattern="opaque", infer=_layer_norm_infer,
            compute=_layer_norm_compute, reference=_layer_norm_ref)


# --------------------------------------------------------------------------- ONNX mapping

ONNX_REDUCE = {
    "ReduceSum": ("reduce_sum", 13), "ReduceMean": ("reduce_mean", 18),
    "ReduceMax": ("reduce_max", 18), "ReduceMin": ("reduce_min", 18),
    "ReduceProd": ("reduce_prod", 18), "ReduceL2": ("reduce_l2", 18),
}


def _reduce_converter(op: str, axes_input_since: int) -> Converter:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        x = inputs[0]
        assert x is not None
        ndim = ctx.tensor_type(x).ndim
        axes: Any = attrs.get("axes")
        if ctx.opset >= axes_input_since and len(inputs) > 1 and inputs[1] is not None:
            known = ctx.value(inputs[1])
            if known is None:
                raise IRError(f"{op}: axes must be a constant")
            axes = tuple(int(a) for a in known.reshape(-1))
        if axes is not None and len(axes) == 0:
            axes = None
        if axes is None and attrs.get("noop_with_empty_axes", 0):
            return [ctx.call("copy", x)]
        return [ctx.call(op, x, axes=norm_axes(axes, ndim),
                         keepdims=bool(attrs.get("keepdims", 1)))]
    return convert


for _onnx, (_kiln, _since) in ONNX_REDUCE.items():
    onnx_op(_onnx)(_reduce_converter(_kiln, _since))


def _softmax_converter(op: str) -> Converter:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        x = inputs[0]
        assert x is not None
        t = ctx.tensor_type(x)
        if ctx.opset >= 13:
            return [ctx.call(op, x, axis=norm_axes(attrs.get("axis", -1), t.ndim)[0])]
        # Before opset 13 the input is coerced to 2-D at `axis` (default 1).
        (axis,) = norm_axes(attrs.get("axis", 1), t.ndim)
        shape = t.static_shape
        rows = int(np.prod(shape[:axis]))
        flat = ctx.call("reshape", x, shape=(rows, int(np.prod(shape[axis:]))))
        y = ctx.call(op, flat, axis=1)
        return [ctx.call("reshape", y, shape=shape)]
    return convert


onnx_op("Softmax")(_softmax_converter("softmax"))
onnx_op("LogSoftmax")(_softmax_converter("log_softmax"))


@onnx_op("LayerNormalization")
def _layer_norm_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                     attrs: dict[str, Any]) -> list[g.Expr]:
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    assert x is not None and scale is not None
    args = [x, scale] if bias is None else [x, scale, bias]
    return [ctx.call("layer_norm", *args, axis=int(attrs.get("axis", -1)),
                     epsilon=float(attrs.get("epsilon", 1e-5)))]

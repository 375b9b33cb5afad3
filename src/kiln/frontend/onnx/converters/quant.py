"""ONNX converters of quantized models (docs/quantization.md): the QDQ form
(QuantizeLinear/DequantizeLinear), the QOperator form (QLinearConv, QLinearMatMul and
onnxruntime's com.microsoft QGemm, QLinearAdd, QLinearMul, QLinearGlobalAveragePool,
QLinearAveragePool, QLinearConcat, QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax,
QLinearWhere) and dynamic quantization
(DynamicQuantizeLinear, MatMulInteger, ConvInteger).

The integer products map to the integer ops of kiln.ops.quant, QLinearAdd/QLinearMul to
kiln.ops.quant_elementwise and QLinearGlobalAveragePool to kiln.ops.quant_pool
(onnxruntime's formulas); the other elementwise QOperator ops are dequantize -> float op
-> quantize. What kiln cannot run
exactly (4-bit, 2-bit and float8 types, per-row zero points of MatMulInteger's A) is
refused with an IRError, which the importer reports naming the node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.frontend.onnx.converters.registry import GraphContext, converters, onnx_op
from kiln.frontend.onnx.converters.spatial import nonempty_image, onnx_pads
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir.shape_expr import shape_text
from kiln.ops import spatial
from kiln.ops.quant import PRODUCT_DTYPES, QUANT_DTYPES
from kiln.ops.quant_softmax import MAX_MULTIPLIER, softmax_multiplier, softmax_table

MS = "com.microsoft."

# ONNX TensorProto element types of quantized data kiln refuses, by name (onnx.TensorProto).
_REFUSED_TYPES = {16: "bfloat16", 17: "float8e4m3fn", 18: "float8e4m3fnuz", 19: "float8e5m2",
                  20: "float8e5m2fnuz", 21: "uint4", 22: "int4", 23: "float4e2m1",
                  24: "float8e8m0", 25: "uint2", 26: "int2"}
_ELEM_TYPES = {2: "uint8", 3: "int8", 4: "uint16", 5: "int16"}


def _refuse_type(what: str) -> IRError:
    return IRError(f"{what} is not supported: kiln runs int8, uint8, int16 and uint16 "
                   "quantization (4-bit, 2-bit and float8 types are refused rather than run "
                   "in float, which would change the results)")


def _check_qdtype(dtype: str, what: str, allowed: Sequence[str] = QUANT_DTYPES) -> None:
    if dtype not in allowed:
        raise _refuse_type(f"{what} of type {dtype}")


def _check_scale(ctx: GraphContext, scale: g.Expr, what: str) -> None:
    """Refuse a constant scale that a value is divided by, or that a product is
    requantized with, when it is 0, infinite or NaN: the spec's arithmetic then divides
    by zero or rounds NaN, which every runtime does its own way, so no result would be
    right. (DequantizeLinear only multiplies by its scale: any float is defined there.)"""
    value = ctx.value(scale)
    if value is None:
        return
    bad = np.asarray(value, np.float64).ravel()
    bad = bad[~np.isfinite(bad) | (bad == 0)]
    if bad.size:
        raise IRError(f"{what} {float(bad[0])}: a quantization scale must be a finite number "
                      "other than 0")


def _scalarize(ctx: GraphContext, expr: g.Expr) -> g.Expr:
    """A one-element 1-D tensor as a scalar (ONNX allows both for per-tensor parameters)."""
    shape = tuple(ctx.tensor_type(expr).shape)
    if shape == (1,):
        return ctx.call("reshape", expr, shape=())
    return expr


def _zero_point(ctx: GraphContext, zp: g.Expr | None, scale: g.Expr, dtype: str) -> g.Expr:
    """The zero point input, or zeros of `dtype` shaped like the scale when it is omitted."""
    if zp is not None:
        return _scalarize(ctx, zp)
    shape = ctx.tensor_type(scale).static_shape
    return ctx.const(np.zeros(shape, dtype=dt.to_numpy(dtype)))


def _axis_attrs(ctx: GraphContext, attrs: dict[str, Any], x: g.Expr,
                scale: g.Expr) -> dict[str, Any]:
    ndim = ctx.tensor_type(x).ndim
    out: dict[str, Any] = {}
    if ctx.tensor_type(scale).ndim:
        axis = int(attrs.get("axis", 1))
        if not -ndim <= axis < ndim:
            raise IRError(f"axis {axis} is out of range for rank {ndim}")
        out["axis"] = axis % ndim
    block = int(attrs.get("block_size", 0))
    if block:
        out["block_size"] = block
    return out


def quantize(ctx: GraphContext, x: g.Expr, scale: g.Expr, zp: g.Expr,
             **attrs: Any) -> g.Expr:
    """A `quantize_linear` call (float x, zero point of the output type)."""
    return ctx.call("quantize_linear", x, scale, zp, **attrs)


def dequantize(ctx: GraphContext, x: g.Expr, scale: g.Expr, zp: g.Expr | None,
               **attrs: Any) -> g.Expr:
    """A `dequantize_linear` call (a missing zero point is zero)."""
    scale = _scalarize(ctx, scale)
    return ctx.call("dequantize_linear", x, scale,
                    _zero_point(ctx, zp, scale, ctx.tensor_type(x).dtype), **attrs)


# --------------------------------------------------------------------------- QDQ

@onnx_op("QuantizeLinear", min_opset=10)
def _quantize_linear(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                     attrs: dict[str, Any]) -> list[g.Expr]:
    x, scale = inputs[0], inputs[1]
    assert x is not None and scale is not None
    zp = inputs[2] if len(inputs) > 2 else None
    if "output_dtype" in attrs and int(attrs["output_dtype"]):
        code = int(attrs["output_dtype"])
        if code not in _ELEM_TYPES:
            raise _refuse_type(f"output_dtype {_REFUSED_TYPES.get(code, code)}")
        dtype = _ELEM_TYPES[code]
        if zp is not None and ctx.tensor_type(zp).dtype != dtype:
            raise IRError(f"output_dtype {dtype} differs from the zero point's type "
                          f"{ctx.tensor_type(zp).dtype}")
    else:
        dtype = ctx.tensor_type(zp).dtype if zp is not None else "uint8"
    _check_qdtype(dtype, "quantizing to a zero point")
    if not dt.is_float(ctx.tensor_type(x).dtype):
        raise IRError(f"QuantizeLinear of {ctx.tensor_type(x).dtype} input: the input must "
                      "be a float tensor")
    _check_scale(ctx, scale, "the scale")
    scale = _scalarize(ctx, scale)
    zp_expr = _zero_point(ctx, zp, scale, dtype)
    return [quantize(ctx, x, scale, zp_expr, **_axis_attrs(ctx, attrs, x, scale))]


@onnx_op("DequantizeLinear", min_opset=10)
def _dequantize_linear(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                       attrs: dict[str, Any]) -> list[g.Expr]:
    x, scale = inputs[0], inputs[1]
    assert x is not None and scale is not None
    zp = inputs[2] if len(inputs) > 2 else None
    _check_qdtype(ctx.tensor_type(x).dtype, "dequantizing an input",
                  (*QUANT_DTYPES, "int32"))
    scale = _scalarize(ctx, scale)
    return [dequantize(ctx, x, scale, zp, **_axis_attrs(ctx, attrs, x, scale))]


# --------------------------------------------------------------------------- dynamic

@onnx_op("DynamicQuantizeLinear", min_opset=11)
def _dynamic_quantize_linear(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                             attrs: dict[str, Any]) -> list[g.Expr]:
    x = inputs[0]
    assert x is not None
    t = ctx.call("dynamic_quantize_linear", x)
    return [ctx.item(t, k) for k in range(3)]


def _product_zp(ctx: GraphContext, zp: g.Expr | None, operand: g.Expr, what: str,
                per_channel: int | None) -> g.Expr:
    """A zero point of an integer product: a scalar, or one per output channel/column."""
    dtype = ctx.tensor_type(operand).dtype
    _check_qdtype(dtype, what, PRODUCT_DTYPES)
    if zp is None:
        return ctx.const(np.zeros((), dt.to_numpy(dtype)))
    zp = _scalarize(ctx, zp)
    shape = tuple(ctx.tensor_type(zp).shape)
    if shape == () or (per_channel is not None and shape == (per_channel,)):
        return zp
    value = ctx.value(zp)
    if value is not None and value.size and np.all(value == value.reshape(-1)[0]):
        return ctx.const(value.reshape(-1)[0])
    raise IRError(f"the zero point of {what} has shape {shape}: kiln supports a scalar"
                  + (f" or one per output channel ({per_channel})" if per_channel else "")
                  + " (per-row zero points of A are not supported)")


def _n_columns(ctx: GraphContext, b: g.Expr, transpose_b: bool = False) -> int:
    shape = ctx.tensor_type(b).static_shape
    if len(shape) < 2:
        return 1
    return shape[-2] if transpose_b else shape[-1]


@onnx_op("MatMulInteger", min_opset=10)
def _matmul_integer(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                    attrs: dict[str, Any]) -> list[g.Expr]:
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    a_zp = _product_zp(ctx, inputs[2] if len(inputs) > 2 else None, a, "A", None)
    b_zp = _product_zp(ctx, inputs[3] if len(inputs) > 3 else None, b, "B", _n_columns(ctx, b))
    return [ctx.call("matmul_integer", a, b, a_zp, b_zp)]


def conv_attrs(ctx: GraphContext, x: g.Expr, w: g.Expr, attrs: dict[str, Any],
               what: str) -> dict[str, Any]:
    """The kiln attributes of an ONNX convolution node (pads resolved from auto_pad)."""
    xt, wt = ctx.tensor_type(x), ctx.tensor_type(w)
    rank = spatial.spatial_rank(xt.shape, what)
    kernel = tuple(int(k) for k in attrs.get("kernel_shape", wt.static_shape[2:]))
    if kernel != wt.static_shape[2:]:
        raise IRError(f"kernel_shape {kernel} does not match the weight {wt.static_shape}")
    strides = spatial.ints(attrs, "strides", rank, 1)
    dilations = spatial.ints(attrs, "dilations", rank, 1)
    pads = onnx_pads(attrs, xt.shape[2:], kernel, strides, dilations)
    return {"group": int(attrs.get("group", 1)), "strides": strides, "dilations": dilations,
            "pads": pads}


@onnx_op("ConvInteger", min_opset=10)
def _conv_integer(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr]:
    x, w = inputs[0], inputs[1]
    assert x is not None and w is not None
    out_channels = ctx.tensor_type(w).static_shape[0]
    x_zp = _product_zp(ctx, inputs[2] if len(inputs) > 2 else None, x, "X", None)
    w_zp = _product_zp(ctx, inputs[3] if len(inputs) > 3 else None, w, "W", out_channels)
    return [nonempty_image(ctx, ctx.call("conv_integer", x, w, x_zp, w_zp,
                                         **conv_attrs(ctx, x, w, attrs, "ConvInteger")),
                           "ConvInteger")]


# --------------------------------------------------------------------------- QOperator products

def _f32(ctx: GraphContext, expr: g.Expr | None, what: str) -> g.Expr:
    """A QOperator node's scale `expr` as float32 (checked: `_check_scale`)."""
    if expr is None:
        raise IRError(f"{what} is missing")
    _check_scale(ctx, expr, what)
    expr = _scalarize(ctx, expr)
    if ctx.tensor_type(expr).dtype != "float32":
        expr = ctx.call("cast", expr, dtype="float32")
    return expr


def _multiplier(ctx: GraphContext, in_scale: g.Expr | None, w_scale: g.Expr | None,
                out_scale: g.Expr | None, alpha: float = 1.0) -> g.Expr:
    """`(alpha *) in_scale * w_scale / out_scale` in float32, left to right, as
    onnxruntime computes a requantizing product's output scale: a constant when the
    scales are (the importer folds it), else computed at run time."""
    a = _f32(ctx, in_scale, "the input scale")
    if alpha != 1.0:
        a = ctx.call("multiply", ctx.const(np.asarray(alpha, np.float32)), a)
    w = _f32(ctx, w_scale, "the weight scale")
    y = _f32(ctx, out_scale, "the output scale")
    if ctx.tensor_type(y).ndim:
        raise IRError("the output scale and zero point must be per-tensor (one value)")
    return ctx.call("divide", ctx.call("multiply", a, w), y)


def _bias(ctx: GraphContext, bias: g.Expr | None, n: int) -> g.Expr:
    if bias is None:
        return ctx.const(np.zeros((n,), np.int32))
    if ctx.tensor_type(bias).dtype != "int32":
        raise IRError(f"the bias must be int32, got {ctx.tensor_type(bias).dtype}")
    return bias


def _out_zp(ctx: GraphContext, zp: g.Expr | None) -> g.Expr:
    """The output zero point of a requantizing op (uint8 zero when omitted)."""
    if zp is None:
        return ctx.const(np.zeros((), np.uint8))
    zp = _scalarize(ctx, zp)
    t = ctx.tensor_type(zp)
    _check_qdtype(t.dtype, "the output zero point", PRODUCT_DTYPES)
    if t.ndim:
        raise IRError("the output scale and zero point must be per-tensor (one value)")
    return zp


@onnx_op("QLinearConv", min_opset=10)
def _qlinear_conv(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                  attrs: dict[str, Any]) -> list[g.Expr]:
    x, xs, xz, w, ws, wz, ys, yz = inputs[:8]
    bias = inputs[8] if len(inputs) > 8 else None
    assert x is not None and w is not None and ys is not None
    out_channels = ctx.tensor_type(w).static_shape[0]
    call = ctx.call("qlinear_conv", x, w, _bias(ctx, bias, out_channels),
                    _product_zp(ctx, xz, x, "x", None),
                    _product_zp(ctx, wz, w, "w", out_channels), _multiplier(ctx, xs, ws, ys),
                    _out_zp(ctx, yz), **conv_attrs(ctx, x, w, attrs, "QLinearConv"))
    return [nonempty_image(ctx, call, "QLinearConv")]


@onnx_op("QLinearMatMul", min_opset=10)
def _qlinear_matmul(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                    attrs: dict[str, Any]) -> list[g.Expr]:
    a, as_, az, b, bs, bz, ys, yz = inputs[:8]
    assert a is not None and b is not None and ys is not None
    n = _n_columns(ctx, b)
    return [ctx.call("qlinear_matmul", a, b, _bias(ctx, None, n),
                     _product_zp(ctx, az, a, "a", None), _product_zp(ctx, bz, b, "b", n),
                     _multiplier(ctx, as_, bs, ys), _out_zp(ctx, yz))]


@onnx_op(MS + "QGemm")
def _qgemm(ctx: GraphContext, inputs: Sequence[g.Expr | None],
           attrs: dict[str, Any]) -> list[g.Expr]:
    a, as_, az, b, bs, bz = inputs[:6]
    c = inputs[6] if len(inputs) > 6 else None
    ys = inputs[7] if len(inputs) > 7 else None
    yz = inputs[8] if len(inputs) > 8 else None
    assert a is not None and b is not None
    if int(attrs.get("transA", 0)):
        a = ctx.call("transpose", a, perm=(1, 0))
    trans_b = bool(int(attrs.get("transB", 0)))
    n = _n_columns(ctx, b, trans_b)
    alpha = float(np.float32(attrs.get("alpha", 1.0)))
    a_zp = _product_zp(ctx, az, a, "A", None)
    b_zp = _product_zp(ctx, bz, b, "B", n)
    extra = {"transpose_b": True} if trans_b else {}
    if ys is None:
        # Float output: (A - a_zp)(B - b_zp) + C, scaled by alpha * a_scale * b_scale.
        acc = ctx.call("matmul_integer", a, b, a_zp, b_zp, **extra)
        if c is not None:
            acc = ctx.call("add", acc, _bias(ctx, c, n))
        scale = _multiplier(ctx, as_, bs, ctx.const(np.asarray(1.0, np.float32)), alpha)
        return [ctx.call("multiply", ctx.call("cast", acc, dtype="float32"), scale)]
    return [ctx.call("qlinear_matmul", a, b, _bias(ctx, c, n), a_zp, b_zp,
                     _multiplier(ctx, as_, bs, ys, alpha), _out_zp(ctx, yz), **extra)]


# --------------------------------------------------------------------------- QOperator elementwise

def _requant_out(ctx: GraphContext, y: g.Expr, ys: g.Expr | None, yz: g.Expr | None) -> g.Expr:
    assert ys is not None
    scale = _scalarize(ctx, ys)
    return quantize(ctx, y, scale, _out_zp(ctx, yz))


def _binary_inputs(ctx: GraphContext, inputs: Sequence[g.Expr | None]) -> tuple[Any, ...]:
    a, as_, az, b, bs, bz, cs = inputs[:7]
    cz = inputs[7] if len(inputs) > 7 else None
    assert a is not None and b is not None
    for x in (a, b):
        _check_qdtype(ctx.tensor_type(x).dtype, "a QLinear input", PRODUCT_DTYPES)
    dtype = ctx.tensor_type(a).dtype
    zero = ctx.const(np.zeros((), dt.to_numpy(dtype)))
    az_, bz_ = (zero if z is None else _scalarize(ctx, z) for z in (az, bz))
    cz_ = zero if cz is None else _out_zp(ctx, cz)
    return (a, _f32(ctx, as_, "A_scale"), az_, b, _f32(ctx, bs, "B_scale"), bz_,
            _f32(ctx, cs, "C_scale"), cz_)


@onnx_op(MS + "QLinearAdd")
def _qlinear_add(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                 attrs: dict[str, Any]) -> list[g.Expr]:
    # onnxruntime's MLAS formula (kiln.ops.quant_elementwise), not dequantize-add-quantize
    return [ctx.call("qlinear_add", *_binary_inputs(ctx, inputs))]


@onnx_op(MS + "QLinearMul")
def _qlinear_mul(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                 attrs: dict[str, Any]) -> list[g.Expr]:
    return [ctx.call("qlinear_mul", *_binary_inputs(ctx, inputs))]


def _unary(op: str, **fixed: Any) -> Any:
    def convert(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                attrs: dict[str, Any]) -> list[g.Expr]:
        x, xs, xz, ys = inputs[:4]
        yz = inputs[4] if len(inputs) > 4 else None
        assert x is not None and xs is not None
        extra = {k: float(attrs.get(k, v)) for k, v in fixed.items()}
        y = ctx.call(op, dequantize(ctx, x, xs, xz), **extra)
        return [_requant_out(ctx, y, ys, yz)]
    return convert


onnx_op(MS + "QLinearSigmoid")(_unary("sigmoid"))
onnx_op(MS + "QLinearLeakyRelu")(_unary("leaky_relu", alpha=0.01))


@onnx_op(MS + "QLinearGlobalAveragePool")
def _qlinear_global_average_pool(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                                 attrs: dict[str, Any]) -> list[g.Expr]:
    # onnxruntime's MLAS formula (kiln.ops.quant_pool): an int32 sum, requantized
    x, xs, xz, ys = inputs[:4]
    yz = inputs[4] if len(inputs) > 4 else None
    assert x is not None
    _check_qdtype(ctx.tensor_type(x).dtype, "a QLinear input", PRODUCT_DTYPES)
    zero = ctx.const(np.zeros((), dt.to_numpy(ctx.tensor_type(x).dtype)))
    x_zp = zero if xz is None else _scalarize(ctx, xz)
    last = {"channels_last": 1} if int(attrs.get("channels_last", 0)) else {}
    return [ctx.call("qlinear_global_average_pool", x, _f32(ctx, xs, "x_scale"), x_zp,
                     _f32(ctx, ys, "y_scale"), zero if yz is None else _out_zp(ctx, yz),
                     **last)]


@onnx_op(MS + "QLinearAveragePool")
def _qlinear_average_pool(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                          attrs: dict[str, Any]) -> list[g.Expr]:
    # onnxruntime: the dequantized floats averaged as AveragePool does, then rounded with
    # the zero point added first (quantize_linear's `zero_point_first`)

    x, xs, xz, ys = inputs[:4]
    yz = inputs[4] if len(inputs) > 4 else None
    assert x is not None and xs is not None and ys is not None
    _check_qdtype(ctx.tensor_type(x).dtype, "a QLinear input", PRODUCT_DTYPES)
    f = dequantize(ctx, x, xs, xz)
    rank = ctx.tensor_type(x).ndim
    last = bool(int(attrs.get("channels_last", 0)))
    if last:  # the pooling converter takes channels first
        f = ctx.call("transpose", f, perm=(0, rank - 1, *range(1, rank - 1)))
    pool_attrs = {k: v for k, v in attrs.items() if k != "channels_last"}
    y = converters().get("AveragePool").fn(ctx, [f], pool_attrs)[0]
    if last:
        y = ctx.call("transpose", y, perm=(0, *range(2, rank), 1))
    return [quantize(ctx, y, _scalarize(ctx, ys), _out_zp(ctx, yz), zero_point_first=True)]


@onnx_op(MS + "QLinearConcat")
def _qlinear_concat(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                    attrs: dict[str, Any]) -> list[g.Expr]:
    ys, yz = inputs[0], inputs[1]
    rest = inputs[2:]
    if not rest or len(rest) % 3:
        raise IRError(f"QLinearConcat takes Y_scale, Y_zero_point and (tensor, scale, zero "
                      f"point) triples, got {len(inputs)} inputs")
    parts = []
    for k in range(0, len(rest), 3):
        x, xs, xz = rest[k:k + 3]
        assert x is not None and xs is not None
        parts.append(dequantize(ctx, x, xs, xz))
    y = ctx.call("concat", *parts, axis=int(attrs["axis"]))
    return [_requant_out(ctx, y, ys, yz)]


@onnx_op(MS + "QLinearSoftmax")
def _qlinear_softmax(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                     attrs: dict[str, Any]) -> list[g.Expr]:
    # onnxruntime's exp table and division (kiln.ops.quant_softmax): built here from the
    # constant scales, uint8 or int8, over rows of static length; anything else is
    # refused, since a float softmax would round differently from onnxruntime's

    x, xs, xz, ys, yz = (list(inputs) + [None] * 5)[:5]
    assert x is not None
    xt = ctx.tensor_type(x)
    opset = int(attrs.get("opset", 13))
    axis = int(attrs.get("axis", -1 if opset >= 13 else 1))
    scales = [ctx.value(s) for s in (xs, ys)]
    zps = [np.zeros((), dt.to_numpy(xt.dtype)) if z is None else ctx.value(z)
           for z in (xz, yz)]
    if xt.dtype not in ("uint8", "int8") or \
            any(z is None or str(z.dtype) != xt.dtype for z in zps):
        raise IRError(f"QLinearSoftmax on {xt.dtype}: kiln runs onnxruntime's uint8 and int8 "
                      "tables, with zero points of the input's type")
    if xt.ndim == 0 or not -xt.ndim <= axis < xt.ndim:
        raise IRError(f"QLinearSoftmax: axis {axis} is out of range for a rank-{xt.ndim} "
                      "input")
    axis %= xt.ndim
    # opset < 13: a row is every dim from `axis` on; opset 13: the one dim `axis`
    row_dims = xt.shape[axis:] if opset < 13 else (xt.shape[axis],)
    if not all(isinstance(d, int) for d in row_dims) or \
            (opset < 13 and not all(isinstance(d, int) for d in xt.shape)):
        raise IRError(f"QLinearSoftmax over axis {axis} of {shape_text(xt.shape)}: kiln "
                      "runs it over rows of static length only")
    if any(s is None or s.size != 1 for s in scales) or \
            any(z is not None and z.size != 1 for z in zps):
        raise IRError("QLinearSoftmax needs constant per-tensor scales and zero points")
    x_scale, y_scale = (float(np.float32(s.reshape(()))) for s in scales)  # type: ignore[union-attr]
    if not (x_scale > 0 and y_scale > 0 and 1 / y_scale <= MAX_MULTIPLIER):
        raise IRError(f"QLinearSoftmax: scales {x_scale} and {y_scale} are outside what "
                      f"kiln reproduces (x_scale > 0, 1 / y_scale <= {MAX_MULTIPLIER})")
    y_zp = np.asarray(zps[1]).reshape(())  # x's zero point cancels in x - max(x)
    row = 1
    for d in row_dims:
        assert isinstance(d, int)
        row *= d
    table = softmax_table(x_scale, row)

    def softmax(v: g.Expr) -> g.Expr:
        return ctx.call("qlinear_softmax", v, ctx.const(table), ctx.const(y_zp),
                        y_multiplier=softmax_multiplier(y_scale))

    if axis == xt.ndim - 1:
        return [softmax(x)]
    if opset < 13:  # the trailing dims as one row, and back
        rows = ctx.call("reshape", x, shape=(*xt.shape[:axis], row))
        return [ctx.call("reshape", softmax(rows), shape=tuple(xt.shape))]
    # opset 13: onnxruntime swaps `axis` with the last dim, and back (its own inverse)
    perm = list(range(xt.ndim))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    swapped = ctx.call("transpose", x, perm=tuple(perm))
    return [ctx.call("transpose", softmax(swapped), perm=tuple(perm))]


@onnx_op(MS + "QLinearWhere")
def _qlinear_where(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                   attrs: dict[str, Any]) -> list[g.Expr]:
    # onnxruntime requantizes each side through a table of quantize(dequantize(v)) (a
    # copy where the parameters agree): the same as selecting the dequantized values
    # and quantizing the choice, which quantize-ops keeps on the integers
    cond, x, xs, xz, y, ys, yz, zs, zz = (list(inputs) + [None] * 9)[:9]
    assert cond is not None and x is not None and y is not None
    for v in (x, y):
        _check_qdtype(ctx.tensor_type(v).dtype, "a QLinearWhere input", PRODUCT_DTYPES)
    assert xs is not None and ys is not None
    chosen = ctx.call("where", cond, dequantize(ctx, x, xs, xz), dequantize(ctx, y, ys, yz))
    return [_requant_out(ctx, chosen, zs, zz)]

"""QuantizeOps: fuse QDQ patterns into integer operators with a requantizing epilogue.

A model quantized in the QDQ format computes its products in float between
DequantizeLinear and QuantizeLinear nodes. This pass rewrites

    quantize_linear([relu|clip](conv(dequantize_linear(x_q), dequantize_linear(w_q)
                                     [, dequantize_linear(bias_i32)])), y_scale, y_zp)

(and the same around `matmul`, with Gemm's bias as an `add`) into one
`qlinear_conv` / `qlinear_matmul` call (kiln.ops.quant): an int32 accumulation of
`(x - x_zp) * (w - w_zp)`, the int32 bias, then `float32(acc) * multiplier` rounded
half to even, saturated and shifted by the output zero point, where `multiplier =
x_scale * w_scale / y_scale` (one per output channel for per-channel weights). A
ReLU or Clip between the product and the QuantizeLinear becomes the output range
(`qmin`/`qmax`): quantization is monotone, so `quantize(relu(v)) = max(quantize(v),
y_zp)` exactly. For the same reason `quantize(max_pool(dequantize(x)))` with one scale
and zero point is `max_pool(x)` on the integers, and the ops that only move elements
(reshape, transpose, gather, slice, a split's part, nearest resize, ...) run on the
integers when the scale and zero point around them are equal. A concat of dequantized
tensors that is quantized becomes `qlinear_concat` (kiln.ops.quant_elementwise),
onnxruntime's QLinearConcat: each input copied or requantized.

onnxruntime runs some other DQ -> op -> Q groups with its own integer kernels, whose
float32 arithmetic differs from dequantize-op-quantize; those become the ops computing
its numbers: uint8 Add/Mul -> `qlinear_add`/`qlinear_mul` (kiln.ops.quant_elementwise),
GlobalAveragePool -> `qlinear_global_average_pool` (kiln.ops.quant_pool), uint8 and int8
Softmax -> `qlinear_softmax` (kiln.ops.quant_softmax), and a uint8 AveragePool's QuantizeLinear
rounds with the zero point added first.

It applies only when the result is the same computation onnxruntime runs for the
pattern (its QDQ transformer makes the same fusion): the scales and zero points are
compile-time constants, the activation is quantized per tensor, the weight is a
constant int8/uint8 tensor quantized per tensor or per output channel, the bias (if
any) is int32 with zero point 0 and scale `x_scale * w_scale`, and the float
intermediates have no other use. Everything else stays as the model wrote it:
dequantize, float op, quantize (fold-constants then folds dequantized constant
weights into float constants).

Dynamic quantization (`quantize_dynamic`) writes `cast(matmul_integer(a_q, b, a_zp, b_zp))
* (a_scale * b_scale) [+ bias]` over a `dynamic_quantize_linear(a)`; with constant weights,
scales and bias the chain becomes one `dynamic_quant_matmul(a, b, b_zp, b_scale, bias)`
(kiln.ops.quant_dynamic), which quantizes A itself and applies the float epilogue as it
stores: the same float32 operations, in the same order.

Then every `qlinear_conv` / `qlinear_matmul` with constant weights (fused here or
imported from QLinearConv/QLinearMatMul/QGemm), and every `matmul_integer` with a
constant B and every `dynamic_quant_matmul` become their packed forms
(kiln.ops.quant_kernels, kiln.ops.quant_dynamic): the weight shifted by its zero
point, the input zero point's correction folded into the int32 bias (or, for a zero
point known only at run time, applied with B's column sums).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.analysis.graph_uses import var_use_counts
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType
from kiln.transform.dead_code import remove_dead_bindings
from kiln.transform.functor import SharedPacking, rewrite_calls
from kiln.transform.pass_base import FunctionPass

_CONVS = ("conv1d", "conv2d", "conv3d")
_PRODUCT_DTYPES = ("int8", "uint8")
_MAX_POOLS = ("max_pool1d", "max_pool2d", "max_pool3d")
_AVG_POOLS = ("avg_pool1d", "avg_pool2d", "avg_pool3d")
#: ops that only move or select elements (onnxruntime drops the Q/DQ pairs around them)
_DATA_MOVEMENT = ("reshape", "transpose", "broadcast_to", "gather", "gather_elements",
                  "strided_slice", "tile", "resize")
#: float binary op -> the integer op onnxruntime runs for DQ, DQ -> op -> Q
_BINARY = {"add": "qlinear_add", "multiply": "qlinear_mul"}
_STARTS = ("quantize_linear", "qlinear_conv", "qlinear_matmul", "matmul_integer")


@dataclass(frozen=True)
class QuantizeOps(FunctionPass):
    """Rewrite DQ -> conv/matmul/gemm [-> relu/clip] -> Q chains into integer ops."""

    name = "quantize-ops"
    level = "graph"

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> g.Function:
        from kiln.ops import quant_kernels

        assert isinstance(func, g.Function)
        if not any(isinstance(b.value, g.Call) and b.value.op in _STARTS
                   for b in func.bindings):
            return func
        from kiln.ops import quant_dynamic

        match = _Matcher({b.var: b.value for b in func.bindings}, var_use_counts(func))
        fused = rewrite_calls(func, match.rewrite)
        if fused is not func:  # the integer products a fused op replaced: not packed
            fused = remove_dead_bindings(fused)
        # weights, zero-point corrections and bias prepared for the kernels
        packed = rewrite_calls(fused, SharedPacking(
            lambda c: quant_kernels.pack(c) or quant_dynamic.pack(c)))
        # the float products and dequantized weights the fused ops replaced
        return packed if packed is func else remove_dead_bindings(packed)


@dataclass(frozen=True)
class _Quant:
    """A per-tensor or per-channel dequantization of a tensor: its input and parameters."""

    data: g.Expr
    scale: np.ndarray
    zero_point: np.ndarray
    axis: int | None  # None: per tensor


def _output_params(q: g.Call) -> tuple[g.Constant, g.Constant]:
    """A per-tensor QuantizeLinear's scale (float32) and zero point, as scalar constants."""
    scale, zp = q.args[1], q.args[2]
    assert isinstance(scale, g.Constant) and isinstance(zp, g.Constant)
    return (g.Constant(np.asarray(scale.data, np.float32).reshape(())),
            g.Constant(np.asarray(zp.data).reshape(())))


def _scalar(e: g.Expr) -> np.ndarray | None:
    if isinstance(e, g.Constant) and e.data.size == 1:
        return e.data.reshape(())
    return None


def _increasing(scale: np.ndarray) -> bool:
    """Whether quantizing or dequantizing with `scale` is an increasing map, as every
    rewrite here assumes (an activation as the output range, a max pool on integers,
    a requantizing multiplier): each value finite and above 0. A model with other
    scales keeps its float ops, computed as the spec writes them."""
    values = np.asarray(scale, np.float64)
    return bool(np.all(np.isfinite(values) & (values > 0)))


class _Matcher:
    def __init__(self, defs: dict[g.Var, g.Expr], uses: Any) -> None:
        self.defs = defs
        self.uses = uses

    def _producer(self, e: g.Expr, single_use: bool) -> g.Call | None:
        if isinstance(e, g.Var):
            if single_use and self.uses[e] != 1:
                return None
            e = self.defs.get(e)  # type: ignore[assignment]
        return e if isinstance(e, g.Call) else None

    def _dequantized(self, e: g.Expr) -> _Quant | None:
        call = self._producer(e, single_use=False)
        if call is None or call.op != "dequantize_linear" or call.attrs.get("block_size"):
            return None
        data, scale, zp = call.args
        if not (isinstance(scale, g.Constant) and isinstance(zp, g.Constant)) \
                or not _increasing(scale.data):
            return None
        axis = call.attrs.get("axis") if scale.data.ndim else None
        return _Quant(data, np.asarray(scale.data, np.float32), zp.data,
                      None if axis is None else int(axis))  # type: ignore[arg-type]

    def rewrite(self, q: g.Call) -> g.Call | None:
        if q.op in ("add", "multiply"):
            return self._dynamic_matmul(q)
        if q.op != "quantize_linear" or q.attrs.get("block_size"):
            return None
        y_scale, y_zp = _scalar(q.args[1]), _scalar(q.args[2])
        if y_scale is None or y_zp is None or str(y_zp.dtype) not in _PRODUCT_DTYPES \
                or not _increasing(y_scale):
            return None
        from kiln.ops.quant import qrange, quantize_ref

        lo, hi = qrange(str(y_zp.dtype))
        part = self._split_part(q.args[0])
        if part is not None:
            return self._on_integers(part, y_scale, y_zp)
        call = self._producer(q.args[0], single_use=True)
        if call is not None and (call.op in _MAX_POOLS or call.op in _DATA_MOVEMENT):
            return self._on_integers(call, y_scale, y_zp)
        if call is not None and call.op == "concat":
            return self._concat(call, q, y_scale, y_zp)
        if call is not None and call.op in ("relu", "clip"):
            # quantization is monotone: the activation becomes the output range
            bounds = (0.0, None) if call.op == "relu" else (call.attrs.get("min"),
                                                            call.attrs.get("max"))
            for k, bound in enumerate(bounds):
                if bound is None:
                    continue
                qb = int(quantize_ref(np.asarray(bound, np.float32), y_scale, y_zp))
                lo, hi = (max(lo, qb), hi) if k == 0 else (lo, min(hi, qb))
            call = self._producer(call.args[0], single_use=True)
        if call is None or lo > hi:
            return None
        # a ReLU/Clip absorbed above must be a no-op after saturation (onnxruntime drops
        # a ReLU before a QuantizeLinear whose zero point is the type's minimum)
        if call.op in _BINARY and (lo, hi) == qrange(str(y_zp.dtype)):
            binary = self._binary(call, q)
            if binary is not None:
                return binary
        if call.op == "global_avg_pool" and (lo, hi) == qrange(str(y_zp.dtype)):
            return self._global_average(call, q)
        if call.op in _AVG_POOLS and (lo, hi) == qrange(str(y_zp.dtype)):
            return self._average_pool(call, q)
        if call.op == "softmax" and (lo, hi) == qrange(str(y_zp.dtype)):
            return self._softmax(call, q, y_scale, y_zp)
        bias: g.Expr | None = None
        if call.op == "add":
            call, bias = self._matmul_and_bias(call)
            if call is None:
                return None
        if call.op in _CONVS and len(call.args) in (2, 3):
            if len(call.args) == 3:
                bias = call.args[2]
            return self._fuse(q, "qlinear_conv", call, bias, 0, lo, hi, y_scale, y_zp)
        if call.op == "matmul" and len(call.args) == 2:
            channel_axis = 0 if call.attrs.get("transpose_b") else 1
            return self._fuse(q, "qlinear_matmul", call, bias, channel_axis, lo, hi,
                              y_scale, y_zp)
        return None

    def _on_integers(self, op: g.Call, y_scale: np.ndarray, y_zp: np.ndarray
                     ) -> g.Call | None:
        """`quantize(op(dequantize(x), ...))` with the same scale and zero point is `op(x,
        ...)` for an op that only moves or selects elements (reshape, transpose, gather,
        ...): quantize(dequantize(x)) = x. For a max pool the scale must be > 0, so that
        dequantization is increasing and the maximum is the same element (`_increasing`,
        as for every rewrite here). onnxruntime's QDQ transformer drops these pairs too."""
        source = self._dequantized(op.args[0])
        if op.op == "resize" and (op.attrs.get("mode", "nearest") != "nearest"
                                  or op.attrs.get("antialias")
                                  or op.attrs.get("coordinate_transformation_mode")
                                  == "tf_crop_and_resize"):
            return None  # interpolates, or writes a float extrapolation value
        if source is None or source.axis is not None \
                or source.scale.reshape(()) != y_scale \
                or source.zero_point.dtype != y_zp.dtype \
                or source.zero_point.reshape(()) != y_zp:
            return None
        from kiln.ops import call as op_call

        try:
            return op_call(op.op, source.data, *op.args[1:], **op.attrs)
        except IRError:  # an op that takes no integer data: keep float
            return None

    def _split_part(self, e: g.Expr) -> g.Call | None:
        """Part `k` of a `split` that only this use reads, as the `strided_slice` of the
        split's input that is that part (then `_on_integers` like any slice), else None."""
        item = self.defs.get(e) if isinstance(e, g.Var) and self.uses[e] == 1 else None
        if not isinstance(item, g.TupleGetItem):
            return None
        split = self._producer(item.tuple_value, single_use=False)
        if split is None or split.op != "split":
            return None
        from kiln.ops import call as op_call

        sections, axis = split.attrs["sections"], split.attrs.get("axis", 0)
        if not isinstance(sections, tuple) or not isinstance(axis, int):
            return None
        start = sum(int(n) for n in sections[:item.index])
        return op_call("strided_slice", split.args[0], starts=(start,),
                       ends=(start + int(sections[item.index]),), axes=(axis,), steps=(1,))

    def _concat(self, concat: g.Call, q: g.Call, y_scale: np.ndarray, y_zp: np.ndarray
                ) -> g.Call | None:
        """`quantize(concat(dequantize(x_1), dequantize(x_2), ...))`, all per tensor:
        onnxruntime's QLinearConcat, `qlinear_concat` (kiln.ops.quant_elementwise): the
        integers copied where an input's scale and zero point are the output's, else
        requantized (onnxruntime's table of quantize(dequantize(v)) for the 256 values,
        the same float32 operations)."""
        from kiln.ops import call as op_call

        xs = [self._dequantized(arg) for arg in concat.args]
        if any(x is None or x.axis is not None or x.scale.ndim or not (
                isinstance(x.data.type, TensorType)
                and x.data.type.dtype in _PRODUCT_DTYPES) for x in xs):
            return None
        try:
            return op_call("qlinear_concat", *[x.data for x in xs if x is not None],
                           axis=concat.attrs.get("axis", 0),
                           x_scales=tuple(float(x.scale) for x in xs if x is not None),
                           x_zero_points=tuple(int(x.zero_point) for x in xs if x is not None),
                           y_scale=float(y_scale), y_zero_point=int(y_zp), dtype=str(y_zp.dtype))
        except IRError:  # keep float
            return None

    def _binary(self, call: g.Call, q: g.Call) -> g.Call | None:
        """`quantize(add|multiply(dequantize(a), dequantize(b)))` in float32, per tensor,
        a, b and the output all uint8: onnxruntime's QLinearAdd / QLinearMul
        (kiln.ops.quant_elementwise), the formula it runs for this group. onnxruntime
        (x86) keeps the int8 group in float, and so does kiln."""
        from kiln.ops import call as op_call

        dtype = q.type.dtype if isinstance(q.type, TensorType) else ""
        ct = call.type
        if dtype != "uint8" or not (isinstance(ct, TensorType) and ct.dtype == "float32"):
            return None
        operands: list[g.Expr] = []
        for arg in call.args:
            p = self._dequantized(arg)
            if p is None or p.axis is not None or p.scale.ndim or not (
                    isinstance(p.data.type, TensorType) and p.data.type.dtype == dtype):
                return None
            operands += [p.data, g.Constant(p.scale.reshape(())),
                         g.Constant(np.asarray(p.zero_point).reshape(()))]
        try:
            return op_call(_BINARY[call.op], *operands, *_output_params(q))
        except IRError:  # shapes that do not broadcast: keep float
            return None

    def _global_average(self, pool: g.Call, q: g.Call) -> g.Call | None:
        """`quantize(global_avg_pool(dequantize(x)))`, per tensor, x and the output of one
        type: onnxruntime's QLinearGlobalAveragePool (kiln.ops.quant_pool)."""
        from kiln.ops import call as op_call

        x = self._dequantized(pool.args[0])
        if x is None or x.axis is not None or x.scale.ndim or not (
                isinstance(x.data.type, TensorType) and isinstance(q.type, TensorType)
                and x.data.type.dtype == q.type.dtype in _PRODUCT_DTYPES):
            return None
        try:
            return op_call("qlinear_global_average_pool", x.data, g.Constant(x.scale),
                           g.Constant(np.asarray(x.zero_point).reshape(())),
                           *_output_params(q))
        except IRError:  # a dynamic image size: keep float
            return None

    def _average_pool(self, pool: g.Call, q: g.Call) -> g.Call | None:
        """`quantize(avg_pool(dequantize(x)))`, per tensor, uint8: onnxruntime's
        QLinearAveragePool averages the dequantized floats as the float op does, then
        rounds `average / y_scale + y_zp` (the zero point added before rounding)."""
        from kiln.ops import call as op_call

        x = self._dequantized(pool.args[0])
        if q.attrs.get("zero_point_first") or x is None or x.axis is not None \
                or x.scale.ndim or q.attrs.get("axis") \
                or not (isinstance(x.data.type, TensorType) and isinstance(q.type, TensorType)
                        and x.data.type.dtype == q.type.dtype == "uint8"):
            return None
        return op_call("quantize_linear", *q.args, zero_point_first=True)

    def _softmax(self, softmax: g.Call, q: g.Call, y_scale: np.ndarray, y_zp: np.ndarray
                 ) -> g.Call | None:
        """`quantize(softmax(dequantize(x)))` over the last axis, per tensor, uint8 or int8:
        onnxruntime's QLinearSoftmax (kiln.ops.quant_softmax), its exp table built here."""
        from kiln.ops import call as op_call
        from kiln.ops.quant_softmax import MAX_MULTIPLIER, softmax_multiplier, softmax_table

        x = self._dequantized(softmax.args[0])
        xt = x.data.type if x is not None else None
        axis = softmax.attrs.get("axis", -1)
        if x is None or x.axis is not None or x.scale.ndim or not isinstance(xt, TensorType) \
                or xt.dtype not in ("uint8", "int8") or str(y_zp.dtype) != xt.dtype \
                or not isinstance(axis, int) or axis % max(xt.ndim, 1) != xt.ndim - 1 \
                or not isinstance(xt.shape[-1], int) or 1 / float(y_scale) > MAX_MULTIPLIER:
            return None
        table = softmax_table(float(x.scale), int(xt.shape[-1]))
        return op_call("qlinear_softmax", x.data, g.Constant(table),
                       g.Constant(np.asarray(y_zp).reshape(())),
                       y_multiplier=softmax_multiplier(float(y_scale)))

    def _matmul_and_bias(self, add: g.Call) -> tuple[g.Call | None, g.Expr | None]:
        """Gemm's `add(matmul(...), bias)` (either order) -> (the matmul, the bias)."""
        for k in (0, 1):
            inner = self._producer(add.args[k], single_use=True)
            if inner is not None and inner.op == "matmul":
                return inner, add.args[1 - k]
        return None, None

    def _fuse(self, q: g.Call, op: str, product: g.Call, bias: g.Expr | None, channel_axis: int,
              lo: int, hi: int, y_scale: np.ndarray, y_zp: np.ndarray) -> g.Call | None:
        x, w = self._dequantized(product.args[0]), self._dequantized(product.args[1])
        if x is None or w is None or x.axis is not None or x.scale.ndim:
            return None
        xt = x.data.type
        if not (isinstance(xt, TensorType) and xt.dtype in _PRODUCT_DTYPES):
            return None
        if not isinstance(w.data, g.Constant):
            return self._activation_product(q, op, product, x, w, bias, lo, hi, y_scale, y_zp)
        if not (w.data.data.ndim >= 2 and str(w.data.data.dtype) in _PRODUCT_DTYPES):
            return None
        channels = w.data.data.shape[channel_axis]
        if w.axis is not None and (w.axis != channel_axis or w.scale.shape != (channels,)):
            return None
        if product.op == "matmul" and w.data.data.ndim != 2:
            return None
        bias_data = self._bias(bias, x.scale * w.scale, channels)
        if bias_data is None:
            return None
        return self._integer_product(op, x, w, bias_data, y_scale, y_zp,
                                     {**product.attrs, "qmin": lo, "qmax": hi})

    @staticmethod
    def _integer_product(op: str, x: Any, w: Any, bias: np.ndarray, y_scale: np.ndarray,
                         y_zp: np.ndarray, attrs: dict[str, Any]) -> g.Call | None:
        """The fused integer product `op(x, w, bias, x_zp, w_zp, multiplier, y_zp)` of two
        dequantized operands, or None (keep float) where the op refuses the shapes."""
        from kiln.ops import call as op_call
        from kiln.ops.quant import requantize_multiplier

        w_zp = np.asarray(w.zero_point)
        try:
            return op_call(op, x.data, w.data, g.Constant(bias),
                           g.Constant(np.asarray(x.zero_point).reshape(())),
                           g.Constant(w_zp.reshape(()) if w_zp.size == 1 and w.axis is None
                                      else w_zp),
                           g.Constant(requantize_multiplier(x.scale, w.scale, y_scale)),
                           g.Constant(np.asarray(y_zp)), **attrs)
        except IRError:  # a shape the integer op refuses: keep float
            return None

    def _dynamic_matmul(self, root: g.Call) -> g.Call | None:
        """Dynamic quantization's `[add(](multiply(cast(matmul_integer(a_q, b, a_zp, b_zp)),
        multiply(a_scale, b_scale))[, bias)`, where `a_q, a_scale, a_zp` come from one
        `dynamic_quantize_linear(a)` and B, its zero point and scale and the bias are
        constants: `dynamic_quant_matmul(a, ...)` (kiln.ops.quant_dynamic), the same
        float32 operations in the same order."""
        from kiln.ops import call as op_call

        product: g.Call | None = root
        bias: g.Expr | None = None
        if root.op == "add":
            product = None
            for k in (0, 1):
                inner = self._producer(root.args[k], single_use=True)
                if inner is not None and inner.op == "multiply" \
                        and isinstance(root.args[1 - k], g.Constant):
                    product, bias = inner, root.args[1 - k]
            if product is None or product.type != root.type:
                return None
        assert product is not None
        for k in (0, 1):
            cast, scale = (self._producer(product.args[k], single_use=True),
                           self._producer(product.args[1 - k], single_use=True))
            if cast is not None and cast.op == "cast" and scale is not None \
                    and scale.op == "multiply":
                break
        else:
            return None
        if cast.attrs.get("dtype") != "float32":
            return None
        mm = self._producer(cast.args[0], single_use=True)
        if mm is None or mm.op != "matmul_integer" or mm.attrs.get("transpose_b"):
            return None
        a_q, b, a_zp, b_zp = mm.args
        source = self._dynamic_item(a_q, 0)
        scales = [self._dynamic_item(e, 1) for e in scale.args]
        b_scale = scale.args[1] if scales[0] is not None else scale.args[0]
        if source is None or source is not self._dynamic_item(a_zp, 2) \
                or source not in scales or not isinstance(b, g.Constant) \
                or not isinstance(b_zp, g.Constant) or not isinstance(b_scale, g.Constant) \
                or b.data.ndim != 2 or b_scale.data.dtype != np.float32:
            return None
        n = b.data.shape[1]
        bias_data = np.zeros(n, np.float32) if bias is None else self._float_bias(bias, n)
        b_scales = np.asarray(b_scale.data, np.float32)
        if bias_data is None or b_scales.size not in (1, n):
            return None
        try:
            return op_call("dynamic_quant_matmul", source.args[0], b, b_zp,
                           g.Constant(b_scales.reshape(() if b_scales.size == 1 else (n,))),
                           g.Constant(bias_data))
        except IRError:  # a shape the fused op refuses: keep the model's ops
            return None

    def _dynamic_item(self, e: g.Expr, index: int) -> g.Call | None:
        """The `dynamic_quantize_linear` call whose output `index` `e` is, else None."""
        item = self.defs.get(e) if isinstance(e, g.Var) else e
        if not isinstance(item, g.TupleGetItem) or item.index != index:
            return None
        call = self._producer(item.tuple_value, single_use=False)
        return call if call is not None and call.op == "dynamic_quantize_linear" else None

    @staticmethod
    def _float_bias(bias: g.Expr, n: int) -> np.ndarray | None:
        """A float32 constant bias of n values along the last axis, as shape (n,)."""
        if not isinstance(bias, g.Constant) or bias.data.dtype != np.float32 \
                or bias.data.size != n or (bias.data.ndim and bias.data.shape[-1] != n):
            return None
        return np.asarray(bias.data, np.float32).reshape(n)

    def _activation_product(self, q: g.Call, op: str, product: g.Call, x: Any, w: Any,
                            bias: g.Expr | None, lo: int, hi: int, y_scale: np.ndarray,
                            y_zp: np.ndarray) -> g.Call | None:
        """`quantize(matmul(dequantize(a), dequantize(b)))` of two uint8 activations, both
        per tensor, no bias (attention's Q K^T and P V): `qlinear_matmul` with B read at
        run time, as onnxruntime's QDQ transformer makes it a QLinearMatMul (an exact
        int32 product requantized, where the float product rounded before the
        quantization). int8 activations keep the float product: onnxruntime runs them
        either way, depending on its int8-to-uint8 transformer (docs/quantization.md)."""
        wt, xt = w.data.type, x.data.type
        if op != "qlinear_matmul" or bias is not None or product.attrs.get("transpose_b") \
                or w.axis is not None or w.scale.ndim \
                or not (isinstance(wt, TensorType) and wt.dtype == "uint8"
                        and isinstance(xt, TensorType) and xt.dtype == "uint8"
                        and wt.ndim >= 2 and isinstance(wt.shape[-1], int)):
            return None
        return self._integer_product(op, x, w, np.zeros((wt.shape[-1],), np.int32), y_scale,
                                     y_zp, {"qmin": lo, "qmax": hi})

    def _bias(self, bias: g.Expr | None, scale: np.ndarray, channels: int) -> np.ndarray | None:
        """The int32 bias of the fused op (zeros when the product has none), or None when
        the bias is not `dequantize_linear(int32 constant, x_scale * w_scale, 0)`."""
        if bias is None:
            return np.zeros((channels,), np.int32)
        b = self._dequantized(bias)
        if b is None or not isinstance(b.data, g.Constant) or b.data.data.dtype != np.int32 \
                or b.data.data.shape != (channels,) or np.any(b.zero_point != 0):
            return None
        want = np.broadcast_to(np.asarray(scale, np.float32), (channels,))
        if not np.allclose(np.broadcast_to(b.scale, (channels,)), want, rtol=1e-5, atol=0):
            return None
        return np.asarray(b.data.data, np.int32)

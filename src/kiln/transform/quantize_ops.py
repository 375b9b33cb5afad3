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
its numbers: Add/Mul -> `qlinear_add`/`qlinear_mul` (kiln.ops.quant_elementwise),
GlobalAveragePool -> `qlinear_global_average_pool` (kiln.ops.quant_pool), Softmax ->
`qlinear_softmax` (kiln.ops.quant_softmax), and an AveragePool's QuantizeLinear rounds
with the zero point added first.

Which groups those are follows onnxruntime's optimizer (kiln.ops.quant_ort): on x86 it
runs an int8 Q/DQ pair as uint8 only when the pair has one reader, then fuses a group
only when its quantized tensors have one type as its kernels see them (a convolution or
MatMul only with uint8 activations); an int8 group it runs as uint8 is computed as uint8
(`as_uint8`). Before matching, Q/DQ calls of one input with equal constant parameters
are merged (its common-subexpression elimination), and a float bias between a DQ and a Q
is quantized as its WeightBiasQuantization does (`onnxruntime_bias`). After, each
convolution of dequantized operands whose result is quantized but that onnxruntime
keeps in float becomes `conv2d_mlas` (kiln.ops.quant_mlas_conv): its float sums in MLAS's
order (option `threads`: onnxruntime's thread count, which sets that order for some
shapes).

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
constant B and every `dynamic_quant_matmul` become their packed forms, through the
kernel family the registry selects for the target (kiln.kernels.int8.families): the
weight shifted by its zero point, the input zero point's correction folded into the int32
bias (or, for a zero point known only at run time, applied with B's column sums).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.analysis.graph_uses import var_use_counts
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType
from kiln.ir.visitor import GraphMutator
from kiln.kernels.registry import select
from kiln.ops import call as op_call
from kiln.ops.quant import qrange, quantize_ref, requantize_multiplier
from kiln.ops.quant_mlas_conv import default_threads
from kiln.ops.quant_ort import OrtTypes
from kiln.ops.quant_softmax import MAX_MULTIPLIER, softmax_multiplier, softmax_table
from kiln.transform.dead_code import remove_dead_bindings
from kiln.transform.functor import SharedPacking, rewrite_calls
from kiln.transform.kernel_isa import kernel_isa
from kiln.transform.pass_base import FunctionPass

if TYPE_CHECKING:
    from kiln.target.isa import ISA

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
#: the integer products the int8 kernel families pack (kiln.kernels.int8.families)
_PACKED = ("qlinear_conv", "qlinear_matmul", "matmul_integer", "dynamic_quant_matmul")


@dataclass(frozen=True)
class QuantizeOps(FunctionPass):
    """Rewrite DQ -> conv/matmul/gemm [-> relu/clip] -> Q chains into integer ops."""

    name = "quantize-ops"
    level = "graph"
    #: onnxruntime's intra-op thread count, which sets how MLAS sums some float
    #: convolutions (kiln.ops.quant_mlas_conv); None: its default on this host
    #: (`default_threads`, the one host read, made here and never by a kernel)
    threads: int | None = None

    def run_on_function(self, func: Any, name: str, mod: IRModule) -> g.Function:
        assert isinstance(func, g.Function)
        if not any(isinstance(b.value, g.Call) and b.value.op in _STARTS
                   for b in func.bindings):
            return func
        func = _MergeEqualQdq().visit_function(func)
        uses = var_use_counts(func)
        match = _Matcher({b.var: b.value for b in func.bindings}, uses,
                         OrtTypes.of(func, uses))
        fused = rewrite_calls(func, match.rewrite)
        if fused is not func:  # the integer products a fused op replaced: not packed
            fused = remove_dead_bindings(fused)
        # the quantized convolutions left in float: summed as onnxruntime sums them
        fused = rewrite_calls(fused, _FloatConvs(fused, self.threads).rewrite)
        # weights, zero-point corrections and bias prepared for the kernels
        isa = kernel_isa()  # the target the pipeline runs under
        packed = rewrite_calls(fused, SharedPacking(lambda c: _packed(c, isa)))
        # the float products and dequantized weights the fused ops replaced
        return packed if packed is func else remove_dead_bindings(packed)


def _packed(call: g.Call, isa: ISA) -> g.Call | None:
    """`call` packed by the kernel family the registry picks for it on `isa`
    (kiln.kernels.registry.select, as the float blocking passes ask), or None."""

    family = select(call, isa) if call.op in _PACKED else None
    return family.pack(call, isa) if family is not None else None


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
    def __init__(self, defs: dict[g.Var, g.Expr], uses: Any, ort: OrtTypes) -> None:
        self.defs = defs
        self.uses = uses
        self.ort = ort

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
        """`quantize(add|multiply(dequantize(a), dequantize(b)))` in float32, per tensor:
        onnxruntime's QLinearAdd / QLinearMul (kiln.ops.quant_elementwise) when a, b and
        the output have one type as its kernels see them (kiln.ops.quant_ort); int8
        tensors it runs as uint8 are computed as uint8 (`as_uint8`). Mixed types stay
        float there, and in kiln."""

        ct = call.type
        if not (isinstance(ct, TensorType) and ct.dtype == "float32"):
            return None
        operands: list[g.Expr] = []
        seen = {self.ort.output(q)}
        stored = {str(q.type.dtype) if isinstance(q.type, TensorType) else ""}
        for arg in call.args:
            p = self._dequantized(arg)
            if p is None or p.axis is not None or p.scale.ndim \
                    or not isinstance(p.data.type, TensorType):
                return None
            seen.add(self.ort.stored(p.data))
            stored.add(p.data.type.dtype)
            operands += [p.data, g.Constant(p.scale.reshape(())),
                         g.Constant(np.asarray(p.zero_point).reshape(()))]
        if len(seen) != 1 or len(stored) != 1 or not seen <= set(_PRODUCT_DTYPES):
            return None
        shifted = seen != stored  # int8 tensors onnxruntime runs as uint8
        try:
            return op_call(_BINARY[call.op], *operands, *_output_params(q),
                           **({"as_uint8": True} if shifted else {}))
        except IRError:  # shapes that do not broadcast: keep float
            return None

    def _global_average(self, pool: g.Call, q: g.Call) -> g.Call | None:
        """`quantize(global_avg_pool(dequantize(x)))`, per tensor, x and the output of one
        type: onnxruntime's QLinearGlobalAveragePool (kiln.ops.quant_pool)."""

        x = self._dequantized(pool.args[0])
        if x is None or x.axis is not None or x.scale.ndim or not (
                isinstance(x.data.type, TensorType) and isinstance(q.type, TensorType)
                and x.data.type.dtype == q.type.dtype in _PRODUCT_DTYPES) \
                or self.ort.stored(x.data) != self.ort.output(q):
            return None
        try:
            return op_call("qlinear_global_average_pool", x.data, g.Constant(x.scale),
                           g.Constant(np.asarray(x.zero_point).reshape(())),
                           *_output_params(q))
        except IRError:  # a dynamic image size: keep float
            return None

    def _average_pool(self, pool: g.Call, q: g.Call) -> g.Call | None:
        """`quantize(avg_pool(dequantize(x)))`, per tensor, x and the output of one type as
        onnxruntime's kernels see them: its QLinearAveragePool averages the dequantized
        floats as the float op does, then rounds `average / y_scale + y_zp` (the zero point
        added before rounding; for int8 it runs as uint8, with `y_zp + 128`)."""

        x = self._dequantized(pool.args[0])
        if q.attrs.get("zero_point_first") or x is None or x.axis is not None \
                or x.scale.ndim or q.attrs.get("axis") \
                or not (isinstance(x.data.type, TensorType) and isinstance(q.type, TensorType)
                        and x.data.type.dtype == q.type.dtype in _PRODUCT_DTYPES) \
                or self.ort.stored(x.data) != self.ort.output(q):
            return None
        shifted = self.ort.output(q) != q.type.dtype
        return op_call("quantize_linear", *q.args, zero_point_first=True,
                       **({"as_uint8": True} if shifted else {}))

    def _softmax(self, softmax: g.Call, q: g.Call, y_scale: np.ndarray, y_zp: np.ndarray
                 ) -> g.Call | None:
        """`quantize(softmax(dequantize(x)))` over the last axis, per tensor, uint8 or int8:
        onnxruntime's QLinearSoftmax (kiln.ops.quant_softmax), its exp table built here."""

        x = self._dequantized(softmax.args[0])
        xt = x.data.type if x is not None else None
        axis = softmax.attrs.get("axis", -1)
        if x is None or x.axis is not None or x.scale.ndim or not isinstance(xt, TensorType) \
                or xt.dtype not in ("uint8", "int8") or str(y_zp.dtype) != xt.dtype \
                or self.ort.stored(x.data) != self.ort.output(q) \
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
        gemm = product.op == "matmul" and (bias is not None
                                           or bool(product.attrs.get("transpose_b")))
        if not self._integer_group(q, x.data, str(w.data.data.dtype), gemm):
            return None
        channels = w.data.data.shape[channel_axis]
        if w.axis is not None and (w.axis != channel_axis or w.scale.shape != (channels,)):
            return None
        if product.op == "matmul" and w.data.data.ndim != 2:
            return None
        # a float bias is quantized by onnxruntime for a Conv or Gemm (a 2-D MatMul + Add
        # becomes one), not for a batched MatMul's Add
        float_bias = product.op in _CONVS or xt.ndim == 2
        bias_data = self._bias(bias, x.scale * w.scale, channels, float_bias)
        if bias_data is None:
            return None
        # int8 activations onnxruntime runs as uint8: its AVX2 pairs saturate on them too
        shifted = {"as_uint8": True} if xt.dtype == "int8" \
            and self.ort.stored(x.data) == "uint8" else {}
        return self._integer_product(op, x, w, bias_data, y_scale, y_zp,
                                     {**product.attrs, "qmin": lo, "qmax": hi, **shifted})

    def _integer_group(self, q: g.Call, x_data: g.Expr, w_dtype: str, gemm: bool) -> bool:
        """Whether onnxruntime runs the product group ending at `q` as QLinearConv,
        QLinearMatMul or QGemm (kiln.ops.quant_ort): the activation and the output of one
        type, uint8 (int8 activations only in a Gemm with an int8 weight). Otherwise it
        computes the float product, and so does kiln."""
        x_type, y_type = self.ort.stored(x_data), self.ort.output(q)
        return x_type == y_type and (x_type == "uint8" or (gemm and w_dtype == "int8"))

    @staticmethod
    def _integer_product(op: str, x: Any, w: Any, bias: np.ndarray, y_scale: np.ndarray,
                         y_zp: np.ndarray, attrs: dict[str, Any]) -> g.Call | None:
        """The fused integer product `op(x, w, bias, x_zp, w_zp, multiplier, y_zp)` of two
        dequantized operands, or None (keep float) where the op refuses the shapes."""

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
        """`quantize(matmul(dequantize(a), dequantize(b)))` of two activations, both per
        tensor, no bias (attention's Q K^T and P V), A and the output uint8 as
        onnxruntime's kernels see them (int8 pairs it runs as uint8 included):
        `qlinear_matmul` with B read at run time, as onnxruntime's QDQ transformer makes
        it a QLinearMatMul (an exact int32 product requantized, where the float product
        rounded before the quantization). Other types keep the float product, as
        onnxruntime does."""
        wt = w.data.type
        if op != "qlinear_matmul" or bias is not None or product.attrs.get("transpose_b") \
                or w.axis is not None or w.scale.ndim \
                or not self._integer_group(q, x.data, "", False) \
                or not (isinstance(wt, TensorType) and wt.dtype in _PRODUCT_DTYPES
                        and wt.ndim >= 2 and isinstance(wt.shape[-1], int)):
            return None
        return self._integer_product(op, x, w, np.zeros((wt.shape[-1],), np.int32), y_scale,
                                     y_zp, {"qmin": lo, "qmax": hi})

    def _bias(self, bias: g.Expr | None, scale: np.ndarray, channels: int,
              float_bias: bool) -> np.ndarray | None:
        """The int32 bias of the fused op (zeros when the product has none), or None when
        the bias is not `dequantize_linear(int32 constant, x_scale * w_scale, 0)` or, with
        `float_bias`, a float constant (which onnxruntime quantizes, `onnxruntime_bias`)."""
        if bias is None:
            return np.zeros((channels,), np.int32)
        if isinstance(bias, g.Constant):
            return onnxruntime_bias(bias, scale, channels) if float_bias else None
        b = self._dequantized(bias)
        if b is None or not isinstance(b.data, g.Constant) or b.data.data.dtype != np.int32 \
                or b.data.data.shape != (channels,) or np.any(b.zero_point != 0):
            return None
        want = np.broadcast_to(np.asarray(scale, np.float32), (channels,))
        if not np.allclose(np.broadcast_to(b.scale, (channels,)), want, rtol=1e-5, atol=0):
            return None
        return np.asarray(b.data.data, np.int32)


class _MergeEqualQdq(GraphMutator):
    """One QuantizeLinear (DequantizeLinear) for calls of one input with equal constant
    parameters: onnxruntime's common-subexpression elimination merges them before its
    QDQ fusion (a file with a dedicated Q/DQ pair per consumer quantizes a convolution's
    output twice; merged, the convolution has one reader and fuses)."""

    def __init__(self) -> None:
        self.seen: dict[tuple[Any, ...], g.Var] = {}
        self.alias: dict[g.Var, g.Var] = {}

    def visit_var(self, e: g.Var) -> g.Expr:
        return self.alias.get(e, e)

    def visit_binding(self, b: g.Binding) -> g.Binding | list[g.Binding] | None:
        new = super().visit_binding(b)
        value = new.value if isinstance(new, g.Binding) else None
        if not (isinstance(value, g.Call) and value.op in ("quantize_linear", "dequantize_linear")
                and all(isinstance(a, g.Constant) for a in value.args[1:])):
            return new
        params = tuple((c.data.dtype.str, c.data.shape, c.data.tobytes())
                       for c in value.args[1:] if isinstance(c, g.Constant))
        key = (value.op, id(value.args[0]), params, tuple(sorted(value.attrs.items())))
        if key in self.seen:
            self.alias[b.var] = self.seen[key]
            return None
        self.seen[key] = b.var
        return new


def onnxruntime_bias(bias: g.Constant, scale: np.ndarray, channels: int) -> np.ndarray | None:
    """A float bias of a product between a DequantizeLinear and a QuantizeLinear as
    onnxruntime's WeightBiasQuantization transformer quantizes it before its QDQ fusion:
    `int32(round_half_even(bias / (x_scale * w_scale)))` in float32 (None: not a 1-D
    float32 bias of `channels` values, or out of int32's range)."""
    data = np.asarray(bias.data)
    if data.dtype != np.float32 or data.shape != (channels,):
        return None
    with np.errstate(all="ignore"):
        q = np.rint((data / np.asarray(scale, np.float32)).astype(np.float32))
    if not np.all(np.abs(q) < 2.0 ** 31):
        return None
    return q.astype(np.int32)


class _FloatConvs:
    """The convolutions of a QDQ group onnxruntime keeps in float (the matcher fused the
    others): `conv2d(dequantize(x), dequantize(w)[, bias])` whose result only a
    QuantizeLinear reads (through a ReLU or Clip or not) becomes `conv2d_mlas`
    (kiln.ops.quant_mlas_conv), the float sums in MLAS's order, so that the quantized
    result is onnxruntime's. A weight that is a float constant is not such a group
    (onnxruntime runs it on its blocked-layout kernels instead)."""

    def __init__(self, func: g.Function, threads: int | None) -> None:
        self.defs = {b.var: b.value for b in func.bindings}
        self.vars = {id(b.value): b.var for b in func.bindings}
        self.uses = var_use_counts(func)
        self.readers: dict[g.Var, g.Call] = {}
        for b in func.bindings:
            if isinstance(b.value, g.Call):
                for a in b.value.args:
                    if isinstance(a, g.Var):
                        self.readers[a] = b.value
        self.threads = default_threads() if threads is None else threads

    def _dequantized(self, e: g.Expr) -> bool:
        value = self.defs.get(e) if isinstance(e, g.Var) else None
        return isinstance(value, g.Call) and value.op == "dequantize_linear"

    def _quantized(self, var: g.Var | None) -> bool:
        """Whether `var`'s one reader is a QuantizeLinear, or a ReLU/Clip whose is."""
        for _ in range(2):
            if var is None or self.uses[var] != 1 or var not in self.readers:
                return False
            reader = self.readers[var]
            if reader.op == "quantize_linear":
                return True
            if reader.op not in ("relu", "clip"):
                return False
            var = self.vars.get(id(reader))
        return False

    def _scale(self, e: g.Expr) -> np.ndarray | None:
        """The constant scale of the DequantizeLinear bound to `e`, else None."""
        value = self.defs.get(e) if isinstance(e, g.Var) else None
        if isinstance(value, g.Call) and isinstance(value.args[1], g.Constant):
            return np.asarray(value.args[1].data, np.float32)
        return None

    def _bias(self, call: g.Call) -> g.Expr | None:
        """A float constant bias as onnxruntime computes with it: quantized to int32 with
        scale `x_scale * w_scale` (`onnxruntime_bias`), then dequantized."""
        bias = call.args[2]
        x_scale, w_scale = self._scale(call.args[0]), self._scale(call.args[1])
        if not isinstance(bias, g.Constant) or x_scale is None or x_scale.ndim \
                or w_scale is None:
            return bias
        scale = (x_scale * w_scale).astype(np.float32)
        q = onnxruntime_bias(bias, scale, int(np.asarray(bias.data).size))
        if q is None:
            return bias
        return g.Constant((q.astype(np.float32) * scale).astype(np.float32))

    def rewrite(self, call: g.Call) -> g.Call | None:
        if call.op != "conv2d" or not all(self._dequantized(a) for a in call.args[:2]) \
                or not self._quantized(self.vars.get(id(call))):
            return None
        args = (*call.args[:2], self._bias(call)) if len(call.args) == 3 else call.args
        try:
            return op_call("conv2d_mlas", *args, **call.attrs, threads=self.threads)
        except IRError:  # a shape MLAS sums with other kernels: keep kiln's
            return None


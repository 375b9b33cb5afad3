"""ONNX converters onto kiln.ops.nn's operators: Conv (a float32 1-D one as a 2-D
convolution of height 1), ConvTranspose (float32 as onnxruntime computes it: a matmul
whose columns col2im sums into the image), MatMul, Gemm, Einsum (a transpose or a
matmul where it is one) and BatchNormalization (folded to a per-channel scale and
shift, or its training mode)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.errors import IRError
from kiln.frontend.onnx.converters.registry import GraphContext, check_per_channel, onnx_op
from kiln.frontend.onnx.converters.spatial import nonempty_image, onnx_pads
from kiln.ir import graph as g
from kiln.ir.types import TensorType
from kiln.ops import spatial
from kiln.ops.nn import conv_transpose_infer, parse_einsum, static_dim
from kiln.ops.registry import Attrs
from kiln.ops.reshape_dims import reshape_attr


def _kernel(attrs: dict[str, Any], w: TensorType) -> tuple[int, ...]:
    kernel = tuple(int(k) for k in attrs.get("kernel_shape", w.static_shape[2:]))
    if kernel != w.static_shape[2:]:
        raise IRError(f"kernel_shape {kernel} does not match the weight {w.static_shape}")
    return kernel


@onnx_op("Conv")
def _conv_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> list[g.Expr]:
    x, w, b = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
    assert x is not None and w is not None
    xt, wt = ctx.tensor_type(x), ctx.tensor_type(w)
    rank = spatial.spatial_rank(xt.shape, "Conv")
    kernel = _kernel(attrs, wt)
    strides = spatial.ints(attrs, "strides", rank, 1)
    dilations = spatial.ints(attrs, "dilations", rank, 1)
    pads = onnx_pads(attrs, xt.shape[2:], kernel, strides, dilations)
    group = int(attrs.get("group", 1))
    if rank == 1 and xt.dtype == "float32":
        return [nonempty_image(ctx, _conv1d_as_2d(ctx, x, w, b, group, strides, dilations,
                                                  pads), "Conv")]
    args = [x, w] if b is None else [x, w, b]
    return [nonempty_image(ctx, ctx.call(f"conv{spatial.SUFFIX[rank]}", *args, group=group,
                                         strides=strides, dilations=dilations, pads=pads),
                           "Conv")]


def _conv1d_as_2d(ctx: GraphContext, x: g.Expr, w: g.Expr, b: g.Expr | None, group: int,
                  strides: Sequence[int], dilations: Sequence[int],
                  pads: Sequence[int]) -> g.Expr:
    """A 1-D convolution as a 2-D one of height 1 (`[n, c, l]` viewed as `[n, c, 1, l]`),
    so it takes the hand-built 2-D kernels (conv_blocking), symbolic batch included:
    Whisper's and wav2vec's front ends. The views cost no copy of the weight (folded)."""
    def view(v: g.Expr, target: Sequence[Any]) -> g.Expr:
        return ctx.call("reshape", v, shape=reshape_attr(ctx.tensor_type(v).shape, target))

    (n, c, length), (o, i, k) = ctx.tensor_type(x).shape, ctx.tensor_type(w).shape
    args = [view(x, (n, c, 1, length)), view(w, (o, i, 1, k))]
    y = ctx.call("conv2d", *args, *([] if b is None else [b]), group=group,
                 strides=(1, strides[0]), dilations=(1, dilations[0]),
                 pads=(0, pads[0], 0, pads[1]))
    ys = ctx.tensor_type(y).shape
    return view(y, (ys[0], ys[1], ys[3]))


@onnx_op("ConvTranspose")
def _conv_transpose_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                         attrs: dict[str, Any]) -> list[g.Expr]:
    x, w, b = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
    assert x is not None and w is not None
    xt, wt = ctx.tensor_type(x), ctx.tensor_type(w)
    rank = spatial.spatial_rank(xt.shape, "ConvTranspose")
    kernel = _kernel(attrs, wt)
    strides = spatial.ints(attrs, "strides", rank, 1)
    dilations = spatial.ints(attrs, "dilations", rank, 1)
    out_pad = spatial.ints(attrs, "output_padding", rank, 0, least=0)
    auto = attrs.get("auto_pad", "NOTSET")
    if "output_shape" in attrs or auto in ("SAME_UPPER", "SAME_LOWER"):
        in_sp = TensorType(xt.shape[2:], xt.dtype).static_shape
        target = tuple(int(d) for d in attrs.get("output_shape", ()))[-rank:] or tuple(
            in_sp[j] * strides[j] for j in range(rank))
        total = [strides[j] * (in_sp[j] - 1) + out_pad[j] + (kernel[j] - 1) * dilations[j] + 1
                 - target[j] for j in range(rank)]
        # a negative total pads the end with zeros (as output_padding would)
        if auto == "SAME_UPPER":
            pads = (*(t // 2 for t in total), *(t - t // 2 for t in total))
        else:
            pads = (*(t - t // 2 for t in total), *(t // 2 for t in total))
    elif auto == "VALID" or "pads" not in attrs:
        pads = (0,) * (2 * rank)
    else:
        b_, e_ = spatial.pads(attrs, rank)
        pads = (*b_, *e_)
    args = [x, w] if b is None else [x, w, b]
    op_attrs = {"group": int(attrs.get("group", 1)), "strides": strides,
                "dilations": dilations, "pads": pads, "output_padding": out_pad}
    if xt.dtype == "float32":  # the other types: the direct loop nest, accumulating wider
        return [_conv_transpose_as_gemm(ctx, x, w, b, op_attrs)]
    return [ctx.call(f"conv_transpose{spatial.SUFFIX[rank]}", *args, **op_attrs)]


# A transposed convolution over fewer input pixels than this (or than its kernel's taps)
# takes the pixels as the GEMM's rows (`columns_last`): as columns they would fill a
# fraction of the tile (2 vectors wide: 32 columns on AVX-512, 16 on AVX2).
COL2IM_ROWS_BELOW = 32


def _conv_transpose_as_gemm(ctx: GraphContext, x: g.Expr, w: g.Expr, b: g.Expr | None,
                            attrs: Attrs) -> g.Expr:
    """A float32 transposed convolution as onnxruntime computes it: a `matmul` of the
    weight and the input per group (the GEMM micro-kernel), whose columns `col2im` sums
    into the image, then the bias. Each product of an input pixel and a tap is formed
    once and added where it lands, or nowhere: a NaN or an infinity reaches only the
    outputs that read it, and no zero is multiplied by a weight.

    The columns come in one of two layouts (`columns_last` of col2im):
    `[N, G, og * kk, L]`, the weight `[G, og * kk, cg]` times the input viewed
    `[N, G, cg, L]` as onnxruntime does (rows of `L` pixels, which col2im reads as a few
    streams), or, where the input has fewer pixels `L` than the kernel has taps `kk` or
    than COL2IM_ROWS_BELOW (a 1x1 latent, FCN's 64x64 kernels over a 7x7 map),
    `[N, G, L, og * kk]`, the input's pixels as rows times the weight `[G, cg, og * kk]`
    (packed at compile time without groups; a product of few columns would waste most
    of the GEMM tile's lanes), which col2im reads along the taps."""
    xt, wt = ctx.tensor_type(x), ctx.tensor_type(w)
    types = [xt, wt] if b is None else [xt, wt, ctx.tensor_type(b)]
    out_t = conv_transpose_infer(types, attrs)  # the checks and messages of conv_transpose
    assert isinstance(out_t, TensorType)
    n, _, *in_sp = xt.shape
    ws = wt.static_shape
    kernel = ws[2:]
    group = int(attrs["group"])
    cg, og, kk = ws[0] // group, ws[1], int(np.prod(kernel))
    length = int(np.prod(in_sp))  # type: ignore[arg-type]
    last = length < max(kk, COL2IM_ROWS_BELOW)
    grouped = () if group == 1 else (group,)
    xv = ctx.call("reshape", x, shape=reshape_attr(xt.shape, (n, *grouped, cg, length)))
    wv = ctx.call("reshape", w, shape=(*grouped, cg, og * kk))
    if last:  # [N, G, L, cg] @ [G, cg, og * kk]
        xv = ctx.call("transpose", xv, perm=(0, 2, 1) if group == 1 else (0, 1, 3, 2))
        cols = ctx.call("matmul", xv, wv)
    else:  # [G, og * kk, cg] @ [N, G, cg, L]
        wv = ctx.call("transpose", wv, perm=(1, 0) if group == 1 else (0, 2, 1))
        cols = ctx.call("matmul", wv, xv)
    rank = len(kernel)
    begins, ends = attrs["pads"][:rank], attrs["pads"][rank:]
    out_pad = attrs["output_padding"]
    y = ctx.call("col2im", cols, image_shape=out_t.shape[2:], block_shape=kernel,
                 strides=attrs["strides"], dilations=attrs["dilations"],
                 pads=(*begins, *(e - p for e, p in zip(ends, out_pad))),
                 columns_last=int(last))
    if b is None:
        return y
    return ctx.call("add", y, ctx.call("reshape", b, shape=(group * og, *(1,) * rank)))


@onnx_op("MatMul")
def _matmul_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                 attrs: dict[str, Any]) -> list[g.Expr]:
    a, b = inputs[0], inputs[1]
    assert a is not None and b is not None
    return [ctx.call("matmul", a, b)]


@onnx_op("Gemm")
def _gemm_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
               attrs: dict[str, Any]) -> list[g.Expr]:
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    assert a is not None and b is not None
    if attrs.get("transA", 0):
        a = ctx.call("transpose", a, perm=(1, 0))
    # transB: matmul reads B transposed in place (a weight is never copied for it).
    y = ctx.call("matmul", a, b, **({"transpose_b": True} if attrs.get("transB", 0) else {}))
    dtype = ctx.tensor_type(y).dtype
    alpha, beta = float(attrs.get("alpha", 1.0)), float(attrs.get("beta", 1.0))
    if alpha != 1.0:
        y = ctx.call("multiply", y, ctx.const(alpha, dtype))
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = ctx.call("multiply", c, ctx.const(beta, dtype))
        y = ctx.call("add", y, c)
    return [y]


@onnx_op("Einsum")
def _einsum_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                 attrs: dict[str, Any]) -> list[g.Expr]:
    args = [x for x in inputs if x is not None]
    eq = str(attrs["equation"]).replace(" ", "")
    types = [ctx.tensor_type(x) for x in args]
    terms, out = parse_einsum(eq, [t.ndim for t in types])
    # The common patterns map onto existing ops: a transpose, a (batched) matmul.
    if len(terms) == 1 and sorted(terms[0]) == sorted(out) and len(set(out)) == len(out):
        perm = tuple(terms[0].index(c) for c in out)
        return [ctx.call("transpose", args[0], perm=perm)]
    if len(terms) == 2 and _is_matmul(terms[0], terms[1], out, types):
        return [ctx.call("matmul", args[0], args[1])]
    return [ctx.call("einsum", *args, equation=eq)]


def _is_matmul(a: str, b: str, out: str, types: Sequence[TensorType]) -> bool:
    """True for `...ij,...jk->...ik` with identical batch letters and shapes."""
    if len(a) < 2 or len(a) != len(b) or len(out) != len(a):
        return False
    batch = a[:-2]
    i, j, k = a[-2], a[-1], b[-1]
    if len({i, j, k, *batch}) != len(batch) + 3:
        return False
    return (b[:-2] == batch and b[-2] == j and out == batch + i + k
            and types[0].shape[:-2] == types[1].shape[:-2])


@onnx_op("BatchNormalization")
def _batchnorm_onnx(ctx: GraphContext, inputs: Sequence[g.Expr | None],
                    attrs: dict[str, Any]) -> list[g.Expr]:
    x, scale, bias, mean, var = inputs[:5]
    assert x is not None and scale is not None and bias is not None
    assert mean is not None and var is not None
    xt = ctx.tensor_type(x)
    eps = float(attrs.get("epsilon", 1e-5))
    if ctx.tensor_type(scale).ndim > 1 or not attrs.get("spatial", 1):
        # opset 7-8 `spatial=0`: statistics per (C, spatial...) element
        shape = xt.static_shape[1:]
    else:
        shape = (static_dim(xt, 1, "BatchNormalization"),) + (1,) * (xt.ndim - 2)
        for v, name in ((scale, "scale"), (bias, "B"), (mean, "input_mean"),
                        (var, "input_var")):
            check_per_channel(ctx, v, x, f"input {name}")
    training = bool(attrs.get("training_mode", 0)) and ctx.opset >= 14
    if training:
        return _batchnorm_training(ctx, x, scale, bias, mean, var, eps,
                                   float(attrs.get("momentum", 0.9)))
    return [_batchnorm_folded(ctx, x, scale, bias, mean, var, eps, shape)]


def _batchnorm_folded(ctx: GraphContext, x: g.Expr, scale: g.Expr, bias: g.Expr,
                      mean: g.Expr, var: g.Expr, eps: float, shape: tuple[int, ...]
                      ) -> g.Expr:
    """y = x * a + b with a = (1 / sqrt(var + eps)) * scale, b = bias - mean * a (per
    channel, reshaped to `shape`), rounded as onnxruntime's kernel rounds them, in both
    modes: where `a` overflows (a huge scale over a small deviation) y is +-inf or NaN
    as there. Constant statistics fold here, and fold-batchnorm merges a, b into a conv."""
    dtype = ctx.tensor_type(var).dtype
    root = ctx.call("sqrt", ctx.call("add", var, ctx.const(eps, dtype)))
    a = ctx.call("multiply", ctx.call("divide", ctx.const(1.0, dtype), root), scale)
    b = ctx.call("subtract", bias, ctx.call("multiply", mean, a))
    a = ctx.call("reshape", a, shape=shape)
    b = ctx.call("reshape", b, shape=shape)
    return ctx.call("add", ctx.call("multiply", x, a), b)


def _batchnorm_training(ctx: GraphContext, x: g.Expr, scale: g.Expr, bias: g.Expr,
                        mean: g.Expr, var: g.Expr, eps: float, momentum: float
                        ) -> list[g.Expr]:
    """Training mode: the batch statistics (two passes: the mean, then the squared
    deviations), folded into y as in inference (`_batchnorm_folded`, onnxruntime's
    arithmetic), and the running ones updated."""
    xt = ctx.tensor_type(x)
    dtype = xt.dtype
    axes = tuple(k for k in range(xt.ndim) if k != 1)
    shape = (xt.static_shape[1],) + (1,) * (xt.ndim - 2)
    c = xt.static_shape[1]
    bmean = ctx.call("reduce_mean", x, axes=axes, keepdims=True)
    centered = ctx.call("subtract", x, bmean)
    bvar = ctx.call("reduce_mean", ctx.call("multiply", centered, centered), axes=axes,
                    keepdims=True)
    bmean, bvar = (ctx.call("reshape", v, shape=(c,)) for v in (bmean, bvar))
    outs = [_batchnorm_folded(ctx, x, scale, bias, bmean, bvar, eps, shape)]
    if len(ctx.node_outputs) > 1:
        keep = ctx.const(momentum, dtype)
        take = ctx.const(1.0 - momentum, dtype)
        for running, current in ((mean, bmean), (var, bvar)):
            outs.append(ctx.call("add", ctx.call("multiply", running, keep),
                                 ctx.call("multiply", current, take)))
    return outs

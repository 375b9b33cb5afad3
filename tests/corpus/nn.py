"""Neural-network kernels: matmul, convolutions, pooling, softmax, layernorm, dense."""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.ir import IRBuilder, IRModule
from kiln.ir.tensor import Cast, Intrin, const, max_, min_, select

from ._build import f32, loop_nest
from ._case import CorpusCase

# --------------------------------------------------------------------------- matmul


def _matmul() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("matmul"):
        A = ib.arg("A", (8, 12), "float32")
        B = ib.arg("B", (12, 6), "float32")
        C = ib.arg("C", (8, 6), "float32")
        with loop_nest(ib, (8, 6)) as (i, j), ib.allocate("acc", (1,), "float32", "local") as acc:
            ib.store(acc, [0], f32(0.0))
            with ib.for_range(12, name="k") as k:
                ib.store(acc, [0], acc[0] + A[i, k] * B[k, j])
            ib.store(C, [i, j], acc[0])
    return ib.get()


MATMUL = CorpusCase("matmul", _matmul, reference={"matmul": lambda a, b, c: a @ b})


def _batch_matmul() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("batch_matmul"):
        A = ib.arg("A", (2, 4, 6), "float32")
        B = ib.arg("B", (2, 6, 5), "float32")
        C = ib.arg("C", (2, 4, 5), "float32")
        with loop_nest(ib, (2, 4, 5), names="bij") as (b, i, j):
            ib.store(C, [b, i, j], f32(0.0))
            with ib.for_range(6, name="k") as k:
                ib.store(C, [b, i, j], C[b, i, j] + A[b, i, k] * B[b, k, j])
    return ib.get()


BATCH_MATMUL = CorpusCase("batch_matmul", _batch_matmul,
                          reference={"batch_matmul": lambda a, b, c: np.matmul(a, b)})

# --------------------------------------------------------------------------- convolution


def conv2d_reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, stride: int,
                     pad: int, groups: int = 1) -> np.ndarray:
    """NCHW convolution by shifted slices of the zero-padded input."""
    n, _, h, wd = x.shape
    k, cg, r, s = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = (h + 2 * pad - r) // stride + 1, (wd + 2 * pad - s) // stride + 1
    out = np.zeros((n, k, oh, ow))
    kpg = k // groups
    for gi in range(groups):
        xs = xp[:, gi * cg:(gi + 1) * cg]
        ws = w[gi * kpg:(gi + 1) * kpg].astype(np.float64)
        for i in range(r):
            for j in range(s):
                patch = xs[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
                out[:, gi * kpg:(gi + 1) * kpg] += np.einsum("nchw,kc->nkhw", patch,
                                                             ws[:, :, i, j])
    if bias is not None:
        out += bias[None, :, None, None]
    return out.astype(np.float32)


def _conv2d_if() -> IRModule:
    """3x3 convolution, stride 1, padding 1; padding by an if around the MAC."""
    N, C, H, W, K = 1, 3, 8, 8, 4
    ib = IRBuilder()
    with ib.prim_func("conv2d_nchw"):
        X = ib.arg("X", (N, C, H, W), "float32")
        Wt = ib.arg("W", (K, C, 3, 3), "float32")
        Bias = ib.arg("B", (K,), "float32")
        Y = ib.arg("Y", (N, K, H, W), "float32")
        with (loop_nest(ib, (N, K, H, W), names="nkyx") as (n, k, y, x),
              ib.allocate("acc", (1,), "float32", "local") as acc):
            ib.store(acc, [0], Bias[k])
            with (loop_nest(ib, (C, 3, 3), names="crs") as (c, r, s),
                  ib.let("ih", y + r - 1) as ih, ib.let("iw", x + s - 1) as iw):
                inside = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                with ib.if_(inside):
                    ib.store(acc, [0], acc[0] + X[n, c, ih, iw] * Wt[k, c, r, s])
            ib.store(Y, [n, k, y, x], acc[0])
    return ib.get()


CONV2D_NCHW = CorpusCase(
    "conv2d_nchw", _conv2d_if,
    reference={"conv2d_nchw": lambda x, w, b, y: conv2d_reference(x, w, b, 1, 1)},
)


def _conv2d_select() -> IRModule:
    """3x3 convolution, stride 2, padding 1; padding by a Select of a clamped load."""
    N, C, H, W, K = 1, 2, 9, 9, 3
    OH = OW = (H + 2 - 3) // 2 + 1
    ib = IRBuilder()
    with ib.prim_func("conv2d_stride2"):
        X = ib.arg("X", (N, C, H, W), "float32")
        Wt = ib.arg("W", (K, C, 3, 3), "float32")
        Y = ib.arg("Y", (N, K, OH, OW), "float32")
        with loop_nest(ib, (N, K, OH, OW), names="nkyx") as (n, k, y, x):
            ib.store(Y, [n, k, y, x], f32(0.0))
            with loop_nest(ib, (C, 3, 3), names="crs") as (c, r, s):
                ih = y * 2 + r - 1
                iw = x * 2 + s - 1
                inside = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                # Select evaluates both sides: clamp the load so it stays in bounds.
                value = X[n, c, min_(max_(ih, 0), H - 1), min_(max_(iw, 0), W - 1)]
                ib.store(Y, [n, k, y, x],
                         Y[n, k, y, x] + select(inside, value, 0.0) * Wt[k, c, r, s])
    return ib.get()


CONV2D_SELECT = CorpusCase(
    "conv2d_select", _conv2d_select,
    reference={"conv2d_stride2": lambda x, w, y: conv2d_reference(x, w, None, 2, 1)},
)


def _depthwise() -> IRModule:
    C, H, W = 4, 6, 6
    ib = IRBuilder()
    with ib.prim_func("depthwise_conv"):
        X = ib.arg("X", (1, C, H, W), "float32")
        Wt = ib.arg("W", (C, 1, 3, 3), "float32")
        Y = ib.arg("Y", (1, C, H, W), "float32")
        with (loop_nest(ib, (C, H, W), names="cyx") as (c, y, x),
              ib.allocate("acc", (1,), "float32", "local") as acc):
            ib.store(acc, [0], f32(0.0))
            with loop_nest(ib, (3, 3), names="rs") as (r, s):
                ih, iw = y + r - 1, x + s - 1
                with ib.if_((ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)):
                    ib.store(acc, [0], acc[0] + X[0, c, ih, iw] * Wt[c, 0, r, s])
            ib.store(Y, [0, c, y, x], acc[0])
    return ib.get()


DEPTHWISE_CONV = CorpusCase(
    "depthwise_conv", _depthwise,
    reference={"depthwise_conv": lambda x, w, y: conv2d_reference(x, w, None, 1, 1, 4)},
)

# --------------------------------------------------------------------------- pooling


def _max_pool() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("max_pool2x2"):
        X = ib.arg("X", (1, 2, 8, 8), "float32")
        Y = ib.arg("Y", (1, 2, 4, 4), "float32")
        with loop_nest(ib, (2, 4, 4), names="cyx") as (c, y, x):
            ib.store(Y, [0, c, y, x], f32(float("-inf")))
            with loop_nest(ib, (2, 2), names="rs") as (r, s):
                ib.store(Y, [0, c, y, x], max_(Y[0, c, y, x], X[0, c, y * 2 + r, x * 2 + s]))
    return ib.get()


MAX_POOL = CorpusCase(
    "max_pool", _max_pool,
    reference={"max_pool2x2": lambda x, y: x.reshape(1, 2, 4, 2, 4, 2).max(axis=(3, 5))},
)


def _avg_pool_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """3x3, stride 1, padding 1, padding excluded from the count."""
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ones = np.pad(np.ones_like(x, dtype=np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, w = x.shape[2:]
    total = sum(xp[:, :, i:i + h, j:j + w] for i in range(3) for j in range(3))
    count = sum(ones[:, :, i:i + h, j:j + w] for i in range(3) for j in range(3))
    return total / count


def _avg_pool() -> IRModule:
    H = W = 5
    ib = IRBuilder()
    with ib.prim_func("avg_pool3x3"):
        X = ib.arg("X", (1, 3, H, W), "float32")
        Y = ib.arg("Y", (1, 3, H, W), "float32")
        with (loop_nest(ib, (3, H, W), names="cyx") as (c, y, x),
              ib.allocate("sum", (1,), "float32", "local") as acc,
              ib.allocate("count", (1,), "int32", "local") as cnt):
            ib.store(acc, [0], f32(0.0))
            ib.store(cnt, [0], const(0, "int32"))
            with loop_nest(ib, (3, 3), names="rs") as (r, s):
                ih, iw = y + r - 1, x + s - 1
                with ib.if_((ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)):
                    ib.store(acc, [0], acc[0] + X[0, c, ih, iw])
                    ib.store(cnt, [0], cnt[0] + 1)
            ib.store(Y, [0, c, y, x], acc[0] / Cast("float32", cnt[0]))
    return ib.get()


AVG_POOL = CorpusCase("avg_pool", _avg_pool, reference={"avg_pool3x3": _avg_pool_reference})

# --------------------------------------------------------------------------- normalisation


def _softmax() -> IRModule:
    R, N = 4, 10
    ib = IRBuilder()
    with ib.prim_func("softmax"):
        X = ib.arg("X", (R, N), "float32")
        Y = ib.arg("Y", (R, N), "float32")
        with (ib.for_range(R, name="i") as i,
              ib.allocate("row_max", (1,), "float32", "local") as m,
              ib.allocate("row_sum", (1,), "float32", "local") as s,
              ib.allocate("e", (N,), "float32", "local") as e):
            ib.store(m, [0], f32(float("-inf")))
            with ib.for_range(N, name="j") as j:
                ib.store(m, [0], max_(m[0], X[i, j]))
            ib.store(s, [0], f32(0.0))
            with ib.for_range(N, name="j") as j:
                ib.store(e, [j], Intrin("exp", (X[i, j] - m[0],)))
                ib.store(s, [0], s[0] + e[j])
            with ib.for_range(N, name="j") as j:
                ib.store(Y, [i, j], e[j] / s[0])
    return ib.get()


def _softmax_reference(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


SOFTMAX = CorpusCase("softmax", _softmax, reference={"softmax": _softmax_reference},
                     rtol=1e-5, atol=1e-6)


def _layernorm() -> IRModule:
    R, N = 4, 16
    ib = IRBuilder()
    with ib.prim_func("layernorm"):
        X = ib.arg("X", (R, N), "float32")
        G = ib.arg("gamma", (N,), "float32")
        B = ib.arg("beta", (N,), "float32")
        Y = ib.arg("Y", (R, N), "float32")
        with ib.for_range(R, name="i") as i, ib.allocate("stats", (2,), "float32", "local") as st:
            ib.store(st, [0], f32(0.0))
            with ib.for_range(N, name="j") as j:
                ib.store(st, [0], st[0] + X[i, j])
            ib.store(st, [0], st[0] / float(N))
            ib.store(st, [1], f32(0.0))
            with ib.for_range(N, name="j") as j, ib.let("d", X[i, j] - st[0]) as d:
                ib.store(st, [1], st[1] + d * d)
            with (ib.let("inv_std", Intrin("rsqrt", (st[1] / float(N) + 1e-5,))) as inv,
                  ib.for_range(N, name="j") as j):
                ib.store(Y, [i, j], (X[i, j] - st[0]) * inv * G[j] + B[j])
    return ib.get()


def _layernorm_reference(x: np.ndarray, g: np.ndarray, b: np.ndarray,
                         y: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=1, keepdims=True)
    var = x64.var(axis=1, keepdims=True)
    return (x64 - mean) / np.sqrt(var + 1e-5) * g + b


LAYERNORM = CorpusCase("layernorm", _layernorm, reference={"layernorm": _layernorm_reference},
                       rtol=1e-4, atol=1e-5)

# --------------------------------------------------------------------------- constant weights

DENSE_W = np.random.default_rng(7).standard_normal((4, 8)).astype(np.float32)
DENSE_B = np.random.default_rng(8).standard_normal((4,)).astype(np.float32)


def _dense_const() -> IRModule:
    ib = IRBuilder()
    with ib.prim_func("dense_const"):
        X = ib.arg("X", (2, 8), "float32")
        Y = ib.arg("Y", (2, 4), "float32")
        W = ib.declare_const("W", DENSE_W)
        b = ib.declare_const("b", DENSE_B)
        with loop_nest(ib, (2, 4)) as (i, j):
            ib.store(Y, [i, j], b[j])
            with ib.for_range(8, name="k") as k:
                ib.store(Y, [i, j], Y[i, j] + X[i, k] * W[j, k])
    return ib.get()


def _dense_reference(x: np.ndarray, y: np.ndarray) -> Any:
    return x @ DENSE_W.T + DENSE_B


DENSE_CONST = CorpusCase("dense_const", _dense_const, reference={"dense_const": _dense_reference},
                         tags=frozenset({"constants"}))

CASES = [MATMUL, BATCH_MATMUL, CONV2D_NCHW, CONV2D_SELECT, DEPTHWISE_CONV, MAX_POOL, AVG_POOL,
         SOFTMAX, LAYERNORM, DENSE_CONST]

"""A corpus of IR modules written in the kiln.script DSL.

`DSL_CORPUS` maps a name to DSL text that `kiln.script.from_source` parses
into an IRModule (no external metadata needed: large constants travel in the
text's own `meta = {...}` section). The DSL tests print and re-parse every
entry; the IR-analysis tests may import it too (add this directory to
sys.path, or load the file with importlib).

`CORPUS_INPUTS` gives, for some entries, a function name and a builder of
numpy arguments with a reference result, for semantic checks with
`kiln.ir.evaluate`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.ir.metadata import format_section

DSL_CORPUS: dict[str, str] = {}


def _add(name: str, text: str) -> None:
    assert name not in DSL_CORPUS, name
    DSL_CORPUS[name] = text


_add("add_one", '''
from kiln.script import G, T, ir_module


@ir_module
class AddOne:
    @T.prim_func
    def add_one(X: T.Buffer((4,), "float32"), Y: T.Buffer((4,), "float32")):
        for i in T.serial(4):
            Y[i] = X[i] + T.float32(1)

    @G.function
    def main(x: G.Tensor((4,), "float32")) -> G.Tensor((4,), "float32"):
        y: G.Tensor((4,), "float32") = G.call_tensor("add_one", [x], G.Tensor((4,), "float32"))
        return y
''')

_add("elementwise_mul_relu", '''
@T.prim_func
def mul_relu(A: T.Buffer((2, 8), "float32"), B: T.Buffer((2, 8), "float32"),
             C: T.Buffer((2, 8), "float32")):
    for i in T.serial(2):
        for j in T.serial(8):
            C[i, j] = T.max(A[i, j] * B[i, j], 0.0)
''')

_add("broadcast_add", '''
@T.prim_func
def broadcast_add(A: T.Buffer((2, 3), "float32"), B: T.Buffer((3,), "float32"),
                  C: T.Buffer((2, 3), "float32")):
    for i in T.serial(2):
        for j in T.serial(3):
            C[i, j] = A[i, j] + B[j]
''')

_add("reduce_sum", '''
@T.prim_func
def reduce_sum(A: T.Buffer((4, 8), "float32"), B: T.Buffer((4,), "float32")):
    """Sum over axis 1 with a stack accumulator."""
    for i in T.serial(4):
        acc = T.allocate((1,), "float32", scope="local")
        acc[0] = T.float32(0)
        for k in T.serial(8):
            acc[0] = acc[0] + A[i, k]
        B[i] = acc[0]
''')

_add("reduce_max", '''
@T.prim_func
def reduce_max(A: T.Buffer((8, 4), "float32"), B: T.Buffer((4,), "float32")):
    for j in T.serial(4):
        B[j] = T.float32("-inf")
    for i in T.serial(8):
        for j in T.serial(4):
            B[j] = T.max(B[j], A[i, j])
''')

_add("reduce_mean", '''
@T.prim_func
def reduce_mean(A: T.Buffer((3, 4, 5), "float32"), B: T.Buffer((3, 5), "float32")):
    for i in T.serial(3):
        for k in T.serial(5):
            acc = T.allocate((1,), "float32", scope="local")
            acc[0] = 0.0
            for j in T.serial(4):
                acc[0] += A[i, j, k]
            B[i, k] = acc[0] / T.float32(4)
''')

_add("matmul", '''
@T.prim_func
def matmul(A: T.Buffer((4, 8), "float32"), B: T.Buffer((8, 3), "float32"),
           C: T.Buffer((4, 3), "float32")):
    for i in T.parallel(4):
        for j in T.serial(3):
            C[i, j] = T.float32(0)
            for k in T.serial(8):
                C[i, j] = C[i, j] + A[i, k] * B[k, j]
''')

_add("batch_matmul", '''
@T.prim_func
def batch_matmul(A: T.Buffer((2, 4, 8), "float32"), B: T.Buffer((2, 8, 3), "float32"),
                 C: T.Buffer((2, 4, 3), "float32")):
    for b in T.serial(2):
        for i in T.serial(4):
            for j in T.serial(3):
                acc = T.allocate((1,), "float32", scope="local")
                acc[0] = T.float32(0)
                for k in T.unrolled(8):
                    acc[0] = acc[0] + A[b, i, k] * B[b, k, j]
                C[b, i, j] = acc[0]
''')

_add("conv2d_nchw_pad", '''
@T.prim_func
def conv2d(X: T.Buffer((1, 2, 5, 5), "float32"), W: T.Buffer((4, 2, 3, 3), "float32"),
           Y: T.Buffer((1, 4, 5, 5), "float32")):
    """3x3 convolution, stride 1, zero padding 1 (bounds checked with if)."""
    for n in T.serial(1):
        for oc in T.serial(4):
            for oh in T.serial(5):
                for ow in T.serial(5):
                    acc = T.allocate((1,), "float32", scope="local")
                    acc[0] = T.float32(0)
                    for ic in T.serial(2):
                        for kh in T.serial(3):
                            for kw in T.serial(3):
                                with T.let(oh + kh - 1) as ih, T.let(ow + kw - 1) as iw:
                                    if (ih >= 0) & (ih < 5) & (iw >= 0) & (iw < 5):
                                        acc[0] = acc[0] + X[n, ic, ih, iw] * W[oc, ic, kh, kw]
                    Y[n, oc, oh, ow] = acc[0]
''')

_add("depthwise_conv2d_select", '''
@T.prim_func
def depthwise_conv2d(X: T.Buffer((1, 3, 6, 6), "float32"), W: T.Buffer((3, 1, 3, 3), "float32"),
                     Y: T.Buffer((1, 3, 6, 6), "float32")):
    """Depthwise 3x3, padding 1: out-of-range taps read a clamped index, select 0."""
    for c in T.serial(3):
        for h in T.serial(6):
            for w in T.serial(6):
                Y[0, c, h, w] = T.float32(0)
                for kh in T.serial(3):
                    for kw in T.serial(3):
                        Y[0, c, h, w] = Y[0, c, h, w] + T.select(
                            (h + kh >= 1) & (h + kh < 7) & (w + kw >= 1) & (w + kw < 7),
                            X[0, c, T.min(T.max(h + kh - 1, 0), 5), T.min(T.max(w + kw - 1, 0), 5)],
                            T.float32(0)) * W[c, 0, kh, kw]
''')

_add("max_pool2d", '''
@T.prim_func
def max_pool2d(X: T.Buffer((1, 2, 4, 4), "float32"), Y: T.Buffer((1, 2, 2, 2), "float32")):
    for c in T.serial(2):
        for oh in T.serial(2):
            for ow in T.serial(2):
                Y[0, c, oh, ow] = T.float32("-inf")
                for kh in T.serial(2):
                    for kw in T.serial(2):
                        Y[0, c, oh, ow] = T.max(Y[0, c, oh, ow], X[0, c, oh * 2 + kh, ow * 2 + kw])
''')

_add("avg_pool2d", '''
@T.prim_func
def avg_pool2d(X: T.Buffer((1, 2, 4, 4), "float32"), Y: T.Buffer((1, 2, 2, 2), "float32")):
    for c in T.serial(2):
        for oh in T.serial(2):
            for ow in T.serial(2):
                acc = T.allocate((1,), "float32", scope="local")
                acc[0] = T.float32(0)
                for kh in T.serial(2):
                    for kw in T.serial(2):
                        acc[0] = acc[0] + X[0, c, oh * 2 + kh, ow * 2 + kw]
                Y[0, c, oh, ow] = acc[0] * T.float32(0.25)
''')

_add("softmax", '''
@T.prim_func
def softmax(X: T.Buffer((2, 8), "float32"), Y: T.Buffer((2, 8), "float32")):
    for i in T.serial(2):
        mx = T.allocate((1,), "float32", scope="local")
        total = T.allocate((1,), "float32", scope="local")
        mx[0] = T.float32("-inf")
        for j in T.serial(8):
            mx[0] = T.max(mx[0], X[i, j])
        total[0] = T.float32(0)
        for j in T.serial(8):
            Y[i, j] = T.exp(X[i, j] - mx[0])
            total[0] = total[0] + Y[i, j]
        for j in T.serial(8):
            Y[i, j] = Y[i, j] / total[0]
''')

_add("layer_norm", '''
@T.prim_func
def layer_norm(X: T.Buffer((2, 8), "float32"), gamma: T.Buffer((8,), "float32"),
               beta: T.Buffer((8,), "float32"), Y: T.Buffer((2, 8), "float32")):
    for i in T.serial(2):
        stats = T.allocate((2,), "float32", scope="local")
        stats[0] = 0.0
        stats[1] = 0.0
        for j in T.serial(8):
            stats[0] += X[i, j]
        stats[0] = stats[0] / 8
        for j in T.serial(8):
            with T.let(X[i, j] - stats[0]) as d:
                stats[1] += d * d
        stats[1] = stats[1] / 8
        for j in T.serial(8):
            Y[i, j] = (X[i, j] - stats[0]) * T.rsqrt(stats[1] + T.float32(1e-05)) * gamma[j] \\
                + beta[j]
''')

_add("transpose", '''
@T.prim_func
def transpose(A: T.Buffer((2, 3, 4), "float32"), B: T.Buffer((4, 2, 3), "float32")):
    for i in T.serial(4):
        for j in T.serial(2):
            for k in T.serial(3):
                B[i, j, k] = A[j, k, i]
''')

_add("concat", '''
@T.prim_func
def concat(A: T.Buffer((2, 3), "float32"), B: T.Buffer((2, 5), "float32"),
           C: T.Buffer((2, 8), "float32")):
    for i in T.serial(2):
        for j in T.serial(8):
            if j < 3:
                C[i, j] = A[i, j]
            else:
                C[i, j] = B[i, j - 3]
''')

_add("gather_int64", '''
@T.prim_func
def gather(Data: T.Buffer((5, 3), "float32"), Idx: T.Buffer((4,), "int64"),
           Out: T.Buffer((4, 3), "float32")):
    """Gather rows; negative indices count from the end."""
    for i in T.serial(4):
        with T.let(T.select(Idx[i] < 0, Idx[i] + 5, Idx[i])) as row:
            for j in T.serial(3):
                Out[i, j] = Data[row, j]
''')

_add("cast", '''
@T.prim_func
def cast(A: T.Buffer((6,), "float32"), B: T.Buffer((6,), "int32"), C: T.Buffer((6,), "float64")):
    for i in T.serial(6):
        B[i] = T.cast(A[i], "int32")
        C[i] = T.cast(B[i], "float64") * T.float64(0.5)
''')

_add("clip", '''
@T.prim_func
def clip(X: T.Buffer((8,), "float32"), Y: T.Buffer((8,), "float32")):
    for i in T.vectorized(8):
        Y[i] = T.min(T.max(X[i], T.float32(-1.5)), T.float32(1.5))
''')

_add("where_select", '''
@T.prim_func
def where(Cond: T.Buffer((6,), "bool"), A: T.Buffer((6,), "float32"),
          B: T.Buffer((6,), "float32"), Y: T.Buffer((6,), "float32")):
    for i in T.serial(6):
        Y[i] = T.select(Cond[i], A[i], B[i])
''')

_add("control_flow", '''
@T.prim_func
def piecewise(X: T.Buffer((8,), "float32"), Y: T.Buffer((8,), "float32")):
    for i in T.serial(8):
        if X[i] < T.float32(-1):
            Y[i] = T.float32(-1)
        elif X[i] > 1.0:
            Y[i] = X[i] * X[i]
        else:
            if X[i] == 0.0:
                Y[i] = 0.0
            else:
                Y[i] = X[i]
''')

_add("call_extern_expf", '''
@T.prim_func
def exp_extern(X: T.Buffer((8,), "float32"), Y: T.Buffer((8,), "float32")):
    for i in T.serial(8):
        Y[i] = T.call_extern("expf", X[i], dtype="float32",
                             dependency=T.extern_dependency("libm", libs=("-lm",)))
''')

_add("call_extern_buffers", '''
@T.prim_func
def copy_extern(A: T.Buffer((16,), "float32"), B: T.Buffer((16,), "float32")):
    T.evaluate(T.call_extern("memcpy", B, A, T.uint64(64), dtype="uint64",
                             dependency=T.extern_dependency("libc", version_spec=">=2.17",
                                                            url="https://www.gnu.org/software/libc/",
                                                            url_type="url")))
''')

_add("call_func", '''
@ir_module
class CallFunc:
    @T.prim_func
    def scale(A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32"), n: T.int64,
              s: T.float32):
        for i in T.serial(n):
            B[i] = A[i] * s

    @T.prim_func
    def scale_twice(A: T.Buffer((8,), "float32"), B: T.Buffer((8,), "float32")):
        tmp = T.allocate((8,), "float32", scope="global")
        T.call_func("scale", [A, tmp, 8, T.float32(2)])
        T.call_func("scale", [tmp, B, 8, T.float32(3)])
''')

_add("alloc_const_inline", '''
@T.prim_func
def laplace(X: T.Buffer((5, 5), "float32"), Y: T.Buffer((3, 3), "float32")):
    K = T.alloc_const([[0.0, 1.0, 0.0], [1.0, -4.0, 1.0], [0.0, 1.0, 0.0]], "float32")
    for i in T.serial(3):
        for j in T.serial(3):
            Y[i, j] = T.float32(0)
            for di in T.serial(3):
                for dj in T.serial(3):
                    Y[i, j] = Y[i, j] + X[i + di, j + dj] * K[di, dj]
''')

_add("decl_buffer_arena", '''
@T.prim_func
def arena_views(X: T.Buffer((4,), "float32"), Y: T.Buffer((4,), "float32")):
    arena = T.allocate((64,), "uint8", scope="global")
    a = T.decl_buffer((4,), "float32", source=arena, byte_offset=0)
    b = T.decl_buffer((4,), "float32", source=arena, byte_offset=16)
    for i in T.serial(4):
        a[i] = X[i] * 2.0
    for i in T.serial(4):
        b[i] = a[i] + 1.0
    for i in T.serial(4):
        Y[i] = b[i]
''')

_add("mlp_graph", '''
@ir_module
class MLP:
    @T.prim_func
    def dense(X: T.Buffer((1, 4), "float32"), W: T.Buffer((4, 3), "float32"),
              B: T.Buffer((3,), "float32"), Y: T.Buffer((1, 3), "float32")):
        for j in T.serial(3):
            Y[0, j] = B[j]
            for k in T.serial(4):
                Y[0, j] = Y[0, j] + X[0, k] * W[k, j]

    @T.prim_func
    def relu(X: T.Buffer((1, 3), "float32"), Y: T.Buffer((1, 3), "float32")):
        for j in T.serial(3):
            Y[0, j] = T.max(X[0, j], T.float32(0))

    @T.prim_func
    def scale(X: T.Buffer((1, 3), "float32"), S: T.Buffer((), "float32"),
              Y: T.Buffer((1, 3), "float32")):
        for j in T.serial(3):
            Y[0, j] = X[0, j] * S[()]

    @G.function
    def main(x: G.Tensor((1, 4), "float32")) -> G.Tensor((1, 3), "float32"):
        w: G.Tensor((4, 3), "float32") = G.const(
            [[0.5, -1.0, 0.25], [1.0, 0.0, -0.5], [0.125, 2.0, 1.0], [-0.75, 0.5, 0.0]],
            "float32", name="dense.weight")
        b: G.Tensor((3,), "float32") = G.const([0.1, -0.2, 0.3], "float32", name="dense.bias")
        h: G.Tensor((1, 3), "float32") = G.call_tensor("dense", [x, w, b],
                                                       G.Tensor((1, 3), "float32"))
        r: G.Tensor((1, 3), "float32") = G.call_tensor("relu", [h], G.Tensor((1, 3), "float32"))
        y: G.Tensor((1, 3), "float32") = G.call_tensor(
            "scale", [r, G.const(2.0, "float32")], G.Tensor((1, 3), "float32"))
        return y
''')

_add("tuples", '''
@ir_module
class Tuples:
    @T.prim_func
    def split(X: T.Buffer((6,), "float32"), A: T.Buffer((3,), "float32"),
              B: T.Buffer((3,), "float32")):
        for i in T.serial(3):
            A[i] = X[i]
            B[i] = X[i + 3]

    @T.prim_func
    def add(A: T.Buffer((3,), "float32"), B: T.Buffer((3,), "float32"),
            C: T.Buffer((3,), "float32")):
        for i in T.serial(3):
            C[i] = A[i] + B[i]

    @G.function
    def main(x: G.Tensor((6,), "float32")) -> G.Tuple(G.Tensor((3,), "float32"),
                                                       G.Tensor((3,), "float32")):
        parts: G.Tuple(G.Tensor((3,), "float32"), G.Tensor((3,), "float32")) = G.call_tensor(
            "split", [x], G.Tuple(G.Tensor((3,), "float32"), G.Tensor((3,), "float32")))
        a: G.Tensor((3,), "float32") = parts[0]
        b: G.Tensor((3,), "float32") = parts[1]
        s: G.Tensor((3,), "float32") = G.call_tensor("add", [a, b], G.Tensor((3,), "float32"))
        return (s, a)
''')

_add("nested_tuple_params", '''
@G.function
def pick(t: G.Tuple(G.Tensor((2,), "int32"), G.Tuple(G.Tensor((3,), "float32"))),
         u: G.Tuple()) -> G.Tuple(G.Tensor((3,), "float32"), G.Tuple()):
    inner: G.Tuple(G.Tensor((3,), "float32")) = t[1]
    one: G.Tuple(G.Tensor((3,), "float32"), G.Tuple()) = (inner[0], u)
    return one
''')

_add("graph_ops", '''
@G.function
def cnn(x: G.Tensor((1, 3, 8, 8), "float32"),
        w: G.Tensor((4, 3, 3, 3), "float32")) -> G.Tensor((1, 64), "float32"):
    y: G.Tensor((1, 4, 8, 8), "float32") = G.op("conv2d", x, w, strides=(1, 1), pads=(1, 1, 1, 1),
                                                dilations=(1, 1), group=1, auto_pad="NOTSET")
    z: G.Tensor((1, 4, 8, 8), "float32") = G.op("relu", y)
    p: G.Tensor((1, 4, 4, 4), "float32") = G.op("max_pool2d", z, kernel_shape=(2, 2),
                                                strides=(2, 2))
    f: G.Tensor((1, 64), "float32") = G.op("reshape", p, shape=(1, 64))
    s: G.Tensor((1, 64), "float32") = G.op(
        "add", G.op("softmax", f, axis=-1, ret=G.Tensor((1, 64), "float32")),
        G.const(0.5, "float32"), attrs={"kiln.note": "not an identifier", "ret": None})
    return s
''')

_add("symbolic_graph", '''
@G.function
def dyn(x: G.Tensor((n, 4), "float32"), y: G.Tensor((n, 4), "float32")
        ) -> G.Tuple(G.Tensor((n * 2, 4), "float32"), G.Tensor((n, 4), "float32")):
    z: G.Tensor((n, 4), "float32") = G.op("add", x, y)
    w: G.Tensor((n * 2, 4), "float32") = G.op("concat", z, z, axis=0)
    v: G.Tensor((n * 2, 4), "float32") = G.op("relu", w)
    return (v, G.op("relu", z, ret=G.Tensor((n, 4), "float32")))
''')

_add("scalar_params_saxpy", '''
@T.prim_func
def saxpy(n: T.int64, alpha: T.float32, X: T.Buffer((n,), "float32"),
          Y: T.Buffer((n,), "float32"), Out: T.Buffer((n,), "float32")):
    for i in T.serial(n):
        Out[i] = alpha * X[i] + Y[i]
''')

_add("int_ops", '''
@T.prim_func
def int_ops(A: T.Buffer((8,), "int32"), B: T.Buffer((8,), "int32"),
            C: T.Buffer((8, 8), "int32")):
    for i in T.serial(8):
        C[i, 0] = A[i] // B[i]
        C[i, 1] = A[i] % B[i]
        C[i, 2] = T.truncdiv(A[i], B[i])
        C[i, 3] = T.truncmod(A[i], B[i])
        C[i, 4] = (A[i] << 2) | (B[i] >> 1)
        C[i, 5] = A[i] & B[i] ^ T.int32(255)
        C[i, 6] = -A[i] + T.min(A[i], B[i])
        C[i, 7] = T.max(A[i], B[i]) * 3 - ~B[i]
''')

_add("math_intrinsics", '''
@T.prim_func
def math_ops(X: T.Buffer((8,), "float32"), Y: T.Buffer((8, 13), "float32"),
             Flags: T.Buffer((8, 2), "bool")):
    for i in T.serial(8):
        Y[i, 0] = T.exp(X[i])
        Y[i, 1] = T.log(T.abs(X[i]) + 1.0)
        Y[i, 2] = T.sqrt(T.abs(X[i]))
        Y[i, 3] = T.tanh(X[i])
        Y[i, 4] = T.sigmoid(X[i])
        Y[i, 5] = T.erf(X[i])
        Y[i, 6] = T.round(X[i] * 2.0)
        Y[i, 7] = T.floor(X[i]) + T.ceil(X[i])
        Y[i, 8] = T.pow(T.abs(X[i]), T.float32(1.5))
        Y[i, 9] = T.atan2(X[i], T.float32(2))
        Y[i, 10] = T.fmod(X[i], T.float32(0.75))
        Y[i, 11] = X[i] ** T.float32(2)
        Y[i, 12] = T.exp2(T.log2(T.abs(X[i]) + 1.0)) - T.expm1(T.log1p(T.abs(X[i])))
        Flags[i, 0] = T.isnan(X[i])
        Flags[i, 1] = T.isinf(X[i]) | (X[i] != X[i])
''')

_add("lets", '''
@T.prim_func
def lets(A: T.Buffer((4, 4), "float32"), B: T.Buffer((4,), "float32")):
    for i in T.serial(4):
        base = T.let(i * 4)
        base32 = T.let(T.cast(base, "int32"), dtype="int32")
        ends = T.let(A[i, 0] + A[i, 3])
        B[i] = ends * T.cast(base32 + 1, "float32")
''')

_add("let_nested_with_form", '''
@T.prim_func
def lets(A: T.Buffer((4, 4), "float32"), B: T.Buffer((4,), "float32")):
    for i in T.serial(4):
        with T.let(i * 4) as base:
            with T.let(T.cast(base, "int32"), dtype="int32") as base32:
                with T.let(A[i, 0] + A[i, 3]) as ends:
                    B[i] = ends * T.cast(base32 + 1, "float32")
''')

_add("loop_kinds", '''
@T.prim_func
def loop_kinds(A: T.Buffer((4, 16), "float32"), B: T.Buffer((4, 16), "float32")):
    for i in T.parallel(4):
        for jo in T.serial(4):
            for ji in T.vectorized(4):
                B[i, jo * 4 + ji] = A[i, jo * 4 + ji] * 2.0
    for i in T.unrolled(2, 4):
        for j in range(1, 16):
            B[i, j] = B[i, j] + B[i, j - 1]
    for j in T.scalar(16):
        B[0, j] = B[0, j] * B[1, j]
    for i in T.serial(T.int32(0), T.int32(2)):
        for j in T.serial(3, extent=2):
            B[T.cast(i, "int64"), j] = T.float32(0)
''')

_add("attrs", '''
@ir_module
class WithAttrs:
    I.module_attrs({"kiln.name": "demo", "version": 3, "tags": ["a", "b"], "opt": None})

    @T.prim_func
    def main_kernel(X: T.Buffer((2,), "float32"), Y: T.Buffer((2,), "float32")):
        T.func_attr({"kiln.graph": True, "kiln.num_outputs": 1, "kiln.tuple_result": False,
                     "kiln.output_names": ("y",), "scale": 0.5, "nested": {"k": [1, (2, 3)]}})
        for i in T.serial(2):
            Y[i] = X[i]

    @G.function
    def main(x: G.Tensor((2,), "float32")) -> G.Tensor((2,), "float32"):
        G.func_attr({"kiln.entry": True})
        y: G.Tensor((2,), "float32") = G.call_tensor("main_kernel", [x], G.Tensor((2,), "float32"))
        return y
''')

_add("special_floats", '''
@T.prim_func
def special(X: T.Buffer((4,), "float32"), Y: T.Buffer((4,), "float64"),
            Z: T.Buffer((4,), "float16")):
    for i in T.serial(4):
        Y[i] = T.select(T.isnan(X[i]), T.float64("nan"), T.cast(X[i], "float64") + T.float64(0.1))
        Z[i] = T.cast(T.min(T.max(X[i], T.float32("-inf")), T.float32("inf")), "float16") \\
            * T.float16(0.5)
    X[0] = T.float32(-0.0)
    X[1] = T.float32(3.4028234663852886e+38)
    X[2] = T.float32(1.401298464324817e-45)
    X[3] = -T.float32(2.5)
''')

_add("small_ints", '''
@T.prim_func
def quantize(X: T.Buffer((8,), "float32"), Q: T.Buffer((8,), "uint8"), S: T.Buffer((8,), "int8"),
             W: T.Buffer((8,), "uint64")):
    for i in T.serial(8):
        with T.let(T.round(X[i] / T.float32(0.05)) + T.float32(128)) as v:
            Q[i] = T.cast(T.min(T.max(v, 0.0), 255.0), "uint8")
            S[i] = T.cast(T.min(T.max(v - 128.0, -128.0), 127.0), "int8")
            W[i] = T.cast(Q[i], "uint64") * T.uint64(18446744073709551615)
''')

_add("zero_dim", '''
@T.prim_func
def dot(A: T.Buffer((4,), "float32"), B: T.Buffer((4,), "float32"), Out: T.Buffer((), "float32")):
    Out[()] = 0.0
    for i in T.serial(4):
        Out[()] = Out[()] + A[i] * B[i]
''')

_add("pass_and_evaluate", '''
@T.prim_func
def odd(A: T.Buffer((4,), "float32"), flag: T.bool):
    if flag:
        pass
    else:
        A[0] = T.float32(1)
    T.evaluate(0)
''')

_add("bool_logic", '''
@T.prim_func
def bool_logic(A: T.Buffer((4,), "bool"), B: T.Buffer((4,), "bool"), C: T.Buffer((4, 3), "bool")):
    for i in T.serial(4):
        C[i, 0] = A[i] & B[i]
        C[i, 1] = A[i] | ~B[i]
        C[i, 2] = (A[i] ^ B[i]) == T.bool(True)
''')


def _meta_entry() -> str:
    weights = (np.arange(48, dtype=np.float32).reshape(4, 12) - 20.0) * np.float32(0.125)
    bias = np.linspace(-1.0, 1.0, 20).astype(np.float64)
    section = format_section({"fc.weight": weights, "bias": bias})
    return '''
from kiln.script import G, T, ir_module


@ir_module
class WithMetadata:
    @T.prim_func
    def fc(X: T.Buffer((12,), "float32"), Y: T.Buffer((4,), "float32")):
        W = T.alloc_const(meta["fc.weight"])
        for i in T.serial(4):
            Y[i] = T.float32(0)
            for k in T.serial(12):
                Y[i] = Y[i] + W[i, k] * X[k]

    @G.function
    def main(x: G.Tensor((20,), "float64")) -> G.Tensor((20,), "float64"):
        b: G.Tensor((20,), "float64") = G.const(meta["bias"], name="bias")
        y: G.Tensor((20,), "float64") = G.op("add", x, b)
        return y


''' + section


_add("metadata_section", _meta_entry())


# --------------------------------------------------------------------------- semantics

def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _f32(*shape: int) -> np.ndarray:
    return _rng(sum(shape)).standard_normal(shape).astype(np.float32)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _conv_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((1, w.shape[0], 5, 5), np.float32)
    for oc in range(w.shape[0]):
        for h in range(5):
            for v in range(5):
                out[0, oc, h, v] = np.sum(xp[0, :, h:h + 3, v:v + 3] * w[oc])
    return out


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-5) * g + b


# name -> (function, inputs, index of the output argument, reference output)
CaseBuilder = Callable[[], tuple[str, list[np.ndarray], int, Any]]


def _case(fn: str, inputs: list[np.ndarray], out: int, ref: Any) -> CaseBuilder:
    return lambda: (fn, inputs, out, ref)


def _int_ops_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    trunc = (np.abs(a) // np.abs(b)) * np.sign(a) * np.sign(b)
    cols = [a // b, a % b, trunc, np.fmod(a, b), (a << 2) | (b >> 1), (a & b) ^ 255,
            -a + np.minimum(a, b), np.maximum(a, b) * 3 - ~b]
    return np.stack(cols, axis=1).astype(np.int32)


def _cases() -> dict[str, CaseBuilder]:
    a, b = _f32(2, 8), _f32(8, 2)
    m = _f32(4, 8)
    x5 = _f32(1, 2, 5, 5)
    w5 = _f32(4, 2, 3, 3)
    ln = _f32(2, 8)
    g, be = _f32(8), _f32(1, 8)[0]
    idx = np.array([0, -1, 3, 2], np.int64)
    data = _f32(5, 3)
    ia = np.array([7, -7, 7, -7, 0, 100, -100, 12345], np.int32)
    ib = np.array([2, 2, -2, -2, 3, 7, 7, -9], np.int32)
    return {
        "int_ops": _case("int_ops", [ia, ib, np.zeros((8, 8), np.int32)], 2,
                         _int_ops_ref(ia, ib)),
        "elementwise_mul_relu": _case("mul_relu", [a, b.reshape(2, 8), np.zeros((2, 8), "f4")],
                                      2, np.maximum(a * b.reshape(2, 8), 0)),
        "reduce_sum": _case("reduce_sum", [m, np.zeros(4, "f4")], 1, m.sum(axis=1)),
        "matmul": _case("matmul", [m, _f32(8, 3), np.zeros((4, 3), "f4")], 2,
                        m @ _f32(8, 3)),
        "conv2d_nchw_pad": _case("conv2d", [x5, w5, np.zeros((1, 4, 5, 5), "f4")], 2,
                                 _conv_ref(x5, w5)),
        "softmax": _case("softmax", [a, np.zeros((2, 8), "f4")], 1, _softmax(a)),
        "layer_norm": _case("layer_norm", [ln, g, be, np.zeros((2, 8), "f4")], 3,
                            _layer_norm(ln, g, be)),
        "gather_int64": _case("gather", [data, idx, np.zeros((4, 3), "f4")], 2, data[idx]),
        "transpose": _case("transpose", [_f32(2, 3, 4), np.zeros((4, 2, 3), "f4")], 1,
                           _f32(2, 3, 4).transpose(2, 0, 1)),
    }


CORPUS_CASES: dict[str, CaseBuilder] = _cases()

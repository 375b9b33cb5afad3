"""Kernels with symbolic extents (issue 12): graph modules whose types have dimension
variables, run through the default graph pipeline up to legalization, then
- on the interpreter, which passes a kernel its trailing dim scalars by name, and
- with every kernel compiled by the llvm backend and called directly (buffers, then the
  int64 dims sorted by name), the graph's bindings run in order by a small driver,
at several sizes (1, and sizes that are no multiple of any tile) against numpy."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kiln.ir import evaluate
from kiln.ir import graph as g
from kiln.ir.module import IRModule
from kiln.ir.shape_expr import eval_dim
from kiln.ir.tensor import Buffer, PrimFunc, Var
from kiln.ir.types import TensorType
from kiln.script.source import from_source
from kiln.transform.pipeline import default_graph_pipeline, default_tensor_pipeline
from support.numerics import assert_close_to_scale
from support.seeds import reseed

RNG = np.random.default_rng(12)
SIZES = (1, 2, 7, 33, 64)
# attention's products: seq around the register tile (6 x 16 on AVX2) and past 128
SEQ_SIZES = (1, 7, 33, 200)
HEAD = 24  # no multiple of the vector width


@pytest.fixture(autouse=True)
def _per_test_rng(request: pytest.FixtureRequest) -> None:
    reseed(request)  # RNG per test, from its node id (support.seeds)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w + b


def _conv(x: np.ndarray, w: np.ndarray, stride: int, pad: int, groups: int) -> np.ndarray:
    """NCHW conv2d with square stride and padding (the reference of the conv cases)."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    co, ci, kh, kw = w.shape
    oh, ow = (xp.shape[2] - kh) // stride + 1, (xp.shape[3] - kw) // stride + 1
    out = np.zeros((x.shape[0], co, oh, ow), np.float32)
    per = co // groups
    for grp in range(groups):
        xs, ws = xp[:, ci * grp:ci * (grp + 1)], w[per * grp:per * (grp + 1)]
        for i in range(oh):
            for j in range(ow):
                patch = xs[:, :, stride * i:stride * i + kh, stride * j:stride * j + kw]
                out[:, per * grp:per * (grp + 1), i, j] = np.einsum("nchw,ochw->no", patch, ws)
    return out


def _conv_grouped(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return _conv(x, w, 2, 1, 2)


# Constant weights of the dense case: packed at compile time (block-matmuls), N = 37
# is no multiple of a panel.
W = np.round(RNG.standard_normal((19, 37)), 3).astype(np.float32)
BIAS = np.round(RNG.standard_normal(37), 3).astype(np.float32)
# Constant conv weights: block-convolutions picks the row-tiled, blocked (groups) and
# depthwise kernels, whose batch loop is then symbolic.
W_ROWS = np.round(RNG.standard_normal((8, 3, 3, 3)), 3).astype(np.float32)
W_GROUPS = np.round(RNG.standard_normal((6, 2, 3, 3)), 3).astype(np.float32)
W_DW = np.round(RNG.standard_normal((4, 1, 3, 3)), 3).astype(np.float32)
CONV_KERNELS = {"conv_rows": "conv2d_rows", "conv_blocked_groups": "conv2d_blocked",
                "conv_depthwise": "conv2d_depthwise"}


def _conv_case(c_in: int, hw: int, w: np.ndarray, stride: int, groups: int,
               relu: bool = False) -> tuple[str, Any, Any]:
    """A conv2d (3x3, pad 1) with constant weights `w` over `[n, c_in, hw, hw]`."""
    c_out, o = w.shape[0], (hw + 2 - 3) // stride + 1
    t = f'G.Tensor((n, {c_out}, {o}, {o}), "float32")'
    src = f'''
@G.function
def main(x: G.Tensor((n, {c_in}, {hw}, {hw}), "float32")) -> {t}:
    y: {t} = G.op("conv2d", x, G.const({w.tolist()}, "float32", name="w"),
        strides=({stride}, {stride}), pads=(1, 1, 1, 1), dilations=(1, 1), group={groups},
        auto_pad="NOTSET")
    return y
'''
    if relu:
        src = src.replace("    return y\n", f'    r: {t} = G.op("relu", y)\n    return r\n')
    return (src, lambda n: [(n, c_in, hw, hw)],
            lambda x: np.maximum(_conv(x, w, stride, 1, groups), 0 if relu else -np.inf))


def _pool_case(kind: str) -> tuple[str, Any, Any]:
    """A 2x2 stride-2 `{kind}_pool2d` over `[n, 3, 6, 6]`."""
    src = f'''
@G.function
def main(x: G.Tensor((n, 3, 6, 6), "float32")) -> G.Tensor((n, 3, 3, 3), "float32"):
    y: G.Tensor((n, 3, 3, 3), "float32") = G.op("{kind}_pool2d", x, kernel_shape=(2, 2),
                                                strides=(2, 2))
    return y
'''
    def reference(x: np.ndarray) -> np.ndarray:
        windows = x.reshape(x.shape[0], 3, 3, 2, 3, 2)
        return windows.max((3, 5)) if kind == "max" else windows.mean((3, 5))

    return src, lambda n: [(n, 3, 6, 6)], reference


def _attention_case(product: str) -> tuple[str, Any, Any]:
    """One of attention's batched products over a symbolic seq `n`, 2 heads, head dim
    HEAD: "scores" `Q @ K^T` (seq is M and N; K given as K^T, its batch broadcast
    from 1), "scores_tb" the same with K stored `[seq, HEAD]` (`transpose_b`),
    "context" `P @ V` (seq is M and the depth K)."""
    scores = 'G.Tensor((2, n, n), "float32")'
    if product == "context":
        src = f'''
@G.function
def main(p: {scores}, v: G.Tensor((2, n, {HEAD}), "float32")
         ) -> G.Tensor((2, n, {HEAD}), "float32"):
    y: G.Tensor((2, n, {HEAD}), "float32") = G.op("matmul", p, v)
    return y
'''
        return src, lambda n: [(2, n, n), (2, n, HEAD)], lambda p, v: p @ v
    if product == "scores_tb":
        src = f'''
@G.function
def main(q: G.Tensor((2, n, {HEAD}), "float32"), k: G.Tensor((2, n, {HEAD}), "float32")
         ) -> {scores}:
    y: {scores} = G.op("matmul", q, k, transpose_b=True)
    return y
'''
        return (src, lambda n: [(2, n, HEAD), (2, n, HEAD)],
                lambda q, k: q @ k.transpose(0, 2, 1))
    src = f'''
@G.function
def main(q: G.Tensor((2, n, {HEAD}), "float32"), kt: G.Tensor((1, {HEAD}, n), "float32")
         ) -> {scores}:
    y: {scores} = G.op("matmul", q, kt)
    return y
'''
    return src, lambda n: [(2, n, HEAD), (1, HEAD, n)], lambda q, kt: q @ kt


def _reduce_case(op: str, in_shape: str, out_shape: str, attrs: str,
                 shapes: Callable[[int], tuple[int, ...]], reference: Callable[..., Any]
                 ) -> tuple[str, Any, Any]:
    """A one-op reduction `op(x, attrs)` from `in_shape` to `out_shape` (texts over n)."""
    src = f'''
@G.function
def main(x: G.Tensor({in_shape}, "float32")) -> G.Tensor({out_shape}, "float32"):
    y: G.Tensor({out_shape}, "float32") = G.op("{op}", x{attrs})
    return y
'''
    return src, lambda n: [shapes(n)], reference


# name -> (graph source with dimension variable n, input shapes given n, numpy reference)
CASES: dict[str, tuple[str, Callable[[int], list[tuple[int, ...]]], Callable[..., Any]]] = {
    "broadcast_add_relu": ('''
@G.function
def main(x: G.Tensor((n, 24), "float32"), y: G.Tensor((24,), "float32")
         ) -> G.Tensor((n, 24), "float32"):
    z: G.Tensor((n, 24), "float32") = G.op("add", x, y)
    r: G.Tensor((n, 24), "float32") = G.op("relu", z)
    return r
''', lambda n: [(n, 24), (24,)], lambda x, y: np.maximum(x + y, 0)),
    "softmax_rows": ('''
@G.function
def main(x: G.Tensor((n, 40), "float32")) -> G.Tensor((n, 40), "float32"):
    w: G.Tensor((n, 40), "float32") = G.op("softmax", x, axis=-1)
    return w
''', lambda n: [(n, 40)], _softmax),
    "layer_norm_rows": ('''
@G.function
def main(x: G.Tensor((n, 3, 20), "float32"), w: G.Tensor((20,), "float32"),
         b: G.Tensor((20,), "float32")) -> G.Tensor((n, 3, 20), "float32"):
    y: G.Tensor((n, 3, 20), "float32") = G.op("layer_norm", x, w, b, axis=-1, epsilon=1e-5)
    return y
''', lambda n: [(n, 3, 20), (20,), (20,)], _layer_norm),
    "reduce_sum_rows": ('''
@G.function
def main(x: G.Tensor((n, 17), "float32")) -> G.Tensor((n,), "float32"):
    y: G.Tensor((n,), "float32") = G.op("reduce_sum", x, axes=(1,), keepdims=False)
    return y
''', lambda n: [(n, 17)], lambda x: x.sum(1)),
    "matmul_rows": ('''
@G.function
def main(x: G.Tensor((n, 19), "float32"), w: G.Tensor((19, 13), "float32")
         ) -> G.Tensor((n, 13), "float32"):
    y: G.Tensor((n, 13), "float32") = G.op("matmul", x, w)
    return y
''', lambda n: [(n, 19), (19, 13)], lambda x, w: x @ w),
    "attention_matmul": ('''
@G.function
def main(q: G.Tensor((n, 2, 5, 8), "float32"), k: G.Tensor((n, 2, 8, 5), "float32")
         ) -> G.Tensor((n, 2, 5, 5), "float32"):
    y: G.Tensor((n, 2, 5, 5), "float32") = G.op("matmul", q, k)
    return y
''', lambda n: [(n, 2, 5, 8), (n, 2, 8, 5)], lambda q, k: q @ k),
    "transpose": ('''
@G.function
def main(x: G.Tensor((n, 3, 4), "float32")) -> G.Tensor((4, n, 3), "float32"):
    y: G.Tensor((4, n, 3), "float32") = G.op("transpose", x, perm=(2, 0, 1))
    return y
''', lambda n: [(n, 3, 4)], lambda x: x.transpose(2, 0, 1)),
    "concat_slice_reshape": ('''
@G.function
def main(x: G.Tensor((n, 6), "float32"), y: G.Tensor((n, 2), "float32")
         ) -> G.Tensor((n, 2, 3), "float32"):
    c: G.Tensor((n, 8), "float32") = G.op("concat", x, y, axis=1)
    s: G.Tensor((n, 6), "float32") = G.op("strided_slice", c, starts=(1,), ends=(7,), axes=(1,))
    r: G.Tensor((n, 2, 3), "float32") = G.op("reshape", s, shape=(-1, 2, 3))
    return r
''', lambda n: [(n, 6), (n, 2)],
        lambda x, y: np.concatenate([x, y], 1)[:, 1:7].reshape(-1, 2, 3)),
    "conv_symbolic_batch": ('''
@G.function
def main(x: G.Tensor((n, 4, 9, 9), "float32"), w: G.Tensor((6, 2, 3, 3), "float32")
         ) -> G.Tensor((n, 6, 5, 5), "float32"):
    y: G.Tensor((n, 6, 5, 5), "float32") = G.op("conv2d", x, w, strides=(2, 2),
        pads=(1, 1, 1, 1), dilations=(1, 1), group=2, auto_pad="NOTSET")
    return y
''', lambda n: [(n, 4, 9, 9), (6, 2, 3, 3)], _conv_grouped),
    "max_pool": _pool_case("max"),
    "dense_packed_bias_relu": (f'''
@G.function
def main(x: G.Tensor((n, 19), "float32")) -> G.Tensor((n, 37), "float32"):
    y: G.Tensor((n, 37), "float32") = G.op(
        "matmul", x, G.const({W.tolist()}, "float32", name="w"))
    z: G.Tensor((n, 37), "float32") = G.op(
        "add", y, G.const({BIAS.tolist()}, "float32", name="b"))
    r: G.Tensor((n, 37), "float32") = G.op("relu", z)
    return r
''', lambda n: [(n, 19)], lambda x: np.maximum(x @ W + BIAS, 0)),
    "gather_rows": ('''
@G.function
def main(t: G.Tensor((10, 6), "float32"), i: G.Tensor((n,), "int64")
         ) -> G.Tensor((n, 6), "float32"):
    y: G.Tensor((n, 6), "float32") = G.op("gather", t, i, axis=0)
    return y
''', lambda n: [(10, 6), RNG.integers(-10, 10, n)], lambda t, i: t[i]),
    "avg_pool": _pool_case("avg"),
    "conv_rows": _conv_case(3, 10, W_ROWS, 1, 1, relu=True),
    "conv_blocked_groups": _conv_case(4, 9, W_GROUPS, 2, 2),
    "conv_depthwise": _conv_case(4, 7, W_DW, 1, 4),
    "attention_scores": _attention_case("scores"),
    "attention_scores_transpose_b": _attention_case("scores_tb"),
    "attention_context": _attention_case("context"),
    # reductions over trailing axes (row kernels) with a symbolic row count or length
    "reduce_mean_length": _reduce_case("reduce_mean", "(3, n)", "(3, 1)",
                                       ", axes=(1,), keepdims=True", lambda n: (3, n),
                                       lambda x: x.mean(1, keepdims=True)),
    "reduce_max_rows_and_length": _reduce_case(
        "reduce_max", "(n, 2, n)", "(n,)", ", axes=(1, 2), keepdims=False",
        lambda n: (n, 2, n), lambda x: x.max((1, 2))),
    "global_avg_pool": _reduce_case("global_avg_pool", "(n, 4, 3, 5)", "(n, 4, 1, 1)", "",
                                    lambda n: (n, 4, 3, 5),
                                    lambda x: x.mean((2, 3), keepdims=True)),
    "global_max_pool_spatial": _reduce_case("global_max_pool", "(2, 3, n, 3)", "(2, 3, 1, 1)",
                                            "", lambda n: (2, 3, n, 3),
                                            lambda x: x.max((2, 3), keepdims=True)),
    # a leading axis: the tensor-expression kernel, its reduction extent symbolic
    "reduce_mean_leading_axis": _reduce_case("reduce_mean", "(n, 5)", "(5,)",
                                             ", axes=(0,), keepdims=False", lambda n: (n, 5),
                                             lambda x: x.mean(0)),
}
ROW_REDUCTIONS = {"reduce_sum_rows": "reduce_sum", "reduce_mean_length": "reduce_mean",
                  "reduce_max_rows_and_length": "reduce_max",
                  "global_avg_pool": "global_avg_pool",
                  "global_max_pool_spatial": "global_max_pool"}


def _sizes(case: str) -> tuple[int, ...]:
    return SEQ_SIZES if case.startswith("attention_") else SIZES


def _legalized(src: str) -> IRModule:
    mod = from_source(src)
    for p in default_graph_pipeline().passes:
        if p.name == "lower-graph-to-tensor":  # dyn-abi's layer: not tested here
            break
        mod = p(mod)
    return mod


def _inputs(case: str, n: int) -> list[np.ndarray]:
    """Standard-normal float32 arrays of the case's shapes (arrays given are taken as is)."""
    return [s if isinstance(s, np.ndarray) else RNG.standard_normal(s).astype(np.float32)
            for s in CASES[case][1](n)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernels_take_their_dims_as_trailing_scalars(case: str) -> None:
    mod = _legalized(CASES[case][0])
    prims = [f for f in mod.functions.values() if isinstance(f, PrimFunc)]
    assert prims
    for f in prims:
        n_bufs = len(f.buffer_params)
        assert all(isinstance(p, Buffer) for p in f.params[:n_bufs])
        tail = f.params[n_bufs:]
        assert [p.name for p in tail] == ["n"], f.params
        assert isinstance(tail[0], Var) and tail[0].dtype == "int64"
    # the hand-built kernels, not the te fallbacks
    if case == "dense_packed_bias_relu":
        assert [f.attrs.get("kiln.gemm_kernel") for f in prims] == ["matmul_packed"]
    if case in CONV_KERNELS:
        assert [f.attrs.get("kiln.conv_kernel") for f in prims] == [CONV_KERNELS[case]]
    if case in ("softmax_rows", "layer_norm_rows"):
        assert [f.attrs.get("kiln.row_kernel") for f in prims] == [case.split("_rows")[0]]
    if case in ROW_REDUCTIONS:
        assert [f.attrs.get("kiln.row_kernel") for f in prims] == [ROW_REDUCTIONS[case]]
    if case.startswith("attention_") or case == "attention_matmul":
        assert [f.attrs.get("kiln.gemm_kernel") for f in prims] == ["matmul_tiled"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_interpreter_passes_dims_by_name(case: str) -> None:
    mod = _legalized(CASES[case][0])
    for n in _sizes(case):
        args = _inputs(case, n)
        np.testing.assert_allclose(evaluate(mod, "main", *args), CASES[case][2](*args),
                                   rtol=1e-4, atol=1e-5)


def _llvm_kernels(mod: IRModule) -> tuple[Any, dict[str, Any]]:
    """Every PrimFunc of `mod` through the tensor pipeline and the llvm backend (MCJIT)."""
    from llvmlite import binding as llvm

    from kiln.codegen.constants import ConstantPool
    from kiln.codegen.llvm.codegen import compile_module
    from kiln.codegen.llvm.jit_loader import bind_constants
    from kiln.ir.outlined import kernel_funcs
    from kiln.target import Target
    from kiln.transform.outline import OutlineParallelLoops

    prims = {k: f for k, f in mod.functions.items() if isinstance(f, PrimFunc)}
    tmod = OutlineParallelLoops()(default_tensor_pipeline()(IRModule(prims)))
    pool = ConstantPool.from_module(tmod)
    c = compile_module(tmod, Target("llvmjit"), prefix="kiln_", pool=pool, jit=True)
    bitcode = llvm.parse_bitcode(c.module.as_bitcode())
    engine = llvm.create_mcjit_compiler(bitcode, c.target_machine)
    consts = bind_constants(engine, bitcode, "kiln_", bytes(pool.to_bytes()),
                            pool.table_entries())  # as the llvmjit loader does
    engine.finalize_object()
    engine.kiln_constants = consts  # kept alive as long as the engine
    kernels = {}
    for name, f in kernel_funcs(tmod).items():  # loop bodies are internal
        sig = [ctypes.c_void_p if isinstance(p, Buffer) else ctypes.c_int64 for p in f.params]
        kernels[name] = (f, ctypes.CFUNCTYPE(ctypes.c_int32, *sig)(
            engine.get_function_address(f"kiln__kernel_{name}")))
    return engine, kernels


def _run_graph(fn: g.Function, kernels: dict[str, Any], args: list[np.ndarray],
               dims: dict[str, int]) -> np.ndarray:
    """Run `fn`'s CallTensor bindings in order, each kernel called with its dims by name."""
    env: dict[int, np.ndarray] = {id(p): a for p, a in zip(fn.params, args)}
    for b in fn.bindings:
        call = b.value
        if isinstance(call, g.Constant):
            env[id(b.var)] = np.ascontiguousarray(call.data)
            continue
        assert isinstance(call, g.CallTensor) and isinstance(b.var.type, TensorType)
        f, kernel = kernels[call.func]
        out = np.empty([eval_dim(d, dims) for d in b.var.type.shape], np.float32)
        ins = [np.ascontiguousarray(a.data) if isinstance(a, g.Constant) else env[id(a)]
               for a in call.args]
        scalars = [dims[p.name] for p in f.params[len(ins) + 1:]]
        assert kernel(*(a.ctypes.data for a in [*ins, out]), *scalars) == 0
        env[id(b.var)] = out
    return env[id(fn.result)]


def _check_sizes(case: str, mod: IRModule, kernels: dict[str, Any]) -> None:
    fn = mod["main"]
    assert isinstance(fn, g.Function)
    for n in _sizes(case):
        args = _inputs(case, n)
        got = _run_graph(fn, kernels, args, {"n": n})
        assert_close_to_scale(got, CASES[case][2](*args), rtol=1e-4, scaled_atol=1e-5)


@pytest.mark.parametrize("case", sorted(CASES))
def test_llvm_kernels_at_several_sizes(case: str) -> None:
    # One run: the JIT defines a serial parallel-for in its module (it has no host.c), so
    # no thread count reaches these kernels (tests/codegen/test_parallel.py runs the
    # host's pool at several counts).
    mod = _legalized(CASES[case][0])
    engine, kernels = _llvm_kernels(mod)
    _check_sizes(case, mod, kernels)
    del engine


def _c_kernels(mod: IRModule, directory: Any) -> tuple[Any, dict[str, Any]]:
    """Every PrimFunc of `mod` through the serial tensor passes and the C backend's kernel
    source (`cc -Werror`), each exported through a wrapper taking pointers and int64s."""
    import subprocess

    from kiln.codegen.c.codegen import emit_kernels, kernel_cflags
    from kiln.codegen.constants import ConstantPool
    from kiln.ir.outlined import kernel_funcs
    from kiln.target import Target
    from kiln.transform.interchange_reductions import InterchangeReductions
    from kiln.transform.outline import OutlineParallelLoops
    from kiln.transform.simplify import Simplify

    prims = {k: f for k, f in mod.functions.items() if isinstance(f, PrimFunc)}
    tmod = OutlineParallelLoops()(InterchangeReductions()(Simplify()(IRModule(prims))))
    pool = ConstantPool.from_module(tmod)
    source, _ = emit_kernels(tmod, prefix="kiln_", pool=pool)
    wrappers = []
    if len(pool):  # the constants the kernels read (a window's divisors), as the link gives
        data = ", ".join(str(b) for b in bytes(pool.to_bytes()))
        wrappers.append(f"__attribute__((aligned(64))) const uint8_t kiln__consts[] = {{{data}}};")
    for name, f in kernel_funcs(tmod).items():  # loop bodies are static
        params = ", ".join(f"void* a{k}" if isinstance(p, Buffer) else f"int64_t a{k}"
                           for k, p in enumerate(f.params))
        args = ", ".join(f"a{k}" for k in range(len(f.params)))
        wrappers.append(f'__attribute__((visibility("default"))) int32_t export_{name}('
                        f"{params}) {{ return kiln__kernel_{name}({args}); }}")
    c_file, so_file = directory / "kernels.c", directory / "kernels.so"
    # The hand-built kernels' parallel tile loops call the host's thread pool: run the
    # whole range in this thread instead (host.c is dyn-abi's layer).
    serial_pool = ("int32_t kiln__parallel_for(int64_t n, int32_t (*body)(int64_t, int64_t, "
                   "void*), void* context) { return n > 0 ? body(0, n, context) : 0; }")
    uses_pool = "kiln__parallel_for" in source
    c_file.write_text("\n".join([source, *wrappers, serial_pool if uses_pool else ""]) + "\n")
    subprocess.run(["cc", *kernel_cflags(Target("c")), "-Werror", "-shared", "-fPIC",
                    "-o", str(so_file), str(c_file), "-lm"], check=True)
    lib = ctypes.CDLL(str(so_file))
    kernels = {}
    for name, f in kernel_funcs(tmod).items():  # loop bodies are internal
        fn = getattr(lib, f"export_{name}")
        fn.restype = ctypes.c_int32
        fn.argtypes = [ctypes.c_void_p if isinstance(p, Buffer) else ctypes.c_int64
                       for p in f.params]
        kernels[name] = (f, fn)
    return lib, kernels


@pytest.mark.parametrize("case", sorted(CASES))
def test_c_kernels_at_several_sizes(case: str, tmp_path: Any) -> None:
    mod = _legalized(CASES[case][0])
    lib, kernels = _c_kernels(mod, tmp_path)
    _check_sizes(case, mod, kernels)
    del lib


def test_identical_symbolic_calls_share_one_kernel() -> None:
    mod = _legalized('''
@G.function
def main(x: G.Tensor((n, 5), "float32"), y: G.Tensor((n, 5), "float32")
         ) -> G.Tuple(G.Tensor((n, 5), "float32"), G.Tensor((n, 5), "float32")):
    a: G.Tensor((n, 5), "float32") = G.op("softmax", x, axis=-1)
    b: G.Tensor((n, 5), "float32") = G.op("softmax", y, axis=-1)
    return (a, b)
''')
    fn = mod["main"]
    assert isinstance(fn, g.Function)
    called = [b.value.func for b in fn.bindings if isinstance(b.value, g.CallTensor)]
    kernels = [k for k, f in mod.functions.items() if isinstance(f, PrimFunc)]
    assert len(called) == 2 and len(set(called)) == 1 and kernels == called[:1]
    x, y = (RNG.standard_normal((3, 5)).astype(np.float32) for _ in range(2))
    got = evaluate(mod, "main", x, y)
    np.testing.assert_allclose(got[0], _softmax(x), rtol=1e-5)
    np.testing.assert_allclose(got[1], _softmax(y), rtol=1e-5)


@pytest.mark.parametrize("case", ["attention_scores", "attention_context", "max_pool",
                                  "conv_rows", "reduce_max_rows_and_length"])
def test_scheduled_symbolic_kernels_round_trip_through_the_dsl(case: str) -> None:
    """The kernels after the tensor pipeline (a partial last GEMM panel's remainder
    path, loops parallelize merged over a symbolic batch) print and parse back."""
    from kiln.ir import assert_structural_equal
    from kiln.script import print_module

    mod = _legalized(CASES[case][0])
    prims = {k: f for k, f in mod.functions.items() if isinstance(f, PrimFunc)}
    tmod = default_tensor_pipeline()(IRModule(prims))
    text = print_module(tmod, metadata="reference")
    assert_structural_equal(from_source(text, metadata=text.metadata), tmod)


# the row kernels whose row count is `n`: at n = 0 they run no row (the graph entry
# rejects a dim below its minimum 1 first, so only the kernels themselves see a 0)
ZERO_ROW_CASES = ("softmax_rows", "layer_norm_rows", "reduce_sum_rows", "global_avg_pool")


@pytest.mark.parametrize("case", ZERO_ROW_CASES)
def test_row_kernels_run_no_row_at_a_row_count_of_zero(case: str, tmp_path: Any) -> None:
    mod = _legalized(CASES[case][0])
    fn = mod["main"]
    assert isinstance(fn, g.Function)
    args = _inputs(case, 0)
    for build in (lambda: _llvm_kernels(mod), lambda: _c_kernels(mod, tmp_path)):
        keep, kernels = build()
        got = _run_graph(fn, kernels, args, {"n": 0})
        assert got.size == 0 and got.shape == CASES[case][2](*args).shape
        del keep

"""Dynamic-shape kernel benchmark: kernels compiled for a symbolic dim vs the same op
compiled for the static size, timed at that size.

    .venv/bin/python bench/dynamic.py [--repeat 50] [--seconds 2] [--case attention]

Each case is a one-op graph module (kiln.script) in two versions: with dimension
variables `b` / `n` (rows M = n of a GEMM with constant 768x768 weights; attention's
batched products, softmax and head split (a transpose) of a BERT-base-like encoder,
12 heads of 64, batch b, seq n; the batch of a 3x3 convolution and of ResNet-18's
max and global pooling; the rows of softmax / layer_norm / reduce_mean) and with
them replaced by the sizes timed. Both run the default graph pipeline up to
legalization and the default tensor pipeline, are compiled by the llvm backend for
`Target.from_host()` and called as raw kernels (the symbolic one with its dims as
trailing int64 scalars), timed in alternating blocks (bench/harness.py). Columns:
milliseconds per call of each, dynamic / static (the goal is at most 1.25), and
whether the two outputs agree. Prints a table; asserts nothing (this is not a test).
The graph-level (model) comparison needs the packed entries of dynamic graphs
(lower-graph-to-tensor).
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from harness import alternating_blocks_ms, calls_within, describe_target, rel_l2

from kiln.codegen.constants import ConstantPool
from kiln.codegen.llvm.codegen import compile_module
from kiln.ir import graph as g
from kiln.ir.module import IRModule
from kiln.ir.tensor import Buffer, PrimFunc
from kiln.script.source import from_source
from kiln.target import Target
from kiln.transform.outline import OutlineParallelLoops
from kiln.transform.pipeline import default_graph_pipeline, default_tensor_pipeline

RNG = np.random.default_rng(0)
W768 = RNG.standard_normal((768, 768)).astype(np.float32) * 0.03
WCONV = RNG.standard_normal((32, 16, 3, 3)).astype(np.float32) * 0.1

# name, sizes timed ({var: size}), graph source with dims {B} / {N} (replaced by the
# dimension variables "b" / "n" or by the sizes), graph input shapes given the sizes
Case = tuple[str, list[dict[str, int]], str, Callable[[dict[str, int]], list[tuple[int, ...]]]]
BERT_SEQS = [{"b": 1, "n": 32}, {"b": 1, "n": 128}]  # BERT-base: 12 heads of 64
CASES: list[Case] = [
    ("gemm M x 768 x 768", [{"n": 32}, {"n": 128}], '''
@G.function
def main(x: G.Tensor(({N}, 768), "float32")) -> G.Tensor(({N}, 768), "float32"):
    y: G.Tensor(({N}, 768), "float32") = G.op("matmul", x, G.const(W, "float32"))
    return y
''', lambda d: [(d["n"], 768)]),
    ("attention Q @ K^T", BERT_SEQS, '''
@G.function
def main(q: G.Tensor(({B}, 12, {N}, 64), "float32"), kt: G.Tensor(({B}, 12, 64, {N}), "float32")
         ) -> G.Tensor(({B}, 12, {N}, {N}), "float32"):
    y: G.Tensor(({B}, 12, {N}, {N}), "float32") = G.op("matmul", q, kt)
    return y
''', lambda d: [(d["b"], 12, d["n"], 64), (d["b"], 12, 64, d["n"])]),
    ("attention P @ V", BERT_SEQS, '''
@G.function
def main(p: G.Tensor(({B}, 12, {N}, {N}), "float32"), v: G.Tensor(({B}, 12, {N}, 64), "float32")
         ) -> G.Tensor(({B}, 12, {N}, 64), "float32"):
    y: G.Tensor(({B}, 12, {N}, 64), "float32") = G.op("matmul", p, v)
    return y
''', lambda d: [(d["b"], 12, d["n"], d["n"]), (d["b"], 12, d["n"], 64)]),
    ("attention softmax", BERT_SEQS, '''
@G.function
def main(x: G.Tensor(({B}, 12, {N}, {N}), "float32")) -> G.Tensor(({B}, 12, {N}, {N}), "float32"):
    y: G.Tensor(({B}, 12, {N}, {N}), "float32") = G.op("softmax", x, axis=-1)
    return y
''', lambda d: [(d["b"], 12, d["n"], d["n"])]),
    ("attention head split", BERT_SEQS, '''
@G.function
def main(x: G.Tensor(({B}, {N}, 12, 64), "float32")) -> G.Tensor(({B}, 12, {N}, 64), "float32"):
    y: G.Tensor(({B}, 12, {N}, 64), "float32") = G.op("transpose", x, perm=(0, 2, 1, 3))
    return y
''', lambda d: [(d["b"], d["n"], 12, 64)]),
    ("conv 3x3 16->32 @56", [{"n": 1}], '''
@G.function
def main(x: G.Tensor(({N}, 16, 56, 56), "float32")) -> G.Tensor(({N}, 32, 56, 56), "float32"):
    y: G.Tensor(({N}, 32, 56, 56), "float32") = G.op("conv2d", x, G.const(WC, "float32"),
        strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1, auto_pad="NOTSET")
    return y
''', lambda d: [(d["n"], 16, 56, 56)]),
    ("max_pool 3x3/2 64@112", [{"n": 1}], '''
@G.function
def main(x: G.Tensor(({N}, 64, 112, 112), "float32")) -> G.Tensor(({N}, 64, 56, 56), "float32"):
    y: G.Tensor(({N}, 64, 56, 56), "float32") = G.op("max_pool2d", x, kernel_shape=(3, 3),
        strides=(2, 2), pads=(1, 1, 1, 1))
    return y
''', lambda d: [(d["n"], 64, 112, 112)]),
    ("global_avg_pool 512@7", [{"n": 1}], '''
@G.function
def main(x: G.Tensor(({N}, 512, 7, 7), "float32")) -> G.Tensor(({N}, 512, 1, 1), "float32"):
    y: G.Tensor(({N}, 512, 1, 1), "float32") = G.op("global_avg_pool", x)
    return y
''', lambda d: [(d["n"], 512, 7, 7)]),
    ("softmax rows x 512", [{"n": 128}], '''
@G.function
def main(x: G.Tensor(({N}, 512), "float32")) -> G.Tensor(({N}, 512), "float32"):
    y: G.Tensor(({N}, 512), "float32") = G.op("softmax", x, axis=-1)
    return y
''', lambda d: [(d["n"], 512)]),
    ("layer_norm rows x 768", [{"n": 128}], '''
@G.function
def main(x: G.Tensor(({N}, 768), "float32"), w: G.Tensor((768,), "float32"),
         b: G.Tensor((768,), "float32")) -> G.Tensor(({N}, 768), "float32"):
    y: G.Tensor(({N}, 768), "float32") = G.op("layer_norm", x, w, b, axis=-1, epsilon=1e-5)
    return y
''', lambda d: [(d["n"], 768), (768,), (768,)]),
    ("reduce_mean rows x 768", [{"n": 128}], '''
@G.function
def main(x: G.Tensor(({N}, 768), "float32")) -> G.Tensor(({N}, 1), "float32"):
    y: G.Tensor(({N}, 1), "float32") = G.op("reduce_mean", x, axes=(1,), keepdims=True)
    return y
''', lambda d: [(d["n"], 768)]),
]


def _source(src: str, dims: dict[str, int] | None) -> str:
    """The case's source with its dims symbolic (None) or replaced by `dims`' sizes."""
    for var in ("b", "n"):
        src = src.replace("{" + var.upper() + "}", str((dims or {}).get(var, var)))
    return src


def build(src: str, target: Target) -> tuple[Any, PrimFunc, Any, list[Any]]:
    """The module's only kernel compiled (MCJIT), its PrimFunc, a ctypes function, and
    its call's arguments: a constant's array, else the index of the graph input."""
    from llvmlite import binding as llvm

    text = src.replace("G.const(W,", f"G.const({W768.tolist()},").replace(
        "G.const(WC,", f"G.const({WCONV.tolist()},")
    mod = from_source(text)
    for p in default_graph_pipeline().passes:
        if p.name == "lower-graph-to-tensor":
            break
        mod = p(mod)
    fn = mod["main"]
    assert isinstance(fn, g.Function) and len(fn.bindings) == 1
    call = fn.bindings[0].value
    assert isinstance(call, g.CallTensor)
    params = [id(p) for p in fn.params]
    args = [np.ascontiguousarray(a.data) if isinstance(a, g.Constant) else params.index(id(a))
            for a in call.args]
    prims = {k: f for k, f in mod.functions.items() if isinstance(f, PrimFunc)}
    # The llvm backend takes parallel loops outlined, as kiln.compile hands them over.
    tmod = OutlineParallelLoops()(default_tensor_pipeline()(IRModule(prims)))
    c = compile_module(tmod, target, prefix="kiln_", pool=ConstantPool.from_module(tmod),
                       jit=True)
    engine = llvm.create_mcjit_compiler(llvm.parse_bitcode(c.module.as_bitcode()),
                                        c.target_machine)
    engine.finalize_object()
    f = tmod.functions[call.func]
    assert isinstance(f, PrimFunc)
    sig = [ctypes.c_void_p if isinstance(p, Buffer) else ctypes.c_int64 for p in f.params]
    kernel = ctypes.CFUNCTYPE(ctypes.c_int32, *sig)(
        engine.get_function_address(f"kiln__kernel_{call.func}"))
    return engine, f, kernel, args


def _kernel_kind(f: PrimFunc) -> str:
    """The hand-built kernel's name (its `kiln.*_kernel` attribute), else "te"."""
    return next((str(v) for k, v in f.attrs.items() if k.endswith("_kernel")), "te")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--case", default="", help="only the cases whose name holds this text")
    args = ap.parse_args()
    target = Target.from_host()
    print(f"target: {describe_target(target)}")
    print(f"{'case':<24} {'size':>9} {'static ms':>10} {'dynamic ms':>11} {'dyn/static':>10} "
          f"{'rel L2':>8}  kernels (static | dynamic)")
    for name, sizes, src, in_shapes in (c for c in CASES if args.case in c[0]):
        dyn = build(_source(src, None), target)
        for dims in sizes:
            st = build(_source(src, dims), target)
            data = [RNG.standard_normal(s).astype(np.float32) for s in in_shapes(dims)]
            out_shape = [int(d) for d in st[1].buffer_params[-1].shape]
            outs = {"static": np.empty(out_shape, np.float32),
                    "dynamic": np.empty(out_shape, np.float32)}

            def call(which: str, built: Any, extra: list[int],
                     data: list[np.ndarray] = data,
                     outs: dict[str, np.ndarray] = outs) -> Any:
                kernel = built[2]
                # each version passes its own constants (packed or not), the inputs shared
                ptrs = [(data[a] if isinstance(a, int) else a).ctypes.data for a in built[3]]
                out = outs[which].ctypes.data
                return lambda: kernel(*ptrs, out, *extra)

            f = dyn[1]
            scalars = [dims[p.name] for p in f.params[len(f.buffer_params):]]
            fns = {"static": call("static", st, []), "dynamic": call("dynamic", dyn, scalars)}
            calls = calls_within(fns, args.repeat, args.seconds)
            ms = alternating_blocks_ms(fns, calls)
            kinds = " | ".join(_kernel_kind(b[1]) for b in (st, dyn))
            size = ",".join(f"{k}={v}" for k, v in dims.items())
            print(f"{name:<24} {size:>9} {ms['static']:>10.3f} {ms['dynamic']:>11.3f} "
                  f"{ms['dynamic'] / ms['static']:>10.2f} "
                  f"{rel_l2(outs['dynamic'], outs['static']):>8.1e}  {kinds}")
            sys.stdout.flush()

if __name__ == "__main__":
    main()

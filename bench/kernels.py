"""Kernel benchmark: one GEMM or convolution, kiln vs numpy's BLAS vs onnxruntime.

    .venv/bin/python bench/kernels.py [--kernels gemm,conv,dw | NAME,...] [--repeat 20]
                                      [--seconds 3] [--target llvm] [--keep-openblas-coretype]

Each kernel is a one-node ONNX model with its weights as initializers
(MatMul with a constant right-hand side, or Conv with constant weights and
bias, batch 1, NCHW, float32):

- `gemm`: MatMul MxKxN, square 256..2048, tall-skinny / BERT-like shapes and
  matrix-vector products (M = 1);
- `conv`: single convolutions with ResNet-18's 3x3 and 1x1 shapes (and its
  7x7 stem, and two MobileNetV2 1x1 layers);
- `dw`: depthwise 3x3 convolutions of MobileNetV2;
- `squeezenet`: SqueezeNet 1.0's 1x1 squeeze layers (16-64 outputs) and its 1x1 and
  3x3 expand layers;
- `mbv2dw` (with `--int8`): every depthwise 3x3 shape of MobileNetV2, and `qadd`
  (`--int8` only): com.microsoft QLinearAdd of two u8 tensors at MobileNetV2's residual
  shapes and a ResNet-50-sized one.

The model is compiled with `kiln.compile(from_onnx(model), target)` (default:
`Target.from_host()`) and run against a one-node onnxruntime session
(`intra_op_num_threads=2`, CPU provider) and a numpy reference in this same
process: for GEMM `a @ b`; for a dense convolution numpy's BLAS GEMM of the
im2col matrices (`w[Cout, Cin*kh*kw] @ cols[Cin*kh*kw, Ho*Wo]`; building the
columns is not timed, so this is what BLAS reaches on the convolution's GEMM
shape); for a depthwise convolution nine shifted multiply-adds over the
padded input. Each runtime is timed in alternating blocks of calls (median
of up to `--repeat` calls, fewer when `--seconds` per kernel would not hold
them). numpy runs twice, with OpenBLAS on one thread (`np1`) and on two
(`np2`): on a loaded 2-core machine OpenBLAS's two threads wait for each
other and can be far slower than one. Columns: GFLOP/s of each (FLOP = 2 x
multiply-adds); kiln's, the better numpy's and ort's as a percentage of this
machine's float32 FMA peak on two cores (`%pk`; measured first by
bench/peak.py's generated kernel); kiln's throughput as a percentage of the
better numpy's and of onnxruntime's (higher is better); the relative L2 error
of kiln's output against onnxruntime's; kiln's compile time.

These machines set `OPENBLAS_CORETYPE`, which pins OpenBLAS to an older
kernel set; unless `--keep-openblas-coretype` is given the script re-executes
itself without it, so numpy's BLAS picks the kernels for this CPU. The header
prints which core OpenBLAS uses and how many threads. kiln's parallel loops
use `KILN_NUM_THREADS` threads (default: every online CPU). Prints a table;
asserts nothing (this is not a test).

With `--int8`, each selected GEMM is a one-node QLinearMatMul (u8 A as the input,
s8 B as an initializer, per-tensor scales, u8 output) and each convolution a one-node
QLinearConv (u8 input, s8 weights with per-channel scales, int32 bias, u8 output), and
the table prints kiln's and onnxruntime's GOP/s (OP = 2 x integer multiply-adds),
kiln's throughput as a percentage of onnxruntime's and the share of outputs that differ
(in quanta) from onnxruntime's (docs/quantization.md), and kiln's GOP/s as a percentage
of the machine's measured `vpdpbusd` peak on `--threads` cores (bench/peak.py; not
printed without AVX-512 VNNI or AVX-VNNI). `--kernels resnet50 --threads 1` compares
ResNet-50's layers one by one on one thread. `--target` picks kiln's instructions: e.g.
`--target "llvm -mcpu=znver4 -mattr=-avx512f,-avx512vnni,-avxvnni"` runs kiln's AVX2
path on a VNNI host (onnxruntime still runs its VNNI kernels there), and
`-mattr=-avx512vnni,-avxvnni` its AVX-512BW one. `--nbits`: the 4-bit GEMVs of a decode
step (MatMulNBits, one row of A) in GB/s and as a share of the measured memory bandwidth
(bench/nbits_gemv.py; `--from-memory`: each node repeated so its weights come from
memory, as in a decode step); `--fp32` the float32 GEMVs the same way, always from
memory (bench/fp32_gemv.py). `--threads 1` times each runtime on one
thread by its CPU time (also with `--int8`), and the table prints milliseconds per call.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from doc_table import machine_line, markdown_table, write_block
from fp32_gemv import print_fp32
from harness import (
    alternating_blocks_ms,
    calls_within,
    describe_target,
    ort_on_target_isa,
    rel_l2,
    short_error,
)
from nbits_gemv import print_nbits
from onnx import TensorProto, helper, numpy_helper
from peak import Peak, measure_int8_peak, measure_peak

import kiln
from kiln.frontend import from_onnx
from kiln.target.isa import isa_for

DROPPED_CORETYPE = "KILN_BENCH_DROPPED_OPENBLAS_CORETYPE"
DOCS = Path(__file__).resolve().parents[1] / "docs"
# With --threads 1 every runtime runs on the calling thread, timed by its CPU time: time
# spent descheduled by other jobs is not counted, so a loaded machine still gives the
# kernels' own speed (what a wall clock cannot, there).
CPU_TIME = time.thread_time


@dataclass(frozen=True)
class Gemm:
    """MatMul of a[M, K] (input) by b[K, N] (constant)."""

    m: int
    k: int
    n: int

    @property
    def name(self) -> str:
        return f"gemm {self.m}x{self.k}x{self.n}"

    @property
    def group(self) -> str:
        return "gemm"

    @property
    def flop(self) -> int:
        return 2 * self.m * self.k * self.n


@dataclass(frozen=True)
class Conv:
    """Conv of x[1, cin, size, size] with a k x k kernel, 'same' padding, bias."""

    cin: int
    cout: int
    size: int
    k: int = 3
    stride: int = 1
    depthwise: bool = False
    family: str = ""  # the group it is listed in, when not its kind's ("resnet50")

    @property
    def name(self) -> str:
        kind = "dw" if self.depthwise else "conv"
        s = f"/{self.stride}" if self.stride != 1 else ""
        return f"{kind}{self.k}x{self.k}{s} {self.cin}>{self.cout} @{self.size}"

    @property
    def group(self) -> str:
        return self.family or ("dw" if self.depthwise else "conv")

    @property
    def groups(self) -> int:
        return self.cin if self.depthwise else 1

    @property
    def out_size(self) -> int:
        return (self.size + 2 * (self.k // 2) - self.k) // self.stride + 1

    @property
    def flop(self) -> int:
        return (2 * self.cout * self.out_size**2 * (self.cin // self.groups) * self.k * self.k)


@dataclass(frozen=True)
class QAdd:
    """QLinearAdd (int8 only: com.microsoft's node) of two u8 tensors [1, c, size, size]."""

    c: int
    size: int

    @property
    def name(self) -> str:
        return f"qadd {self.c} @{self.size}"

    @property
    def group(self) -> str:
        return "qadd"

    @property
    def flop(self) -> int:  # one add per output element
        return self.c * self.size ** 2


Kernel = Gemm | Conv | QAdd

KERNELS: list[Kernel] = [
    Gemm(256, 256, 256), Gemm(512, 512, 512), Gemm(1024, 1024, 1024), Gemm(2048, 2048, 2048),
    Gemm(2048, 2048, 64), Gemm(64, 2048, 2048),  # tall-skinny: narrow output, short input
    Gemm(128, 768, 768), Gemm(128, 768, 3072), Gemm(128, 3072, 768),  # BERT-base, seq 128
    Gemm(1, 784, 512), Gemm(1, 4096, 4096),  # matrix-vector: the MLP's first layer, a big one
    # ResNet-18: 3x3 of each stage, a stride-2 3x3, the 1x1/2 projections, the 7x7/2 stem
    Conv(64, 64, 56), Conv(128, 128, 28), Conv(256, 256, 14), Conv(512, 512, 7),
    Conv(64, 128, 56, stride=2), Conv(64, 128, 56, k=1, stride=2),
    Conv(256, 512, 14, k=1, stride=2), Conv(3, 64, 224, k=7, stride=2),
    # MobileNetV2 1x1 expansion / projection and depthwise layers
    Conv(24, 144, 56, k=1), Conv(144, 24, 56, k=1),
    Conv(144, 144, 56, depthwise=True), Conv(96, 96, 112, stride=2, depthwise=True),
    Conv(960, 960, 7, depthwise=True),
]

# ResNet-50 (v1.5: the stride on the 3x3) layer by layer: the 7x7/2 stem, each stage's
# 1x1 reduce/expand, 3x3 (stride 2 in its first block) and 1x1/2 projection.
RESNET50_LAYERS = [
    (3, 64, 224, 7, 2),
    (64, 64, 56, 1, 1), (64, 64, 56, 3, 1), (64, 256, 56, 1, 1), (256, 64, 56, 1, 1),
    (256, 128, 56, 1, 1), (128, 128, 56, 3, 2), (256, 512, 56, 1, 2),
    (128, 512, 28, 1, 1), (512, 128, 28, 1, 1), (128, 128, 28, 3, 1),
    (512, 256, 28, 1, 1), (256, 256, 28, 3, 2), (512, 1024, 28, 1, 2),
    (256, 1024, 14, 1, 1), (1024, 256, 14, 1, 1), (256, 256, 14, 3, 1),
    (1024, 512, 14, 1, 1), (512, 512, 14, 3, 2), (1024, 2048, 14, 1, 2),
    (512, 2048, 7, 1, 1), (2048, 512, 7, 1, 1), (512, 512, 7, 3, 1),
]
KERNELS += [Conv(cin, cout, size, k, stride, family="resnet50")
            for cin, cout, size, k, stride in RESNET50_LAYERS]
# VGG-19's distinct 3x3 layers (in channels, out channels, size): the deep ones K-blocked
# on AVX2 (kiln.kernels.conv.direct.choose_k_blocking)
VGG19_LAYERS = [(3, 64, 224), (64, 64, 224), (64, 128, 112), (128, 128, 112), (128, 256, 56),
                (256, 256, 56), (256, 512, 28), (512, 512, 28), (512, 512, 14)]
KERNELS += [Conv(cin, cout, size, family="vgg19") for cin, cout, size in VGG19_LAYERS]
# MobileNetV2's depthwise 3x3 layers (channels, input size, stride) and its residual adds
MOBILENETV2_DEPTHWISE = [(32, 112, 1), (96, 112, 2), (144, 56, 1), (144, 56, 2), (192, 28, 1),
                         (192, 28, 2), (384, 14, 1), (576, 14, 1), (576, 14, 2), (960, 7, 1)]
KERNELS += [Conv(c, c, size, stride=stride, depthwise=True, family="mbv2dw")
            for c, size, stride in MOBILENETV2_DEPTHWISE]
# SqueezeNet 1.0's fire modules (in channels, out channels, size, kernel): the narrow 1x1
# squeeze layers (16-64 outputs) and the 1x1 / 3x3 expands; their images (54x54, 26x26)
# fill no whole GEMM panel
SQUEEZENET_LAYERS = [(96, 16, 54, 1), (128, 16, 54, 1), (128, 32, 54, 1), (256, 32, 26, 1),
                     (256, 48, 26, 1), (384, 48, 26, 1), (384, 64, 26, 1), (512, 64, 12, 1),
                     (16, 64, 54, 1), (32, 128, 54, 1), (32, 128, 26, 1), (48, 192, 26, 1),
                     (64, 256, 26, 1), (64, 256, 12, 1), (512, 1000, 12, 1),
                     (16, 64, 54, 3), (32, 128, 54, 3), (32, 128, 26, 3), (48, 192, 26, 3),
                     (64, 256, 26, 3), (64, 256, 12, 3)]
KERNELS += [Conv(cin, cout, size, k, family="squeezenet")
            for cin, cout, size, k in SQUEEZENET_LAYERS]
KERNELS += [QAdd(24, 56), QAdd(32, 28), QAdd(64, 14), QAdd(96, 14), QAdd(160, 7),
            QAdd(256, 56)]  # the last: a ResNet-50-sized residual
GROUPS = ("gemm", "conv", "dw", "resnet50", "vgg19", "squeezenet", "mbv2dw", "qadd")


def one_node_model(kernel: Gemm | Conv, rng: np.random.Generator
                   ) -> tuple[onnx.ModelProto, np.ndarray, list[np.ndarray]]:
    """The one-node ONNX model of `kernel`, an input, and its constant operands."""
    if isinstance(kernel, Gemm):
        x = rng.standard_normal((kernel.m, kernel.k)).astype(np.float32)
        consts = [(rng.standard_normal((kernel.k, kernel.n)) / np.sqrt(kernel.k)).astype(
            np.float32)]
        node = helper.make_node("MatMul", ["x", "c0"], ["y"])
        out_shape = [kernel.m, kernel.n]
    else:
        x = rng.standard_normal((1, kernel.cin, kernel.size, kernel.size)).astype(np.float32)
        fan_in = kernel.cin // kernel.groups * kernel.k**2
        consts = [(rng.standard_normal((kernel.cout, kernel.cin // kernel.groups, kernel.k,
                                        kernel.k)) / np.sqrt(fan_in)).astype(np.float32),
                  rng.standard_normal(kernel.cout).astype(np.float32) * 0.1]
        node = helper.make_node("Conv", ["x", "c0", "c1"], ["y"],
                                kernel_shape=[kernel.k, kernel.k], pads=[kernel.k // 2] * 4,
                                strides=[kernel.stride] * 2, group=kernel.groups)
        out_shape = [1, kernel.cout, kernel.out_size, kernel.out_size]
    graph = helper.make_graph(
        [node], kernel.name.replace(" ", "_"),
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        [numpy_helper.from_array(c, f"c{i}") for i, c in enumerate(consts)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model, x, consts


def numpy_reference(kernel: Gemm | Conv, x: np.ndarray, consts: list[np.ndarray]
                    ) -> tuple[Callable[[], np.ndarray], Callable[[np.ndarray], np.ndarray]]:
    """The timed numpy call, and how to turn its result into the kernel's output."""
    if isinstance(kernel, Gemm):
        b = consts[0]
        return (lambda: x @ b), (lambda y: y)
    w, bias = consts
    k, s, ho = kernel.k, kernel.stride, kernel.out_size
    padded = np.pad(x[0], ((0, 0), (k // 2, k // 2), (k // 2, k // 2)))
    span = s * (ho - 1) + 1

    def tap(i: int, j: int) -> np.ndarray:
        return padded[:, i:i + span:s, j:j + span:s]

    if kernel.depthwise:
        taps = [(tap(i, j), w[:, 0, i, j, None, None]) for i in range(k) for j in range(k)]

        def depthwise() -> np.ndarray:
            acc = taps[0][0] * taps[0][1]
            for t, wt in taps[1:]:
                acc += t * wt
            return acc

        return depthwise, lambda y: (y + bias[:, None, None])[None]
    # im2col: rows ordered (cin, i, j) as w.reshape(cout, -1)
    cols = np.ascontiguousarray(np.stack([tap(i, j) for i in range(k) for j in range(k)],
                                         axis=1).reshape(kernel.cin * k * k, ho * ho))
    wmat = np.ascontiguousarray(w.reshape(kernel.cout, -1))
    return (lambda: wmat @ cols), lambda y: (y + bias[:, None]).reshape(1, kernel.cout, ho, ho)


def run(kernel: Kernel, target: kiln.target.Target, repeat: int, seconds: float,
        blas: OpenBlas | None, threads: int = 2) -> dict[str, float] | str:
    """GFLOP/s of kiln, numpy and ort on `kernel`, or why kiln could not run it (on
    `threads` threads; one thread is timed by its CPU time, `CPU_TIME`)."""
    import onnxruntime as ort

    if isinstance(kernel, QAdd):
        return "int8 only (--int8)"
    model, x, consts = one_node_model(kernel, np.random.default_rng(0))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    feed = {"x": x}
    expected = session.run(None, feed)[0]
    np_call, np_output = numpy_reference(kernel, x, consts)
    np_error = rel_l2(np_output(np_call()), expected)
    if np_error > 1e-4:  # the reference computes something else: a bug in this script
        raise AssertionError(f"{kernel.name}: numpy reference differs from ort ({np_error:.1e})")

    start = time.perf_counter()
    try:
        ex = kiln.compile(from_onnx(model), target)
        fn = ex["main"]
        actual = np.asarray(fn(x))
    except Exception as exc:  # a benchmark reports what fails and goes on
        return short_error(exc)
    compile_s = time.perf_counter() - start

    fns = {"kiln": lambda: fn(x), "numpy1": numpy_on_threads(np_call, blas, 1),
           "numpy2": numpy_on_threads(np_call, blas, 2),
           "ort": lambda: session.run(None, feed)}
    if threads == 1:
        fns["numpy2"] = fns["numpy1"]
    calls = calls_within(fns, repeat, seconds)
    ms = alternating_blocks_ms(fns, calls, clock=CPU_TIME if threads == 1 else time.perf_counter)
    result = {f"{name}_gflops": kernel.flop / (t * 1e-3) / 1e9 for name, t in ms.items()}
    return {**result, "compile_s": compile_s, "rel_l2": rel_l2(actual, expected),
            "calls": calls, "cache_hit": float(ex.cache_hit)}


@dataclass(frozen=True)
class OpenBlas:
    """numpy's OpenBLAS: its core type, and its thread count (which can be set)."""

    library: str
    corename: str
    get_threads: Callable[[], int]
    set_threads: Callable[[int], None]


def find_openblas() -> OpenBlas | None:
    """The OpenBLAS numpy loaded (Linux: found in /proc/self/maps), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower()}
    except OSError:
        return None
    for path in sorted(paths):
        lib = ctypes.CDLL(path)  # already loaded: the same handle
        for prefix, suffix in (("openblas_", ""), ("scipy_openblas_", "64_"),
                               ("openblas_", "64_")):
            names = [f"{prefix}{what}{suffix}"
                     for what in ("get_corename", "get_num_threads", "set_num_threads")]
            if all(hasattr(lib, name) for name in names):
                corename, get_threads, set_threads = (getattr(lib, name) for name in names)
                corename.restype = ctypes.c_char_p
                return OpenBlas(os.path.basename(path), corename().decode(), get_threads,
                                set_threads)
    return None


def numpy_on_threads(call: Callable[[], object], blas: OpenBlas | None, threads: int
                     ) -> Callable[[], object]:
    """`call` run with numpy's OpenBLAS on `threads` threads (as is without OpenBLAS)."""
    if blas is None:
        return call

    def on_threads() -> object:
        blas.set_threads(threads)  # a store into OpenBLAS's settings: ~1 us
        return call()

    return on_threads


def int8_gemm_model(g: Gemm, rng: np.random.Generator) -> onnx.ModelProto:
    """A one-node QLinearMatMul of u8 a[M, K] (input) by a constant s8 b[K, N]."""
    consts = {"as": np.float32(0.02), "az": np.uint8(128),
              "b": rng.integers(-127, 128, (g.k, g.n)).astype(np.int8),
              "bs": np.float32(0.01), "bz": np.int8(0),
              "ys": np.float32(0.02 * 0.01 * np.sqrt(g.k) * 40), "yz": np.uint8(128)}
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                            ["y"])
    return int8_model(node, [g.m, g.k], [g.m, g.n], consts)


def int8_conv_model(c: Conv, rng: np.random.Generator) -> onnx.ModelProto:
    """A one-node QLinearConv of u8 x[1, cin, size, size] (input) by constant s8 weights
    with per-channel scales (as onnxruntime's quantizer writes them) and an int32 bias."""
    fan_in = c.cin // c.groups * c.k ** 2
    consts = {"xs": np.float32(0.02), "xz": np.uint8(128),
              "w": rng.integers(-127, 128, (c.cout, c.cin // c.groups, c.k, c.k)).astype(
                  np.int8),
              "ws": rng.uniform(0.005, 0.015, c.cout).astype(np.float32),
              "wz": np.zeros(c.cout, np.int8),
              "ys": np.float32(0.02 * 0.01 * np.sqrt(fan_in) * 40), "yz": np.uint8(128),
              "bias": rng.integers(-5000, 5000, c.cout).astype(np.int32)}
    node = helper.make_node("QLinearConv", ["a", "xs", "xz", "w", "ws", "wz", "ys", "yz", "bias"],
                            ["y"], kernel_shape=[c.k, c.k], pads=[c.k // 2] * 4,
                            strides=[c.stride] * 2, group=c.groups)
    return int8_model(node, [1, c.cin, c.size, c.size], [1, c.cout, c.out_size, c.out_size],
                      consts)


def int8_add_model(q: QAdd) -> onnx.ModelProto:
    """A one-node com.microsoft QLinearAdd of u8 a and b (both inputs), u8 output."""
    consts = {"as": np.float32(0.02), "az": np.uint8(120), "bs": np.float32(0.03),
              "bz": np.uint8(131), "ys": np.float32(0.04), "yz": np.uint8(126)}
    node = helper.make_node("QLinearAdd", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"],
                            domain="com.microsoft")
    shape = [1, q.c, q.size, q.size]
    model = int8_model(node, shape, shape, consts, extra_inputs=["b"])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return model


def int8_model(node: onnx.NodeProto, in_shape: list[int], out_shape: list[int],
               consts: dict[str, np.ndarray], extra_inputs: tuple[str, ...] | list[str] = ()
               ) -> onnx.ModelProto:
    """A one-node model of `node` from u8 input `a` (and `extra_inputs`, of its shape) to
    u8 output `y`."""
    graph = helper.make_graph(
        [node], "int8_kernel",
        [helper.make_tensor_value_info(x, TensorProto.UINT8, in_shape)
         for x in ("a", *extra_inputs)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, out_shape)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def run_int8(kernel: Kernel, target: kiln.target.Target, repeat: int, seconds: float,
             threads: int = 2) -> dict[str, float] | str:
    """kiln vs onnxruntime on one int8 GEMM, convolution or QLinearAdd (a string: why it
    was skipped), on `threads` threads (one: timed by its CPU time, `CPU_TIME`)."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    if isinstance(kernel, Gemm):
        model = int8_gemm_model(kernel, rng)
        feed = {"a": rng.integers(0, 256, (kernel.m, kernel.k)).astype(np.uint8)}
    elif isinstance(kernel, QAdd):
        model = int8_add_model(kernel)
        feed = {x: rng.integers(0, 256, (1, kernel.c, kernel.size, kernel.size)).astype(
            np.uint8) for x in ("a", "b")}
    else:
        model = int8_conv_model(kernel, rng)
        feed = {"a": rng.integers(0, 256, (1, kernel.cin, kernel.size, kernel.size)).astype(
            np.uint8)}
    args = list(feed.values())
    try:
        start = time.perf_counter()
        fn = kiln.compile(from_onnx(model), target)["main"]
        compile_s = time.perf_counter() - start
        got = np.asarray(fn(*args))
    except Exception as exc:  # a benchmark reports what fails and goes on
        return short_error(exc)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    want = session.run(None, feed)[0]
    fns = {"kiln": lambda: fn(*args), "ort": lambda: session.run(None, feed)}
    ms = alternating_blocks_ms(fns, calls_within(fns, repeat, seconds),
                               clock=CPU_TIME if threads == 1 else time.perf_counter)
    differ = float((got.astype(np.int32) != want.astype(np.int32)).mean())
    return {"kiln_gops": kernel.flop / ms["kiln"] / 1e6, "ort_gops": kernel.flop / ms["ort"] / 1e6,
            "kiln_ms": ms["kiln"], "ort_ms": ms["ort"], "differ": differ,
            "compile_s": compile_s}


def print_int8(kernels: list[Kernel], target: kiln.target.Target, repeat: int,
               seconds: float, threads: int = 2) -> None:
    peak = measure_int8_peak(threads=threads)
    if peak is not None:
        print(f"int8 peak (vpdpbusd, {peak.vector_bits}-bit): {peak.per_core:.0f} GOP/s per "
              f"core measured, x{peak.threads} = {peak.all_threads:.0f} GOP/s")
    header = (f"{'kernel':<24} {'MOP':>6} {'kiln ms':>8} {'ort ms':>8} {'kiln GOP/s':>10} "
              f"{'ort GOP/s':>9} {'kiln %ort':>9} {'kiln %peak':>10} {'differ':>7} "
              f"{'compile s':>9}")
    print(header)
    print("-" * len(header))
    for kernel in kernels:
        r = run_int8(kernel, target, repeat, seconds, threads)
        if isinstance(r, str):
            print(f"{kernel.name:<24} skipped: {r}", flush=True)
            continue
        of_peak = f"{100 * r['kiln_gops'] / peak.all_threads:>10.0f}" if peak else f"{'-':>10}"
        print(f"{kernel.name:<24} {kernel.flop / 1e6:>6.0f} {r['kiln_ms']:>8.3f} "
              f"{r['ort_ms']:>8.3f} {r['kiln_gops']:>10.1f} "
              f"{r['ort_gops']:>9.1f} {100 * r['kiln_gops'] / r['ort_gops']:>9.0f} "
              f"{of_peak} {r['differ']:>7.1%} {r['compile_s']:>9.2f}", flush=True)


def selected(spec: str) -> list[Kernel]:
    """Kernels named by a comma-separated list of groups (`GROUPS`) or names (a layer in
    two groups runs once)."""
    items = [item.strip() for item in spec.split(",")]
    picked = list({k.name: k for k in KERNELS if k.group in items or k.name in items}.values())
    unknown = set(items) - {k.group for k in KERNELS} - {k.name for k in KERNELS}
    if unknown or not picked:
        names = "; ".join(dict.fromkeys(k.name for k in KERNELS))
        raise SystemExit(f"unknown kernels {sorted(unknown)}; choose groups "
                         f"{', '.join(GROUPS)} or names: {names}")
    return picked


# ISAs `--isa` can name: the host's own, and AVX2 on an AVX-512 host (its AVX-512
# features removed, as `mattr=-avx512f` does for any target).
ISAS = ("host", "avx2")


def isa_targets(spec: str, base: kiln.target.Target) -> list[tuple[str, kiln.target.Target]]:
    """(label, target) of each ISA in the comma-separated `spec`, built from `base`."""
    out = []
    for name in (item.strip() for item in spec.split(",")):
        if name not in ISAS:
            raise SystemExit(f"unknown ISA {name!r}; choose from {', '.join(ISAS)}")
        if name == "host":
            out.append((f"{base.get('mcpu', '') or 'host'}", base))
            continue
        mattr = [f for f in base.get("mattr", ()) or () if not f.startswith("+avx512")]
        out.append(("avx2", base.with_attrs(mattr=[*mattr, "-avx512f"])))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", default="gemm,conv,dw",
                        help=f"comma-separated groups ({', '.join(GROUPS)}) or kernel names")
    parser.add_argument("--isa", default="host",
                        help="comma-separated ISAs to build for: host (the target's own), "
                             "avx2 (its AVX-512 features removed)")
    parser.add_argument("--repeat", type=int, default=20, help="most timed calls per runtime")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="time budget per kernel for the timed calls (all runtimes)")
    parser.add_argument("--target", default=None, help="kiln target (default: this host)")
    parser.add_argument("--threads", type=int, choices=(1, 2), default=2,
                        help="threads of kiln, ort and numpy; 1: timed by the calling "
                             "thread's CPU time (robust on a loaded machine)")
    parser.add_argument("--keep-openblas-coretype", action="store_true",
                        help="keep OPENBLAS_CORETYPE for numpy (default: re-run without it)")
    parser.add_argument("--write-docs", action="store_true",
                        help="replace the bench:kernels block of docs/performance.md")
    parser.add_argument("--int8", action="store_true",
                        help="int8 GEMMs and convolutions (QLinearMatMul, QLinearConv) "
                             "against onnxruntime instead")
    parser.add_argument("--nbits", action="store_true",
                        help="the 4-bit GEMVs of a decode step (MatMulNBits, M = 1) against "
                             "onnxruntime, in GB/s and as a share of the measured memory "
                             "bandwidth (bench/nbits_gemv.py)")
    parser.add_argument("--fp32", action="store_true",
                        help="the float32 GEMVs of a decode step (one row of A, weights from "
                             "memory) against onnxruntime, in GB/s and as a share of the "
                             "measured read bandwidth (bench/fp32_gemv.py)")
    parser.add_argument("--from-memory", action="store_true",
                        help="with --nbits: each node repeated over 160+ MiB of weights, so "
                             "every call reads them from memory, as a decode step does")
    parser.add_argument("--ort-isa", choices=("target", "host"), default="target",
                        help="target (default): onnxruntime without the CPU features the "
                             "host has and the target lacks (bench/ort_isa.py; with --int8, "
                             "or one --isa); host: all")
    args = parser.parse_args()
    if "OPENBLAS_CORETYPE" in os.environ and not args.keep_openblas_coretype:
        # OpenBLAS reads it when numpy loads: only a fresh process can drop it.
        env = dict(os.environ)
        env[DROPPED_CORETYPE] = env.pop("OPENBLAS_CORETYPE")
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    load_before = os.getloadavg()[0]
    kernels = selected(args.kernels)
    if args.threads == 1:  # read once per library, at its first parallel loop
        os.environ["KILN_NUM_THREADS"] = "1"
    target = kiln.target.Target.from_host() if args.target is None else kiln.target.Target(
        args.target)
    if args.fp32:
        print(f"target: {target.kind.name} {describe_target(target)}; threads: {args.threads}")
        os.environ.setdefault("KILN_NUM_THREADS", str(args.threads))
        print_fp32(target, args.repeat, args.seconds, args.threads)
        return
    if args.nbits:
        print(f"target: {target.kind.name} {describe_target(target)}; threads: {args.threads}")
        os.environ.setdefault("KILN_NUM_THREADS", str(args.threads))
        print_nbits(target, args.repeat, args.seconds, args.threads, args.from_memory)
        return
    if args.int8:
        threads = os.environ.get("KILN_NUM_THREADS", f"all ({os.cpu_count()})")
        print(f"target: {target.kind.name} {describe_target(target)}")
        print(ort_on_target_isa(target, args.ort_isa))
        clock = "the calling thread's CPU time" if args.threads == 1 else "wall time"
        print(f"KILN_NUM_THREADS: {threads}   ort threads: {args.threads}   median of up to "
              f"{args.repeat} calls in {args.seconds:g} s, alternating blocks, {clock}")
        print_int8(kernels, target, args.repeat, args.seconds, args.threads)
        return

    coretype = os.environ.get("OPENBLAS_CORETYPE")
    if coretype is not None:
        how = f"OPENBLAS_CORETYPE={coretype} kept"
    elif DROPPED_CORETYPE in os.environ:
        how = f"OPENBLAS_CORETYPE={os.environ[DROPPED_CORETYPE]} removed (re-executed)"
    else:
        how = "OPENBLAS_CORETYPE not set"
    isas = isa_targets(args.isa, target)
    # one onnxruntime per process: it runs the ISA of a single --isa, else the host's
    print(ort_on_target_isa(isas[0][1], args.ort_isa if len(isas) == 1 else "host"))
    peak = measure_peak(threads=args.threads, cpu_time=args.threads == 1)
    blas = find_openblas()
    on = "1 thread" if args.threads == 1 else "1 and on 2 threads"
    blas_text = (f"OpenBLAS core {blas.corename}, {blas.get_threads()} threads by default "
                 f"({blas.library}); timed on {on}"
                 if blas is not None else "not OpenBLAS (threads not set)")
    threads = os.environ.get("KILN_NUM_THREADS", f"all ({os.cpu_count()})")
    print(peak.describe())
    print(f"numpy {np.__version__}: {blas_text}; {how}")
    clock = "the calling thread's CPU time" if args.threads == 1 else "wall time"
    print(f"KILN_NUM_THREADS: {threads}   ort threads: {args.threads}   median of up to "
          f"{args.repeat} calls in {args.seconds:g} s, alternating blocks, {clock}")
    block: list[str] = []
    for label, isa_target in isas:
        block += ["", *print_conv_table(kernels, label, isa_target, peak, blas, args)]
    if args.write_docs:
        command = " ".join(["bench/kernels.py", *sys.argv[1:]])
        write_block(DOCS / "performance.md", "kernels", [
            machine_line(command, describe_target(target), load_before, os.getloadavg()[0]),
            peak.describe() + ".", *block])


def print_conv_table(kernels: list[Kernel], label: str, target: kiln.target.Target,
                     peak: Peak, blas: OpenBlas | None, args: argparse.Namespace
                     ) -> list[str]:
    """Print the float32 table of `kernels` on one ISA and return it as Markdown; `%pk`
    is a percentage of the FMA peak of the vector widths the ISA has (up to 512 bits
    with AVX-512F, 256 with AVX2: a core whose 512-bit FMAs are no faster than its
    256-bit ones has one peak for both)."""
    isa = isa_for(target)
    widths = {b: max(one, all_ / peak.threads) for b, (one, all_) in peak.by_width.items()
              if b <= max(isa.vector_bits, 128)}
    bits = max(widths, key=lambda b: widths[b])
    full = widths[bits] * peak.threads
    title = (f"[{label}] target: {target.kind.name} {describe_target(target)}; %pk: percent "
             f"of {full:.0f} GFLOP/s ({bits}-bit FMA peak x {peak.threads} cores)")
    print("\n" + title)
    rows: list[list[str]] = []
    header = (f"{'kernel':<24} {'MFLOP':>6} {'kiln GF/s':>9} {'np1 GF/s':>8} {'np2 GF/s':>8} "
              f"{'ort GF/s':>8} {'kiln %pk':>8} {'np %pk':>6} {'ort %pk':>7} {'kiln %np':>8} "
              f"{'kiln %ort':>9} {'rel L2':>7} {'compile s':>9}")
    print(header)
    print("-" * len(header))
    for kernel in kernels:
        r = run(kernel, target, args.repeat, args.seconds, blas, args.threads)
        if isinstance(r, str):
            print(f"{kernel.name:<24} skipped: {r}", flush=True)
            rows.append([kernel.name, "skipped: " + r.replace("|", "/"), *[""] * 5])
            continue
        k, o = r["kiln_gflops"], r["ort_gflops"]
        n1, n2 = r["numpy1_gflops"], r["numpy2_gflops"]
        n = max(n1, n2)
        pk = 100 / full
        print(f"{kernel.name:<24} {kernel.flop / 1e6:>6.0f} {k:>9.1f} {n1:>8.1f} {n2:>8.1f} "
              f"{o:>8.1f} {k * pk:>8.1f} {n * pk:>6.1f} {o * pk:>7.1f} {100 * k / n:>8.0f} "
              f"{100 * k / o:>9.0f} {r['rel_l2']:>7.0e} {r['compile_s']:>9.2f}"
              f"{' (cache hit)' if r['cache_hit'] else ''}", flush=True)
        rows.append([kernel.name, f"{k:.1f}", f"{k * pk:.0f}%", f"{n:.1f}", f"{o:.1f}",
                     f"{100 * k / n:.0f}%", f"{100 * k / o:.0f}%"])
    columns = ["kernel", "kiln GFLOP/s", "kiln %pk", "numpy GFLOP/s", "ort GFLOP/s",
               "kiln %numpy", "kiln %ort"]
    return [title, "", *markdown_table(columns, rows)]


if __name__ == "__main__":
    main()

"""The float32 GEMV of a decode step (`bench/kernels.py --fp32`): one MatMul of one row
of A by a float32 weight [K, N], kiln against onnxruntime (MLAS), in this process, each
node repeated so every call reads its weights from memory (as a decode step's ~2 GB a
token do), beside a plain read of memory by the same threads (bench/nbits_gemv.py's
stream: an int32 max over 256 MiB) in the same alternating blocks, by the same clock.
`%bw` is the median over rounds of the GEMV's bytes per second over the read's.

Both runtimes hold the weights in anonymous memory here (numpy asks for transparent huge
pages for large arrays); a kiln library maps them from its file (kiln.runtime.page_advice),
so this is the kernel's streaming rate, not the mapping's. Shapes: the layers of the 0.49B
and 1.1B Llama-style models of bench/llm.py --genai.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import onnx
from harness import alternating_blocks, calls_within, paired_ratio, pooled_ms
from nbits_gemv import MEMORY_MIB, ROUNDS, kiln_outputs, ort_session, stream_calls
from onnx import TensorProto, helper

import kiln
from kiln.frontend import from_onnx

#: (K, N): 0.49B (hidden 1024, 4 of 16 heads' width for K and V, FFN 4864, vocabulary
#: 32000) and 1.1B (hidden 2048, FFN 5632): Q, K/V, gate/up, down, the LM head.
SHAPES = ((1024, 1024), (1024, 256), (1024, 4864), (4864, 1024), (1024, 32000),
          (2048, 2048), (2048, 256), (2048, 5632), (5632, 2048), (2048, 32000))


def matmul_model(k: int, n: int, copies: int, rng: np.random.Generator) -> onnx.ModelProto:
    """`copies` MatMuls of the same A [1, K], each by its own random float32 [K, N]."""
    inits, nodes, outputs = [], [], []
    for c in range(copies):
        w = (rng.standard_normal((k, n), dtype=np.float32) * np.float32(k ** -0.5))
        inits.append(helper.make_tensor(f"w{c}", TensorProto.FLOAT, w.shape, w.tobytes(),
                                        raw=True))
        nodes.append(helper.make_node("MatMul", ["x", f"w{c}"], [f"y{c}"]))
        outputs.append(helper.make_tensor_value_info(f"y{c}", TensorProto.FLOAT, [1, n]))
    graph = helper.make_graph(
        nodes, "gemv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def print_fp32(target: kiln.target.Target, repeat: int, seconds: float,
               threads: int) -> list[str]:
    """Times each shape and prints (and returns) the table's lines."""
    lines = [f"{threads} thread(s), {'CPU' if threads == 1 else 'wall'} time, {ROUNDS} "
             f"rounds of alternating blocks; each node {MEMORY_MIB}+ MiB over its copies; "
             f"load average {os.getloadavg()[0]:.1f}", "",
             f"{'K x N':<12} {'MiB':>6} {'copies':>6} {'read GB/s':>9} {'kiln us':>8} "
             f"{'ort us':>8} {'kiln GB/s':>9} {'ort GB/s':>9} {'%bw':>5} {'kiln/ort':>8} "
             f"{'err':>8}"]
    print("\n".join(lines), flush=True)
    _copy, read, stream_bytes = stream_calls(threads)
    for k, n in SHAPES:
        lines.append(_row(k, n, target, repeat, seconds, threads, read, stream_bytes))
        print(lines[-1], flush=True)
    lines.append(f"load average at the end {os.getloadavg()[0]:.1f}")
    print(lines[-1], flush=True)
    return lines


def _row(k: int, n: int, target: kiln.target.Target, repeat: int, seconds: float,
         threads: int, read: Callable[[], object], stream_bytes: int) -> str:
    """The table's line of one shape: kiln and onnxruntime beside the stream's read."""
    nbytes = 4 * k * n
    copies = max(1, -(-(MEMORY_MIB << 20) // nbytes))
    model = matmul_model(k, n, copies, np.random.default_rng(k + n))
    fn = kiln.compile(from_onnx(model), target)["main"]
    session = ort_session(model, threads)
    x = np.random.default_rng(k).standard_normal((1, k)).astype(np.float32)
    err = max(float(np.abs(np.asarray(a) - b).max())
              for a, b in zip(kiln_outputs(fn(x)), session({"x": x}), strict=True))
    fns = {"read": read, "kiln": lambda: fn(x), "ort": lambda: session({"x": x})}
    # one thread: the calling thread's CPU time (a loaded machine's waits not counted)
    clock = time.thread_time if threads == 1 else time.perf_counter
    times = alternating_blocks(fns, max(ROUNDS, calls_within(fns, repeat, seconds)),
                               ROUNDS, clock)
    ms = {name: t / (1 if name == "read" else copies) for name, t in pooled_ms(times).items()}
    share = 100 * copies * nbytes / stream_bytes
    return (f"{f'{k} x {n}':<12} {nbytes / 2**20:>6.1f} {copies:>6} "
            f"{stream_bytes / ms['read'] / 1e6:>9.1f} {1e3 * ms['kiln']:>8.1f} "
            f"{1e3 * ms['ort']:>8.1f} {nbytes / ms['kiln'] / 1e6:>9.1f} "
            f"{nbytes / ms['ort'] / 1e6:>9.1f} "
            f"{share * paired_ratio(times['read'], times['kiln']):>5.0f} "
            f"{ms['kiln'] / ms['ort']:>8.2f} {err:>8.1e}")

"""The 4-bit GEMV of a decode step (`bench/kernels.py --nbits`): one MatMulNBits node
(bits 4, blocks of 32, symmetric: what onnxruntime's MatMulNBitsQuantizer writes for
onnxruntime-genai), one row of A, kiln against onnxruntime (accuracy_level unset: float32
sums, and 4: A quantized to int8 per block; kiln's `kiln4` the same node at level 4: its
int8 GEMV, kiln.kernels.gemm.nbits_int8), in this process.

A GEMV reads every weight byte once, so it is bound by memory bandwidth once the weights
leave the caches: the table prints the bytes each call reads (the packed codes and the
float32 scales), kiln's GB/s over them, and that as a share of this machine's read
bandwidth, measured first by the same clock on as many threads as the kernels: a numpy
int32 max over 512 MiB (a copy's GB/s printed beside it). Shapes up to a few MiB stay in
the L2/L3 caches between calls; the LM heads (39-81 MiB) do not. Shapes: the layers of a
0.5B and a 1.1B Llama-style model (`SHAPES`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
from harness import alternating_blocks_ms, calls_within
from onnx import TensorProto, helper

import kiln
from kiln.frontend import from_onnx

MS = "com.microsoft"
BLOCK = 32
#: (K, N) of each GEMV: A [1, K] by the 4-bit weight [K, N]. The layers of a 0.5B
#: (Qwen2-style: hidden 896, FFN 4864, vocabulary 151936) and a 1.1B Llama (hidden 2048,
#: FFN 5632, vocabulary 32000): attention projections, FFN up and down, the LM head.
SHAPES = ((896, 896), (896, 4864), (4864, 896), (896, 151936), (2048, 2048), (2048, 5632),
          (5632, 2048), (2048, 32000))


def stream_bandwidth(threads: int, clock: Callable[[], float], mib: int = 512,
                     rounds: int = 5) -> tuple[float, float]:
    """GB/s of a numpy copy of `mib` MiB (read plus written bytes) and of a read of them
    (an int32 max: a GEMV only reads), split over `threads` threads (numpy releases the
    GIL in both), the best of `rounds` by `clock` (the kernels' clock)."""
    src = np.ones(mib << 18, np.float32)
    dst = np.empty_like(src)
    words = src.view(np.int32)
    parts = np.array_split(np.arange(src.size), threads)
    bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts]

    def best(fn: Callable[[tuple[int, int]], object]) -> float:
        fastest = float("inf")
        with ThreadPoolExecutor(threads) as pool:
            for _ in range(rounds):
                start = clock()
                if threads == 1:
                    fn(bounds[0])
                else:
                    list(pool.map(fn, bounds))
                fastest = min(fastest, clock() - start)
        return fastest

    copy = best(lambda b: np.copyto(dst[b[0]:b[1]], src[b[0]:b[1]]))
    read = best(lambda b: words[b[0]:b[1]].max())
    return 2 * src.nbytes / copy / 1e9, src.nbytes / read / 1e9


def nbits_model(k: int, n: int, accuracy_level: int, rng: np.random.Generator
                ) -> tuple[onnx.ModelProto, int]:
    """A one-node MatMulNBits model (random codes and scales) and its weight bytes."""
    blocks = -(-k // BLOCK)
    b = rng.integers(0, 256, (n, blocks, BLOCK // 2), dtype=np.uint8)
    scales = rng.uniform(0.001, 0.01, (n, blocks)).astype(np.float32)
    inits = [helper.make_tensor("b", TensorProto.UINT8, b.shape, b.tobytes(), raw=True),
             helper.make_tensor("s", TensorProto.FLOAT, scales.shape, scales.tobytes(),
                                raw=True)]
    attrs = {"K": k, "N": n, "bits": 4, "block_size": BLOCK}
    if accuracy_level:
        attrs["accuracy_level"] = accuracy_level
    node = helper.make_node("MatMulNBits", ["x", "b", "s"], ["y"], domain=MS, **attrs)
    graph = helper.make_graph(
        [node], "gemv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)])
    return model, b.nbytes + scales.nbytes


def _ort(model: onnx.ModelProto, threads: int) -> Callable[[dict[str, np.ndarray]], object]:
    import onnxruntime as ort  # heavy: only when the benchmark runs

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return lambda feed: session.run(None, feed)


def print_nbits(target: kiln.target.Target, repeat: int, seconds: float,
                threads: int) -> list[str]:
    """Times each shape and prints (and returns) the table's lines."""
    clock = time.thread_time if threads == 1 else time.perf_counter
    copy, bandwidth = stream_bandwidth(threads, clock)
    lines = [f"memory bandwidth, {threads} thread(s), timed by "
             f"{'CPU time' if threads == 1 else 'wall time'}: read {bandwidth:.1f} GB/s "
             f"(int32 max of 512 MiB; %bw columns), copy {copy:.1f} GB/s (read + written)",
             ""]
    lines.append(f"{'K x N':<12} {'MiB':>6} {'kiln us':>8} {'kiln4 us':>8} {'ort us':>8} "
                 f"{'ort4 us':>8} {'kiln GB/s':>9} {'kiln4 GB/s':>10} {'%bw':>5} "
                 f"{'%bw4':>5} {'kiln/ort':>8} {'kiln4/ort4':>10} {'err4':>8}")
    print("\n".join(lines), flush=True)
    for k, n in SHAPES:
        line = _row(k, n, target, repeat, seconds, threads, bandwidth)
        print(line, flush=True)
        lines.append(line)
    return lines


def _row(k: int, n: int, target: kiln.target.Target, repeat: int, seconds: float,
         threads: int, bandwidth: float) -> str:
    """The table's line of one shape: kiln and onnxruntime at accuracy levels 0 (float32
    sums) and 4 (A quantized to int8 per block)."""
    model, nbytes = nbits_model(k, n, 0, np.random.default_rng(k + n))
    model4 = nbits_model(k, n, 4, np.random.default_rng(k + n))[0]
    fn = kiln.compile(from_onnx(model), target)["main"]
    fn4 = kiln.compile(from_onnx(model4), target)["main"]
    x = np.random.default_rng(k).standard_normal((1, k)).astype(np.float32)
    feed = {"x": x}
    ort0 = _ort(model, threads)
    ort4 = _ort(model4, threads)
    # kiln's level 4 quantizes A as onnxruntime's: the same sums up to their order
    err = float(np.abs(np.asarray(fn4(x)) - ort4(feed)[0]).max())  # type: ignore[index]
    fns = {"kiln": lambda: fn(x), "kiln4": lambda: fn4(x), "ort": lambda: ort0(feed),
           "ort4": lambda: ort4(feed)}
    # one thread: the calling thread's CPU time (a loaded machine's waits not counted)
    clock = time.thread_time if threads == 1 else time.perf_counter
    ms = alternating_blocks_ms(fns, calls_within(fns, repeat, seconds), clock=clock)
    gbs = nbytes / (ms["kiln"] * 1e-3) / 1e9
    gbs4 = nbytes / (ms["kiln4"] * 1e-3) / 1e9
    return (f"{f'{k} x {n}':<12} {nbytes / 2**20:>6.1f} {1e3 * ms['kiln']:>8.1f} "
            f"{1e3 * ms['kiln4']:>8.1f} {1e3 * ms['ort']:>8.1f} {1e3 * ms['ort4']:>8.1f} "
            f"{gbs:>9.1f} {gbs4:>10.1f} {100 * gbs / bandwidth:>5.0f} "
            f"{100 * gbs4 / bandwidth:>5.0f} {ms['kiln'] / ms['ort']:>8.2f} "
            f"{ms['kiln4'] / ms['ort4']:>10.2f} {err:>8.1e}")

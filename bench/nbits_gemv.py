"""The 4-bit GEMV of a decode step (`bench/kernels.py --nbits`): one MatMulNBits node
(bits 4, blocks of 32, symmetric: what onnxruntime's MatMulNBitsQuantizer writes for
onnxruntime-genai), one row of A, kiln against onnxruntime (accuracy_level unset: float32
sums, and 4: A quantized to int8 per block), in this process.

A GEMV reads every weight byte once, so it is bound by memory bandwidth once the weights
leave the caches: the table prints the bytes each call reads (the packed codes and the
float32 scales), kiln's GB/s over them, and that as a share of this machine's bandwidth,
measured first as a numpy copy of a 512 MiB array (bytes read plus bytes written, on as
many threads as the kernels). Shapes: Llama-style layers of bench/llm.py's model (hidden
512) and of 1-7B models (hidden 2048-4096, FFN 5632-11008).
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
#: (K, N) of each GEMV: A [1, K] by the 4-bit weight [K, N].
SHAPES = ((512, 512), (512, 1024), (2048, 2048), (2048, 5632), (4096, 4096), (4096, 11008),
          (11008, 4096))


def copy_bandwidth(threads: int, mib: int = 512, rounds: int = 5) -> float:
    """GB/s of a numpy copy of `mib` MiB split over `threads` threads (numpy releases the
    GIL while it copies), read plus written bytes, the best of `rounds`."""
    src = np.ones(mib << 18, np.float32)
    dst = np.empty_like(src)
    parts = np.array_split(np.arange(src.size), threads)
    bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts]
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(rounds):
            start = time.perf_counter()
            list(pool.map(lambda b: np.copyto(dst[b[0]:b[1]], src[b[0]:b[1]]), bounds))
            best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best / 1e9


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
    bandwidth = copy_bandwidth(threads)
    lines = [f"memory bandwidth (numpy copy of 512 MiB, read + written, {threads} threads): "
             f"{bandwidth:.1f} GB/s", ""]
    lines.append(f"{'K x N':<12} {'MiB':>6} {'kiln us':>8} {'ort us':>8} {'ort4 us':>8} "
                 f"{'kiln GB/s':>9} {'%bw':>5} {'kiln %ort':>9} {'max err':>8}")
    print("\n".join(lines), flush=True)
    for k, n in SHAPES:
        line = _row(k, n, target, repeat, seconds, threads, bandwidth)
        print(line, flush=True)
        lines.append(line)
    return lines


def _row(k: int, n: int, target: kiln.target.Target, repeat: int, seconds: float,
         threads: int, bandwidth: float) -> str:
    """The table's line of one shape."""
    model, nbytes = nbits_model(k, n, 0, np.random.default_rng(k + n))
    fn = kiln.compile(from_onnx(model), target)["main"]
    x = np.random.default_rng(k).standard_normal((1, k)).astype(np.float32)
    feed = {"x": x}
    ort0 = _ort(model, threads)
    ort4 = _ort(nbits_model(k, n, 4, np.random.default_rng(k + n))[0], threads)
    err = float(np.abs(np.asarray(fn(x)) - ort0(feed)[0]).max())  # type: ignore[index]
    fns = {"kiln": lambda: fn(x), "ort": lambda: ort0(feed), "ort4": lambda: ort4(feed)}
    # one thread: the calling thread's CPU time (a loaded machine's waits not counted)
    clock = time.thread_time if threads == 1 else time.perf_counter
    ms = alternating_blocks_ms(fns, calls_within(fns, repeat, seconds), clock=clock)
    gbs = nbytes / (ms["kiln"] * 1e-3) / 1e9
    return (f"{f'{k} x {n}':<12} {nbytes / 2**20:>6.1f} {1e3 * ms['kiln']:>8.1f} "
            f"{1e3 * ms['ort']:>8.1f} {1e3 * ms['ort4']:>8.1f} {gbs:>9.1f} "
            f"{100 * gbs / bandwidth:>5.0f} {100 * ms['ort'] / ms['kiln']:>9.0f} "
            f"{err:>8.1e}")

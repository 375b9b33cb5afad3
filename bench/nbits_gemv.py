"""The 4-bit GEMV of a decode step (`bench/kernels.py --nbits`): one MatMulNBits node
(bits 4, blocks of 32, symmetric: what onnxruntime's MatMulNBitsQuantizer writes for
onnxruntime-genai), one row of A, kiln against onnxruntime (accuracy_level unset: float32
sums, and 4: A quantized to int8 per block; kiln's `kiln4` the same node at level 4: its
int8 GEMV, kiln.kernels.gemm.nbits_int8), in this process.

A GEMV reads every weight byte once, so it is bound by memory bandwidth once the weights
leave the caches: the table prints the bytes each call reads (the packed codes and the
float32 scales), kiln's GB/s over them, and that as a share of this machine's read
bandwidth: a numpy int32 max over 256 MiB on as many threads as the kernels (a copy's GB/s,
read plus written, printed beside it), timed in the same alternating blocks as each row's
GEMVs, by the same clock, so a loaded machine's slow spells hit both alike; `%bw` and
`%bw4` are the medians over rounds of kiln's GB/s over the read's of the same round
(harness.paired_ratio). Shapes up to a few MiB stay in the L2/L3 caches between calls; the
LM heads (39-81 MiB) do not, nor do a decode step's weights (hundreds of MiB a step):
`--from-memory` builds each row's node `copies` times over (one model, the copies in
sequence, at least `MEMORY_MIB` MiB in all) so every call reads its weights from memory,
and prints the time of one copy. Shapes: the layers of a 0.5B and a 1.1B Llama-style model
(`SHAPES`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
from harness import alternating_blocks, calls_within, paired_ratio, pooled_ms
from onnx import TensorProto, helper

import kiln
from kiln.frontend import from_onnx

MS = "com.microsoft"
BLOCK = 32
#: (K, N) of each GEMV: A [1, K] by the 4-bit weight [K, N]. The layers of a 0.5B
#: (Qwen2-style: hidden 896, FFN 4864, vocabulary 151936) and a 1.1B Llama (hidden 2048,
#: FFN 5632, vocabulary 32000): attention projections, FFN up and down, the LM head; and
#: the LM head of hidden 1024 (the 0.49B of bench/llm.py --genai).
SHAPES = ((896, 896), (896, 4864), (4864, 896), (896, 151936), (2048, 2048), (2048, 5632),
          (5632, 2048), (2048, 32000), (1024, 32000))


#: Bytes the read and the copy of the bandwidth stream (`stream_calls`) go over.
STREAM_MIB = 256
#: With `--from-memory`, each row's node is repeated to at least this many MiB: several
#: times the L3 cache (32 MiB on the Zen 5 of docs/performance.md), as a decode step's
#: weights are.
MEMORY_MIB = 160


def stream_calls(threads: int, mib: int = STREAM_MIB
                 ) -> tuple[Callable[[], object], Callable[[], object], int]:
    """A copy of `mib` MiB (numpy's `copyto`) and a read of them (an int32 max: a GEMV
    only reads), each split over `threads` threads (numpy releases the GIL in both), and
    the bytes each reads."""
    src = np.ones(mib << 18, np.float32)
    dst = np.empty_like(src)
    words = src.view(np.int32)
    parts = np.array_split(np.arange(src.size), threads)
    bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts]
    pool = ThreadPoolExecutor(threads)

    def split(fn: Callable[[tuple[int, int]], object]) -> Callable[[], object]:
        if threads == 1:
            return lambda: fn(bounds[0])
        return lambda: list(pool.map(fn, bounds))

    copy = split(lambda b: np.copyto(dst[b[0]:b[1]], src[b[0]:b[1]]))
    read = split(lambda b: words[b[0]:b[1]].max())
    return copy, read, src.nbytes


def nbits_model(k: int, n: int, accuracy_level: int, rng: np.random.Generator,
                copies: int = 1) -> tuple[onnx.ModelProto, int]:
    """A MatMulNBits model (random codes and scales) of `copies` nodes on the same A, each
    with its own weights and output, and the weight bytes of one node."""
    blocks = -(-k // BLOCK)
    attrs = {"K": k, "N": n, "bits": 4, "block_size": BLOCK}
    if accuracy_level:
        attrs["accuracy_level"] = accuracy_level
    inits, nodes, outputs = [], [], []
    for c in range(copies):
        b = rng.integers(0, 256, (n, blocks, BLOCK // 2), dtype=np.uint8)
        scales = rng.uniform(0.001, 0.01, (n, blocks)).astype(np.float32)
        inits += [helper.make_tensor(f"b{c}", TensorProto.UINT8, b.shape, b.tobytes(), raw=True),
                  helper.make_tensor(f"s{c}", TensorProto.FLOAT, scales.shape,
                                     scales.tobytes(), raw=True)]
        nodes.append(helper.make_node("MatMulNBits", ["x", f"b{c}", f"s{c}"], [f"y{c}"],
                                      domain=MS, **attrs))
        outputs.append(helper.make_tensor_value_info(f"y{c}", TensorProto.FLOAT, [1, n]))
    graph = helper.make_graph(
        nodes, "gemv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
        outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid(MS, 1)])
    return model, b.nbytes + scales.nbytes


def ort_session(model: onnx.ModelProto, threads: int) -> Callable[[dict[str, np.ndarray]], object]:
    import onnxruntime as ort  # heavy: only when the benchmark runs

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return lambda feed: session.run(None, feed)


#: Rounds of alternating blocks a row is timed over (each: the stream's copy and read,
#: then each GEMV), medians over all.
ROUNDS = 10


def print_nbits(target: kiln.target.Target, repeat: int, seconds: float,
                threads: int, from_memory: bool = False) -> list[str]:
    """Times each shape and prints (and returns) the table's lines."""
    clock = "CPU time" if threads == 1 else "wall time"
    where = (f"weights from memory (each node {MEMORY_MIB}+ MiB over its copies)"
             if from_memory else "weights in cache when they fit")
    lines = [f"{threads} thread(s), timed by {clock}, {ROUNDS} rounds of alternating blocks; "
             f"{where}; read/copy: an int32 max / a copy of {STREAM_MIB} MiB in the same "
             f"rounds; load average {os.getloadavg()[0]:.1f}", ""]
    lines.append(f"{'K x N':<12} {'MiB':>6} {'copies':>6} {'read GB/s':>9} {'copy GB/s':>9} "
                 f"{'kiln us':>8} {'kiln4 us':>8} {'ort us':>8} {'ort4 us':>8} "
                 f"{'kiln GB/s':>9} {'kiln4 GB/s':>10} {'%bw':>5} {'%bw4':>5} "
                 f"{'kiln/ort':>8} {'kiln4/ort4':>10} {'err4':>8}")
    print("\n".join(lines), flush=True)
    copy, read, stream_bytes = stream_calls(threads)
    for k, n in SHAPES:
        line = _row(k, n, target, repeat, seconds, threads, from_memory,
                    {"read": read, "copy": copy}, stream_bytes)
        print(line, flush=True)
        lines.append(line)
    lines.append(f"load average at the end {os.getloadavg()[0]:.1f}")
    print(lines[-1], flush=True)
    return lines


def _row(k: int, n: int, target: kiln.target.Target, repeat: int, seconds: float,
         threads: int, from_memory: bool, stream: dict[str, Callable[[], object]],
         stream_bytes: int) -> str:
    """The table's line of one shape: kiln and onnxruntime at accuracy levels 0 (float32
    sums) and 4 (A quantized to int8 per block), beside the stream's read and copy."""
    nbytes = nbits_model(k, n, 0, np.random.default_rng(k + n))[1]
    copies = max(1, -(-(MEMORY_MIB << 20) // nbytes)) if from_memory else 1
    model = nbits_model(k, n, 0, np.random.default_rng(k + n), copies)[0]
    model4 = nbits_model(k, n, 4, np.random.default_rng(k + n), copies)[0]
    fn = kiln.compile(from_onnx(model), target)["main"]
    fn4 = kiln.compile(from_onnx(model4), target)["main"]
    x = np.random.default_rng(k).standard_normal((1, k)).astype(np.float32)
    feed = {"x": x}
    ort0 = ort_session(model, threads)
    ort4 = ort_session(model4, threads)
    # kiln's level 4 quantizes A as onnxruntime's: the same sums up to their order
    err = max(float(np.abs(np.asarray(a) - b).max())
              for a, b in zip(kiln_outputs(fn4(x)), ort4(feed), strict=True))
    fns = {**stream, "kiln": lambda: fn(x), "kiln4": lambda: fn4(x),
           "ort": lambda: ort0(feed), "ort4": lambda: ort4(feed)}
    # one thread: the calling thread's CPU time (a loaded machine's waits not counted)
    clock = time.thread_time if threads == 1 else time.perf_counter
    times = alternating_blocks(fns, max(ROUNDS, calls_within(fns, repeat, seconds)),
                               ROUNDS, clock)
    ms = {name: t / (1 if name in stream else copies) for name, t in pooled_ms(times).items()}
    read_gbs = stream_bytes / (ms["read"] * 1e-3) / 1e9
    copy_gbs = 2 * stream_bytes / (ms["copy"] * 1e-3) / 1e9
    gbs = nbytes / (ms["kiln"] * 1e-3) / 1e9
    gbs4 = nbytes / (ms["kiln4"] * 1e-3) / 1e9
    # the read's time over the GEMV's in each round, scaled by their bytes
    share = 100 * copies * nbytes / stream_bytes
    return (f"{f'{k} x {n}':<12} {nbytes / 2**20:>6.1f} {copies:>6} {read_gbs:>9.1f} "
            f"{copy_gbs:>9.1f} {1e3 * ms['kiln']:>8.1f} {1e3 * ms['kiln4']:>8.1f} "
            f"{1e3 * ms['ort']:>8.1f} {1e3 * ms['ort4']:>8.1f} {gbs:>9.1f} {gbs4:>10.1f} "
            f"{share * paired_ratio(times['read'], times['kiln']):>5.0f} "
            f"{share * paired_ratio(times['read'], times['kiln4']):>5.0f} "
            f"{ms['kiln'] / ms['ort']:>8.2f} {ms['kiln4'] / ms['ort4']:>10.2f} {err:>8.1e}")


def kiln_outputs(result: object) -> list[np.ndarray]:
    """A kiln call's outputs as a list (one output comes back bare)."""
    return list(result) if isinstance(result, (list, tuple)) else [np.asarray(result)]

"""This machine's float32 FMA peak (and int8 VNNI peak), measured with a small
generated kernel.

    .venv/bin/python bench/peak.py [--seconds 0.3]

`measure_peak` JIT-compiles (llvmlite, host CPU and features) a loop whose body
is `ACCUMULATORS` independent `llvm.fma` calls on float vectors, once per
vector width the host has (128 bits; 256 with AVX; 512 with AVX-512F), and
keeps the fastest: some CPUs run 512-bit FMAs at half rate, so the widest
registers are not always the peak. Independent accumulators hide the FMA
latency (4-5 cycles on current x86, 2 FMA pipes: at least 8-10 chains in
flight), so the loop runs at the FMA throughput bound. Each kernel is timed on
one thread and on `threads` threads at once (ctypes releases the GIL during
the call), best of `ROUNDS`; FLOP = iterations x accumulators x lanes x 2.
The per-core peak is the best of the one-thread figure and the all-threads
figure divided by the thread count (on a shared machine either can be the
less disturbed one); the all-cores peak is that times the thread count.
bench/kernels.py divides by these figures. Prints them when run as a script.
"""

from __future__ import annotations

import argparse
import ctypes
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import llvmlite.binding as llvm

ACCUMULATORS = 12  # two FMA pipes x 5-cycle latency, plus slack; fits in 16 ymm/zmm
ROUNDS = 20


@dataclass(frozen=True)
class Peak:
    """Measured float32 FMA throughput in GFLOP/s (at the fastest vector width)."""

    cpu: str
    vector_bits: int
    per_core: float
    threads: int
    by_width: dict[int, tuple[float, float]]  # bits -> (one thread, `threads` threads)

    @property
    def all_threads(self) -> float:
        """The peak of `threads` cores: per-core peak x threads (on a shared machine the
        concurrent measurement mostly shows the other jobs)."""
        return self.per_core * self.threads

    def describe(self) -> str:
        widths = ", ".join(f"{bits}-bit {one:.0f}/{all_:.0f}"
                           for bits, (one, all_) in sorted(self.by_width.items()))
        return (f"FMA peak (float32): {self.per_core:.1f} GFLOP/s per core measured "
                f"({self.vector_bits}-bit), x{self.threads} cores = {self.all_threads:.1f} "
                f"GFLOP/s [{ACCUMULATORS} independent llvm.fma chains in a loop, llvmlite JIT "
                f"for {self.cpu}, best of {ROUNDS} calls; GFLOP/s on 1/{self.threads} "
                f"concurrent threads by width: {widths}]")


def host_vector_widths() -> list[int]:
    """The float vector widths in bits this host runs: 128, and 256/512 if present."""
    features = dict(llvm.get_host_cpu_features())
    widths = [128]
    if features.get("avx"):
        widths.append(256)
    if features.get("avx512f"):
        widths.append(512)
    return widths


def _kernel_ir(lanes: int, int8: bool = False) -> str:
    """LLVM IR of `float fma_loop(i64 n, float b, float c)`: n rounds of the FMA chains
    (`int8`: of `vpdpbusd` chains on int32 lanes, b and c converted to integers)."""
    elem, add = ("i32", "add") if int8 else ("float", "fadd")
    vec = f"<{lanes} x {elem}>"
    fn = f"llvm.x86.avx512.vpdpbusd.{lanes * 32}" if int8 else f"llvm.fma.v{lanes}f32"
    lines = [
        f"declare {vec} @{fn}({vec}, {vec}, {vec})",
        "define float @fma_loop(i64 %n, float %bf, float %cf) {",
        "entry:",
        *(("  %b = fptosi float %bf to i32", "  %c = fptosi float %cf to i32") if int8
           else ("  %b = fadd float %bf, 0.0", "  %c = fadd float %cf, 0.0")),
        f"  %bi = insertelement {vec} poison, {elem} %b, i32 0",
        f"  %bv = shufflevector {vec} %bi, {vec} poison, <{lanes} x i32> zeroinitializer",
        f"  %ci = insertelement {vec} poison, {elem} %c, i32 0",
        f"  %cv = shufflevector {vec} %ci, {vec} poison, <{lanes} x i32> zeroinitializer",
        "  br label %loop",
        "loop:",
        "  %i = phi i64 [0, %entry], [%i1, %loop]",
    ]
    for a in range(ACCUMULATORS):
        lines.append(f"  %a{a} = phi {vec} [%cv, %entry], [%n{a}, %loop]")
    for a in range(ACCUMULATORS):
        operands = f"{vec} %a{a}, {vec} %bv, {vec} %cv"
        lines.append(f"  %n{a} = call {vec} @{fn}({operands})")
    lines += ["  %i1 = add i64 %i, 1", "  %more = icmp ult i64 %i1, %n",
              "  br i1 %more, label %loop, label %done", "done:"]
    # Sum the accumulators so none is dead.
    prev = "%n0"
    for a in range(1, ACCUMULATORS):
        lines.append(f"  %s{a} = {add} {vec} {prev}, %n{a}")
        prev = f"%s{a}"
    lines.append(f"  %r = extractelement {vec} {prev}, i32 0")
    lines += (["  %rf = sitofp i32 %r to float", "  ret float %rf", "}"] if int8
              else ["  ret float %r", "}"])
    return "\n".join(lines)


class _Kernel:
    """The JIT-compiled FMA loop at one vector width (kept alive with its engine)."""

    def __init__(self, bits: int, int8: bool = False) -> None:
        self.lanes = bits // 32
        # one vpdpbusd lane: 4 multiplies and 4 adds; one fma lane: 2 operations
        self.ops_per_lane = 8 if int8 else 2
        target = llvm.Target.from_default_triple()
        machine = target.create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
            opt=3)
        module = llvm.parse_assembly(_kernel_ir(self.lanes, int8))
        module.verify()
        self.engine = llvm.create_mcjit_compiler(module, machine)
        self.engine.finalize_object()
        address = self.engine.get_function_address("fma_loop")
        self.fn = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_int64, ctypes.c_float,
                                   ctypes.c_float)(address)

    def gflops(self, threads: int, seconds: float, cpu_time: bool = False) -> float:
        """Best GFLOP/s of `threads` concurrent calls over `ROUNDS` rounds; with
        `cpu_time` (one thread only) timed by the calling thread's CPU time, which time
        spent descheduled by other jobs does not count."""
        if cpu_time:
            return self._on_this_thread(seconds)
        n = self._calibrated(seconds, time.perf_counter)
        flop = n * ACCUMULATORS * self.lanes * self.ops_per_lane
        best = 0.0
        for _ in range(ROUNDS):
            workers = [threading.Thread(target=self.fn, args=(n, 0.999, 1e-3))
                       for _ in range(threads)]
            start = time.perf_counter()
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            best = max(best, threads * flop / (time.perf_counter() - start) / 1e9)
        return best


    def _calibrated(self, seconds: float, clock: Callable[[], float]) -> int:
        """The loop count for which one call takes about `seconds / ROUNDS` by `clock`."""
        n = 1 << 14
        while True:
            start = clock()
            self.fn(n, 0.999, 1e-3)
            if clock() - start > seconds / ROUNDS:
                return n
            n *= 2

    def _on_this_thread(self, seconds: float) -> float:
        n = self._calibrated(seconds, time.thread_time)
        flop = n * ACCUMULATORS * self.lanes * self.ops_per_lane
        best = 0.0
        for _ in range(ROUNDS):
            start = time.thread_time()
            self.fn(n, 0.999, 1e-3)
            best = max(best, flop / (time.thread_time() - start) / 1e9)
        return best


def measure_peak(threads: int = 2, seconds: float = 0.3, cpu_time: bool = False) -> Peak:
    """Measure the float32 FMA peak of one core and of `threads` threads at once; with
    `cpu_time`, one core by the calling thread's CPU time (robust to other jobs) and
    `threads` x that."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    by_width = {}
    for bits in host_vector_widths():
        kernel = _Kernel(bits)
        one = kernel.gflops(1, seconds, cpu_time)
        by_width[bits] = (one, one * threads if cpu_time else kernel.gflops(threads, seconds))
    # Every measurement is a lower bound of the per-core peak (other jobs only slow it).
    per_core = {bits: max(one, all_ / threads) for bits, (one, all_) in by_width.items()}
    best = max(per_core, key=lambda bits: per_core[bits])
    return Peak(llvm.get_host_cpu_name(), best, per_core[best], threads, by_width)


def measure_int8_peak(threads: int = 2, seconds: float = 0.3) -> Peak | None:
    """Measure the int8 `vpdpbusd` peak in GOP/s (a multiply and an add per u8 x s8
    product): 512-bit with AVX-512 VNNI, 256-bit with AVX-VNNI; None without either."""
    features = dict(llvm.get_host_cpu_features())
    widths = [bits for bits, need in ((256, "avxvnni"), (512, "avx512vnni"))
              if features.get(need) or (bits == 256 and features.get("avx512vnni")
                                        and features.get("avx512vl"))]
    if not widths:
        return None
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    by_width = {}
    for bits in widths:
        kernel = _Kernel(bits, int8=True)
        by_width[bits] = (kernel.gflops(1, seconds), kernel.gflops(threads, seconds))
    per_core = {bits: max(one, all_ / threads) for bits, (one, all_) in by_width.items()}
    best = max(per_core, key=lambda bits: per_core[bits])
    return Peak(llvm.get_host_cpu_name(), best, per_core[best], threads, by_width)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=0.3,
                        help="time budget per width and thread count")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(measure_peak(args.threads, args.seconds).describe())
    int8 = measure_int8_peak(args.threads, args.seconds)
    if int8 is not None:
        print(f"int8 vpdpbusd peak: {int8.per_core:.1f} GOP/s per core measured "
              f"({int8.vector_bits}-bit), x{int8.threads} cores = {int8.all_threads:.1f} GOP/s")


if __name__ == "__main__":
    main()

"""onnxruntime and OpenVINO on a kiln target's instruction set: CPU features hidden from
their `cpuid`.

onnxruntime's MLAS and OpenVINO's CPU plugin (its oneDNN, its own MLAS copy and its JIT
emitters) pick their kernels from the `cpuid` instruction when they start, so on an
AVX-512 host they run their AVX-512 and VNNI kernels even when kiln is compiled for the
AVX2 path (`--mattr=-avx512f`, `--target "llvm -mcpu=znver3"`), and a ratio to them is
not the AVX2 path's. `hide_from_onnxruntime(features)` (`hide_from_openvino`), called
before the package is imported, makes the import load a copy of the installed package
whose native libraries have every `cpuid` instruction (0F A2, found by objdump's
disassembly) replaced by `int 0x41` (CD 41, as long): in user mode that raises a
general-protection fault, whose SIGSEGV a small handler (compiled here with `cc`)
answers as `cpuid` would, with the hidden features' bits cleared, before it resumes
after the instruction. Only start-up detection executes `cpuid`, so the handler costs
nothing in the timed calls; kiln's own code and every other library of the process see
the real CPU. One handler serves every hidden package of a process, with one hidden set.

Check it took: onnxruntime with AVX-512 VNNI hidden sums u8 x s8 pairs the way its
AVX2 kernel does, saturating to int16 (docs/quantization.md, "onnxruntime's AVX2
pairs"), where the VNNI kernel is exact; `saturates()` runs that MatMulInteger.
OpenVINO names the ISA in each layer's `exec_type` (`brgconv_avx2_f32`);
`openvino_isas()` runs a convolution and returns them.

The copies are cached under ~/.cache/kiln-bench, one per package build.
Needs Linux on x86-64, objdump (binutils) and a C compiler. A bench tool: asserts nothing.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.util
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

#: The cpuid bits of each hideable feature (LLVM spelling): (leaf, subleaf, register
#: index 0-3 for eax..edx, bit). Leaf 7 holds the AVX-512, VNNI and AMX flags.
CPUID_BITS: dict[str, tuple[int, int, int, int]] = {
    "avx512f": (7, 0, 1, 16), "avx512dq": (7, 0, 1, 17), "avx512ifma": (7, 0, 1, 21),
    "avx512cd": (7, 0, 1, 28), "avx512bw": (7, 0, 1, 30), "avx512vl": (7, 0, 1, 31),
    "avx512vbmi": (7, 0, 2, 1), "avx512vbmi2": (7, 0, 2, 6), "avx512vnni": (7, 0, 2, 11),
    "avx512bitalg": (7, 0, 2, 12), "avx512vpopcntdq": (7, 0, 2, 14),
    "avx512vp2intersect": (7, 0, 3, 8), "amx-bf16": (7, 0, 3, 22),
    "avx512fp16": (7, 0, 3, 23), "amx-tile": (7, 0, 3, 24), "amx-int8": (7, 0, 3, 25),
    "avxvnni": (7, 1, 0, 4), "avx512bf16": (7, 1, 0, 5), "avxifma": (7, 1, 0, 23),
    "avxvnniint8": (7, 1, 3, 4), "amx-fp16": (7, 1, 0, 21),
}

#: The trap that stands in for `cpuid`: `int 0x41`, two bytes as `cpuid` is.
CPUID, TRAP = b"\x0f\xa2", b"\xcd\x41"

HANDLER_C = r"""
#define _GNU_SOURCE
#include <cpuid.h>
#include <signal.h>
#include <string.h>
#include <ucontext.h>

static unsigned clear[2][4];   /* bits cleared in leaf 7's answers, by subleaf */
static unsigned long answered;
static struct sigaction previous;

static void on_segv(int sig, siginfo_t *info, void *context) {
    greg_t *r = ((ucontext_t *)context)->uc_mcontext.gregs;
    const unsigned char *at = (const unsigned char *)r[REG_RIP];
    /* `int 0x41` faults with SI_KERNEL and the instruction's address; any other fault
       goes back to the previous handler when the instruction runs again */
    if (info->si_code != SI_KERNEL || at[0] != 0xCD || at[1] != 0x41) {
        sigaction(SIGSEGV, &previous, NULL);
        return;
    }
    unsigned leaf = (unsigned)r[REG_RAX], sub = (unsigned)r[REG_RCX], v[4];
    __cpuid_count(leaf, sub, v[0], v[1], v[2], v[3]);
    if (leaf == 7 && sub < 2)
        for (int i = 0; i < 4; i++) v[i] &= ~clear[sub][i];
    r[REG_RAX] = v[0]; r[REG_RBX] = v[1]; r[REG_RCX] = v[2]; r[REG_RDX] = v[3];
    r[REG_RIP] += 2;
    answered++;
    (void)sig;
}

int kiln_bench_hide(const unsigned *leaf7_0, const unsigned *leaf7_1) {
    struct sigaction action;
    memcpy(clear[0], leaf7_0, sizeof clear[0]);
    memcpy(clear[1], leaf7_1, sizeof clear[1]);
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_segv;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    return sigaction(SIGSEGV, &action, &previous);
}

unsigned long kiln_bench_answered(void) { return answered; }
"""

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kiln-bench"
_handler: list[ctypes.CDLL] = []  # the loaded handler, kept alive
_hidden: list[str] = []  # the features it hides


def hidden_for(target_features: Iterable[str], host_features: Iterable[str]) -> list[str]:
    """The hideable features the host has and the target lacks, sorted; every AVX-512
    one when the target lacks `avx512f` (a feature list may not name them all)."""
    target = set(target_features)
    hidden = {f for f in set(host_features) - target if f in CPUID_BITS}
    if "avx512f" in hidden:
        hidden |= {f for f in CPUID_BITS if f.startswith("avx512")}
    return sorted(hidden)


def hide_from_onnxruntime(features: Iterable[str]) -> str:
    """Import onnxruntime from a copy that sees the CPU without `features` (LLVM names,
    keys of CPUID_BITS); returns a line saying what was done.
    Raises RuntimeError when onnxruntime is already imported, the platform is not
    Linux x86-64, a tool is missing or the process hides another set already."""
    return _hide_from("onnxruntime", features)


def hide_from_openvino(features: Iterable[str]) -> str:
    """Import OpenVINO from a copy that sees the CPU without `features`, as
    `hide_from_onnxruntime`: libopenvino, its CPU plugin's oneDNN and MLAS all ask the
    trapped `cpuid` (oneDNN's `ONEDNN_MAX_CPU_ISA` would cap only oneDNN's kernels)."""
    return _hide_from("openvino", features)


def _hide_from(package_name: str, features: Iterable[str]) -> str:
    hidden = sorted(set(features))
    unknown = [f for f in hidden if f not in CPUID_BITS]
    if unknown:
        raise RuntimeError(f"cannot hide {unknown}: not in ort_isa.CPUID_BITS")
    if not hidden:
        return f"{package_name}: the host's CPU features"
    if package_name in sys.modules:
        raise RuntimeError(f"{package_name}'s CPU features must be hidden before it is "
                           "imported")
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        raise RuntimeError("hiding CPU features from a library needs Linux on x86-64")
    spec = importlib.util.find_spec(package_name)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"{package_name} is not installed")
    root = _patched_copy(Path(spec.origin).parent)
    _install_handler(hidden)
    before = answered()
    sys.path.insert(0, str(root))
    importlib.import_module(package_name)  # its start-up detection may run here
    if package_name == "openvino":
        _openvino_capabilities()  # libopenvino asks cpuid when first asked for the CPU
    if answered() == before:
        raise RuntimeError(f"{package_name} loaded without asking the handler: "
                           "nothing hidden")
    return f"{package_name}: {' '.join(hidden)} hidden from its cpuid (bench/ort_isa.py)"


def answered() -> int:
    """How many trapped `cpuid` instructions the handler has answered (0: none ran)."""
    return int(_handler[0].kiln_bench_answered()) if _handler else 0


def saturates() -> bool:
    """Whether onnxruntime's MatMulInteger saturates u8 x s8 pairs to int16 (its AVX2
    kernels do, its VNNI kernels and the ONNX definition do not): 255 x -128 x 2 per
    pair, so a saturated sum is -32768 a pair, the exact one -65280."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    k = 64
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    graph = helper.make_graph(
        [node], "pairs", [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, k]),
                          helper.make_tensor_value_info("b", TensorProto.INT8, [k, 16])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    a = np.full((1, k), 255, np.uint8)
    b = np.full((k, 16), -128, np.int8)
    y = session.run(None, {"a": a, "b": b})[0]
    return bool((y != a.astype(np.int32) @ b.astype(np.int32)).any())


def _openvino_capabilities() -> list[str]:
    import openvino as ov

    return list(ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def openvino_isas() -> list[str]:
    """The distinct `exec_type`s OpenVINO's CPU plugin runs a float32 convolution and
    matrix product with (PERF_COUNT), e.g. ['brgconv_avx2_f32', 'gemm_mlas_f32'], and
    its OPTIMIZATION_CAPABILITIES: which ISA the plugin chose."""
    import numpy as np
    import onnx
    import openvino as ov
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
               for name, shape in (("w", (32, 16, 3, 3)), ("m", (64, 32 * 8 * 8)))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Flatten", ["c"], ["f"]),
             helper.make_node("Gemm", ["f", "m"], ["y"], transB=1)]
    graph = helper.make_graph(
        nodes, "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "probe.onnx")
        onnx.save(model, path)
        compiled = ov.Core().compile_model(path, "CPU", {
            "INFERENCE_PRECISION_HINT": "f32", "PERF_COUNT": True, "INFERENCE_NUM_THREADS": 1})
    request = compiled.create_infer_request()
    request.infer({"x": np.ones((1, 16, 8, 8), np.float32)})
    kinds = {p.exec_type for p in request.get_profiling_info()
             if p.node_type in ("Convolution", "FullyConnected", "MatMul")}
    return [*sorted(kinds), f"capabilities {' '.join(_openvino_capabilities())}"]


def _patched_copy(package: Path) -> Path:
    """A directory holding the installed `package` with its native libraries' `cpuid`
    instructions trapped (built once, then reused)."""
    libraries = sorted(p for p in package.rglob("*.so*") if p.is_file())
    stamp = hashlib.sha256(repr([(str(p), p.stat().st_size, p.stat().st_mtime_ns)
                                 for p in libraries]).encode()).hexdigest()[:16]
    root = CACHE / f"{package.name}-{stamp}"
    if (root / "done").exists():
        return root
    if root.exists():
        shutil.rmtree(root)
    copy = root / package.name
    shutil.copytree(package, copy, symlinks=True,
                    ignore=lambda d, names: [n for n in names if n == "__pycache__"])
    for lib in libraries:
        _trap_cpuid(copy / lib.relative_to(package))
    (root / "done").touch()
    return root


def _trap_cpuid(path: Path) -> int:
    """Replace each `cpuid` of the ELF file at `path` by TRAP; returns how many."""
    listing = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(path)],
                             capture_output=True, text=True, check=True).stdout
    addresses = [int(m.group(1), 16) for m in
                 re.finditer(r"^\s*([0-9a-f]+):\s+cpuid\s*$", listing, re.M)]
    data = bytearray(path.read_bytes())
    segments = _load_segments(data)
    for address in addresses:
        offset = next(o + address - v for v, o, size in segments if v <= address < v + size)
        if data[offset:offset + 2] != CPUID:
            raise RuntimeError(f"{path.name}: no cpuid at {address:#x}")
        data[offset:offset + 2] = TRAP
    path.unlink()  # a fresh file, never a write through a link into the installed one
    path.write_bytes(bytes(data))
    path.chmod(0o755)
    return len(addresses)


def _load_segments(elf: bytes) -> list[tuple[int, int, int]]:
    """(virtual address, file offset, file size) of each PT_LOAD of a 64-bit
    little-endian ELF file."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise RuntimeError("not a 64-bit little-endian ELF file")
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    segments = []
    for i in range(phnum):
        kind, _, offset, vaddr, _, filesz = struct.unpack_from(
            "<IIQQQQ", elf, phoff + i * phentsize)
        if kind == 1:
            segments.append((vaddr, offset, filesz))
    return segments


def _compiled_handler() -> Path:
    """The handler's shared library, compiled once per version of HANDLER_C."""
    path = CACHE / f"hide_cpuid-{hashlib.sha256(HANDLER_C.encode()).hexdigest()[:16]}.so"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        source = path.with_suffix(".c")
        source.write_text(HANDLER_C)
        cc = os.environ.get("CC", "cc")
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([cc, "-O2", "-shared", "-fPIC", "-Wall", "-Werror", "-o",
                        str(partial), str(source)], check=True)
        partial.replace(path)  # whole or absent: another bench may be loading it
    return path


def _install_handler(hidden: list[str]) -> None:
    """Install the SIGSEGV handler answering for the hidden features, once a process:
    a second install would take itself for the previous handler."""
    if _handler:
        if _hidden != hidden:
            raise RuntimeError(f"this process hides {' '.join(_hidden)} already; cannot "
                               f"hide {' '.join(hidden)} from another library")
        return
    masks = [[0] * 4, [0] * 4]
    for feature in hidden:
        _, sub, register, bit = CPUID_BITS[feature]
        masks[sub][register] |= 1 << bit
    lib = ctypes.CDLL(str(_compiled_handler()))
    words = ctypes.c_uint * 4
    lib.kiln_bench_answered.restype = ctypes.c_ulong
    if lib.kiln_bench_hide(words(*masks[0]), words(*masks[1])) != 0:
        raise RuntimeError("sigaction(SIGSEGV) failed")
    _handler.append(lib)
    _hidden.extend(hidden)

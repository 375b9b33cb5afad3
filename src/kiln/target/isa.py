"""One description of a target's CPU, for every kernel builder.

`isa_for(target)` turns a target's (mtriple, mcpu, mattr) into an `ISA`: the
vector width and registers, FMA, the integer dot-product instructions, AMX tiles
and a cache model. The features come from LLVM's own subtarget
(`kiln.target.llvm_features`), so `mcpu=znver4` and `mattr=[-avx512f]` mean
what LLVM will emit for them, not what a hand-kept CPU list guesses. Kernels ask
this object — never the host — so a library built for another CPU gets that
CPU's tiles.

Targets without a CPU (python, cuda, ...) and deploy hosts without llvmlite get
`GENERIC`: 128-bit vectors, no FMA, no dot products — code that is correct
everywhere.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

from kiln.errors import TargetError
from kiln.target.host import host_triple, machine_config, triple_arch, triple_bare_metal
from kiln.target.kernel_profile import KernelProfile, profile_for
from kiln.target.llvm_features import implied_features
from kiln.target.llvm_names import check_cpu_names
from kiln.target.target import Target

# The features an ISA decision depends on (LLVM spelling). Probing only these keeps
# `isa_for` fast; the full list a library requires is codegen.cpu_requirements'.
_X86 = ("sse4.1", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq",
        "avx512vl", "avx512vnni", "avx512bf16", "avx512fp16", "avxvnni", "avxvnniint8",
        "amx-tile", "amx-int8", "amx-bf16", "amx-fp16", "avx10.1-512", "avx10.2-512")
_AARCH64 = ("neon", "fullfp16", "dotprod", "i8mm", "bf16", "sve", "sve2", "sme")
_ARM = ("neon", "dotprod", "i8mm", "dsp", "mve", "mve.fp", "fp-armv8", "vfp4")

# Integer dot-product instruction families, best first (see `ISA.int8_dot`).
INT8_DOTS = ("amx", "avx512vnni", "avxvnni", "avx512bw", "avx2", "i8mm", "sdot", "dsp")


@dataclass(frozen=True)
class ISA:
    """What the kernels may use on one target CPU.

    `vector_bits` is the widest vector register kiln's kernels fill (0: none worth
    vectorizing for); `lanes(dtype)` divides it. `int8_dot` names the best u8xs8 ->
    s32 multiply-accumulate: "avx512vnni" (vpdpbusd zmm), "avxvnni" (vpdpbusd ymm),
    "avx512bw"/"avx2" (bytes widened to int16 halves, then vpmaddwd: exact), "i8mm"/
    "sdot" (AArch64 smmla / sdot), "dsp" (Arm SMLAD), or None (widen and multiply).
    "amx" is listed in `int8_dots` only: AMX tiles serve large GEMMs next to the
    vector path, never instead of it.
    """

    arch: str
    features: frozenset[str]
    vector_bits: int
    vector_registers: int
    mask_registers: int = 0
    fma: bool = False
    int8_dots: tuple[str, ...] = ()
    amx_tiles: int = 0
    l1d_bytes: int = 32 * 1024
    l2_bytes: int = 512 * 1024
    l3_bytes_per_core: int = 2 * 1024 * 1024
    cpu: str = ""
    #: The target's kind ("llvm", "c", ...; empty: no target): on CPU kinds the kernels
    #: compute exp/tanh/erf as arithmetic (kiln.kernels.math) instead of libm calls.
    kind: str = ""
    #: The target attribute `int8-pairs`: "exact" (ONNX's sums) or "saturate"
    #: (onnxruntime's AVX2 int16 pair sums, docs/quantization.md).
    int8_pairs: str = "exact"
    #: Whether the kernel rules may take Winograd convolutions (the target attribute
    #: `winograd`; absent: on where the target has an OS, off on bare metal).
    winograd: bool = False
    #: The tuning session's one-thread work (ns) from which a kernel loop goes parallel,
    #: for the model compiled (its `parallel_threshold` knob, kiln.tuning.apply); 0: the
    #: rule's (kiln.kernels.parallel_work.PARALLEL_MIN_NS). The passes set it.
    parallel_min_ns: int = 0
    #: The target attribute `precision` (kiln.target.precision): "f32", or "bf16" for
    #: GEMMs on bfloat16 weights with float32 sums (kiln.kernels.gemm.bf16).
    precision: str = "f32"

    def lanes(self, dtype: str = "float32") -> int:
        """Elements of `dtype` in one vector register (1 without vectors)."""
        bits = _DTYPE_BITS.get(dtype)
        if bits is None:
            raise TargetError(f"no lane count for dtype {dtype!r}")
        return max(1, self.vector_bits // bits)

    @property
    def int8_dot(self) -> str | None:
        """The best vector u8xs8 -> s32 instruction family (None: widen and multiply)."""
        vector = [d for d in self.int8_dots if d != "amx"]
        return vector[0] if vector else None

    @property
    def profile(self) -> KernelProfile:
        """The measured per-microarchitecture knobs of the kernel rules for this ISA's
        vector width (kiln.target.kernel_profile)."""
        return profile_for(self.vector_bits)

    def has(self, feature: str) -> bool:
        """Whether the target enables the LLVM feature `feature` (e.g. "avx512vnni")."""
        return feature in self.features


_DTYPE_BITS = {"float64": 64, "int64": 64, "uint64": 64, "float32": 32, "int32": 32,
               "uint32": 32, "float16": 16, "bfloat16": 16, "int16": 16, "uint16": 16,
               "int8": 8, "uint8": 8, "bool": 8}

GENERIC = ISA(arch="generic", features=frozenset(), vector_bits=128, vector_registers=16)


def isa_for(target: Any) -> ISA:
    """The ISA of `target` (a kiln Target; None means the current one, else GENERIC),
    with the target's kind and the kernel choices its attributes make."""
    if target is None:
        target = Target.current()
        if target is None:
            return GENERIC
    return _with_target_choices(_cpu_isa(target), target)


def _with_target_choices(isa: ISA, target: Any) -> ISA:
    attrs = target.attrs
    winograd = attrs.get("winograd")
    if winograd is None:  # firmware's flash and RAM: no transformed weights by default
        winograd = not triple_bare_metal(str(attrs.get("mtriple") or host_triple()))
    return replace(isa, kind=target.kind.name, int8_pairs=str(attrs.get("int8-pairs") or
                                                              "exact"), winograd=bool(winograd),
                   precision=str(attrs.get("precision") or "f32"))


def _cpu_isa(target: Any) -> ISA:
    attrs = target.attrs
    if "mattr" not in attrs:  # kinds without a CPU (python, cuda, rocm, ...)
        return GENERIC
    triple = str(attrs.get("mtriple") or host_triple())
    cpu = str(attrs.get("mcpu") or "")
    features = [str(f) for f in attrs.get("mattr") or ()]
    if cpu == "native":  # `c -mcpu=native`: this machine's CPU, as the C compiler takes it

        host = machine_config()
        cpu, features = str(host["mcpu"]), [*host["mattr"], *features]
    return isa_of(triple, cpu, ",".join(features))


@functools.cache
def isa_of(triple: str, cpu: str, mattr: str) -> ISA:
    """The ISA of LLVM's subtarget (triple, cpu, comma-separated mattr)."""
    arch = triple_arch(triple)
    candidates = _X86 if arch in ("x86_64", "i386", "i686") else (
        _AARCH64 if arch in ("aarch64", "arm64") else
        _ARM if arch.startswith(("arm", "thumb")) else ())
    try:
        # LLVM aborts the process on some CPUs of another architecture ("64-bit code
        # requested on a subtarget that doesn't support it"): refuse them first
        check_cpu_names(triple, cpu, [f for f in mattr.split(",") if f], "llvm")
        feats = implied_features(triple, cpu, mattr, candidates)
    except ImportError:  # no llvmlite: trust mattr alone
        feats = frozenset(f[1:] for f in mattr.split(",") if f.startswith("+"))
    if candidates is _X86:
        return _x86(feats, cpu)
    if candidates is _AARCH64:
        return _aarch64(feats, cpu)
    if candidates is _ARM:
        return _arm(feats, cpu)
    if arch.startswith("wasm"):
        return ISA(arch=arch, features=feats, vector_bits=128, vector_registers=16, cpu=cpu)
    return ISA(arch=arch, features=feats, vector_bits=0, vector_registers=0, cpu=cpu)


def _x86(f: frozenset[str], cpu: str) -> ISA:
    avx512 = "avx512f" in f
    dots = [d for d, need in (("amx", "amx-int8"), ("avx512vnni", "avx512vnni"),
                              ("avxvnni", "avxvnni"), ("avx512bw", "avx512bw"),
                              ("avx2", "avx2")) if need in f]
    return ISA(
        arch="x86_64", features=f, cpu=cpu,
        vector_bits=512 if avx512 else 256 if "avx" in f else 128,
        vector_registers=32 if avx512 else 16,
        mask_registers=8 if avx512 else 0,
        fma="fma" in f,
        int8_dots=tuple(dots),
        amx_tiles=8 if "amx-tile" in f else 0,
        l1d_bytes=48 * 1024 if avx512 else 32 * 1024,
        l2_bytes=1024 * 1024 if avx512 else 512 * 1024,
    )


def _aarch64(f: frozenset[str], cpu: str) -> ISA:
    dots = [d for d, need in (("i8mm", "i8mm"), ("sdot", "dotprod")) if need in f]
    return ISA(arch="aarch64", features=f | {"neon"}, cpu=cpu, vector_bits=128,
               vector_registers=32, mask_registers=16 if "sve" in f else 0, fma=True,
               int8_dots=tuple(dots), l1d_bytes=64 * 1024, l2_bytes=1024 * 1024)


def _arm(f: frozenset[str], cpu: str) -> ISA:
    neon = "neon" in f or "mve" in f
    dots = [d for d, need in (("i8mm", "i8mm"), ("sdot", "dotprod"), ("dsp", "dsp"))
            if need in f]
    return ISA(arch="arm", features=f, cpu=cpu, vector_bits=128 if neon else 0,
               vector_registers=16 if neon else 0, fma="vfp4" in f or "mve.fp" in f,
               int8_dots=tuple(dots), l1d_bytes=16 * 1024, l2_bytes=0,
               l3_bytes_per_core=0)

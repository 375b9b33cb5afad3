"""The CPU kinds' `precision` attribute: the arithmetic of float32 GEMMs and
convolutions.

`f32` (the default, also spelled by leaving the attribute out) computes in float32.
`bf16` stores the constant weights of GEMMs and NCHWc convolutions in bfloat16 (rounded
to nearest even at compile time) and sums products of bfloat16 values in float32, with
float32 inputs and outputs (kiln.kernels.gemm.bf16, kiln.kernels.conv.bf16; attention's
products of two activations: kiln.kernels.gemm.bf16_tiled): one AVX512-BF16
`vdpbf16ps` per two multiply-adds.
`f16` stores the constant weights of GEMMs in float16 (rounded to nearest even at
compile time) and widens them to float32 as the kernel loads them (F16C's
`vcvtph2ps`), multiplying and summing in float32 (kiln.kernels.gemm.f16): half the
weight bytes at float32 arithmetic, so the only extra rounding is the weights' (a
relative 2^-11). Convolutions and attention stay float32 under `f16`.
A target whose CPU lacks the instruction refuses it here, when the target is built,
naming the feature and CPUs that have it.
"""

from __future__ import annotations

from typing import Any

from kiln.errors import TargetError
from kiln.target.host import host_triple, machine_config, triple_arch
from kiln.target.llvm_features import implied_features

#: The LLVM feature the bf16 GEMM kernel needs (`vdpbf16ps`, `vcvtne2ps2bf16`).
BF16_FEATURE = "avx512bf16"
#: LLVM CPU names that have it, for the error message (AMD first, then Intel).
BF16_CPUS = ("znver4", "znver5", "cooperlake", "sapphirerapids", "graniterapids")
#: The kinds whose code generator emits the bf16 kernel's instructions.
BF16_KINDS = ("llvm", "llvmjit")
#: The LLVM feature the f16 GEMM needs (`vcvtph2ps`), and CPUs that have it.
F16_FEATURE = "f16c"
F16_CPUS = ("x86-64-v3", "haswell", "znver1")


def check_precision(attrs: dict[str, Any], kind: str) -> dict[str, Any]:
    """`attrs` with `precision` checked against the target's CPU (TargetError when the
    CPU or the kind cannot run it); `f32`, the default, is dropped, so that
    `host -precision=f32` and `host` are one target."""
    precision = attrs.get("precision")
    if precision is None or precision == "f32":
        attrs.pop("precision", None)
        return attrs
    where = f"attribute 'precision' of target kind '{kind}' is '{precision}'"
    words = "bfloat16 dot products" if precision == "bf16" else "float16 weight loads"
    if kind not in BF16_KINDS:
        raise TargetError(f"{where}: the '{kind}' code generator does not emit the "
                          f"{words} yet; use kind {' or '.join(BF16_KINDS)}")
    triple = str(attrs.get("mtriple") or host_triple())
    cpu, mattr = str(attrs.get("mcpu") or ""), list(attrs.get("mattr") or ())
    if cpu == "native":
        host = machine_config()
        cpu, mattr = str(host["mcpu"]), [*host["mattr"], *mattr]
    arch = triple_arch(triple)
    feature, instruction, cpus = ((BF16_FEATURE, "vdpbf16ps", BF16_CPUS) if precision == "bf16"
                                  else (F16_FEATURE, "vcvtph2ps", F16_CPUS))
    if arch not in ("x86_64", "i386", "i686"):
        raise TargetError(f"{where}: the {precision} GEMM is built for x86 "
                          f"({feature}) only, not for {arch} ({triple}) yet")
    if feature not in _features(triple, cpu, mattr, feature):
        raise TargetError(
            f"{where}, but CPU {cpu or '(generic)'!r} with mattr {mattr or '[]'} lacks "
            f"'{feature}' ({instruction}); CPUs that have it: -mcpu="
            f"{', -mcpu='.join(cpus)}, or add -mattr=+{feature} where the "
            "machine has it")
    return attrs


def _features(triple: str, cpu: str, mattr: list[str], feature: str) -> frozenset[str]:
    try:
        return implied_features(triple, cpu, ",".join(mattr), (feature,))
    except ImportError:  # no llvmlite: trust mattr alone
        return frozenset(f[1:] for f in mattr if f.startswith("+"))

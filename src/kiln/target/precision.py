"""The CPU kinds' `precision` attribute: the arithmetic of float32 GEMMs and
convolutions.

`f32` (the default, also spelled by leaving the attribute out) computes in float32.
`bf16` stores the constant weights of GEMMs and NCHWc convolutions in bfloat16 (rounded
to nearest even at compile time) and sums products of bfloat16 values in float32, with
float32 inputs and outputs (kiln.kernels.gemm.bf16, kiln.kernels.conv.bf16; attention's
products of two activations: kiln.kernels.gemm.bf16_tiled): one AVX512-BF16
`vdpbf16ps` per two multiply-adds.
A target whose CPU lacks the instruction refuses it here, when the target is built,
naming the feature and CPUs that have it. `f16` is declared but not built yet.
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


def check_precision(attrs: dict[str, Any], kind: str) -> dict[str, Any]:
    """`attrs` with `precision` checked against the target's CPU (TargetError when the
    CPU or the kind cannot run it); `f32`, the default, is dropped, so that
    `host -precision=f32` and `host` are one target."""
    precision = attrs.get("precision")
    if precision is None or precision == "f32":
        attrs.pop("precision", None)
        return attrs
    where = f"attribute 'precision' of target kind '{kind}' is '{precision}'"
    if precision == "f16":
        raise TargetError(f"{where}: float16 compute (AVX512-FP16) is not built yet; use "
                          "'bf16' on a CPU with AVX512-BF16, or 'f32'")
    if kind not in BF16_KINDS:
        raise TargetError(f"{where}: the '{kind}' code generator does not emit the "
                          f"bfloat16 dot products yet; use kind {' or '.join(BF16_KINDS)}")
    triple = str(attrs.get("mtriple") or host_triple())
    cpu, mattr = str(attrs.get("mcpu") or ""), list(attrs.get("mattr") or ())
    if cpu == "native":
        host = machine_config()
        cpu, mattr = str(host["mcpu"]), [*host["mattr"], *mattr]
    arch = triple_arch(triple)
    if arch not in ("x86_64", "i386", "i686"):
        raise TargetError(f"{where}: the bfloat16 GEMM is built for x86 (AVX512-BF16) only, "
                          f"not for {arch} ({triple}) yet")
    if BF16_FEATURE not in _features(triple, cpu, mattr):
        raise TargetError(
            f"{where}, but CPU {cpu or '(generic)'!r} with mattr {mattr or '[]'} lacks "
            f"'{BF16_FEATURE}' (vdpbf16ps); CPUs that have it: -mcpu="
            f"{', -mcpu='.join(BF16_CPUS)}, or add -mattr=+{BF16_FEATURE} where the "
            "machine has it")
    return attrs


def _features(triple: str, cpu: str, mattr: list[str]) -> frozenset[str]:
    try:
        return implied_features(triple, cpu, ",".join(mattr), (BF16_FEATURE,))
    except ImportError:  # no llvmlite: trust mattr alone
        return frozenset(f[1:] for f in mattr if f.startswith("+"))

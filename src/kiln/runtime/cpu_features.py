"""Does this CPU have the features a library's code was compiled for?

A library built for CPU features the running machine lacks (AVX-512 code on an
AVX2 machine) would die with SIGILL at its first call. The compiler records the
features the native code may use (artifact metadata `requires_features`, LLVM
feature names); `load_module` compares them with the running CPU and refuses
with an error naming the missing ones. The running CPU's features come from
Linux's /proc/cpuinfo (no llvmlite on a deploy host): its flag names differ
from LLVM's, so only the features in `_CPUINFO_NAMES` are compared; the others
(tuning flags, features Linux does not list) are not checked.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Iterable
from pathlib import Path

from kiln.errors import KilnError

# LLVM feature name -> /proc/cpuinfo flag, per architecture (Linux names): the
# extensions a compiler emits on its own for kernels (vector units, bit
# manipulation). Instructions only reachable through intrinsics (AES, SHA,
# RDRAND, ...) are left out: kiln's code does not use them, and a hypervisor may
# hide some of them from Linux while the CPU still reports them.
_X86 = {
    "sse": "sse", "sse2": "sse2", "sse3": "pni", "ssse3": "ssse3", "sse4.1": "sse4_1",
    "sse4.2": "sse4_2", "popcnt": "popcnt", "avx": "avx", "avx2": "avx2", "fma": "fma",
    "f16c": "f16c", "bmi": "bmi1", "bmi2": "bmi2", "lzcnt": "abm", "movbe": "movbe",
    "avx512f": "avx512f", "avx512cd": "avx512cd", "avx512bw": "avx512bw",
    "avx512dq": "avx512dq", "avx512vl": "avx512vl", "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi", "avx512vbmi2": "avx512_vbmi2", "avx512vnni": "avx512_vnni",
    "avx512bitalg": "avx512_bitalg", "avx512vpopcntdq": "avx512_vpopcntdq",
    "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16", "avxvnni": "avx_vnni",
    "amx-tile": "amx_tile", "amx-int8": "amx_int8", "amx-bf16": "amx_bf16",
}
_AARCH64 = {
    "fp-armv8": "fp", "neon": "asimd", "crc": "crc32", "lse": "atomics", "rdm": "asimdrdm",
    "dotprod": "asimddp", "fullfp16": "fphp", "sve": "sve", "sve2": "sve2", "i8mm": "i8mm",
    "bf16": "bf16", "rcpc": "lrcpc", "fp16fml": "asimdfhm",
}
_CPUINFO_NAMES = {"x86_64": _X86, "i686": _X86, "aarch64": _AARCH64, "arm64": _AARCH64}


class CPUFeatureError(KilnError, RuntimeError):
    """The library's code needs CPU features this machine lacks."""


def machine_arch() -> str:
    """This machine's architecture in triple spelling ('x86_64', 'aarch64')."""
    arch = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


@functools.cache
def cpuinfo_flags(path: str = "/proc/cpuinfo") -> frozenset[str] | None:
    """The CPU flags Linux reports (the first processor's), or None if unknown."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() in ("flags", "features"):
            return frozenset(value.split())
    return None


def checkable_features(arch: str) -> frozenset[str]:
    """The LLVM feature names the loader compares on `arch` (triple spelling)."""
    return frozenset(_CPUINFO_NAMES.get(arch, {}))


def missing_features(required: Iterable[str], arch: str,
                     flags: frozenset[str] | None) -> list[str]:
    """The features of `required` (LLVM names) that `flags` (cpuinfo) lacks; only
    features with a known cpuinfo name are compared."""
    names = _CPUINFO_NAMES.get(arch)
    if names is None or flags is None:
        return []
    return sorted({f for f in required if f in names and names[f] not in flags})


def check_cpu(required: Iterable[str], triple: str, where: str) -> None:
    """CPUFeatureError if this machine lacks a feature the code in `where` needs.
    `KILN_SKIP_CPU_CHECK=1` skips the check (for a CPU whose Linux flags are incomplete)."""
    if os.environ.get("KILN_SKIP_CPU_CHECK", "") not in ("", "0"):
        return
    arch = triple.split("-", 1)[0]
    if arch != machine_arch():
        return  # another architecture: the dynamic loader refuses the file itself
    missing = missing_features(required, arch, cpuinfo_flags())
    if missing:
        raise CPUFeatureError(
            f"{where}: the code was compiled for CPU features this machine lacks: "
            f"{', '.join(missing)} (it would stop with an illegal instruction). Compile "
            "for this machine (target 'llvm' = this host) or for a baseline both machines "
            "have, e.g. '{\"kind\": \"llvm\", \"mcpu\": \"x86-64-v2\"}'")


__all__ = ["CPUFeatureError", "check_cpu", "checkable_features", "cpuinfo_flags", "machine_arch",
           "missing_features"]

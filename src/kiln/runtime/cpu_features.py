"""Does this CPU have the features a library's code was compiled for?

A library built for CPU features the running machine lacks (AVX-512 code on an
AVX2 machine, APX code on anything before Diamond Rapids) would die with SIGILL
at its first call. So:

- the compiler records the features the native code may use (artifact metadata
  `requires_features`, LLVM feature names, derived from LLVM's own subtarget
  by the compiler), and only names `TABLES` below can decide;
- host.c carries the same list, each name with its row of `TABLES`, and exports
  `{prefix}_cpu_missing`, which reads the running CPU's identification (x86:
  `cpuid` and `xgetbv`; AArch64 Linux: `getauxval(AT_HWCAP/AT_HWCAP2)`) and names
  the features it lacks. The first call of any entry runs it (plain C callers),
  and `load_module` calls it right after `dlopen`, before any kernel can run
  (`check_library`): a deploy host needs neither llvmlite nor a compiler for it.

`TABLES` is the one description of how a feature is detected, mirroring LLVM's
`sys::getHostCPUFeatures` (llvm/lib/TargetParser/Host.cpp): tests check that,
on an x86 machine, its view of the machine equals `llvm.get_host_cpu_features()`
for every key. `KILN_SKIP_CPU_CHECK=1` skips the check (Python and C), for a
machine whose hypervisor hides a bit the CPU really has.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import IntEnum

from kiln.errors import KilnError
from kiln.runtime import ctypes_abi as abi
from kiln.runtime.libc import libc_function

SKIP_ENV = "KILN_SKIP_CPU_CHECK"


class CPUFeatureError(KilnError, RuntimeError):
    """The library's code needs CPU features this machine lacks."""


class Reg(IntEnum):
    """The cpuid output register a bit is in (x86)."""

    EAX = 0
    EBX = 1
    ECX = 2
    EDX = 3


# Linux auxiliary-vector entries of AArch64's hardware capabilities.
AT_HWCAP = 16
AT_HWCAP2 = 26


@dataclass(frozen=True, slots=True)
class Field:
    """One condition `((word >> shift) & mask) >= at_least` on one word of the CPU's
    identification: x86 `cpuid(leaf, subleaf)`'s register `reg`; on AArch64 the
    auxiliary-vector entry `leaf` (AT_HWCAP, AT_HWCAP2), `subleaf` and `reg` 0."""

    leaf: int
    subleaf: int
    reg: int
    shift: int
    mask: int = 1
    at_least: int = 1


@dataclass(frozen=True, slots=True)
class CPUFeature:
    """How to tell that the running CPU has the LLVM feature `name`: every field
    holds and (x86) the OS saves the register state `xcr0` (bits of XGETBV(0)).

    `system`: instructions that only an OS, a hypervisor or an explicit intrinsic
    uses (SGX, PCONFIG, user interrupts, cache and TSX control, ...), never code a
    compiler generates on its own as kiln's kernels are. Hypervisors routinely hide
    these bits (a cloud `icelake-server` VM reports no PCONFIG), so they are not
    checked: a library built for the instance's own CPU name still loads there.
    """

    name: str
    fields: tuple[Field, ...]
    xcr0: int = 0
    system: bool = False


# ------------------------------------------------------------------ x86
# XCR0 state components: x87|SSE|AVX (0x7 would need x87 too; LLVM asks SSE|AVX),
# AVX-512 (opmask, ZMM_Hi256, Hi16_ZMM), AMX (XTILECFG, XTILEDATA), APX (EGPR).
_AVX_STATE = 0x6
_AVX512_STATE = 0xE6
_AMX_STATE = (1 << 17) | (1 << 18)
_APX_STATE = 1 << 19
_AVX_BIT = Field(1, 0, Reg.ECX, 28)  # LLVM: AVX state also needs the AVX cpuid bit


def _x86(rows: Mapping[str, tuple[int, int, Reg, int]], state: str = "") -> dict[str, CPUFeature]:
    """Single-bit features: name -> (leaf, subleaf, register, bit), all needing `state`."""
    xcr0, extra = {"": (0, ()), "avx": (_AVX_STATE, (_AVX_BIT,)),
                   "avx512": (_AVX512_STATE, (_AVX_BIT,)), "amx": (_AMX_STATE, ()),
                   "apx": (_APX_STATE, ())}[state]
    return {name: CPUFeature(name, tuple(dict.fromkeys((*extra, Field(leaf, sub, reg, bit)))),
                             xcr0)
            for name, (leaf, sub, reg, bit) in rows.items()}


_EXT1, _EXT8 = 0x80000001, 0x80000008
_X86: dict[str, CPUFeature] = {
    **_x86({
        "cx8": (1, 0, Reg.EDX, 8), "cmov": (1, 0, Reg.EDX, 15), "mmx": (1, 0, Reg.EDX, 23),
        "fxsr": (1, 0, Reg.EDX, 24), "sse": (1, 0, Reg.EDX, 25), "sse2": (1, 0, Reg.EDX, 26),
        "sse3": (1, 0, Reg.ECX, 0), "pclmul": (1, 0, Reg.ECX, 1), "ssse3": (1, 0, Reg.ECX, 9),
        "cx16": (1, 0, Reg.ECX, 13), "sse4.1": (1, 0, Reg.ECX, 19),
        "sse4.2": (1, 0, Reg.ECX, 20), "crc32": (1, 0, Reg.ECX, 20),
        "movbe": (1, 0, Reg.ECX, 22), "popcnt": (1, 0, Reg.ECX, 23), "aes": (1, 0, Reg.ECX, 25),
        "rdrnd": (1, 0, Reg.ECX, 30),
        "sahf": (_EXT1, 0, Reg.ECX, 0), "lzcnt": (_EXT1, 0, Reg.ECX, 5),
        "sse4a": (_EXT1, 0, Reg.ECX, 6), "prfchw": (_EXT1, 0, Reg.ECX, 8),
        "lwp": (_EXT1, 0, Reg.ECX, 15), "tbm": (_EXT1, 0, Reg.ECX, 21),
        "mwaitx": (_EXT1, 0, Reg.ECX, 29), "64bit": (_EXT1, 0, Reg.EDX, 29),
        "clzero": (_EXT8, 0, Reg.EBX, 0), "rdpru": (_EXT8, 0, Reg.EBX, 4),
        "wbnoinvd": (_EXT8, 0, Reg.EBX, 9),
        "fsgsbase": (7, 0, Reg.EBX, 0), "sgx": (7, 0, Reg.EBX, 2), "bmi": (7, 0, Reg.EBX, 3),
        "bmi2": (7, 0, Reg.EBX, 8), "invpcid": (7, 0, Reg.EBX, 10), "rtm": (7, 0, Reg.EBX, 11),
        "rdseed": (7, 0, Reg.EBX, 18), "adx": (7, 0, Reg.EBX, 19),
        "clflushopt": (7, 0, Reg.EBX, 23), "clwb": (7, 0, Reg.EBX, 24),
        "sha": (7, 0, Reg.EBX, 29),
        "pku": (7, 0, Reg.ECX, 4), "waitpkg": (7, 0, Reg.ECX, 5), "shstk": (7, 0, Reg.ECX, 7),
        "gfni": (7, 0, Reg.ECX, 8), "rdpid": (7, 0, Reg.ECX, 22), "kl": (7, 0, Reg.ECX, 23),
        "cldemote": (7, 0, Reg.ECX, 25), "movdiri": (7, 0, Reg.ECX, 27),
        "movdir64b": (7, 0, Reg.ECX, 28), "enqcmd": (7, 0, Reg.ECX, 29),
        "uintr": (7, 0, Reg.EDX, 5), "serialize": (7, 0, Reg.EDX, 14),
        "tsxldtrk": (7, 0, Reg.EDX, 16), "pconfig": (7, 0, Reg.EDX, 18),
        "sha512": (7, 1, Reg.EAX, 0), "sm3": (7, 1, Reg.EAX, 1), "sm4": (7, 1, Reg.EAX, 2),
        "raoint": (7, 1, Reg.EAX, 3), "cmpccxadd": (7, 1, Reg.EAX, 7),
        "hreset": (7, 1, Reg.EAX, 22), "movrs": (7, 1, Reg.EAX, 31),
        "prefetchi": (7, 1, Reg.EDX, 14), "usermsr": (7, 1, Reg.EDX, 15),
        "ptwrite": (0x14, 0, Reg.EBX, 4), "widekl": (0x19, 0, Reg.EBX, 2),
    }),
    **_x86({
        "avx": (1, 0, Reg.ECX, 28), "fma": (1, 0, Reg.ECX, 12), "xsave": (1, 0, Reg.ECX, 26),
        "f16c": (1, 0, Reg.ECX, 29), "xop": (_EXT1, 0, Reg.ECX, 11),
        "fma4": (_EXT1, 0, Reg.ECX, 16), "avx2": (7, 0, Reg.EBX, 5),
        "vaes": (7, 0, Reg.ECX, 9), "vpclmulqdq": (7, 0, Reg.ECX, 10),
        "avxvnni": (7, 1, Reg.EAX, 4), "avxifma": (7, 1, Reg.EAX, 23),
        "avxvnniint8": (7, 1, Reg.EDX, 4), "avxneconvert": (7, 1, Reg.EDX, 5),
        "avxvnniint16": (7, 1, Reg.EDX, 10),
        "xsaveopt": (0xD, 1, Reg.EAX, 0), "xsavec": (0xD, 1, Reg.EAX, 1),
        "xsaves": (0xD, 1, Reg.EAX, 3),
    }, "avx"),
    **_x86({
        "avx512f": (7, 0, Reg.EBX, 16), "avx512dq": (7, 0, Reg.EBX, 17),
        "avx512ifma": (7, 0, Reg.EBX, 21), "avx512cd": (7, 0, Reg.EBX, 28),
        "avx512bw": (7, 0, Reg.EBX, 30), "avx512vl": (7, 0, Reg.EBX, 31),
        "avx512vbmi": (7, 0, Reg.ECX, 1), "avx512vbmi2": (7, 0, Reg.ECX, 6),
        "avx512vnni": (7, 0, Reg.ECX, 11), "avx512bitalg": (7, 0, Reg.ECX, 12),
        "avx512vpopcntdq": (7, 0, Reg.ECX, 14), "avx512vp2intersect": (7, 0, Reg.EDX, 8),
        "avx512fp16": (7, 0, Reg.EDX, 23), "avx512bf16": (7, 1, Reg.EAX, 5),
    }, "avx512"),
    **_x86({
        "amx-bf16": (7, 0, Reg.EDX, 22), "amx-tile": (7, 0, Reg.EDX, 24),
        "amx-int8": (7, 0, Reg.EDX, 25), "amx-fp16": (7, 1, Reg.EAX, 21),
        "amx-complex": (7, 1, Reg.EDX, 8), "amx-fp8": (0x1E, 1, Reg.EAX, 4),
        "amx-tf32": (0x1E, 1, Reg.EAX, 6), "amx-avx512": (0x1E, 1, Reg.EAX, 7),
        "amx-movrs": (0x1E, 1, Reg.EAX, 8),
    }, "amx"),
    # APX: one cpuid bit for every sub-feature LLVM names; the OS must also save
    # the 16 extra registers (XCR0 bit 19), or their instructions fault.
    **_x86(dict.fromkeys(("egpr", "push2pop2", "ppx", "ndd", "ccmp", "nf", "cf", "zu"),
                         (7, 1, Reg.EDX, 21)), "apx"),
    # AVX10: the cpuid bit, and leaf 0x24's EBX[7:0] holds the version (>= 1, >= 2);
    # it uses the AVX-512 registers, so their state too.
    **{f"avx10.{v}": CPUFeature(f"avx10.{v}", (_AVX_BIT, Field(7, 1, Reg.EDX, 19),
                                               Field(0x24, 0, Reg.EBX, 0, 0xFF, v)),
                                _AVX512_STATE) for v in (1, 2)},
}


# ------------------------------------------------------------------ AArch64 (Linux hwcaps)
def _hwcaps(*bits: tuple[int, int]) -> tuple[Field, ...]:
    return tuple(Field(at, 0, 0, bit) for at, bit in bits)


_H, _H2 = AT_HWCAP, AT_HWCAP2
_AARCH64_ROWS: dict[str, tuple[tuple[int, int], ...]] = {
    "fp-armv8": ((_H, 0),), "neon": ((_H, 1),),
    "aes": ((_H, 3), (_H, 4)),  # AES and PMULL, as LLVM's host detection asks
    "sha2": ((_H, 5), (_H, 6)),  # SHA1 and SHA2
    "crc": ((_H, 7),), "lse": ((_H, 8),), "fullfp16": ((_H, 9), (_H, 10)),
    "rdm": ((_H, 12),), "jsconv": ((_H, 13),), "complxnum": ((_H, 14),), "rcpc": ((_H, 15),),
    "ccpp": ((_H, 16),), "sha3": ((_H, 17), (_H, 21)),  # LLVM's sha3 is SHA3 + SHA512
    "sm4": ((_H, 18), (_H, 19)),  # SM3 + SM4
    "dotprod": ((_H, 20),), "sve": ((_H, 22),), "fp16fml": ((_H, 23),), "dit": ((_H, 24),),
    "lse2": ((_H, 25),), "rcpc-immo": ((_H, 26),), "flagm": ((_H, 27),), "ssbs": ((_H, 28),),
    "sb": ((_H, 29),), "pauth": ((_H, 30), (_H, 31)),
    "ccdp": ((_H2, 0),), "sve2": ((_H2, 1),), "sve-aes": ((_H2, 2), (_H2, 3)),
    "sve-bitperm": ((_H2, 4),), "sve-sha3": ((_H2, 5),), "sve-sm4": ((_H2, 6),),
    "altnzcv": ((_H2, 7),), "fptoint": ((_H2, 8),), "f32mm": ((_H2, 10),),
    "f64mm": ((_H2, 11),), "i8mm": ((_H2, 13),), "bf16": ((_H2, 14),), "rand": ((_H2, 16),),
    "bti": ((_H2, 17),), "mte": ((_H2, 18),), "sme": ((_H2, 23),), "sme-i16i64": ((_H2, 24),),
    "sme-f64f64": ((_H2, 25),), "wfxt": ((_H2, 31),), "cssc": ((_H2, 34),),
    "sve2p1": ((_H2, 36),), "sme2": ((_H2, 37),), "mops": ((_H2, 43),), "hbc": ((_H2, 44),),
}
_AARCH64 = {name: CPUFeature(name, _hwcaps(*bits)) for name, bits in _AARCH64_ROWS.items()}

# Not checked (CPUFeature.system): OS, hypervisor and intrinsic-only instructions.
_SYSTEM = {
    "x86": ("sgx", "pconfig", "enqcmd", "uintr", "shstk", "pku", "invpcid", "fsgsbase",
            "hreset", "kl", "widekl", "usermsr", "rdpid", "ptwrite", "lwp", "mwaitx",
            "waitpkg", "serialize", "wbnoinvd", "tsxldtrk", "rtm", "xsave", "xsaveopt",
            "xsavec", "xsaves", "clzero", "rdpru", "cldemote", "clflushopt", "clwb", "movdiri",
            "movdir64b", "rdrnd", "rdseed", "prefetchi"),
    "aarch64": ("pauth", "bti", "mte", "rand", "ssbs", "sb", "dit", "wfxt", "ccpp", "ccdp"),
}

# Table architecture -> LLVM feature name -> how to detect it.
TABLES: dict[str, dict[str, CPUFeature]] = {
    arch: {name: replace(row, system=name in _SYSTEM[arch]) for name, row in rows.items()}
    for arch, rows in (("x86", _X86), ("aarch64", _AARCH64))}
_TABLE_OF_ARCH = {"x86_64": "x86", "i386": "x86", "i486": "x86", "i586": "x86", "i686": "x86",
                  "aarch64": "aarch64", "arm64": "aarch64"}


def table_arch(triple: str) -> str | None:
    """'x86' or 'aarch64' for a triple whose CPU kiln can check (x86 on any OS; AArch64
    on Linux, where the kernel publishes the hardware capabilities); None otherwise."""
    parts = triple.split("-")
    table = _TABLE_OF_ARCH.get(parts[0])
    if table == "aarch64" and "linux" not in parts[1:]:
        return None
    return table


def table_for(triple: str) -> dict[str, CPUFeature]:
    """The detection table of `triple`'s CPUs (empty when kiln cannot check them)."""
    table = table_arch(triple)
    return TABLES[table] if table else {}


def machine_arch() -> str:
    """This machine's architecture in triple spelling ('x86_64', 'aarch64')."""
    arch = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


def skip_requested() -> bool:
    """Whether `KILN_SKIP_CPU_CHECK` asks to skip the check (set, and not '' or '0')."""
    return os.environ.get(SKIP_ENV, "") not in ("", "0")


def _advice(names: str) -> str:
    return (f"the code was compiled for CPU features this machine lacks: {names} (it would "
            "stop with an illegal instruction). Compile for this machine (target 'llvm' = "
            "this host) or for a baseline both machines have, e.g. "
            "'{\"kind\": \"llvm\", \"mcpu\": \"x86-64-v3\"}'; "
            f"{SKIP_ENV}=1 skips this check")


# Linux x86-64: arch_prctl's syscall number, its request for an extended state
# component, and AMX's tile data component (XFEATURE_XTILEDATA).
_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


def request_amx_permission() -> bool:
    """Ask Linux for this process's use of the AMX tile data (arch_prctl
    ARCH_REQ_XCOMP_PERM), which it needs before its first tile instruction; False when
    refused. Other systems ask nothing: True. A library's host.c asks the same in its
    CPU check (`{prefix}_cpu_missing`); code without host.c (the llvmjit loader) asks
    here."""
    if platform.system() != "Linux" or machine_arch() != "x86_64":
        return True
    syscall = libc_function("syscall", ctypes.c_long, ctypes.c_long, ctypes.c_long,
                            ctypes.c_long)
    return syscall is not None and syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM,
                                           _XFEATURE_XTILEDATA) == 0


# Bytes of the name list `{prefix}_cpu_missing` writes (longer lists are cut short).
MISSING_BUFFER_SIZE = 4096


def check_library(lib: ctypes.CDLL, prefix: str, required: Iterable[str], triple: str,
                  where: str) -> None:
    """CPUFeatureError if this machine lacks a feature the library's code needs.

    `required` is the union of its native artifacts' `requires_features` (for
    `triple`); the answer comes from the library's own `{prefix}_cpu_missing`,
    which checks the same list, so nothing of the library but that function runs.
    """
    need = sorted(set(required))
    if skip_requested() and any(f.startswith("amx-") for f in need):
        request_amx_permission()  # the check skipped, AMX code still needs the tile data
    if not need or skip_requested() or triple.split("-", 1)[0] != machine_arch():
        return  # nothing to check, or another architecture (the loader refuses the file)
    try:
        fn = abi.bind(lib, f"{prefix}_cpu_missing", "cpu_missing")
    except AttributeError:
        raise CPUFeatureError(
            f"{where}: the code needs CPU features ({', '.join(need)}) but the library has "
            f"no {prefix}_cpu_missing to check them (built by an older kiln); rebuild it, "
            f"or set {SKIP_ENV}=1 if this machine is known to have them") from None
    out = ctypes.create_string_buffer(MISSING_BUFFER_SIZE)
    count = fn(out, MISSING_BUFFER_SIZE)
    if count < 0:
        raise CPUFeatureError(f"{where}: the library cannot read this CPU's features (built "
                              f"without cpuid/getauxval support); {SKIP_ENV}=1 skips the check")
    if count > 0:
        raise CPUFeatureError(f"{where}: {_advice(out.value.decode('ascii', 'replace'))}")


__all__ = [
    "AT_HWCAP",
    "AT_HWCAP2",
    "MISSING_BUFFER_SIZE",
    "SKIP_ENV",
    "TABLES",
    "CPUFeature",
    "CPUFeatureError",
    "Field",
    "Reg",
    "check_library",
    "machine_arch",
    "request_amx_permission",
    "skip_requested",
    "table_arch",
    "table_for",
]

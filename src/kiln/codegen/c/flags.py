"""C compiler flags for the generated kernels, derived from the target.

A native build (no `mtriple`, or one whose architecture is this machine's) gets
flags for the system `cc`, which the runtime uses to build the library. A cross
build (e.g. `c -mtriple=thumbv7em-none-eabihf -mcpu=cortex-m4`) gets the flags
of the matching GCC cross compiler, recorded in the artifact metadata together
with the compiler's name; kiln does not run it.

Always present: `-std=c99`, `-fwrapv` (integer arithmetic wraps, as in the IR),
`-ffp-contract=off` (no fused multiply-add, so results match the IR
interpreter; `-ffast-math` replaces it when the target asks for it) and
`-fno-math-errno -fno-trapping-math` (the IR has no errno and no floating-point
exceptions; GCC vectorizes `floorf` only without them). A native build whose `mcpu`
is this machine's CPU gets `-march=native`: the system compiler may not know LLVM's
name for a newer CPU. Another x86 CPU the system compiler does not know (GCC 12 has no
`znver4`) is spelled as the x86-64 baseline with the CPU's features that LLVM lists
and GCC names alike (`X86_FEATURES`), so the kernels use the same instruction sets.
"""

from __future__ import annotations

import functools
import os
import platform
import shlex
import subprocess
from typing import Any

from kiln.runtime.toolchain import cross_compiler
from kiln.target.host import machine_config, triple_bare_metal
from kiln.target.llvm_features import implied_features

# Python's names for machines -> the architecture part of LLVM triples.
_MACHINE_ARCH = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "i686": "i386"}


def target_attr(target: Any, key: str, default: Any = None) -> Any:
    """`target.get(key, default)`, tolerating None or objects without that attribute."""
    if target is None:
        return default
    getter = getattr(target, "get", None)
    if getter is None:
        return default
    try:
        value = getter(key, default)
    except (ValueError, KeyError, TypeError):  # an attribute the kind does not declare
        return default
    return default if value is None else value


def host_arch() -> str:
    machine = platform.machine().lower()
    return _MACHINE_ARCH.get(machine, machine)


def triple_arch(triple: str) -> str:
    arch = triple.split("-", 1)[0].lower()
    return _MACHINE_ARCH.get(arch, arch)


def is_native(target: Any) -> bool:
    """True when the system C compiler builds for this target."""
    triple = target_attr(target, "mtriple")
    return triple is None or triple_arch(triple) == host_arch()


# x86 features whose LLVM and GCC names agree (`+avx2` <-> `-mavx2`). LLVM knows
# many more (a host target lists dozens); GCC would reject some, so others are
# left to -march.
X86_FEATURES = frozenset((
    "sse", "sse2", "sse3", "ssse3", "sse4.1", "sse4.2", "sse4a", "avx", "avx2", "fma", "fma4",
    "xop", "f16c", "bmi", "bmi2", "popcnt", "lzcnt", "avx512f", "avx512bw", "avx512cd", "avx512dq",
    "avx512vl", "avx512vnni", "avx512bf16", "avx512fp16", "avx512ifma", "avx512vbmi", "avx512vbmi2",
    "avx512bitalg", "avx512vpopcntdq", "avxvnni",
))


def _x86_feature_flags(mattr: Any) -> list[str]:
    """Known LLVM features (+avx2, -avx512f) as GCC flags (-mavx2, -mno-avx512f)."""
    out = []
    for feature in mattr or ():
        name = str(feature)
        if name[1:] not in X86_FEATURES:
            continue
        out.append(f"-m{name[1:]}" if name.startswith("+") else f"-mno-{name[1:]}")
    return out


def bare_metal(target: Any) -> bool:
    """True for a triple without an OS (`thumbv7em-none-eabi`): firmware, no threads, no PIC."""
    triple = target_attr(target, "mtriple")
    return triple is not None and triple_bare_metal(str(triple))


def _is_host_cpu(mcpu: str) -> bool:
    """Whether `mcpu` is LLVM's name of this machine's CPU (kiln.target.machine_config)."""

    try:
        return mcpu == str(machine_config()["mcpu"])
    except ImportError:  # no llvmlite: no LLVM name to compare with
        return False


@functools.cache
def _system_cc_knows_march(cc: str, cpu: str) -> bool:
    """Whether the system C compiler `cc` (a command line) accepts `-march=cpu`."""
    try:
        proc = subprocess.run([*shlex.split(cc), f"-march={cpu}", "-E", "-x", "c", "-"],
                              input=b"", capture_output=True, timeout=60, check=False)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return True  # no compiler to ask: the build reports its own error
    return proc.returncode == 0


def _x86_cpu_flags(cpu: str) -> list[str]:
    """`-march=cpu`, or the x86-64 baseline with `cpu`'s features (as LLVM lists them)
    where the system compiler ($CC, else cc, as the runtime builds) does not know it."""
    if cpu == "native" or _system_cc_knows_march(os.environ.get("CC") or "cc", cpu):
        return [f"-march={cpu}"]
    try:
        pass
    except ImportError:  # pragma: no cover - the compiler always has llvmlite
        return [f"-march={cpu}"]
    features = implied_features("x86_64-unknown-linux-gnu", cpu, "",
                                tuple(sorted(X86_FEATURES)))
    return ["-march=x86-64", *(f"-m{f}" for f in sorted(features))]


def arch_flags(target: Any) -> list[str]:
    """CPU selection flags for the C compiler that builds for `target`."""
    mcpu = target_attr(target, "mcpu")
    if is_native(target):
        arch = host_arch()
        flags: list[str] = []
        if mcpu:
            # This machine's CPU is `native` to the system compiler, which may predate
            # LLVM's name for it (GCC 12 has no -march=znver4).
            cpu = "native" if _is_host_cpu(str(mcpu)) else str(mcpu)
            # x86 GCC selects a CPU with -march; Arm, AArch64 and RISC-V GCC with -mcpu.
            flags.extend(_x86_cpu_flags(cpu) if arch in ("x86_64", "i386")
                         else [f"-mcpu={cpu}"])
        if arch in ("x86_64", "i386"):
            flags.extend(_x86_feature_flags(target_attr(target, "mattr", ())))
        return [*flags, "-fPIC"]
    triple = str(target_attr(target, "mtriple"))
    arch = triple_arch(triple)
    flags = [f"-mcpu={mcpu}"] if mcpu else []
    if arch.startswith("thumb"):
        flags.append("-mthumb")
    float_abi = target_attr(target, "mfloat-abi")
    if float_abi is None and arch.startswith(("arm", "thumb")) and triple.endswith("hf"):
        float_abi = "hard"
    if float_abi:
        flags.append(f"-mfloat-abi={float_abi}")
    mabi = target_attr(target, "mabi")
    if mabi:
        flags.append(f"-mabi={mabi}")
    if not bare_metal(target):
        flags.append("-fPIC")  # bare-metal firmware is linked statically
    return flags


def selected_cpu(target: Any) -> tuple[str, str] | None:
    """(LLVM CPU name, LLVM feature string) of what `arch_flags` asks the system C
    compiler for in a native build (`-march`/`-mcpu`, and x86 `-m<feature>`), or
    None when it selects no CPU. `native` is this machine (kiln.target.host.machine_config)."""
    if not is_native(target):
        return None
    mcpu = str(target_attr(target, "mcpu", "") or "")
    mattr = [str(f) for f in target_attr(target, "mattr", ()) or ()]
    if host_arch() in ("x86_64", "i386"):
        mattr = [f for f in mattr if f[1:] in X86_FEATURES]
    else:
        mattr = []  # other architectures get no feature flags (arch_flags)
    if mcpu == "native":
        host = machine_config()
        mcpu, mattr = str(host["mcpu"]), [*host["mattr"], *mattr]
    if not mcpu and not mattr:
        return None
    return mcpu, ",".join(mattr)


def toolchain_metadata(target: Any) -> dict[str, Any]:
    """`native`, and for a cross build the compiler to use and the triple."""
    if is_native(target):
        return {"native": True}
    triple = str(target_attr(target, "mtriple"))
    return {"native": False, "cc": cross_compiler(triple), "mtriple": triple}


# The IR has neither errno nor floating-point exception flags (nor has the llvm backend's
# output): telling GCC so lets it vectorize loops calling floorf, sqrtf, ... (with
# trapping math it keeps `floorf` scalar). Neither flag changes a computed value.
NO_FP_SIDE_EFFECTS = ("-fno-math-errno", "-fno-trapping-math")


def kernel_cflags(target: Any) -> list[str]:
    """Flags for kernels.c (`target` None: the host at -O2)."""
    opt = target_attr(target, "opt-level", 2)
    fp = "-ffast-math" if target_attr(target, "fast-math", False) else "-ffp-contract=off"
    return ["-std=c99", f"-O{opt}", "-fwrapv", fp, *NO_FP_SIDE_EFFECTS, *arch_flags(target)]


def host_cflags(target: Any) -> list[str]:
    """Flags for host.c: C11 for `_Thread_local`, otherwise like the kernels, except
    that a native build selects no CPU (host.c checks the CPU's features before the
    kernels run, so it must itself run on any CPU of the architecture).

    Firmware has no threads (and no TLS runtime): KILN_NO_THREADS makes the
    error buffer a plain static.
    """
    cpu = ["-fPIC"] if is_native(target) else arch_flags(target)
    flags = ["-std=c11", f"-O{target_attr(target, 'opt-level', 2)}", *cpu]
    if bare_metal(target):
        flags.append("-DKILN_NO_THREADS")
    return flags

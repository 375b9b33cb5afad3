"""The CPU features a library's native code may use, recorded for the loader.

kiln.runtime.cpu_features compares them with the running CPU when a library is
loaded. They are the `+` features of the target's `mattr` and those its `mcpu`
implies, minus the `-` ones. LLVM does not list what a CPU name implies through
llvmlite, so: for this machine's own CPU name, LLVM's host feature map; for an
x86 CPU name, the features the C compiler enables for `-march=<mcpu>` (GCC's
and LLVM's x86 CPU and ISA-extension names agree); otherwise the explicit
features only.
"""

from __future__ import annotations

import functools
import shutil
import subprocess

from kiln.runtime.cpu_features import checkable_features


@functools.cache
def _x86_march_features(cpu: str) -> frozenset[str]:
    """ISA extensions `cc -march=cpu` enables (empty when the compiler does not know cpu)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return frozenset()
    try:
        proc = subprocess.run([cc, f"-march={cpu}", "-Q", "--help=target"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    if proc.returncode != 0:
        return frozenset()
    out = set()
    for line in proc.stdout.splitlines():
        words = line.split()
        if len(words) == 2 and words[0].startswith("-m") and words[1] == "[enabled]":
            out.add(words[0][2:])
    return frozenset(out)


def _host_features(cpu: str) -> frozenset[str] | None:
    from kiln.codegen.llvm.target_machine import llvm_binding

    llvm = llvm_binding()
    if str(llvm.get_host_cpu_name()) != cpu:
        return None
    return frozenset(name for name, on in dict(llvm.get_host_cpu_features()).items() if on)


def required_features(triple: str, cpu: str, features: str) -> list[str]:
    """LLVM feature names the code for (triple, cpu, features) may use, sorted."""
    enabled = {f[1:] for f in features.split(",") if f.startswith("+")}
    disabled = {f[1:] for f in features.split(",") if f.startswith("-")}
    arch = triple.split("-", 1)[0]
    if cpu and cpu not in ("generic", "native"):
        implied = _host_features(cpu)
        if implied is None and arch in ("x86_64", "i686"):
            # Only the ISA extensions the loader can check (GCC also lists ABI options).
            implied = _x86_march_features(cpu) & checkable_features(arch)
        enabled |= implied or set()
    return sorted(enabled - disabled)


__all__ = ["required_features"]

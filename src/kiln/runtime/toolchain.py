"""Which C compiler builds a library for its target.

A library's native artifacts say what they were compiled for: the `c` backend
records the cross compiler it expects (artifact metadata `cc`), LLVM objects
their triple. `export_library` with no `cc=` and no `$CC` uses that: the
system `cc` for this machine's architecture, the usual GCC cross compiler
otherwise (`aarch64-linux-gnu-gcc` for an aarch64 Linux tag, `arm-none-eabi-gcc`
for Cortex-M, ...). A compiler that is not installed is a
MissingDependencyError naming the Debian package that provides it.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
from collections.abc import Iterable
from typing import Any

from kiln.artifact.artifact import NATIVE
from kiln.errors import MissingDependencyError

# Cross compiler -> the Debian package(s) that install it.
DEBIAN_PACKAGES = {
    "aarch64-linux-gnu-gcc": "gcc-aarch64-linux-gnu libc6-dev-arm64-cross",
    "arm-linux-gnueabihf-gcc": "gcc-arm-linux-gnueabihf libc6-dev-armhf-cross",
    "arm-linux-gnueabi-gcc": "gcc-arm-linux-gnueabi libc6-dev-armel-cross",
    "arm-none-eabi-gcc": "gcc-arm-none-eabi libnewlib-arm-none-eabi",
    "riscv64-linux-gnu-gcc": "gcc-riscv64-linux-gnu libc6-dev-riscv64-cross",
    "clang": "clang lld",
}


def _host_arch() -> str:
    arch = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


def library_triple(artifacts: Iterable[Any]) -> str | None:
    """The target triple the native artifacts were built for, if they record one."""
    for a in artifacts:
        if a.loader == NATIVE:
            triple = a.metadata.get("mtriple") or a.metadata.get("triple")
            if isinstance(triple, str) and triple:
                return triple
    return None


def cross_compiler(triple: str) -> str:
    """The usual GCC cross compiler for a triple, e.g. 'arm-none-eabi-gcc'."""
    parts = triple.lower().split("-")
    arch = parts[0]
    bare_metal = "none" in parts[1:]
    if arch.startswith(("arm", "thumb")):
        if bare_metal:
            return "arm-none-eabi-gcc"
        return "arm-linux-gnueabihf-gcc" if triple.endswith("hf") else "arm-linux-gnueabi-gcc"
    if arch in ("aarch64", "arm64"):
        return "aarch64-none-elf-gcc" if bare_metal else "aarch64-linux-gnu-gcc"
    if arch.startswith("riscv"):
        return f"{arch}-unknown-elf-gcc" if bare_metal else f"{arch}-linux-gnu-gcc"
    return f"{triple}-gcc"


def default_compiler(artifacts: Iterable[Any]) -> list[str] | None:
    """The compiler command for these artifacts, or None for this machine's `cc`.

    Raises MissingDependencyError when the cross compiler is not installed.
    """
    arts = list(artifacts)
    recorded = next((a.metadata["cc"] for a in arts if a.loader == NATIVE and
                     isinstance(a.metadata.get("cc"), str) and a.metadata["cc"]), None)
    triple = library_triple(arts)
    if recorded is not None:
        command = shlex.split(recorded)
    elif triple is None or (triple.split("-", 1)[0] == _host_arch() and
                            "-none" not in triple and "wasm" not in triple):
        return None
    else:
        command = [cross_compiler(triple)]
    if shutil.which(command[0]) is None:
        package = DEBIAN_PACKAGES.get(os.path.basename(command[0]))
        how = (f" (Debian/Ubuntu: apt-get install {package})" if package else "")
        raise MissingDependencyError(
            f"building this library for {triple or 'its target'} needs the C compiler "
            f"'{command[0]}', which is not installed{how}; or pass cc= to export_library "
            "(kiln compile --cc)")
    return command


__all__ = ["DEBIAN_PACKAGES", "cross_compiler", "default_compiler", "library_triple"]

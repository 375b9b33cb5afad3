"""What LLVM knows about this machine and about triples, imported lazily.

`kiln.runtime` imports nothing from the compiler side, and a deploy host may
not have llvmlite at all; so llvmlite is imported only inside these functions,
the first time one is called. Without llvmlite, the host triple falls back to
a guess from `platform`, triple checking is skipped, and `host_config()` (which
needs the CPU name and features) raises TargetError.
"""

from __future__ import annotations

import functools
import os
import platform
import sys
from types import ModuleType
from typing import Any

from kiln.errors import TargetError, install_hint


@functools.cache
def llvm_if_installed() -> ModuleType | None:
    """llvmlite.binding with every target initialised, or None when not installed."""
    try:
        import llvmlite.binding as llvm  # optional: llvmlite (the compiler extra)
    except ImportError:
        return None
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    return llvm


@functools.cache
def llvmlite_version() -> str | None:
    """The installed llvmlite's version (its package's `__version__`, which its
    distribution's metadata repeats; read without `importlib.metadata`, whose import
    costs 8-12 ms of a start), or None when it is not installed."""
    try:
        import llvmlite  # optional: llvmlite (the compiler extra); the binding stays unloaded
    except ImportError:
        return None
    return str(llvmlite.__version__)


def llvm_available() -> bool:
    """Whether llvmlite can be imported."""
    return llvm_if_installed() is not None


@functools.cache
def host_triple() -> str:
    """The LLVM triple of this process, e.g. 'x86_64-unknown-linux-gnu'."""
    llvm = llvm_if_installed()
    if llvm is not None:
        return str(llvm.get_process_triple())
    machine = platform.machine().lower() or "unknown"
    if sys.platform == "darwin":
        return f"{machine}-apple-darwin"
    if sys.platform == "win32":
        return f"{machine}-pc-windows-msvc"
    return f"{machine}-unknown-linux-gnu"


def triple_arch(triple: str) -> str:
    """The architecture part of a triple: 'aarch64' for 'aarch64-linux-gnu'."""
    return triple.split("-", 1)[0]


def triple_bare_metal(triple: str) -> bool:
    """Whether `triple` names no OS ('thumbv7em-none-eabi'): firmware, no threads, no PIC."""
    return "none" in triple.split("-")[1:]


def check_triple(triple: str, where: str) -> None:
    """Raise TargetError when LLVM has no backend for `triple` (skipped without llvmlite)."""
    llvm = llvm_if_installed()
    if llvm is None:
        return
    try:
        llvm.Target.from_triple(triple)
    except RuntimeError as err:
        raise TargetError(
            f"{where}: LLVM has no backend for triple '{triple}' ({err}). "
            "Triples look like 'x86_64-linux-gnu', 'aarch64-linux-gnu', "
            "'thumbv7em-none-eabi', 'riscv64-unknown-linux-gnu', 'wasm32-unknown-unknown'"
        ) from None


#: An LLVM CPU name that `host` stands for instead of this machine's CPU
#: (docs/targets.md, "Another CPU as `host`").
HOST_CPU_VAR = "KILN_HOST_CPU"


@functools.cache
def _detected() -> tuple[str, str, tuple[str, ...]]:
    llvm = llvm_if_installed()
    if llvm is None:
        raise TargetError(
            "Target.from_host() needs llvmlite to detect the CPU, which is not installed "
            f"here ({install_hint('llvmlite')}); or write the target yourself, e.g. "
            "Target('llvm -mcpu=...')"
        )
    features: dict[str, bool] = dict(llvm.get_host_cpu_features())
    mattr = tuple(("+" if on else "-") + name for name, on in sorted(features.items()))
    return str(llvm.get_process_triple()), str(llvm.get_host_cpu_name()), mattr


def detected_names() -> tuple[str, str, frozenset[str]] | None:
    """This machine's triple, CPU name and feature names as LLVM detected them (the
    names LLVM itself gave, so it knows them); None without llvmlite or where LLVM cannot
    tell (it raises RuntimeError on a platform without the detection)."""
    if llvm_if_installed() is None:
        return None
    try:
        triple, cpu, mattr = _detected()
    except RuntimeError:
        return None
    return triple, cpu, frozenset(f[1:] for f in mattr)


@functools.cache
def _standing_in(cpu: str) -> tuple[str, str, tuple[str, ...]]:
    """`host` as the LLVM CPU `cpu` of this machine's triple, with that CPU's features."""
    # llvm_names imports this module
    from kiln.target.llvm_names import (
        check_cpu_names,  # cycle: kiln.target.llvm_names imports this module
    )

    triple = _detected()[0]
    try:
        check_cpu_names(triple, cpu, (), "llvm")
    except TargetError as exc:
        raise TargetError(f"${HOST_CPU_VAR}={cpu!r}: {exc}") from None
    return triple, cpu, ()


def machine_config() -> dict[str, Any]:
    """The `llvm` target config of this machine as LLVM detects it: triple, CPU name
    and every feature ("+avx2", "-avx512f", ...), sorted by name, enabled and
    disabled, as `-mcpu=native` would pass them. What `native` means to a C compiler."""
    triple, cpu, mattr = _detected()
    return {"kind": "llvm", "mtriple": triple, "mcpu": cpu, "mattr": list(mattr)}


def host_config() -> dict[str, Any]:
    """The `llvm` target config `host` stands for: this machine's (`machine_config`),
    or, when `$KILN_HOST_CPU` names an LLVM CPU, that CPU on this machine's triple with
    the features LLVM gives it (no `mattr`), e.g. an AVX2 `znver3` on an AVX-512 host.
    """
    cpu = os.environ.get(HOST_CPU_VAR, "").strip()
    triple, cpu, mattr = _standing_in(cpu) if cpu else _detected()
    return {"kind": "llvm", "mtriple": triple, "mcpu": cpu, "mattr": list(mattr)}

"""The CPU and feature names LLVM knows for a triple, to check `mcpu`/`mattr`.

LLVM only warns about a CPU or feature it does not know ("'skylakee' is not a
recognized processor for this target (ignoring processor)") and then builds
code for a generic CPU, which can end in a process abort inside LLVM ("64-bit
code requested on a subtarget that doesn't support it"). So when a target is
built, kiln checks `mcpu` and `mattr` against the names LLVM lists for the
triple's target and turns an unknown one into a TargetError with a "did you
mean". LLVM prints those lists (CPU `help`) to the C-level stderr, once per
process, and llvmlite has no call that returns them: so a child process asks,
once per LLVM target and process, and this process's own stderr is never
touched. The list is the table LLVM checks the names against (the subtarget's
processor and feature tables), so a name is unknown exactly when LLVM would
warn about it.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from typing import NamedTuple

from kiln._registry import suggest
from kiln.errors import TargetError
from kiln.target.host import detected_names, llvm_if_installed, triple_arch

# Asked in a child process: LLVM prints the lists to file descriptor 2.
_LIST_NAMES = ("import llvmlite.binding as l, sys; l.initialize_all_targets(); "
               "l.Target.from_triple(sys.argv[1]).create_target_machine(cpu='help', "
               "features='')")


class LLVMNames(NamedTuple):
    """What LLVM lists for one target architecture."""

    cpus: frozenset[str]
    features: frozenset[str]


def _parse_help(text: str) -> LLVMNames:
    cpus: set[str] = set()
    features: set[str] = set()
    current: set[str] | None = None
    for line in text.splitlines():
        if line.startswith("Available CPUs"):
            current = cpus
        elif line.startswith("Available features"):
            current = features
        elif line.startswith("  ") and current is not None and " - " in line:
            current.add(line.split()[0])
    return LLVMNames(frozenset(cpus), frozenset(features))


def _llvm_target(triple: str) -> str | None:
    """The name of LLVM's target for `triple` (its names are the target's, whatever the
    OS or vendor); None when llvmlite is absent or LLVM has no such target."""
    llvm = llvm_if_installed()
    if llvm is None:
        return None
    try:
        name: str = llvm.Target.from_triple(triple).name
    except RuntimeError:
        return None
    return name


@functools.cache
def _names_of_target(target: str, triple: str) -> LLVMNames | None:
    try:
        proc = subprocess.run([sys.executable, "-c", _LIST_NAMES, triple], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    names = _parse_help(proc.stderr + proc.stdout)
    return names if names.cpus else None


def llvm_names(triple: str) -> LLVMNames | None:
    """CPU and feature names LLVM knows for `triple`'s target; None when llvmlite is
    absent, LLVM has no such target or lists nothing. Asked once per LLVM target and
    process, in a child process (see the module docstring)."""
    target = _llvm_target(triple)
    return None if target is None else _names_of_target(target, triple)


def _detected_here(triple: str, mcpu: str | None, features: list[str]) -> bool:
    """Whether `mcpu` and `features` are names LLVM detected on this machine, for a
    triple of this machine's LLVM target: LLVM gave them, so it knows them, and the
    child process that lists the names (70 ms of a start-up) is not needed (the host
    target, `Target.from_host()`, names every feature of this CPU)."""
    host = detected_names()
    if host is None:
        return False
    host_triple_, host_cpu, host_features = host
    if (mcpu and mcpu != host_cpu) or not host_features.issuperset(features):
        return False
    return triple == host_triple_ or _llvm_target(triple) == _llvm_target(host_triple_)


def check_cpu_names(triple: str, mcpu: str | None, mattr: tuple[str, ...] | list[str],
                    kind: str) -> None:
    """TargetError, with a suggestion, if LLVM does not know `mcpu` or a feature of
    `mattr` for `triple` (it would ignore them and may abort later). Without llvmlite,
    or when LLVM lists no names for the target, nothing is checked."""
    features = [f.lstrip("+-") for f in mattr if f.lstrip("+-")]
    if not mcpu and not features:
        return
    if _detected_here(triple, mcpu, features):
        return
    names = llvm_names(triple)
    if names is None:
        return
    unknown = [("processor", mcpu)] if mcpu and mcpu not in names.cpus else []
    unknown += [("feature", f) for f in features if f not in names.features]
    if not unknown:
        return
    what, name = unknown[0]
    hint = suggest(name, sorted(names.cpus if what == "processor" else names.features))
    attr, noun = ("mcpu", "CPU") if what == "processor" else ("mattr", "feature")
    raise TargetError(f"attribute '{attr}' of target kind '{kind}': LLVM knows no {noun} "
                      f"'{name}' for {triple_arch(triple)}" + (f";{hint}" if hint else ""))


__all__ = ["LLVMNames", "check_cpu_names", "llvm_names"]

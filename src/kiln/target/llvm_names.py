"""The CPU and feature names LLVM knows for a triple, to check `mcpu`/`mattr`.

LLVM only warns about a CPU or feature it does not know ("'skylakee' is not a
recognized processor for this target (ignoring processor)") and then builds
code for a generic CPU, which can end in a process abort inside LLVM ("64-bit
code requested on a subtarget that doesn't support it"). So when a target is
built, kiln creates its LLVM target machine once with the C-level stderr
briefly redirected to a file and turns those warnings into a TargetError. The
"did you mean" comes from the lists LLVM prints for CPU `help` (once per
process, hence asked in a child process, and only when there is an error).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tempfile
import threading
from typing import NamedTuple

from kiln._registry import suggest
from kiln.errors import TargetError
from kiln.target.host import llvm_if_installed, triple_arch

_CAPTURE = threading.Lock()


class LLVMNames(NamedTuple):
    """What LLVM lists for one target architecture."""

    cpus: frozenset[str]
    features: frozenset[str]


def _capture_stderr(action: object) -> str:
    """Run `action()` with file descriptor 2 redirected; the text written there."""
    assert callable(action)
    with _CAPTURE, tempfile.TemporaryFile() as out:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(out.fileno(), 2)
            action()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        return out.read().decode("utf-8", "replace")


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


_UNKNOWN = re.compile(r"'([^']*)' is not a recognized (processor|feature) for this target")


@functools.cache
def _unknown_names(triple: str, mcpu: str, features: str) -> tuple[tuple[str, str], ...]:
    """(kind, name) of each CPU or feature LLVM warns about for this combination."""
    llvm = llvm_if_installed()
    if llvm is None:
        return ()
    try:
        target = llvm.Target.from_triple(triple)
    except RuntimeError:
        return ()
    text = _capture_stderr(lambda: target.create_target_machine(cpu=mcpu, features=features))
    found = dict.fromkeys((m.group(2), m.group(1).lstrip("+-")) for m in _UNKNOWN.finditer(text))
    return tuple(found)


@functools.cache
def llvm_names(triple: str) -> LLVMNames | None:
    """CPU and feature names LLVM knows for `triple`'s architecture; None when
    llvmlite is absent or LLVM lists nothing. LLVM prints the lists once per
    process, so a child process asks (used for suggestions only)."""
    if llvm_if_installed() is None:
        return None
    code = ("import llvmlite.binding as l, sys; l.initialize_all_targets(); "
            "l.Target.from_triple(sys.argv[1]).create_target_machine(cpu='help', features='')")
    try:
        proc = subprocess.run([sys.executable, "-c", code, triple], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    names = _parse_help(proc.stderr + proc.stdout)
    return names if names.cpus else None


def check_cpu_names(triple: str, mcpu: str | None, mattr: tuple[str, ...] | list[str],
                    kind: str) -> None:
    """TargetError, with a suggestion, if LLVM does not know `mcpu` or a feature of
    `mattr` for `triple` (it would ignore them and may abort later)."""
    unknown = _unknown_names(triple, mcpu or "", ",".join(mattr))
    if not unknown:
        return
    what, name = unknown[0]
    names = llvm_names(triple)
    choices = sorted(names.cpus if what == "processor" else names.features) if names else []
    hint = suggest(name, choices)
    attr, noun = ("mcpu", "CPU") if what == "processor" else ("mattr", "feature")
    raise TargetError(f"attribute '{attr}' of target kind '{kind}': LLVM knows no {noun} "
                      f"'{name}' for {triple_arch(triple)}" + (f";{hint}" if hint else ""))


__all__ = ["LLVMNames", "check_cpu_names", "llvm_names"]

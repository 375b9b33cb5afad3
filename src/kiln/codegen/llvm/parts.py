"""Compile a module's parts (kiln.codegen.llvm.split) on every core, through the kernel cache.

llvmlite runs every call into LLVM under one process-wide lock, so threads cannot
optimise parts at once: the parts the kernel cache does not hold are compiled by
forked worker processes, as many as the CPUs this process may run on
(`KILN_CODEGEN_JOBS` overrides), the calling process one of them; each worker takes
the next part from a queue (a pipe), the costliest first, until none is left. A fork
costs no start-up: the child has llvmlite loaded and the parts' text in memory. Each
part is parsed, verified, optimised and emitted exactly as the whole module would be
(kiln.codegen.llvm.target_machine); the objects are joined into one relocatable
kernels.o by the linker (`ld -r`) and the optimised bitcode of the parts linked into
one module for kernels.bc. A kernel's part may be keyed and compiled under names made
from its content (kiln.codegen.llvm.part_names); the join then gives it the model's
names as aliases.
"""

from __future__ import annotations

import os
import pickle
import select
import shutil
import struct
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from kiln.codegen import kernel_cache
from kiln.codegen.llvm import part_names
from kiln.codegen.llvm.split import Part
from kiln.codegen.llvm.target_machine import (
    MachineConfig,
    llvm_binding,
    optimize,
    parse_and_verify,
)
from kiln.errors import CompileError


def jobs() -> int:
    """How many processes compile parts: `$KILN_CODEGEN_JOBS`, else the usable CPUs."""
    env = os.environ.get("KILN_CODEGEN_JOBS", "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise CompileError(f"KILN_CODEGEN_JOBS={env!r} is not a whole number") from None
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def linker() -> str | None:
    """The `ld` that joins part objects, or None when this machine has none."""
    return shutil.which("ld")


# (object, bitcode, the declarations of the part's non-internal functions as optimised)
Compiled = tuple[bytes, bytes, str]


class PartCode(NamedTuple):
    """One part's code, compiled or from the kernel cache: its object and optimised
    bitcode, the declarations of its visible functions (under the model's names: what
    a caller's part is compiled with). A part named by its content
    (kiln.codegen.llvm.part_names) has `names` (content name -> the model's) and
    `aliases` (the model's name -> content name, for the join)."""

    obj: bytes
    bitcode: bytes
    declarations: str
    names: dict[str, str]
    aliases: dict[str, str]
    key: str = ""  # the kernel cache's key of a part named by its content


def compile_part(text: str, config: MachineConfig, tm: Any) -> Compiled:
    """(object, optimised bitcode, declarations) of one part, as the whole module is
    compiled (kiln.codegen.llvm.codegen)."""
    llvm = llvm_binding()
    mod = parse_and_verify(text, context=llvm.create_context())
    optimize(mod, tm, config.opt_level)
    mod.verify()
    declarations = part_names.declaration_lines(mod)
    try:
        obj = bytes(tm.emit_object(mod))
    except RuntimeError as err:
        raise CompileError(f"LLVM could not emit the object code: {err}") from None
    return obj, bytes(mod.as_bitcode()), declarations


def _compile_share(texts: Sequence[str], config: MachineConfig) -> list[Compiled]:
    tm = config.target_machine()
    return [compile_part(t, config, tm) for t in texts]


def cost(text: str) -> int:
    """What LLVM's work on a part is guessed from: its branches, one per basic block
    or so. LLVM's time follows a part's blocks much more closely than its length (an
    unrolled tile is long but cheap; docs/performance.md, "Compile time, round seven")."""
    return text.count(" br ") + 1


# A queue entry: the index of a part. Entries are at most PIPE_BUF bytes in all, so
# the queue is written whole before any worker starts, and reads of one entry are atomic.
_ENTRY = struct.Struct("<I")
_QUEUE_ENTRIES = getattr(select, "PIPE_BUF", 512) // _ENTRY.size


def _queue(texts: Sequence[str]) -> list[list[int]]:
    """The parts' indices in the order workers take them, costliest first (`cost`), in
    at most `_QUEUE_ENTRIES` groups: a worker that is done takes the next group, so the
    cores finish together however good the guess of each part's cost was."""
    order = sorted(range(len(texts)), key=lambda i: -cost(texts[i]))
    per_entry = -(-len(order) // _QUEUE_ENTRIES)  # 1 up to _QUEUE_ENTRIES parts
    return [order[i:i + per_entry] for i in range(0, len(order), per_entry)]


def _drain(queue: int, entries: Sequence[Sequence[int]], texts: Sequence[str],
           config: MachineConfig) -> list[tuple[int, Compiled]]:
    """Compile the parts of the entries read from the pipe `queue` until it is empty."""
    tm = config.target_machine()
    done = []
    while entry := os.read(queue, _ENTRY.size):
        for i in entries[_ENTRY.unpack(entry)[0]]:
            done.append((i, compile_part(texts[i], config, tm)))
    return done


def _child(queue: int, entries: Sequence[Sequence[int]], texts: Sequence[str],
           config: MachineConfig, fd: int) -> None:
    """In a forked worker: compile from the queue, write the pickled result to `fd`, exit."""
    code = 0
    try:
        lock = getattr(getattr(llvm_binding().ffi.lib, "_lock", None), "_lock", None)
        if lock is not None:  # another thread of the parent may have held it at the fork
            llvm_binding().ffi.lib._lock._lock = threading.RLock()
        payload = pickle.dumps(("ok", _drain(queue, entries, texts, config)))
    except BaseException as err:  # reported by the parent
        payload = pickle.dumps(("error", str(err)))
        code = 1
    with os.fdopen(fd, "wb") as f:
        f.write(payload)
    os._exit(code)


def _compile_all(texts: Sequence[str], config: MachineConfig) -> list[Compiled]:
    n = min(jobs(), len(texts))
    if n <= 1 or not hasattr(os, "fork"):
        return _compile_share(texts, config)
    entries = _queue(texts)
    queue, feed = os.pipe()
    os.write(feed, b"".join(_ENTRY.pack(e) for e in range(len(entries))))
    os.close(feed)  # the workers see the end of the queue once it is empty
    children = []
    for _ in range(n - 1):
        read, write = os.pipe()
        with warnings.catch_warnings():
            # Python warns of fork in a threaded process: the child only runs LLVM.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            os.close(read)
            _child(queue, entries, texts, config, write)
        os.close(write)
        children.append((pid, read))
    results: list[Compiled | None] = [None] * len(texts)
    failure: str | None = None
    try:
        for i, r in _drain(queue, entries, texts, config):
            results[i] = r
    except CompileError as err:
        failure = str(err)
    finally:
        os.close(queue)
    for pid, read in children:
        with os.fdopen(read, "rb") as f:
            data = f.read()
        os.waitpid(pid, 0)
        reply: tuple[str, Any] = pickle.loads(data) if data else ("error", "a worker died")
        status, value = reply
        if status != "ok":
            failure = failure or value
            continue
        for i, r in value:
            results[i] = r
    if failure is not None:
        raise CompileError(failure)
    return [r for r in results if r is not None]


def machine_key(config: MachineConfig) -> tuple[dict[str, Any], str]:
    """What of the machine the kernel cache keys a part by, and LLVM's version."""
    version = ".".join(map(str, llvm_binding().llvm_version_info))
    return ({**config.to_json(), "fast_math": config.fast_math,
             "vector_width": config.vector_width}, version)


def compile_parts(parts: Sequence[Part], config: MachineConfig, by_content: bool = False,
                  known: Sequence[PartCode] = (), known_keys: Sequence[str] = ()
                  ) -> list[PartCode]:
    """The code of each part, from the kernel cache or compiled in parallel; a part
    calling another's functions after that one (`Part.calls`). With `by_content`, a
    part that calls no other part's is keyed and compiled under names made from its
    code (kiln.codegen.llvm.part_names): another model that has the kernel finds it.
    `known`: parts of the module whose code is at hand (the kernel cache's, under the
    part keys `known_keys`), whose functions the parts may call."""
    use_cache = kernel_cache.enabled()
    machine, version = machine_key(config)

    def key_of(text: str) -> str:
        return kernel_cache.part_key(text, machine, version)

    codes: list[PartCode | None] = [None] * len(parts)
    declarations: dict[str, str] = {}
    for code in known:
        for line in code.declarations.splitlines():
            name, declaration = line.split("\0", 1)
            declarations[name] = declaration
    taken: set[str] = set(known_keys)
    while any(c is None for c in codes):
        ready = [i for i, p in enumerate(parts) if codes[i] is None
                 and all(c in declarations for c in p.calls)]
        if not ready:
            raise CompileError("the module's parts call one another in a cycle")
        texts = {i: parts[i].with_declarations(declarations) for i in ready}
        named = {i: part_names.content_named(texts[i], parts[i].functions, key_of, taken)
                 for i in ready if by_content and not parts[i].calls}
        keys = {i: named[i].key if i in named else key_of(texts[i]) for i in ready}
        found: dict[int, Compiled | None] = {
            i: kernel_cache.lookup(keys[i]) if use_cache else None for i in ready}
        todo = [i for i in ready if found[i] is None]
        compiled = _compile_all([named[i].text() if i in named else texts[i] for i in todo],
                                config)
        for i, r in zip(todo, compiled):
            found[i] = r
            if use_cache:
                kernel_cache.store(keys[i], *r)
        for i in ready:
            done = found[i]
            assert done is not None
            obj, bitcode, declared = done
            names, aliases = (named[i].names, named[i].aliases) if i in named else ({}, {})
            if names:
                declared = part_names.model_declarations(declared, names)
            codes[i] = PartCode(obj, bitcode, declared, names, aliases,
                                keys[i] if i in named else "")
            for line in declared.splitlines():
                name, declaration = line.split("\0", 1)
                declarations[name] = declaration
    return [c for c in codes if c is not None]


def join_objects(objects: Sequence[bytes], ld: str,
                 aliases: dict[str, str] | None = None) -> bytes:
    """One relocatable object holding `objects` (`ld -r`), with each symbol of
    `aliases` (name -> the symbol it stands for) defined as an alias."""
    with tempfile.TemporaryDirectory(prefix="kiln-parts-") as tmp:
        paths = []
        for i, obj in enumerate(objects):
            path = Path(tmp) / f"part{i}.o"
            path.write_bytes(obj)
            paths.append(str(path))
        out = Path(tmp) / "kernels.o"
        defsyms = [f"--defsym={name}={target}" for name, target in (aliases or {}).items()]
        proc = subprocess.run([ld, "-r", "-o", str(out), *defsyms, *paths], capture_output=True,
                              text=True, check=False)
        if proc.returncode != 0:
            raise CompileError(f"joining the kernels' objects failed: {ld} -r: "
                               f"{(proc.stderr or proc.stdout).strip()}")
        return out.read_bytes()


def distinct_objects(codes: Sequence[PartCode]) -> list[bytes]:
    """The objects of `codes` to join, each part named by its content once: two kernel
    groups of a build may be found in the kernel cache under one part (their kiln IR
    differs, the LLVM IR they lower to does not), and that part's object defines its
    content names; the second group's functions are its aliases of them (the join's
    `--defsym`), the same machine code."""
    seen: set[str] = set()
    out = []
    for code in codes:
        if code.key and code.key in seen:
            continue
        seen.add(code.key)
        out.append(code.obj)
    return out


def join_bitcode(codes: Sequence[PartCode]) -> bytes:
    """The parts' optimised bitcode, under the model's names, linked into one module."""
    llvm = llvm_binding()
    context = llvm.create_context()
    modules = []
    for code in codes:
        module = llvm.parse_bitcode(code.bitcode, context)
        part_names.rename_functions(module, code.names)
        modules.append(module)
    for module in modules[1:]:
        modules[0].link_in(module)
    return bytes(modules[0].as_bitcode())


__all__ = ["PartCode", "compile_part", "compile_parts", "distinct_objects", "jobs",
           "join_bitcode", "join_objects", "linker", "machine_key"]

"""The `llvmjit` loader: JIT-compile a module.bc artifact in this process.

`load_llvmjit(artifacts, ctx)` is the runtime's loader "llvmjit", registered
(lazily) by kiln.codegen when the compiler is imported: the runtime alone cannot
run bitcode. It parses the bitcode, checks it was built for this machine,
binds `{prefix}_consts` to a private, 64-byte aligned copy of constants.bin
(per engine: nothing global changes), compiles with MCJIT and wraps each raw
kernel in `kiln.runtime.RawKernelFunction`, which checks arguments in Python
as the packed C entries do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.codegen.constants import CONST_ALIGN, CONSTANTS_FILE
from kiln.codegen.cpu_requirements import required_features
from kiln.codegen.llvm.jit import BITCODE_FILE, JIT_FORMAT, JIT_FORMAT_VERSION
from kiln.codegen.llvm.lower_to_llvm import ERROR_CODES
from kiln.codegen.llvm.target_machine import llvm_binding
from kiln.codegen.naming import const_table_symbol, consts_symbol, kernel_symbol
from kiln.errors import CallError, FormatError, KilnError
from kiln.runtime import LoadContext, Module, RawKernelFunction
from kiln.runtime.cpu_features import CPUFeatureError, request_amx_permission, skip_requested
from kiln.runtime.lifetime import CallGuard
from kiln.runtime.shared_constants import checked_table


def load_llvmjit(artifacts: Sequence[Any], ctx: LoadContext | None = None) -> LLVMJITModule:
    """Load the llvmjit artifacts (module.bc and optional constants.bin) as a Module."""
    by_name: dict[str, Any] = {}
    for a in artifacts:
        if a.file_name in by_name:
            raise FormatError(f"llvmjit: two artifacts named {a.file_name!r}")
        if not getattr(a, "serializable", True):
            raise FormatError(f"llvmjit: artifact {a.file_name!r} holds no bytes")
        by_name[a.file_name] = a
    unknown = sorted(set(by_name) - {BITCODE_FILE, CONSTANTS_FILE})
    if unknown:
        raise FormatError(f"llvmjit: unexpected artifact(s) {unknown}; the llvmjit loader "
                          f"reads {BITCODE_FILE} and {CONSTANTS_FILE}")
    if BITCODE_FILE not in by_name:
        raise FormatError(f"llvmjit: no {BITCODE_FILE} among the artifacts "
                          f"({', '.join(sorted(by_name)) or 'none'})")
    return LLVMJITModule(by_name[BITCODE_FILE], by_name.get(CONSTANTS_FILE))


class LLVMJITModule(Module):
    """Kernels JIT-compiled by LLVM (MCJIT) in this process; keeps the engine alive.

    `close()` waits for calls in flight on other threads, then drops the
    engine (freeing the machine code); functions handed out before raise
    CallError from then on instead of running.
    """

    kind = "llvmjit"

    def __init__(self, bitcode: Any, constants: Any | None = None) -> None:
        meta = _check_metadata(bitcode.metadata)
        library = dict(meta["metadata"])
        super().__init__(metadata=library,
                         artifacts=[a for a in (bitcode, constants) if a is not None])
        self._guard = CallGuard("the llvmjit module")
        llvm = llvm_binding()
        try:
            mod = llvm.parse_bitcode(bytes(bitcode.content))
            mod.verify()
        except RuntimeError as err:
            raise FormatError(f"llvmjit: {BITCODE_FILE} is not valid LLVM bitcode: {err}"
                              ) from None
        self.prefix = str(meta["prefix"])
        self.triple = str(meta["triple"])
        _check_host(llvm, self.triple, str(meta.get("cpu", "")), str(meta.get("features", "")))
        self._ir_text = str(mod)
        self._tm = llvm.Target.from_triple(self.triple).create_target_machine(
            cpu=str(meta.get("cpu", "")), features=str(meta.get("features", "")),
            opt=int(meta.get("opt_level", 3)), reloc="default", codemodel="jitdefault",
            jit=True)
        self._engine = llvm.create_mcjit_compiler(mod, self._tm)
        self._constants = self._bind_constants(mod, constants)
        self._engine.finalize_object()
        self._functions = self._wrap_kernels(library)

    def _bind_constants(self, mod: Any, constants: Any | None) -> Any:
        if constants is None:
            return bind_constants(self._engine, mod, self.prefix, None, None)
        return bind_constants(self._engine, mod, self.prefix, bytes(constants.content),
                              constants.metadata.get("table"))

    def _wrap_kernels(self, library: Mapping[str, Any]) -> dict[str, RawKernelFunction]:
        functions: dict[str, RawKernelFunction] = {}
        for name, signature in dict(library.get("functions", {})).items():
            symbol = kernel_symbol(self.prefix, name)
            address = self._engine.get_function_address(symbol)
            if not address:
                raise FormatError(f"llvmjit: {BITCODE_FILE} has no kernel {symbol!r} for "
                                  f"function {name!r}")
            functions[name] = RawKernelFunction(
                signature, address, _error_message(name), keepalive=self, guard=self._guard)
        return functions

    def kernel_address(self, name: str) -> int:
        """Address of the raw kernel of IR function `name` (for calls through ctypes)."""
        if self._engine is None:
            raise CallError(f"llvmjit: kernel {name!r}: the module is closed")
        if name not in self._functions:
            raise KilnError(f"llvmjit: no kernel for function {name!r}; known: "
                            f"{', '.join(self._functions) or '(none)'}")
        return int(self._engine.get_function_address(kernel_symbol(self.prefix, name)))

    # -- Module interface ------------------------------------------------------------

    def _own_function(self, name: str) -> RawKernelFunction | None:
        return self._functions.get(name)

    def _own_names(self) -> list[str]:
        return list(self._functions)

    def _own_source(self, fmt: str) -> str | None:
        """"ll": the LLVM IR being run; "asm": its assembly for this machine."""
        if fmt == "ll":
            return self._ir_text
        if fmt == "asm":
            # This IR was parsed and verified in this process already (it runs here).
            llvm = llvm_binding()
            return str(self._tm.emit_assembly(llvm.parse_assembly(self._ir_text)))
        return super()._own_source(fmt)

    def close(self) -> None:
        """Wait for calls in flight, then free the code; later calls raise CallError."""
        self._guard.close()
        self._functions = {}
        self._engine = None  # no call runs and none can start: the code may go
        self._constants = None
        super().close()


def _error_message(name: str) -> Callable[[int], str]:
    """The call's message for a kernel's return code (kiln.ir.kernel_errors)."""
    return lambda code: f"{name}: {ERROR_CODES.get(code, f'kernel failed with status {code}')}"


def _check_metadata(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    if meta.get("format") != JIT_FORMAT:
        raise FormatError(f"llvmjit: {BITCODE_FILE} metadata has format "
                          f"{meta.get('format')!r}, expected {JIT_FORMAT!r}")
    version = meta.get("version")
    if not isinstance(version, int) or not 1 <= version <= JIT_FORMAT_VERSION:
        raise FormatError(f"llvmjit: {BITCODE_FILE} metadata version {version!r} is not "
                          f"supported (this kiln reads 1..{JIT_FORMAT_VERSION})")
    missing = [k for k in ("metadata", "prefix", "triple") if k not in meta]
    if missing:
        raise FormatError(f"llvmjit: {BITCODE_FILE} metadata lacks {', '.join(missing)}")
    return meta


def _check_host(llvm: Any, triple: str, cpu: str, features: str) -> None:
    """Refuse code for another architecture or needing CPU features this host lacks
    (every feature LLVM's subtarget for (triple, cpu, features) has, not only `+x`)."""

    host = str(llvm.get_process_triple())
    if triple.split("-", 1)[0] != host.split("-", 1)[0]:
        raise KilnError(f"llvmjit: the module was compiled for {triple}, but this process "
                        f"runs on {host}; recompile it here")
    required = required_features(triple, cpu, features)
    amx = any(f.startswith("amx-") for f in required)
    if skip_requested():
        if amx:  # the check skipped, AMX code still needs the tile data
            request_amx_permission()
        return
    host_features = dict(llvm.get_host_cpu_features())
    missing = [f for f in required if host_features.get(f) is False]
    if missing:
        raise CPUFeatureError(f"llvmjit: the module needs CPU feature(s) {', '.join(missing)} "
                              "that this machine lacks; recompile it for this host")
    if amx and not request_amx_permission():
        raise CPUFeatureError("llvmjit: the module uses AMX tiles, but Linux refused this "
                              "process the AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM)")


def bind_constants(engine: Any, mod: Any, prefix: str, data: bytes | None,
                   entries: Any) -> Any:
    """Give MCJIT `engine` the constants `mod`'s kernels read: `{prefix}_consts` mapped to
    a private, aligned copy of `data` and `{prefix}_const_table` to the addresses of its
    `entries` ([offset, bytes] by slot, the constants artifact's `table`). Returns what
    must stay alive as long as the engine (None when no kernel reads constants)."""
    found = {}
    for symbol in (consts_symbol(prefix), const_table_symbol(prefix)):
        with contextlib.suppress(NameError):  # not read by any kernel
            found[symbol] = mod.get_global_variable(symbol)
    if not found:
        return None  # no kernel reads constants
    if data is None:
        raise FormatError(f"llvmjit: the kernels read constants ({', '.join(found)}) but "
                          f"there is no {CONSTANTS_FILE} artifact")
    raw = np.zeros(len(data) + CONST_ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % CONST_ALIGN
    buf = raw[start:start + len(data)]
    buf[:] = np.frombuffer(data, dtype=np.uint8)
    buf.flags.writeable = False
    if consts_symbol(prefix) in found:
        engine.add_global_mapping(found[consts_symbol(prefix)], buf.ctypes.data)
    table = found.get(const_table_symbol(prefix))
    if table is None:
        return raw
    entries = checked_table(entries, len(data), f"llvmjit: {CONSTANTS_FILE}")
    # The slots: each constant's address in the private copy (the kernels read it there).
    slots = np.array([buf.ctypes.data + int(e[0]) for e in entries] or [0], dtype=np.uint64)
    engine.add_global_mapping(table, slots.ctypes.data)
    return raw, slots

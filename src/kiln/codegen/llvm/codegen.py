"""The `llvm` codegen: lowered IRModule -> kernels.o + kernels.bc + host.c + constants.bin."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import threading
from dataclasses import dataclass
from typing import Any

from kiln.artifact import Artifact
from kiln.codegen import kernel_cache
from kiln.codegen.const_table import table_artifact
from kiln.codegen.constants import ConstantPool, precompile_swap_runtime
from kiln.codegen.cpu_requirements import feature_rows
from kiln.codegen.host import DEFAULT_HOST_CFLAGS, codegen_host
from kiln.codegen.llvm import part_names, parts
from kiln.codegen.llvm.bf16_dot import bf16_dot_lanes
from kiln.codegen.llvm.cached_kernels import CachedKernels
from kiln.codegen.llvm.lower_to_llvm import (
    C_LIBRARY_HEAP,
    ERROR_CODES,
    LoweredModule,
    LoweringOptions,
    Reuse,
    lower_module,
)
from kiln.codegen.llvm.parts import PartCode
from kiln.codegen.llvm.split import Part, split_module
from kiln.codegen.llvm.target_machine import (
    MachineConfig,
    llvm_binding,
    machine_config,
    optimize,
    parse_and_verify,
)
from kiln.codegen.naming import check_prefix, library_metadata, workspace_symbols
from kiln.codegen.sizes import check_buffer_sizes
from kiln.errors import CompileError
from kiln.ir.module import IRModule
from kiln.ir.steps import timed_step
from kiln.runtime.native import precompile_c
from kiln.target.isa import isa_for, isa_of

CODEGEN_ID = "llvm"
_OFF = ("0", "false", "no", "off")


@dataclass
class CompiledModule:
    """An optimised LLVM module (llvmlite ModuleRef) with its machine and lowering facts."""

    module: Any  # llvmlite.binding.ModuleRef
    target_machine: Any
    config: MachineConfig
    lowered: LoweredModule

    def metadata(self) -> dict[str, Any]:
        """Artifact metadata shared by the object and the bitcode."""
        return _metadata(self.config, self.lowered)


def _metadata(config: MachineConfig, lowered: LoweredModule) -> dict[str, Any]:
    deps = [d for d in lowered.externs.values() if d is not None]
    return {
        **config.to_json(),
        "functions": sorted(lowered.kernels.values()),
        "externs": sorted(lowered.externs),
        "extern_dependencies": deps,
        "error_codes": {str(code): msg for code, msg in ERROR_CODES.items()},
    }


def compile_module(mod: IRModule, target: Any, *, prefix: str, pool: ConstantPool,
                   jit: bool = False) -> CompiledModule:
    """Lower, verify and optimise `mod` for `target` (any object with `.get`).

    One LLVM module on the calling thread, in an LLVMContext of its own (freed with
    the module): the llvmjit backend's way, and the llvm backend's where it cannot
    compile in parts on every core (docs/codegen-llvm.md, "Parts on every core")."""

    config, tm, lowered = _lower(mod, target, prefix=prefix, pool=pool, jit=jit)
    with timed_step("codegen.parse"):
        llvm_mod = parse_and_verify(str(lowered.module), context=llvm_binding().create_context())
    with timed_step("codegen.optimize"):
        optimize(llvm_mod, tm, config.opt_level)
        llvm_mod.verify()
    return CompiledModule(llvm_mod, tm, config, lowered)


def _lower(mod: IRModule, target: Any, *, prefix: str, pool: ConstantPool, jit: bool,
           reuse: Reuse | None = None) -> tuple[MachineConfig, Any, LoweredModule]:
    """The machine configuration, its TargetMachine and `mod` lowered to llvmlite IR."""
    check_prefix(prefix)
    config = machine_config(target, jit=jit)
    tm = config.target_machine()
    data_layout = str(tm.target_data)
    check_buffer_sizes(mod, _pointer_bits(data_layout))
    isa = isa_of(config.triple, config.cpu, config.features)
    options = LoweringOptions(
        prefix=prefix, triple=config.triple, data_layout=data_layout,
        hidden=not jit, pointer_bits=_pointer_bits(data_layout), fast_math=config.fast_math,
        native_roundeven=config.native_roundeven, sext_int32=config.sext_int32,
        no_slp=config.no_slp,
        int8_dot=isa.int8_dot, bf16_dot=bf16_dot_lanes(isa), amx_bf16=isa.has("amx-bf16"),
        native_f16=isa.has("f16c"),
        const_table=not config.arch.startswith("wasm"),  # wasm links its own data object
        function_attrs=config.function_attrs(), serial_parallel_for=jit,
        # wasm has no host.c (kiln.export.wasm), the JIT none either
        heap_functions=(C_LIBRARY_HEAP if jit or config.arch.startswith("wasm")
                        else workspace_symbols(prefix)))

    machine, version = parts.machine_key(config)
    with timed_step("codegen.lower"):
        return config, tm, lower_module(mod, pool, options, reuse,
                                        (json.dumps(machine, sort_keys=True), version))


def _pointer_bits(data_layout: str) -> int:
    """Pointer width in address space 0 from a data layout string ("p:32:32" -> 32)."""
    for spec in data_layout.split("-"):
        if spec.startswith(("p:", "p0:")):
            return int(spec.split(":")[1])
    return 64  # LLVM's default when the layout does not say


# prepare_llvm's threads by prefix and machine: codegen_llvm waits for its own first.
_PREPARING: dict[tuple[str, MachineConfig], threading.Thread] = {}
_PREPARING_LOCK = threading.Lock()


def prepare_llvm(mod: IRModule, target: Any, *, prefix: str) -> None:
    """Ask LLVM, on a thread beside the passes, which CPU features the target has (the
    ISA object the passes choose kernels by) and which the code may use
    (`MachineConfig.to_json`): probes LLVM runs once a process, which took the main
    thread in the passes and at the start of code generation. C compiles started here
    instead ran beside the passes' numpy work and slowed it more than they saved
    (docs/performance.md, "Compile time, round eighteen")."""
    config = machine_config(target)

    def probe() -> None:
        with contextlib.suppress(Exception):  # the passes and codegen_llvm ask again
            isa_for(target)  # the passes' kernels need it first (block-convolutions)
            config.to_json()

    thread = threading.Thread(target=probe, name="kiln-prepare-llvm", daemon=True)
    with _PREPARING_LOCK:
        _PREPARING[(prefix, config)] = thread
    thread.start()


def _wait_for_prepare(prefix: str, config: MachineConfig) -> None:
    """Wait for `prepare_llvm`'s probe for `prefix` and `config`, if any: so that it is
    not made twice."""
    with _PREPARING_LOCK:
        thread = _PREPARING.pop((prefix, config), None)
    if thread is not None:
        thread.join()


def codegen_llvm(mod: IRModule, target: Any, *, prefix: str, pool: ConstantPool) -> list[Any]:
    """Compile the lowered module `mod` for `target` (kind `llvm`) into artifacts.

    Returns, in order: `kernels.o` (loader "native": the raw kernels,
    hidden), `kernels.bc` (loader "none": the optimised bitcode, for
    inspection), `host.c` (the packed entries from kiln.codegen.host) and,
    when `pool` holds constants, `constants.bin` (symbol `{prefix}_consts`).
    """

    config = machine_config(target)
    _wait_for_prepare(prefix, config)
    # Firmware has no threads: host.c's parallel loops then run serially.
    host_flags = [*DEFAULT_HOST_CFLAGS, "-DKILN_NO_THREADS"] if _bare_metal(config) else None
    host = codegen_host(mod, prefix=prefix, metadata=library_metadata(mod, prefix),
                        cflags=host_flags, cpu_features=feature_rows(
                            config.triple, config.to_json()["requires_features"]))
    in_parts = compiles_in_parts(config)
    if in_parts:  # on the core the lowering leaves idle, and LLVM's main thread later
        precompile_swap_runtime(pool, host, prefix)
    cached = CachedKernels(prefix) if in_parts and kernel_cache.enabled() \
        and part_names.links_aliases(config.triple) else None
    config, tm, lowered = _lower(mod, target, prefix=prefix, pool=pool, jit=False,
                                 reuse=cached.reuse if cached else None)
    meta = _metadata(config, lowered)
    if in_parts:
        obj, bitcode = _compile_in_parts(lowered, config, host, cached)
    else:
        obj, bitcode = _compile_whole(lowered, config, tm)
    libs = sorted({lib for d in meta["extern_dependencies"] for lib in d.get("libs", ())})
    if not _bare_metal(config):
        libs = sorted({*libs, "-lm"})  # the kernels may call the C math library
    artifacts = [
        Artifact(CODEGEN_ID, "native", "kernels.o", obj, {**meta, "libs": libs}),
        Artifact(CODEGEN_ID, "none", "kernels.bc", bitcode, {**meta, "format": "llvm-bitcode"}),
        host,
    ]
    del obj  # the machine code is no longer needed
    if len(pool):
        with timed_step("codegen.constants"):
            artifacts.append(pool.artifact(CODEGEN_ID, prefix))
            if pool.table:
                table = table_artifact(pool.table_entries(), prefix, CODEGEN_ID,
                                       host.metadata.get("cflags", ()))
                precompile_c(table)  # as host.c is: a load finds the object
                artifacts.append(table)
    return artifacts


def _compile_whole(lowered: LoweredModule, config: MachineConfig,
                   tm: Any) -> tuple[bytes, bytes]:
    """(object, bitcode) of the lowered module compiled as one LLVM module."""
    with timed_step("codegen.parse"):
        llvm_mod = parse_and_verify(str(lowered.module), context=llvm_binding().create_context())
    with timed_step("codegen.optimize"):
        optimize(llvm_mod, tm, config.opt_level)
        llvm_mod.verify()
    with timed_step("codegen.emit_object"):
        try:
            obj = bytes(tm.emit_object(llvm_mod))
        except RuntimeError as err:
            raise CompileError(f"LLVM could not emit the object code: {err}") from None
        return obj, bytes(llvm_mod.as_bitcode())


def compiles_in_parts(config: MachineConfig) -> bool:
    """Whether the module is compiled in parts (kiln.codegen.llvm.split): for a hosted
    target of this machine's architecture, whose objects this machine's `ld` joins."""
    arch = platform.machine().lower()
    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)
    return (config.reloc == "pic" and config.arch == arch and parts.linker() is not None
            and os.environ.get("KILN_CODEGEN_PARTS", "1").strip().lower() not in _OFF)


def _compile_in_parts(lowered: LoweredModule, config: MachineConfig, host: Artifact,
                      cached: CachedKernels | None = None) -> tuple[bytes, bytes]:
    """(object, bitcode) of the lowered module compiled part by part: in parallel, through
    the kernel cache (kiln.codegen.llvm.parts; `cached`: the kernels found before the
    lowering, kiln.codegen.llvm.kernel_keys). A module of several parts (a large
    model) has this machine's cc build `host` meanwhile, for the library's load: it
    takes a core when the parts leave one free (the graph function's part, the join)."""
    known = cached.codes(lowered.reused) if cached else []
    with timed_step("codegen.split"):
        pieces = split_module(lowered.module, frozenset(
            symbol for code in known for symbol in code.names.values()))
    if len(pieces) + len(known) > 1:
        with timed_step("codegen.start_host_cc"):
            precompile_c(host)
    # Several parts: the kernels are named by their content, so that another model
    # finds them in the kernel cache; the join gives them the model's names.
    by_content = len(pieces) + len(known) > 1 and part_names.links_aliases(config.triple)
    with timed_step("codegen.parts"):
        results = parts.compile_parts(pieces, config, by_content, known,
                                      [code.key for code in known])
    if cached:
        cached.record(lowered, pieces, results)
    results = _in_module_order(lowered, [*zip(pieces, results), *((None, c) for c in known)])
    if len(results) == 1:
        return results[0].obj, results[0].bitcode
    with timed_step("codegen.join"):
        aliases = {name: symbol for r in results for name, symbol in r.aliases.items()}
        return (parts.join_objects(parts.distinct_objects(results), str(parts.linker()),
                                   aliases),
                parts.join_bitcode(results))


def _in_module_order(lowered: LoweredModule,
                     codes: list[tuple[Part | None, PartCode]]) -> list[PartCode]:
    """The parts' code in the order of their first function in the module: the order a
    build that compiles every part joins them in."""
    place = {name: i for i, name in enumerate(lowered.module.globals)}

    def first(item: tuple[Part | None, PartCode]) -> int:
        part, code = item
        names = part.functions if part is not None else code.names.values()
        return min(place[name] for name in names if name in place)  # no trampoline if reused

    return [code for _, code in sorted(codes, key=first)]


def _bare_metal(config: MachineConfig) -> bool:
    return config.reloc == "static"

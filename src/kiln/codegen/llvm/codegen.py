"""The `llvm` codegen: lowered IRModule -> kernels.o + kernels.bc + host.c + constants.bin."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.codegen.constants import ConstantPool
from kiln.codegen.llvm.lower_to_llvm import (
    ERROR_CODES,
    LoweredModule,
    LoweringOptions,
    lower_module,
)
from kiln.codegen.llvm.parallel import (
    PARTS_PER_THREAD,
    SPLIT_MIN_INSTRUCTIONS,
    Part,
    compile_threads,
    merged_bitcode,
    module_instructions,
    run_all,
    split_module_text,
)
from kiln.codegen.llvm.target_machine import (
    MachineConfig,
    machine_config,
    optimize,
    parse_and_verify,
)
from kiln.codegen.naming import check_prefix, library_metadata
from kiln.codegen.sizes import check_buffer_sizes
from kiln.ir.module import IRModule
from kiln.target.isa import isa_of

CODEGEN_ID = "llvm"


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
    """Lower, verify and optimise `mod` for `target` (any object with `.get`)."""
    from kiln.transform.instruments import timed_step

    config, tm, lowered = _lower(mod, target, prefix=prefix, pool=pool, jit=jit)
    with timed_step("codegen.parse"):
        llvm_mod = parse_and_verify(str(lowered.module))
    with timed_step("codegen.optimize"):
        optimize(llvm_mod, tm, config.opt_level)
        llvm_mod.verify()
    return CompiledModule(llvm_mod, tm, config, lowered)


def _lower(mod: IRModule, target: Any, *, prefix: str, pool: ConstantPool,
           jit: bool) -> tuple[MachineConfig, Any, LoweredModule]:
    """The machine configuration, its TargetMachine and `mod` lowered to llvmlite IR."""
    check_prefix(prefix)
    config = machine_config(target, jit=jit)
    tm = config.target_machine()
    data_layout = str(tm.target_data)
    check_buffer_sizes(mod, _pointer_bits(data_layout))
    options = LoweringOptions(
        prefix=prefix, triple=config.triple, data_layout=data_layout,
        hidden=not jit, pointer_bits=_pointer_bits(data_layout), fast_math=config.fast_math,
        native_roundeven=config.native_roundeven, sext_int32=config.sext_int32,
        int8_dot=isa_of(config.triple, config.cpu, config.features).int8_dot,
        function_attrs=config.function_attrs(), serial_parallel_for=jit)
    from kiln.transform.instruments import timed_step

    with timed_step("codegen.lower"):
        return config, tm, lower_module(mod, pool, options)


def _optimized_parts(mod: IRModule, target: Any, *, prefix: str,
                     pool: ConstantPool
                     ) -> tuple[MachineConfig, LoweredModule, list[Part], int]:
    """`mod` lowered, then parsed and optimised as one LLVM module, or as several on
    threads when it is large (kiln.codegen.llvm.parallel)."""
    from kiln.transform.instruments import timed_step

    config, _, lowered = _lower(mod, target, prefix=prefix, pool=pool, jit=False)
    threads = compile_threads()
    if _bare_metal(config) or module_instructions(lowered.module) < SPLIT_MIN_INSTRUCTIONS:
        threads = 1
    with timed_step("codegen.parse"):
        texts = split_module_text(lowered.module, threads * PARTS_PER_THREAD
                                  if threads > 1 else 1)
        parts = [Part(text, config, "kiln kernels") for text in texts]
    with timed_step("codegen.optimize"):
        run_all(lambda part: part.optimize(config.opt_level), parts, threads)
    return config, lowered, parts, threads


def _pointer_bits(data_layout: str) -> int:
    """Pointer width in address space 0 from a data layout string ("p:32:32" -> 32)."""
    for spec in data_layout.split("-"):
        if spec.startswith(("p:", "p0:")):
            return int(spec.split(":")[1])
    return 64  # LLVM's default when the layout does not say


def codegen_llvm(mod: IRModule, target: Any, *, prefix: str, pool: ConstantPool) -> list[Any]:
    """Compile the lowered module `mod` for `target` (kind `llvm`) into artifacts.

    Returns, in order: `kernels.o` (loader "native": the raw kernels,
    hidden), `kernels.bc` (loader "none": the optimised bitcode, for
    inspection), `host.c` (the packed entries from kiln.codegen.host) and,
    when `pool` holds constants, `constants.bin` (symbol `{prefix}_consts`).
    """
    from kiln.artifact import Artifact
    from kiln.codegen.cpu_requirements import feature_rows
    from kiln.codegen.host import DEFAULT_HOST_CFLAGS, codegen_host
    from kiln.transform.instruments import timed_step

    with timed_step("codegen.lower_optimize"):
        config, lowered, parts, threads = _optimized_parts(mod, target, prefix=prefix,
                                                           pool=pool)
    meta = _metadata(config, lowered)
    with timed_step("codegen.emit_object"):
        objects = run_all(Part.emit_object, parts, threads)
        bitcode = merged_bitcode(parts)
    libs = sorted({lib for d in meta["extern_dependencies"] for lib in d.get("libs", ())})
    if not _bare_metal(config):
        libs = sorted({*libs, "-lm"})  # the kernels may call the C math library
    # Firmware has no threads: host.c's parallel loops then run serially.
    host_flags = [*DEFAULT_HOST_CFLAGS, "-DKILN_NO_THREADS"] if _bare_metal(config) else None
    # One object per part (kernels.o, kernels_1.o, ...), linked into one library.
    artifacts = [Artifact(CODEGEN_ID, "native", "kernels.o" if i == 0 else f"kernels_{i}.o",
                          obj, {**meta, "libs": libs}) for i, obj in enumerate(objects)]
    artifacts += [
        Artifact(CODEGEN_ID, "none", "kernels.bc", bitcode, {**meta, "format": "llvm-bitcode"}),
        codegen_host(mod, prefix=prefix, metadata=library_metadata(mod, prefix),
                     cflags=host_flags,
                     cpu_features=feature_rows(config.triple, meta["requires_features"])),
    ]
    del parts, objects  # LLVM's modules and machine code are no longer needed
    if len(pool):
        with timed_step("codegen.constants"):
            artifacts.append(pool.artifact(CODEGEN_ID, prefix))
    return artifacts


def _bare_metal(config: MachineConfig) -> bool:
    return config.reloc == "static"

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
from kiln.codegen.llvm.target_machine import (
    MachineConfig,
    machine_config,
    optimize,
    parse_and_verify,
)
from kiln.codegen.naming import check_prefix, library_metadata
from kiln.codegen.sizes import check_buffer_sizes
from kiln.ir.module import IRModule

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
        deps = [d for d in self.lowered.externs.values() if d is not None]
        return {
            **self.config.to_json(),
            "functions": sorted(self.lowered.kernels.values()),
            "externs": sorted(self.lowered.externs),
            "extern_dependencies": deps,
            "error_codes": {str(code): msg for code, msg in ERROR_CODES.items()},
        }


def compile_module(mod: IRModule, target: Any, *, prefix: str, pool: ConstantPool,
                   jit: bool = False) -> CompiledModule:
    """Lower, verify and optimise `mod` for `target` (any object with `.get`)."""
    check_prefix(prefix)
    config = machine_config(target, jit=jit)
    tm = config.target_machine()
    data_layout = str(tm.target_data)
    check_buffer_sizes(mod, _pointer_bits(data_layout))
    options = LoweringOptions(
        prefix=prefix, triple=config.triple, data_layout=data_layout,
        hidden=not jit, pointer_bits=_pointer_bits(data_layout), fast_math=config.fast_math,
        native_roundeven=config.native_roundeven, sext_int32=config.sext_int32,
        function_attrs=config.function_attrs(), serial_parallel_for=jit)
    from kiln.transform.instruments import timed_step

    with timed_step("codegen.lower"):
        lowered = lower_module(mod, pool, options)
    with timed_step("codegen.parse"):
        llvm_mod = parse_and_verify(str(lowered.module))
    with timed_step("codegen.optimize"):
        optimize(llvm_mod, tm, config.opt_level)
        llvm_mod.verify()
    return CompiledModule(llvm_mod, tm, config, lowered)


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
    from kiln.codegen.host import DEFAULT_HOST_CFLAGS, codegen_host
    from kiln.transform.instruments import timed_step

    with timed_step("codegen.lower_optimize"):
        compiled = compile_module(mod, target, prefix=prefix, pool=pool)
    meta = compiled.metadata()
    with timed_step("codegen.emit_object"):
        obj = compiled.target_machine.emit_object(compiled.module)
    libs = sorted({lib for d in meta["extern_dependencies"] for lib in d.get("libs", ())})
    if not _bare_metal(compiled.config):
        libs = sorted({*libs, "-lm"})  # the kernels may call the C math library
    # Firmware has no threads: host.c's parallel loops then run serially.
    host_flags = [*DEFAULT_HOST_CFLAGS, "-DKILN_NO_THREADS"] if _bare_metal(
        compiled.config) else None
    artifacts = [
        Artifact(CODEGEN_ID, "native", "kernels.o", obj, {**meta, "libs": libs}),
        Artifact(CODEGEN_ID, "none", "kernels.bc", compiled.module.as_bitcode(),
                 {**meta, "format": "llvm-bitcode"}),
        codegen_host(mod, prefix=prefix, metadata=library_metadata(mod, prefix),
                     cflags=host_flags, cpu_features=meta["requires_features"]),
    ]
    # LLVM's module and machine code are no longer needed: free them before the
    # weights are copied into their artifact (that copy sets the compile's peak memory).
    del compiled, obj
    if len(pool):
        with timed_step("codegen.constants"):
            artifacts.append(pool.artifact(CODEGEN_ID, prefix))
    return artifacts


def _bare_metal(config: MachineConfig) -> bool:
    return config.reloc == "static"

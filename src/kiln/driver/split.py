"""Heterogeneous builds: one module, a host and devices, one library (docs/targets.md).

A target with a device part (a GPU kind such as `{"kind": "cuda", "host": {...}}`)
or a composite target (`{"kind": "composite", "devices": [...], "host": ...}`) is
compiled in five steps:

1. the graph pipeline runs once, under the first device's target (a GPU kind picks
   the "gpu" pipeline, whose kernels suit a GPU), lowering graph functions to
   host PrimFuncs that call kernels;
2. `assign_targets` writes each function's target into its `target` attribute
   (printed by the DSL, so the decision is visible and can be made by hand
   beforehand): graph functions run on the host, kernels on the devices, in
   turn, unless a kernel already names one;
3. each target's tensor pipeline runs, and each function keeps the result of
   its own target's pipeline (a GPU's binds loops to blocks and threads);
4. each target's code generator compiles its functions; the host's also
   compiles the graph functions, calling the other targets' kernels as
   external symbols (attribute `kiln.external`), which a device codegen
   defines: a CPU codegen by the kernels themselves, `cuda` by launch stubs;
5. one host.c (entries, metadata) is made for the whole module, and the
   artifacts of all code generators form one ArtifactSet, linked into one
   library by export. Every target shares one constant pool (one weights blob).

Split builds skip the compile cache.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kiln.artifact import Artifact, ArtifactSet
from kiln.artifact.artifact import device_key, with_target_key
from kiln.codegen.const_table import TABLE_FILE, table_artifact
from kiln.codegen.constants import CONSTANTS_FILE, ConstantPool
from kiln.codegen.cpu_requirements import feature_rows
from kiln.codegen.host import DEFAULT_HOST_CFLAGS, codegen_host
from kiln.codegen.naming import library_metadata
from kiln.codegen.registry import build, codegen_for, resolve_target
from kiln.driver.compiler import executable_metadata, outline_for, verify_stage
from kiln.driver.executable import Executable
from kiln.errors import CompileError
from kiln.ir.attrs import ATTR_EXTERNAL, ATTR_GRAPH, ATTR_TARGET
from kiln.ir.module import IRModule
from kiln.ir.tensor import PrimFunc
from kiln.runtime.cpu_features import CPUFeature
from kiln.target import Target
from kiln.transform.instruments import timed_step
from kiln.transform.pipeline import PipelineSpec, get_pipeline


def is_split_target(target: Target) -> bool:
    """Whether `target` compiles through a host and devices (composite or GPU kinds)."""
    return target.kind.name == "composite" or "gpu" in target.keys


def host_and_devices(target: Target) -> tuple[Target, list[Target]]:
    """The host target (this machine's llvm if none is given) and the device targets."""
    host = target.host or Target.from_host()
    if target.kind.name == "composite":
        return host, list(target.devices)
    return host, [target.with_host(None)]


def assign_targets(mod: IRModule, host: Target, devices: list[Target]) -> IRModule:
    """`mod` with every function's `target` attribute set (module docstring, step 2).

    Raises CompileError when a function already names a target that is neither
    the host nor one of the devices.
    """
    allowed = {str(t): t for t in (host, *devices)}
    out = {}
    turn = 0
    for name, fn in mod.items():
        given = fn.attrs.get(ATTR_TARGET)
        if given is not None:
            if str(_as_target(given)) not in allowed:
                raise CompileError(
                    f"function '{name}' asks for target {given} but this build has "
                    f"{', '.join(t.kind.name for t in allowed.values())}")
            out[name] = fn
            continue
        if not isinstance(fn, PrimFunc) or fn.attrs.get(ATTR_GRAPH):
            chosen = host
        else:
            chosen = devices[turn % len(devices)]
            turn += 1
        out[name] = fn.with_attrs(**{ATTR_TARGET: str(chosen)})
    return IRModule(out, mod.attrs)


def target_of(fn: Any) -> Target:
    """The target a function was assigned (its `target` attribute)."""
    return _as_target(fn.attrs[ATTR_TARGET])


def compile_split(mod: IRModule, target: Target, *, graph_pipeline: PipelineSpec,
                  tensor_pipeline: PipelineSpec, prefix: str) -> Any:
    """Compile `mod` for a host and devices into one Executable (module docstring)."""

    host, devices = host_and_devices(target)
    for t in (host, *devices):
        codegen_for(t)  # a kind without a codegen fails here, naming those that have one
    with devices[0]:
        mod = get_pipeline(_gpu_default(graph_pipeline, devices[0]), "graph",
                           target=devices[0])(mod)
    mod = assign_targets(mod, host, devices)
    groups = _group(mod)
    lowered: dict[str, Any] = {}
    for t, names in groups.values():
        with t:
            done = get_pipeline(_gpu_default(tensor_pipeline, t), "tensor", target=t)(mod)
        lowered.update({n: done[n] for n in names})
    mod = IRModule({n: lowered[n] for n in mod.functions}, mod.attrs)
    verify_stage(mod, "the module after the graph and tensor pipelines")
    metadata = executable_metadata(mod, prefix)
    with timed_step("constants"):
        pool = ConstantPool.from_module(mod)
    with timed_step("codegen"):
        artifacts = _codegen(mod, groups, str(host), prefix, pool)
    return Executable(artifacts, mod, metadata, target, prefix, cache_hit=False, cache_key=None)


def _as_target(spec: Any) -> Target:
    return resolve_target(spec)


def _gpu_default(spec: PipelineSpec, target: Target) -> PipelineSpec:
    """"default" on a GPU kind without its own pipeline means kiln's "gpu" pipelines."""
    own = target.kind.get_attr("graph_pipeline")
    if spec == "default" and own is None and "gpu" in target.keys:
        return "gpu"
    return spec


def _group(mod: IRModule) -> dict[str, tuple[Target, list[str]]]:
    groups: dict[str, tuple[Target, list[str]]] = {}
    for name, fn in mod.items():
        t = target_of(fn)
        groups.setdefault(str(t), (t, []))[1].append(name)
    return groups


def _codegen(mod: IRModule, groups: dict[str, tuple[Target, list[str]]], host_key: str,
             prefix: str, pool: ConstantPool) -> ArtifactSet:

    out: list[Any] = []
    host_flags: list[str] = list(DEFAULT_HOST_CFLAGS)
    cpu_features: list[CPUFeature] = []
    for key, (t, names) in groups.items():
        if key == host_key:
            # The host compiles its own functions; the others' kernels are external symbols.
            part = IRModule({n: fn if n in names else fn.with_attrs(**{ATTR_EXTERNAL: True})
                             for n, fn in mod.items()}, mod.attrs)
        else:
            part = IRModule({n: mod[n] for n in names}, mod.attrs)
        for a in build(outline_for(codegen_for(t)[0], part), t, prefix=prefix, pool=pool):
            if a.codegen_id == "host":  # host.c is made once, for the whole module, below
                host_flags = list(a.metadata.get("cflags", host_flags))
                continue
            if a.file_name == CONSTANTS_FILE and key != host_key:
                continue  # one weights blob, the host's
            if a.file_name == TABLE_FILE:
                continue  # one table of the shared pool, made below
            if a.metadata.get("requires_features"):
                cpu_features += feature_rows(str(a.metadata["triple"]),
                                             [str(f) for f in a.metadata["requires_features"]])
            # A device's artifacts carry its target key (distinct names per device).
            out.append(a if key == host_key else
                       with_target_key(a, device_key(t.kind.name, t.fingerprint())))
    out.append(codegen_host(mod, prefix=prefix, metadata=library_metadata(mod, prefix),
                            cflags=host_flags,
                            cpu_features=list(dict.fromkeys(cpu_features))))
    if pool.table:  # some target's kernels read the shared pool through its table
        out = [replace(a, metadata={**a.metadata, "table": pool.table_entries()})
               if isinstance(a, Artifact) and a.file_name == CONSTANTS_FILE else a for a in out]
        out.append(table_artifact(pool.table_entries(), prefix, "host", host_flags))
    try:
        return ArtifactSet(out)
    except ValueError as exc:  # not expected: target keys keep the devices' names apart
        raise CompileError(f"the targets of this build produce clashing artifacts: {exc}"
                           ) from None


__all__ = ["assign_targets", "compile_split", "host_and_devices", "is_split_target",
           "target_of"]

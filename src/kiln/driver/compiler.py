"""`kiln.compile`: IRModule + target -> Executable, the one streamlined flow (docs/compile.md).

1. resolve the target (argument, per-function `target` attribute, `with Target`,
   else this machine);
2. verify the IR;
3. run the graph pipeline (default: legalize operators, drop dead code, lower
   graph functions to PrimFuncs with a planned workspace) and the tensor
   pipeline (default: simplify), inside the target's scope;
4. verify the lowered IR; for the llvm and c codegens, give the lowered graph functions
   the caller's terminate flag (kiln.transform.terminate); for a code generator that
   consumes outlined IR, run the pass `outline-parallel-loops` (unless the tensor
   pipeline did): the Executable keeps the module before both, the code generator
   gets the rewritten one;
5. gather the weights into one ConstantPool (one copy, hashed once in chunks;
   the digest feeds the cache key, the cache and the library's weight check);
6. codegen through the registry (`kiln.codegen.build`), or take the artifacts
   from the on-disk compile cache. The cache is asked first whether it ever stored
   this structure (the key without the weights, `cache.structure_known`): if not, no
   lookup can hit, and the weights are hashed on other threads while the code
   generator runs (`ConstantPool.hash_in_background`), not before.

Every step after the pipelines is timed through `kiln.transform.instruments.
timed_step`, so a `TimingInstrument` in the PassContext reports it.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from dataclasses import dataclass
from typing import Any

import kiln.codegen as codegen
from kiln.artifact.artifact import ArtifactSet
from kiln.artifact.integrity import CHUNK_SIZE
from kiln.codegen import kernel_cache
from kiln.codegen.constants import ConstantPool
from kiln.codegen.naming import DEFAULT_PREFIX, check_prefix, library_metadata
from kiln.codegen.registry import graph_signature, resolve_target
from kiln.driver import cache, generic_kernels
from kiln.driver.executable import Executable
from kiln.driver.fingerprint import module_fingerprint
from kiln.errors import ArgumentTypeError, CompileError, IRError, KilnError, UsageError
from kiln.export.dependencies import collect_dependencies
from kiln.frontend import from_onnx
from kiln.ir.attrs import ATTR_MAX_LOOP_ITERATIONS, ATTR_TARGET, ATTR_WORKSPACE_BYTES
from kiln.ir.gc_pace import fewer_collections
from kiln.ir.graph import Function
from kiln.ir.module import IRModule
from kiln.ir.outlined import has_parallel_loops
from kiln.ir.profiling import profile_sites
from kiln.ir.tensor import PrimFunc
from kiln.ir.verify import verify, verify_changes
from kiln.kernels.search import check_database
from kiln.target import Target
from kiln.target.isa import isa_for
from kiln.transform.context import PassContext
from kiln.transform.instruments import timed_step
from kiln.transform.pass_base import Pass
from kiln.transform.pipeline import PipelineSpec, get_pipeline
from kiln.transform.terminate import TerminateChecks
from kiln.tuning.apply import FromDatabase, using
from kiln.tuning.database import TuningDatabase, target_key


@fewer_collections
def compile(
    mod: IRModule | PrimFunc | Function | str | os.PathLike[str] | Any, target: Any = None, *,
    graph_pipeline: PipelineSpec = "default", tensor_pipeline: PipelineSpec = "default",
    system_lib_prefix: str | None = None, profile: bool = False, tuning: Any = None,
    max_loop_iterations: int | None = None,
) -> Executable:
    """Compile `mod` for `target` into an Executable.

    Args:
        mod: the IRModule (a lone PrimFunc or graph Function becomes `main`), or an
            ONNX model (a path or an onnx.ModelProto), imported with
            `kiln.frontend.from_onnx`'s defaults.
        target: a `kiln.target.Target` or anything `Target(...)` accepts; None
            takes the target of `with Target(...)`, else this machine's llvm.
            A function attribute "target" sets it per function; kiln compiles
            one target per module and rejects a mix, except for composite and GPU
            targets, which split the module by that attribute (kiln/driver/split.py).
        graph_pipeline: passes for graph-level functions: "default" (the target
            kind's own, else kiln's), None (none), a pipeline name, a Pass, or a
            callable IRModule -> IRModule.
        tensor_pipeline: the same for the tensor-level functions.
        system_lib_prefix: prefix of every exported C symbol (default "kiln_").
        profile: time every kernel call of the lowered graph functions (llvm and c
            codegens; kiln.transform.profile). The loaded module's `profile()` returns
            the counters, `kiln run --profile` prints them (docs/cli.md). Off: no timer
            code at all.
        tuning: a tuning database (`kiln tune`'s JSON file, or a
            `kiln.tuning.TuningDatabase`): the kernels it has a choice for on this
            target's CPU take that tile, the others the rule's. Its fingerprint goes
            into the library metadata ("tuning"), so the build is reproducible from it.
            A database with no record for this target's CPU is ignored with a warning.
        max_loop_iterations: the most iterations a graph-level Loop (ONNX Loop or Scan)
            may run; a call whose Loop would run more fails with a CallError naming the
            Loop node. None (default): no limit, as onnxruntime.

    Raises:
        IRError: the input or the lowered IR is ill-formed.
        CompileError: a pass, the codegen or the toolchain failed.
        TargetError: the target is malformed.
        FormatError: the tuning database is not a valid one.
    """

    if not isinstance(profile, bool):
        raise ArgumentTypeError(f"profile must be True or False, got {type(profile).__name__}")
    mod = _with_loop_limit(_as_module(mod), max_loop_iterations)
    tgt = _pick_target(mod, target)
    prefix = check_prefix(system_lib_prefix if system_lib_prefix is not None else DEFAULT_PREFIX)
    from kiln.driver import split  # cycle: kiln.driver imports this module

    if split.is_split_target(tgt):  # a host and devices (kiln/driver/split.py)
        if tuning is not None:
            raise CompileError("tuning= applies to single-target builds; compile each part "
                               "of a split target with its own database")
        verify_stage(mod, "the input module")
        return split.compile_split(mod, tgt, graph_pipeline=graph_pipeline,
                                   tensor_pipeline=tensor_pipeline, prefix=prefix)

    verify_stage(mod, "the input module")
    _prepare_codegen(mod, tgt, prefix)
    session = _tuning_session(tuning, tgt, mod)
    # no database: leave a session of the caller's (kiln tune's) in place
    with using(session) if session is not None else contextlib.nullcontext():
        mod, generic = generic_kernels.recorded(
            mod, lambda m: _pipelines(m, tgt, graph_pipeline, tensor_pipeline))
    codegen_name, codegen_fn = codegen.codegen_for(tgt)
    if profile and not profile_sites(mod):  # else the tensor pipeline named the pass
        mod = _instrument(mod, codegen_name)
    # What the codegen compiles; the Executable keeps `mod`, as for outlining.
    built = _terminable(mod, codegen_name, tgt)

    metadata = executable_metadata(built, prefix)
    if session is not None:
        _note_tuning(metadata, session, tgt)
    generic_kernels.note(metadata, generic)
    artifacts = None
    with timed_step("constants"):
        pool = ConstantPool.from_module(mod)
    keys = _cache_keys(mod, pool, tgt, prefix, codegen_name, codegen_fn)
    key = None
    if keys is not None:
        with timed_step("cache.lookup"):
            if cache.structure_known(keys.structure):
                key = keys.with_weights(pool)  # hashes the weights now
                artifacts = cache.lookup(key)
    hit = artifacts is not None
    if artifacts is None:
        if key is None:  # no lookup needed them: hashed beside the code generator
            pool.hash_in_background()
        artifacts = _generate(codegen_name, built, tgt, prefix, pool, keys is not None)

        deps = collect_dependencies(artifacts)
        if deps:  # in the library metadata too (kiln inspect, docs/mlf.md)
            metadata["external_dependencies"] = [d.to_json() for d in deps]
        if keys is not None:
            with timed_step("cache.store"):
                key = keys.with_weights(pool)
                cache.store(key, artifacts, metadata, structure=keys.structure)
    artifacts = ArtifactSet(pool.with_replay(artifacts, prefix))  # Module.swap_weights
    del pool  # the artifacts hold the one copy of the weights now
    return Executable(artifacts, mod, metadata, tgt, prefix, cache_hit=hit, cache_key=key)


def _prepare_codegen(mod: IRModule, tgt: Target, prefix: str) -> None:
    """Let the target's code generator start what the passes do not change, on the core
    they leave idle (`kiln.codegen.prepare`)."""
    # An error (no code generator, a machine LLVM lacks) is the code generator's to
    # raise after the passes, as before.
    with contextlib.suppress(KilnError):
        name, _ = codegen.codegen_for(tgt)
        codegen.prepare(name, mod, tgt, prefix=prefix)


def _note_tuning(metadata: dict[str, Any], session: FromDatabase, tgt: Target) -> None:
    """Record in `metadata` what tuning `session` applied; warn when some of it was not
    checked in this model."""
    tkey = target_key(isa_for(tgt))
    metadata["tuning"] = {"fingerprint": session.db.fingerprint(), "target": tkey,
                          "kernels": dict(sorted(session.applied.items())),
                          "checked_in_model": session.checked(tkey) is not None}
    if session.unchecked:
        # stacklevel 3: the warning names compile's caller
        warnings.warn(f"{len(session.applied)} tuned kernel(s) applied from records not "
                      "checked in this model (no verdict of `kiln tune` for it, "
                      "docs/tuning.md): tune this model to check them", stacklevel=3)


@dataclass(frozen=True)
class _CacheKeys:
    """A build's compile-cache key, but for its weights: `structure` (the key of no
    weights) and the fields that `with_weights` completes."""

    fields: dict[str, str]
    structure: str

    def with_weights(self, pool: ConstantPool) -> str:
        """The build's key: hashes `pool`'s weights unless they are hashed already."""
        with timed_step("fingerprint.weights"):
            return cache.cache_key(weights=pool.fingerprint(), **self.fields)


def _cache_keys(mod: IRModule, pool: ConstantPool, tgt: Target, prefix: str,
                codegen_name: str, codegen_fn: object) -> _CacheKeys | None:
    """The compile cache's keys of this build (its code generator named `codegen_name`,
    run by `codegen_fn`), or None when the cache is off."""
    if not cache.cache_enabled(PassContext.current().config):
        return None
    with timed_step("fingerprint"):
        fields = {"ir_fingerprint": module_fingerprint(mod, pool),
                  "target_fingerprint": tgt.fingerprint(), "prefix": prefix,
                  "codegen": f"{codegen_name}:{_qualname(codegen_fn)}"
                  # large pools are addressed otherwise (codegen/constants.py)
                  + (":large-consts" if pool.large else "")}
        return _CacheKeys(fields, cache.cache_key(weights=None, **fields))


def _generate(codegen_name: str, built: IRModule, tgt: Target, prefix: str,
              pool: ConstantPool, cached: bool) -> ArtifactSet:
    """The artifacts of codegen `codegen_name` for `built` (outlined if it needs it); when
    `cached` (the compile cache is on), the weights are written to the cache meanwhile."""

    writer = None
    if cached and pool.size:
        # The weights go to the cache while the code generator runs, named once hashed.
        writer = cache.store_object_async(
            lambda: cache.chunked_object_name(pool.size, CHUNK_SIZE, pool.chunk_digests()),
            pool.size, pool.parts())
    # The kernel cache follows the compile cache's switch unless the config sets its own
    # (kiln.codegen.kernel_cache).
    token = kernel_cache.enabled_in_build.set(
        cache.kernel_cache_enabled(PassContext.current().config))
    try:
        with timed_step("codegen"):
            return codegen.build(outline_for(codegen_name, built, verified=True), tgt,
                                 prefix=prefix, pool=pool)
    finally:
        kernel_cache.enabled_in_build.reset(token)
        if writer is not None:
            with timed_step("cache.weights"):
                writer.join()


def lower_for_codegen(mod: IRModule, target: Target) -> IRModule:
    """`mod` as `compile(mod, target)` hands it to the code generator (default pipelines,
    no tuning database, no profiling): the graph and tensor pipelines under `target`,
    terminate checks and outlined parallel loops where its codegen takes them. What
    tests/replay hashes to prove a refactor changed no kernel."""

    verify_stage(mod, "the input module")
    mod = _pipelines(mod, target, "default", "default")
    codegen_name, _ = codegen.codegen_for(target)
    return outline_for(codegen_name, _terminable(mod, codegen_name, target), verified=True)


def _pipelines(mod: IRModule, tgt: Target, graph_pipeline: PipelineSpec,
               tensor_pipeline: PipelineSpec) -> IRModule:
    """`mod` through the graph then the tensor pipeline under `tgt`, verified."""
    with tgt:
        mod = get_pipeline(graph_pipeline, "graph", target=tgt)(mod)
        mod = get_pipeline(tensor_pipeline, "tensor", target=tgt)(mod)
    verify_stage(mod, "the module after the graph and tensor pipelines")
    return mod


# Code generators whose libraries carry host.c, where the profiling counters live and
# whose entries pass the caller's terminate flag.
PROFILING_CODEGENS = ("llvm", "c")
# Code generators that take parallel loops outlined (kiln.transform.outline).
OUTLINING_CODEGENS = ("llvm", "llvmjit", "c", "cuda")


def outline_for(codegen_name: str, mod: IRModule, *, verified: bool = False) -> IRModule:
    """`mod` with its parallel loops outlined if codegen `codegen_name` needs it (the pass
    `outline-parallel-loops`, which returns an outlined module as is); else `mod`.
    `verified`: `mod` passed `verify` (then only what the pass changed is verified)."""
    from kiln.transform.outline import (
        OutlineParallelLoops,  # lazy: kiln.transform.registry loads it on first use
    )

    if codegen_name not in OUTLINING_CODEGENS or not has_parallel_loops(mod):
        return mod
    return _late_pass(OutlineParallelLoops(), mod, "codegen.outline",
                      "the module with outlined parallel loops", verified)


def _late_pass(p: Pass, mod: IRModule, step: str, what: str, verified: bool) -> IRModule:
    """`p(mod)` after the pipelines, timed as `step`; verified (as `what`) when changed:
    only the functions `p` changed or added when `mod` was `verified` (the kernels a
    late pass leaves as they were are not walked again; ir.verify.verify_changes)."""
    with timed_step(step):
        out = p(mod)
    if out is not mod:
        verify_stage(out, what, since=mod if verified else None)
    return out


def _tuning_session(tuning: Any, tgt: Target, mod: IRModule) -> FromDatabase | None:
    """The session applying `tuning` (a path or a TuningDatabase) for `tgt` to `mod`,
    or None; a database with model verdicts names `mod` by its fingerprint before any
    pass (kiln.tuning.database.Verdict)."""
    if tuning is None:
        return None

    db = tuning if isinstance(tuning, TuningDatabase) else TuningDatabase.load(tuning)
    check_database(db)  # unknown kernels and parameters: a UsageError naming the record
    key = target_key(isa_for(tgt))
    targets = {r.target for r in db.records()}
    if targets and key not in targets:
        name = "the tuning database" if tuning is db else f"tuning database {tuning}"
        warnings.warn(f"{name} has no record for this target's CPU ({key}; it has "
                      f"{', '.join(sorted(targets))}): every kernel takes the rule's tile",
                      stacklevel=3)
    return FromDatabase(db, module_fingerprint(mod) if db.verdicts() else None)


def _instrument(mod: IRModule, codegen_name: str) -> IRModule:
    """`mod` with timers around its kernel calls (kiln.transform.profile)."""
    from kiln.transform.profile import (
        ProfileKernelCalls,  # lazy: kiln.transform.registry loads it on first use
    )

    if codegen_name not in PROFILING_CODEGENS:
        raise CompileError(
            f"profile=True needs a native library with host.c (codegen "
            f"{' or '.join(PROFILING_CODEGENS)}); the {codegen_name!r} codegen has none")
    with timed_step("profile"):
        mod = ProfileKernelCalls()(mod)
    verify_stage(mod, "the module with profiling timers")
    return mod


def _with_loop_limit(mod: IRModule, limit: int | None) -> IRModule:
    """`mod` with the module attribute `kiln.max_loop_iterations` the lowering of its
    Loops reads (kiln.transform.lower_control_flow); `mod` itself for no limit."""
    if limit is None:
        return mod
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise UsageError(f"max_loop_iterations must be a positive integer or None, got "
                         f"{limit!r}")
    return IRModule(mod.functions, {**mod.attrs, ATTR_MAX_LOOP_ITERATIONS: limit})


def _terminable(mod: IRModule, codegen_name: str, tgt: Target) -> IRModule:
    """`mod` whose lowered graph functions poll the caller's terminate flag
    (kiln.transform.terminate), where host.c's entries pass it: the llvm and c codegens
    (a wasm32 module has no host.c: its embedder calls the raw kernels)."""

    wasm = str(tgt.attrs.get("mtriple", "")).startswith("wasm")
    if codegen_name not in PROFILING_CODEGENS or wasm:
        return mod
    # `mod` comes verified from the pipelines (or from _instrument)
    return _late_pass(TerminateChecks(), mod, "terminate", "the module with terminate checks",
                      verified=True)


def executable_metadata(mod: IRModule, prefix: str) -> dict[str, Any]:
    """Library metadata (docs/abi.md) of a lowered module, plus workspace sizes.

    Graph functions left unlowered (a bring-your-own-codegen target that opted
    out of lowering) have no native entry; they are listed under
    "external_functions" so the native loader does not look for their symbols.
    """

    graph = mod.graph_funcs()
    lowered = mod.without(*graph) if graph else mod
    workspace = {name: fn.attrs[ATTR_WORKSPACE_BYTES]  # an int, or a symbolic size's text
                 for name, fn in lowered.prim_funcs().items()
                 if ATTR_WORKSPACE_BYTES in fn.attrs}
    meta = library_metadata(lowered, prefix, workspace_bytes=workspace)
    if graph:
        meta["external_functions"] = {name: graph_signature(name, fn, prefix)
                                      for name, fn in graph.items()}
    return meta


def _as_module(mod: Any) -> IRModule:
    if isinstance(mod, IRModule):
        return mod
    if isinstance(mod, (PrimFunc, Function)):
        return IRModule({"main": mod})
    if isinstance(mod, (str, os.PathLike)) or type(mod).__name__ == "ModelProto":
        return from_onnx(mod)  # an ONNX file or model: imported with default options
    raise CompileError(
        f"kiln.compile expects an IRModule (or a PrimFunc / graph Function), an ONNX "
        f"file path or an onnx.ModelProto, got {type(mod).__name__}; for import options "
        "use kiln.frontend.from_onnx(model, shape_dict=...)")


def _pick_target(mod: IRModule, target: Any) -> Target:
    """The one target of this build (argument, function attributes or the context)."""
    from kiln.driver import split  # cycle: kiln.driver imports this module

    per_function: dict[str, Target] = {}
    for name, fn in mod.items():
        spec = fn.attrs.get(ATTR_TARGET)
        if spec is not None:
            per_function[name] = resolve_target(spec)
    distinct = {str(t): t for t in per_function.values()}
    if len(distinct) > 1:
        listed = ", ".join(f"{n} -> {t.kind.name}" for n, t in sorted(per_function.items()))
        raise CompileError(
            f"functions of this module ask for different targets ({listed}); kiln compiles "
            "one target per module: split the module by target and compile each part")
    if target is not None:
        tgt = resolve_target(target)
        for name, t in per_function.items():
            if t != tgt and not split.is_split_target(tgt):
                raise CompileError(
                    f"function '{name}' has target attribute {t} but kiln.compile was asked "
                    f"for {tgt}; remove the attribute or compile for its target")
        return tgt
    if distinct:
        return next(iter(distinct.values()))
    return Target.current(allow_none=True) or Target.from_host()


def verify_stage(mod: IRModule, what: str, since: IRModule | None = None) -> None:
    """Verify `mod`; an IRError names the compile stage `what` that produced it. `since`:
    the verified module a late pass made `mod` from (`verify_changes`)."""

    try:
        if since is None:
            verify(mod)
        else:
            verify_changes(mod, since)
    except IRError as exc:
        raise IRError(f"{what} is not valid IR: {exc}") from exc


def _qualname(fn: object) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"

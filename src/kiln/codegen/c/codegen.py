"""The `c` backend: a lowered IRModule -> kernels.c + host.c (+ constants.bin).

kernels.c holds one raw kernel per PrimFunc (docs/abi.md, "Raw kernels"),
readable C99 that compiles cleanly with `cc -std=c99 -Wall -Wextra -Werror
-pedantic`. host.c (from `kiln.codegen.host`) adds the checked packed entries,
the last-error accessor and the metadata. Weights go to constants.bin, which
the linker turns into the hidden symbol `{prefix}_consts`.
"""

from __future__ import annotations

from typing import Any

from kiln import __version__
from kiln.artifact import Artifact
from kiln.codegen.c.context import ModuleContext
from kiln.codegen.c.externs import ExternTable
from kiln.codegen.c.flags import host_cflags, kernel_cflags, selected_cpu, toolchain_metadata
from kiln.codegen.c.kernel import KernelPrinter
from kiln.codegen.c.vector import vector_preamble
from kiln.codegen.cfamily.dialect import C_DIALECT, CDialect
from kiln.codegen.cfamily.helpers import Helpers
from kiln.codegen.cfamily.signature import ParamQualifiers, check_shape_vars, qualifiers
from kiln.codegen.const_table import table_artifact
from kiln.codegen.constants import ConstantPool
from kiln.codegen.cpu_requirements import feature_rows, required_features
from kiln.codegen.host import codegen_host, uses_heap
from kiln.codegen.naming import (
    C_TYPE_NAMES,
    CONSTS_BASE,
    check_prefix,
    const_table_symbol,
    consts_symbol,
    kernel_symbol,
    library_metadata,
    parallel_for_symbol,
    profile_symbol,
    workspace_symbols,
)
from kiln.codegen.sizes import check_buffer_sizes, target_pointer_bits
from kiln.errors import CompileError, MissingDependencyError, install_hint
from kiln.escape import c_comment
from kiln.ir.analysis.tensor_queries import extern_calls
from kiln.ir.attrs import ATTR_EXTERNAL
from kiln.ir.module import IRModule
from kiln.ir.outlined import kernel_funcs, outlined_launches
from kiln.ir.profiling import profile_sites
from kiln.ir.tensor import PROFILE_INTRINSICS, Buffer, Param, PrimFunc
from kiln.target.host import host_triple, llvm_available
from kiln.target.llvm_names import check_cpu_names

KERNELS_FILE = C_DIALECT.file_name
CODEGEN_ID = "c"

_MACROS = {
    "KILN_VECTORIZE": """\
/* Ask for the next loop to be vectorized (IR loop kind "vectorized"). Only a
   hint: GCC's `ivdep` would also promise independent iterations, which the IR
   does not; GCC vectorizes at -O2/-O3 by itself. */
#if defined(__clang__)
#define KILN_VECTORIZE _Pragma("clang loop vectorize(enable)")
#else
#define KILN_VECTORIZE
#endif""",
    "KILN_UNROLL": """\
/* Unroll the next loop n times (IR loop kind "unrolled"). */
#define KILN_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define KILN_UNROLL(n) KILN_PRAGMA(clang loop unroll_count(n))
#elif defined(__GNUC__) && __GNUC__ >= 8
#define KILN_UNROLL(n) KILN_PRAGMA(GCC unroll n)
#else
#define KILN_UNROLL(n)
#endif""",
    "KILN_NO_VECTORIZE": """\
/* Keep the next loop scalar (IR loop kind "scalar"): GCC before 14 has no pragma. */
#if defined(__clang__)
#define KILN_NO_VECTORIZE _Pragma("clang loop vectorize(disable)")
#elif defined(__GNUC__) && __GNUC__ >= 14
#define KILN_NO_VECTORIZE _Pragma("GCC novector")
#else
#define KILN_NO_VECTORIZE
#endif""",
    "KILN_PREFETCH": """\
/* Ask the CPU to bring the cache line of address p in for a read (IR intrinsic
   "prefetch"); nothing where the compiler has no builtin or in CUDA device code. */
#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
#define KILN_PREFETCH(p) __builtin_prefetch((p), 0, 3)
#else
#define KILN_PREFETCH(p) ((void)(p))
#endif""",
}


def emit_kernels(mod: IRModule, *, prefix: str, pool: ConstantPool,
                 dialect: CDialect = C_DIALECT, const_table: bool = False
                 ) -> tuple[str, dict[str, Any]]:
    """(kernels.c source, facts for the artifact metadata) of a lowered module; another
    `dialect` prints the same kernels in another C-family language (kernels.cu).
    `const_table`: the kernels read constants' addresses from `{prefix}_const_table`
    (kiln.codegen.const_table) rather than `{prefix}_consts + offset`."""
    check_prefix(prefix)
    graph_left = sorted(mod.graph_funcs())
    if graph_left:
        raise CompileError(f"the C backend needs a lowered module; graph-level functions "
                           f"{graph_left} were not lowered to tensor-level functions")
    # Parallel loops were outlined (the pass outline-parallel-loops) into loop-body
    # kernels run by host.c's thread pool.
    outlined = outlined_launches(mod, "C codegen")
    funcs = outlined.mod.prim_funcs()
    bodies = outlined.bodies
    symbols = {kernel_symbol(prefix, name) for name in funcs} | {
        consts_symbol(prefix), const_table_symbol(prefix), CONSTS_BASE}
    profiled = bool(profile_sites(mod))
    if profiled:
        symbols |= {profile_symbol(prefix, n) for n in sorted(PROFILE_INTRINSICS)}
    if bodies:
        symbols |= {parallel_for_symbol(prefix)}
        symbols |= {f"{kernel_symbol(prefix, name)}_run" for name in bodies}
    externs = ExternTable(symbols)
    for name, fn in funcs.items():
        for node in extern_calls(fn.body):
            externs.add(node, f"C codegen of '{name}'")
    reserved = symbols | _extern_names(mod)
    quals = qualifiers(funcs)
    ctx = ModuleContext(outlined.mod, prefix, pool, Helpers(), externs, quals,
                        launches=outlined.launches, dialect=dialect, const_table=const_table)

    definitions: list[str] = []
    prototypes: list[str] = []
    for name, fn in funcs.items():
        check_shape_vars("C codegen", name, fn)
        printer = KernelPrinter(ctx, name, fn, reserved)
        if fn.attrs.get(ATTR_EXTERNAL):  # defined by another target's code (driver/split)
            printer.declare_params()  # names the parameters of the prototype
            prototypes.append(printer.prototype())
            continue
        lines = printer.print()
        if name in bodies:
            definitions.extend(_context_struct(prefix, name, fn, quals[name]))
            definitions.extend(lines)
            definitions.extend(_trampoline(prefix, name, fn))
        else:
            definitions.extend(lines)
        definitions.append("")
        prototypes.append(printer.prototype())
    if bodies:
        prototypes[:0] = [*_parallel_for_decl(parallel_for_symbol(prefix)), ""]
    if profiled:
        prototypes[:0] = [*_profile_decls(prefix), ""]


    out = [*dialect.header(__version__), *(f"#include <{h}>" for h in dialect.includes)]
    if ctx.uses_malloc:
        out += ["#include <stdlib.h>",
                "/* Heap buffers. A build without malloc (Model Library Format, docs/mlf.md)",
                "   defines both names to its own allocator. */",
                "#ifndef KILN_MALLOC",
                "#define KILN_MALLOC malloc",
                "#define KILN_FREE free",
                "#else",
                "void* KILN_MALLOC(size_t size);",
                "void KILN_FREE(void* ptr);",
                "#endif"]
    if ctx.helpers.needs_string_h or "string.h" in externs.headers():
        out.append("#include <string.h>")
    out += ["", dialect.linkage, ""]
    for macro in sorted(ctx.macros):
        out += [_MACROS[macro], ""]
    out += vector_preamble(ctx.vector_types)
    out += _weights_preamble(ctx)
    declarations = externs.declarations()
    if declarations:
        out += ["/* External functions (call_extern). */", *declarations, ""]
    if ctx.helpers:
        out += ctx.helpers.lines(dialect)
    if prototypes:
        out += [*prototypes, "", *definitions]
    else:
        # ISO C forbids an empty translation unit.
        out += ["typedef int kiln_no_kernels;", ""]
    info = {
        "kernels": {name: kernel_symbol(prefix, name) for name in kernel_funcs(mod)},
        "libs": ["-lm", *externs.libs],
        "extern_dependencies": list(externs.dependencies.values()),
    }
    return "\n".join(out).rstrip("\n") + "\n", info


def _profile_decls(prefix: str) -> list[str]:
    """The prototypes of host.c's kernel-call timers `{prefix}_profile_start/stop`."""
    start, stop = (profile_symbol(prefix, f"profile_{n}") for n in ("start", "stop"))
    return ['/* Kernel-call timers (host.c; kiln.transform.profile, docs/abi.md "Profiling"). */',
            f"KILN_HIDDEN int64_t {start}(int64_t site);",
            f"KILN_HIDDEN int64_t {stop}(int64_t site, int64_t start);"]


def _parallel_for_decl(symbol: str) -> list[str]:
    """The prototype of host.c's thread pool entry `symbol` (`{prefix}_parallel_for`)."""
    return ["/* The library's thread pool (host.c): runs body over chunks of [0, n), returns",
            '   the first non-zero status of a chunk (docs/abi.md, "Parallel loops"). */',
            f"KILN_HIDDEN int32_t {symbol}(int64_t n,",
            "    int32_t (*body)(int64_t begin, int64_t end, void* context), void* context);"]


def _capture_ctype(param: Param, index: int, quals: ParamQualifiers) -> str:
    """The context-struct field type of a loop body's parameter (no `restrict`)."""
    if isinstance(param, Buffer):
        ctype = C_TYPE_NAMES[param.dtype]
        return f"{ctype}*" if index in quals.written else f"const {ctype}*"
    return C_TYPE_NAMES[param.dtype]


def _context_struct(prefix: str, name: str, fn: PrimFunc, quals: ParamQualifiers) -> list[str]:
    """The struct a launch fills with the loop's captured values (none: no struct)."""
    symbol = kernel_symbol(prefix, name)
    fields = [f"  {_capture_ctype(p, i, quals)} p{i - 2};"
              for i, p in enumerate(fn.params) if i >= 2]
    if not fields:
        return []
    return [f"/* Captured values of {c_comment(name)}. */", f"struct {symbol}_ctx {{",
            *fields, "};", ""]


def _trampoline(prefix: str, name: str, fn: PrimFunc) -> list[str]:
    """`int32_t {symbol}_run(begin, end, context)`: what the thread pool calls."""
    symbol = kernel_symbol(prefix, name)
    captured = [f"c->p{i}" for i in range(len(fn.params) - 2)]
    out = ["", f"static int32_t {symbol}_run(int64_t begin, int64_t end, void* context) {{"]
    if captured:
        out.append(f"  const struct {symbol}_ctx* c = context;")
    else:
        out.append("  (void)context;")
    call = f"  return {symbol}(begin, end{''.join(', ' + c for c in captured)});"
    if len(call) > 100:
        call = f"  return {symbol}(\n      begin, end, {', '.join(captured)});"
    out += [call, "}"]
    return out


def _extern_names(mod: IRModule) -> set[str]:
    return {node.name for fn in mod.prim_funcs().values() for node in extern_calls(fn.body)}


def _cpu_requirements(target: Any) -> dict[str, Any]:
    """`triple` and `requires_features` of kernels.c when a native build selects a CPU
    (`-march=<mcpu>`, `-mavx2`, ...): the features LLVM's CPU of that name has, which
    host.c checks as for the llvm backend (GCC and LLVM share x86 and Arm CPU names)."""
    selected = selected_cpu(target)
    if selected is None:
        return {}

    if not llvm_available():
        raise MissingDependencyError(
            "a c target with mcpu/mattr needs llvmlite to know the CPU features the "
            f"kernels may use ({install_hint('llvmlite')}); or drop mcpu/mattr")
    triple, (cpu, features) = host_triple(), selected
    # A name LLVM does not know would silently probe a generic CPU: say so instead.
    check_cpu_names(triple, cpu, [f for f in features.split(",") if f], "c")
    return {"triple": triple, "requires_features": required_features(triple, cpu, features)}



def _weights_preamble(ctx: ModuleContext) -> list[str]:
    """The declarations through which the kernels reach the weights."""
    prefix = ctx.prefix
    if not ctx.uses_consts:
        return []
    if ctx.const_table:
        return ["/* Where each weight is read: const_table.c (docs/runtime.md, \"One copy per",
                "   process\"). */",
                f"extern KILN_HIDDEN const uint8_t* {const_table_symbol(prefix)}[];", ""]
    out = ["/* Weights: read-only, 64-byte aligned, linked from constants.bin. */",
           f"extern KILN_HIDDEN const uint8_t {consts_symbol(prefix)}[];", ""]
    if ctx.pool.large:
        out += ["/* More weights than a 32-bit relocation's offset reaches: kernels read",
                "   their address at run time (volatile: never folded into a relocation). */",
                f"static const uint8_t* const volatile {CONSTS_BASE} = "
                f"{consts_symbol(prefix)};", ""]
    return out

def codegen_c(mod: IRModule, target: Any, *, prefix: str, pool: ConstantPool) -> list[Any]:
    """The `c` target's artifacts: kernels.c, host.c and (with weights) constants.bin.

    `target` is a `kiln.target.Target` of kind "c" (or None for the host): it
    selects the C compiler flags recorded in `metadata["cflags"]`.
    """

    check_buffer_sizes(mod, target_pointer_bits(target))
    source, info = emit_kernels(mod, prefix=prefix, pool=pool, const_table=True)
    toolchain = toolchain_metadata(target)
    cpu = _cpu_requirements(target)
    cflags = kernel_cflags(target)
    if uses_heap(mod):  # heap buffers from host.c's workspace cache (docs/abi.md)
        alloc, free = workspace_symbols(prefix)
        cflags += [f"-DKILN_MALLOC={alloc}", f"-DKILN_FREE={free}"]
    kernels = Artifact(CODEGEN_ID, "native", KERNELS_FILE, source.encode("utf-8"),
                       {"cflags": cflags, **info, **toolchain, **cpu})
    host = codegen_host(mod, prefix=prefix, metadata=library_metadata(mod, prefix),
                        cflags=host_cflags(target),
                        cpu_features=feature_rows(cpu["triple"], cpu["requires_features"])
                        if cpu else ())
    artifacts = [kernels, host]
    if len(pool):
        artifacts.append(pool.artifact(CODEGEN_ID, prefix))
        if pool.table:
            artifacts.append(table_artifact(pool.table_entries(), prefix, CODEGEN_ID,
                                            host.metadata.get("cflags", ())))
    return artifacts

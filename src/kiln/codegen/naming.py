"""Symbol names and the function-signature metadata every backend shares.

The C ABI (docs/abi.md) in one place:
- public packed entry of IR function `f`:  `{prefix}f`
- its raw kernel (internal, hidden):        `{prefix}_kernel_f`
- last-error accessor:                      `{prefix}_last_error`
- library metadata (JSON):                  `{prefix}_metadata`
- missing CPU features:                     `{prefix}_cpu_missing`
- embedded constants (weights):             `{prefix}_consts`
- embedded artifact blob:                   `{prefix}_blob`
- thread pool entry (hidden):               `{prefix}_parallel_for`
- thread pool controls:                     `{prefix}_set_num_threads`, `{prefix}_num_threads`,
                                            `{prefix}_set_spin_us`, `{prefix}_pool_stats`
- profiling timers (hidden, profile=True):  `{prefix}_profile_start`, `{prefix}_profile_stop`
- profiling counters (profile=True):        `{prefix}_profile_read`, `{prefix}_profile_reset`
IR function names never start with "_", so these cannot collide. `f` stands for
`kiln.escape.symbol_name(f)`: the name itself when it is plain ASCII and at
most 200 characters, else a stable mangled `_x<hash>_<hint>` (docs/abi.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kiln import __version__, dim_expr
from kiln.codegen.decoder_layout import DecoderLayout, decoder_layout
from kiln.errors import CompileError, FormatError
from kiln.escape import is_c_identifier, symbol_name
from kiln.ir.aliasing import analyze
from kiln.ir.attrs import (
    ATTR_GRAPH,
    ATTR_LAST_POSITION,
    ATTR_LAST_POSITION_OF,
    ATTR_NUM_OUTPUTS,
    ATTR_OUTPUT_NAMES,
    ATTR_PROFILE_SITES,
    ATTR_RUNTIME_DIMS,
    ATTR_TUPLE_RESULT,
)
from kiln.ir.module import IRModule
from kiln.ir.outlined import kernel_funcs
from kiln.ir.shape_expr import dim_bounds, dim_nonzero, dim_text, graph_dims
from kiln.ir.tensor import AllocConst, Buffer, PrimExpr, PrimFunc, Var
from kiln.ir.terminate import terminate_flag
from kiln.ir.visitor import iter_stmts
from kiln.runtime import abi
from kiln.runtime.threads import POOL_EXPORTS

DEFAULT_PREFIX = "kiln_"
LIBRARY_FORMAT = "kiln.library"
# Library metadata versions (docs/abi.md, "Library metadata"); readers accept 1..newest.
#   1 (2026-11): functions with signatures, workspace_bytes, external_dependencies.
#   2 (2026-11-22): optional "profile" (kernel-call timer sites of a library built with
#     profile=True, read through {prefix}_profile_read) and "graphs" (each lowered graph
#     function's kernel calls, tensors and workspace offsets: `kiln inspect --report`).
#   3 (2026-11-23): symbolic dimensions: a tensor's shape may hold strings (a variable or
#     an expression, `"seq*2"`), and a graph function with them lists its "dims" (name,
#     min, max) and its "output_shapes_symbol".
#   4 (2026-11-23): data-dependent output sizes: a graph function whose results have
#     sizes known only after the call lists them in "runtime_dims" (name, bound, and the
#     result axes they size, with each axis' actual-size text); its results' "shape" is
#     the upper bound the caller allocates, and the entry writes the actual extents into
#     the results' DLTensor shapes. Libraries without them differ from 3 only in the number.
#   5 (2026-11-27): `"terminate": true` on a graph function whose entry takes the caller's
#     terminate flag as one more argument (docs/abi.md, "Stopping a call"); a Loop's
#     iteration limit (max_loop_iterations). Every key of version 4 is unchanged.
#     Also: `"dims"` minima default to 0, and an optional `"nonzero"` list of sizes the
#     model divides by (docs/dynamic-shapes.md, "Zero sizes"); the entry checks them
#     itself, so a runtime that ignores the key still refuses such a call.
#   6 (2026-11-27): `"generate_symbol"` on a decoder graph function (kiln.codegen.decoder_layout),
#     the exported greedy generation entry `{prefix}_generate_{name}` (docs/abi.md,
#     "Generation"). Every key of version 5 is unchanged.
#   7 (2026-11-27): `"swap"` (`symbol`, `weight_symbol`) on a library with constants: the
#     exported `{prefix}_swap_weights` and `{prefix}_swap_weight` (docs/abi.md, "Swapping
#     weights"). Every key of version 6 is unchanged.
#   8 (2026-11-28): `{prefix}_generate_{name}` takes a token callback and its user pointer
#     after `out_steps` (KilnTokenFunc, docs/abi.md "Generation"); kiln.generate runs its
#     greedy loop through it from this version on. Every key of version 7 is unchanged.
#   9 (2026-11-28): `"in_place_of"` on a result written in place of a parameter (docs/abi.md,
#     "A result in place of a parameter"). Every key of version 8 is unchanged.
#   10 (2026-11-28): `"last_position"` on a decoder graph function: the name of its
#     companion function of the same library, which returns the logits of each row's last
#     position only (kiln.transform.last_position); both generation loops run the prompt's
#     call on it (docs/abi.md, "Generation"). Every key of version 9 is unchanged.
LIBRARY_FORMAT_VERSION = 10


# Longest system_lib_prefix: it starts every symbol of the library.
MAX_PREFIX = 64


def check_prefix(prefix: str) -> str:
    if not is_c_identifier(prefix) or len(prefix) > MAX_PREFIX:
        raise CompileError(f"system_lib_prefix {prefix!r} must be a non-empty C identifier (ASCII, "
                           f"at most {MAX_PREFIX} characters)")
    return prefix


def parallel_for_symbol(prefix: str) -> str:
    """The thread pool's entry in host.c (hidden): `{prefix}_parallel_for`."""
    return f"{prefix}_parallel_for"


def workspace_symbols(prefix: str) -> tuple[str, str]:
    """host.c's caching heap allocator of the kernels (hidden; docs/abi.md, "Heap
    workspaces"): `{prefix}_workspace_alloc`, `{prefix}_workspace_free`."""
    return f"{prefix}_workspace_alloc", f"{prefix}_workspace_free"


PROFILE_EXPORTS = ("profile_read", "profile_reset")


def pool_controls_config(prefix: str) -> list[str]:
    """The #defines naming kiln_host.c's exported thread controls `{prefix}_set_num_threads`,
    ... (kiln.runtime.threads.POOL_EXPORTS; docs/abi.md, "Threads")."""
    macros = dict(zip(POOL_EXPORTS, ("KILN_SET_NUM_THREADS", "KILN_GET_NUM_THREADS",
                                     "KILN_SET_SPIN_US", "KILN_POOL_STATS"), strict=True))
    return [f"#define {macros[name]} {prefix}_{name}" for name in POOL_EXPORTS]


def profile_symbol(prefix: str, name: str) -> str:
    """`{prefix}_{name}` for a profiling timer intrinsic (`profile_start`, `profile_stop`,
    hidden, in host.c) or a profiling export of PROFILE_EXPORTS (docs/abi.md, "Profiling")."""
    return f"{prefix}_{name}"


def entry_symbol(prefix: str, name: str) -> str:
    return f"{prefix}{symbol_name(name)}"


def kernel_symbol(prefix: str, name: str) -> str:
    return f"{prefix}_kernel_{symbol_name(name)}"


def output_shapes_symbol(prefix: str, name: str) -> str:
    """The entry that tells a caller the result shapes of a graph function with symbolic
    dimensions (docs/abi.md): `{prefix}_output_shapes_{name}`."""
    return f"{prefix}_output_shapes_{symbol_name(name)}"


def generate_symbol(prefix: str, name: str) -> str:
    """The greedy generation entry of a decoder function (docs/abi.md, "Generation"):
    `{prefix}_generate_{name}`."""
    return f"{prefix}_generate_{symbol_name(name)}"


def last_error_symbol(prefix: str) -> str:
    return f"{prefix}_last_error"


def metadata_symbol(prefix: str) -> str:
    return f"{prefix}_metadata"


def cpu_missing_symbol(prefix: str) -> str:
    """`int32_t {prefix}_cpu_missing(char* out, int32_t size)`: the CPU features the
    library's code needs that this CPU lacks (docs/abi.md, "CPU features")."""
    return f"{prefix}_cpu_missing"


def consts_symbol(prefix: str) -> str:
    return f"{prefix}_consts"


def const_table_symbol(prefix: str) -> str:
    """`const uint8_t* {prefix}_const_table[]`: the address each constant is read at, by
    pool index (kiln.codegen.const_table); hidden, writable."""
    return f"{prefix}_const_table"


def swap_symbols(prefix: str) -> dict[str, str]:
    """The entries of kiln_swap.c a library with constants exports (docs/abi.md, "Swapping
    weights"): `symbol` `{prefix}_swap_weights(raw, n_raw)`, `weight_symbol`
    `{prefix}_swap_weight(i, ...)`; and the hidden `program`, `names` (swap_program.c),
    `run` (the interpreter, swap_runtime.c), `pause` and `resume` (host.c's call guard)."""
    return {"symbol": f"{prefix}_swap_weights", "weight_symbol": f"{prefix}_swap_weight",
            "program": f"{prefix}_swap_program", "names": f"{prefix}_swap_names",
            "run": f"{prefix}_swap_run", "pause": f"{prefix}_swap_pause",
            "resume": f"{prefix}_swap_resume"}


def has_constants(mod: IRModule) -> bool:
    """Whether some tensor-level function of `mod` holds a constant (AllocConst)."""
    return any(isinstance(node, AllocConst) for fn in mod.prim_funcs().values()
               for node in iter_stmts(fn.body))


# The file-local pointer holding `{prefix}_consts`'s address in a C translation unit
# whose pool is large (kiln.codegen.constants.LARGE_CONSTS_BYTES).
CONSTS_BASE = "kiln_consts_base"


def runtime_dims(fn: PrimFunc) -> tuple[tuple[str, int | str, tuple[tuple[int, int, str], ...]],
                                         ...]:
    """`kiln.runtime_dims` of a lowered graph function: (name, bound, places) per
    data-dependent dimension (transform/lower_graph.py); () when it has none. Such a
    function takes an int64 buffer of their values after its results."""
    if not fn.attrs.get(ATTR_GRAPH):
        return ()
    return tuple((str(n), b, tuple((int(k), int(a), str(x)) for k, a, x in places))
                 for n, b, places in fn.attrs.get(ATTR_RUNTIME_DIMS, ()) or ())


# C element types of buffers and scalar parameters (the ABI's table, not a copy).
C_TYPE_NAMES = abi.C_TYPE_NAMES


def _metadata_text(name: str, d: PrimExpr) -> str:
    """`dim_text(d)`, which must read back within the language's limits: a library whose
    metadata held a text the runtime refuses could not be loaded."""
    text = dim_text(d)
    try:
        dim_expr.parse(text)
    except FormatError as err:
        raise CompileError(f"the shape of '{name}' cannot be written to metadata: {err}") from None
    return text


def param_info(p: Buffer | Var) -> dict[str, Any]:
    """A parameter's JSON: a symbolic dimension is its text (`"seq*2"`), ints stay ints."""
    if isinstance(p, Buffer):
        shape = [d if isinstance(d, int) else _metadata_text(p.name, d) for d in p.shape]
        return {"name": p.name, "kind": "tensor", "shape": shape, "dtype": p.dtype}
    return {"name": p.name, "kind": "scalar", "dtype": p.dtype}


def packed_params(fn: PrimFunc) -> tuple[Buffer | Var, ...]:
    """The parameters of `fn` its packed entry takes as arguments (docs/abi.md): all but
    a lowered graph function's trailing ones, which the entry fills in itself (the
    buffer of run-time dimensions, the terminate flag, the dimension scalars)."""
    hidden = len(graph_dims(fn)) + bool(runtime_dims(fn)) + (terminate_flag(fn) is not None)
    return fn.params[:len(fn.params) - hidden]


def function_signature(name: str, fn: PrimFunc, prefix: str,
                       written: frozenset[int] = frozenset(),
                       in_place: Mapping[int, int] | None = None) -> dict[str, Any]:
    """The JSON signature of one lowered function, as the metadata symbol carries it.

    For a lowered graph function the last `kiln.num_outputs` buffers are results,
    which the caller allocates; the rest are parameters. A tensor parameter whose
    index is in `written` (the function stores into it) is marked `"written": true`,
    so the runtime can refuse read-only or overlapping buffers there. A result in
    `in_place` ({result index: parameter index}, kiln.codegen.in_place) may be that
    parameter's own buffer: `"in_place_of": index`.
    """
    n_out = int(fn.attrs.get(ATTR_NUM_OUTPUTS, 0))
    params = [param_info(p) for p in packed_params(fn)]
    split = len(params) - n_out
    for i, info in enumerate(params[:split]):  # results are always written
        if i in written and info["kind"] == "tensor":
            info["written"] = True
    results = params[split:]
    names = list(fn.attrs.get(ATTR_OUTPUT_NAMES, ()) or [r["name"] for r in results])
    for r, rname in zip(results, names):
        r["name"] = rname
    for j, i in sorted((in_place or {}).items()):
        results[j]["in_place_of"] = i
    extra: dict[str, Any] = {}
    dims, runtime = graph_dims(fn), runtime_dims(fn)
    if dims:
        bounds = dim_bounds(fn)
        extra = {"dims": [{"name": d.name, "min": bounds.get(d.name, (0, None))[0],
                           "max": bounds.get(d.name, (0, None))[1]} for d in dims],
                 "output_shapes_symbol": output_shapes_symbol(prefix, name)}
        if dim_nonzero(fn):  # sizes the model divides by (docs/dynamic-shapes.md)
            extra["nonzero"] = [{"dim": text, "why": why} for text, why in dim_nonzero(fn)]
    if terminate_flag(fn) is not None:  # the entry takes the caller's flag (docs/abi.md)
        extra["terminate"] = True
    if runtime:
        extra["runtime_dims"] = [
            {"name": n, "bound": b,
             "places": [{"result": k, "axis": a, "actual": text} for k, a, text in places]}
            for n, b, places in runtime]
    signature = {
        "name": name,
        "symbol": entry_symbol(prefix, name),
        **extra,
        # the caller allocates results whenever outputs are declared
        "kind": "graph" if fn.attrs.get(ATTR_GRAPH) or n_out else "tensor",
        "params": params[:split],
        "results": results,
        "tuple_result": bool(fn.attrs.get(ATTR_TUPLE_RESULT, False)),
    }
    companion = fn.attrs.get(ATTR_LAST_POSITION)
    if companion is not None:  # kiln.transform.last_position
        signature["last_position"] = str(companion)
    if signature["kind"] == "graph" and ATTR_LAST_POSITION_OF not in fn.attrs and \
            isinstance(decoder_layout(signature), DecoderLayout):
        signature["generate_symbol"] = generate_symbol(prefix, name)  # docs/abi.md
    return signature


def library_metadata(mod: IRModule, prefix: str, **extra: Any) -> dict[str, Any]:
    """The library metadata JSON object (docs/abi.md) of a lowered module."""

    # Outlined loop bodies (kiln.ir.outlined) write for their kernel, which lists
    # the buffers as written; they are no functions of the library.
    from kiln.codegen.in_place import in_place_results  # cycle: it imports this module

    written = analyze(mod.prim_funcs()).written
    every = mod.prim_funcs()
    funcs = {name: function_signature(name, fn, prefix, written.get(name, frozenset()),
                                      in_place_results(fn, every))
             for name, fn in kernel_funcs(mod).items()}
    graph_left = sorted(mod.graph_funcs())
    if graph_left:
        raise CompileError(
            f"graph-level functions {graph_left} were not lowered before codegen; "
            "run the default graph pipeline or lower them yourself")
    from kiln.codegen.graph_summary import (
        graph_summaries,  # cycle: kiln.codegen.graph_summary imports this module
    )

    graphs = graph_summaries(mod.prim_funcs(), written)
    if graphs:  # the kernel calls and memory plan of each lowered graph function
        extra = {"graphs": graphs, **extra}
    if has_constants(mod):  # kiln_swap.c's entries (docs/abi.md, "Swapping weights")
        symbols = swap_symbols(prefix)
        extra = {"swap": {k: symbols[k] for k in ("symbol", "weight_symbol")}, **extra}
    sites = mod.attrs.get(ATTR_PROFILE_SITES, ())
    if sites:  # profile-kernel-calls ran (kiln.ir.profiling): the timer sites, in order
        extra = {"profile": {"sites": [{"function": f, "kernel": k} for f, k in sites]},
                 **extra}
    return {
        "format": LIBRARY_FORMAT,
        "version": LIBRARY_FORMAT_VERSION,
        "kiln_version": __version__,
        "prefix": prefix,
        "functions": funcs,
        **extra,
    }

"""host.c: the checked packed entry points shared by the `c` and `llvm` backends.

For every PrimFunc `name` of a lowered module, host.c defines the public entry

    int32_t {prefix}{name}(const KilnValue* args, const int32_t* type_codes, int32_t num_args)

which performs every check of docs/abi.md in order, argument by argument, and
then calls the raw kernel `{prefix}_kernel_{name}` (defined by the backend in
kernels.c or kernels.o). It also defines `{prefix}_last_error` (a thread-local
message buffer) and `{prefix}_metadata` (the library metadata JSON).

Return codes of an entry (kiln.runtime.abi): 0 success; -1 an argument was
rejected; otherwise the kernel's non-zero status (1: a heap workspace could not be
allocated).

host.c is kiln_host.c (`kiln.runtime.include_dir()/kiln/kiln_host.c`: the
checks, the error buffer and the thread pool, the same C for every model)
followed by kiln_host_entries.c and this model's part: kernel prototypes, entries
and metadata. Every name in the model's part is spelled by kiln.escape. host.c
includes only the C standard library; it needs C11 for `_Thread_local` (GNU
`__thread` before C11). Its metadata `prelude` is the length of its #defines and
kiln_host.c, which kiln.runtime.native compiles apart, once for every model that
shares them (docs/codegen-c.md, "kiln_host.c").

When some kernel has a `parallel` loop, host.c defines KILN_HOST_PARALLEL, so
kiln_host.c adds the hidden `{prefix}_parallel_for`, a small pthread pool the
kernels run their outlined loops on (kiln.ir.outlined; docs/abi.md,
"Parallel loops"); `-DKILN_NO_THREADS` (firmware) makes it run loops serially.
When some kernel allocates heap buffers, it defines the hidden
`{prefix}_workspace_alloc`/`_free` that LLVM-built kernels allocate them with: freed
workspaces of 1 MiB and more are kept for the next call (docs/abi.md, "Heap
workspaces").
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln import __version__, dim_expr
from kiln.artifact import Artifact
from kiln.codegen.cfamily.helpers import DIM_RUNTIME_FILE, Helpers
from kiln.codegen.cfamily.printer import HELPER_PREFIX, CPrinter, NameScope
from kiln.codegen.cfamily.signature import describe_params, param_ctype, qualifiers
from kiln.codegen.decoder_layout import DecoderLayout, decoder_layout
from kiln.codegen.host_dims import TensorArg, dim_c, dim_check, emit_binding, or_return
from kiln.codegen.host_generate import generate_entry
from kiln.codegen.naming import (
    C_TYPE_NAMES,
    check_prefix,
    cpu_missing_symbol,
    entry_symbol,
    kernel_symbol,
    last_error_symbol,
    metadata_symbol,
    output_shapes_symbol,
    packed_params,
    parallel_for_symbol,
    pool_controls_config,
    profile_symbol,
    runtime_dims,
    swap_symbols,
    workspace_symbols,
)
from kiln.errors import CompileError
from kiln.escape import c_char_array, c_comment, c_string_literal, int64_literal, utf8
from kiln.ir import dtype as dt
from kiln.ir.analysis.tensor_queries import calls, heap_allocations
from kiln.ir.attrs import ATTR_CHECK_MESSAGES, ATTR_NUM_OUTPUTS
from kiln.ir.kernel_errors import ERROR_OUT_OF_MEMORY, KERNEL_ERRORS
from kiln.ir.module import IRModule
from kiln.ir.outlined import has_parallel_loops, kernel_funcs
from kiln.ir.shape_expr import graph_dims, is_static
from kiln.ir.tensor import Buffer, PrimFunc, Var
from kiln.ir.terminate import terminate_flag
from kiln.kernels.parallel_work import PARALLEL_MIN_NS
from kiln.runtime.abi import INT64_MAX, SCALAR_RANGES, dl_type
from kiln.runtime.cpu_features import CPUFeature
from kiln.runtime.native import PRELUDE_KEY

HOST_FILE = "host.c"
DEFAULT_HOST_CFLAGS = ("-std=c11", "-O2", "-fPIC")

# Linker input of the thread pool (glibc before 2.34 keeps pthreads in libpthread).
PTHREAD_LIBS = ("-pthread",)

# The model-independent C of host.c, shipped next to kiln.h (package data).
HOST_RUNTIME_FILE = "kiln_host.c"
# The rest of it, compiled with the model's entries (their own check messages).
HOST_ENTRIES_FILE = "kiln_host_entries.c"
# Longest name written inline as a string literal; longer ones get a static array.
_INLINE_NAME = 200
_NS = "kiln_host_"  # kiln_host.c's static helpers
# A line including a file of kiln's runtime directory (not a system header).
_LOCAL_INCLUDE = re.compile(r'#include "([\w.]+)"\n?')
# The C tokens that hold or hide identifiers: comments, string and character literals,
# numbers (`64u`, `0x1fu`: no identifier inside) and the identifiers themselves.
_C_TOKEN = re.compile(r"/\*.*?\*/|\"(?:\\.|[^\"\\])*\"|'(?:\\.|[^'\\])*'|\d\w*"
                      r"|([A-Za-z_]\w*)", re.S)


def host_runtime_path() -> Path:
    """Where kiln_host.c is installed: `kiln.runtime.include_dir()/kiln/kiln_host.c`."""
    kiln_dir = Path(__file__).resolve().parent.parent
    return kiln_dir / "runtime" / "include" / "kiln" / HOST_RUNTIME_FILE


def _inlined(path: Path, included: list[str]) -> str:
    """The text of `path` with each `#include "name"` of a file next to it replaced by
    that file's text (recursively), as the preprocessor would; `included` collects the
    names."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        include = _LOCAL_INCLUDE.fullmatch(line)
        if include is None:
            out.append(line)
            continue
        name = include[1]
        if not (path.parent / name).is_file():
            raise CompileError(f"{path} includes {name!r}, which is not next to it")
        included.append(name)
        out.append(_inlined(path.parent / name, included))
    return "".join(out)


@functools.cache
def host_prelude_source() -> str:
    """The text of kiln_host.c, which every generated host.c starts with (after its
    #defines), and of the file it includes: host.c includes only the C library, so
    kiln_host.c's `#include "kiln_dim.c"` line stands for that file's text, as it does
    for the preprocessor (any other file of its directory it included would, too)."""
    included: list[str] = []
    text = _inlined(host_runtime_path(), included)
    if DIM_RUNTIME_FILE not in included:
        raise CompileError(f"{host_runtime_path()} does not include {DIM_RUNTIME_FILE}")
    return text


@functools.cache
def host_entries_source() -> str:
    """The text of kiln_host_entries.c (and the files it includes), which host.c holds
    after kiln_host.c and the model's check messages: what the entries need in their
    own object when the prelude is compiled apart (kiln.runtime.native)."""
    return _inlined(host_runtime_path().with_name(HOST_ENTRIES_FILE), [])


def host_runtime_source() -> str:
    """The model-independent C of host.c: kiln_host.c then kiln_host_entries.c, with
    the files they include (the #defines of `HostPrinter.render` go before it)."""
    return host_prelude_source() + host_entries_source()


@functools.cache
def host_runtime_names() -> frozenset[str]:
    """Every identifier kiln_host.c's code uses (comments and strings left out).

    No generated symbol or local may take one of these names: a clash would
    redefine (or, for a macro, silently rename) something of kiln_host.c.
    """
    return frozenset(m[1] for m in _C_TOKEN.finditer(host_runtime_source()) if m[1])


def check_messages_define(own: Mapping[int, str] | None = None) -> str:
    """`#define KILN_HOST_CHECK_MESSAGES {...}`: the messages of failed kernel checks
    (kiln.ir.kernel_errors) by status code, which kiln_host.c's kernel_failed reports;
    `own`: the functions' own codes (`kiln.check_messages`) and their messages."""
    messages = {**KERNEL_ERRORS, **(own or {})}
    items = ["0" if code == ERROR_OUT_OF_MEMORY or code not in messages
             else c_string_literal(messages[code]) for code in range(max(messages) + 1)]
    return f"#define KILN_HOST_CHECK_MESSAGES {{{', '.join(items)}}}"


def own_check_messages(mod: IRModule) -> dict[int, str]:
    """The check codes of `mod`'s functions' own (`kiln.check_messages`), with their
    messages; CompileError when two functions give one code two messages."""
    out: dict[int, str] = {}
    for name, fn in mod.prim_funcs().items():
        for code, text in fn.attrs.get(ATTR_CHECK_MESSAGES, ()) or ():
            if out.setdefault(int(code), str(text)) != text:
                raise CompileError(f"function '{name}': check code {code} means "
                                   f"{text!r}, another function's {out[int(code)]!r}")
    return out


def cpu_features_config(prefix: str, features: Sequence[CPUFeature]) -> list[str]:
    """The #defines of kiln_host.c's CPU check: `{prefix}_cpu_missing`, and the rows
    (kiln.runtime.cpu_features.TABLES) of the features the kernels need, if any."""
    config = [f"#define KILN_HOST_CPU_MISSING {cpu_missing_symbol(prefix)}"]
    if not features:
        return config
    rows = []
    for f in features:
        fields = ", ".join(f"{{{b.leaf:#x}u, {b.subleaf}u, {int(b.reg)}u, {b.shift}u, "
                           f"{b.mask:#x}u, {b.at_least}u}}" for b in f.fields)
        rows.append(f"{{{c_string_literal(f.name)}, {f.xcr0:#x}u, {len(f.fields)}u, "
                    f"{{{fields}}}}}")
    return [*config, "#define KILN_HOST_CPU_FEATURES { \\",
            *(f"  {row}, \\" for row in rows), "}"]


def uses_heap(mod: IRModule) -> bool:
    """Whether some kernel of `mod` allocates a heap buffer (from host.c's workspace cache)."""
    return any(heap_allocations(f.body) for f in mod.prim_funcs().values())


def workspace_bytes(mod: IRModule, name: str) -> tuple[int, bool]:
    """(largest heap workspace in bytes, whether all have that size) of `name` and its callees."""
    sizes: set[int] = set()
    seen: set[str] = set()
    todo = [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        fn = mod.functions.get(current)
        if not isinstance(fn, PrimFunc):
            continue
        for alloc in heap_allocations(fn.body):
            if all(isinstance(d, int) for d in alloc.buffer.shape):
                sizes.add(alloc.buffer.nbytes())
        todo.extend(c.func for c in calls(fn.body))
    if not sizes:
        return 0, True
    return max(sizes), len(sizes) == 1


class HostPrinter:
    """Prints host.c for one module: kiln_host.c, then the model's entries."""

    def __init__(self, mod: IRModule, prefix: str, metadata: Mapping[str, Any],
                 cpu_features: Sequence[CPUFeature] = ()) -> None:
        self.mod = mod
        self.cpu_features = list(cpu_features)  # checked on the first call of any entry
        self.prefix = check_prefix(prefix)
        self.ns = f"{prefix}_host_"  # static helpers: reserved by docs/abi.md's `{prefix}_`
        self.metadata = metadata
        self.helpers = Helpers()
        # Kernels with parallel loops call the thread pool defined here.
        self.parallel = has_parallel_loops(mod)
        # Kernels with heap buffers allocate them from the workspace cache defined here.
        self.heap = uses_heap(mod)
        funcs = kernel_funcs(mod)  # outlined loop bodies are private to kernels.o
        self.quals = qualifiers(mod.prim_funcs())  # what a kernel's loop bodies write too
        symbols = {entry_symbol(prefix, f) for f in funcs} | {kernel_symbol(prefix, f)
                                                              for f in funcs}
        clash = sorted(symbols & host_runtime_names())
        if clash:
            raise CompileError(
                f"system_lib_prefix {prefix!r} gives symbol {clash[0]!r}, a name kiln_host.c "
                "uses itself (docs/abi.md); choose another prefix or function name")
        # Globals of host.c that a local must not shadow.
        self.reserved = symbols | host_runtime_names()

    def helper(self, name: str) -> str:
        """Use a shared kernels helper; return its name in this file's namespace."""
        return self.ns + self.helpers.use(name).removeprefix(HELPER_PREFIX)

    def helper_lines(self) -> list[str]:
        """The helpers' definitions, named into this file's namespace by macros that
        hold only around them (host.c shares its namespace with the public entries,
        so helper `kiln_x` is the reserved `{prefix}_host_x` here)."""
        names = self.helpers.names
        if not names:
            return []
        return [*(f"#define {n} {self.ns}{n.removeprefix(HELPER_PREFIX)}" for n in names),
                *self.helpers.lines(), *(f"#undef {n}" for n in names), ""]

    def render(self) -> str:
        """host.c's text (see `render_parts`)."""
        prelude, model = self.render_parts()
        return prelude + model

    def render_parts(self) -> tuple[str, str]:
        """host.c in two parts: its #defines and kiln_host.c, the same for every model
        of one prefix, target and set of features (kiln.runtime.native compiles it once,
        apart); then kiln_host_entries.c and this model's part."""
        funcs = kernel_funcs(self.mod)
        entries: list[str] = []
        for name, fn in funcs.items():
            entries.extend(self.entry(name, fn))
            entries.append("")
        generating = self.generate_entries()
        config = cpu_features_config(self.prefix, self.cpu_features)
        config += self.profile_config()
        config += pool_controls_config(self.prefix)
        if self.heap:
            alloc, free = workspace_symbols(self.prefix)
            config += [f"#define KILN_WORKSPACE_ALLOC {alloc}",
                       f"#define KILN_WORKSPACE_FREE {free}"]
        config += self.swap_config()
        if self.parallel:
            config += ["#define KILN_HOST_PARALLEL 1",
                       f"#define KILN_PARALLEL_FOR {parallel_for_symbol(self.prefix)}",
                       f"#define KILN_POOL_DEFAULT_SERIAL_NS {PARALLEL_MIN_NS}"]
        prelude = [
            "/*",
            f" * {HOST_FILE} -- generated by kiln {__version__}. Do not edit.",
            " * Checked packed entry points, last error and metadata of docs/abi.md:",
            f" * {HOST_RUNTIME_FILE} (the same for every model), then this model's part.",
            " */",
            *config,
            host_prelude_source().rstrip("\n"),
            "",
        ]
        model = [
            "/* ------------------------------------------------------- this model */",
            "",
            check_messages_define(own_check_messages(self.mod)),
            *(["#define KILN_HOST_GENERATE 1"] if generating else []),
            host_entries_source().rstrip("\n"),
            "",
            "/* Raw kernels (kernels.c / kernels.o). */",
            *(self.kernel_prototype(name, fn) for name, fn in funcs.items()),
            "",
            *self.helper_lines(),
            *entries,
            *generating,
            *self.accessors(),
        ]
        return "\n".join(prelude) + "\n", "\n".join(model).rstrip("\n") + "\n"

    def generate_entries(self) -> list[str]:
        """`{prefix}_generate_{fn}` for each decoder function (kiln.codegen.host_generate)."""
        out: list[str] = []
        for name, signature in self.metadata.get("functions", {}).items():
            if signature.get("generate_symbol"):  # kiln.codegen.naming.function_signature
                layout = decoder_layout(signature)
                assert isinstance(layout, DecoderLayout), layout
                out += generate_entry(self.prefix, self.ns, name, layout,
                                      signature.get("last_position"))
        return out

    def swap_config(self) -> list[str]:
        """The #defines of kiln_swap.c (`{prefix}_swap_weights` and the call guard), for a
        library with constants."""
        if not self.metadata.get("swap"):
            return []
        symbols = swap_symbols(self.prefix)
        return ["#define KILN_HOST_SWAP 1",
                *(f"#define KILN_SWAP_{k.upper()} {symbols[v]}" for k, v in (
                    ("weights", "symbol"), ("weight", "weight_symbol"), ("program", "program"),
                    ("names", "names"), ("run", "run"), ("pause", "pause"),
                    ("resume", "resume")))]

    def profile_config(self) -> list[str]:
        """The #defines of kiln_host.c's profiling counters (none without profile sites)."""
        sites = self.metadata.get("profile", {}).get("sites", [])
        if not sites:
            return []
        functions = ", ".join(c_string_literal(s["function"]) for s in sites)
        kernels = ", ".join(c_string_literal(s["kernel"] or "") for s in sites)
        return [f"#define KILN_HOST_PROFILE {len(sites)}",
                *(f"#define KILN_PROFILE_{n.upper()} {profile_symbol(self.prefix, 'profile_' + n)}"
                  for n in ("start", "stop", "read", "reset")),
                f"#define KILN_HOST_PROFILE_FUNCTIONS {{{functions}}}",
                f"#define KILN_HOST_PROFILE_KERNELS {{{kernels}}}"]

    def kernel_prototype(self, name: str, fn: PrimFunc) -> str:
        """The raw kernel's declaration, with kernels.c's parameter types."""
        quals = self.quals[name]
        params = [f"{param_ctype(p, i, quals)} p{i}" for i, p in enumerate(fn.params)]
        return (f"KILN_HIDDEN int32_t {kernel_symbol(self.prefix, name)}"
                f"({', '.join(params) or 'void'});")

    def entry(self, name: str, fn: PrimFunc) -> list[str]:
        """The packed entry of `name`: checks in docs/abi.md order, then the kernel call;
        for a graph function with symbolic dimensions also its output-shapes entry."""
        dims = graph_dims(fn)
        runtime = runtime_dims(fn)  # data-dependent sizes: written back after the call
        packed = packed_params(fn)
        terminable = terminate_flag(fn) is not None
        p = CPrinter()
        names = NameScope(self.reserved | {"args", "type_codes", "num_args", "status", "fn"})
        p.line(f"/* {c_comment(f'{name}({describe_params(fn)})')} */")
        p.line(f"KILN_EXPORT int32_t {entry_symbol(self.prefix, name)}"
               "(const KilnValue* args, const int32_t* type_codes,")
        p.line("    int32_t num_args) {")
        with p.indented():
            args = self.prologue(p, names, name, packed, ("args", "type_codes"),
                                 terminable=terminable)
            flag = self.terminate_argument(p, names, len(packed)) if terminable else ""
            call_args = list(args.call_args)
            bound: dict[str, str] = {}
            if args.symbolic:
                bound = emit_binding(p, names, name, fn, args.tensors, args.given)
            values = ""
            if runtime:
                values = names.fresh("runtime_dims")
                p.line(f"int64_t {values}[{len(runtime)}] = {{0}};")
                call_args.append(values)
            if terminable:
                call_args.append(flag)
            call_args += [bound[d.name] for d in dims]
            symbol = kernel_symbol(self.prefix, name)
            # The call guard of kiln_swap.c: a swap installs while no kernel runs.
            p.line("KILN_HOST_CALL_ENTER();")
            p.line(f"int32_t status = {symbol}({', '.join(call_args)});")
            p.line("KILN_HOST_CALL_LEAVE();")
            size, exact = workspace_bytes(self.mod, name)
            # Report a size only when it is the one workspace size that can have failed.
            reported = size if exact else 0
            if runtime:
                with p.block("if (status == 0)"):
                    self.write_runtime_shapes(p, names, fn, len(packed), values, bound)
            p.line(f"return status == 0 ? 0 : {_NS}kernel_failed(fn, status, {reported});")
        p.line("}")
        if dims:
            p.line("")
            self.output_shapes_entry(p, name, fn, packed)
        return p.lines

    def write_runtime_shapes(self, p: CPrinter, names: NameScope, fn: PrimFunc, n_packed: int,
                             values: str, bound: Mapping[str, str]) -> None:
        """After a successful call: each result extent sized by a data-dependent dimension
        goes into the caller's DLTensor `shape` (docs/abi.md, "Data-dependent output
        sizes"); the kernel wrote the dimensions' values into `values`."""
        runtime = runtime_dims(fn)
        n_out = int(fn.attrs.get(ATTR_NUM_OUTPUTS, 0))
        local = {**bound, **{n: f"{values}[{j}]" for j, (n, _, _) in enumerate(runtime)}}
        status = names.fresh("shape_status")
        p.line(f"int32_t {status} = 0;")
        done: set[tuple[int, int]] = set()
        for _, _, places in runtime:
            for k, axis, actual in places:
                if (k, axis) in done:
                    continue
                done.add((k, axis))
                arg = n_packed - n_out + k
                expr = dim_expr.to_c(dim_expr.parse(actual), local, status)
                p.line(f"((DLTensor*)args[{arg}].v_handle)->shape[{axis}] = {expr};")
        p.line(f"(void){status};")

    def output_shapes_entry(self, p: CPrinter, name: str, fn: PrimFunc,
                            packed: Sequence[Buffer | Var]) -> None:
        """`{prefix}_output_shapes_{name}(args, type_codes, num_args, shapes)`: given the
        inputs only, run the entry's checks on them and write every result's dims, one
        after the other, into `shapes` (docs/abi.md, "Symbolic shapes")."""
        n_out = int(fn.attrs.get(ATTR_NUM_OUTPUTS, 0))
        inputs, outputs = packed[:len(packed) - n_out], packed[len(packed) - n_out:]
        names = NameScope(self.reserved | {"args", "type_codes", "num_args", "shapes", "fn"})
        p.line(f"/* The result shapes of {c_comment(name)} for these inputs. */")
        p.line(f"KILN_EXPORT int32_t {output_shapes_symbol(self.prefix, name)}"
               "(const KilnValue* args,")
        p.line("    const int32_t* type_codes, int32_t num_args, int64_t* shapes) {")
        with p.indented():
            args = self.prologue(p, names, name, inputs, ("args", "type_codes", "shapes"))
            bound = emit_binding(p, names, name, fn, args.tensors, args.given)
            for local in args.call_args:
                p.line(f"(void){local};")
            status = names.fresh("status")
            p.line(f"int32_t {status} = 0;")
            k = 0
            for out in outputs:
                assert isinstance(out, Buffer)
                for d in out.shape:
                    p.line(f"shapes[{k}] = {dim_c(d, bound, status)};")
                    if not isinstance(d, int | Var):  # an expression: a size, or an error
                        with p.block(f"if ({dim_check('fn', status, f'shapes[{k}]', d)} != 0)"):
                            p.line("return KILN_HOST_ARGUMENT_ERROR;")
                    k += 1
            p.line(f"(void){status};")
            p.line("return 0;")
        p.line("}")

    def prologue(self, p: CPrinter, names: NameScope, name: str,
                 params: Sequence[Buffer | Var], pointers: Sequence[str], *,
                 terminable: bool = False) -> _Arguments:
        """The start of an entry: its name, locals, and checks 1-6 of docs/abi.md in order
        (`pointers`: the pointer parameters that must not be NULL; `terminable`: one more
        argument, the caller's terminate flag, may follow)."""
        n = len(params)
        self.string_array(p, "fn", name)
        args = self.arguments(p, names, params)
        p.extend(args.decls)
        p.line(f"{_NS}error[0] = '\\0';")
        with p.block(f"if (!{_NS}cpu_ok(fn))"):
            p.line("return KILN_HOST_ARGUMENT_ERROR;")
        noun = "argument" if n == 1 else "arguments"
        count = f"num_args != {n} && num_args != {n + 1}" if terminable else f"num_args != {n}"
        with p.block(f"if ({count})"):
            p.line(f'return {_NS}fail("%s: expected {n} {noun}, got %d", fn, (int)num_args);')
        if n or len(pointers) > 2:
            which = ", ".join(pointers[:-1]) + " or " + pointers[-1]
            with p.block(f"if ({' || '.join(f'{q} == NULL' for q in pointers)})"):
                p.line(f'return {_NS}fail("%s: {which} is NULL", fn);')
            # Argument by argument, each check in order; the first failure wins.
            or_return(p, args.checks)
        else:
            p.line("(void)args;")
            p.line("(void)type_codes;")
        return args

    @staticmethod
    def terminate_argument(p: CPrinter, names: NameScope, index: int) -> str:
        """The kernel's terminate flag: packed argument `index`, the caller's, when given
        (checked), else host.c's flag that is never set (docs/abi.md, "Stopping a call")."""
        flag = names.fresh("terminate")
        p.line(f"void* {flag} = NULL;")
        with p.block(f"if ({_NS}terminate_flag(&{flag}, fn, {index}, args, type_codes, "
                     "num_args) != 0)"):
            p.line("return KILN_HOST_ARGUMENT_ERROR;")
        return flag

    def arguments(self, p: CPrinter, names: NameScope,
                  params: Sequence[Buffer | Var]) -> _Arguments:
        """The locals, checks and kernel arguments of an entry's packed arguments."""
        args = _Arguments()
        for i, q in enumerate(params):
            local = names.fresh(q.name)
            param_name = c_string_literal(q.name)
            if len(utf8(q.name)) > _INLINE_NAME:
                param_name = names.fresh(f"{q.name}_name")
                self.string_array(p, param_name, q.name)
            where = f"fn, {i}, {param_name}, args[{i}], type_codes[{i}]"
            if isinstance(q, Buffer):
                code, bits, _ = dl_type(q.dtype)
                shape_arg = "NULL"
                if not is_static(q.shape):  # checked once the dimensions are bound
                    args.symbolic = True
                    args.tensors.append(TensorArg(i, q, param_name))
                elif q.shape:
                    shape_arg = names.fresh(f"{q.name}_shape")
                    p.line(f"static const int64_t {shape_arg}[{len(q.shape)}] = "
                           f"{{{', '.join(str(d) for d in q.shape)}}};")
                args.decls.append(f"void* {local} = NULL;")
                args.checks.append(f"{_NS}tensor(&{local}, {where}, {len(q.shape)}, "
                                   f"{shape_arg}, {code}, {bits}, {dt.itemsize(q.dtype)})")
                args.call_args.append(local)  # void* converts to the kernel's pointer type
            elif dt.is_float(q.dtype):
                args.decls.append(f"double {local} = 0;")
                args.checks.append(f"{_NS}float(&{local}, {where})")
                args.call_args.append(self.float_scalar(q.dtype, local))
            else:
                lo, hi = SCALAR_RANGES[q.dtype]
                hi = min(hi, INT64_MAX)  # values cross as int64_t
                args.decls.append(f"int64_t {local} = 0;")
                args.checks.append(f"{_NS}int(&{local}, {where}, {int64_literal(lo)}, "
                                   f"{int64_literal(hi)}, {c_string_literal(q.dtype)})")
                ctype = C_TYPE_NAMES[q.dtype]
                args.call_args.append(local if ctype == "int64_t" else f"({ctype}){local}")
                args.given[q.name] = (local, i, param_name)
        return args

    @staticmethod
    def string_array(p: CPrinter, name: str, text: str) -> None:
        """`static const char name[] = ...;` holding `text` (kiln.escape.c_char_array)."""
        init = c_char_array(text)
        if len(init) == 1:
            p.line(f"static const char {name}[] = {init[0]};")
            return
        p.line(f"static const char {name}[] =")
        with p.indented():
            p.extend(init[:-1])
            p.line(init[-1] + ";")

    def float_scalar(self, dtype: str, local: str) -> str:
        if dtype == "float16":
            return f"{self.helper('kiln_f16_from_double')}({local})"
        if dtype == "bfloat16":  # through float32, like the IR interpreter
            return f"{self.helper('kiln_bf16_from_double')}((float){local})"
        return f"({C_TYPE_NAMES[dtype]}){local}"

    def accessors(self) -> list[str]:
        meta = json.dumps(self.metadata, sort_keys=False, ensure_ascii=False,
                          separators=(",", ":"))
        p = CPrinter()
        self.string_array(p, f"{self.ns}metadata_json", meta)
        out = [*p.lines,
            "",
            "/* The message of the last failed call on this thread (\"\" after a success). */",
            f"KILN_EXPORT const char* {last_error_symbol(self.prefix)}(void) {{",
            "  return kiln_host_error;",
            "}",
            "",
            "/* Library metadata JSON (docs/abi.md). */",
            f"KILN_EXPORT const char* {metadata_symbol(self.prefix)}(void) {{",
            f"  return {self.ns}metadata_json;",
            "}",
        ]
        return out


@dataclass
class _Arguments:
    """What `HostPrinter.arguments` gathers for an entry."""

    decls: list[str] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    call_args: list[str] = field(default_factory=list)
    tensors: list[TensorArg] = field(default_factory=list)  # those of symbolic shape
    given: dict[str, tuple[str, int, str]] = field(default_factory=dict)  # int scalars
    symbolic: bool = False


def host_source(mod: IRModule, *, prefix: str, metadata: Mapping[str, Any],
                cpu_features: Sequence[CPUFeature] = ()) -> str:
    """The text of host.c for `mod` (see the module docstring); `cpu_features` (rows of
    kiln.runtime.cpu_features.TABLES) are checked on the first call of any entry."""
    return HostPrinter(mod, prefix, metadata, cpu_features).render()


def codegen_host(
    mod: IRModule, *, prefix: str, metadata: Mapping[str, Any],
    cflags: Sequence[str] | None = None, cpu_features: Sequence[CPUFeature] = (),
) -> Any:
    """`Artifact("host", "native", "host.c", ...)`: packed entries, last error, metadata.

    `metadata` is `kiln.codegen.naming.library_metadata(mod, prefix)`; `cflags`
    defaults to `-std=c11 -O2 -fPIC` (backends pass their target's flags). When
    a kernel has a parallel loop, host.c also holds the thread pool and its
    metadata asks the linker for `-pthread` (not with `-DKILN_NO_THREADS`, which
    makes parallel loops serial for firmware).
    """

    flags = list(cflags if cflags is not None else DEFAULT_HOST_CFLAGS)
    meta: dict[str, Any] = {"cflags": flags}
    if has_parallel_loops(mod) and "-DKILN_NO_THREADS" not in flags:
        meta["libs"] = list(PTHREAD_LIBS)
    prelude, model = HostPrinter(mod, prefix, metadata, cpu_features).render_parts()
    # host.c's first bytes, its #defines and kiln_host.c: compiled apart, once for every
    # model that shares them (kiln.runtime.native.PRELUDE_KEY).
    meta[PRELUDE_KEY] = len(prelude.encode("utf-8"))
    return Artifact("host", "native", HOST_FILE, (prelude + model).encode("utf-8"), meta)


__all__ = ["codegen_host", "host_source", "workspace_bytes"]

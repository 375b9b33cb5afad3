"""Lower the tensor-level functions of an IRModule to one llvmlite module.

Each PrimFunc `f` becomes the raw kernel of docs/abi.md:

    i32 @{prefix}_kernel_f(ptr %A, ptr %B, i64 %n, ...)

one argument per IR parameter (a buffer is a pointer to its elements, a
scalar its C type), returning 0 or an error code (`ERROR_CODES`). The node
-> emitter dispatch tables `EXPR_RULES` and `STMT_RULES` are the whole
translation; docs/codegen-llvm.md describes each rule.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llvmlite import ir
from llvmlite.ir.values import MDValue

from kiln._registry import suggest
from kiln.codegen.cfamily.signature import check_shape_vars
from kiln.codegen.constants import CONST_ALIGN, ConstantPool
from kiln.codegen.llvm import arith
from kiln.codegen.llvm.amx import amx_helper
from kiln.codegen.llvm.arith import MathContext
from kiln.codegen.llvm.decls import ExternModule, declare
from kiln.codegen.llvm.dim_size import checked_dim
from kiln.codegen.llvm.dtypes import (
    I1,
    I8,
    I32,
    I64,
    PTR,
    c_type,
    compute_type,
    const_value,
    is_half,
    storage_type,
)
from kiln.codegen.llvm.float16 import HalfConversions
from kiln.codegen.llvm.float_range import fits_int32
from kiln.codegen.llvm.intrinsics import emit_intrinsic
from kiln.codegen.llvm.kernel_keys import KernelGroup, group_key, standalone_groups
from kiln.codegen.llvm.vector_loops import emit_vector_loop
from kiln.codegen.naming import (
    const_table_symbol,
    consts_symbol,
    kernel_symbol,
    parallel_for_symbol,
    profile_symbol,
)
from kiln.errors import CompileError, IRError
from kiln.escape import c_identifier, is_c_identifier
from kiln.ir import dtype as dt
from kiln.ir.aliasing import analyze
from kiln.ir.amx import is_amx_call
from kiln.ir.attrs import ATTR_EXTERNAL, ATTR_NO_SLP, ATTR_PARALLEL_OF
from kiln.ir.kernel_errors import (
    ERROR_OUT_OF_MEMORY,
    ERROR_SIZE_OVERFLOW,
    ERROR_TERMINATED,
    KERNEL_ERRORS,
)
from kiln.ir.module import IRModule
from kiln.ir.outlined import (
    COUNT_ARG,
    FIRST_CAPTURE,
    Launch,
    kernel_funcs,
    outlined_launches,
)
from kiln.ir.same_address import SAME_ADDRESS
from kiln.ir.shape_expr import dim_product, dim_vars, to_dim_expr
from kiln.ir.tensor import (
    CHECK_INTRINSIC,
    PREFETCH_INTRINSIC,
    PROFILE_INTRINSICS,
    TERMINATE_CHECK,
    Allocate,
    AllocConst,
    BinaryOp,
    Buffer,
    CallExtern,
    CallFunc,
    Cast,
    Compare,
    Const,
    DeclBuffer,
    Evaluate,
    For,
    IfThenElse,
    Intrin,
    LetStmt,
    Load,
    PrimExpr,
    PrimFunc,
    Reinterpret,
    Select,
    SeqStmt,
    Stmt,
    Store,
    UnaryOp,
    Var,
    While,
    reinterpret_fault,
)
from kiln.ir.visitor import iter_stmts

# Non-zero kernel results; the host entry (kiln/codegen/host.py) maps them to
# messages. A failing CallFunc passes its callee's code through unchanged.
ERROR_CODES = KERNEL_ERRORS

# Alignment of stack buffers (a cache line: lets the vectorizer use aligned access).
LOCAL_ALIGN = 64

# A function making more kernel calls than this (a lowered graph `main` of a big model)
# calls its kernels without inlining them: inlining thousands of loop nests into one
# function makes LLVM's optimizer superlinear (2,000 calls: ~25 s instead of ~2 s), and a
# kernel's loops gain nothing from being inlined into a sequence of calls.
MAX_INLINED_CALL_SITES = 32


@dataclass(frozen=True)
class LoweringOptions:
    """What the lowering needs to know about the target and the library."""

    prefix: str
    triple: str = ""
    data_layout: str = ""
    # Hidden visibility for kernels and the constants symbol: right for a
    # shared library (nothing internal is exported), wrong for a JIT whose
    # constants live at an arbitrary address (it needs a GOT-style access).
    hidden: bool = True
    pointer_bits: int = 64
    fast_math: bool = False
    native_roundeven: bool = True
    # The integer dot-product family of the target's ISA (`dot4_u8s8`, int_dot.py).
    int8_dot: str | None = None
    # Lanes of the target's bfloat16 dot product (`dot2_bf16`, bf16_dot.py; 0: none).
    bf16_dot: int = 0
    # float16 widens with `fpext` (F16C's vcvtph2ps) rather than integer IR (float16.py).
    native_f16: bool = False
    # Kernels read each constant's address from `{prefix}_const_table` (a slot per pool
    # entry, kiln.codegen.const_table) instead of `{prefix}_consts + offset`: the loader
    # may point a slot at another library's copy of equal bytes (docs/runtime.md).
    const_table: bool = False
    # Whether the target has AMX-BF16: the AMX tile calls (kiln.ir.amx, amx.py) need it.
    amx_bf16: bool = False
    # ABIs that pass 32-bit integers sign-extended in 64-bit registers (RISC-V 64...).
    sext_int32: bool = False
    # Function attributes ("target-cpu", "target-features", "prefer-vector-width").
    function_attrs: tuple[tuple[str, str], ...] = ()
    # Whether kernels marked `kiln.no_slp` get `noimplicitfloat` (`keeps_slp_off`): where LLVM
    # was seen to leave explicit vector code alone under it (MachineConfig.no_slp).
    no_slp: bool = False
    # Parallel loops call `{prefix}_parallel_for`: host.c's thread pool (False), or
    # a serial definition emitted into this module (True: the JIT has no host.c).
    serial_parallel_for: bool = False
    # The heap allocator of `global` buffers: the C library's (JIT, wasm), or host.c's
    # caching `{prefix}_workspace_alloc`/`_free` (declared hidden; docs/abi.md,
    # "Heap workspaces").
    heap_functions: tuple[str, str] = ("malloc", "free")  # C_LIBRARY_HEAP
    # External functions declared under other names (kiln.codegen.llvm.decls.ExternModule):
    # requested name (`llvm.exp.f32`, `expf`) -> declared name (libdevice's `__nv_expf`).
    extern_names: Mapping[str, str] = field(default_factory=dict)


C_LIBRARY_HEAP = ("malloc", "free")

# Fast-math flags used when the target enables fast-math: everything except
# nnan/ninf, so isnan/isinf and NaN propagation keep working.
FAST_MATH_FLAGS = ("reassoc", "contract", "arcp", "afn", "nsz")


class _KernelAttributes(ir.values.FunctionAttributes):
    """Function attributes plus LLVM string attributes such as "target-cpu"="znver5"."""

    def __init__(self, strings: tuple[tuple[str, str], ...]) -> None:
        super().__init__()
        self.strings = strings

    def _to_list(self, ret_type: ir.Type) -> list[str]:
        out: list[str] = super()._to_list(ret_type)
        out.extend(f'"{key}"="{value}"' for key, value in self.strings)
        return out


class _LoopID(MDValue):
    """A distinct, self-referential `!llvm.loop` node (llvmlite has no such node)."""

    def __init__(self, module: ir.Module, properties: list[ir.Value]) -> None:
        super().__init__(module, properties, name=str(len(module.metadata)))

    def descr(self, buf: list[str]) -> None:
        ops = ", ".join([self.get_reference()] + [p.get_reference() for p in self.operands])
        buf += (f"distinct !{{ {ops} }}", "\n")

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


class _IndirectCallee:
    """A call target held in an opaque `ptr` value, with its function type.

    llvmlite reads a callee's type from its pointer type, which an opaque
    pointer lacks; the printed call only needs the reference and the type.
    """

    def __init__(self, value: ir.Value, ftype: ir.FunctionType) -> None:
        self.value = value
        self.type = value.type
        self.function_type = ftype

    def get_reference(self) -> str:
        return str(self.value.get_reference())


@dataclass
class LoweredModule:
    """The llvmlite module and facts about it the codegen reports."""

    module: ir.Module
    kernels: dict[str, str]  # IR function name -> kernel symbol (outlined loops excluded)
    externs: dict[str, Any] = field(default_factory=dict)  # extern name -> dependency JSON
    uses_constants: bool = False
    # Kernel groups keyed before lowering (kiln.codegen.llvm.kernel_keys), and those of
    # them `reuse` took: declared, not lowered
    keyed: list[KernelGroup] = field(default_factory=list)
    reused: list[KernelGroup] = field(default_factory=list)


# Whether the caller has the code of a keyed kernel group (kiln.codegen.llvm.kernel_keys),
# so that the group is declared only, not lowered.
Reuse = Callable[[KernelGroup], bool]


def lower_module(mod: IRModule, pool: ConstantPool, options: LoweringOptions,
                 reuse: Reuse | None = None, context: tuple[str, ...] = ()) -> LoweredModule:
    """Translate every PrimFunc of `mod` into one LLVM module (see the module docstring).
    With `reuse`, each kernel that stands alone in its part is keyed first (`context`:
    the machine and versions, beside `options`) and left declared where `reuse` says
    its code is at hand."""
    return _ModuleLowering(mod, pool, options).run(reuse, context)


# ======================================================================= module


def _opaque(value: Any) -> Any:
    """Retype an llvmlite value from a typed pointer (`[n x T]*`) to the opaque `ptr`.

    llvmlite still types allocas and globals with typed pointers; every buffer
    address in a kernel is an opaque `ptr`, accessed with explicit element types.
    """
    value.type = PTR
    return value


class _ModuleLowering:
    def __init__(self, mod: IRModule, pool: ConstantPool, options: LoweringOptions) -> None:
        graph = sorted(mod.graph_funcs())
        if graph:
            raise CompileError(
                f"the llvm backend compiles tensor-level functions only; graph-level "
                f"functions {graph} were not lowered (run the graph pipeline first)")
        # Parallel loops were outlined (the pass outline-parallel-loops) into internal
        # loop-body kernels run by `{prefix}_parallel_for`.
        outlined = outlined_launches(mod, "llvm codegen")
        self.public = set(kernel_funcs(mod))
        self.launches: dict[CallFunc, Launch] = outlined.launches
        self.bodies = outlined.bodies
        self.trampolines: dict[str, ir.Function] = {}
        self._parallel_for: ir.Function | None = None
        mod = outlined.mod
        self.mod = mod
        self.pool = pool
        self.options = options
        self.module = ExternModule("kiln", options.extern_names)
        self.module.triple = options.triple
        self.module.data_layout = options.data_layout
        self.math = MathContext(
            self.module, HalfConversions(self.module, options.native_f16),
            FAST_MATH_FLAGS if options.fast_math else (), options.native_roundeven,
            int8_dot=options.int8_dot, bf16_dot=options.bf16_dot)
        self.size_t = ir.IntType(options.pointer_bits)
        self.kernels: dict[str, ir.Function] = {}
        self.funcs = mod.prim_funcs()
        # kernels that hand loops to the thread pool: never inlined (`never_inlined`)
        self.dispatchers = {str(self.funcs[b].attrs.get(ATTR_PARALLEL_OF)) for b in self.bodies}
        self.externs: dict[str, Any] = {}
        self._consts: ir.GlobalVariable | None = None
        self._table: ir.GlobalVariable | None = None

    def run(self, reuse: Reuse | None = None, context: tuple[str, ...] = ()) -> LoweredModule:
        self.aliasing = analyze(dict(self.funcs))
        for name, fn in self.funcs.items():
            self.kernels[name] = self._declare_kernel(name, fn, self.aliasing.noalias[name])
        keyed = self._keyed(context) if reuse is not None else []
        reused = [group for group in keyed if reuse is not None and reuse(group)]
        skipped = {name for group in reused for name in group.functions}
        for name in self.bodies:
            if name not in skipped:
                self.trampolines[name] = self._trampoline(self.kernels[name],
                                                          self.keeps_slp_off(name))
        for name, fn in self.funcs.items():
            if name in skipped:
                self._reads_constants(fn)
            elif not fn.attrs.get(ATTR_EXTERNAL):  # else another codegen defines it
                FunctionLowering(self, name, fn, self.kernels[name]).run()
        return LoweredModule(
            self.module, {n: f.name for n, f in self.kernels.items() if n in self.public},
            self.externs, self._consts is not None or self._table is not None, keyed, reused)

    def _keyed(self, context: tuple[str, ...]) -> list[KernelGroup]:
        """The kernel groups keyed before lowering (kiln.codegen.llvm.kernel_keys)."""
        def facts(name: str) -> str:
            return (f"noalias={sorted(self.aliasing.noalias[name])} "
                    f"no_slp={self.keeps_slp_off(name)}")

        out, seen = [], set()
        ctx = (repr(self.options), *context)
        for names in standalone_groups(self.funcs, self.public, _inlines_calls,
                                       self.never_inlined):
            if any(self.funcs[n].attrs.get(ATTR_EXTERNAL) for n in names):
                continue
            key = group_key(names, self.funcs, facts, self.pool, ctx)
            if key is None or key in seen:  # a second copy is lowered (its own part key)
                continue
            seen.add(key)
            out.append(KernelGroup(names, key))
        return out

    def _reads_constants(self, fn: PrimFunc) -> None:
        """What lowering `fn` does to the module beside its code: the constants' global."""
        if any(isinstance(s, AllocConst) for s in iter_stmts(fn.body)):
            self.constants_global()

    def _declare_kernel(self, name: str, fn: PrimFunc, noalias: frozenset[int]) -> ir.Function:
        seen: set[int] = set()
        arg_types: list[ir.Type] = []
        for p in fn.params:
            if id(p) in seen:
                raise CompileError(f"function {name!r}: parameter {p.name!r} is listed twice")
            seen.add(id(p))
            arg_types.append(PTR if isinstance(p, Buffer) else c_type(p.dtype))
        check_shape_vars("llvm codegen", name, fn)
        irfn = ir.Function(self.module, ir.FunctionType(I32, arg_types),
                           kernel_symbol(self.options.prefix, name))
        if name in self.bodies:
            irfn.linkage = "internal"  # an outlined parallel loop: private to the module
        elif self.options.hidden:
            irfn.linkage = "hidden"  # printed as the visibility of an external definition
        irfn.attributes = _KernelAttributes(self.options.function_attrs)
        irfn.attributes.add("nounwind")
        if self.keeps_slp_off(name):
            irfn.attributes.add("noimplicitfloat")
        if self.never_inlined(name):
            irfn.attributes.add("noinline")
        if self.options.sext_int32:
            irfn.return_value.add_attribute("signext")
        used: set[str] = set()
        for index, (arg, p) in enumerate(zip(irfn.args, fn.params)):
            hint = c_identifier(p.name)
            if hint in used:  # two names may spell the same identifier
                hint = f"arg{index}"
                while hint in used:
                    hint += "_"
            used.add(hint)
            arg.name = hint
            if isinstance(p, Buffer) and index in noalias:
                arg.add_attribute("noalias")
        return irfn

    def never_inlined(self, name: str) -> bool:
        """Whether kernel `name` is `noinline`. Under `keeps_slp_off`: inlined, it would
        pass `noimplicitfloat` on to its caller (LLVM's inliner ORs it in), and the graph
        function and every kernel inlined there would lose SLP. A kernel that hands its
        loops to the thread pool: inlined, it would save one call per run of a kernel
        whose work is in its outlined loop bodies, and it would be compiled in the graph
        function's part, model by model; not inlined, it is a part of its own that the
        kernel cache shares with every model of the same kernel (a small model's stem
        max pool with a large one's: docs/performance.md, round twenty-four)."""
        return self.keeps_slp_off(name) or name in self.dispatchers

    def keeps_slp_off(self, name: str) -> bool:
        """Whether kernel `name` (or the kernel an outlined loop body `name` came from)
        carries `ATTR_NO_SLP`. It is lowered as LLVM's `noimplicitfloat`, the one
        function attribute LLVM's SLP vectorizer stops at: the kernel's vectors are
        explicit IR vector operations, which the attribute leaves alone (it only keeps
        LLVM from introducing vector or float registers itself: SLP, the loop
        vectorizer, vector memcpy). On x86-64 only (`LoweringOptions.no_slp`)."""
        if not self.options.no_slp:
            return False
        fn = self.funcs[name]
        owner = self.funcs.get(str(fn.attrs.get(ATTR_PARALLEL_OF, name)), fn)
        return bool(fn.attrs.get(ATTR_NO_SLP) or owner.attrs.get(ATTR_NO_SLP))

    # -- parallel loops ----------------------------------------------------------

    def _trampoline(self, body: ir.Function, no_slp: bool = False) -> ir.Function:
        """`i32 @{body}.run(i64 begin, i64 end, ptr context)`, what the thread pool calls:
        loads the captured values from the context struct and calls the loop body (with
        `no_slp`, under `noimplicitfloat` as the body is: `keeps_slp_off`)."""
        fn = ir.Function(self.module, ir.FunctionType(I32, [I64, I64, PTR]), f"{body.name}.run")
        fn.linkage = "internal"
        # The kernels' CPU and features: the body is inlined here.
        fn.attributes = _KernelAttributes(self.options.function_attrs)
        fn.attributes.add("nounwind")
        if no_slp:
            fn.attributes.add("noimplicitfloat")
        begin, end, context = fn.args
        begin.name, end.name, context.name = "begin", "end", "context"
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        struct = self.context_type(body)
        values = [begin, end]
        for k, arg in enumerate(body.args[FIRST_CAPTURE:]):
            slot = b.gep(context, [ir.Constant(I32, 0), ir.Constant(I32, k)], inbounds=True,
                         source_etype=struct)
            values.append(b.load(slot, typ=arg.type))
        b.ret(b.call(body, values))
        return fn

    @staticmethod
    def context_type(body: ir.Function) -> ir.LiteralStructType:
        """The struct holding a loop body's captured values (its parameters after begin, end)."""
        return ir.LiteralStructType([a.type for a in body.args[FIRST_CAPTURE:]])

    def parallel_for(self) -> ir.Function:
        """`i32 @{prefix}_parallel_for(i64 n, ptr body, ptr context)`: host.c's thread pool
        (declared hidden), or for the JIT a serial definition in this module."""
        if self._parallel_for is None:
            fn = ir.Function(self.module, ir.FunctionType(I32, [I64, PTR, PTR]),
                             parallel_for_symbol(self.options.prefix))
            if self.options.serial_parallel_for:
                fn.attributes = _KernelAttributes(self.options.function_attrs)
            fn.attributes.add("nounwind")
            if self.options.serial_parallel_for:
                fn.linkage = "internal"
                n, body, context = fn.args
                entry = fn.append_basic_block("entry")
                run = fn.append_basic_block("run")
                empty = fn.append_basic_block("empty")
                b = ir.IRBuilder(entry)
                b.cbranch(b.icmp_signed(">", n, ir.Constant(I64, 0)), run, empty)
                b.position_at_end(run)
                callee = _IndirectCallee(body, ir.FunctionType(I32, [I64, I64, PTR]))
                b.ret(b.call(callee, [ir.Constant(I64, 0), n, context]))
                b.position_at_end(empty)
                b.ret(ir.Constant(I32, 0))
            elif self.options.hidden:
                fn.linkage = "hidden"  # declared: host.c defines it in the same library
            self._parallel_for = fn
        return self._parallel_for

    def heap_alloc(self) -> ir.Function:
        """`ptr @alloc(size_t)` of LoweringOptions.heap_functions."""
        return self._heap_function(self.options.heap_functions[0], PTR, [self.size_t])

    def heap_free(self) -> ir.Function:
        """`void @free(ptr)` of LoweringOptions.heap_functions."""
        return self._heap_function(self.options.heap_functions[1], ir.VoidType(), [PTR])

    def _heap_function(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        fn = declare(self.module, name, ret, args)
        if self.options.heap_functions != C_LIBRARY_HEAP and self.options.hidden:
            fn.linkage = "hidden"  # host.c defines it in the same library
        return fn

    # -- module-level objects --------------------------------------------------

    def _external_data(self, name: str, element: ir.Type, align: int) -> ir.GlobalVariable:
        gv = ir.GlobalVariable(self.module, ir.ArrayType(element, 0), name)
        gv.linkage = "external"
        if self.options.hidden:
            gv.storage_class = "hidden"
        gv.align = align
        return gv

    def consts_global(self) -> ir.GlobalVariable:
        """`@{prefix}_consts`: the external, 64-byte aligned constants blob."""
        if self._consts is None:
            gv = self._external_data(consts_symbol(self.options.prefix), I8, CONST_ALIGN)
            gv.global_constant = True
            self._consts = _opaque(gv)
        return self._consts

    def const_table_global(self) -> ir.GlobalVariable:
        """`@{prefix}_const_table`: the external, writable table of constant addresses."""
        if self._table is None:
            self._table = self._external_data(const_table_symbol(self.options.prefix), PTR, 8)
        return self._table

    def constants_global(self) -> ir.GlobalVariable:
        """The global a kernel reads its constants through: the table of their addresses
        (`const_table` targets, the pool then laid out as one) or the pool itself."""
        if self.options.const_table:
            self.pool.table = True
            return self.const_table_global()
        return self.consts_global()

    def loop_metadata(self, kind: str) -> ir.Value | None:
        """A fresh `!llvm.loop` node for a loop of `kind`, or None for plain loops."""
        if kind == "vectorized":
            props = [self.module.add_metadata([
                ir.MetaDataString(self.module, "llvm.loop.vectorize.enable"),
                ir.Constant(I1, 1)])]
        elif kind == "unrolled":
            props = [self.module.add_metadata([
                ir.MetaDataString(self.module, "llvm.loop.unroll.full")])]
        elif kind == "scalar":
            props = [self.module.add_metadata([
                ir.MetaDataString(self.module, "llvm.loop.vectorize.width"),
                ir.Constant(ir.IntType(32), 1)])]
        else:
            return None
        return _LoopID(self.module, props)

    def extern_ext_attr(self, dtype: str) -> str | None:
        """The C ABI extension attribute of a small integer crossing a call."""
        bits = 8 if dt.is_bool(dtype) else dt.bits(dtype)
        if dt.is_float(dtype) and not is_half(dtype):
            return None
        if bits < 32:
            return "signext" if dt.kind(dtype) == "int" else "zeroext"
        if bits == 32 and self.options.sext_int32 and not dt.is_float(dtype):
            return "signext"
        return None


# ======================================================================= functions


class FunctionLowering:
    """Emits one kernel body. Scopes are structured, so SSA values bind directly."""

    def __init__(self, parent: _ModuleLowering, name: str, fn: PrimFunc,
                 irfn: ir.Function) -> None:
        self.parent = parent
        self.name = name
        self.fn = fn
        self.irfn = irfn
        self.math = parent.math
        self.entry = irfn.append_basic_block("entry")
        self.alloca_b = ir.IRBuilder(self.entry)  # stack slots go in the entry block
        self.body = irfn.append_basic_block("body")
        self.b = ir.IRBuilder(self.body)
        self.scalars: dict[Var, ir.Value] = {}
        self.buffers: dict[Buffer, ir.Value] = {}
        self.heap: list[ir.Value] = []  # live malloc'ed buffers, freed on any exit
        self.readonly: set[Buffer] = set()  # AllocConst buffers and views of them
        # Buffers declared in each open statement list, with their malloc'ed pointer if
        # any: a declaration's scope (and a heap buffer's lifetime) ends with its list.
        self.blocks: list[list[tuple[Buffer, ir.Value | None]]] = []
        # Let variables bound in each open statement list, with the value each hid.
        self.let_blocks: list[list[tuple[Var, ir.Value | None]]] = []
        self.call_attrs = () if _inlines_calls(fn) else ("noinline",)
        # under `noimplicitfloat` (`keeps_slp_off`) LLVM's loop vectorizer does not run
        self.no_slp = parent.keeps_slp_off(name)

    def error(self, message: str) -> CompileError:
        return CompileError(f"llvm codegen, function {self.name!r}: {message}")

    def run(self) -> None:
        for arg, p in zip(self.irfn.args, self.fn.params):
            if isinstance(p, Buffer):
                self.buffers[p] = arg
            else:
                self.scalars[p] = self.from_storage(arg, p.dtype)
        self.block(self.fn.body)
        self.b.ret(ir.Constant(I32, 0))
        self.alloca_b.branch(self.body)

    # -- dispatch ----------------------------------------------------------------

    def expr(self, e: PrimExpr) -> ir.Value:
        rule = EXPR_RULES.get(type(e))
        if rule is None:
            raise self.error(f"no lowering for expression {type(e).__name__}")
        return rule(self, e)

    def stmt(self, s: Stmt) -> None:
        rule = STMT_RULES.get(type(s))
        if rule is None:
            raise self.error(f"no lowering for statement {type(s).__name__}")
        rule(self, s)

    def block(self, s: Stmt) -> None:
        """`s` as a statement list: the declarations in it end where it ends."""
        self.blocks.append([])
        self.let_blocks.append([])
        for item in s.body if isinstance(s, SeqStmt) else (s,):
            self.stmt(item)
        for var, previous in reversed(self.let_blocks.pop()):
            _restore(self.scalars, var, previous)
        for buf, heap_ptr in reversed(self.blocks.pop()):
            del self.buffers[buf]
            self.readonly.discard(buf)
            if heap_ptr is not None:
                self.heap.pop()
                self.b.call(self.parent.heap_free(), [heap_ptr])

    def declare(self, buf: Buffer, ptr: ir.Value, *, heap: bool = False) -> None:
        """Bring `buf` into scope until the enclosing statement list ends."""
        if buf in self.buffers:
            raise self.error(f"buffer {buf.name!r} is declared twice")
        self.buffers[buf] = ptr
        if heap:
            self.heap.append(ptr)
        self.blocks[-1].append((buf, ptr if heap else None))

    # -- memory helpers --------------------------------------------------------------

    def from_storage(self, raw: ir.Value, dtype: str) -> ir.Value:
        """A loaded (or C-passed) value of `dtype` as a compute value."""
        if dt.is_bool(dtype):
            return self.b.icmp_unsigned("!=", raw, ir.Constant(I8, 0))
        if is_half(dtype):
            return self.math.halfs.to_f32(self.b, raw, dtype)
        return raw

    def to_storage(self, value: ir.Value, dtype: str) -> ir.Value:
        """A compute value of `dtype` as stored in memory (or passed to C)."""
        if dt.is_bool(dtype):
            return self.b.zext(value, I8)
        if is_half(dtype):
            return self.math.halfs.from_f32(self.b, value, dtype)
        return value

    def buffer_ptr(self, buf: Buffer) -> ir.Value:
        ptr = self.buffers.get(buf)
        if ptr is None:
            raise self.error(
                f"buffer {buf.name!r} is used outside the scope that defines it "
                "(not a parameter, Allocate, AllocConst or DeclBuffer around this use)")
        return ptr

    def index_i64(self, e: PrimExpr) -> ir.Value:
        """An integer expression widened (or narrowed) to i64 for address arithmetic."""
        if not dt.is_int(e.dtype):
            raise self.error(f"index or size expression has dtype {e.dtype}; "
                             "indices must be integers")
        v = self.expr(e)
        bits = dt.bits(e.dtype)
        if bits == 64:
            return v
        if bits > 64:  # pragma: no cover - no such dtype today
            return self.b.trunc(v, I64)
        return self.b.sext(v, I64) if dt.kind(e.dtype) == "int" else self.b.zext(v, I64)

    def dim_i64(self, d: Any) -> ir.Value:
        if isinstance(d, int):
            return ir.Constant(I64, d)
        if isinstance(d, PrimExpr):
            return self.index_i64(d)
        raise self.error(f"buffer dimension {d!r} is neither an int nor an expression")

    def element_ptr(self, buf: Buffer, indices: tuple[PrimExpr, ...]) -> ir.Value:
        """Address of `buf[indices]`: row-major flattening in i64."""
        if len(indices) != buf.ndim:
            raise self.error(f"buffer {buf.name!r} has {buf.ndim} dimension(s) but is indexed "
                             f"with {len(indices)} index(es)")
        base = self.buffer_ptr(buf)
        if not indices:
            return base
        flat = self.index_i64(indices[0])
        for dim, idx in zip(buf.shape[1:], indices[1:]):
            flat = arith.int_add(self.b, arith.int_mul(self.b, flat, self.dim_i64(dim), ["nsw"]),
                                 self.index_i64(idx), ["nsw"])
        return self.b.gep(base, [flat], inbounds=True, source_etype=storage_type(buf.dtype))

    def byte_size(self, buf: Buffer) -> tuple[ir.Value, ir.Value]:
        """(size of `buf` in bytes as size_t, whether that size is not one).

        A size computed at run time from symbolic dimensions may overflow int64 or be
        negative: computed with kiln_dim.c's checked arithmetic (`checked_dim`), such a
        size sets the flag instead of wrapping, and the caller fails the kernel.
        """
        size_t = self.parent.size_t
        if all(isinstance(d, int) for d in buf.shape):
            return ir.Constant(size_t, buf.nbytes()), ir.Constant(I1, 0)
        nbytes = dim_product((*buf.shape, dt.itemsize(buf.dtype)))
        names = {v.name: self.index_i64(v) for v in dim_vars(nbytes)}
        n, failed = checked_dim(self.b, to_dim_expr(nbytes), names)
        failed = self.b.or_(failed, self.b.icmp_signed("<", n, ir.Constant(I64, 0)))
        if size_t.width < 64:
            too_big = self.b.icmp_signed(">", n, ir.Constant(I64, (1 << size_t.width) - 1))
            return self.b.trunc(n, size_t), self.b.or_(failed, too_big)
        return n, failed

    # -- control helpers ---------------------------------------------------------------

    def return_if(self, failed: ir.Value, code: ir.Value) -> None:
        """If `failed`, free the live heap buffers and return `code`; else continue."""
        err = self.b.append_basic_block("error")
        ok = self.b.append_basic_block("ok")
        self.b.cbranch(failed, err, ok)
        self.b.position_at_end(err)
        free = self.parent.heap_free()
        for ptr in reversed(self.heap):
            self.b.call(free, [ptr])
        self.b.ret(code)
        self.b.position_at_end(ok)

    def as_bool(self, e: PrimExpr) -> ir.Value:
        v = self.expr(e)
        return v if dt.is_bool(e.dtype) else arith.cast(self.math, self.b, v, e.dtype, "bool")

    def same_dtypes(self, what: str, *exprs: PrimExpr) -> str:
        dtypes = {e.dtype for e in exprs}
        if len(dtypes) != 1:
            raise self.error(f"{what}: operand dtypes differ ({', '.join(sorted(dtypes))}); "
                             "insert a Cast")
        return exprs[0].dtype


# ======================================================================= expressions


def _var(fl: FunctionLowering, e: Var) -> ir.Value:
    value = fl.scalars.get(e)
    if value is None:
        raise fl.error(f"variable {e.name!r} is used outside the scope that defines it")
    return value


def _const(fl: FunctionLowering, e: Const) -> ir.Value:
    return const_value(e.value, e.dtype)


def _binary(fl: FunctionLowering, e: BinaryOp) -> ir.Value:
    dtype = fl.same_dtypes(f"binary op '{e.op}'", e.a, e.b)
    x, y = fl.expr(e.a), fl.expr(e.b)
    try:
        return arith.binary(fl.math, fl.b, e.op, dtype, x, y)
    except CompileError as err:
        raise fl.error(str(err)) from None


def _compare(fl: FunctionLowering, e: Compare) -> ir.Value:
    dtype = fl.same_dtypes(f"comparison '{e.op}'", e.a, e.b)
    return arith.compare(fl.b, e.op, dtype, fl.expr(e.a), fl.expr(e.b))


def _unary(fl: FunctionLowering, e: UnaryOp) -> ir.Value:
    try:
        return arith.unary(fl.math, fl.b, e.op, e.dtype, fl.expr(e.a))
    except CompileError as err:
        raise fl.error(str(err)) from None


def _select(fl: FunctionLowering, e: Select) -> ir.Value:
    fl.same_dtypes("select", e.true_value, e.false_value)
    cond = fl.as_bool(e.cond)
    return fl.b.select(cond, fl.expr(e.true_value), fl.expr(e.false_value))


def _cast(fl: FunctionLowering, e: Cast) -> ir.Value:
    if e.value.dtype == "float32" and dt.is_int(e.dtype) and dt.bits(e.dtype) <= 32 \
            and fits_int32(e.value):
        # a clamped operand (quantization): one conversion instruction
        return arith.bounded_float_to_int(fl.b, fl.expr(e.value), e.dtype)
    return arith.cast(fl.math, fl.b, fl.expr(e.value), e.value.dtype, e.dtype)


def _reinterpret(fl: FunctionLowering, e: Reinterpret) -> ir.Value:
    fault = reinterpret_fault(e.value.dtype, e.dtype)
    if fault is not None:
        raise fl.error(fault)
    return arith.reinterpret(fl.b, fl.expr(e.value), e.dtype)


def _load(fl: FunctionLowering, e: Load) -> ir.Value:
    ptr = fl.element_ptr(e.buffer, e.indices)
    raw = fl.b.load(ptr, typ=storage_type(e.buffer.dtype), align=dt.itemsize(e.buffer.dtype))
    return fl.from_storage(raw, e.buffer.dtype)


def _intrin(fl: FunctionLowering, e: Intrin) -> ir.Value:
    if e.name in PROFILE_INTRINSICS:  # host.c's timers (kiln.ir.profiling)
        timer = declare(fl.parent.module, profile_symbol(fl.parent.options.prefix, e.name),
                        I64, [I64] * len(e.args), what="profiling timer")
        if fl.parent.options.hidden:
            timer.linkage = "hidden"  # declared: host.c defines it in the same library
        return fl.b.call(timer, [fl.expr(a) for a in e.args])
    dtype = fl.same_dtypes(f"intrinsic {e.name}", *e.args)
    args = [fl.expr(a) for a in e.args]
    try:
        return emit_intrinsic(fl.math, fl.b, e.name, dtype, args)
    except CompileError as err:
        raise fl.error(str(err)) from None


def _call_extern(fl: FunctionLowering, e: CallExtern) -> ir.Value:
    if e.name == SAME_ADDRESS:  # no function: the comparison (kiln.ir.same_address)
        a, b = (fl.buffer_ptr(x) for x in e.args if isinstance(x, Buffer))
        return fl.b.zext(fl.b.icmp_unsigned("==", a, b), c_type(e.dtype))
    if is_amx_call(e.name):  # defined in this module (kiln.codegen.llvm.amx)
        return _call_amx(fl, e)
    if not is_c_identifier(e.name):
        raise fl.error(f"external function name {e.name!r} is not a C identifier "
                       "(ASCII letters, digits and _)")
    values: list[ir.Value] = []
    arg_types: list[ir.Type] = []
    arg_attrs: dict[int, tuple[str, ...]] = {}
    for index, a in enumerate(e.args):
        if isinstance(a, Buffer):
            values.append(fl.buffer_ptr(a))
            arg_types.append(PTR)
            continue
        values.append(fl.to_storage(fl.expr(a), a.dtype))
        arg_types.append(c_type(a.dtype))
        ext = fl.parent.extern_ext_attr(a.dtype)
        if ext:
            arg_attrs[index] = (ext,)
    if e.name.startswith(fl.parent.options.prefix):
        raise fl.error(f"external function name {e.name!r} collides with kiln's symbols "
                       f"(prefix {fl.parent.options.prefix!r})")
    ret = c_type(e.dtype)
    try:
        callee = declare(fl.parent.module, e.name, ret, arg_types, what="external function")
    except CompileError as err:
        raise fl.error(str(err)) from None
    for index, attrs in arg_attrs.items():
        for attr in attrs:
            callee.args[index].add_attribute(attr)
    dep = e.dependency.to_json() if e.dependency is not None else None
    fl.parent.externs.setdefault(e.name, dep)
    raw = fl.b.call(callee, values, arg_attrs=arg_attrs or None)
    return fl.from_storage(raw, e.dtype)


def _call_amx(fl: FunctionLowering, e: CallExtern) -> ir.Value:
    """An AMX tile call (kiln.ir.amx): buffers by address, integers as i64."""
    if not fl.parent.options.amx_bf16:
        raise fl.error(f"{e.name}: the AMX tile calls need a target with amx-bf16 "
                       "(e.g. -mcpu=sapphirerapids, or -mattr=+amx-tile,+amx-bf16)")
    values: list[ir.Value] = []
    for a in e.args:
        if isinstance(a, Buffer):
            values.append(fl.buffer_ptr(a))
            continue
        v = fl.expr(a)
        values.append(v if v.type == I64 else fl.b.sext(v, I64))
    return fl.b.call(amx_helper(fl.parent.module, e.name), values)


EXPR_RULES: dict[type, Callable[[Any, Any], ir.Value]] = {
    Var: _var,
    Const: _const,
    BinaryOp: _binary,
    Compare: _compare,
    UnaryOp: _unary,
    Select: _select,
    Cast: _cast,
    Reinterpret: _reinterpret,
    Load: _load,
    Intrin: _intrin,
    CallExtern: _call_extern,
}


# ======================================================================= statements


def _inlines_calls(fn: PrimFunc) -> bool:
    """Whether `fn`'s calls may be inlined: at most MAX_INLINED_CALL_SITES of them."""
    return sum(isinstance(x, CallFunc) for x in iter_stmts(fn.body)) <= MAX_INLINED_CALL_SITES


def _store(fl: FunctionLowering, s: Store) -> None:
    if s.buffer in fl.readonly:
        raise fl.error(f"store into constant buffer {s.buffer.name!r}: AllocConst data is "
                       "read-only (it lives in the library's read-only data)")
    if s.value.dtype != s.buffer.dtype:
        raise fl.error(f"store of a {s.value.dtype} value into {s.buffer.dtype} buffer "
                       f"{s.buffer.name!r}; insert a Cast")
    value = fl.to_storage(fl.expr(s.value), s.buffer.dtype)
    ptr = fl.element_ptr(s.buffer, s.indices)
    fl.b.store(value, ptr, align=dt.itemsize(s.buffer.dtype))


def _seq(fl: FunctionLowering, s: SeqStmt) -> None:
    fl.block(s)


def _for(fl: FunctionLowering, s: For) -> None:
    dtype = s.var.dtype
    if not dt.is_int(dtype):
        raise fl.error(f"loop variable {s.var.name!r} has dtype {dtype}; loops count integers")
    if s.start.dtype != dtype or s.extent.dtype != dtype:
        raise fl.error(f"loop {s.var.name!r}: start ({s.start.dtype}) and extent "
                       f"({s.extent.dtype}) must have the loop variable's dtype {dtype}")
    if s.kind == "vector":  # decided by the vectorize-loops pass
        emit_vector_loop(fl, s)
        return
    b = fl.b
    start = fl.expr(s.start)
    end = arith.int_add(b, start, fl.expr(s.extent))
    pre = b.block
    var = c_identifier(s.var.name)  # value names: kiln.escape spells them
    header = b.append_basic_block(f"for.{var}")
    body = b.append_basic_block(f"for.{var}.body")
    latch = b.append_basic_block(f"for.{var}.next")
    exit_ = b.append_basic_block(f"for.{var}.end")
    b.branch(header)
    b.position_at_end(header)
    i = b.phi(compute_type(dtype), name=var)
    i.add_incoming(start, pre)
    signed = dt.kind(dtype) == "int"
    cond = b.icmp_signed("<", i, end) if signed else b.icmp_unsigned("<", i, end)
    b.cbranch(cond, body, exit_)
    b.position_at_end(body)
    previous = fl.scalars.get(s.var)
    fl.scalars[s.var] = i
    fl.block(s.body)
    _restore(fl.scalars, s.var, previous)
    b.branch(latch)
    b.position_at_end(latch)
    step = b.add(i, ir.Constant(i.type, 1), flags=["nsw"] if signed else ["nuw"])
    i.add_incoming(step, latch)
    back = b.branch(header)
    # without LLVM's loop vectorizer (`no_slp`) a request for it would only print "loop
    # not vectorized" warnings
    kind = "serial" if s.kind == "vectorized" and fl.no_slp else s.kind
    md = fl.parent.loop_metadata(kind)
    if md is not None:
        back.set_metadata("llvm.loop", md)
    b.position_at_end(exit_)


def _restore(env: dict[Var, ir.Value], var: Var, previous: ir.Value | None) -> None:
    if previous is None:
        env.pop(var, None)
    else:
        env[var] = previous


def _let(fl: FunctionLowering, s: LetStmt) -> None:
    if s.var.dtype != s.value.dtype:
        raise fl.error(f"let {s.var.name!r}: variable dtype {s.var.dtype} differs from the "
                       f"value's {s.value.dtype}")
    # An SSA value computed here, where the let stands; the variable is known until
    # the enclosing statement list ends (`block`).
    value = fl.expr(s.value)
    fl.let_blocks[-1].append((s.var, fl.scalars.get(s.var)))
    fl.scalars[s.var] = value


def _if(fl: FunctionLowering, s: IfThenElse) -> None:
    cond = fl.as_bool(s.cond)
    b = fl.b
    then = b.append_basic_block("if.then")
    merge = b.append_basic_block("if.end")
    otherwise = b.append_basic_block("if.else") if s.else_body is not None else merge
    b.cbranch(cond, then, otherwise)
    b.position_at_end(then)
    fl.block(s.then_body)
    b.branch(merge)
    if s.else_body is not None:
        b.position_at_end(otherwise)
        fl.block(s.else_body)
        b.branch(merge)
    b.position_at_end(merge)


def _while(fl: FunctionLowering, s: While) -> None:
    # header: test the condition (evaluated afresh each time) -> body -> header.
    b = fl.b
    header = b.append_basic_block("while.cond")
    body = b.append_basic_block("while.body")
    exit_ = b.append_basic_block("while.end")
    b.branch(header)
    b.position_at_end(header)
    b.cbranch(fl.as_bool(s.cond), body, exit_)
    b.position_at_end(body)
    fl.block(s.body)
    b.branch(header)
    b.position_at_end(exit_)


def _allocate(fl: FunctionLowering, s: Allocate) -> None:
    buf = s.buffer
    if buf in fl.buffers:
        raise fl.error(f"buffer {buf.name!r} is allocated twice")
    if buf.scope == "local":
        if not all(isinstance(d, int) for d in buf.shape):
            raise fl.error(f"local buffer {buf.name!r} needs a static shape, got {buf.shape}; "
                           "use scope 'global' for a dynamic size")
        slot = fl.alloca_b.alloca(ir.ArrayType(storage_type(buf.dtype), max(buf.numel(), 1)),
                                  name=c_identifier(buf.name))
        slot.align = LOCAL_ALIGN
        fl.declare(buf, _opaque(slot))
        return
    malloc = fl.parent.heap_alloc()
    size, overflow = fl.byte_size(buf)
    oom = ir.Constant(I32, ERROR_OUT_OF_MEMORY)
    if not isinstance(overflow, ir.Constant):
        fl.return_if(overflow, ir.Constant(I32, ERROR_SIZE_OVERFLOW))
    # malloc(0) may return NULL legitimately: ask for at least one byte.
    one = ir.Constant(fl.parent.size_t, 1)
    size = fl.b.select(fl.b.icmp_unsigned("==", size, ir.Constant(size.type, 0)), one, size)
    ptr = fl.b.call(malloc, [size], name=c_identifier(buf.name))
    fl.return_if(fl.b.icmp_unsigned("==", ptr, ir.Constant(PTR, None)), oom)
    fl.declare(buf, ptr, heap=True)


def _alloc_const(fl: FunctionLowering, s: AllocConst) -> None:
    buf = s.buffer
    try:
        need = buf.nbytes()
    except IRError as err:
        raise fl.error(f"constant buffer {buf.name!r}: {err}") from None
    if s.data.nbytes < need:
        raise fl.error(f"constant buffer {buf.name!r} ({buf.dtype}, shape {buf.shape}) needs "
                       f"{need} bytes but its data has {s.data.nbytes}")
    offset = fl.parent.pool.add(s.data)
    constants = fl.parent.constants_global()
    if fl.parent.options.const_table:
        index = fl.parent.pool.index(s.data)
        slot = fl.b.gep(constants, [ir.Constant(I64, index)],
                        inbounds=True, source_etype=PTR)
        ptr = fl.b.load(slot, name=c_identifier(buf.name), typ=PTR)
        module = fl.parent.module
        ptr.set_metadata("align", module.add_metadata([ir.Constant(I64, CONST_ALIGN)]))
        ptr.set_metadata("nonnull", module.add_metadata([]))
        fl.declare(buf, ptr)
        fl.readonly.add(buf)
        return
    base = constants
    if fl.parent.pool.large:
        # An empty asm hides that the pointer is the symbol's address, so LLVM adds the
        # offset at run time instead of folding it into a 32-bit relocation (+-2 GiB).
        base = fl.b.asm(ir.FunctionType(PTR, [PTR]), "", "=r,0", [base], side_effect=False,
                        name="consts")
    fl.declare(buf, fl.b.gep(base, [ir.Constant(I64, offset)], inbounds=True,
                             source_etype=I8, name=c_identifier(buf.name)))
    fl.readonly.add(buf)


def _decl_buffer(fl: FunctionLowering, s: DeclBuffer) -> None:
    buf, src = s.buffer, s.source
    source = fl.buffer_ptr(src)
    size = dt.itemsize(buf.dtype)
    if not isinstance(s.byte_offset, int):  # laid out at entry (symbolic sizes)
        offset = fl.index_i64(s.byte_offset)
        fl.declare(buf, fl.b.gep(source, [offset], inbounds=True, source_etype=I8,
                                 name=c_identifier(buf.name)))
        if src in fl.readonly:
            fl.readonly.add(buf)
        return
    if s.byte_offset < 0 or s.byte_offset % size:
        raise fl.error(f"view {buf.name!r} of {src.name!r} starts at byte {s.byte_offset}, "
                       f"which is not a non-negative multiple of its element size {size}")
    try:
        end, limit = s.byte_offset + buf.nbytes(), src.nbytes()
    except IRError:
        end = limit = 0  # symbolic sizes: cannot check here
    if end > limit:
        raise fl.error(f"view {buf.name!r} covers bytes [{s.byte_offset}, {end}) but its "
                       f"source {src.name!r} has only {limit}")
    fl.declare(buf, fl.b.gep(source, [ir.Constant(I64, s.byte_offset)], inbounds=True,
                             source_etype=I8, name=c_identifier(buf.name)))
    if src in fl.readonly:
        fl.readonly.add(buf)


def _evaluate(fl: FunctionLowering, s: Evaluate) -> None:
    if isinstance(s.value, Intrin) and s.value.name == CHECK_INTRINSIC:
        # The `check` intrinsic: return its error code when the condition is false.
        cond, code = s.value.args
        assert isinstance(code, Const)
        fl.return_if(fl.b.not_(fl.as_bool(cond)), ir.Constant(I32, int(code.value)))
        return
    if isinstance(s.value, Intrin) and s.value.name == PREFETCH_INTRINSIC:
        # A read prefetch into every cache level (`llvm.prefetch(ptr, rw 0, locality 3,
        # data 1)`: x86 `prefetcht0`); it cannot fault.
        (element,) = s.value.args
        assert isinstance(element, Load)
        ptr = fl.element_ptr(element.buffer, element.indices)
        prefetch = declare(fl.parent.module, "llvm.prefetch.p0", ir.VoidType(),
                           [PTR, I32, I32, I32], what="intrinsic")
        fl.b.call(prefetch, [ptr, *(ir.Constant(I32, v) for v in (0, 3, 1))])
        return
    if isinstance(s.value, Intrin) and s.value.name == TERMINATE_CHECK:
        # The caller's flag, read anew each time: an atomic (monotonic) load, which LLVM
        # neither hoists out of a loop nor merges, since another thread sets the flag.
        (element,) = s.value.args
        assert isinstance(element, Load)
        ptr = fl.element_ptr(element.buffer, element.indices)
        flag = fl.b.load_atomic(ptr, "monotonic", 4, typ=I32)
        fl.return_if(fl.b.icmp_signed("!=", flag, ir.Constant(I32, 0)),
                     ir.Constant(I32, ERROR_TERMINATED))
        return
    fl.expr(s.value)


def _call_func(fl: FunctionLowering, s: CallFunc) -> None:
    callee = fl.parent.funcs.get(s.func)
    if callee is None:
        names = list(fl.parent.funcs)
        raise fl.error(f"CallFunc to unknown function {s.func!r}.{suggest(s.func, names)} "
                       f"Tensor-level functions: {', '.join(names)}")
    if len(s.args) != len(callee.params):
        raise fl.error(f"CallFunc {s.func}: expected {len(callee.params)} arguments, "
                       f"got {len(s.args)}")
    values: list[ir.Value] = []
    for index, (arg, param) in enumerate(zip(s.args, callee.params)):
        where = f"CallFunc {s.func}: argument {index} ({param.name!r})"
        if isinstance(param, Buffer):
            if not isinstance(arg, Buffer):
                raise fl.error(f"{where} is a buffer parameter but got a scalar")
            if arg.dtype != param.dtype:
                raise fl.error(f"{where} expects a {param.dtype} buffer, got {arg.dtype} "
                               f"buffer {arg.name!r}")
            _check_fits(fl, where, arg, param)
            if arg in fl.readonly and index in fl.parent.aliasing.written[s.func]:
                raise fl.error(f"{where}: {s.func} writes this parameter, but constant buffer "
                               f"{arg.name!r} is read-only")
            values.append(fl.buffer_ptr(arg))
        else:
            if isinstance(arg, Buffer):
                raise fl.error(f"{where} is a scalar parameter but got buffer {arg.name!r}")
            if arg.dtype != param.dtype:
                raise fl.error(f"{where} expects {param.dtype}, got {arg.dtype}; insert a Cast")
            values.append(fl.to_storage(fl.expr(arg), arg.dtype))
    launch = fl.parent.launches.get(s)
    if launch is not None:
        rc = _launch(fl, launch, values)
    else:
        rc = fl.b.call(fl.parent.kernels[s.func], values, attrs=fl.call_attrs)
    fl.return_if(fl.b.icmp_signed("!=", rc, ir.Constant(I32, 0)), rc)


def _launch(fl: FunctionLowering, launch: Launch, values: list[ir.Value]) -> ir.Value:
    """Run an outlined parallel loop: captured values into a stack context struct,
    then `{prefix}_parallel_for(count, @{body}.run, context)` (kiln.ir.outlined)."""
    parent = fl.parent
    body = parent.kernels[launch.body]
    struct = parent.context_type(body)
    context = _opaque(fl.alloca_b.alloca(struct, name=f"{c_identifier(launch.var)}.context"))
    for k, value in enumerate(values[FIRST_CAPTURE:]):
        slot = fl.b.gep(context, [ir.Constant(I32, 0), ir.Constant(I32, k)], inbounds=True,
                        source_etype=struct)
        fl.b.store(value, slot)
    return fl.b.call(parent.parallel_for(),
                     [values[COUNT_ARG], parent.trampolines[launch.body], context])


def _check_fits(fl: FunctionLowering, where: str, arg: Buffer, param: Buffer) -> None:
    try:
        have, need = arg.nbytes(), param.nbytes()
    except IRError:
        return
    if have < need:
        raise fl.error(f"{where} needs {need} bytes (shape {param.shape}) but buffer "
                       f"{arg.name!r} has {have} (shape {arg.shape})")


STMT_RULES: dict[type, Callable[[Any, Any], None]] = {
    Store: _store,
    SeqStmt: _seq,
    For: _for,
    LetStmt: _let,
    IfThenElse: _if,
    While: _while,
    Allocate: _allocate,
    AllocConst: _alloc_const,
    DeclBuffer: _decl_buffer,
    Evaluate: _evaluate,
    CallFunc: _call_func,
}

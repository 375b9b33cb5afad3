"""Statements and whole kernels to C: a dispatch table from statement type to an emit method.

One PrimFunc becomes one raw kernel (docs/abi.md, "Raw kernels"):

    KILN_HIDDEN int32_t {prefix}_kernel_{name}(const float* X, ..., float* restrict Y, int64_t n)

(qualifiers: kiln.codegen.cfamily.signature) returning 0, `STATUS_OUT_OF_MEMORY`
when a heap workspace cannot be allocated, `ERROR_SIZE_OVERFLOW` when the size of
one sized by symbolic dimensions overflows int64 (or the non-zero status of a
kernel it calls). Heap workspaces (`Allocate` with scope "global") are pointers
declared NULL at the top of the kernel, malloc'ed where the IR allocates them
and freed where their scope ends; an error jumps to the single `done:` label,
which frees whatever is still held.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kiln import dim_expr
from kiln.codegen.c.context import (
    STATUS_OUT_OF_MEMORY,
    BufferRef,
    FuncContext,
    ModuleContext,
    value_ctype,
)
from kiln.codegen.c.expr import ADD, CExpr, ExprEmitter, cast, infix, operand, paren
from kiln.codegen.c.vector import VectorLoopPrinter, prints_as_vectors
from kiln.codegen.cfamily.helpers import DIM_HELPERS
from kiln.codegen.cfamily.literals import int_literal
from kiln.codegen.cfamily.printer import CPrinter, NameScope
from kiln.codegen.cfamily.signature import describe_params, param_ctype
from kiln.codegen.naming import (
    C_TYPE_NAMES,
    CONSTS_BASE,
    const_table_symbol,
    consts_symbol,
    kernel_symbol,
    parallel_for_symbol,
)
from kiln.errors import IRError
from kiln.escape import c_comment
from kiln.ir import dtype as dt
from kiln.ir.analysis.tensor_queries import (
    calls,
    has_side_effects,
    heap_allocations,
    read_buffers,
    referenced,
)
from kiln.ir.attrs import ATTR_PARALLEL_OF, ATTR_PARALLEL_VAR
from kiln.ir.kernel_errors import ERROR_SIZE_OVERFLOW, ERROR_TERMINATED
from kiln.ir.outlined import COUNT_ARG, FIRST_CAPTURE
from kiln.ir.shape_expr import dim_product, dim_vars, to_dim_expr
from kiln.ir.tensor import (
    CHECK_INTRINSIC,
    PREFETCH_INTRINSIC,
    TERMINATE_CHECK,
    Allocate,
    AllocConst,
    BinaryOp,
    Buffer,
    CallExtern,
    CallFunc,
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
    SeqStmt,
    Stmt,
    Store,
    Var,
    While,
)

# The C type of kernels' return value and of the status variable.
STATUS_CTYPE = "int32_t"
# Longest line the printer aims for.
MAX_LINE = 100
# GCC rejects larger `#pragma GCC unroll` counts.
MAX_UNROLL = 65534


def tail_allocations(body: Stmt) -> set[Allocate]:
    """Heap Allocates whose scope ends where the kernel ends (freed only at `done:`).

    Those are the declarations of the function body's own statement list and, when
    its last statement is a nested list, of that one's (and so on).
    """
    out: set[Allocate] = set()
    s: Stmt | None = body
    while s is not None:
        items = s.body if isinstance(s, SeqStmt) else (s,)
        out.update(x for x in items if isinstance(x, Allocate))
        last = items[-1] if items else None
        s = last if isinstance(last, SeqStmt) else None
    return out


class KernelPrinter:
    """Prints one PrimFunc as a raw kernel definition."""

    def __init__(self, module: ModuleContext, name: str, fn: PrimFunc,
                 reserved: set[str]) -> None:
        self.fn = fn
        self.name = name
        self.symbol = kernel_symbol(module.prefix, name)
        self.ctx = FuncContext(module, name, NameScope(reserved))
        self.exprs = ExprEmitter(self.ctx)
        self.p = CPrinter()
        self.refs = referenced(fn.body)
        self.read = read_buffers(fn.body)
        # Unreferenced allocations print nothing (and would leave `done:` unused).
        self.heap = [a for a in heap_allocations(fn.body) if a.buffer in self.refs]
        self.freed_at_exit = tail_allocations(fn.body)
        self.status: str | None = None
        self.params: list[str] = []  # C parameter declarations
        self.heap_ptr: dict[Buffer, str] = {}
        # Buffers declared in each open statement list (with their Allocate when it
        # is a heap one): their scope, and a heap buffer's lifetime, end with the list.
        self.blocks: list[list[tuple[Buffer, Allocate | None]]] = []
        # Let variables bound in each open statement list, with the C name each hid.
        self.let_blocks: list[list[tuple[Var, str | None]]] = []
        self.quals = module.params[name]
        # An outlined parallel-loop body is private to kernels.c.
        self.loop_of: str | None = fn.attrs.get(ATTR_PARALLEL_OF)

    # ------------------------------------------------------------------ kernel

    def print(self) -> list[str]:
        """The kernel definition; `self.prototype()` is valid afterwards."""
        prologue = self.declare_params()
        names = self.ctx.names
        heap_names: list[str] = []
        if self.heap or calls(self.fn.body):
            self.status = names.fresh("status")
            prologue.append(f"{STATUS_CTYPE} {self.status} = 0;")
        for alloc in self.heap:
            # Declared up front so `done:` can free it; usable only inside its Allocate.
            buf = alloc.buffer
            ptr = names.fresh(buf.name)
            heap_names.append(ptr)
            self.heap_ptr[buf] = ptr
            prologue.append(f"{C_TYPE_NAMES[buf.dtype]}* {ptr} = NULL;")

        p = self.p
        if self.loop_of is not None:
            var = str(self.fn.attrs.get(ATTR_PARALLEL_VAR, ""))
            p.line(f"/* Iterations [begin, end) of parallel loop "
                   f"{c_comment(repr(var))} of {c_comment(self.loop_of)}. */")
        else:
            p.line(f"/* {c_comment(f'{self.name}({describe_params(self.fn)})')} */")
        with p.block(self.prototype(with_semicolon=False)):
            p.extend(prologue)
            self.block(self.fn.body)
            if self.heap:
                p.lines.append("done:")  # labels sit at the left margin
                p.extend(f"KILN_FREE({ptr});" for ptr in heap_names)
            p.line(f"return {self.status or 0};")
        return p.lines

    def prototype(self, *, with_semicolon: bool = True) -> str:
        """The kernel's declarator; one parameter per line when it gets long."""
        linkage = "static" if self.loop_of is not None else "KILN_HIDDEN"
        head = f"{linkage} {STATUS_CTYPE} {self.symbol}("
        params = self.params or ["void"]
        text = head + ", ".join(params) + ")"
        if len(text) > MAX_LINE - 2:
            text = head + "\n" + ",\n".join(f"    {p}" for p in params) + ")"
        return text + ";" if with_semicolon else text

    def declare_params(self) -> list[str]:
        """Name the parameters; return prologue lines (unused markers, float16 decoding)."""
        names, ctx = self.ctx.names, self.ctx
        prologue: list[str] = []
        seen: set[object] = set()
        for index, param in enumerate(self.fn.params):
            if param in seen:
                raise ctx.error(f"parameter '{param.name}' appears twice")
            seen.add(param)
            used = param in self.refs
            if isinstance(param, Buffer):
                name = names.fresh(param.name)
                ctx.buffers[param] = BufferRef(name, const=index not in self.quals.written)
                ctype = param_ctype(param, index, self.quals, ctx.module.dialect.restrict)
                self.params.append(f"{ctype} {name}")
            elif param.dtype in ("float16", "bfloat16"):
                # 16-bit float scalars arrive as bit patterns (docs/abi.md).
                bits = names.fresh(param.name + "_bits")
                self.params.append(f"uint16_t {bits}")
                if used:
                    name = names.fresh(param.name)
                    ctx.vars[param] = name
                    decoded = self.exprs.from_bits(param.dtype, CExpr(bits))
                    prologue.append(f"const float {name} = {decoded.text};")
                    continue
                name = bits
            else:
                name = names.fresh(param.name)
                ctx.vars[param] = name
                self.params.append(f"{C_TYPE_NAMES[param.dtype]} {name}")
            if not used:
                prologue.append(f"(void){name}; /* unused */")
        return prologue

    # ------------------------------------------------------------------ statements

    def stmt(self, s: Stmt) -> None:
        fn = _STATEMENTS.get(type(s))
        if fn is None:
            raise self.ctx.error(f"the C backend cannot print statement {type(s).__name__}")
        fn(self, s)

    def block_body(self, s: Stmt) -> None:
        """`s` as the body of a C block: indented, in its own name scope."""
        with self.p.indented(), self.ctx.names.scope():
            self.block(s)

    def block(self, s: Stmt) -> None:
        """`s` as a statement list: the declarations in it end where it ends."""
        self.blocks.append([])
        self.let_blocks.append([])
        for item in s.body if isinstance(s, SeqStmt) else (s,):
            self.stmt(item)
        for var, previous in reversed(self.let_blocks.pop()):
            self.restore_var(var, previous)
        for buf, alloc in reversed(self.blocks.pop()):
            del self.ctx.buffers[buf]
            if alloc is not None and alloc not in self.freed_at_exit:
                ptr = self.heap_ptr[buf]
                self.p.line(f"KILN_FREE({ptr});")
                self.p.line(f"{ptr} = NULL; /* done: frees it again */")

    def declare(self, buf: Buffer, ref: BufferRef, alloc: Allocate | None = None) -> None:
        """Bring `buf` into scope until the enclosing statement list ends."""
        if buf in self.ctx.buffers:
            raise self.ctx.error(f"buffer '{buf.name}' is declared twice in nested scopes")
        self.ctx.buffers[buf] = ref
        self.blocks[-1].append((buf, alloc))

    def expr(self, e: PrimExpr) -> CExpr:
        return self.exprs.emit(e)

    def condition(self, e: PrimExpr) -> str:
        c = self.expr(e)
        return c.text if e.dtype == "bool" else infix("ne", c, CExpr("0")).text

    def seq(self, s: SeqStmt) -> None:
        self.block(s)

    def store(self, s: Store) -> None:
        buf = s.buffer
        ref = self.ctx.buffer(buf)
        if ref.const:
            raise self.ctx.error(f"store into constant buffer '{buf.name}'")
        if s.value.dtype != buf.dtype:
            raise self.ctx.error(f"store of a {s.value.dtype} value into {buf.dtype} buffer "
                                 f"'{buf.name}'; insert a Cast")
        value = self.exprs.to_bits(buf.dtype, self.expr(s.value))
        self.p.line(f"{ref.name}[{self.exprs.index(buf, s.indices)}] = {value.text};")

    def for_(self, s: For) -> None:
        if s.kind == "vector" and prints_as_vectors(s):
            VectorLoopPrinter(self, s).print()
        else:
            self.scalar_for(s)

    def scalar_for(self, s: For) -> None:
        """`s` as a C `for` loop (a `vector` loop: the scalar form of its lanes)."""
        var = s.var
        ctype = value_ctype(var.dtype)
        if not dt.is_int(var.dtype):
            raise self.ctx.error(f"loop variable '{var.name}' has dtype {var.dtype}; "
                                 "loops count with integers")
        start = self.loop_bound(s.start, var)
        if isinstance(s.start, Const) and isinstance(s.extent, Const):
            end_value = int(s.start.value) + int(s.extent.value)
            end = CExpr(int_literal(end_value, var.dtype)[0])
        elif isinstance(s.start, Const) and int(s.start.value) == 0:
            end = self.loop_bound(s.extent, var)
        else:
            end = self.loop_bound(BinaryOp("add", s.start, s.extent), var)
        if s.kind in ("vectorized", "vector"):
            self.ctx.module.macros.add("KILN_VECTORIZE")
            self.p.line("KILN_VECTORIZE")
        elif s.kind == "unrolled":
            if isinstance(s.extent, Const) and int(s.extent.value) > 0:
                self.ctx.module.macros.add("KILN_UNROLL")
                self.p.line(f"KILN_UNROLL({min(int(s.extent.value), MAX_UNROLL)})")
            else:
                self.p.line("/* unrolled (extent unknown at compile time) */")
        elif s.kind == "scalar":
            self.ctx.module.macros.add("KILN_NO_VECTORIZE")
            self.p.line("KILN_NO_VECTORIZE")
        elif s.kind == "parallel":
            # Outlined loops never get here (kiln.ir.outlined): this one is not
            # an integer loop with matching bounds.
            self.p.line("/* parallel: runs serially */")
        with self.ctx.names.scope():
            name = self.ctx.names.fresh(var.name)
            previous = self.ctx.vars.get(var)
            self.ctx.vars[var] = name
            head = (f"for ({ctype} {name} = {start.text}; {name} < {paren(end, ADD)}; "
                    f"++{name})")
            self.p.line(head + " {")
            self.block_body(s.body)
            self.p.line("}")
            self.restore_var(var, previous)

    def loop_bound(self, e: PrimExpr, var: Var) -> CExpr:
        value = self.expr(e)
        if e.dtype != var.dtype:
            if not dt.is_int(e.dtype):
                raise self.ctx.error(f"loop '{var.name}' has a {e.dtype} bound")
            value = cast(value_ctype(var.dtype), value)
        return value

    def restore_var(self, var: Var, previous: str | None) -> None:
        if previous is None:
            self.ctx.vars.pop(var, None)
        else:
            self.ctx.vars[var] = previous

    def let(self, s: LetStmt) -> None:
        if s.value.dtype != s.var.dtype:
            raise self.ctx.error(f"let '{s.var.name}': a {s.value.dtype} value bound to a "
                                 f"{s.var.dtype} variable")
        if s.var not in self.refs:
            if has_side_effects(s.value):
                self.p.line(f"(void){operand(self.expr(s.value))};")
            return
        # A declaration in the current C block; the variable is known until the
        # enclosing statement list ends (`block`).
        value = self.expr(s.value)
        name = self.ctx.names.fresh(s.var.name)
        self.p.line(f"const {value_ctype(s.var.dtype)} {name} = {value.text};")
        self.let_blocks[-1].append((s.var, self.ctx.vars.get(s.var)))
        self.ctx.vars[s.var] = name

    def if_(self, s: IfThenElse) -> None:
        p = self.p
        p.line(f"if ({self.condition(s.cond)}) {{")
        self.block_body(s.then_body)
        other = s.else_body
        while isinstance(other, IfThenElse):
            p.line(f"}} else if ({self.condition(other.cond)}) {{")
            self.block_body(other.then_body)
            other = other.else_body
        if other is not None:
            p.line("} else {")
            self.block_body(other)
        p.line("}")

    def while_(self, s: While) -> None:
        # `for (;;)` with the test first in the body: whatever the condition's C
        # expression needs is evaluated on every iteration.
        p = self.p
        p.line("for (;;) {")
        with p.indented(), self.ctx.names.scope():
            p.line(f"if (!({self.condition(s.cond)})) break;")
            self.block(s.body)
        p.line("}")

    def allocate(self, s: Allocate) -> None:
        buf = s.buffer
        if buf not in self.refs:
            return
        ctype = C_TYPE_NAMES[buf.dtype]
        if buf.scope != "local" and not all(isinstance(d, int) for d in buf.shape):
            self.allocate_symbolic(s)
            return
        numel = self.static_numel(buf)
        if buf.scope == "local":
            name = self.ctx.names.fresh(buf.name)
            # ISO C has no zero-length arrays; an empty buffer is never indexed.
            self.p.line(f"{ctype} {name}[{max(numel, 1)}];")
            if buf not in self.read:
                self.p.line(f"(void){name}; /* written, never read */")
            self.declare(buf, BufferRef(name))
            return
        ptr = self.heap_ptr[buf]
        count = str(max(numel, 1)) if numel < (1 << 31) else f"(size_t)UINT64_C({numel})"
        self.ctx.module.uses_malloc = True
        p = self.p
        p.line(f"{ptr} = ({ctype}*)KILN_MALLOC(sizeof({ctype}) * {count});")
        with p.block(f"if ({ptr} == NULL)"):
            p.line(f"{self.status} = {STATUS_OUT_OF_MEMORY}; /* out of memory */")
            p.line("goto done;")
        self.declare(buf, BufferRef(ptr), s)

    def allocate_symbolic(self, s: Allocate) -> None:
        """A heap buffer whose size is an expression of the kernel's dim scalars: the byte
        count is computed with kiln_dim.c's checked arithmetic, and one that overflows
        int64 (or size_t) or is negative fails the kernel before any allocation."""
        buf = s.buffer
        ctype = C_TYPE_NAMES[buf.dtype]
        size_dim = dim_product((*buf.shape, dt.itemsize(buf.dtype)))
        names = {v.name: self.ctx.var_name(v) for v in dim_vars(size_dim)}
        nbytes = to_dim_expr(size_dim)
        ptr = self.heap_ptr[buf]
        module = self.ctx.module
        module.uses_malloc = True
        module.helpers.use(DIM_HELPERS)
        size, failed = self.ctx.names.fresh(f"{buf.name}_bytes"), self.ctx.names.fresh("failed")
        p = self.p
        p.line(f"int32_t {failed} = 0;")
        p.line(f"int64_t {size} = {dim_expr.to_c(nbytes, names, failed)};")
        with p.block(f"if ({failed} != 0 || {size} < 0 || (uint64_t){size} > SIZE_MAX)"):
            p.line(f"{self.status} = {ERROR_SIZE_OVERFLOW}; /* size overflows int64 */")
            p.line("goto done;")
        # At least one byte: malloc(0) may return NULL, and an empty buffer is never read.
        p.line(f"{ptr} = ({ctype}*)KILN_MALLOC((size_t)({size} > 0 ? {size} : 1));")
        with p.block(f"if ({ptr} == NULL)"):
            p.line(f"{self.status} = {STATUS_OUT_OF_MEMORY}; /* out of memory */")
            p.line("goto done;")
        self.declare(buf, BufferRef(ptr), s)

    def alloc_const(self, s: AllocConst) -> None:
        buf = s.buffer
        if buf not in self.refs:
            return
        data = s.data
        try:
            data_dtype = dt.from_numpy(data.dtype)
        except IRError:
            data_dtype = str(data.dtype)
        if data_dtype != buf.dtype or data.size != self.static_numel(buf):
            raise self.ctx.error(
                f"constant '{buf.name}' is declared {buf.dtype}{list(buf.shape)} but its data "
                f"is {data_dtype}{list(data.shape)}")
        module = self.ctx.module
        offset = module.pool.add(data)
        module.uses_consts = True
        ctype = C_TYPE_NAMES[buf.dtype]
        name = self.ctx.names.fresh(buf.name)
        if module.const_table:
            module.pool.table = True
            slot = f"{const_table_symbol(module.prefix)}[{module.pool.index(data)}]"
            self.p.line(f"const {ctype}* {name} = (const {ctype}*){slot};")
        else:
            base = CONSTS_BASE if module.pool.large else consts_symbol(module.prefix)
            self.p.line(f"const {ctype}* {name} = (const {ctype}*)({base} + {offset});")
        self.declare(buf, BufferRef(name, const=True))

    def decl_buffer(self, s: DeclBuffer) -> None:
        buf, src = s.buffer, s.source
        if buf not in self.refs:
            return
        source = self.ctx.buffer(src)
        if isinstance(s.byte_offset, int):
            self.check_view(s)
            offset = int_literal(s.byte_offset, "int64")[0]
        else:  # a workspace laid out at entry: the planner placed it (symbolic sizes)
            offset = f"({self.expr(s.byte_offset).text})"
        const = "const " if source.const else ""
        ctype = C_TYPE_NAMES[buf.dtype]
        name = self.ctx.names.fresh(buf.name)
        if s.byte_offset == 0 and C_TYPE_NAMES[src.dtype] == ctype:
            init = source.name
        elif s.byte_offset == 0:
            init = f"({const}{ctype}*){source.name}"
        else:
            init = f"({const}{ctype}*)(({const}uint8_t*){source.name} + {offset})"
        self.p.line(f"{const}{ctype}* {name} = {init};")
        self.declare(buf, BufferRef(name, const=source.const))

    def check_view(self, s: DeclBuffer) -> None:
        """A view at a constant offset lies inside its source and is aligned to its elements."""
        buf, src = s.buffer, s.source
        assert isinstance(s.byte_offset, int)
        static = all(isinstance(d, int) for d in (*buf.shape, *src.shape))
        end = s.byte_offset + (buf.nbytes() if static else 0)
        if s.byte_offset < 0 or (static and end > src.nbytes()):
            raise self.ctx.error(
                f"buffer '{buf.name}' ({buf.dtype}{list(buf.shape)} at byte offset "
                f"{s.byte_offset}) does not fit in '{src.name}' "
                f"({src.dtype}{list(src.shape)})")
        if s.byte_offset % dt.itemsize(buf.dtype) != 0:
            raise self.ctx.error(f"buffer '{buf.name}' starts at byte offset {s.byte_offset}, "
                                 f"not a multiple of its {buf.dtype} element size")

    def static_numel(self, buf: Buffer) -> int:
        if any(not isinstance(d, int) for d in buf.shape):
            raise self.ctx.error(f"buffer '{buf.name}' has a symbolic shape {buf.shape}; "
                                 "the C backend needs static shapes")
        return buf.numel()

    def evaluate(self, s: Evaluate) -> None:
        if isinstance(s.value, Intrin) and s.value.name == CHECK_INTRINSIC:
            self.check(s.value)
            return
        if isinstance(s.value, Intrin) and s.value.name == PREFETCH_INTRINSIC:
            (element,) = s.value.args
            assert isinstance(element, Load)
            ref = self.ctx.buffer(element.buffer)
            self.ctx.module.macros.add("KILN_PREFETCH")
            offset = self.exprs.index(element.buffer, element.indices)
            self.p.line(f"KILN_PREFETCH(&{ref.name}[{offset}]);")
            return
        if isinstance(s.value, Intrin) and s.value.name == TERMINATE_CHECK:
            self.terminate_check(s.value)
            return
        if isinstance(s.value, CallExtern):
            self.p.line(f"{self.exprs.call_extern(s.value, discard=True).text};")
            return
        value = self.expr(s.value)
        if has_side_effects(s.value):
            self.p.line(f"(void){operand(value)};")
        # A pure expression evaluated for nothing prints nothing.

    def check(self, e: Intrin) -> None:
        """The `check` intrinsic: leave the kernel with its error code if `cond` is false."""
        cond, code = e.args
        assert isinstance(code, Const)
        self.fail_if(f"!({self.condition(cond)})", int(code.value), "failed check")

    def terminate_check(self, e: Intrin) -> None:
        """The `terminate_check` intrinsic: a volatile read of the caller's flag (another
        thread sets it), and leave the kernel with ERROR_TERMINATED when it is set."""
        (element,) = e.args
        assert isinstance(element, Load)
        ref = self.ctx.buffer(element.buffer)
        offset = self.exprs.index(element.buffer, element.indices)
        self.fail_if(f"*(const volatile int32_t*)&{ref.name}[{offset}] != 0", ERROR_TERMINATED,
                     "terminated by the caller")

    def fail_if(self, cond: str, code: int, why: str) -> None:
        """Leave the kernel with status `code` when the C condition `cond` holds."""
        with self.p.block(f"if ({cond})"):
            if self.status is None:  # no heap workspace to free
                self.p.line(f"return {code}; /* {why} */")
            else:
                self.p.line(f"{self.status} = {code}; /* {why} */")
                self.check_status()

    def call_func(self, s: CallFunc) -> None:
        ctx = self.ctx
        launch = ctx.module.launches.get(s)
        if launch is not None:
            self.launch(s, launch.body)
            return
        args = self.call_args(s)
        symbol = kernel_symbol(ctx.module.prefix, s.func)
        self.p.line(f"{self.status} = {symbol}({', '.join(args)});")
        self.check_status()

    def check_status(self) -> None:
        """Leave the kernel with the status of a failed call."""
        if self.heap:
            self.p.line(f"if ({self.status} != 0) goto done;")
        else:
            self.p.line(f"if ({self.status} != 0) return {self.status};")

    def launch(self, s: CallFunc, body: str) -> None:
        """Run an outlined parallel loop on the thread pool (kiln.ir.outlined)."""
        ctx = self.ctx
        args = self.call_args(s)
        symbol = kernel_symbol(ctx.module.prefix, body)
        captured = args[FIRST_CAPTURE:]
        count = args[COUNT_ARG]
        parallel_for = parallel_for_symbol(ctx.module.prefix)
        p = self.p
        if not captured:
            p.line(f"{self.status} = {parallel_for}({count}, {symbol}_run, NULL);")
        else:
            p.line("{")
            with p.indented(), ctx.names.scope():
                name = ctx.names.fresh("parallel")
                p.line(f"struct {symbol}_ctx {name};")
                for k, value in enumerate(captured):
                    p.line(f"{name}.p{k} = {value};")
                p.line(f"{self.status} = {parallel_for}({count}, {symbol}_run, &{name});")
            p.line("}")
        self.check_status()

    def call_args(self, s: CallFunc) -> list[str]:
        """The C arguments of a call to kernel `s.func`, checked against its parameters."""
        ctx = self.ctx
        callee = ctx.module.mod.functions.get(s.func)
        if not isinstance(callee, PrimFunc):
            known = ", ".join(sorted(ctx.module.mod.prim_funcs())) or "(none)"
            raise ctx.error(f"call to '{s.func}', which is not a tensor-level function of "
                            f"the module (known: {known})")
        if len(s.args) != len(callee.params):
            raise ctx.error(f"call to '{s.func}' passes {len(s.args)} arguments; it takes "
                            f"{len(callee.params)}")
        args: list[str] = []
        for i, (arg, param) in enumerate(zip(s.args, callee.params)):
            where = f"call to '{s.func}', argument {i} '{param.name}'"
            if isinstance(param, Buffer) != isinstance(arg, Buffer) or arg.dtype != param.dtype:
                got = f"buffer {arg.dtype}" if isinstance(arg, Buffer) else f"{arg.dtype} value"
                want = (f"buffer {param.dtype}" if isinstance(param, Buffer)
                        else f"{param.dtype} value")
                raise ctx.error(f"{where}: expected a {want}, got a {got}")
            if isinstance(arg, Buffer):
                ref = ctx.buffer(arg)
                writes = i in ctx.module.params[s.func].written
                args.append(f"({C_TYPE_NAMES[arg.dtype]}*){ref.name}" if ref.const and writes
                            else ref.name)
            else:
                args.append(self.exprs.to_bits(arg.dtype, self.expr(arg)).text)
        return args


def _table() -> dict[type, Callable[[KernelPrinter, Any], None]]:
    return {
        SeqStmt: KernelPrinter.seq,
        Store: KernelPrinter.store,
        For: KernelPrinter.for_,
        LetStmt: KernelPrinter.let,
        IfThenElse: KernelPrinter.if_,
        While: KernelPrinter.while_,
        Allocate: KernelPrinter.allocate,
        AllocConst: KernelPrinter.alloc_const,
        DeclBuffer: KernelPrinter.decl_buffer,
        Evaluate: KernelPrinter.evaluate,
        CallFunc: KernelPrinter.call_func,
    }


_STATEMENTS = _table()

"""The IR verifier: `verify(mod_or_func)` raises IRError on ill-formed IR.

Nodes are built without many checks (the builder checks some, passes may build
anything), so this is where a malformed tree is caught before a backend turns
it into a crash. Checks, tensor level:
- every Var / Buffer is used inside the scope that defines it (function
  parameter, loop, let, Allocate, AllocConst, DeclBuffer), is not used before
  its definition, and is not bound again while already in scope; a declaration
  (Allocate, AllocConst, DeclBuffer) is in scope from the next statement to the
  end of the block it stands in (its SeqStmt, loop/branch/let body, function body);
- dtypes: Store value vs buffer, BinaryOp / Compare operands alike and valid for
  the op, integer indices (one per dimension), bool conditions (If, Select),
  integer loop variables, let values, intrinsic arguments, constants that fit
  their dtype;
- a `vector` loop is straight-line vector code (kiln.ir.analysis.vector_loops);
- CallFunc: the callee exists, is a PrimFunc, and takes these arguments
  (count, buffer vs scalar, buffer shape and dtype, scalar dtype);
- AllocConst data matches its buffer; DeclBuffer lies inside its source; a
  "local" (stack) Allocate is at most 64 KiB; constant buffers are not stored to;
- the lowering attributes `kiln.num_outputs` / `kiln.output_names` fit the params.
Graph level: Vars defined before use and bound once; binding types match their
values; CallTensor targets an existing PrimFunc whose parameters are
`args + outputs` with matching shapes and dtypes; TupleGetItem in range.

Cross-function checks (CallFunc, CallTensor) need the module: verifying a lone
function skips them. The first fault is reported; the message names the
function and the node and quotes the printed function around it, e.g.

    IRError: function 'add_one': use of buffer 'T' outside its scope (its Allocate ended)
      at: T[i]
        3 |     for i in T.serial(4):
        4 |         T = T.allocate((4,), "float32", "global")
        5 |         ...
      > 6 |     Y[i] = T[i]
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from kiln._registry import suggest
from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.ir.analysis.graph_uses import called_functions
from kiln.ir.analysis.vector_loops import vector_shape_fault
from kiln.ir.attrs import ATTR_CHECK_MESSAGES, ATTR_NUM_OUTPUTS, ATTR_OUTPUT_NAMES
from kiln.ir.kernel_errors import KERNEL_ERRORS
from kiln.ir.module import BaseFunc, IRModule
from kiln.ir.printer import NodeText, print_function
from kiln.ir.shape_expr import graph_dims, shape_text
from kiln.ir.types import TensorType, TupleType, Type
from kiln.ir.visitor import (
    StmtExprVisitor,
    check_nesting,
    definitions,
    graph_children,
    iter_stmts,
)

__all__ = ["STACK_LIMIT_BYTES", "verify"]

# The largest "local" (stack) allocation; bigger ones belong on the heap.
STACK_LIMIT_BYTES = 64 * 1024

# Ops valid per operand kind.
_ARITH_OPS = frozenset({"add", "sub", "mul", "div", "floordiv", "floormod", "mod", "pow"})
_INT_ONLY_OPS = frozenset({"shl", "shr"})
_BITWISE_OPS = frozenset({"and", "or", "xor"})
# Intrinsics that accept integer arguments as well as floats.
_INT_INTRINSICS = frozenset({"abs"})



def verify(mod_or_func: IRModule | BaseFunc, *, name: str | None = None) -> None:
    """Check that IR is well formed; raise IRError describing the first fault.

    Accepts an IRModule (every function, with cross-function checks) or a single
    PrimFunc / graph Function (`name` is used in messages).
    """
    if isinstance(mod_or_func, IRModule):
        functions = list(mod_or_func.items())
        mod: IRModule | None = mod_or_func
    elif isinstance(mod_or_func, (t.PrimFunc, g.Function)):
        functions, mod = [(name or "<function>", mod_or_func)], None
    else:
        raise IRError(f"verify expects an IRModule, PrimFunc or graph Function, "
                      f"got {type(mod_or_func).__name__}")
    for fname, fn in functions:
        check_nesting(fn, f"verify: function '{fname}'")
        _verify_function(fname, fn, mod)


def verify_changes(mod: IRModule, before: IRModule) -> None:
    """`verify(mod)` for a module a pass made from `before`, which verified: a function
    `mod` holds as the same object as `before` is not walked again, unless it calls one
    whose interface changed (its parameters, or a graph function's result type: all
    that a caller's checks read of its callee). A function of `before` missing from
    `mod` verifies the whole of it."""
    old = before.functions
    new = mod.functions
    if any(name not in new for name in old):
        verify(mod)
        return
    changed = {name for name, fn in new.items() if old.get(name) is not fn}
    interface = {name for name in changed
                 if name in old and not _same_interface(old[name], new[name])}
    for name, fn in new.items():
        if name in changed or (interface and not interface.isdisjoint(called_functions(fn))):
            check_nesting(fn, f"verify: function '{name}'")
            _verify_function(name, fn, mod)


def _same_interface(a: BaseFunc, b: BaseFunc) -> bool:
    """Whether callers of `a` check the same against `b` (parameters the same objects)."""
    if type(a) is not type(b) or len(a.params) != len(b.params):
        return False
    if any(p is not q for p, q in zip(a.params, b.params)):
        return False
    return not isinstance(a, g.Function) or (
        _type_key(a.ret_type) == _type_key(b.ret_type))  # type: ignore[union-attr]


class _Fault(Exception):
    def __init__(self, message: str, node: object, where: object) -> None:
        super().__init__(message)
        self.message = message
        self.node = node
        self.where = where


def _verify_function(name: str, fn: BaseFunc, mod: IRModule | None) -> None:
    try:
        if isinstance(fn, t.PrimFunc):
            _PrimFuncVerifier(name, fn, mod).run()
        else:
            _GraphVerifier(name, fn, mod).run()
    except _Fault as fault:
        raise IRError(_report(name, fn, fault)) from None


def _report(name: str, fn: BaseFunc, fault: _Fault) -> str:
    nodes = NodeText()
    try:
        printed = print_function(name, fn)
        nodes = printed.nodes  # the `at:` line uses the names of the quoted text
        quoted = printed.excerpt(fault.where)
    except Exception as exc:  # never hide the fault behind a printer failure
        quoted = f"    (could not print the function: {exc})"
    lines = [f"function '{name}': {fault.message}"]
    if fault.node is not None and fault.node is not fault.where:
        lines.append(f"  at: {nodes.node(fault.node)}")
    lines.append(quoted)
    return "\n".join(lines)


def _fits(value: int, dtype: str) -> bool:
    n = dt.bits(dtype)
    if dt.kind(dtype) == "uint":
        return 0 <= value < (1 << n)
    return -(1 << (n - 1)) <= value < (1 << (n - 1))


def _shape_str(shape: tuple[object, ...]) -> str:
    return str(tuple(shape))


class _Scopes:
    """Which variables/buffers are defined, where, and whether their scope ended."""

    def __init__(self) -> None:
        self.live: dict[int, str] = {}  # id -> what defined it ("loop", "let", ...)
        self.ended: dict[int, str] = {}
        self._keep: list[object] = []

    def define(self, node: object, what: str) -> None:
        self.live[id(node)] = what
        self.ended.pop(id(node), None)
        self._keep.append(node)

    def end(self, node: object) -> None:
        what = self.live.pop(id(node), None)
        if what is not None:
            self.ended[id(node)] = what


def _defined_in(body: t.Stmt) -> list[t.Var | t.Buffer]:
    """The variables and buffers bound under `body` (only statements bind: expressions
    need no walk)."""
    return [d for s in iter_stmts(body) for d in definitions(s)]


class _PrimFuncVerifier(StmtExprVisitor):
    def __init__(self, name: str, fn: t.PrimFunc, mod: IRModule | None) -> None:
        self.name = name
        self.fn = fn
        self.mod = mod
        self.scopes = _Scopes()
        self.const_buffers: set[int] = set()
        self.where: list[object] = [fn]
        # Declarations of each open block, ended when the block ends.
        self.blocks: list[list[t.Buffer | t.Var]] = []
        self._keep = _defined_in(fn.body)
        self.defined_later = {id(d) for d in self._keep}

    def fault(self, message: str, node: object = None) -> NoReturn:
        raise _Fault(message, node, self.where[-1])

    def run(self) -> None:
        self.check_params()
        self.block(self.fn.body)

    # ------------------------------------------------------------------ scopes

    def check_params(self) -> None:
        for i, p in enumerate(self.fn.params):
            if id(p) in self.scopes.live:
                self.fault(f"parameter {i} '{p.name}' appears twice in the parameter list", p)
            if isinstance(p, t.Buffer) and p.scope != "global":
                self.fault(f"parameter buffer '{p.name}' has scope '{p.scope}'; "
                           "parameters are caller memory (scope 'global')", p)
            self.scopes.define(p, "parameter")
        # Symbolic dimensions: a fresh Var is a shape variable, bound by the argument's
        # shape; any other expression may use scalar parameters and earlier shape vars.
        for p in self.fn.params:
            if isinstance(p, t.Buffer):
                self.check_shape(p, "parameter buffer", allow_symbolic=True,
                                 binds_shape_vars=True)
        self.check_output_attrs()

    def check_output_attrs(self) -> None:
        attrs = self.fn.attrs
        if ATTR_NUM_OUTPUTS not in attrs:
            return
        n = attrs[ATTR_NUM_OUTPUTS]
        # outputs come last, before a graph function's dimension scalars
        params = self.fn.params[:len(self.fn.params) - len(graph_dims(self.fn))]
        if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= len(params):
            self.fault(f"attribute {ATTR_NUM_OUTPUTS}={n!r} must be an int between 0 and "
                       f"the number of parameters ({len(params)})")
        for p in params[len(params) - n:]:
            if not isinstance(p, t.Buffer):
                self.fault(f"attribute {ATTR_NUM_OUTPUTS}={n} makes scalar parameter "
                           f"'{p.name}' an output; outputs must be buffers", p)
        names = attrs.get(ATTR_OUTPUT_NAMES)
        if names is not None and len(tuple(names)) != n:
            self.fault(f"attribute {ATTR_OUTPUT_NAMES} has {len(tuple(names))} names but "
                       f"{ATTR_NUM_OUTPUTS} is {n}")

    @contextmanager
    def binding(self, node: t.Var | t.Buffer, what: str) -> Iterator[None]:
        kind = "variable" if isinstance(node, t.Var) else "buffer"
        if id(node) in self.scopes.live:
            self.fault(f"redefinition of {kind} '{node.name}' by a {what}: it is already "
                       f"bound by an enclosing {self.scopes.live[id(node)]}", node)
        self.scopes.define(node, what)
        try:
            yield
        finally:
            self.scopes.end(node)

    def block(self, s: t.Stmt) -> None:
        """Visit a block; the declarations made in it end with it."""
        self.blocks.append([])
        try:
            self.visit_stmt(s)
        finally:
            for b in self.blocks.pop():
                self.scopes.end(b)

    def declare(self, b: t.Buffer | t.Var, what: str) -> None:
        """A declaration or let: `b` is in scope until the enclosing block ends."""
        if id(b) in self.scopes.live:
            kind = "variable" if isinstance(b, t.Var) else "buffer"
            self.fault(f"redefinition of {kind} '{b.name}' by a {what}: it is already "
                       f"bound by an enclosing {self.scopes.live[id(b)]}", b)
        self.scopes.define(b, what)
        self.blocks[-1].append(b)

    def visit_seq_stmt(self, s: t.SeqStmt) -> None:
        self.blocks.append([])
        try:
            for sub in s.body:
                self.visit_stmt(sub)
        finally:
            for b in self.blocks.pop():
                self.scopes.end(b)

    def check_use(self, node: t.Var | t.Buffer, at: object = None) -> None:
        """`node` must be in scope; `at` is the node to show (e.g. the Load of a buffer)."""
        at = node if at is None else at
        key = id(node)
        if key in self.scopes.live:
            return
        kind = "variable" if isinstance(node, t.Var) else "buffer"
        if key in self.scopes.ended:
            self.fault(f"use of {kind} '{node.name}' outside its scope "
                       f"(its {self.scopes.ended[key]} ended)", at)
        if key in self.defined_later:
            self.fault(f"use of {kind} '{node.name}' before its definition", at)
        self.fault(f"undefined {kind} '{node.name}': not a parameter, loop variable, let "
                   f"binding or allocation of function '{self.name}'", at)

    def check_shape(self, b: t.Buffer, what: str, *, allow_symbolic: bool = False,
                    binds_shape_vars: bool = False) -> None:
        for d in b.shape:
            if isinstance(d, int):
                if d < 0:
                    self.fault(f"{what} '{b.name}' has a negative dimension in shape "
                               f"{_shape_str(b.shape)}", b)
            elif not (allow_symbolic and isinstance(d, t.PrimExpr)):
                self.fault(f"{what} '{b.name}' needs a static shape, got {_shape_str(b.shape)}",
                           b)
            elif not dt.is_int(d.dtype):
                self.fault(f"{what} '{b.name}' has a dimension of dtype {d.dtype}; dimensions "
                           "must be integers", b)
            elif binds_shape_vars and isinstance(d, t.Var) and id(d) not in self.scopes.live:
                self.scopes.define(d, "buffer shape")
            else:
                self.visit_expr(d)

    # ------------------------------------------------------------------ statements

    def visit_stmt(self, s: t.Stmt) -> None:
        self.where.append(s)
        super().visit_stmt(s)
        self.where.pop()

    def check_indices(self, b: t.Buffer, indices: tuple[t.PrimExpr, ...], node: object,
                      what: str) -> None:
        if len(indices) != b.ndim:
            plural = "index" if len(indices) == 1 else "indices"
            self.fault(f"{what} of buffer '{b.name}' has {len(indices)} {plural} but the "
                       f"buffer has {b.ndim} dimension(s) (shape {_shape_str(b.shape)})", node)
        for k, i in enumerate(indices):
            if not dt.is_int(i.dtype):
                self.fault(f"index {k} of {what} of buffer '{b.name}' has dtype {i.dtype}; "
                           "indices must be integers", node)

    def visit_store(self, s: t.Store) -> None:
        self.check_use(s.buffer)
        if id(s.buffer) in self.const_buffers:
            self.fault(f"store to constant buffer '{s.buffer.name}' (AllocConst data is "
                       "read-only)", s)
        self.check_indices(s.buffer, s.indices, s, "Store")
        if s.value.dtype != s.buffer.dtype:
            self.fault(f"Store to buffer '{s.buffer.name}': value dtype {s.value.dtype} differs "
                       f"from the buffer dtype {s.buffer.dtype}; insert a Cast", s.value)
        for i in s.indices:
            self.visit_expr(i)
        self.visit_expr(s.value)

    def visit_for(self, s: t.For) -> None:
        v = s.var
        if not dt.is_int(v.dtype):
            self.fault(f"loop variable '{v.name}' has dtype {v.dtype}; loop variables must be "
                       "integers", v)
        for part, e in (("start", s.start), ("extent", s.extent)):
            if e.dtype != v.dtype:
                self.fault(f"loop {part} has dtype {e.dtype} but loop variable '{v.name}' is "
                           f"{v.dtype}", e)
        self.visit_expr(s.start)
        self.visit_expr(s.extent)
        if s.kind == "vector":
            fault = vector_shape_fault(s)
            if fault is not None:
                self.fault(f"vector loop '{v.name}' is not straight-line vector code: {fault}; "
                           "make it T.vectorized (the vectorize-loops pass decides)", s.extent)
        with self.binding(v, "loop"):
            self.block(s.body)

    def visit_let_stmt(self, s: t.LetStmt) -> None:
        if s.value.dtype != s.var.dtype:
            self.fault(f"let '{s.var.name}': value dtype {s.value.dtype} differs from the "
                       f"variable dtype {s.var.dtype}", s.value)
        self.visit_expr(s.value)
        self.declare(s.var, "let")

    def visit_if_then_else(self, s: t.IfThenElse) -> None:
        if s.cond.dtype != "bool":
            self.fault(f"if condition has dtype {s.cond.dtype}; it must be bool "
                       "(compare with 0 explicitly)", s.cond)
        self.visit_expr(s.cond)
        self.block(s.then_body)
        if s.else_body is not None:
            self.block(s.else_body)

    def visit_while(self, s: t.While) -> None:
        if s.cond.dtype != "bool":
            self.fault(f"while condition has dtype {s.cond.dtype}; it must be bool "
                       "(compare with 0 explicitly)", s.cond)
        self.visit_expr(s.cond)
        self.block(s.body)

    def visit_allocate(self, s: t.Allocate) -> None:
        b = s.buffer
        self.check_shape(b, "Allocate of buffer", allow_symbolic=b.scope == "global")
        if b.scope == "local" and b.nbytes() > STACK_LIMIT_BYTES:
            self.fault(f"Allocate of buffer '{b.name}' in scope 'local' needs {b.nbytes()} "
                       f"bytes, more than the {STACK_LIMIT_BYTES}-byte stack limit; "
                       "use scope \"global\" (heap) instead", b)
        self.declare(b, "Allocate")

    def visit_alloc_const(self, s: t.AllocConst) -> None:
        b = s.buffer
        self.check_shape(b, "AllocConst buffer")
        data_shape = tuple(int(d) for d in s.data.shape)
        if data_shape != b.shape:
            self.fault(f"AllocConst buffer '{b.name}' has shape {_shape_str(b.shape)} but its "
                       f"data has shape {data_shape}", b)
        try:
            data_dtype = dt.from_numpy(s.data.dtype)
        except IRError:
            data_dtype = str(s.data.dtype)
        if data_dtype != b.dtype:
            self.fault(f"AllocConst buffer '{b.name}' has dtype {b.dtype} but its data is "
                       f"{data_dtype}", b)
        self.const_buffers.add(id(b))
        self.declare(b, "AllocConst")

    def visit_decl_buffer(self, s: t.DeclBuffer) -> None:
        b, src = s.buffer, s.source
        self.check_use(src)
        self.check_shape(b, "DeclBuffer", allow_symbolic=True)
        if not isinstance(s.byte_offset, int):  # laid out at entry over symbolic sizes
            if s.byte_offset.dtype != "int64":
                self.fault(f"DeclBuffer '{b.name}' has a {s.byte_offset.dtype} byte offset; "
                           "an offset expression is int64", b)
            self.visit_expr(s.byte_offset)
            self.declare(b, "DeclBuffer")
            return
        static = _is_static(b) and _is_static(src)
        end = s.byte_offset + (b.nbytes() if static else 0)
        if s.byte_offset < 0 or (static and end > src.nbytes()):
            self.fault(f"DeclBuffer '{b.name}' covers bytes [{s.byte_offset}, {end}) but its "
                       f"source '{src.name}' has {src.nbytes()} bytes", b)
        if s.byte_offset % dt.itemsize(b.dtype):
            self.fault(f"DeclBuffer '{b.name}' starts at byte {s.byte_offset}, not a multiple "
                       f"of its element size {dt.itemsize(b.dtype)} ({b.dtype})", b)
        if id(src) in self.const_buffers:
            self.const_buffers.add(id(b))
        self.declare(b, "DeclBuffer")

    def visit_call_func(self, s: t.CallFunc) -> None:
        for a in s.args:
            if isinstance(a, t.Buffer):
                self.check_use(a)
            else:
                self.visit_expr(a)
        if self.mod is None:
            return
        if s.func not in self.mod:
            names = list(self.mod.prim_funcs())
            self.fault(f"CallFunc to missing function '{s.func}'.{suggest(s.func, names)} "
                       f"PrimFuncs: {', '.join(names) or '(none)'}", s)
        callee = self.mod[s.func]
        if not isinstance(callee, t.PrimFunc):
            self.fault(f"CallFunc target '{s.func}' is a graph function; CallFunc calls "
                       "PrimFuncs", s)
        if len(s.args) != len(callee.params):
            self.fault(f"CallFunc to '{s.func}' passes {len(s.args)} argument(s) but it takes "
                       f"{len(callee.params)} ({_param_names(callee)})", s)
        for k, (a, p) in enumerate(zip(s.args, callee.params)):
            where = f"CallFunc to '{s.func}': argument {k} for parameter '{p.name}'"
            if isinstance(p, t.Buffer):
                if not isinstance(a, t.Buffer):
                    self.fault(f"{where} must be a buffer, got a scalar expression", s)
                if a.dtype != p.dtype:
                    self.fault(f"{where}: buffer '{a.name}' has dtype {a.dtype}, expected "
                               f"{p.dtype}", s)
                if not _shapes_compatible(a.shape, p.shape):
                    self.fault(f"{where}: buffer '{a.name}' has shape {_shape_str(a.shape)}, "
                               f"expected {_shape_str(p.shape)}", s)
            else:
                if isinstance(a, t.Buffer):
                    self.fault(f"{where} must be a scalar of dtype {p.dtype}, got buffer "
                               f"'{a.name}'", s)
                if a.dtype != p.dtype:
                    self.fault(f"{where} has dtype {a.dtype}, expected {p.dtype}", s)

    # ------------------------------------------------------------------ expressions

    def visit_var(self, e: t.Var) -> None:
        self.check_use(e)

    def visit_const(self, e: t.Const) -> None:
        if dt.is_int(e.dtype) and not _fits(int(e.value), e.dtype):
            self.fault(f"constant {e.value} does not fit dtype {e.dtype}", e)

    def visit_binary_op(self, e: t.BinaryOp) -> None:
        a, b = e.a.dtype, e.b.dtype
        if a != b:
            self.fault(f"operands of '{e.op}' have different dtypes ({a} vs {b}); "
                       "insert a Cast", e)
        kind = dt.kind(a)
        if kind == "float" and (e.op in _INT_ONLY_OPS or e.op in _BITWISE_OPS):
            self.fault(f"'{e.op}' is not defined on floats ({a})", e)
        if kind == "bool" and (e.op in _ARITH_OPS or e.op in _INT_ONLY_OPS):
            self.fault(f"'{e.op}' is not defined on bool; cast to an integer first", e)
        super().visit_binary_op(e)

    def visit_compare(self, e: t.Compare) -> None:
        if e.a.dtype != e.b.dtype:
            self.fault(f"operands of comparison '{e.op}' have different dtypes "
                       f"({e.a.dtype} vs {e.b.dtype}); insert a Cast", e)
        super().visit_compare(e)

    def visit_unary_op(self, e: t.UnaryOp) -> None:
        if e.op == "neg" and e.a.dtype == "bool":
            self.fault("'neg' is not defined on bool; use 'not'", e)
        if e.op == "not" and dt.is_float(e.a.dtype):
            self.fault(f"'not' is not defined on floats ({e.a.dtype})", e)
        super().visit_unary_op(e)

    def visit_select(self, e: t.Select) -> None:
        if e.cond.dtype != "bool":
            self.fault(f"Select condition has dtype {e.cond.dtype}; it must be bool", e)
        if e.true_value.dtype != e.false_value.dtype:
            self.fault(f"Select branches have different dtypes ({e.true_value.dtype} vs "
                       f"{e.false_value.dtype})", e)
        super().visit_select(e)

    def visit_reinterpret(self, e: t.Reinterpret) -> None:
        fault = t.reinterpret_fault(e.value.dtype, e.dtype)
        if fault is not None:
            self.fault(fault, e)
        super().visit_reinterpret(e)

    def check_check(self, e: t.Intrin) -> None:
        cond, code = e.args
        if cond.dtype != "bool":
            self.fault(f"intrinsic 'check' needs a bool condition, got {cond.dtype}", e)
        own = dict(self.fn.attrs.get(ATTR_CHECK_MESSAGES, ()) or ())  # the function's codes
        if not (isinstance(code, t.Const) and code.dtype == "int32"
                and (int(code.value) in KERNEL_ERRORS or int(code.value) in own)
                and int(code.value) > 1):
            self.fault(f"intrinsic 'check' needs an int32 constant error code of "
                       f"kiln.ir.kernel_errors, got {code}", e)

    def visit_load(self, e: t.Load) -> None:
        self.check_use(e.buffer, at=e)
        self.check_indices(e.buffer, e.indices, e, "Load")
        for i in e.indices:
            self.visit_expr(i)

    def visit_evaluate(self, s: t.Evaluate) -> None:
        e = s.value
        if isinstance(e, t.Intrin) and e.name == t.CHECK_INTRINSIC:
            self.check_check(e)
            for a in e.args:
                self.visit_expr(a)
            return
        if isinstance(e, t.Intrin) and e.name in (t.PREFETCH_INTRINSIC, t.TERMINATE_CHECK):
            (address,) = e.args
            if not isinstance(address, t.Load):
                self.fault(f"intrinsic '{e.name}' takes a buffer element (a Load), got "
                           f"{type(address).__name__}", e)
            elif e.name == t.TERMINATE_CHECK and address.dtype != "int32":
                self.fault(f"intrinsic '{e.name}' reads an int32 flag, got {address.dtype}", e)
            self.visit_expr(address)
            return
        super().visit_evaluate(s)

    def visit_intrin(self, e: t.Intrin) -> None:
        if e.name in (t.CHECK_INTRINSIC, t.PREFETCH_INTRINSIC, t.TERMINATE_CHECK):
            self.fault(f"intrinsic '{e.name}' is valid only as the value of an Evaluate", e)
        first = e.args[0].dtype
        if e.name == t.DOT2_BF16:
            if first != "float32" or any(a.dtype != "int32" for a in e.args[1:]):
                self.fault(f"intrinsic '{e.name}' takes a float32 sum and two int32 words "
                           f"(bfloat16 pairs), got {[a.dtype for a in e.args]}", e)
            super().visit_intrin(e)
            return
        if e.name == t.BF16_PAIR:
            if any(a.dtype != "float32" for a in e.args):
                self.fault(f"intrinsic '{e.name}' takes two float32 values, got "
                           f"{[a.dtype for a in e.args]}", e)
            super().visit_intrin(e)
            return
        if e.name in t.DOT4_INTRINSICS and first != "int32":
            self.fault(f"intrinsic '{e.name}' takes int32 arguments (4 packed bytes), "
                       f"got {first}", e)
        elif e.name in t.PROFILE_INTRINSICS and first != "int64":
            self.fault(f"intrinsic '{e.name}' takes int64 arguments, got {first}", e)
        elif (not dt.is_float(first) and e.name not in t.PROFILE_INTRINSICS
              and e.name not in t.DOT4_INTRINSICS
              and not (e.name in _INT_INTRINSICS and dt.is_int(first))):
            need = "a float or integer" if e.name in _INT_INTRINSICS else "a float"
            self.fault(f"intrinsic '{e.name}' needs {need} argument, got {first}", e)
        for a in e.args[1:]:
            if a.dtype != first:
                self.fault(f"arguments of intrinsic '{e.name}' have different dtypes "
                           f"({first} vs {a.dtype})", e)
        super().visit_intrin(e)

    def visit_buffer_use(self, b: t.Buffer) -> None:
        self.check_use(b)


def _is_static(b: t.Buffer) -> bool:
    return all(isinstance(d, int) for d in b.shape)


def _shapes_compatible(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """Equal ranks and equal static dimensions (symbolic ones are checked at run time)."""
    return len(a) == len(b) and all(
        x == y for x, y in zip(a, b) if isinstance(x, int) and isinstance(y, int))


def _type_key(ty: Type) -> object:
    """`ty` with its symbolic dimensions by name: a body function has its own
    dimension variables, named as its caller's (docs/ir.md)."""
    if isinstance(ty, TupleType):
        return tuple(_type_key(f) for f in ty.fields)
    return (shape_text(ty.shape), ty.dtype)


def _param_names(fn: t.PrimFunc) -> str:
    return ", ".join(p.name for p in fn.params) or "no parameters"


class _GraphVerifier:
    def __init__(self, name: str, fn: g.Function, mod: IRModule | None) -> None:
        self.name = name
        self.fn = fn
        self.mod = mod
        self.live: set[int] = set()
        self.later: set[int] = {id(b.var) for b in fn.bindings}
        self.where: object = fn

    def fault(self, message: str, node: object = None) -> NoReturn:
        raise _Fault(message, node, self.where)

    def run(self) -> None:
        for i, p in enumerate(self.fn.params):
            if id(p) in self.live:
                self.fault(f"parameter {i} '{p.name}' appears twice in the parameter list", p)
            self.live.add(id(p))
        for b in self.fn.bindings:
            self.where = b
            self.expr(b.value)
            if id(b.var) in self.live:
                self.fault(f"redefinition of variable '{b.var.name}': it is already bound", b.var)
            value_type = self.type_of(b.value)
            if value_type != b.var.var_type:
                self.fault(f"binding '{b.var.name}' is declared {b.var.var_type} but its value "
                           f"has type {value_type}", b.var)
            self.live.add(id(b.var))
        self.where = self.fn.result
        self.expr(self.fn.result)
        self.type_of(self.fn.result)

    def type_of(self, e: g.Expr) -> Type:
        try:
            return e.type
        except IRError as exc:
            self.fault(str(exc), e)

    def expr(self, e: g.Expr) -> None:
        if isinstance(e, g.Var):
            if id(e) not in self.live:
                when = "before its definition" if id(e) in self.later else "but never defined"
                self.fault(f"graph variable '{e.name}' is used {when}", e)
        elif isinstance(e, g.Constant):
            pass
        elif isinstance(e, g.Call):
            for a in e.args:
                self.expr(a)
        elif isinstance(e, g.CallTensor):
            for a in e.args:
                self.expr(a)
            self.call_tensor(e)
        elif isinstance(e, g.Tuple):
            for f in e.fields:
                self.expr(f)
        elif isinstance(e, (g.If, g.Loop)):
            for x in graph_children(e):
                self.expr(x)
            self.control_flow(e)
        elif isinstance(e, g.TupleGetItem):
            self.expr(e.tuple_value)
            ty = self.type_of(e.tuple_value)
            if not isinstance(ty, TupleType):
                self.fault(f"TupleGetItem of a non-tuple value of type {ty}", e)
            if not 0 <= e.index < len(ty.fields):
                self.fault(f"TupleGetItem index {e.index} is out of range for a tuple of "
                           f"{len(ty.fields)} field(s)", e)
        else:
            self.fault(f"unknown graph expression {type(e).__name__}", e)

    def control_flow(self, e: g.If | g.Loop) -> None:
        """Types of an If's condition and branches, a Loop's operands and body."""
        bool0, int0 = TensorType((), "bool"), TensorType((), "int64")
        if isinstance(e, g.If):
            if _type_key(self.type_of(e.cond)) != _type_key(bool0):
                self.fault(f"if condition has type {self.type_of(e.cond)}; it must be a 0-d "
                           "bool tensor", e)
            arg_types = [self.type_of(a) for a in e.args]
            for branch in (e.then_branch, e.else_branch):
                self.callee(e, branch, arg_types, e.ret_type)
            return
        if e.trip_count is None and e.cond is None:
            self.fault(f"loop '{e.body}' has neither a trip count nor a condition: it would "
                       "never end", e)
        if e.trip_count is not None and _type_key(self.type_of(e.trip_count)) != _type_key(int0):
            self.fault(f"loop trip count has type {self.type_of(e.trip_count)}; it must be a "
                       "0-d int64 tensor", e)
        if e.cond is not None and _type_key(self.type_of(e.cond)) != _type_key(bool0):
            self.fault(f"loop condition has type {self.type_of(e.cond)}; it must be a 0-d "
                       "bool tensor", e)
        states = [self.type_of(s) for s in e.states]
        fields = e.ret_type.fields
        if len(fields) < len(states):
            self.fault(f"loop type {e.ret_type} has fewer fields than the {len(states)} "
                       "loop-carried value(s)", e)
        for k, (st, ft) in enumerate(zip(states, fields)):
            if _type_key(st) != _type_key(ft):
                self.fault(f"loop-carried value {k} has type {st} but the loop's type says "
                           f"{ft} (a loop-carried value keeps its type)", e)
        scans = []
        for ft in fields[len(states):]:
            if not isinstance(ft, TensorType) or not ft.shape:
                self.fault(f"loop scan output type {ft} needs a leading axis (one slice per "
                           "iteration)", e)
            scans.append(TensorType(ft.shape[1:], ft.dtype))
        params = [int0, bool0, *states, *(self.type_of(c) for c in e.captures)]
        self.callee(e, e.body, params, TupleType((bool0, *states, *scans)))

    def callee(self, e: g.Expr, name: str, params: list[Type], ret: Type) -> None:
        """Graph function `name` of the module takes `params` and returns `ret`."""
        if self.mod is None:
            return
        fn = self.mod.functions.get(name)
        if not isinstance(fn, g.Function):
            names = list(self.mod.graph_funcs())
            what = "missing" if fn is None else "not a graph function"
            self.fault(f"control flow calls '{name}', which is {what}.{suggest(name, names)} "
                       f"Graph functions: {', '.join(names) or '(none)'}", e)
        got = [p.var_type for p in fn.params]
        if [_type_key(x) for x in got] != [_type_key(x) for x in params]:
            self.fault(f"'{name}' takes ({', '.join(map(str, got))}) but control flow passes "
                       f"({', '.join(map(str, params))})", e)
        if _type_key(fn.ret_type) != _type_key(ret):
            self.fault(f"'{name}' returns {fn.ret_type} but control flow expects {ret}", e)

    def call_tensor(self, e: g.CallTensor) -> None:
        fields = e.ret_type.fields if isinstance(e.ret_type, TupleType) else (e.ret_type,)
        for f in fields:
            if not isinstance(f, TensorType):
                self.fault(f"call_tensor output type {f} is not a tensor", e)
        if self.mod is None:
            return
        if e.func not in self.mod:
            names = list(self.mod.prim_funcs())
            self.fault(f"CallTensor to missing PrimFunc '{e.func}'.{suggest(e.func, names)} "
                       f"PrimFuncs: {', '.join(names) or '(none)'}", e)
        callee = self.mod[e.func]
        if not isinstance(callee, t.PrimFunc):
            self.fault(f"CallTensor target '{e.func}' is a graph function, not a PrimFunc", e)
        n_in, n_out, n_params = len(e.args), len(fields), len(callee.params)
        if n_in + n_out != n_params:
            self.fault(f"CallTensor to '{e.func}' passes {n_in} argument(s) + {n_out} output(s) "
                       f"= {n_in + n_out}, but it takes {n_params} parameters "
                       f"({_param_names(callee)})", e)
        arg_types = [self.type_of(a) for a in e.args] + list(fields)
        for k, (ty, p) in enumerate(zip(arg_types, callee.params)):
            role = f"argument {k}" if k < n_in else f"output {k - n_in}"
            where = f"CallTensor to '{e.func}': {role} for parameter '{p.name}'"
            if not isinstance(p, t.Buffer):
                self.fault(f"{where}: the parameter is a scalar; CallTensor passes tensors "
                           "only", e)
            if not isinstance(ty, TensorType):
                self.fault(f"{where} has type {ty}, expected a tensor", e)
            if ty.dtype != p.dtype:
                self.fault(f"{where} has dtype {ty.dtype}, expected {p.dtype}", e)
            if not _shapes_compatible(ty.shape, p.shape):
                self.fault(f"{where} has shape {_shape_str(ty.shape)}, expected "
                           f"{_shape_str(p.shape)}", e)

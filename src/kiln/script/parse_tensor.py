"""Parse the body of a `@T.prim_func` into IRBuilder calls.

Literals: a bare Python number adopts the dtype of the typed operand beside it
(`X[i] + 1` with float32 X is `X[i] + T.float32(1.0)`), is int64 in index and
loop positions, and otherwise takes the default of its Python type (int64,
float32, bool). Python operators between two bare numbers are computed by
Python (`4 * 2` is 8); `T.*` functions always build IR nodes.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, NoReturn, TypeGuard

from kiln._registry import suggest
from kiln.ir import dtype as dt
from kiln.ir import tensor as t
from kiln.ir.dtype import DTYPES, INDEX_DTYPE
from kiln.ir.tensor import INTRINSICS, Buffer, PrimExpr, Var
from kiln.script.diagnostics import ScriptError
from kiln.script.namespace import BINARY_FUNCS, LOOP_KINDS
from kiln.script.parser import MISSING, Parser, is_docstring, is_number

# A value while parsing: an IR expression, a buffer, or a bare Python number.
Plain = int | float | bool
Value = PrimExpr | Buffer | Plain

_BINOPS: dict[type, str] = {
    ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div",
    ast.FloorDiv: "floordiv", ast.Mod: "floormod", ast.Pow: "pow", ast.BitAnd: "and",
    ast.BitOr: "or", ast.BitXor: "xor", ast.LShift: "shl", ast.RShift: "shr",
}
_CMPOPS: dict[type, str] = {
    ast.Eq: "eq", ast.NotEq: "ne", ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge",
}
_PY_COMPARE = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
               "gt": operator.gt, "ge": operator.ge}
# T.* names that are valid in expression position (for suggestions).
_EXPR_FUNCS = sorted({*DTYPES, *BINARY_FUNCS, *INTRINSICS, "select", "cast", "reinterpret",
                      "call_extern"})
_STMT_FUNCS = {
    "serial": "a loop iterator: `for i in T.serial(n):`",
    "parallel": "a loop iterator: `for i in T.parallel(n):`",
    "vectorized": "a loop iterator: `for i in T.vectorized(n):`",
    "vector": "a straight-line vector loop: `for v in T.vector(8):`",
    "unrolled": "a loop iterator: `for i in T.unrolled(n):`",
    "scalar": "a loop kept scalar (not vectorized): `for i in T.scalar(n):`",
    "block_x": "a GPU block loop: `for b in T.block_x(n):`",
    "thread_x": "a GPU thread loop: `for t in T.thread_x(n):`",
    "let": "a binding: `x = T.let(value)`",
    "allocate": "a declaration: `buf = T.allocate(shape, dtype, scope=...)`",
    "alloc_const": "a declaration: `buf = T.alloc_const(data)`",
    "decl_buffer": "a declaration: `buf = T.decl_buffer(shape, dtype, source=...)`",
    "evaluate": "a statement: `T.evaluate(expr)`",
    "call_func": "a statement: `T.call_func(\"name\", [args])`",
    "func_attr": "a statement at the top of the function body",
    "extern_dependency": "the dependency= argument of T.call_extern",
    "Buffer": "a parameter annotation: `X: T.Buffer((4,), \"float32\")`",
    "prim_func": "a decorator",
}


class TensorFunctionParser:
    """Parses one `@T.prim_func` definition."""

    def __init__(self, parser: Parser) -> None:
        self.p = parser
        self.ib = parser.ib

    def fail(self, node: ast.AST | None, message: str) -> NoReturn:
        self.p.fail(node, message)

    # ------------------------------------------------------------------ function

    def function(self, node: ast.FunctionDef, name: str) -> None:
        check_plain_signature(self.p, node)
        if node.returns is not None and not (
                isinstance(node.returns, ast.Constant) and node.returns.value is None):
            self.fail(node.returns, "a @T.prim_func returns nothing (it writes its outputs "
                                    "into buffer parameters); remove the return annotation")
        with self.p.at(node), self.ib.prim_func(name), self.p.scope() as frame:
            params = self._param_specs(node.args.args)
            # Scalar parameters first: buffer shapes may name any of them.
            for arg, spec in params:
                if isinstance(spec, Var):
                    frame[arg.arg] = spec
            shape_vars: dict[str, Var] = {}
            for arg, spec in params:
                if isinstance(spec, Var):
                    self.ib.scalar_arg(spec.name, spec.dtype, var=spec)
                else:
                    buf = self._buffer_param(arg.arg, spec, shape_vars)
                    self.ib.arg(buf.name, buf.shape, buf.dtype, buffer=buf)
                    frame[arg.arg] = buf
            for var_name, var in shape_vars.items():
                frame.setdefault(var_name, var)
            body = node.body[1:] if is_docstring(node.body[0]) else node.body
            if not body:
                self.fail(node, f"prim_func {name!r} has an empty body")
            self.stmts(body, top=True)

    def _param_specs(self, args: list[ast.arg]) -> list[tuple[ast.arg, Var | ast.Call]]:
        out: list[tuple[ast.arg, Var | ast.Call]] = []
        for arg in args:
            ann = arg.annotation
            if ann is None:
                self.fail(arg, f"parameter {arg.arg!r} needs an annotation: "
                               f"T.Buffer(shape, dtype) or a scalar type such as T.int64")
            ref = self.p.dsl_ref(ann.func if isinstance(ann, ast.Call) else ann)
            if ref is not None and ref[0] == "T" and ref[1] in DTYPES and not isinstance(
                    ann, ast.Call):
                out.append((arg, Var(arg.arg, ref[1])))
            elif isinstance(ann, ast.Call) and ref == ("T", "Buffer"):
                out.append((arg, ann))
            else:
                self.fail(ann, f"parameter {arg.arg!r}: expected T.Buffer(shape, dtype) or a "
                               "scalar type such as T.int64 / T.float32")
        return out

    def _buffer_param(self, name: str, ann: ast.Call, shape_vars: dict[str, Var]) -> Buffer:
        kws = self.p.keywords(ann, "T.Buffer", ("shape", "dtype", "scope"))
        args = _bind_args(self.p, ann, "T.Buffer", ann.args, kws, ("shape", "dtype", "scope"),
                          required=2)
        scope = self.p.scope_arg(args.get("scope"))
        with self.p.at(ann):
            return Buffer(name, self.shape(args["shape"], shape_vars),
                          self.p.dtype_arg(args["dtype"]), scope)

    def shape(self, node: ast.expr, implicit: dict[str, Var] | None = None) -> tuple[Any, ...]:
        """A shape: ints, or index expressions over variables in scope.

        With `implicit` (parameter shapes), a name bound nowhere is a shape
        variable: an int64 Var, the same one for every use of the name, that
        the arguments' shapes define at run time.
        """
        if implicit is None:
            return self._shape(node)
        for sub in ast.walk(node):
            if (isinstance(sub, ast.Name) and sub.id not in implicit
                    and self.p.lookup(sub.id) is MISSING and sub.id not in self.p.env):
                implicit[sub.id] = Var(sub.id, INDEX_DTYPE)
        with self.p.scope(dict(implicit)):
            return self._shape(node)

    def _shape(self, node: ast.expr) -> tuple[Any, ...]:
        if not isinstance(node, (ast.Tuple, ast.List)):
            value = self.p.static(node, "a shape tuple")
            if not isinstance(value, (tuple, list)):
                self.fail(node, "a shape is a tuple: (4,) or (n, 4)")
            return tuple(self._dim(node, v) for v in value)
        return tuple(self._dim(e, self.expr(e)) for e in node.elts)

    def _dim(self, node: ast.expr, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, PrimExpr)):
            self.fail(node, f"a shape dimension must be an int or an index expression, "
                            f"got {value!r}")
        if isinstance(value, int) and value < 0:
            self.fail(node, f"negative dimension {value}")
        return value

    # ------------------------------------------------------------------ statements

    def stmts(self, nodes: Sequence[ast.stmt], top: bool = False) -> None:
        for node in nodes:
            with self.p.at(node):
                self.stmt(node, top)

    def block(self, nodes: Sequence[ast.stmt], bindings: dict[str, Any]) -> None:
        with self.p.scope(bindings):
            self.stmts(nodes)

    def stmt(self, node: ast.stmt, top: bool) -> None:
        if isinstance(node, ast.For):
            self._for(node)
        elif isinstance(node, ast.With):
            self._with(node, list(node.items))
        elif isinstance(node, ast.If):
            self._if(node)
        elif isinstance(node, ast.While):
            self._while(node)
        elif isinstance(node, ast.Assign):
            if len(node.targets) != 1:
                self.fail(node, "one assignment target per statement")
            if not self._declaration(node.targets[0], node.value):
                self._store(node, node.targets[0], node.value)
        elif isinstance(node, ast.AugAssign):
            self._aug_store(node)
        elif isinstance(node, ast.AnnAssign):
            self.fail(node, "annotated assignment is graph-level syntax; bind a scalar with "
                            "`x = T.let(value)`")
        elif isinstance(node, ast.Expr):
            self._expr_stmt(node, top)
        elif isinstance(node, ast.Pass):
            self.ib.emit_stmt(t.SeqStmt(()))  # an empty block; no-op beside other statements
        elif isinstance(node, ast.Return):
            self.fail(node, "a @T.prim_func returns nothing: it writes its outputs into "
                            "buffer parameters")
        else:
            self.fail(node, f"unsupported statement `{type(node).__name__.lower()}` in a "
                            "@T.prim_func; use T.serial and while loops, if/else, `x = T.let(...)` "
                            "bindings, "
                            "`buf = T.allocate/T.alloc_const/T.decl_buffer(...)` "
                            "declarations and buffer stores")

    def _for(self, node: ast.For) -> None:
        if node.orelse:
            self.fail(node.orelse[0], "for-else is not supported")
        if not isinstance(node.target, ast.Name):
            self.fail(node.target, "a loop variable is a single name: `for i in T.serial(n):`")
        it = node.iter
        if not isinstance(it, ast.Call):
            self.fail(it, "loop over T.serial/T.parallel/T.vectorized/T.unrolled(...) "
                          "or range(...)")
        ref = self.p.dsl_ref(it.func)
        if (isinstance(it.func, ast.Name) and it.func.id == "range"
                and self.p.lookup("range") is MISSING):
            kind = "serial"
            allowed: tuple[str, ...] = ()
        elif ref is not None and ref[0] == "T" and ref[1] in LOOP_KINDS:
            kind = LOOP_KINDS[ref[1]]
            allowed = ("extent", "dtype")
        else:
            self.fail(it, "loop over T.serial/T.parallel/T.vectorized/T.unrolled(...) "
                          "or range(...)")
        kws = self.p.keywords(it, "the loop iterator", allowed)
        if not 1 <= len(it.args) <= 2:
            self.fail(it, "a loop takes (stop), (start, stop) or (start, extent=e)")
        if "extent" in kws and len(it.args) != 1:
            self.fail(it, "with extent= pass only the start: T.serial(start, extent=e)")
        bounds = [self.index(a) for a in it.args]
        extent = self.index(kws["extent"]) if "extent" in kws else None
        name = node.target.id
        var = Var(name, self.p.dtype_arg(kws["dtype"])) if "dtype" in kws else None
        stop = bounds[1] if len(bounds) == 2 else None
        with self.ib.for_range(bounds[0], stop, name=name, kind=kind, var=var,
                               extent=extent) as v:
            self.block(node.body, {name: v})

    def _declaration(self, target: ast.expr, value: ast.expr) -> bool:
        """`name = T.let/T.allocate/T.alloc_const/T.decl_buffer(...)`: a let or a
        declaration whose variable or buffer is in scope for the rest of the block
        (False: not a declaration)."""
        ref = self.p.dsl_ref(value.func) if isinstance(value, ast.Call) else None
        declare = self._DECLARATIONS.get(ref[1]) if ref is not None and ref[0] == "T" else None
        if declare is None or ref is None or not isinstance(value, ast.Call):
            return False
        if not isinstance(target, ast.Name):
            what = "binds a variable" if ref[1] == "let" else "declares a buffer"
            self.fail(target, f"T.{ref[1]}(...) {what}: assign it to a single "
                              f"name, `x = T.{ref[1]}(...)`")
        self.p.scopes[-1][target.id] = declare(self, value, target.id)
        return True

    def _with(self, node: ast.With, items: list[ast.withitem]) -> None:
        """The older `with T.let/T.allocate/T.alloc_const/T.decl_buffer(...) as name:`
        form still parses: it binds the variable or declares the buffer in the
        enclosing block (a flat statement) and names it for the `with` body (items
        nest)."""
        item = items[0]
        call = item.context_expr
        ref = self.p.dsl_ref(call.func) if isinstance(call, ast.Call) else None
        opener = self._SCOPES.get(ref[1]) if ref is not None and ref[0] == "T" else None
        if opener is None or not isinstance(call, ast.Call):
            self.fail(call, "expected `with T.let/T.allocate/T.alloc_const/T.decl_buffer(...)"
                            " as name:`")
        assert ref is not None
        if not isinstance(item.optional_vars, ast.Name):
            self.fail(call, f"T.{ref[1]}(...) needs a single name: "
                            f"`with T.{ref[1]}(...) as name:`")
        name = item.optional_vars.id
        with opener(self, call, name) as bound, self.p.scope({name: bound}):
            if len(items) > 1:
                self._with(node, items[1:])
            else:
                self.stmts(node.body)

    def _let(self, call: ast.Call, name: str) -> Var:
        kws = self.p.keywords(call, "T.let", ("dtype",))
        if len(call.args) != 1:
            self.fail(call, "T.let takes the value only (the name comes from the "
                            "assignment): `x = T.let(value)`")
        value = self.prim(call.args[0])
        var = Var(name, self.p.dtype_arg(kws["dtype"])) if "dtype" in kws else None
        return self.ib.declare_let(name, value, var=var)

    def _allocate(self, call: ast.Call, name: str) -> Buffer:
        params = ("shape", "dtype", "scope")
        kws = self.p.keywords(call, "T.allocate", params)
        args = _bind_args(self.p, call, "T.allocate", call.args, kws, params, required=2)
        shape, dtype = self.shape(args["shape"]), self.p.dtype_arg(args["dtype"])
        return self.ib.declare_allocate(name, shape, dtype, self.p.scope_arg(args.get("scope")))

    def _alloc_const(self, call: ast.Call, name: str) -> Buffer:
        arr, kws = self.p.data(call, "T.alloc_const", ("buffer_shape", "buffer_dtype", "scope"))
        buffer = None
        if kws:  # the buffer's own shape / dtype / scope differ from the data's
            shape = self.shape(kws["buffer_shape"]) if "buffer_shape" in kws else arr.shape
            dtype = (self.p.dtype_arg(kws["buffer_dtype"]) if "buffer_dtype" in kws
                     else dt.from_numpy(arr.dtype))
            buffer = Buffer(name, shape, dtype, self.p.scope_arg(kws.get("scope")))
        return self.ib.declare_const(name, arr, buffer=buffer)

    def _decl_buffer(self, call: ast.Call, name: str) -> Buffer:
        params = ("shape", "dtype", "source", "byte_offset", "scope")
        kws = self.p.keywords(call, "T.decl_buffer", params)
        args = _bind_args(self.p, call, "T.decl_buffer", call.args, kws, params, required=2)
        if "source" not in args:
            self.fail(call, "T.decl_buffer needs source=<buffer>")
        source = self.expr(args["source"])
        if not isinstance(source, Buffer):
            self.fail(args["source"], "source= must be a buffer")
        offset: Any = 0
        if "byte_offset" in args:  # an int, or an expression over shape variables
            offset = self._dim(args["byte_offset"], self.expr(args["byte_offset"]))
            if isinstance(offset, t.Const):
                offset = int(offset.value)
        buf = Buffer(name, self.shape(args["shape"]), self.p.dtype_arg(args["dtype"]),
                     self.p.scope_arg(args.get("scope")))
        return self.ib.declare_view(name, buf.shape, buf.dtype, source, offset, buffer=buf)

    _DECLARATIONS: dict[str, Callable[[Any, ast.Call, str], Buffer | Var]] = {
        "let": _let, "allocate": _allocate, "alloc_const": _alloc_const,
        "decl_buffer": _decl_buffer,
    }

    @contextmanager
    def _open_declaration(self, call: ast.Call, name: str) -> Iterator[Buffer | Var]:
        ref = self.p.dsl_ref(call.func)
        assert ref is not None
        yield self._DECLARATIONS[ref[1]](self, call, name)

    _SCOPES: dict[str, Callable[[Any, ast.Call, str], AbstractContextManager[Any]]] = {
        "let": _open_declaration, "allocate": _open_declaration, "alloc_const": _open_declaration,
        "decl_buffer": _open_declaration,
    }

    def _if(self, node: ast.If) -> None:
        cond = self.prim(node.test)
        with self.ib.if_(cond):
            self.block(node.body, {})
        if node.orelse:
            with self.ib.else_():
                self.block(node.orelse, {})

    def _while(self, node: ast.While) -> None:
        if node.orelse:
            self.fail(node.orelse[0], "while-else is not supported")
        cond = self.prim(node.test)
        with self.ib.while_(cond):
            self.block(node.body, {})

    def _target(self, target: ast.expr) -> tuple[Buffer, list[PrimExpr]]:
        if isinstance(target, ast.Name):
            self.fail(target, f"cannot assign to {target.id!r}: store into a buffer "
                              f"(`A[i] = value`) or bind a scalar with "
                              f"`{target.id} = T.let(value)`")
        if not isinstance(target, ast.Subscript):
            self.fail(target, "the target of an assignment is a buffer element: A[i, j]")
        buf = self.expr(target.value)
        if not isinstance(buf, Buffer):
            self.fail(target.value, f"`{ast.unparse(target.value)}` is not a buffer")
        return buf, self.indices(target.slice)

    def _store(self, node: ast.stmt, target: ast.expr, value_node: ast.expr) -> None:
        buf, indices = self._target(target)
        value = self._store_value(value_node, buf, self.expr(value_node))
        self.ib.store(buf, indices, value)

    def _aug_store(self, node: ast.AugAssign) -> None:
        op = _BINOPS.get(type(node.op))
        if op is None:
            self.fail(node, f"augmented operator {type(node.op).__name__} is not supported")
        buf, indices = self._target(node.target)
        rhs = self._store_value(node.value, buf, self.expr(node.value))
        value = self._binary(node, op, t.Load(buf, tuple(indices)), rhs)
        self.ib.store(buf, indices, value)

    def _store_value(self, node: ast.expr, buf: Buffer, value: Value) -> PrimExpr | Plain:
        if isinstance(value, Buffer):
            self.fail(node, f"buffer {ast.unparse(node)!r} used as a value; index it")
        if isinstance(value, float) and not dt.is_float(buf.dtype):
            self.fail(node, f"cannot store the float literal {value!r} into "
                            f"{buf.dtype} buffer {buf.name!r}")
        return value

    def _expr_stmt(self, node: ast.Expr, top: bool) -> None:
        call = node.value
        ref = self.p.dsl_ref(call.func) if isinstance(call, ast.Call) else None
        if isinstance(call, ast.Call) and ref == ("T", "evaluate"):
            if len(call.args) != 1 or call.keywords:
                self.fail(call, "T.evaluate takes one expression")
            self.ib.evaluate(self.prim(call.args[0]))
        elif isinstance(call, ast.Call) and ref == ("T", "call_func"):
            self._call_func(call)
        elif isinstance(call, ast.Call) and ref == ("T", "func_attr"):
            if not top:
                self.fail(call, "T.func_attr belongs at the top level of the function body")
            for key, value in self.p.attr_dict(call, "T.func_attr").items():
                self.ib.func_attr(key, value)
        elif is_docstring(node):
            self.fail(node, "a string statement is only allowed as the function's docstring")
        else:
            self.fail(node, "an expression statement must be T.evaluate(...), "
                            "T.call_func(...) or T.func_attr(...)")

    def _call_func(self, call: ast.Call) -> None:
        if len(call.args) != 2 or call.keywords:
            self.fail(call, "T.call_func takes a function name and a list of arguments: "
                            "T.call_func(\"kernel\", [A, B, n])")
        name = self.p.str_arg(call.args[0], "the function name")
        args_node = call.args[1]
        if not isinstance(args_node, (ast.List, ast.Tuple)):
            self.fail(args_node, "the arguments of T.call_func are a list: [A, B, n]")
        args: list[Buffer | PrimExpr] = []
        for a in args_node.elts:
            v = self.expr(a)
            args.append(v if isinstance(v, Buffer) else self.to_prim(a, v))
        self.ib.call_func(name, args)

    # ------------------------------------------------------------------ expressions

    def prim(self, node: ast.expr) -> PrimExpr:
        """An expression as a PrimExpr (a bare number takes its default dtype)."""
        return self.to_prim(node, self.expr(node))

    def to_prim(self, node: ast.expr, value: Value) -> PrimExpr:
        if isinstance(value, Buffer):
            self.fail(node, f"buffer {value.name!r} used as a value; index it: "
                            f"{ast.unparse(node)}[...]")
        return t.as_expr(value)

    def index(self, node: ast.expr) -> PrimExpr:
        """An index or loop bound: a bare int is int64."""
        value = self.expr(node)
        if isinstance(value, Buffer):
            self.fail(node, f"buffer {value.name!r} used as an index")
        if isinstance(value, (bool, float)):
            self.fail(node, f"an index must be an integer, got {value!r}")
        return t.as_expr(value, INDEX_DTYPE)

    def indices(self, node: ast.expr) -> list[PrimExpr]:
        items = node.elts if isinstance(node, ast.Tuple) else [node]
        for item in items:
            if isinstance(item, ast.Slice):
                self.fail(item, "slices are not supported; index one element per dimension")
        return [self.index(i) for i in items]

    def expr(self, node: ast.expr) -> Value:
        with self.p.at(node):
            return self._expr(node)

    def _expr(self, node: ast.expr) -> Value:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, (bool, int, float)) and not isinstance(
                    node.value, complex):
                return node.value
            self.fail(node, f"{node.value!r} is not a tensor-level value")
        if isinstance(node, ast.Name):
            return self._name(node)
        if isinstance(node, ast.UnaryOp):
            return self._unary(node)
        if isinstance(node, ast.BinOp):
            op = _BINOPS.get(type(node.op))
            if op is None:
                self.fail(node, f"operator `{_op_text(node)}` is not supported")
            a, b = self.expr(node.left), self.expr(node.right)
            if _is_plain(a) and _is_plain(b):
                return self.p.fold_binop(node, a, b)
            return self._binary(node, op, a, b)
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.BoolOp):
            op = "and" if isinstance(node.op, ast.And) else "or"
            values = [self.expr(v) for v in node.values]
            result = values[0]
            for v, vnode in zip(values[1:], node.values[1:]):
                result = self._binary(vnode, op, result, v)
            return result
        if isinstance(node, ast.Subscript):
            buf = self.expr(node.value)
            if not isinstance(buf, Buffer):
                self.fail(node.value, f"`{ast.unparse(node.value)}` is not a buffer")
            return t.Load(buf, tuple(self.indices(node.slice)))
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.IfExp):
            self.fail(node, "use T.select(cond, a, b) instead of `a if cond else b`")
        self.fail(node, f"unsupported expression `{ast.unparse(node)}` in a @T.prim_func")

    def _name(self, node: ast.Name) -> Value:
        bound = self.p.lookup(node.id)
        if bound is not MISSING:
            if isinstance(bound, (PrimExpr, Buffer)):
                return bound
            self.fail(node, f"{node.id!r} is not a tensor-level value")
        value = self.p.env.get(node.id, MISSING)
        if value is not MISSING:
            if hasattr(value, "item") and callable(value.item) and getattr(
                    value, "ndim", None) == 0:
                value = value.item()  # numpy scalar
            if isinstance(value, (bool, int, float)):
                return value
            self.fail(node, f"{node.id!r} is a {type(value).__name__}, not a number or a "
                            "DSL variable")
        known = self.p.visible_names()
        self.fail(node, f"unknown name {node.id!r};{suggest(node.id, known)}".rstrip(";"))

    def _unary(self, node: ast.UnaryOp) -> Value:
        value = self.expr(node.operand)
        if isinstance(value, Buffer):
            self.fail(node, f"buffer {value.name!r} used as a value")
        if _is_plain(value):
            if isinstance(node.op, ast.USub):
                return -value
            if isinstance(node.op, ast.UAdd):
                return +value
            if isinstance(node.op, ast.Not):
                return not value
            if isinstance(value, float):
                self.fail(node, "`~` needs an integer")
            return ~value
        assert isinstance(value, PrimExpr)
        if isinstance(node.op, ast.UAdd):
            return value
        return t.UnaryOp("neg" if isinstance(node.op, ast.USub) else "not", value)

    def _binary(self, node: ast.AST, op: str, a: Value, b: Value) -> PrimExpr:
        for v in (a, b):
            if isinstance(v, Buffer):
                self.fail(node, f"buffer {v.name!r} used as a value; index it")
        assert not isinstance(a, Buffer) and not isinstance(b, Buffer)
        with self.p.at(node):
            result = t.binary(op, a, b)
        if op == "div" and not dt.is_float(result.dtype):
            self.fail(node, f"'/' on {result.dtype} operands: use '//' (floor division) or "
                            "T.truncdiv(a, b) (C division)")
        return result

    def _compare(self, node: ast.Compare) -> Value:
        if len(node.ops) != 1:
            self.fail(node, "chained comparisons are not supported; use (a < b) & (b < c)")
        op = _CMPOPS.get(type(node.ops[0]))
        if op is None:
            self.fail(node, f"comparison `{type(node.ops[0]).__name__}` is not supported")
        a, b = self.expr(node.left), self.expr(node.comparators[0])
        if _is_plain(a) and _is_plain(b):
            return bool(_PY_COMPARE[op](a, b))
        for v in (a, b):
            if isinstance(v, Buffer):
                self.fail(node, f"buffer {v.name!r} used as a value; index it")
        assert not isinstance(a, Buffer) and not isinstance(b, Buffer)
        return t.compare(op, a, b)

    # ------------------------------------------------------------------ T.* calls

    def _call(self, node: ast.Call) -> Value:
        ref = self.p.dsl_ref(node.func)
        if ref is None:
            self.fail(node.func, f"unknown function `{ast.unparse(node.func)}`; tensor-level "
                                 "expressions call T.* functions")
        ns, name = ref
        if ns != "T":
            self.fail(node.func, f"{ns}.{name} is not tensor-level; a @T.prim_func uses T.*")
        if name in DTYPES:
            return self._typed_literal(node, name)
        if name in _STMT_FUNCS:
            self.fail(node.func, f"T.{name} is not an expression; it is {_STMT_FUNCS[name]}")
        if name == "call_extern":
            return self._call_extern(node)
        if node.keywords:
            self.fail(node.keywords[0], f"T.{name} takes no keyword arguments")
        if name == "cast":
            self._arity(node, name, 2)
            return t.Cast(self.p.dtype_arg(node.args[1]), self.prim(node.args[0]))
        if name == "reinterpret":
            self._arity(node, name, 2)
            value, dtype = self.prim(node.args[0]), self.p.dtype_arg(node.args[1])
            fault = t.reinterpret_fault(value.dtype, dtype)
            if fault is not None:
                self.fail(node, fault)
            return t.Reinterpret(dtype, value)
        args = [self.expr(a) for a in node.args]
        for a, anode in zip(args, node.args):
            if isinstance(a, Buffer):
                self.fail(anode, f"buffer {a.name!r} used as a value; index it")
        values: list[PrimExpr | int | float | bool] = [
            a for a in args if not isinstance(a, Buffer)]
        if name in BINARY_FUNCS:
            self._arity(node, name, 2)
            result = t.binary(BINARY_FUNCS[name], values[0], values[1])
            if name.startswith("trunc") and dt.is_float(result.dtype):
                alt = "'/'" if name == "truncdiv" else "T.fmod"
                self.fail(node, f"T.{name} needs integer operands; for floats use {alt}")
            return result
        if name == "select":
            self._arity(node, name, 3)
            return t.select(self.to_prim(node.args[0], values[0]), values[1], values[2])
        if name in INTRINSICS:
            self._arity(node, name, INTRINSICS[name])
            return t.intrin(name, *values)
        self.fail(node.func, f"unknown intrinsic '{name}';"
                             f"{suggest(name, _EXPR_FUNCS) or ' not a T function'}")

    def _arity(self, node: ast.Call, name: str, n: int) -> None:
        if len(node.args) != n:
            self.fail(node, f"T.{name} takes {n} argument(s), got {len(node.args)}")

    def _typed_literal(self, node: ast.Call, dtype: str) -> PrimExpr:
        if len(node.args) != 1 or node.keywords:
            self.fail(node, f"T.{dtype}(...) takes one number: T.{dtype}(1)")
        arg = node.args[0]
        try:
            value = self.p.static(arg)
        except ScriptError:  # not a constant: reported below with a hint
            value = MISSING
        if isinstance(value, str):
            special = value.strip().lower()
            if not dt.is_float(dtype) or special not in ("inf", "-inf", "nan", "+inf"):
                self.fail(arg, f"T.{dtype}({value!r}): only float types take a string, and "
                               "only \"inf\", \"-inf\" or \"nan\"")
            value = float(special)
        if value is MISSING or not is_number(value):
            self.fail(node, f"T.{dtype}(...) takes a number; to convert an expression use "
                            f"T.cast({ast.unparse(arg)}, \"{dtype}\")")
        if dt.is_bool(dtype) and not isinstance(value, bool):
            self.fail(arg, f"T.bool takes True or False, got {value!r}")
        if dt.is_int(dtype) and (isinstance(value, (bool, float))):
            self.fail(arg, f"T.{dtype} takes an int, got {value!r}")
        if dt.is_float(dtype) and isinstance(value, bool):
            self.fail(arg, f"T.{dtype} takes a number, got {value!r}")
        return t.Const(value, dtype)

    def _call_extern(self, node: ast.Call) -> PrimExpr:
        kws = self.p.keywords(node, "T.call_extern", ("dtype", "dependency"))
        if not node.args:
            self.fail(node, "T.call_extern takes the function name first: "
                            "T.call_extern(\"expf\", x, dtype=\"float32\")")
        if "dtype" not in kws:
            self.fail(node, "T.call_extern needs dtype= (the C return type)")
        name = self.p.str_arg(node.args[0], "the extern function name")
        args: list[PrimExpr | Buffer] = []
        for a in node.args[1:]:
            v = self.expr(a)
            args.append(v if isinstance(v, Buffer) else self.to_prim(a, v))
        dependency = None
        if "dependency" in kws:
            dependency = self._extern_dependency(kws["dependency"])
        return t.CallExtern(name, tuple(args), self.p.dtype_arg(kws["dtype"]), dependency)

    def _extern_dependency(self, node: ast.expr) -> t.ExternDependency | None:
        if isinstance(node, ast.Constant) and node.value is None:
            return None
        if not (isinstance(node, ast.Call)
                and self.p.dsl_ref(node.func) == ("T", "extern_dependency")):
            self.fail(node, "dependency= takes T.extern_dependency(\"libm\", libs=(\"-lm\",))")
        fields = ("short_name", "version_spec", "url", "url_type", "libs")
        kws = self.p.keywords(node, "T.extern_dependency", fields)
        args = _bind_args(self.p, node, "T.extern_dependency", node.args, kws, fields,
                          required=1)
        values: dict[str, Any] = {}
        for key, vnode in args.items():
            if key == "libs":
                libs = self.p.static(vnode, "a tuple of strings")
                if not isinstance(libs, (tuple, list)) or not all(
                        isinstance(x, str) for x in libs):
                    self.fail(vnode, "libs= takes a tuple of strings, e.g. (\"-lm\",)")
                values[key] = tuple(libs)
            else:
                values[key] = self.p.str_arg(vnode, key)
        return t.ExternDependency(**values)


def _is_plain(value: object) -> TypeGuard[Plain]:
    return isinstance(value, (bool, int, float))


def _op_text(node: ast.BinOp) -> str:
    return "@" if isinstance(node.op, ast.MatMult) else type(node.op).__name__


def _bind_args(
    p: Parser, call: ast.Call, what: str, args: Sequence[ast.expr],
    kws: dict[str, ast.expr], params: tuple[str, ...], required: int,
) -> dict[str, ast.expr]:
    """Positional and keyword arguments by parameter name (like Python binding)."""
    if len(args) > len(params):
        p.fail(call, f"{what} takes at most {len(params)} arguments ({', '.join(params)})")
    out: dict[str, ast.expr] = dict(zip(params, args))
    for key, value in kws.items():
        if key in out:
            p.fail(value, f"{what}: {key} is given twice")
        out[key] = value
    missing = [name for name in params[:required] if name not in out]
    if missing:
        p.fail(call, f"{what} is missing {', '.join(missing)}")
    return out


def check_plain_signature(p: Parser, node: ast.FunctionDef) -> None:
    """Refuse defaults, *args, keyword-only and positional-only parameters."""
    a = node.args
    extra = a.posonlyargs or a.vararg or a.kwonlyargs or a.kwarg or a.defaults
    if extra:
        p.fail(node, f"function {node.name!r}: parameters are plain `name: annotation` "
                     "(no defaults, *args, keyword-only or ** parameters)")
    seen: set[str] = set()
    for arg in a.args:
        if arg.arg in seen:
            p.fail(arg, f"duplicate parameter {arg.arg!r}")
        seen.add(arg.arg)

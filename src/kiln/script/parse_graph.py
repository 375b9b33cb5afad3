"""Parse the body of a `@G.function` into IRBuilder calls.

A graph function is a list of bindings `y: G.Tensor(...) = <expr>` and a
`return`. Every type is written out, so no operator registry is needed:
`G.op("conv2d", x, w, strides=(1, 1))` takes its result type from the
binding's annotation (or from `ret=` when it is nested in another expression).
Names in a tensor shape that are not bound elsewhere are symbolic dimensions
(int64 variables shared by the whole function).
"""

from __future__ import annotations

import ast
from typing import Any, NoReturn

from kiln._registry import suggest
from kiln.ir import graph as g
from kiln.ir.structural import structural_equal
from kiln.ir.tensor import Var
from kiln.ir.types import TensorType, TupleType, Type
from kiln.script.parse_tensor import TensorFunctionParser, check_plain_signature
from kiln.script.parser import Parser, is_docstring


class GraphFunctionParser:
    """Parses one `@G.function` definition."""

    def __init__(self, parser: Parser) -> None:
        self.p = parser
        self.ib = parser.ib
        self.shape_vars: dict[str, Var] = {}

    def fail(self, node: ast.AST | None, message: str) -> NoReturn:
        self.p.fail(node, message)

    def function(self, node: ast.FunctionDef, name: str) -> None:
        check_plain_signature(self.p, node)
        with self.p.at(node), self.ib.function(name), self.p.scope() as frame:
            for arg in node.args.args:
                if arg.annotation is None:
                    self.fail(arg, f"parameter {arg.arg!r} needs a type: "
                                   "G.Tensor(shape, dtype) or G.Tuple(...)")
                frame[arg.arg] = self.ib.param(arg.arg, self.type(arg.annotation))
            ret_type = self.type(node.returns) if node.returns is not None else None
            body = node.body[1:] if is_docstring(node.body[0]) else node.body
            returned = False
            for stmt in body:
                if returned:
                    self.fail(stmt, "statement after `return`")
                with self.p.at(stmt):
                    returned = self.stmt(stmt, frame, ret_type, node.returns)
            if not returned:
                self.fail(node, f"graph function {name!r} has no `return`")

    def stmt(self, node: ast.stmt, frame: dict[str, Any], ret_type: Type | None,
             ret_node: ast.expr | None) -> bool:
        """Parse one statement; True if it was the `return`."""
        if isinstance(node, ast.AnnAssign):
            if not isinstance(node.target, ast.Name) or node.value is None:
                self.fail(node, "a binding is `name: type = value`")
            ty = self.type(node.annotation)
            value = self.expr(node.value, ty)
            actual = self._type_of(value, node.value)
            if not structural_equal(actual, ty):
                self.fail(node.annotation, f"the binding's type {ty} does not match its "
                                           f"value's type {actual}")
            name = node.target.id
            frame[name] = self.ib.emit(value, name, var=g.Var(name, ty))
        elif isinstance(node, ast.Assign):
            if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
                self.fail(node, "a binding assigns one name: `y: G.Tensor(...) = value`")
            name = node.targets[0].id
            frame[name] = self.ib.emit(self.expr(node.value), name)
        elif isinstance(node, ast.Return):
            if node.value is None:
                self.fail(node, "a graph function returns a value: `return y`")
            result = self.expr(node.value)
            actual = self._type_of(result, node.value)
            if ret_type is not None and not structural_equal(actual, ret_type):
                self.fail(ret_node, f"the return annotation {ret_type} does not match the "
                                    f"returned value's type {actual}")
            self.ib.ret(result)
            return True
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
                self.p.dsl_ref(node.value.func) == ("G", "func_attr"):
            for key, value in self.p.attr_dict(node.value, "G.func_attr").items():
                self.ib.func_attr(key, value)
        elif isinstance(node, ast.Pass):
            pass
        else:
            self.fail(node, "a @G.function body holds bindings `y: G.Tensor(...) = ...`, "
                            "G.func_attr({...}) and one final `return`")
        return False

    def _type_of(self, value: g.Expr, node: ast.expr) -> Type:
        with self.p.at(node):
            return value.type

    # ------------------------------------------------------------------ types

    def type(self, node: ast.expr) -> Type:
        ref = self.p.dsl_ref(node.func) if isinstance(node, ast.Call) else None
        if not isinstance(node, ast.Call) or ref not in (("G", "Tensor"), ("G", "Tuple")):
            self.fail(node, "expected a type: G.Tensor(shape, dtype) or G.Tuple(...)")
        assert ref is not None
        if ref[1] == "Tuple":
            if node.keywords:
                self.fail(node, "G.Tuple takes the field types only")
            return TupleType(tuple(self.type(f) for f in node.args))
        kws = self.p.keywords(node, "G.Tensor", ("shape", "dtype"))
        args = dict(zip(("shape", "dtype"), node.args))
        args.update(kws)
        if len(node.args) > 2 or set(args) != {"shape", "dtype"}:
            self.fail(node, "G.Tensor takes a shape and a dtype: G.Tensor((1, 4), \"float32\")")
        with self.p.at(node):
            return TensorType(self._shape(args["shape"]), self.p.dtype_arg(args["dtype"]))

    def _shape(self, node: ast.expr) -> tuple[Any, ...]:
        # Unknown names become symbolic dimensions of this function.
        with self.p.scope(dict(self.shape_vars)):
            return TensorFunctionParser(self.p).shape(node, self.shape_vars)

    # ------------------------------------------------------------------ expressions

    def expr(self, node: ast.expr, binding_type: Type | None = None) -> g.Expr:
        with self.p.at(node):
            return self._expr(node, binding_type)

    def _expr(self, node: ast.expr, binding_type: Type | None) -> g.Expr:
        if isinstance(node, ast.Name):
            value = self.p.lookup(node.id)
            if isinstance(value, g.Expr):
                return value
            known = self.p.visible_names()
            self.fail(node, f"unknown name {node.id!r};{suggest(node.id, known)}".rstrip(";"))
        if isinstance(node, ast.Tuple):
            return g.Tuple(tuple(self.expr(e) for e in node.elts))
        if isinstance(node, ast.Subscript):
            base = self.expr(node.value)
            index = self.p.int_arg(node.slice, "a tuple index")
            return g.TupleGetItem(base, index)
        if isinstance(node, ast.Call):
            return self._call(node, binding_type)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            self.fail(node, f"a number is not a graph value; wrap it: "
                            f"G.const({node.value!r}, \"float32\")")
        self.fail(node, f"unsupported graph expression `{ast.unparse(node)}`")

    def _call(self, node: ast.Call, binding_type: Type | None) -> g.Expr:
        ref = self.p.dsl_ref(node.func)
        if ref is None or ref[0] != "G":
            what = f"{ref[0]}.{ref[1]}" if ref else f"`{ast.unparse(node.func)}`"
            self.fail(node.func, f"{what} is not a graph-level call; use G.op, "
                                 "G.call_tensor, G.if_then_else, G.loop or G.const")
        name = ref[1]
        if name == "op":
            return self._op(node, binding_type)
        if name == "call_tensor":
            return self._call_tensor(node, binding_type)
        if name == "if_then_else":
            return self._if_then_else(node, binding_type)
        if name == "loop":
            return self._loop(node, binding_type)
        if name == "const":
            arr, kws = self.p.data(node, "G.const", ("name",))
            const_name = self.p.str_arg(kws["name"], "name") if "name" in kws else ""
            return g.Constant(arr, const_name)
        self.p.unknown_attr(node.func, "G", name, "graph call")

    def _op(self, node: ast.Call, binding_type: Type | None) -> g.Expr:
        if not node.args:
            self.fail(node, "G.op takes the operator name first: G.op(\"add\", x, y)")
        op = self.p.str_arg(node.args[0], "the operator name")
        args = tuple(self.expr(a) for a in node.args[1:])
        attrs: dict[str, Any] = {}
        ret: Type | None = None
        for kw in node.keywords:
            if kw.arg is None:
                self.fail(kw.value, "G.op: `**` arguments are not supported")
            if kw.arg == "ret":
                ret = self.type(kw.value)
            elif kw.arg == "attrs":
                extra = self.p.static(kw.value, "an attribute dict")
                if not isinstance(extra, dict) or not all(isinstance(k, str) for k in extra):
                    self.fail(kw.value, "attrs= takes a dict with string keys")
                for key, value in extra.items():
                    if key in attrs:
                        self.fail(kw.value, f"attribute {key!r} is given twice")
                    attrs[key] = value
            else:
                if kw.arg in attrs:
                    self.fail(kw, f"attribute {kw.arg!r} is given twice")
                attrs[kw.arg] = self.p.static(kw.value, "an attribute value")
        ret = ret or binding_type
        if ret is None:
            self.fail(node, f"G.op(\"{op}\", ...) needs ret=<type> here (there is no binding "
                            "annotation to take the result type from)")
        return g.Call(op, args, attrs, ret)

    def _expr_list(self, node: ast.expr, what: str) -> tuple[g.Expr, ...]:
        if not isinstance(node, (ast.List, ast.Tuple)):
            self.fail(node, f"{what} are a list: [x, w]")
        return tuple(self.expr(a) for a in node.elts)

    def _if_then_else(self, node: ast.Call, binding_type: Type | None) -> g.Expr:
        kws = self.p.keywords(node, "G.if_then_else", ("then_branch", "else_branch", "ret"))
        if len(node.args) != 2 or "then_branch" not in kws or "else_branch" not in kws:
            self.fail(node, "G.if_then_else takes the condition, a list of arguments and both "
                            "branches: G.if_then_else(c, [x], then_branch=\"f\", "
                            "else_branch=\"g\")")
        cond = self.expr(node.args[0])
        args = self._expr_list(node.args[1], "the arguments of G.if_then_else")
        then_branch = self.p.str_arg(kws["then_branch"], "then_branch")
        else_branch = self.p.str_arg(kws["else_branch"], "else_branch")
        ret = self.type(kws["ret"]) if "ret" in kws else binding_type
        if ret is None:
            self.fail(node, "G.if_then_else needs ret=<type> here")
        return g.If(cond, args, then_branch, else_branch, ret)

    def _loop(self, node: ast.Call, binding_type: Type | None) -> g.Expr:
        kws = self.p.keywords(node, "G.loop", ("captures", "trip_count", "cond", "ret"))
        if len(node.args) != 2:
            self.fail(node, "G.loop takes the body's name and the list of initial loop-carried "
                            "values: G.loop(\"body\", [s], trip_count=n, captures=[x])")
        body = self.p.str_arg(node.args[0], "the body's name")
        states = self._expr_list(node.args[1], "the loop-carried values of G.loop")
        captures = (self._expr_list(kws["captures"], "the captures of G.loop")
                    if "captures" in kws else ())
        trip_count = self.expr(kws["trip_count"]) if "trip_count" in kws else None
        cond = self.expr(kws["cond"]) if "cond" in kws else None
        ret = self.type(kws["ret"]) if "ret" in kws else binding_type
        if not isinstance(ret, TupleType):
            self.fail(node, "G.loop's type is a tuple (final loop-carried values, then scan "
                            "outputs): annotate G.Tuple(...) or pass ret=")
        return g.Loop(body, trip_count, cond, states, captures, ret)

    def _call_tensor(self, node: ast.Call, binding_type: Type | None) -> g.Expr:
        kws = self.p.keywords(node, "G.call_tensor", ("ret",))
        if not 2 <= len(node.args) <= 3 or (len(node.args) == 3 and kws):
            self.fail(node, "G.call_tensor takes a function name, a list of arguments and the "
                            "output type: G.call_tensor(\"f\", [x], G.Tensor((4,), \"float32\"))")
        func = self.p.str_arg(node.args[0], "the function name")
        args_node = node.args[1]
        if not isinstance(args_node, (ast.List, ast.Tuple)):
            self.fail(args_node, "the arguments of G.call_tensor are a list: [x, w]")
        args = tuple(self.expr(a) for a in args_node.elts)
        ret_node = node.args[2] if len(node.args) == 3 else kws.get("ret")
        ret = self.type(ret_node) if ret_node is not None else binding_type
        if ret is None:
            self.fail(node, "G.call_tensor needs the output type here")
        return g.CallTensor(func, args, ret)

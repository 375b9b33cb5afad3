"""Parse kiln.script DSL text into an IRModule.

The text is read with Python's `ast` (never executed) and every function is
built through `kiln.ir.IRBuilder`, the same builder hand-written IR uses.
This module handles the module structure (`@ir_module` class, decorated
functions, the `meta = {...}` section), static values (dtypes, shapes,
attributes) and constant data; `parse_tensor` and `parse_graph` handle the
bodies of `@T.prim_func` and `@G.function`.

Every error is a `ScriptError` (an `IRError`) that names the line and column
and quotes the offending line.
"""

from __future__ import annotations

import ast
import math
import operator
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NoReturn

import numpy as np

from kiln._registry import suggest
from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir.builder import IRBuilder
from kiln.ir.dtype import DTYPES
from kiln.ir.metadata import Metadata, decode_entry
from kiln.ir.module import IRModule
from kiln.ir.tensor import BUFFER_SCOPES, readonly_array
from kiln.ir.visitor import MAX_NESTING
from kiln.script.diagnostics import ScriptError, Source
from kiln.script.namespace import G_NAMES, I_NAMES, T_NAMES, G, I, T
from kiln.script.nesting import ast_depth, text_depth_bound

# What `Parser.lookup` returns for a name the script's scope does not define.
MISSING = object()
_NAMESPACES: dict[int, str] = {id(T): "T", id(G): "G", id(I): "I"}
_NS_NAMES = {"T": T_NAMES, "G": G_NAMES, "I": I_NAMES}
# Python arithmetic the parser computes itself on two plain numbers (`N * 2`).
_PYTHON_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
    ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor,
}
# Levels of syntax tree around a function's statements (module, class, function,
# decorator) beyond the IR's own nesting limit.
_WRAPPER_LEVELS = 8
# `text_depth_bound` over-counts (dotted names, keywords); past this bound the text
# could exhaust the frames of `ast.parse` itself (about three levels per frame).
_TEXT_BOUND_LIMIT = 4 * MAX_NESTING
# Values a name from the surrounding Python scope may stand for.
_STATIC_TYPES = (int, float, bool, str, type(None), tuple, list, dict)


def default_env() -> dict[str, Any]:
    """Names every DSL text may use: the namespaces and the `ir_module` decorator."""
    from kiln.script.decorators import (
        ir_module,  # cycle: kiln.script.decorators imports this module
    )

    return {"T": T, "G": G, "I": I, "ir_module": ir_module}


def parse_source(
    source: Source, *, env: Mapping[str, Any], metadata: Metadata | None = None,
) -> IRModule:
    """Parse `source` (a module, a class or decorated functions) into an IRModule."""
    # Python's parser and the DSL parser recurse per level of the syntax tree: refuse
    # text nested too deeply for them first (the frame limit is never raised).
    limit = MAX_NESTING + _WRAPPER_LEVELS
    bound = text_depth_bound(source.text)
    if bound > _TEXT_BOUND_LIMIT:
        raise source.error_at(1, 0, f"the text is nested too deeply (depth up to {bound} > "
                                    f"limit {_TEXT_BOUND_LIMIT}); split long expressions "
                                    "with T.let")
    try:
        tree = ast.parse(source.text, filename=source.filename or "<kiln.script>")
    except SyntaxError as exc:
        lineno = exc.lineno or 1
        raise source.error_at(lineno, max(0, (exc.offset or 1) - 1),
                              f"invalid syntax: {exc.msg}") from None
    except MemoryError:
        raise source.error_at(1, 0, "the text is too complex for Python's parser") from None
    depth = ast_depth(tree)
    if depth > limit:
        raise source.error_at(1, 0, f"the text is nested too deeply (depth {depth} > limit "
                                    f"{limit}); split long expressions with T.let")
    return Parser(source, env, metadata or {}).module(tree)


class Parser:
    """Module-level parsing plus the helpers both function parsers share."""

    def __init__(self, source: Source, env: Mapping[str, Any], metadata: Metadata) -> None:
        self.src = source
        self.env = dict(env)
        # Read-only arrays: every node built from one entry then shares it (the
        # IR copies writable arrays), so a re-print stores it once again.
        self.explicit_meta = {k: readonly_array(v) for k, v in metadata.items()}
        self.meta: Metadata = dict(self.explicit_meta)
        self.ib = IRBuilder()
        # Names bound by the DSL text (innermost last); they shadow `env`.
        self.scopes: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ errors

    def error(self, node: ast.AST | None, message: str) -> ScriptError:
        return self.src.error(node, message)

    def fail(self, node: ast.AST | None, message: str) -> NoReturn:
        raise self.error(node, message)

    @contextmanager
    def at(self, node: ast.AST) -> Iterator[None]:
        """Attach `node`'s position to an IRError raised by the IR or the builder."""
        try:
            yield
        except ScriptError:
            raise
        except IRError as exc:
            raise self.error(node, str(exc)) from None

    # ------------------------------------------------------------------ names

    @contextmanager
    def scope(self, bindings: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        frame = dict(bindings or {})
        self.scopes.append(frame)
        try:
            yield frame
        finally:
            self.scopes.pop()

    def lookup(self, name: str) -> Any:
        """The DSL binding of `name`, or MISSING."""
        for frame in reversed(self.scopes):
            if name in frame:
                return frame[name]
        return MISSING

    def visible_names(self) -> list[str]:
        return [n for frame in self.scopes for n in frame]

    def env_value(self, node: ast.expr) -> Any:
        """The Python object a Name or dotted name stands for (not DSL-bound), or MISSING."""
        if isinstance(node, ast.Name):
            if self.lookup(node.id) is not MISSING:
                return MISSING
            return self.env.get(node.id, MISSING)
        if isinstance(node, ast.Attribute):
            base = self.env_value(node.value)
            if isinstance(base, types.ModuleType):
                return getattr(base, node.attr, MISSING)
        return MISSING

    def namespace(self, node: ast.expr) -> str | None:
        """'T', 'G' or 'I' if `node` names one of the DSL namespaces."""
        obj = self.env_value(node)
        return _NAMESPACES.get(id(obj)) if obj is not MISSING else None

    def dsl_ref(self, node: ast.expr) -> tuple[str, str] | None:
        """(namespace, attribute) for `T.serial`-like nodes; ('I', 'ir_module') for ir_module."""
        if isinstance(node, ast.Attribute):
            ns = self.namespace(node.value)
            if ns is not None:
                return ns, node.attr
        from kiln.script.decorators import (
            ir_module,  # cycle: kiln.script.decorators imports this module
        )

        if self.env_value(node) is ir_module:
            return "I", "ir_module"
        return None

    def unknown_attr(self, node: ast.AST, ns: str, name: str, what: str = "function") -> NoReturn:
        self.fail(node, f"unknown {what} '{ns}.{name}';"
                        f"{suggest(name, sorted(_NS_NAMES[ns])) or ' not part of the DSL'}")

    # ------------------------------------------------------------------ module

    def module(self, tree: ast.Module) -> IRModule:
        body = tree.body
        for node in body:
            if _is_meta_section(node):
                self._meta_section(node)
        found = False
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)) or _is_meta_section(node):
                continue
            if is_docstring(node):
                continue
            if isinstance(node, ast.ClassDef):
                self._class(node)
                found = True
            elif isinstance(node, ast.FunctionDef):
                self.function(node)
                found = True
            else:
                self.fail(node, "expected an @ir_module class, a @T.prim_func or @G.function "
                                "definition, or the `meta = {...}` section at the top level")
        if not found:
            self.fail(None, "the text defines no @ir_module class and no function")
        with self.at(tree):
            return self.ib.get()

    def _meta_section(self, node: ast.stmt) -> None:
        assert isinstance(node, ast.Assign)
        try:
            table = ast.literal_eval(node.value)
        except (ValueError, SyntaxError, TypeError):
            self.fail(node.value, "the `meta = {...}` section must be a literal dict "
                                  "(as the printer writes it)")
        if not isinstance(table, dict):
            self.fail(node.value, "the `meta` section must be a dict")
        for key, entry in table.items():
            if not isinstance(key, str):
                self.fail(node.value, f"metadata key {key!r} is not a string")
            if key in self.meta and key in self.explicit_meta:
                self.fail(node, f"metadata {key!r} is both in the text and in the metadata "
                                "argument; remove one")
            if key in self.meta:
                self.fail(node, f"metadata {key!r} is defined twice")
            with self.at(node):
                arr = decode_entry(key, entry)  # a fresh copy: freeze it in place
            arr.flags.writeable = False
            self.meta[key] = arr

    def _class(self, node: ast.ClassDef) -> None:
        if not any(self._is_ir_module(d) for d in node.decorator_list):
            self.fail(node, f"class {node.name}: expected the @ir_module decorator")
        if node.bases or node.keywords:
            self.fail(node, f"class {node.name}: an @ir_module class takes no base classes")
        for item in node.body:
            if is_docstring(item) or isinstance(item, ast.Pass):
                continue
            if isinstance(item, ast.FunctionDef):
                self.function(item)
            elif (isinstance(item, ast.Expr) and isinstance(item.value, ast.Call)
                  and self._is_call(item.value, "I", "module_attrs")):
                self._module_attrs(item.value)
            else:
                self.fail(item, "an @ir_module class holds @T.prim_func / @G.function "
                                "definitions and I.module_attrs({...})")

    def _is_ir_module(self, deco: ast.expr) -> bool:
        target = deco.func if isinstance(deco, ast.Call) else deco
        return self.dsl_ref(target) == ("I", "ir_module")

    def _is_call(self, node: ast.expr, ns: str, name: str) -> bool:
        return isinstance(node, ast.Call) and self.dsl_ref(node.func) == (ns, name)

    def _module_attrs(self, call: ast.Call) -> None:
        attrs = self.attr_dict(call, "I.module_attrs")
        for key, value in attrs.items():
            self.ib.module_attr(key, value)

    def attr_dict(self, call: ast.Call, what: str) -> dict[str, Any]:
        if len(call.args) != 1 or call.keywords:
            self.fail(call, f"{what} takes one dict: {what}({{\"key\": value}})")
        value = self.static(call.args[0])
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            self.fail(call.args[0], f"{what} takes a dict with string keys")
        return value

    def function(self, node: ast.FunctionDef) -> None:
        from kiln.script.parse_graph import (
            GraphFunctionParser,  # cycle: kiln.script.parse_graph imports this module
        )
        from kiln.script.parse_tensor import (
            TensorFunctionParser,  # cycle: kiln.script.parse_tensor imports this module
        )

        kind, name = self._function_kind(node)
        if kind == "T":
            TensorFunctionParser(self).function(node, name)
        else:
            GraphFunctionParser(self).function(node, name)

    def _function_kind(self, node: ast.FunctionDef) -> tuple[str, str]:
        found: tuple[str, str] | None = None
        for deco in node.decorator_list:
            call = deco if isinstance(deco, ast.Call) else None
            ref = self.dsl_ref(call.func if call else deco)
            if ref not in (("T", "prim_func"), ("G", "function")):
                self.fail(deco, "unknown decorator; a DSL function is decorated with "
                                "@T.prim_func or @G.function")
            if found is not None:
                self.fail(deco, "a function takes one @T.prim_func or @G.function decorator")
            assert ref is not None
            name = node.name
            for kw in call.keywords if call else []:
                if kw.arg == "name":
                    value = self.static(kw.value)
                    if not isinstance(value, str):
                        self.fail(kw.value, "name= must be a string")
                    name = value
                elif kw.arg != "metadata":  # metadata= is the decorator's own argument
                    self.fail(kw, f"unknown decorator argument {kw.arg!r}; known: name")
            if call and call.args:
                self.fail(call, "decorator arguments are keywords: name=...")
            found = (ref[0], name)
        if found is None:
            self.fail(node, f"function {node.name!r} needs a @T.prim_func (tensor level) or "
                            "@G.function (graph level) decorator")
        return found

    # ------------------------------------------------------------------ static values

    def static(self, node: ast.expr, what: str = "a constant") -> Any:
        """Evaluate a literal: numbers, strings, tuples, lists, dicts, `float("inf")`,
        arithmetic on numbers and names of Python values from the surrounding scope."""
        if isinstance(node, ast.Constant):
            if isinstance(node.value, (bytes, complex)) or node.value is Ellipsis:
                self.fail(node, f"expected {what}, got {node.value!r}")
            return node.value
        if isinstance(node, ast.Tuple):
            return tuple(self.static(e, what) for e in node.elts)
        if isinstance(node, ast.List):
            return [self.static(e, what) for e in node.elts]
        if isinstance(node, ast.Dict):
            out = {}
            for k, v in zip(node.keys, node.values):
                if k is None:
                    self.fail(v, "`**` is not supported in a DSL dict")
                out[self.static(k, what)] = self.static(v, what)
            return out
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = self.static(node.operand, what)
            if not is_number(value):
                self.fail(node, f"expected {what}")
            return -value if isinstance(node.op, ast.USub) else +value
        if isinstance(node, ast.BinOp):
            a, b = self.static(node.left, what), self.static(node.right, what)
            if not (is_number(a) and is_number(b)):
                self.fail(node, f"expected {what}")
            return self.fold_binop(node, a, b)
        if isinstance(node, ast.Call) and self._is_float_call(node):
            return self._float_call(node)
        value = self.env_value(node) if isinstance(node, (ast.Name, ast.Attribute)) else MISSING
        if value is not MISSING:
            if isinstance(value, np.generic):
                return value.item()
            if isinstance(value, _STATIC_TYPES):
                return value
            self.fail(node, f"expected {what}; {ast.unparse(node)!r} is a "
                            f"{type(value).__name__}")
        if isinstance(node, ast.Name):
            bound = self.lookup(node.id)
            if bound is not MISSING:
                self.fail(node, f"expected {what}, not {node.id!r} (a {type(bound).__name__})")
            self.fail(node, f"unknown name {node.id!r}")
        self.fail(node, f"expected {what}, got `{ast.unparse(node)}`")

    def _is_float_call(self, node: ast.Call) -> bool:
        return (isinstance(node.func, ast.Name) and node.func.id == "float"
                and self.lookup("float") is MISSING)

    def _float_call(self, node: ast.Call) -> float:
        if len(node.args) != 1 or node.keywords:
            self.fail(node, 'float(...) takes one argument: float("inf"), float("nan")')
        value = self.static(node.args[0])
        if isinstance(value, str):
            if value.strip().lower() not in ("inf", "+inf", "-inf", "nan", "infinity",
                                             "-infinity", "+infinity"):
                self.fail(node, f'float({value!r}): expected "inf", "-inf" or "nan"')
            return float(value)
        if isinstance(value, bool) or not is_number(value):
            self.fail(node, "float(...) takes a number or one of \"inf\", \"-inf\", \"nan\"")
        return float(value)

    def fold_binop(self, node: ast.BinOp, a: Any, b: Any) -> Any:
        """Python arithmetic on two plain numbers (as Python itself would compute it)."""
        fn = _PYTHON_BINOPS.get(type(node.op))
        if fn is None:
            self.fail(node, f"operator {type(node.op).__name__} is not supported")
        try:
            result = fn(a, b)
        except (ArithmeticError, TypeError, ValueError) as exc:
            self.fail(node, f"cannot compute `{ast.unparse(node)}`: {exc}")
        if isinstance(result, complex):
            self.fail(node, f"`{ast.unparse(node)}` is complex")
        return result

    def dtype_arg(self, node: ast.expr) -> str:
        value = self.static(node, "a dtype string")
        if not isinstance(value, str):
            self.fail(node, f"expected a dtype string such as \"float32\", got {value!r}")
        if value not in DTYPES:
            self.fail(node, f"unknown dtype {value!r};"
                            f"{suggest(value, list(DTYPES)) or ' known: ' + ', '.join(DTYPES)}")
        return value

    def int_arg(self, node: ast.expr, what: str) -> int:
        value = self.static(node, what)
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(node, f"{what} must be an int, got {value!r}")
        return value

    def scope_arg(self, node: ast.expr | None) -> str:
        """A buffer scope argument ("global" when absent)."""
        if node is None:
            return "global"
        value = self.str_arg(node, "scope")
        if value not in BUFFER_SCOPES:
            self.fail(node, f"unknown buffer scope {value!r}; known: {', '.join(BUFFER_SCOPES)}")
        return value

    def str_arg(self, node: ast.expr, what: str) -> str:
        value = self.static(node, what)
        if not isinstance(value, str):
            self.fail(node, f"{what} must be a string, got {value!r}")
        return value

    # ------------------------------------------------------------------ constant data

    def data(self, call: ast.Call, what: str, extra: tuple[str, ...] = ()) -> tuple[
            np.ndarray, dict[str, ast.expr]]:
        """The array of `G.const(...)` / `T.alloc_const(...)` and its other keywords.

        Forms: `(meta["key"])`, `(array_name)` for a numpy array in the
        surrounding Python scope, or `(nested_list, dtype)`; `shape=` reshapes.
        """
        kws = self.keywords(call, what, ("dtype", "shape", *extra))
        if not 1 <= len(call.args) <= 2:
            self.fail(call, f"{what} takes the data and an optional dtype: "
                            f"{what}([[1.0, 2.0]], \"float32\") or {what}(meta[\"name\"])")
        src = call.args[0]
        if len(call.args) == 2 and "dtype" in kws:
            self.fail(kws["dtype"], f"{what}: dtype is given twice")
        dtype_node = call.args[1] if len(call.args) == 2 else kws.pop("dtype", None)
        dtype = self.dtype_arg(dtype_node) if dtype_node is not None else None
        arr = self._stored_array(src)
        if arr is None:
            if dtype is None:
                self.fail(call, f"{what} with literal data needs a dtype: "
                                f"{what}({ast.unparse(src)}, \"float32\")")
            arr = self._literal_array(src, dtype)
        elif dtype is not None and dt.from_numpy(arr.dtype) != dtype:
            self.fail(dtype_node, f"the data of {ast.unparse(src)} is "
                                  f"{dt.from_numpy(arr.dtype)}, not {dtype}")
        shape_node = kws.pop("shape", None)
        if shape_node is not None:
            shape = self.static(shape_node, "a shape")
            if not isinstance(shape, (tuple, list)) or not all(
                    isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
                self.fail(shape_node, "shape= must be a tuple of non-negative ints")
            if math.prod(shape) != arr.size:
                self.fail(shape_node, f"cannot reshape {arr.size} elements to {tuple(shape)}")
            arr = arr.reshape(tuple(shape))
        return arr, kws

    def _stored_array(self, node: ast.expr) -> np.ndarray | None:
        """The array of `meta["key"]` or of a numpy array name; None for literal data."""
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)
                and node.value.id == "meta" and self.lookup("meta") is MISSING):
            key = self.static(node.slice, "a metadata key")
            if not isinstance(key, str):
                self.fail(node.slice, "metadata keys are strings: meta[\"name\"]")
            if key not in self.meta:
                known = list(self.meta)
                hint = suggest(key, known) or (
                    f" known: {', '.join(known)}" if known else
                    " the text has no `meta` section and no metadata was given: pass "
                    "metadata=... to from_source (print_module(..., metadata=\"reference\") "
                    "returns it as .metadata)")
                self.fail(node, f"meta[{key!r}] is not in the metadata;{hint}")
            arr = self.meta[key]
        else:
            value = self.env_value(node) if isinstance(node, (ast.Name, ast.Attribute)) \
                else MISSING
            if not isinstance(value, np.ndarray):
                return None
            arr = readonly_array(value)
        with self.at(node):
            dt.from_numpy(arr.dtype)
        return arr

    def _literal_array(self, node: ast.expr, dtype: str) -> np.ndarray:
        value = self.static(node, "array data (a number or nested lists)")
        kind = dt.kind(dtype)
        self._check_leaves(node, value, kind, dtype)
        try:
            if kind == "float":
                wide = np.array(value, dtype=np.float64)
                with np.errstate(over="ignore"):  # reported just below
                    arr = wide.astype(dt.to_numpy(dtype))
                if np.any(np.isinf(arr) & np.isfinite(wide)):
                    self.fail(node, f"a value is out of range for {dtype}")
            else:
                arr = np.array(value, dtype=dt.to_numpy(dtype))
        except ScriptError:
            raise
        except (ValueError, TypeError, OverflowError) as exc:
            self.fail(node, f"bad {dtype} array data: {exc}")
        return arr

    def _check_leaves(self, node: ast.expr, value: Any, kind: str, dtype: str) -> None:
        if isinstance(value, list):
            for item in value:
                self._check_leaves(node, item, kind, dtype)
            return
        ok = (isinstance(value, bool) if kind == "bool" else
              isinstance(value, int) and not isinstance(value, bool) if kind in ("int", "uint")
              else is_number(value) and not isinstance(value, bool))
        if not ok:
            self.fail(node, f"array element {value!r} does not fit dtype {dtype}")

    def keywords(self, call: ast.Call, what: str, allowed: tuple[str, ...]) -> dict[str, ast.expr]:
        out: dict[str, ast.expr] = {}
        for kw in call.keywords:
            if kw.arg is None:
                self.fail(kw.value, f"{what}: `**` arguments are not supported")
            if kw.arg not in allowed:
                hint = suggest(kw.arg, list(allowed)) or " known: " + ", ".join(allowed)
                self.fail(kw, f"{what} has no argument {kw.arg!r};{hint}")
            out[kw.arg] = kw.value
        return out


def is_number(value: Any) -> bool:
    """True for a Python int or float (bool included) the script may use as a literal."""
    return isinstance(value, (int, float)) and not isinstance(value, complex)


def is_docstring(node: ast.stmt) -> bool:
    """True for a statement that is a bare string (a docstring)."""
    return (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str))


def _is_meta_section(node: ast.stmt) -> bool:
    return (isinstance(node, ast.Assign) and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "meta")

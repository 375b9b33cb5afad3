"""The reference interpreter's compiler: one PrimFunc -> the source of a Python function.

Loops become loops over Python ints and numpy scalars; integer bounds are
tracked through index expressions so that wrapping and bounds checks are
skipped where they are proven unnecessary. Compiled functions are cached by
identity. The semantics are documented in `kiln.ir.evaluate`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kiln.errors import IRError
from kiln.ir import dtype as dt
from kiln.ir import tensor as t
from kiln.ir._interp_externs import EXTERN_REFERENCES
from kiln.ir._interp_runtime import (
    BASE_NS,
    EXACT_UFUNCS,
    FLOAT_UFUNCS,
    Fault,
    bit_view,
    converter,
    float_carrier,
    int_range,
    ir_text,
    np_dtype,
    round16,
    round_bf16,
)
from kiln.ir.identity_cache import IdentityCache
from kiln.ir.kernel_errors import ERROR_TERMINATED
from kiln.ir.visitor import check_nesting


@dataclass
class _V:
    """A compiled expression: Python code, integer bounds if known, nesting depth."""

    code: str
    lo: int | None = None
    hi: int | None = None
    depth: int = 0


@dataclass
class _Layout:
    """A buffer's dimensions, strides and size as code: literals or runtime locals."""

    dims: list[str]
    static: list[int | None]
    strides: list[str]
    numel: str


@dataclass
class CompiledFunc:
    """A compiled PrimFunc: its name, its Python source and the function to run."""

    name: str
    source: str
    run: Callable[..., None]


_HOIST_DEPTH = 32  # spill deeper expressions into temporaries (parser nesting limits)


class _Compiler:
    """Compiles one PrimFunc into the source of a Python function."""

    def __init__(self, func: t.PrimFunc, name: str) -> None:
        self.func = func
        self.name = name
        self.lines: list[str] = []
        self.pre: list[str] = []
        self.ns: dict[str, Any] = dict(BASE_NS)
        self.names: dict[int, str] = {}
        self.live: set[int] = set()
        self.ranges: dict[int, tuple[int, int]] = {}
        self.sites: list[str] = []
        self.layouts: dict[int, _Layout] = {}
        self._counter = itertools.count()
        self._keep: list[object] = []
        # Buffers declared in each open block; their scope ends with the block.
        self.blocks: list[list[t.Var | t.Buffer]] = []

    # ------------------------------------------------------------------ naming

    def ident(self, node: t.Var | t.Buffer) -> str:
        """Name a variable/buffer at its definition and bring it into scope."""
        key = id(node)
        self.live.add(key)
        if key not in self.names:
            hint = re.sub(r"\W", "_", node.name) or "v"
            if not hint[0].isalpha():
                hint = "v" + hint
            self.names[key] = f"{hint}_{next(self._counter)}"
            self._keep.append(node)
        return self.names[key]

    def end_scope(self, node: t.Var | t.Buffer) -> None:
        self.live.discard(id(node))

    def lookup(self, node: t.Var | t.Buffer) -> str:
        name = self.names.get(id(node))
        if name is None or id(node) not in self.live:
            kind = "variable" if isinstance(node, t.Var) else "buffer"
            raise IRError(f"{self.name}: {kind} '{node.name}' is used outside its scope "
                          "(run kiln.ir.verify for details)")
        return name

    def const(self, value: Any, hint: str = "k") -> str:
        name = f"_{hint}{next(self._counter)}"
        self.ns[name] = value
        return name

    def temp(self) -> str:
        return f"_t{next(self._counter)}"

    # ------------------------------------------------------------------ top level

    def compile(self) -> CompiledFunc:
        params = [self.ident(p) for p in self.func.params]
        for p in self.func.params:
            if isinstance(p, t.Var) and dt.is_int(p.dtype):
                self.ranges[id(p)] = int_range(p.dtype)
        # Buffers arrive with their shapes; symbolic dimensions are bound or checked
        # against them, then the kernel works on flat views.
        for p in self.func.params:
            if isinstance(p, t.Buffer):
                name = self.names[id(p)]
                shape_of = None
                if not all(isinstance(d, int) for d in p.shape):
                    shape_of = self.temp()
                    self.emit(1, f"{shape_of} = {name}.shape")
                self.define_layout(p, 1, shape_of)
                self.emit(1, f"{name} = {name}.reshape(-1)")
        self.block(self.func.body, 1)
        header = f"def _kernel(_rt, {', '.join(params)}):" if params else "def _kernel(_rt):"
        source = "\n".join([header, *self.lines]) + "\n"
        sites = self.sites

        def oob(site: int, *values: int) -> int:
            raise Fault(sites[site].format(*values))

        self.ns["_oob"] = oob
        try:
            code = compile(source, f"<kiln.evaluate {self.name}>", "exec")
        except (SyntaxError, MemoryError) as exc:
            raise IRError(f"{self.name}: the interpreter cannot compile this function "
                          f"({type(exc).__name__}: {exc})") from exc
        exec(code, self.ns)
        return CompiledFunc(self.name, source, self.ns["_kernel"])

    def emit(self, depth: int, text: str) -> None:
        for line in self.pre:
            self.lines.append("    " * depth + line)
        self.pre.clear()
        self.lines.append("    " * depth + text)

    # ------------------------------------------------------------------ statements

    def body(self, s: t.Stmt, depth: int) -> None:
        before = len(self.lines)
        self.block(s, depth)
        if len(self.lines) == before:
            self.emit(depth, "pass")

    def block(self, s: t.Stmt, depth: int) -> None:
        """A statement list: the declarations in it go out of scope at its end."""
        self.blocks.append([])
        subs = s.body if isinstance(s, t.SeqStmt) else (s,)
        for sub in subs:
            self.stmt(sub, depth)
        for b in self.blocks.pop():
            self.end_scope(b)

    def declare(self, b: t.Buffer) -> str:
        self.blocks[-1].append(b)
        return self.ident(b)

    def stmt(self, s: t.Stmt, depth: int) -> None:
        rule = _STMT_RULES.get(type(s))
        if rule is None:
            raise IRError(f"{self.name}: the interpreter has no rule for {type(s).__name__}")
        rule(self, s, depth)

    def seq(self, s: t.SeqStmt, depth: int) -> None:
        self.block(s, depth)

    def store(self, s: t.Store, depth: int) -> None:
        index = self.flat_index(s.buffer, s.indices, "store to")
        value = self.expr(s.value)
        if s.value.dtype != s.buffer.dtype:
            raise IRError(f"{self.name}: Store to '{s.buffer.name}' of a {s.value.dtype} "
                          f"value into a {s.buffer.dtype} buffer (run kiln.ir.verify)")
        self.emit(depth, f"{self.lookup(s.buffer)}[{index}] = {value.code}")

    def let(self, s: t.LetStmt, depth: int) -> None:
        value = self.expr(s.value)
        name = self.ident(s.var)
        self.blocks[-1].append(s.var)
        self.emit(depth, f"{name} = {value.code}")
        # (Always reset: a variable bound again in a sibling scope gets new bounds.)
        self.ranges.pop(id(s.var), None)
        if value.lo is not None and value.hi is not None:
            self.ranges[id(s.var)] = (value.lo, value.hi)

    def if_(self, s: t.IfThenElse, depth: int) -> None:
        cond = self.expr(s.cond)
        self.emit(depth, f"if {cond.code}:")
        self.body(s.then_body, depth + 1)
        if s.else_body is not None:
            self.emit(depth, "else:")
            self.body(s.else_body, depth + 1)

    def allocate(self, s: t.Allocate, depth: int) -> None:
        b = s.buffer
        npdt = self.const(np_dtype(b.dtype), "dt")
        name = self.declare(b)
        layout = self.define_layout(b, depth)
        self.emit(depth, f"{name} = _alloc({layout.numel}, {npdt})")

    def alloc_const(self, s: t.AllocConst, depth: int) -> None:
        data = s.data.reshape(-1)
        if data.dtype != np_dtype(s.buffer.dtype) or s.data.shape != s.buffer.shape:
            raise IRError(f"{self.name}: AllocConst data {s.data.dtype}{s.data.shape} "
                          f"does not match buffer '{s.buffer.name}' (run kiln.ir.verify)")
        name = self.declare(s.buffer)
        self.define_layout(s.buffer, depth)
        self.emit(depth, f"{name} = {self.const(data, 'w')}")

    def decl_buffer(self, s: t.DeclBuffer, depth: int) -> None:
        b = s.buffer
        npdt = self.const(np_dtype(b.dtype), "dt")
        src = self.lookup(s.source)
        name = self.declare(b)
        layout = self.define_layout(b, depth)
        offset = (str(s.byte_offset) if isinstance(s.byte_offset, int)
                  else self.expr(s.byte_offset).code)
        self.emit(depth, f"{name} = _view({src}, {offset}, "
                         f"{layout.numel}, {npdt})")

    def evaluate(self, s: t.Evaluate, depth: int) -> None:
        if isinstance(s.value, t.Intrin) and s.value.name == t.PREFETCH_INTRINSIC:
            # a hint: read the element (checking it is in bounds) and drop it
            self.emit(depth, self.expr(s.value.args[0]).code)
            return
        if isinstance(s.value, t.Intrin) and s.value.name == t.TERMINATE_CHECK:
            flag = self.expr(s.value.args[0]).code
            self.emit(depth, f"_check(({flag}) == 0, {ERROR_TERMINATED})")
            return
        self.emit(depth, self.expr(s.value).code)

    def call_func(self, s: t.CallFunc, depth: int) -> None:
        args = [self.shaped(a) if isinstance(a, t.Buffer) else self.expr(a).code
                for a in s.args]
        packed = "".join(f"{a}, " for a in args)
        self.emit(depth, f"_rt.call({s.func!r}, ({packed}))")

    def for_(self, s: t.For, depth: int) -> None:
        if not dt.is_int(s.var.dtype):
            raise IRError(f"{self.name}: loop variable '{s.var.name}' has dtype {s.var.dtype}")
        start, extent = self.expr(s.start), self.expr(s.extent)
        if isinstance(s.start, t.Const) and isinstance(s.extent, t.Const):
            rng = f"range({int(s.start.value)}, {int(s.start.value) + int(s.extent.value)})"
        else:
            tmp = self.temp()
            self.emit(depth, f"{tmp} = {start.code}")
            rng = f"range({tmp}, {tmp} + {extent.code})"
        name = self.ident(s.var)
        self.ranges.pop(id(s.var), None)
        if None not in (start.lo, start.hi, extent.hi):
            assert start.lo is not None and start.hi is not None and extent.hi is not None
            hi = start.hi + max(extent.hi, 1) - 1
            self.ranges[id(s.var)] = (start.lo, hi)
        self.emit(depth, f"for {name} in {rng}:")
        self.body(s.body, depth + 1)
        self.end_scope(s.var)

    def while_(self, s: t.While, depth: int) -> None:
        # The condition is evaluated inside the loop: its setup lines run every time.
        self.emit(depth, "while True:")
        cond = self.expr(s.cond)
        self.emit(depth + 1, f"if not ({cond.code}):")
        self.emit(depth + 2, "break")
        self.body(s.body, depth + 1)

    def define_layout(self, b: t.Buffer, depth: int, shape_of: str | None = None) -> _Layout:
        """Compute `b`'s dimensions and strides where it is defined.

        `shape_of` names the runtime shape of a parameter: a dimension that is a
        fresh Var is bound from it (a shape variable), any other symbolic
        dimension is checked against it.
        """
        dims: list[str] = []
        static: list[int | None] = []
        for k, d in enumerate(b.shape):
            if isinstance(d, int):
                dims.append(str(d))
                static.append(d)
                continue
            if not isinstance(d, t.PrimExpr) or not dt.is_int(d.dtype):
                raise IRError(f"{self.name}: buffer '{b.name}' has a bad dimension {d!r}")
            static.append(None)
            if shape_of is not None and isinstance(d, t.Var) and id(d) not in self.live:
                name = self.ident(d)
                self.emit(depth, f"{name} = {shape_of}[{k}]")
                self.ranges[id(d)] = (0, int_range(d.dtype)[1])
                dims.append(name)
                continue
            value = self.expr(d)
            tmp = self.temp()
            self.emit(depth, f"{tmp} = {value.code}")
            if shape_of is not None:
                site = self.site(f"argument '{b.name}': dimension {k} is {{0}} but the "
                                 f"parameter's shape says {ir_text(d)} = {{1}}")
                self.emit(depth, f"if {shape_of}[{k}] != {tmp}: "
                                 f"_oob({site}, {shape_of}[{k}], {tmp})")
            else:
                site = self.site(f"buffer '{b.name}': dimension {k} ({ir_text(d)}) is {{0}}")
                self.emit(depth, f"if {tmp} < 0: _oob({site}, {tmp})")
            dims.append(tmp)
        strides = ["1"] * len(dims)
        size_code, size = "1", 1
        symbolic = False
        for k in reversed(range(len(dims))):
            strides[k] = size_code
            dim = static[k]
            if not symbolic and dim is not None:
                size *= dim
                size_code = str(size)
            else:
                symbolic = True
                tmp = self.temp()
                self.emit(depth, f"{tmp} = {dims[k]} * {size_code}")
                size_code = tmp
        layout = _Layout(dims, static, strides, size_code)
        self.layouts[id(b)] = layout
        return layout

    def site(self, message: str) -> int:
        """Register a fault message (formatted with runtime values) and return its id."""
        self.sites.append(f"{self.name}: {message}")
        return len(self.sites) - 1

    def shaped(self, b: t.Buffer) -> str:
        """`b` reshaped to its dimensions, to pass to another function."""
        name = self.lookup(b)
        dims = self.layouts[id(b)].dims
        shape = f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"
        return f"{name}.reshape({shape})"

    def flat_index(self, b: t.Buffer, indices: tuple[t.PrimExpr, ...], what: str) -> str:
        self.lookup(b)
        layout = self.layouts[id(b)]
        if len(indices) != len(layout.dims):
            raise IRError(f"{self.name}: {what} '{b.name}' with {len(indices)} indices; the "
                          f"buffer has {len(layout.dims)} dimensions (run kiln.ir.verify)")
        terms: list[str] = []
        for d, idx in enumerate(indices):
            if not dt.is_int(idx.dtype):
                raise IRError(f"{self.name}: index {d} of '{b.name}' has dtype {idx.dtype}")
            v = self.expr(idx)
            code = v.code
            size = layout.static[d]
            dim = layout.dims[d]
            if size is None or v.lo is None or v.hi is None or v.lo < 0 or v.hi >= size:
                site = self.site(f"{what} buffer '{b.name}': index {{0}} is out of bounds for "
                                 f"dimension {d} of size {{1}}")
                tmp = self.temp()
                code = (f"({tmp} if 0 <= ({tmp} := {code}) < {dim} "
                        f"else _oob({site}, {tmp}, {dim}))")
            stride = layout.strides[d]
            terms.append(code if stride == "1" else f"{code} * {stride}")
        return " + ".join(terms) if terms else "0"

    # ------------------------------------------------------------------ expressions

    def expr(self, e: t.PrimExpr) -> _V:
        v = self._expr(e)
        if v.depth > _HOIST_DEPTH:
            tmp = self.temp()
            self.pre.append(f"{tmp} = {v.code}")
            return _V(tmp, v.lo, v.hi, 0)
        return v

    def wrap(self, code: str, lo: int | None, hi: int | None, dtype: str, depth: int) -> _V:
        """Wrap an integer result into `dtype` unless its bounds prove it fits."""
        dlo, dhi = int_range(dtype)
        if lo is not None and hi is not None and dlo <= lo and hi <= dhi:
            return _V(code, lo, hi, depth)
        mask = (1 << dt.bits(dtype)) - 1
        if dt.kind(dtype) == "uint":
            return _V(f"({code} & {mask})", dlo, dhi, depth + 1)
        half = 1 << (dt.bits(dtype) - 1)
        return _V(f"((({code} + {half}) & {mask}) - {half})", dlo, dhi, depth + 1)

    def _expr(self, e: t.PrimExpr) -> _V:
        method = _EXPR_RULES.get(type(e))
        if method is None:
            raise IRError(f"{self.name}: the interpreter has no rule for {type(e).__name__}")
        result: _V = method(self, e)
        return result

    def var(self, e: t.Var) -> _V:
        name = self.lookup(e)
        if dt.is_int(e.dtype):
            lo, hi = self.ranges.get(id(e), int_range(e.dtype))
            return _V(name, lo, hi)
        return _V(name)

    def const_expr(self, e: t.Const) -> _V:
        if e.dtype == "bool":
            return _V("True" if e.value else "False")
        if dt.is_float(e.dtype):
            value = float(e.value)
            if e.dtype == "float16":
                return _V(self.const(round16(value)))
            if e.dtype == "bfloat16":
                return _V(self.const(round_bf16(value)))
            return _V(self.const(float_carrier(e.dtype)(value)))
        v = int(e.value)
        lo, hi = int_range(e.dtype)
        if not lo <= v <= hi:
            raise IRError(f"{self.name}: constant {v} does not fit {e.dtype}")
        return _V(f"({v})" if v < 0 else str(v), v, v)

    def load(self, e: t.Load) -> _V:
        b = e.buffer
        index = self.flat_index(b, e.indices, "load from")
        name = self.lookup(b)
        if dt.is_float(b.dtype):
            if b.dtype in ("float16", "bfloat16"):
                return _V(f"_F32({name}[{index}])", depth=1)
            return _V(f"{name}[{index}]", depth=1)
        lo, hi = int_range(b.dtype)
        return _V(f"{name}.item({index})", lo, hi, depth=1)

    def binary(self, e: t.BinaryOp) -> _V:
        a, b = self.expr(e.a), self.expr(e.b)
        if e.a.dtype != e.b.dtype:
            raise IRError(f"{self.name}: '{e.op}' on {e.a.dtype} and {e.b.dtype} "
                          "(run kiln.ir.verify)")
        dtype = e.a.dtype
        depth = max(a.depth, b.depth) + 1
        op = e.op
        if op in ("min", "max"):
            fn = "min" if op == "min" else "max"
            if dt.is_float(dtype):
                fn = "_f" + fn  # a NaN operand gives NaN, as in the backends
            lo = hi = None
            if None not in (a.lo, a.hi, b.lo, b.hi):
                pick = min if op == "min" else max
                lo, hi = pick(a.lo, b.lo), pick(a.hi, b.hi)  # type: ignore[type-var]
            # Python's min/max return the first operand on ties.
            return _V(f"{fn}({a.code}, {b.code})", lo, hi, depth)
        if dtype == "bool":
            return self.bool_binary(op, a, b, depth)
        if dt.is_float(dtype):
            return self.float_binary(op, a, b, dtype, depth)
        return self.int_binary(op, a, b, dtype, depth)

    def bool_binary(self, op: str, a: _V, b: _V, depth: int) -> _V:
        sym = {"and": "&", "or": "|", "xor": "^"}.get(op)
        if sym is None:
            raise IRError(f"{self.name}: '{op}' is not defined on bool")
        return _V(f"bool({a.code} {sym} {b.code})", depth=depth)

    def float_binary(self, op: str, a: _V, b: _V, dtype: str, depth: int) -> _V:
        sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}.get(op)
        if sym is not None:
            return _V(f"({a.code} {sym} {b.code})", depth=depth)
        width = "64" if dtype == "float64" else "32"
        calls = {"floordiv": "_ffloordiv", "floormod": "_ffloormod", "mod": "_fmod",
                 "pow": f"_pow{width}"}
        if op not in calls:
            raise IRError(f"{self.name}: '{op}' is not defined on {dtype}")
        return _V(f"{calls[op]}({a.code}, {b.code})", depth=depth)

    def int_binary(self, op: str, a: _V, b: _V, dtype: str, depth: int) -> _V:
        bits = dt.bits(dtype)
        lo: int | None = None
        hi: int | None = None
        known = None not in (a.lo, a.hi, b.lo, b.hi)
        alo, ahi, blo, bhi = (a.lo or 0), (a.hi or 0), (b.lo or 0), (b.hi or 0)
        nonneg = known and alo >= 0 and blo >= 1
        if op in ("add", "sub", "mul"):
            sym = {"add": "+", "sub": "-", "mul": "*"}[op]
            if known:
                if op == "add":
                    lo, hi = alo + blo, ahi + bhi
                elif op == "sub":
                    lo, hi = alo - bhi, ahi - blo
                else:
                    corners = (alo * blo, alo * bhi, ahi * blo, ahi * bhi)
                    lo, hi = min(corners), max(corners)
            return self.wrap(f"({a.code} {sym} {b.code})", lo, hi, dtype, depth)
        if op in ("div", "floordiv"):
            if nonneg or op == "floordiv":
                code = f"({a.code} // {b.code})"
                if known and blo >= 1:
                    lo, hi = min(alo // blo, alo // bhi), max(ahi // blo, ahi // bhi)
            else:
                code = f"_tdiv({a.code}, {b.code})"
                if known:
                    m = max(abs(alo), abs(ahi))
                    lo, hi = -m, m
            return self.wrap(code, lo, hi, dtype, depth)
        if op in ("mod", "floormod"):
            if nonneg or op == "floormod":
                code = f"({a.code} % {b.code})"
                if known and blo >= 1:
                    lo, hi = 0, bhi - 1
            else:
                code = f"_tmod({a.code}, {b.code})"
            if lo is None and known:
                m = max(abs(blo), abs(bhi))
                lo, hi = -m, m
            return self.wrap(code, lo, hi, dtype, depth)
        if op in ("and", "or", "xor"):
            sym = {"and": "&", "or": "|", "xor": "^"}[op]
            # Bitwise ops on in-range two's complement ints stay in range.
            dlo, dhi = int_range(dtype)
            return _V(f"({a.code} {sym} {b.code})", dlo, dhi, depth)
        if op == "shl":
            return self.wrap(f"_shl({a.code}, {b.code}, {bits})", None, None, dtype, depth)
        if op == "shr":
            dlo, dhi = int_range(dtype)
            return _V(f"_shr({a.code}, {b.code}, {bits})", dlo, dhi, depth)
        if op == "pow":
            return self.wrap(f"_ipow({a.code}, {b.code}, {bits})", None, None, dtype, depth)
        raise IRError(f"{self.name}: '{op}' is not defined on {dtype}")

    def compare(self, e: t.Compare) -> _V:
        a, b = self.expr(e.a), self.expr(e.b)
        sym = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}[e.op]
        return _V(f"({a.code} {sym} {b.code})", depth=max(a.depth, b.depth) + 1)

    def unary(self, e: t.UnaryOp) -> _V:
        a = self.expr(e.a)
        dtype = e.a.dtype
        depth = a.depth + 1
        if e.op == "neg":
            if dt.is_float(dtype):
                return _V(f"(-{a.code})", depth=depth)
            if dtype == "bool":
                raise IRError(f"{self.name}: 'neg' is not defined on bool")
            lo = -a.hi if a.hi is not None else None
            hi = -a.lo if a.lo is not None else None
            return self.wrap(f"(-{a.code})", lo, hi, dtype, depth)
        if dtype == "bool":
            return _V(f"(not {a.code})", depth=depth)
        if dt.is_float(dtype):
            raise IRError(f"{self.name}: 'not' is not defined on {dtype}")
        if dt.kind(dtype) == "uint":
            return _V(f"(~{a.code} & {(1 << dt.bits(dtype)) - 1})", *int_range(dtype), depth)
        return _V(f"(~{a.code})", *int_range(dtype), depth)

    def select(self, e: t.Select) -> _V:
        c, x, y = self.expr(e.cond), self.expr(e.true_value), self.expr(e.false_value)
        lo = hi = None
        if None not in (x.lo, x.hi, y.lo, y.hi):
            lo, hi = min(x.lo, y.lo), max(x.hi, y.hi)  # type: ignore[type-var]
        return _V(f"_sel({c.code}, {x.code}, {y.code})", lo, hi,
                  max(c.depth, x.depth, y.depth) + 1)

    def cast(self, e: t.Cast) -> _V:
        v = self.expr(e.value)
        src, dst = e.value.dtype, e.dtype
        depth = v.depth + 1
        if src == dst:
            return v
        if dst == "bool":
            return _V(f"bool({v.code} != 0)", depth=depth)
        if dt.is_int(dst):
            if src == "bool":
                return _V(f"int({v.code})", 0, 1, depth)
            if dt.is_float(src):
                return self.wrap(f"_f2i({v.code})", None, None, dst, depth)
            return self.wrap(v.code, v.lo, v.hi, dst, depth)
        # To a float dtype.
        if dst == "float16":
            return _V(f"_round16({v.code})", depth=depth)
        if dst == "bfloat16":
            return _V(f"_round_bf16({v.code})", depth=depth)
        fn = "_F64" if dst == "float64" else "_F32"
        return _V(f"{fn}({v.code})", depth=depth)

    def reinterpret(self, e: t.Reinterpret) -> _V:
        v = self.expr(e.value)
        src, dst = e.value.dtype, e.dtype
        fault = t.reinterpret_fault(src, dst)
        if fault is not None:
            raise IRError(f"{self.name}: {fault}")
        if src == dst:
            return v
        view = self.const(bit_view(src, dst), "bits")
        if dt.is_int(dst):
            return _V(f"{view}({v.code})", *int_range(dst), v.depth + 1)
        return _V(f"{view}({v.code})", depth=v.depth + 1)

    def check(self, e: t.Intrin) -> _V:
        cond, code = (self.expr(a) for a in e.args)
        return _V(f"_check({cond.code}, {code.code})", depth=max(cond.depth, code.depth) + 1)

    def intrin(self, e: t.Intrin) -> _V:
        if e.name == t.CHECK_INTRINSIC:
            return self.check(e)
        if e.name in t.PROFILE_INTRINSICS:  # timers measure compiled code only: read 0 here
            return _V("0", 0, 0)
        args = [self.expr(a) for a in e.args]
        codes = ", ".join(a.code for a in args)
        depth = max(a.depth for a in args) + 1
        dtype = e.args[0].dtype
        name = e.name
        if name == t.DOT2_BF16:
            return _V(f"_dot2_bf16({codes})", depth=depth)
        if name == t.BF16_PAIR:
            return self.wrap(f"_bf16_pair({codes})", -(1 << 31), (1 << 31) - 1, "int32", depth)
        if name in t.DOT4_INTRINSICS:
            return self.wrap(f"_{name}({codes})", None, None, "int32", depth)
        if not dt.is_float(dtype):
            if name == "abs" and dt.is_int(dtype):
                a = args[0]
                lo = hi = None
                if a.lo is not None and a.hi is not None:
                    hi = max(abs(a.lo), abs(a.hi))
                    lo = 0 if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi))
                return self.wrap(f"abs({codes})", lo, hi, dtype, depth)
            raise IRError(f"{self.name}: intrinsic '{name}' needs a float argument, got {dtype}")
        width = "64" if dtype == "float64" else "32"
        carrier = "_F64" if dtype == "float64" else "_F32"
        if name in EXACT_UFUNCS:
            return _V(f"_{name}({codes})", depth=depth)
        if name in FLOAT_UFUNCS:
            return _V(f"_{name}{width}({codes})", depth=depth)
        one = self.const(float_carrier(dtype)(1.0))
        if name == "rsqrt":
            return _V(f"({one} / _sqrt({codes}))", depth=depth)
        if name == "sigmoid":
            return _V(f"({one} / ({one} + _exp{width}(-{codes})))", depth=depth)
        if name == "erf":
            return _V(f"_erf{width}({codes})", depth=depth)
        if name == "fma":
            # float32: the product is exact in float64, so only the sum rounds (twice:
            # to float64, then float32; a true fma rounds once, which differs in rare
            # ties). float64: a product and a sum, each rounded.
            x, y, z = (v.code for v in args)
            if width == "32":
                return _V(f"_F32(_F64({x}) * _F64({y}) + _F64({z}))", depth=depth)
            return _V(f"(({x}) * ({y}) + ({z}))", depth=depth)
        raise IRError(f"{self.name}: the interpreter has no rule for intrinsic '{name}' "
                      f"({carrier})")

    def call_extern(self, e: t.CallExtern) -> _V:
        ref = EXTERN_REFERENCES.get(e.name)
        if ref is None:
            known = ", ".join(sorted(EXTERN_REFERENCES))
            raise IRError(f"{self.name}: no reference for extern '{e.name}'; the interpreter "
                          f"knows {known}. Add one with "
                          "kiln.ir.evaluate.register_extern_reference")
        got = tuple("buffer" if isinstance(a, t.Buffer) else a.dtype for a in e.args)
        if not ref.accepts(got, e.dtype):
            raise IRError(f"{self.name}: extern '{e.name}' takes ({', '.join(ref.arg_dtypes)}) "
                          f"-> {ref.ret_dtype or 'any'}, but is called with "
                          f"({', '.join(got)}) -> {e.dtype}")
        args = [_V(self.lookup(a)) if isinstance(a, t.Buffer) else self.expr(a)
                for a in e.args]
        fn = self.const(ref.fn, "x")
        depth = max((a.depth for a in args), default=0) + 1
        code = f"{fn}({', '.join(a.code for a in args)})"
        if ref.ret_dtype is None:
            code = f"{self.const(converter(e.dtype), 'cv')}({code})"
        if dt.is_int(e.dtype):
            lo, hi = int_range(e.dtype)
            return _V(code, lo, hi, depth)
        return _V(code, depth=depth)


_STMT_RULES: dict[type, Callable[[_Compiler, Any, int], None]] = {
    t.SeqStmt: _Compiler.seq,
    t.Store: _Compiler.store,
    t.For: _Compiler.for_,
    t.LetStmt: _Compiler.let,
    t.IfThenElse: _Compiler.if_,
    t.While: _Compiler.while_,
    t.Allocate: _Compiler.allocate,
    t.AllocConst: _Compiler.alloc_const,
    t.DeclBuffer: _Compiler.decl_buffer,
    t.Evaluate: _Compiler.evaluate,
    t.CallFunc: _Compiler.call_func,
}

_EXPR_RULES: dict[type, Callable[[_Compiler, Any], _V]] = {
    t.Var: _Compiler.var,
    t.Const: _Compiler.const_expr,
    t.Load: _Compiler.load,
    t.BinaryOp: _Compiler.binary,
    t.Compare: _Compiler.compare,
    t.UnaryOp: _Compiler.unary,
    t.Select: _Compiler.select,
    t.Cast: _Compiler.cast,
    t.Reinterpret: _Compiler.reinterpret,
    t.Intrin: _Compiler.intrin,
    t.CallExtern: _Compiler.call_extern,
}

# Compiled functions, each kept while its PrimFunc lives.
_CACHE: IdentityCache[t.PrimFunc, CompiledFunc] = IdentityCache()


def compile_primfunc(func: t.PrimFunc, name: str) -> CompiledFunc:
    """`func` (called `name` in messages) compiled, once while it lives."""

    def compile_func(func: t.PrimFunc) -> CompiledFunc:
        check_nesting(func, f"evaluate {name}")
        return _Compiler(func, name).compile()

    return _CACHE.get_or_compute(func, compile_func)


"""`vector` loops to C with GCC/Clang vector extensions.

The `vectorize-loops` pass (transform/vectorize_loops.py) marks straight-line lane
loops `for v in T.vector(n)`. The C backend prints each as vector code in chunks of the
register width the pass recorded (module attribute `kiln.vector_bits`; 128 bits when
absent): a chunk of `w` float32 lanes is one `kiln_f32x{w}` value per IR node, where

    typedef float kiln_f32x8 __attribute__((vector_size(32)));

Loads and stores go through an unaligned, `may_alias` variant of the type
(`kiln_f32x8_u`), which the compiler turns into unaligned vector moves; values that do
not depend on the loop variable are computed once per chunk and broadcast. `min`/`max`
keep the IR's NaN rule with a compare-and-blend, `fma` is `fmaf` per lane (GCC and
Clang fuse it into vector FMA instructions where the target has them); a `select` is a
blend on an int32 comparison mask, a `reinterpret` a vector cast (bits kept), a value
`cast` `__builtin_convertvector` (int32 to float32: exp's forms, kiln.kernels.math;
bytes and words widened to int32 or float32, which C converts by the source's sign: the
dequantize loops; int32 narrowed to bytes, modulo 256 as GCC and Clang define it).
Byte and word lanes (int8, uint8, int16, uint16: the integer max pools' rows) load,
`min`/`max` and store as `kiln_u8x32` and so on, their masks of the same width (GCC 12
makes a uint8 max `vpminub`, `vpcmpeqb` and `vpblendvb` with AVX2: it does not see the
blend as `vpmaxub`; LLVM's backend emits the one instruction). Chunks span the register
over the widest element the loop touches or casts to (32 bytes, 8 float32 lanes with
AVX2, also when bytes are widened to float32). Chunk
widths are powers of two (the extension's rule): `n` is covered by full-width chunks, then
halves down to one lane, which prints as scalar code.

A compiler without the extensions (`__GNUC__` undefined; MSVC is not a kiln target),
or a build with `-DKILN_VECTORS=0`, gets the plain scalar loop printed next to the
vector code under `#if KILN_VECTORS`.
Loops with `dot4_u8s8` stay scalar loops (the scalar helper is what the C compiler
vectorizes best), and so do selects of 64-bit lanes, rounding intrinsics and narrowing
stores (int32 lanes to bytes).

No function takes or returns a vector, so no vector crosses an ABI boundary (GCC warns
about that, `-Wpsabi`, when the vector is wider than the target's registers).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kiln.codegen.c.context import value_ctype
from kiln.codegen.c.expr import ADD, paren
from kiln.ir import dtype as dt
from kiln.ir.affine import mentions
from kiln.ir.analysis.vector_loops import element_bytes, narrowed
from kiln.ir.attrs import ATTR_VECTOR_BITS
from kiln.ir.tensor import (
    BinaryOp,
    Buffer,
    Cast,
    Compare,
    Const,
    For,
    Intrin,
    LetStmt,
    Load,
    PrimExpr,
    Reinterpret,
    Select,
    SeqStmt,
    Stmt,
    Store,
    UnaryOp,
    Var,
)
from kiln.ir.visitor import iter_nodes

if TYPE_CHECKING:
    from kiln.codegen.c.kernel import KernelPrinter

# The register width when the module does not record one: every C target kiln builds
# for (x86-64 SSE2, AArch64 NEON) has 128-bit vectors, others split them.
DEFAULT_VECTOR_BITS = 128
# Straight-line chunks up to this many; longer loops run a C loop over full chunks.
MAX_UNROLLED_CHUNKS = 8
# A scalar operand that can be splatted as it is printed (a name or a plain number).
SIMPLE_OPERAND = re.compile(r"[\w.]+")
_SHORT = {"float32": "f32", "float64": "f64", "int32": "i32", "int64": "i64",
          "int8": "i8", "uint8": "u8", "int16": "i16", "uint16": "u16"}
# The integer vector a comparison of two vectors of a dtype gives (also the blend mask).
_MASK = {"float32": "int32", "float64": "int64", "int32": "int32", "int64": "int64",
         "int8": "int8", "uint8": "int8", "int16": "int16", "uint16": "int16"}
_FMA = {"float32": "fmaf", "float64": "fma"}
_VECTOR_INTRINSICS = frozenset({"fma", "isnan"})
# selects and comparisons print as masks of 32-bit lanes (the vectorizable math's) or of
# byte and word lanes (the integer max pools')
_MASKED_LANES = frozenset({"float32", "int32", "int8", "uint8", "int16", "uint16"})
_INFIX_TOKENS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "and": "&", "or": "|",
                 "xor": "^", "shl": "<<", "shr": ">>"}
_COMPARE_TOKENS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


def vector_type(dtype: str, lanes: int) -> str:
    """The C vector type of `lanes` values of `dtype`, e.g. kiln_f32x8."""
    return f"kiln_{_SHORT[dtype]}x{lanes}"


def vector_preamble(types: set[tuple[str, int]]) -> list[str]:
    """Typedefs of the vector types a translation unit uses (with their masks)."""
    if not types:
        return []
    wanted = types | {(_MASK[d], n) for d, n in types}
    out = ["/* Vector types of the `vector` loops (GCC/Clang vector extensions); without",
           "   them, or with -DKILN_VECTORS=0, the loops run scalar. `_u`: unaligned, may",
           "   alias its elements. */",
           "#ifndef KILN_VECTORS",
           "#if defined(__GNUC__) || defined(__clang__)",
           "#define KILN_VECTORS 1",
           "#else",
           "#define KILN_VECTORS 0",
           "#endif",
           "#endif",
           "#if KILN_VECTORS"]
    for dtype, lanes in sorted(wanted, key=lambda x: (x[0], x[1])):
        name, size = vector_type(dtype, lanes), lanes * dt.itemsize(dtype)
        ctype = value_ctype(dtype)
        out.append(f"typedef {ctype} {name} __attribute__((vector_size({size})));")
        out.append(f"typedef {ctype} {name}_u __attribute__((vector_size({size}), "
                   f"aligned({dt.itemsize(dtype)}), may_alias));")
    out += ["#endif", ""]
    return out


def chunk_lanes(loop: For, vector_bits: int) -> int:
    """Lanes per chunk: the register width over the widest element, a power of two."""
    lanes = max(1, vector_bits // (8 * element_bytes(loop)))
    return 1 << (lanes.bit_length() - 1)


def prints_as_vectors(loop: For) -> bool:
    """Whether the C backend prints `vector` loop `loop` as vector code: not with
    `dot4_u8s8` (nor the `vector` forms this printer lacks: rounding intrinsics, selects
    and comparisons of 64-bit lanes, narrowing stores), which print as the scalar loop."""
    return not any(_scalar_only(n) for n in iter_nodes(loop.body))


def _scalar_only(node: object) -> bool:
    if isinstance(node, Store):  # a narrowing store (int32 lanes to bytes): the C
        return narrowed(node) is not None  # compiler vectorizes the scalar loop
    if isinstance(node, Intrin):
        return node.name not in _VECTOR_INTRINSICS or (
            node.name == "isnan" and node.args[0].dtype != "float32")
    if isinstance(node, Select):
        return node.dtype not in _MASKED_LANES
    if isinstance(node, Compare):
        return node.a.dtype not in _MASKED_LANES
    return False


class VectorLoopPrinter:
    """Prints one `vector` loop (checked by the verifier) as chunks of vector code."""

    def __init__(self, kp: KernelPrinter, loop: For) -> None:
        self.kp = kp
        self.p = kp.p
        self.ctx = kp.ctx
        self.loop = loop
        self.var = loop.var
        self.vectors: dict[Var, str] = {}
        self.width = 1

    def print(self) -> None:
        loop, p, ctx = self.loop, self.p, self.ctx
        assert isinstance(loop.extent, Const)
        extent = int(loop.extent.value)
        bits = int(ctx.module.mod.attrs.get(ATTR_VECTOR_BITS, DEFAULT_VECTOR_BITS))
        full = min(chunk_lanes(loop, bits), 1 << (extent.bit_length() - 1))
        start = paren(self.kp.loop_bound(loop.start, self.var), ADD)
        p.line(f"/* vector loop {self.var.name}: {extent} lanes */")
        p.line("#if KILN_VECTORS")
        offset = 0
        count = extent // full
        if count > MAX_UNROLLED_CHUNKS:
            with ctx.names.scope():
                base = ctx.names.fresh("lane")
                p.line(f"for (int64_t {base} = 0; {base} < {count * full}; {base} += {full}) {{")
                with p.indented():
                    self.chunk(f"{start} + {base}", full)
                p.line("}")
            offset = count * full
        width = full
        while offset < extent:
            while offset + width > extent:
                width //= 2
            self.chunk(self.lane(start, offset), width)
            offset += width
        p.line("#else")
        self.kp.scalar_for(loop)
        p.line("#endif")

    def lane(self, start: str, offset: int) -> str:
        """C text of lane `offset`'s loop variable value."""
        if isinstance(self.loop.start, Const):
            return str(int(self.loop.start.value) + offset)
        return f"{start} + {offset}" if offset else start

    def chunk(self, first: str, width: int) -> None:
        """Lanes [first, first + width) as one block of vector (or scalar) code."""
        ctx, p = self.ctx, self.p
        self.width = width
        p.line("{")
        with p.indented(), ctx.names.scope():
            name = ctx.names.fresh(self.var.name)
            previous = ctx.vars.get(self.var)
            ctx.vars[self.var] = name
            p.line(f"const {value_ctype(self.var.dtype)} {name} = {first};")
            if width == 1:
                self.kp.block(self.loop.body)
            else:
                self.block(self.loop.body)
            self.kp.restore_var(self.var, previous)
        p.line("}")

    def block(self, s: Stmt) -> None:
        bound: list[tuple[Var, bool, str | None]] = []
        for item in _items(s):
            if isinstance(item, SeqStmt):
                self.block(item)
            elif isinstance(item, LetStmt):
                if item.var not in self.kp.refs:
                    continue  # unused (-Wunused-variable); a vector value has no effects
                if self.lane_invariant(item.value):
                    value = self.kp.expr(item.value).text
                    name = self.ctx.names.fresh(item.var.name)
                    self.p.line(f"const {value_ctype(item.var.dtype)} {name} = {value};")
                    bound.append((item.var, False, self.ctx.vars.get(item.var)))
                    self.ctx.vars[item.var] = name
                else:
                    value = self.vexpr(item.value)
                    name = self.ctx.names.fresh(item.var.name)
                    self.p.line(f"const {self.vtype(item.var.dtype)} {name} = {value};")
                    bound.append((item.var, True, self.vectors.get(item.var)))
                    self.vectors[item.var] = name
            else:
                assert isinstance(item, Store)
                value = self.vexpr(item.value)
                self.p.line(f"*({self.vtype(item.buffer.dtype)}_u*)"
                            f"{self.address(item.buffer, item.indices)} = {value};")
        for var, is_vector, previous in reversed(bound):
            if not is_vector:
                self.kp.restore_var(var, previous)
            elif previous is None:
                self.vectors.pop(var, None)
            else:
                self.vectors[var] = previous

    def lane_invariant(self, e: PrimExpr) -> bool:
        return not mentions(e, {self.var, *self.vectors})

    def vtype(self, dtype: str) -> str:
        self.ctx.module.vector_types.add((dtype, self.width))
        return vector_type(dtype, self.width)

    def address(self, buf: Buffer, indices: tuple[PrimExpr, ...]) -> str:
        ref = self.ctx.buffer(buf)
        return f"&{ref.name}[{self.kp.exprs.index(buf, indices)}]"

    def temp(self, dtype: str, value: str, hint: str = "vec") -> str:
        name = self.ctx.names.fresh(hint)
        self.p.line(f"const {self.vtype(dtype)} {name} = {value};")
        return name

    def vexpr(self, e: PrimExpr) -> str:
        """The name of a vector temporary holding `e` for the chunk's lanes."""
        if self.lane_invariant(e):
            scalar = self.kp.expr(e).text
            if not SIMPLE_OPERAND.fullmatch(scalar):  # a name or a number: used as it is
                name = self.ctx.names.fresh("inv")
                self.p.line(f"const {value_ctype(e.dtype)} {name} = {scalar};")
                scalar = name
            return self.temp(e.dtype, "(" + self.vtype(e.dtype) + "){"
                             + ", ".join([scalar] * self.width) + "}", "splat")
        if isinstance(e, Var):
            return self.vectors[e]
        if isinstance(e, Load):
            t = self.vtype(e.dtype)
            return self.temp(e.dtype, f"*(const {t}_u*){self.address(e.buffer, e.indices)}",
                             "load")
        if isinstance(e, BinaryOp) and e.op in ("shl", "shr"):
            # by a constant in [0, 32) (the analysis checks); -fwrapv: `<<` wraps
            assert isinstance(e.b, Const)
            return self.temp(e.dtype, f"{self.vexpr(e.a)} {_INFIX_TOKENS[e.op]} "
                                      f"{int(e.b.value)}")
        if isinstance(e, BinaryOp):
            a, b = self.vexpr(e.a), self.vexpr(e.b)
            if e.op in ("min", "max"):
                return self.min_max(e.op, e.dtype, a, b)
            return self.temp(e.dtype, f"{a} {_INFIX_TOKENS[e.op]} {b}")
        if isinstance(e, UnaryOp):
            assert e.op == "neg"
            return self.temp(e.dtype, f"-{self.vexpr(e.a)}")
        if isinstance(e, Select):
            return self.blend(e.dtype, self.mask(e.cond, _MASK[e.dtype]),
                              self.vexpr(e.true_value),
                              self.vexpr(e.false_value))
        if isinstance(e, Reinterpret):  # a cast between vector types of one size: the bits
            return self.temp(e.dtype, f"({self.vtype(e.dtype)}){self.vexpr(e.value)}")
        if isinstance(e, Cast):  # the analysis checks which (`vector_cast_fault`)
            return self.temp(e.dtype, f"__builtin_convertvector({self.vexpr(e.value)}, "
                                      f"{self.vtype(e.dtype)})")
        assert isinstance(e, Intrin) and e.name == "fma"
        args = [self.vexpr(a) for a in e.args]
        lanes = ", ".join(f"{_FMA[e.dtype]}({', '.join(f'{a}[{k}]' for a in args)})"
                          for k in range(self.width))
        return self.temp(e.dtype, f"({self.vtype(e.dtype)}){{{lanes}}}")

    def mask(self, cond: PrimExpr, dtype: str) -> str:
        """A `dtype` (signed integer) vector of -1 (true) or 0 per lane for the bool
        `cond`; a comparison of lanes of another width is converted (-1 stays -1)."""
        if self.lane_invariant(cond):
            scalar = self.ctx.names.fresh("inv")
            ctype = value_ctype(dtype)
            self.p.line(f"const {ctype} {scalar} = -({ctype})({self.kp.expr(cond).text});")
            return self.temp(dtype, f"({self.vtype(dtype)}){{"
                             + ", ".join([scalar] * self.width) + "}", "splat")
        if isinstance(cond, Intrin):  # isnan: a NaN lane is unequal to itself
            a, own = self.vexpr(cond.args[0]), _MASK[cond.args[0].dtype]
            pick = self.temp(own, f"{a} != {a}", "pick")
        else:
            assert isinstance(cond, Compare)
            a, b, own = self.vexpr(cond.a), self.vexpr(cond.b), _MASK[cond.a.dtype]
            pick = self.temp(own, f"{a} {_COMPARE_TOKENS[cond.op]} {b}", "pick")
        if own == dtype:
            return pick
        return self.temp(dtype, f"__builtin_convertvector({pick}, {self.vtype(dtype)})", "pick")

    def blend(self, dtype: str, mask: str, a: str, b: str) -> str:
        """`mask ? a : b` per lane, as bitwise operations on the lanes' bits."""
        mask_t = self.vtype(_MASK[dtype])
        return self.temp(dtype, f"({self.vtype(dtype)})((({mask_t}){a} & {mask}) | "
                         f"(({mask_t}){b} & ~{mask}))")

    def min_max(self, op: str, dtype: str, a: str, b: str) -> str:
        """numpy's rule, like the scalar helpers: (a <= b || isnan(a)) ? a : b for min
        (>= for max), as a compare mask and a bitwise blend."""
        cmp = "<=" if op == "min" else ">="
        nan = f" | ({a} != {a})" if dt.is_float(dtype) else ""  # ints: never NaN
        mask = self.temp(_MASK[dtype], f"({a} {cmp} {b}){nan}", "pick")
        return self.blend(dtype, mask, a, b)


def _items(s: Stmt) -> Iterator[Stmt]:
    yield from s.body if isinstance(s, SeqStmt) else (s,)

"""Which `vectorized` loops are straight-line vector code (backend-neutral).

kiln's kernels spell the lanes of a register tile (kiln.kernels.tiles) as an
innermost `for v in T.vectorized(n)` loop. When its body is straight-line arithmetic,
every IR node of the body can be computed for all `n` lanes at once: one vector load,
operation or store per node. The `vectorize-loops` pass (kiln.transform.vectorize_loops)
turns such loops into `T.vector(n)` loops and the backends emit them as vector code
(kiln.codegen.llvm.vector_loops, kiln.codegen.c.vector).

A loop qualifies (`vector_shape_fault` checks its shape, `vector_loop_lanes` all of it)
when:

- its extent is a constant from 2 to `MAX_LANES`;
- its body holds stores and lets only (a let whose value depends on the loop variable
  binds a vector);
- every expression that depends on the loop variable is a float32/float64 `add`, `sub`,
  `mul`, `div`, `min`, `max`, `neg`, `fma`, `floor`, `ceil`, `trunc`, `round` or
  `abs`; an int32 `add`, `sub`, `mul`, `min`, `max`, `and`, `or`, `xor`, `neg`, a
  shift by a constant or `dot4_u8s8`; `dot2_bf16` (a float32 sum, int32 words);
  `bf16_pair` (int32 words of float32 values); a
  `select` on a comparison of such values (or
  `isnan`); an int32-to-float32 `cast`, a widening `cast` of byte or word lanes to int32
  or float32 (zero-extended from the unsigned types, sign-extended from the signed ones:
  every dequantize of bytes); a 32-bit `reinterpret` between float32 and
  int32 (the vectorizable math of kiln.kernels.math); such a let variable, or a
  load whose element moves by exactly one when the variable grows by one (a
  contiguous load); expressions that do not depend on it are computed once and
  broadcast;
- byte and word lanes (`SMALL_INT_DTYPES`: int8, uint8, int16, uint16) hold loads,
  `min`, `max` and `select`s on comparisons of the same dtype (the integer max pools'
  rows), and int32 lanes narrowed to them by a `cast` (each lane's low byte or word);
  arithmetic on them is refused (it would wrap in the lane's width);
- every store is contiguous; a store into a byte or word buffer stores the cast of an
  int32 expression (each lane truncated to its low byte or word: the quantized kernels'
  outputs, bfloat16 values) or a value of the buffer's own dtype;
- (independence) the buffers the loop writes are touched only contiguously, at element
  distances that keep different iterations apart (0, or at least the extent), and no
  other buffer of the loop may share their memory (stack buffers, constants and
  `noalias` parameters cannot: `private_buffers`); no written buffer is a constant.
"""

from __future__ import annotations

from kiln.ir.affine import constant_offset, flat_coefficient, mentions, mentions_memoized
from kiln.ir.dtype import itemsize as dtype_bytes
from kiln.ir.identity_cache import IdentityCache
from kiln.ir.tensor import (
    BF16_PAIR,
    DOT2_BF16,
    DOT4_INTRINSICS,
    Allocate,
    AllocConst,
    BinaryOp,
    Buffer,
    Cast,
    Compare,
    Const,
    DeclBuffer,
    For,
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
)
from kiln.ir.visitor import iter_exprs, iter_nodes, iter_stmts

MAX_LANES = 256
VECTOR_DTYPES = frozenset({"float32", "float64"})
VECTOR_BINARY = frozenset({"add", "sub", "mul", "div", "min", "max"})
VECTOR_INTRINSICS = frozenset({"fma", "floor", "ceil", "trunc", "round", "abs"})
# int32 lanes: loads, stores, the integer dot product (the quantized kernels' tiles) and
# the integer arithmetic of 2^n in exp (kiln.kernels.math)
INT_VECTOR_DTYPE = "int32"
INT_VECTOR_BINARY = frozenset({"add", "sub", "mul", "min", "max", "and", "or", "xor"})
SHIFTS = frozenset({"shl", "shr"})
# reinterpret / cast between these two only (both 32 bits wide)
BIT_CAST_DTYPES = frozenset({"float32", "int32"})
# a store into these narrows int32 lanes (a Cast at the top of the stored value; 16-bit
# lanes: bfloat16 values, kiln.kernels.conv.nchwc_depthwise)
NARROW_STORE_DTYPES = frozenset({"int8", "uint8", "int16", "uint16"})
# byte and word lanes: loads, stores, min, max and selects (no arithmetic)
SMALL_INT_DTYPES = frozenset({"int8", "uint8", "int16", "uint16"})
SMALL_INT_BINARY = frozenset({"min", "max"})
# a cast of byte or word lanes widens them to these (zext / sext by the source's sign)
WIDENED_DTYPES = frozenset({INT_VECTOR_DTYPE, "float32"})


def vector_cast_fault(src: str, dst: str) -> str | None:
    """Why a `cast` of `src` lanes to `dst` has no vector form, or None: int32 to float32,
    byte or word lanes widened to int32 or float32, int32 narrowed to bytes or words."""
    if (src, dst) == (INT_VECTOR_DTYPE, "float32") or (
            src in SMALL_INT_DTYPES and dst in WIDENED_DTYPES) or (
            src == INT_VECTOR_DTYPE and dst in NARROW_STORE_DTYPES):
        return None
    return f"a cast from {src} to {dst} has no vector form"


def narrowed(s: Store) -> PrimExpr | None:
    """The int32 value a narrowing store `buffer[...] = Cast(int8/uint8/int16/uint16, value)`
    truncates, or None for any other store."""
    v = s.value
    if (s.buffer.dtype in NARROW_STORE_DTYPES and isinstance(v, Cast)
            and v.dtype == s.buffer.dtype and v.value.dtype == INT_VECTOR_DTYPE):
        return v.value
    return None

Access = tuple[Buffer, tuple[PrimExpr, ...], bool]  # buffer, indices, contiguous


class VectorBody:
    """Walks a loop body: is it straight-line vector code, and what does it touch."""

    def __init__(self, var: Var) -> None:
        self.var = var
        self.vectors: set[Var] = set()  # let variables bound to vectors
        self.accesses: list[Access] = []
        self.written: set[Buffer] = set()
        self.fault = ""
        # id(expression) -> (expression, does it vary per lane); the node is kept so its id
        # stays its own while the walk lasts (narrowed stores build temporary expressions)
        self._varying: dict[int, tuple[PrimExpr, bool]] = {}

    def fail(self, why: str) -> bool:
        self.fault = self.fault or why
        return False

    def forget_lanes(self) -> None:
        """Drop the per-node answers of the walk (it is done), keeping its findings."""
        self._varying.clear()

    def lane_invariant(self, e: PrimExpr) -> bool:
        return not self._varies(e)

    def _varies(self, root: PrimExpr) -> bool:
        """Whether `root` mentions the loop variable or a vector let. `expr` asks this of
        every node on its way down: each node's answer is kept (`mentions_memoized`)."""
        return mentions_memoized(root, self._lane_variable, self._varying)

    def _lane_variable(self, v: Var) -> bool:
        return v is self.var or v in self.vectors

    def stmt(self, s: Stmt) -> bool:
        if isinstance(s, SeqStmt):
            return all(self.stmt(x) for x in s.body)
        if isinstance(s, LetStmt):
            if s.var.dtype != s.value.dtype or not self.expr(s.value):
                return self.fail(self.fault or f"let '{s.var.name}' is not a vector value")
            if not self.lane_invariant(s.value):
                self.vectors.add(s.var)
                if id(s.var) in self._varying:  # s.var was seen before its let (reused):
                    self._varying.clear()       # answers above it may be stale
            return True
        if isinstance(s, Store):
            narrow = narrowed(s)
            small = narrow is None and s.buffer.dtype in SMALL_INT_DTYPES
            if narrow is None and not small and s.buffer.dtype not in (*VECTOR_DTYPES,
                                                                      INT_VECTOR_DTYPE):
                return self.fail(f"store into {s.buffer.dtype} buffer '{s.buffer.name}'")
            value = s.value if narrow is None else narrow
            wanted = (s.buffer.dtype,) if small else (s.buffer.dtype, INT_VECTOR_DTYPE)
            if value.dtype not in wanted or not self.expr(value):
                return self.fail(self.fault or f"the value stored into '{s.buffer.name}' "
                                 "is not a vector expression")
            if not self.contiguous(s.buffer, s.indices):
                return self.fail(f"the store into '{s.buffer.name}' is not contiguous")
            self.accesses.append((s.buffer, s.indices, True))
            self.written.add(s.buffer)
            return True
        return self.fail(f"the body holds a {type(s).__name__}, not only stores and lets")

    def contiguous(self, buf: Buffer, indices: tuple[PrimExpr, ...]) -> bool:
        if self.vectors and any(mentions(i, self.vectors) for i in indices):
            return False  # indexed by a computed vector: a gather
        return flat_coefficient(buf, indices, self.var) == 1

    def expr(self, e: PrimExpr) -> bool:
        """True if `e` can be computed for all lanes at once."""
        if self.lane_invariant(e):
            self.accesses += [(x.buffer, x.indices, False) for x in iter_exprs(e)
                              if isinstance(x, Load)]
            return True
        if isinstance(e, Var):
            return e in self.vectors or self.fail("the loop variable is used as a value")
        if e.dtype == "bool":
            return self.condition(e)
        if e.dtype in SMALL_INT_DTYPES:
            return self.small_int_expr(e)
        if e.dtype not in (*VECTOR_DTYPES, INT_VECTOR_DTYPE):
            return self.fail(f"a {e.dtype} expression depends on the loop variable")
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Select):
            return self.condition(e.cond) and self.expr(e.true_value) and self.expr(
                e.false_value)
        if isinstance(e, (Cast, Reinterpret)):
            return self.bit_cast(e)
        if e.dtype == INT_VECTOR_DTYPE:
            return self.int_expr(e)
        if isinstance(e, BinaryOp):
            return (((e.op in VECTOR_BINARY and e.a.dtype == e.b.dtype == e.dtype)
                     or self.fail(f"'{e.op}' has no vector form"))
                    and self.expr(e.a) and self.expr(e.b))
        if isinstance(e, UnaryOp):
            return (e.op == "neg" or self.fail(f"'{e.op}' has no vector form")) and self.expr(e.a)
        if isinstance(e, Intrin) and e.name == DOT2_BF16:
            return ((e.dtype == "float32" and all(a.dtype == INT_VECTOR_DTYPE
                                                  for a in e.args[1:]))
                    or self.fail("dot2_bf16 takes a float32 sum and int32 words")
                    ) and all(self.expr(a) for a in e.args)
        if isinstance(e, Intrin):
            return (((e.name in VECTOR_INTRINSICS and all(a.dtype == e.dtype for a in e.args))
                     or self.fail(f"'{e.name}' has no vector form"))
                    and all(self.expr(a) for a in e.args))
        return self.fail(f"a {type(e).__name__} has no vector form")

    def condition(self, e: PrimExpr) -> bool:
        """A bool of every lane: a comparison of vector values or `isnan` of one."""
        if self.lane_invariant(e):
            return self.expr(e)
        if isinstance(e, Compare):
            return ((e.a.dtype in (*VECTOR_DTYPES, INT_VECTOR_DTYPE, *SMALL_INT_DTYPES)
                     or self.fail(f"a comparison of {e.a.dtype} values has no vector form"))
                    and self.expr(e.a) and self.expr(e.b))
        if isinstance(e, Intrin) and e.name == "isnan" and e.args[0].dtype in VECTOR_DTYPES:
            return self.expr(e.args[0])
        return self.fail(f"a bool {type(e).__name__} has no vector form")

    def bit_cast(self, e: Cast | Reinterpret) -> bool:
        """float32 <-> int32 bits (Reinterpret), the value casts of `vector_cast_fault`."""
        src = e.value.dtype
        if isinstance(e, Cast):
            fault = vector_cast_fault(src, e.dtype)
            return (fault is None or self.fail(fault)) and self.expr(e.value)
        return ({src, e.dtype} == BIT_CAST_DTYPES or self.fail(
            f"a reinterpret from {src} to {e.dtype} has no vector form")) and self.expr(e.value)

    def load(self, e: Load) -> bool:
        if not self.contiguous(e.buffer, e.indices):
            return self.fail(f"the load of '{e.buffer.name}' is not contiguous")
        self.accesses.append((e.buffer, e.indices, True))
        return True

    def small_int_expr(self, e: PrimExpr) -> bool:
        """Byte or word lanes: a load, `min`/`max` of two such values, a select, int32
        lanes narrowed to bytes."""
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Cast):
            return self.bit_cast(e)
        if isinstance(e, Select):
            return self.condition(e.cond) and self.expr(e.true_value) and self.expr(
                e.false_value)
        if (isinstance(e, BinaryOp) and e.op in SMALL_INT_BINARY
                and e.a.dtype == e.b.dtype == e.dtype):
            return self.expr(e.a) and self.expr(e.b)
        what = e.op if isinstance(e, (BinaryOp, UnaryOp)) else type(e).__name__
        return self.fail(f"{e.dtype} '{what}' has no vector form (byte and word lanes: "
                         "loads, min, max, selects)")

    def int_expr(self, e: PrimExpr) -> bool:
        """int32 lanes: `dot4_u8s8`, integer arithmetic, shifts by a constant."""
        if isinstance(e, BinaryOp) and e.op in SHIFTS:
            amount = e.b
            return ((isinstance(amount, Const) and 0 <= int(amount.value) < 32)
                    or self.fail("a shift by a non-constant amount has no vector form")
                    ) and self.expr(e.a)
        if isinstance(e, BinaryOp):
            return ((e.op in INT_VECTOR_BINARY or self.fail(f"int32 '{e.op}' has no vector "
                                                            "form"))
                    and self.expr(e.a) and self.expr(e.b))
        if isinstance(e, UnaryOp):
            return (e.op == "neg" or self.fail(f"int32 '{e.op}' has no vector form")
                    ) and self.expr(e.a)
        if isinstance(e, Intrin) and e.name == BF16_PAIR:
            return all(a.dtype == "float32" and self.expr(a) for a in e.args)
        if not (isinstance(e, Intrin) and e.name in DOT4_INTRINSICS):
            return self.fail("an int32 expression other than a load, arithmetic or dot4_u8s8")
        return all(a.dtype == INT_VECTOR_DTYPE and self.expr(a) for a in e.args)

    def independent(self, lanes: int, private: set[Buffer]) -> bool:
        """Different iterations never touch one element of a written buffer, and nothing
        else the loop reads may share a written buffer's memory."""
        for w in self.written:
            mine = [a for a in self.accesses if a[0] is w]
            if not all(contiguous for _, _, contiguous in mine):
                return False
            for k, (_, first, _) in enumerate(mine):
                for _, second, _ in mine[k + 1:]:
                    d = constant_offset(w, first, second)
                    if d is None or 0 < abs(d) < lanes:
                        return False
            others = {a[0] for a in self.accesses if a[0] is not w}
            if others and w not in private and not others <= private:
                return False
        return True


def element_bytes(loop: For) -> int:
    """The widest element (in bytes) `loop`'s body loads, stores or casts to (4 with no
    access): a register of `bits` holds `bits // (8 * element_bytes)` of the loop's lanes,
    32 for a byte loop on AVX2, 8 for float32 (also when the bytes are widened to it)."""
    return max((dtype_bytes(n.buffer.dtype if isinstance(n, (Load, Store)) else n.dtype)
                for n in iter_nodes(loop.body) if isinstance(n, (Load, Store, Cast))),
               default=4)


def vector_shape_fault(loop: For) -> str | None:
    """Why `loop`'s shape is not straight-line vector code, or None when it is.
    (Independence is not checked: a `T.vector` loop promises it.)"""
    if not isinstance(loop.extent, Const):
        return "its extent is not a constant"
    lanes = int(loop.extent.value)
    if not 2 <= lanes <= MAX_LANES:
        return f"its extent {lanes} is not from 2 to {MAX_LANES}"
    body = _walked(loop)
    assert body is not None
    return body.fault or None


# A loop is immutable, so its walk holds while it lives: verify (after several passes),
# vectorize-loops and the backends ask about the same loops.
_WALKS: IdentityCache[For, VectorBody] = IdentityCache()


def walks_as(loop: For, source: For) -> For:
    """`loop`, a loop over `source`'s variable and body (another extent or kind: a
    piece vectorize-loops cuts), given `source`'s walk if it has one: a walk reads the
    variable and the body only, and the verifier and the backends would otherwise walk
    the same body again for the new loop."""
    if loop.var is source.var and loop.body is source.body:
        found = _WALKS.get(source)
        if found is not None:
            _WALKS.put(loop, found)
    return loop


def _walked(loop: For) -> VectorBody | None:
    """`loop`'s body walked (once per loop), or None when its extent is no vector length."""
    if not isinstance(loop.extent, Const) or not 2 <= int(loop.extent.value) <= MAX_LANES:
        return None
    return _WALKS.get_or_compute(loop, _walk)


def _walk(loop: For) -> VectorBody:
    body = VectorBody(loop.var)
    if not body.stmt(loop.body):
        body.fault = body.fault or "the body is not straight-line vector code"
    body.forget_lanes()
    return body


def vector_loop_lanes(loop: For, private: set[Buffer], readonly: set[Buffer]) -> int:
    """The lane count `loop` can run with as straight-line vector code, or 0.

    `private`: buffers no other buffer of the function can reach (`private_buffers`);
    `readonly`: constant buffers (`readonly_buffers`), which the loop must not write.
    """
    body = _walked(loop)
    if body is None or body.fault or not isinstance(loop.extent, Const):
        return 0
    lanes = int(loop.extent.value)
    if body.written & readonly:
        return 0  # the scalar path reports the store into a constant
    return lanes if body.independent(lanes, private) else 0


def long_loop_vectorizable(loop: For, private: set[Buffer], readonly: set[Buffer]) -> bool:
    """Whether `loop`, of a constant extent above MAX_LANES, is straight-line vector code
    with independent iterations over its whole extent: it can run as a loop over vector
    pieces of at most MAX_LANES lanes (kiln.transform.vectorize_loops, `strip_mined`)."""
    if not isinstance(loop.extent, Const) or int(loop.extent.value) <= MAX_LANES:
        return False
    body = _walk(For(loop.var, loop.start, Const(MAX_LANES, loop.var.dtype), loop.kind,
                     loop.body))
    if body.fault or body.written & readonly:
        return False
    return body.independent(int(loop.extent.value), private)


def private_buffers(fn: PrimFunc, noalias: set[int] | frozenset[int]) -> set[Buffer]:
    """Buffers whose memory no other buffer of `fn` can reach: its own allocations,
    constants and the parameters at the indices `noalias` (kiln.ir.aliasing), unless a
    view is made of them (views are never private)."""
    private = {p for k, p in enumerate(fn.params) if isinstance(p, Buffer) and k in noalias}
    viewed: set[Buffer] = set()
    for s in iter_stmts(fn.body):
        if isinstance(s, (Allocate, AllocConst)):
            private.add(s.buffer)
        elif isinstance(s, DeclBuffer):
            viewed.add(s.source)
    return private - viewed


def readonly_buffers(fn: PrimFunc) -> set[Buffer]:
    """`fn`'s constant buffers (AllocConst) and the views of them."""
    out: set[Buffer] = set()
    for s in iter_stmts(fn.body):  # pre-order: a view's source is declared first
        if isinstance(s, AllocConst) or (isinstance(s, DeclBuffer) and s.source in out):
            out.add(s.buffer)
    return out

"""Parallelize: which loops become `parallel`, checked against the interpreter.

Besides unit tests of the analysis, two executable checks run on every loop
the pass marks (random kernels built here, every function of the IR corpus,
lowered operator graphs), both IR rewrites run by `kiln.ir.evaluate`:

- `reverse_parallel_loops(fn)`: every parallel loop runs its iterations in
  reverse order. Independent iterations give bit-identical results in any order.
- `instrument_races(fn)`: a dynamic race detector. Around every parallel loop,
  each buffer the loop shares (one not allocated inside it) gets two shadow
  arrays: the iteration that wrote each element and the one that read it (-1:
  none, -2: several). After the loop, an element written by two iterations, or
  written by one and read by another, counts as a conflict; the conflicts are
  added into an extra trailing int64[1] parameter. A loop calling another kernel
  or handing memory to external code counts as a conflict (nothing to follow).

The backends' multi-threaded execution of such loops is tested in
tests/codegen/test_parallel.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corpus import CORPUS
from kiln import evaluate, ops
from kiln.errors import CallError
from kiln.ir import IRBuilder, IRModule
from kiln.ir import graph as g
from kiln.ir.tensor import (
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
    LetStmt,
    Load,
    PrimExpr,
    PrimFunc,
    Select,
    SeqStmt,
    Stmt,
    Store,
    Var,
    seq,
)
from kiln.ir.visitor import expr_children, iter_stmts
from kiln.transform.parallelize import Parallelize
from kiln.transform.pipeline import get_pipeline
from kiln.transform.registry import parse_passes

I64 = "int64"

# ====================================================================== checkers



def _c(v: int) -> Const:
    return Const(v, I64)


def map_parallel_loops(s: Stmt, fn: object) -> Stmt:
    """`s` with every outermost parallel loop replaced by `fn(loop)`."""
    if isinstance(s, For):
        if s.kind == "parallel":
            return fn(s)  # type: ignore[operator,no-any-return]
        return For(s.var, s.start, s.extent, s.kind, map_parallel_loops(s.body, fn))
    if isinstance(s, SeqStmt):
        return seq(*(map_parallel_loops(x, fn) for x in s.body))
    if isinstance(s, IfThenElse):
        other = map_parallel_loops(s.else_body, fn) if s.else_body is not None else None
        return IfThenElse(s.cond, map_parallel_loops(s.then_body, fn), other)
    return s


def count_parallel_loops(s: Stmt) -> int:
    found = [0]

    def count(loop: For) -> Stmt:
        found[0] += 1
        return loop

    map_parallel_loops(s, count)
    return found[0]


# ------------------------------------------------------------------ reverse order


def reverse_parallel_loops(fn: PrimFunc) -> PrimFunc:
    """`fn` with each parallel loop iterating from its last iteration to its first."""

    def reverse(loop: For) -> Stmt:
        k = Var(f"{loop.var.name}_rev", loop.var.dtype)
        last = BinaryOp("sub", BinaryOp("add", loop.start, loop.extent), Const(1, loop.var.dtype))
        return For(k, Const(0, loop.var.dtype), loop.extent, "serial",
                   seq(LetStmt(loop.var, BinaryOp("sub", last, k)), loop.body))

    return fn.with_body(map_parallel_loops(fn.body, reverse))


# ------------------------------------------------------------------ race detector


def instrument_races(fn: PrimFunc) -> PrimFunc:
    """`fn` with a race detector around each parallel loop and a trailing
    `conflicts: int64[1]` parameter that it increments (see the module docstring)."""
    conflicts = Buffer("conflicts", (1,), I64)
    body = map_parallel_loops(fn.body, lambda loop: _Detector(loop, conflicts).run())
    return PrimFunc((*fn.params, conflicts), body, dict(fn.attrs))


class _Detector:
    def __init__(self, loop: For, conflicts: Buffer) -> None:
        self.loop = loop
        self.conflicts = conflicts
        self.iteration: PrimExpr = (loop.var if loop.var.dtype == I64
                                    else Cast(I64, loop.var))
        self.private: set[Buffer] = set()
        # shared buffer -> (writer shadow, reader shadow)
        self.shadows: dict[Buffer, tuple[Buffer, Buffer]] = {}

    def run(self) -> Stmt:
        body = self.stmt(self.loop.body)
        loop = For(self.loop.var, self.loop.start, self.loop.extent, "serial", body)
        stmts: list[Stmt] = []
        for buf, (w, r) in self.shadows.items():
            stmts.append(_over(buf, lambda idx, w=w, r=r: seq(
                Store(w, _c(-1), idx), Store(r, _c(-1), idx))))
        stmts.append(loop)
        for buf, (w, r) in self.shadows.items():
            stmts.append(_over(buf, lambda idx, w=w, r=r: self.check(w, r, idx)))
        decls = [Allocate(b) for pair in self.shadows.values() for b in pair]
        return seq(*decls, *stmts)

    def check(self, w: Buffer, r: Buffer, idx: tuple[PrimExpr, ...]) -> Stmt:
        written = Compare("ne", Load(w, idx), _c(-1))
        several = Compare("eq", Load(w, idx), _c(-2))
        read_by_other = BinaryOp("and", Compare("ne", Load(r, idx), _c(-1)),
                                 Compare("ne", Load(r, idx), Load(w, idx)))
        bad = BinaryOp("and", written, BinaryOp("or", several, read_by_other))
        total = BinaryOp("add", Load(self.conflicts, (_c(0),)), Cast(I64, bad))
        return Store(self.conflicts, total, (_c(0),))

    def shadow(self, buf: Buffer) -> tuple[Buffer, Buffer]:
        if buf not in self.shadows:
            self.shadows[buf] = (Buffer(f"{buf.name}_writer", buf.shape, I64),
                                 Buffer(f"{buf.name}_reader", buf.shape, I64))
        return self.shadows[buf]

    def record(self, shadow: Buffer, idx: tuple[PrimExpr, ...]) -> Stmt:
        """shadow[idx] = this iteration if unset or already this one, else -2."""
        old = Load(shadow, idx)
        mine = BinaryOp("or", Compare("eq", old, _c(-1)), Compare("eq", old, self.iteration))
        return Store(shadow, Select(mine, self.iteration, _c(-2)), idx)

    def reads(self, *exprs: PrimExpr) -> list[Stmt]:
        out: list[Stmt] = []
        for e in exprs:
            for load in _loads(e):
                if load.buffer not in self.private:
                    out.append(self.record(self.shadow(load.buffer)[1], load.indices))
            if any(isinstance(x, CallExtern) and any(isinstance(a, Buffer) for a in x.args)
                   for x in _walk(e)):
                out.append(self.unverifiable())  # external code touching memory
        return out

    def unverifiable(self) -> Stmt:
        """Count a conflict: the loop does something the detector cannot follow."""
        return Store(self.conflicts, BinaryOp("add", Load(self.conflicts, (_c(0),)), _c(1)),
                     (_c(0),))

    def stmt(self, s: Stmt) -> Stmt:
        if isinstance(s, Store):
            pre = self.reads(s.value, *s.indices)
            if s.buffer not in self.private:
                pre.append(self.record(self.shadow(s.buffer)[0], s.indices))
            return seq(*pre, s)
        if isinstance(s, SeqStmt):
            return seq(*(self.stmt(x) for x in s.body))
        if isinstance(s, For):
            return seq(*self.reads(s.start, s.extent),
                       For(s.var, s.start, s.extent, s.kind, self.stmt(s.body)))
        if isinstance(s, LetStmt):
            return seq(*self.reads(s.value), s)
        if isinstance(s, IfThenElse):
            other = self.stmt(s.else_body) if s.else_body is not None else None
            return seq(*self.reads(s.cond), IfThenElse(s.cond, self.stmt(s.then_body), other))
        if isinstance(s, (Allocate, AllocConst)):
            self.private.add(s.buffer)
            return s
        if isinstance(s, DeclBuffer):
            if s.source in self.private:
                self.private.add(s.buffer)
            return s
        if isinstance(s, Evaluate):
            return seq(*self.reads(s.value), s)
        if isinstance(s, CallFunc):
            return seq(self.unverifiable(), s)
        raise AssertionError(f"race check: unexpected statement {type(s).__name__}")


def _over(buf: Buffer, body: object) -> Stmt:
    """A loop nest over every element of `buf`, `body(indices)` inside."""
    idx = tuple(Var(f"e{d}", I64) for d in range(buf.ndim))
    out: Stmt = body(idx)  # type: ignore[operator]
    for var, extent in reversed(list(zip(idx, buf.shape))):
        ext = extent if isinstance(extent, PrimExpr) else _c(int(extent))
        out = For(var, _c(0), ext, "serial", out)
    return out


def _children(e: PrimExpr) -> tuple[PrimExpr, ...]:
    """Operand expressions of `e` (buffer arguments of extern calls left out)."""
    return tuple(c for c in expr_children(e) if isinstance(c, PrimExpr))


def _walk(e: PrimExpr) -> Iterator[PrimExpr]:
    stack = [e]
    while stack:
        x = stack.pop()
        yield x
        stack.extend(_children(x))


def _loads(e: PrimExpr) -> Iterator[Load]:
    return (x for x in _walk(e) if isinstance(x, Load))


# ====================================================================== helpers


def parallel_loops(fn: PrimFunc) -> list[str]:
    """Names of the loop variables of `fn`'s parallel loops, outermost first."""
    names: list[str] = []

    def walk(s: Stmt) -> None:
        if isinstance(s, For):
            if s.kind == "parallel":
                names.append(s.var.name)
            walk(s.body)
        elif isinstance(s, SeqStmt):
            for x in s.body:
                walk(x)
        elif isinstance(s, IfThenElse):
            walk(s.then_body)
            if s.else_body is not None:
                walk(s.else_body)

    walk(fn.body)
    return names


def schedule(mod: IRModule, **options: Any) -> IRModule:
    return Parallelize(**options).run(mod)


def one(body: Callable[[IRBuilder], None], name: str = "f", **attrs: Any) -> IRModule:
    ib = IRBuilder()
    with ib.prim_func(name, attrs):
        body(ib)
    return ib.get()


def fresh_args(args: list[Any]) -> list[Any]:
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    return bool(a == b)


def check_parallel_loops(mod: IRModule, name: str, args: list[Any]) -> None:
    """The function's parallel loops are independent on these inputs: reversed order
    gives the serial result bit for bit, and the race detector finds no conflict."""
    fn = mod[name]
    assert isinstance(fn, PrimFunc)
    serial = fresh_args(args)
    try:
        evaluate(mod, name, *serial)
    except CallError:
        return  # these random inputs are invalid for this function (e.g. an index)
    reversed_args = fresh_args(args)
    evaluate(mod.with_function(name, reverse_parallel_loops(fn)), name, *reversed_args)
    for want, got in zip(serial, reversed_args):
        assert same(want, got), f"{name}: reversed parallel loops change the result"
    conflicts = np.zeros(1, np.int64)
    evaluate(mod.with_function(name, instrument_races(fn)), name, *fresh_args(args), conflicts)
    assert conflicts[0] == 0, f"{name}: {conflicts[0]} elements shared between iterations"


# ====================================================================== the checkers work


def test_race_detector_and_reversal_catch_dependent_iterations() -> None:
    def racy(ib: IRBuilder) -> None:
        x = ib.arg("X", (16,), "int32")
        y = ib.arg("Y", (16,), "int32")
        with ib.for_range(16, name="i", kind="parallel") as i:
            ib.store(y, [0], y[0] + x[i])  # commutative: reversal cannot see it

    def carried(ib: IRBuilder) -> None:
        y = ib.arg("Y", (16,), "int32")
        with ib.for_range(1, 16, name="i", kind="parallel") as i:
            ib.store(y, [i], y[i - 1] + 1)

    x = np.arange(16, dtype=np.int32)
    for build in (racy, carried):
        mod = one(build)
        conflicts = np.zeros(1, np.int64)
        evaluate(mod.with_function("f", instrument_races(mod["f"])), "f",
                 *fresh_args([x, x] if build is racy else [x]), conflicts)
        assert conflicts[0] > 0
    mod = one(carried)
    with pytest.raises(AssertionError, match="reversed"):
        check_parallel_loops(mod, "f", [np.zeros(16, np.int32)])


# ====================================================================== which loops


def elementwise(n: int = 64) -> Callable[[IRBuilder], None]:
    def build(ib: IRBuilder) -> None:
        x = ib.arg("X", (n, n), "float32")
        y = ib.arg("Y", (n, n), "float32")
        with ib.for_range(n, name="i") as i, ib.for_range(n, name="j") as j:
            ib.store(y, [i, j], x[i, j] * 2.0 + 1.0)
    return build


def test_elementwise_nest_gets_a_parallel_outer_loop() -> None:
    mod = schedule(one(elementwise(128)), min_work=100_000)
    assert parallel_loops(mod["f"]) == ["i"]  # type: ignore[arg-type]
    check_parallel_loops(mod, "f", [np.ones((128, 128), np.float32),
                                    np.zeros((128, 128), np.float32)])


def test_small_work_stays_serial_and_the_module_is_returned_unchanged() -> None:
    mod = one(elementwise(64))
    assert Parallelize().run(mod) is mod
    assert parallel_loops(schedule(mod, min_work=0)["f"]) == ["i"]  # type: ignore[arg-type]


def test_pass_is_registered_and_in_the_default_tensor_pipeline() -> None:
    (p,) = parse_passes("parallelize{min_work=10 min_extent=2}")
    assert p == Parallelize(min_work=10, min_extent=2)
    names = [q.name for q in get_pipeline("default", "tensor").passes]  # type: ignore[attr-defined]
    assert names == ["simplify", "partition-loops", "flatten-loops", "interchange-reductions",
                     "parallelize", "expand-math", "vectorize-loops"]


def loop_kernel(store: Callable[[Var, Buffer, Buffer], None], *, n: int = 256,
                dtype: str = "float32", start: int = 0) -> IRModule:
    def build(ib: IRBuilder) -> None:
        x = ib.arg("X", (n,), dtype)
        y = ib.arg("Y", (n,), dtype)
        with ib.for_range(start, n, name="i") as i:
            store(i, x, y)  # type: ignore[arg-type]
    return one(build)


CASES: dict[str, tuple[Callable[..., None], bool]] = {
    # name: (store(ib)(i, X, Y), parallel?)
    "map": (lambda ib: lambda i, x, y: ib.store(y, [i], x[i] * 3.0), True),
    "gather from input": (lambda ib: lambda i, x, y: ib.store(y, [i], x[255 - i] + x[0]), True),
    "affine index": (lambda ib: lambda i, x, y: ib.store(y, [(i * 3 + 1) % 256], x[i]), False),
    "shifted write": (lambda ib: lambda i, x, y: ib.store(y, [255 - i], x[i]), True),
    "one element": (lambda ib: lambda i, x, y: ib.store(y, [0], y[0] + x[i]), False),
    "carried": (lambda ib: lambda i, x, y: ib.store(y, [i], y[(i + 255) % 256] + x[i]), False),
    "read neighbour": (lambda ib: lambda i, x, y: ib.store(y, [i], x[i] + y[255 - i]), False),
    "write input too": (lambda ib: lambda i, x, y: (ib.store(y, [i], x[i]),
                                                     ib.store(x, [i], x[i] * 0.5)), True),
    "halved index": (lambda ib: lambda i, x, y: ib.store(y, [i // 2], x[i]), False),
    "data-dependent": (lambda ib: lambda i, x, y: ib.store(
        y, [Cast(I64, x[i]) % 256], x[i]), False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_independence_analysis(case: str) -> None:
    make, expected = CASES[case]

    def build(ib: IRBuilder) -> None:
        x = ib.arg("X", (256,), "float32")
        y = ib.arg("Y", (256,), "float32")
        with ib.for_range(256, name="i") as i:
            make(ib)(i, x, y)

    mod = schedule(one(build), min_work=0)
    assert bool(parallel_loops(mod["f"])) is expected  # type: ignore[arg-type]
    rng = np.random.default_rng(0)
    check_parallel_loops(mod, "f", [rng.integers(0, 9, 256).astype(np.float32),
                                    np.zeros(256, np.float32)])


@pytest.mark.parametrize(("dtype", "factor", "expected"), [
    ("int64", 2, True),    # 64-bit index arithmetic: no wrap-around
    ("int32", 3, True),    # an odd factor is a bijection modulo 2**32
    ("int32", 2, False),   # an even one may map two iterations to one element
    ("int8", 1, True),
])
def test_narrow_loop_variables(dtype: str, factor: int, expected: bool) -> None:
    def build(ib: IRBuilder) -> None:
        y = ib.arg("Y", (128,), "float32")
        x = ib.arg("X", (40,), "float32")
        i = Var("i", dtype)
        with ib.for_range(Const(0, dtype), extent=Const(40, dtype), var=i):
            ib.store(y, [Cast(I64, i * Const(factor, dtype))], x[Cast(I64, i)])

    mod = schedule(one(build), min_work=0)
    assert bool(parallel_loops(mod["f"])) is expected  # type: ignore[arg-type]


@pytest.mark.parametrize(("step", "expected"), [(64, ["jo"]), (32, ["ji"])])
def test_tiled_indices_own_a_window(step: int, expected: list[str]) -> None:
    """`Y[jo * step + ji]` with `0 <= ji < min(64, ...)`: the tiles of `jo` are disjoint
    only when the step covers the inner loop's range (else only `ji` is parallel)."""
    def build(ib: IRBuilder) -> None:
        x = ib.arg("X", (300,), "float32")
        y = ib.arg("Y", (300,), "float32")
        with ib.for_range(4, name="jo") as jo:
            rest = BinaryOp("min", Const(64, I64), Const(300, I64) - jo * 64)
            with ib.for_range(0, extent=rest, name="ji") as ji:
                ib.store(y, [jo * step + ji], x[jo * step + ji] + y[jo * step + ji])

    mod = schedule(one(build), min_work=0)
    assert parallel_loops(mod["f"]) == expected  # type: ignore[arg-type]
    rng = np.random.default_rng(2)
    check_parallel_loops(mod, "f", [rng.standard_normal(300).astype(np.float32),
                                    rng.standard_normal(300).astype(np.float32)])


def test_symbolic_factor_is_not_trusted() -> None:
    def build(ib: IRBuilder) -> None:
        k = ib.scalar_arg("k")
        y = ib.arg("Y", (64,), "float32")
        with ib.for_range(8, name="i") as i:
            ib.store(y, [i * k], 1.0)  # k may be 0

    assert not parallel_loops(schedule(one(build), min_work=0)["f"])  # type: ignore[arg-type]


def test_private_allocations_and_shared_scratch() -> None:
    def accumulate(inside: bool) -> Callable[[IRBuilder], None]:
        def build(ib: IRBuilder) -> None:
            x = ib.arg("X", (32, 32), "float32")
            y = ib.arg("Y", (32,), "float32")

            def row(acc: Buffer, i: Var) -> None:
                ib.store(acc, [0], 0.0)
                with ib.for_range(32, name="k") as k:
                    ib.store(acc, [0], acc[0] + x[i, k])
                ib.store(y, [i], acc[0])

            if inside:
                with ib.for_range(32, name="i") as i, \
                        ib.allocate("acc", (1,), "float32", "local") as acc:
                    row(acc, i)
            else:
                with ib.allocate("acc", (1,), "float32", "local") as acc, \
                        ib.for_range(32, name="i") as i:
                    row(acc, i)
        return build

    x = np.random.default_rng(1).standard_normal((32, 32)).astype(np.float32)
    private = schedule(one(accumulate(True)), min_work=0)
    assert parallel_loops(private["f"]) == ["i"]  # type: ignore[arg-type]
    check_parallel_loops(private, "f", [x, np.zeros(32, np.float32)])
    assert not parallel_loops(schedule(one(accumulate(False)), min_work=0)["f"])  # type: ignore[arg-type]


def test_calls_and_external_functions() -> None:
    def with_stmt(make: Callable[[IRBuilder, Var, Buffer, Buffer], None]) -> IRModule:
        ib = IRBuilder()
        with ib.prim_func("g"):
            z = ib.arg("Z", (64,), "float32")
            ib.store(z, [0], 1.0)
        with ib.prim_func("f"):
            x = ib.arg("X", (64,), "float32")
            y = ib.arg("Y", (64,), "float32")
            with ib.for_range(64, name="i") as i:
                make(ib, i, x, y)
        return schedule(ib.get(), min_work=0)

    pure = with_stmt(lambda ib, i, x, y: ib.store(
        y, [i], CallExtern("expf", (x[i],), "float32")))
    assert parallel_loops(pure["f"]) == ["i"]  # type: ignore[arg-type]
    memset = with_stmt(lambda ib, i, x, y: ib.evaluate(
        CallExtern("memset", (y, Const(0, "int32"), Const(4, I64)), "int32")))
    assert not parallel_loops(memset["f"])  # type: ignore[arg-type]
    call = with_stmt(lambda ib, i, x, y: (ib.store(y, [i], x[i]), ib.call_func("g", [y])))
    assert not parallel_loops(call["f"])  # type: ignore[arg-type]


def test_kernels_called_in_place_keep_their_loops_serial() -> None:
    """`shift(X, Y): Y[i] = X[i + 1]` is parallel, unless some call passes one buffer
    as both X and Y: then a later iteration would overwrite what an earlier reads."""
    def module(in_place: bool) -> IRModule:
        ib = IRBuilder()
        with ib.prim_func("shift"):
            x = ib.arg("X", (65,), "float32")
            y = ib.arg("Y", (65,), "float32")
            with ib.for_range(64, name="i") as i:
                ib.store(y, [i], x[i + 1])
        with ib.prim_func("caller"):
            a = ib.arg("A", (65,), "float32")
            b = ib.arg("B", (65,), "float32")
            ib.call_func("shift", [a, a] if in_place else [a, b])
        return schedule(ib.get(), min_work=0)

    assert parallel_loops(module(False)["shift"]) == ["i"]  # type: ignore[arg-type]
    assert not parallel_loops(module(True)["shift"])  # type: ignore[arg-type]


def test_views_of_one_workspace() -> None:
    def module(second_offset: int) -> IRModule:
        def build(ib: IRBuilder) -> None:
            y = ib.arg("Y", (16,), "float32")
            with ib.allocate("ws", (256,), "uint8", "global") as ws, \
                    ib.decl_buffer("a", (16,), "float32", ws, 0) as a, \
                    ib.decl_buffer("b", (16,), "float32", ws, second_offset) as b:
                with ib.for_range(16, name="j") as j:
                    ib.store(a, [j], Cast("float32", j))
                with ib.for_range(16, name="i") as i:
                    ib.store(b, [i], a[15 - i] * 2.0)
                with ib.for_range(16, name="k") as k:
                    ib.store(y, [k], b[k])
        return schedule(one(build), min_work=0)

    disjoint = module(64)
    assert parallel_loops(disjoint["f"]) == ["j", "i", "k"]  # type: ignore[arg-type]
    check_parallel_loops(disjoint, "f", [np.zeros(16, np.float32)])
    overlapping = module(32)  # b's first half is a's second half
    assert parallel_loops(overlapping["f"]) == ["j", "k"]  # type: ignore[arg-type]


def test_lowered_graph_functions_are_left_alone() -> None:
    mod = one(elementwise(), name="main", **{"kiln.graph": True})
    assert schedule(mod, min_work=0) is mod


def test_short_outer_loops_hand_over_to_a_longer_inner_loop() -> None:
    def nest(*extents: int) -> IRModule:
        def build(ib: IRBuilder) -> None:
            y = ib.arg("Y", extents, "float32")
            with ib.for_range(extents[0], name="a") as a, \
                    ib.for_range(extents[1], name="b") as b, \
                    ib.for_range(extents[2], name="c") as c:
                ib.store(y, [a, b, c], Cast("float32", a + b + c))
        return schedule(one(build), min_work=0)

    assert parallel_loops(nest(16, 4, 4)["f"]) == ["a"]  # type: ignore[arg-type]
    assert parallel_loops(nest(2, 64, 4)["f"]) == ["b"]  # type: ignore[arg-type]
    # Nothing long enough: the longest loop that is not the innermost one.
    assert parallel_loops(nest(2, 3, 5)["f"]) == ["b"]  # type: ignore[arg-type]


def test_inner_loops_of_a_sequential_outer_loop() -> None:
    """A time-step loop carries a dependence; the loop inside it does not."""
    def build(ib: IRBuilder) -> None:
        y = ib.arg("Y", (8, 64), "float32")
        with ib.for_range(1, 8, name="t") as t, ib.for_range(64, name="i") as i:
            ib.store(y, [t, i], y[t - 1, i] * 0.5 + 1.0)

    mod = schedule(one(build), min_work=0)
    assert parallel_loops(mod["f"]) == ["i"]  # type: ignore[arg-type]
    check_parallel_loops(mod, "f", [np.ones((8, 64), np.float32)])


def test_existing_parallel_loops_are_kept_and_not_nested() -> None:
    def build(ib: IRBuilder) -> None:
        y = ib.arg("Y", (64, 64), "float32")
        with ib.for_range(64, name="i") as i, ib.for_range(64, name="j", kind="parallel") as j:
            ib.store(y, [i, j], 1.0)

    mod = one(build)
    assert schedule(mod, min_work=0) is mod


def _symbolic_nest(outer_kind: str) -> IRModule:
    """Y[b, 64, n, 16] = a + c + d + e over symbolic b and n (the kernel's dim scalars),
    the outer loop `outer_kind` (a kernel builder may mark it parallel itself)."""
    b, n = Var("b", "int64"), Var("n", "int64")

    def build(ib: IRBuilder) -> None:
        y = ib.arg("Y", (b, 64, n, 16), "float32")
        ib.scalar_arg("b", var=b)
        ib.scalar_arg("n", var=n)
        with ib.for_range(b, name="a", kind=outer_kind) as a, \
                ib.for_range(64, name="c") as c, ib.for_range(n, name="d") as d, \
                ib.for_range(16, name="e") as e:
            ib.store(y, [a, c, d, e], Cast("float32", a + c + d + e))
    return one(build)


def test_a_symbolic_batch_loop_is_split_with_the_loop_inside_it() -> None:
    """A batch of one must still split: the symbolic batch loop and the 64 channels
    become one parallel loop over b * 64 (indices recovered by division)."""
    mod = schedule(_symbolic_nest("serial"), min_work=0)
    fn = mod["f"]
    assert isinstance(fn, PrimFunc)
    assert parallel_loops(fn) == ["a_flat"]
    (loop,) = [s for s in iter_stmts(fn.body) if isinstance(s, For) and s.kind == "parallel"]
    assert isinstance(loop.extent, BinaryOp) and loop.extent.op == "mul"
    for b, n in ((1, 3), (3, 2)):
        check_parallel_loops(mod, "f", [np.zeros((b, 64, n, 16), np.float32), b, n])
        out = np.zeros((b, 64, n, 16), np.float32)
        evaluate(mod, "f", out, b, n)
        np.testing.assert_array_equal(out, np.indices((b, 64, n, 16)).sum(0))


def test_a_symbolic_loop_goes_parallel_only_with_the_work_for_it() -> None:
    """With a work threshold, the merged loop is taken at run time only when b * 64
    iterations pay for a launch; else a copy of the serial nest runs (its own variables:
    the module prints and parses back)."""
    from kiln.ir import assert_structural_equal
    from kiln.script import from_source, print_module

    mod = schedule(_symbolic_nest("serial"), min_work=100_000_000)
    fn = mod["f"]
    assert isinstance(fn, PrimFunc) and isinstance(fn.body, IfThenElse)
    assert parallel_loops(fn) == ["a_flat"]
    assert fn.body.else_body is not None and not any(
        isinstance(s, For) and s.kind == "parallel" for s in iter_stmts(fn.body.else_body))
    for b, n in ((1, 3), (12, 2)):  # 64 iterations: serial; 768: parallel
        check_parallel_loops(mod, "f", [np.zeros((b, 64, n, 16), np.float32), b, n])
        out = np.zeros((b, 64, n, 16), np.float32)
        evaluate(mod, "f", out, b, n)
        np.testing.assert_array_equal(out, np.indices((b, 64, n, 16)).sum(0))
    text = print_module(mod)
    assert_structural_equal(from_source(text), mod)


def test_nothing_inside_a_loop_the_kernel_marked_parallel_is_split() -> None:
    mod = _symbolic_nest("parallel")
    assert schedule(mod, min_work=0) is mod


# ====================================================================== property tests


def _corpus_functions() -> list[tuple[str, str]]:
    return [(case, fname) for case in sorted(CORPUS)
            for fname, fn in CORPUS[case].module().prim_funcs().items()
            if not fn.attrs.get("kiln.graph")]


def test_every_corpus_function_parallelizes_safely() -> None:
    """Every loop the pass marks in the IR corpus (with no work threshold) is
    independent on the case's inputs."""
    marked = 0
    rng = np.random.default_rng(0)
    for case_name, fname in _corpus_functions():
        case = CORPUS[case_name]
        mod = schedule(case.module(), min_work=0, min_extent=2)
        fn = mod[fname]
        assert isinstance(fn, PrimFunc)
        if parallel_loops(fn):
            marked += 1
            try:
                args = case.args(fname, rng)
            except ValueError:  # symbolic shapes without explicit inputs
                continue
            check_parallel_loops(mod, fname, args)
    assert marked >= 20  # the analysis is not vacuous on the corpus


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pick=st.sampled_from(_corpus_functions()), seed=st.integers(0, 2**32 - 1),
       min_extent=st.sampled_from([1, 2, 8]))
def test_corpus_kernels_on_random_inputs(pick: tuple[str, str], seed: int,
                                         min_extent: int) -> None:
    case_name, fname = pick
    case = CORPUS[case_name]
    mod = schedule(case.module(), min_work=0, min_extent=min_extent)
    if not parallel_loops(mod[fname]):  # type: ignore[arg-type]
        return
    try:
        args = case.args(fname, np.random.default_rng(seed))
    except ValueError:
        return
    check_parallel_loops(mod, fname, args)


# Random kernels over square buffers: each index is one of these forms.
N = 6
INDEX_FORMS: dict[str, Callable[[PrimExpr, PrimExpr], PrimExpr]] = {
    "i": lambda i, j: i,
    "j": lambda i, j: j,
    "0": lambda i, j: Const(0, I64),
    "N-1-i": lambda i, j: (N - 1) - i,
    "(i+1)%N": lambda i, j: (i + 1) % N,
    "i//2": lambda i, j: i // 2,
    "(2i)%N": lambda i, j: (i * 2) % N,
    "N-1-j": lambda i, j: (N - 1) - j,
    "(i+j)%N": lambda i, j: (i + j) % N,
}


@st.composite
def random_kernels(draw: st.DrawFn) -> IRModule:
    """A loop over i (and maybe j inside) with a few stores between A, B, C, and
    maybe an accumulator allocated inside or outside the i loop."""
    two_loops = draw(st.booleans())
    forms = list(INDEX_FORMS) if two_loops else [f for f in INDEX_FORMS if "j" not in f]
    acc_place = draw(st.sampled_from(["none", "inside", "outside"]))
    stores = draw(st.lists(st.tuples(
        st.sampled_from(["A", "B", "C"]),
        st.lists(st.sampled_from(forms), min_size=2, max_size=2),
        st.lists(st.tuples(st.sampled_from(["A", "B", "C", "acc"]),
                           st.lists(st.sampled_from(forms), min_size=2, max_size=2)),
                 min_size=1, max_size=2)), min_size=1, max_size=3))

    ib = IRBuilder()
    with ib.prim_func("k"):
        bufs = {"A": ib.arg("A", (N, N), "float32"), "B": ib.arg("B", (N, N), "float32"),
                "C": ib.arg("C", (N,), "float32")}

        def body(i: Var, j: PrimExpr, acc: Buffer | None) -> None:
            def index(name: str, picks: list[str]) -> list[PrimExpr]:
                idx = [INDEX_FORMS[p](i, j) for p in picks]
                return idx[:1] if name == "C" else ([Const(0, I64)] if name == "acc" else idx)

            if acc is not None:
                ib.store(acc, [0], bufs["A"][i, 0] + 1.0)
            for target, picks, loads in stores:
                value: PrimExpr = Const(0.5, "float32")
                for src, src_picks in loads:
                    if src == "acc" and acc is None:
                        continue
                    buf = acc if src == "acc" else bufs[src]
                    assert buf is not None
                    value = value + buf[tuple(index(src, src_picks))]
                ib.store(bufs[target], index(target, picks), value)

        def loops(acc: Buffer | None) -> None:
            with ib.for_range(N, name="i") as i:
                if acc_place == "inside":
                    with ib.allocate("acc", (1,), "float32", "local") as inner:
                        nest(i, inner)
                else:
                    nest(i, acc)

        def nest(i: Var, acc: Buffer | None) -> None:
            if two_loops:
                with ib.for_range(N, name="j") as j:
                    body(i, j, acc)
            else:
                body(i, Const(0, I64), acc)

        if acc_place == "outside":
            with ib.allocate("acc", (1,), "float32", "local") as acc:
                loops(acc)
        else:
            loops(None)
    return ib.get()


def _random_inputs(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-4, 5, (N, N)).astype(np.float32),
            rng.integers(-4, 5, (N, N)).astype(np.float32),
            rng.integers(-4, 5, N).astype(np.float32)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mod=random_kernels(), seed=st.integers(0, 2**16))
def test_random_kernels_parallelize_only_independent_loops(mod: IRModule, seed: int) -> None:
    scheduled = schedule(mod, min_work=0, min_extent=1)
    check_parallel_loops(scheduled, "k", _random_inputs(seed))


def test_random_kernels_are_often_parallel() -> None:
    """The property test above is not vacuous: a fair share of random kernels gets a
    parallel loop (and every one of those passes the checks)."""
    marked = 0
    examples = 0

    @settings(max_examples=120, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(mod=random_kernels())
    def count(mod: IRModule) -> None:
        nonlocal marked, examples
        examples += 1
        scheduled = schedule(mod, min_work=0, min_extent=1)
        if parallel_loops(scheduled["k"]):  # type: ignore[arg-type]
            marked += 1
            check_parallel_loops(scheduled, "k", _random_inputs(examples))

    count()
    assert marked >= examples // 10, (marked, examples)


def op_graphs() -> dict[str, Callable[[IRBuilder], g.Expr]]:
    rng = np.random.default_rng(0)

    def const(*shape: int) -> g.Constant:
        return g.Constant(rng.standard_normal(shape).astype(np.float32), "w")

    def p(ib: IRBuilder, *shape: int) -> g.Var:
        return ib.param("x", shape, "float32")

    return {
        "conv_relu_pool": lambda ib: ib.emit(ops.call("max_pool2d", ib.emit(ops.call(
            "relu", ib.emit(ops.call("conv2d", p(ib, 1, 3, 10, 10), const(4, 3, 3, 3),
                                     pads=(1, 1, 1, 1)), "c")), "r"),
            kernel_shape=(2, 2), strides=(2, 2)), "y"),
        "matmul_softmax": lambda ib: ib.emit(ops.call("softmax", ib.emit(ops.call(
            "matmul", p(ib, 5, 7), const(7, 9)), "m"), axis=-1), "y"),
        "layer_norm": lambda ib: ib.emit(ops.call(
            "layer_norm", p(ib, 4, 6), const(6), const(6), axis=-1), "y"),
        "cumsum": lambda ib: ib.emit(ops.call("cumsum", p(ib, 3, 7), axis=1), "y"),
        "transpose_concat": lambda ib: ib.emit(ops.call("concat", p(ib, 3, 4), ib.emit(
            ops.call("transpose", const(4, 3), perm=(1, 0)), "t"), axis=0), "y"),
        "reduce_argmax": lambda ib: ib.emit(ops.call("argmax", ib.emit(ops.call(
            "reduce_mean", p(ib, 4, 5, 6), axes=(2,), keepdims=1), "r"), axis=1), "y"),
        "scatter": lambda ib: ib.emit(ops.call(
            "scatter_elements", p(ib, 4, 5),
            g.Constant(np.array([[1, 0, 2, 1, 0]], np.int64), "idx"),
            const(1, 5), axis=0), "y"),
        "pad_avg_pool": lambda ib: ib.emit(ops.call("avg_pool2d", ib.emit(ops.call(
            "pad", p(ib, 1, 2, 5, 5), pads=(0, 0, 1, 1, 0, 0, 1, 1)), "q"),
            kernel_shape=(3, 3), strides=(1, 1)), "y"),
    }


@pytest.mark.parametrize("graph", sorted(op_graphs()))
def test_lowered_operator_graphs_parallelize_safely(graph: str) -> None:
    ib = IRBuilder()
    with ib.function("main"):
        ib.ret(op_graphs()[graph](ib))
    try:
        built = ib.get()
        lowered = get_pipeline("default", "graph")(built)
    except CallError as exc:  # an operator signature this kiln does not offer
        pytest.skip(f"{graph}: {exc}")
    mod = schedule(get_pipeline("simplify", "tensor")(lowered), min_work=0, min_extent=2)
    rng = np.random.default_rng(1)
    kernels = [name for name, fn in mod.prim_funcs().items() if not fn.attrs.get("kiln.graph")]
    assert kernels
    for name in kernels:
        fn = mod[name]
        assert isinstance(fn, PrimFunc)
        args = [rng.standard_normal([int(d) for d in b.shape]).astype(b.dtype)
                if isinstance(b, Buffer) else 0 for b in fn.params]
        check_parallel_loops(mod, name, args)
    # The whole graph still computes what it did.
    x = rng.standard_normal(built["main"].params[0].type.shape).astype(np.float32)  # type: ignore[attr-defined,union-attr]
    want = evaluate(built, "main", x)
    out = np.zeros_like(want)
    evaluate(mod, "main", x, out)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)

"""Shared pieces of the hand-built kernels: register-tile loops, multiply-adds, the
parallel tile loop and the rule below which a kernel runs on one thread (the time
threshold of kiln.kernels.parallel_work).

Every kernel family (kiln.kernels.registry) builds its loop nests from these,
so a change of policy (when to go parallel, how tile lanes are spelled) is made once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import replace
from typing import cast

from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.tensor import (
    Const,
    For,
    IfThenElse,
    Intrin,
    LetStmt,
    PrimExpr,
    Stmt,
    Var,
    as_expr,
    seq,
)
from kiln.kernels.parallel_work import min_parallel_work
from kiln.target.isa import ISA

#: `epilogue(value, output index)`: what a kernel stores for one output value.
Epilogue = Callable[[PrimExpr, tuple[PrimExpr, ...]], PrimExpr]

#: How a kernel's parallel tile loop is split over threads (a tuning knob, kiln.tuning;
#: the call's `split` attribute): "serial" runs it on one thread; "outer" splits the
#: flattened tile index with the last tile dimension fastest (the rule's order: a
#: thread's chunk spans few output channel blocks / B panels); "inner" with the first
#: tile dimension after the batch fastest (a chunk spans few positions / rows). Both
#: parallel ones go parallel whatever the work (no threshold). Every order visits each
#: tile once, so every split computes the same values.
PARALLEL_SPLITS = ("serial", "outer", "inner")
_SPLIT: ContextVar[str | None] = ContextVar("kiln_parallel_split", default=None)


@contextlib.contextmanager
def parallel_split(split: str | None) -> Iterator[None]:
    """Build kernels inside with the parallel `split` (one of PARALLEL_SPLITS; None:
    the rule's: parallel above the work threshold, "outer" order)."""
    token = _SPLIT.set(split)
    try:
        yield
    finally:
        _SPLIT.reset(token)


def tuned_split() -> str | None:
    """The parallel split kernels are being built with (`parallel_split`), None for the
    rule's."""
    return _SPLIT.get()


@contextlib.contextmanager
def parallel_over_images() -> Iterator[None]:
    """Build a kernel over an image of run-time size inside: its tile loops go parallel
    whatever the work (a tuned split stays). `parallel_when` would build each loop twice,
    parallel and serial, chosen at run time; for the convolutions and pools of such
    images that doubled their code and a third of their compile time, for a serial twin
    that only a few-pixel image would take."""
    with parallel_split(_SPLIT.get() or "outer"):
        yield


# A target without vector registers still gets tiles this many float32 values wide
# (independent accumulator chains for the scalar pipes) and a 16-register budget.
SCALAR_TILE_LANES = 4
SCALAR_TILE_REGISTERS = 16


def tile_lanes(isa: ISA, dtype: str = "float32") -> int:
    """Lanes of `dtype` one tile column holds on `isa` (the vector width; 4 for float32
    on targets without vectors)."""
    if isa.vector_bits == 0:
        return SCALAR_TILE_LANES
    return isa.lanes(dtype)


def tile_registers(isa: ISA) -> int:
    """Registers a register tile may fill on `isa`."""
    return isa.vector_registers or SCALAR_TILE_REGISTERS


# Narrow outputs (SqueezeNet's 16 and 32 channel squeeze layers, a 32-channel 3x3
# layer): where a kernel's rule of `rows` output channels per tile leaves more than
# this share of surplus rows (6 rows: 18 for 16 channels, 36 for 32), a shorter tile
# that divides the channels is taken (`narrow_rows`).
NARROW_SURPLUS_SHARE = 0.1
#: The fewest accumulators a shorter tile keeps: 8 chains hide the FMA latency of two
#: pipes (kiln.kernels.gemm.micro_kernel.MIN_ACCUMULATORS).
NARROW_MIN_ACCUMULATORS = 8


def narrow_rows(isa: ISA, channels: int, rows: int, vectors: int, narrows: bool) -> int:
    """Output channels per register tile for `channels` outputs, the rule's `rows` per
    tile of `vectors` vectors: `rows`, or where the caller's rule `narrows` on `isa`
    (its kernel profile, kiln.target.kernel_profile) and `rows` leaves surplus channels past
    `NARROW_SURPLUS_SHARE` of them, the tallest shorter count dividing `channels` that
    keeps `NARROW_MIN_ACCUMULATORS` accumulators (16 or 32 channels at 2 vectors: 4)."""
    if not narrows or channels <= rows or \
            -(-channels // rows) * rows - channels <= NARROW_SURPLUS_SHARE * channels:
        return rows
    return next((r for r in range(rows - 1, 0, -1)
                 if channels % r == 0 and r * vectors >= NARROW_MIN_ACCUMULATORS), rows)


def const(v: int) -> Const:
    """An index constant."""
    return Const(v, INDEX_DTYPE)


def loop(name: str, extent: int | PrimExpr, body: Callable[[Var], Stmt],
         kind: str = "serial", start: int | PrimExpr = 0) -> Stmt:
    """`for name in range(start, start + extent)` around `body(var)` (`start` and
    `extent` may be int64 expressions: symbolic sizes)."""
    v = Var(name, INDEX_DTYPE)
    return For(v, as_expr(start, INDEX_DTYPE), as_expr(extent, INDEX_DTYPE), kind, body(v))


def bound(name: str, value: int | PrimExpr, lets: list[Stmt]) -> int:
    """`value` as is when an int or a variable, else a variable bound to it by a LetStmt
    appended to `lets`: a symbolic size's expression evaluated once, not rebuilt in every
    loop bound that uses it (kernels over symbolic sizes stay small)."""
    if isinstance(value, (int, Var)):
        return cast(int, value)
    v = Var(name, INDEX_DTYPE)
    lets.append(LetStmt(v, as_expr(value, INDEX_DTYPE)))
    return cast(int, v)


def lanes_loop(name: str, extent: int, body: Callable[[PrimExpr], Stmt]) -> Stmt:
    """`for name in T.vectorized(extent)`: the lanes of a register tile. The
    vectorize-loops pass makes such a loop `T.vector` and both backends emit it as
    vector instructions, one per statement (kiln.transform.vectorize_loops), so a tile
    costs one IR statement per row instead of one per element."""
    return loop(name, extent, body, kind="vectorized") if extent > 1 else body(const(0))


def nest(names: Sequence[str], extents: Sequence[int],
         body: Callable[..., Stmt], kind: str = "serial") -> Stmt:
    """A loop nest over `extents` (loops of extent 1 are left out; one of extent 0 stays,
    so that the body runs zero times on an empty tensor)."""
    vs = [Var(n, INDEX_DTYPE) for n in names]
    # a symbolic extent (the batch: a dim scalar of the kernel) always loops
    loops = [not isinstance(e, int) or e != 1 for e in extents]
    idx: list[PrimExpr] = [v if lp else const(0) for v, lp in zip(vs, loops)]
    stmt = body(*idx)
    for v, e, lp in reversed(list(zip(vs, extents, loops))):
        if lp:
            stmt = For(v, const(0), as_expr(e, INDEX_DTYPE), kind, stmt)
    return stmt


def madd(acc: PrimExpr, a: PrimExpr, b: PrimExpr, fused: bool = True) -> PrimExpr:
    """`acc + a * b`: rounded once (the `fma` intrinsic, one instruction) when `fused`,
    which callers set when the target has FMA hardware (`ISA.fma`; elsewhere `fma`
    would be a libm call per multiply-add)."""
    return Intrin("fma", (a, b, acc)) if fused else acc + a * b


def parallel_tiles(extents: Sequence[int], body: Callable[..., Stmt]) -> Stmt:
    """`for i0, i1, ...` in `extents` as one loop over the flattened index, marked
    `parallel` (the backends split it evenly over threads; its iterations write disjoint
    output tiles, which the `parallelize` pass cannot see through the div/mod). Each index
    is computed once per tile and bound to a variable (the tile reads them many times)."""
    total = 1
    for e in extents:
        total *= e
    t = Var("tile", INDEX_DTYPE)
    split = _SPLIT.get()
    values = _unflatten(t, extents) if split != "inner" else _unflatten_inner(t, extents)
    idx: list[PrimExpr] = []
    lets: list[Stmt] = []
    for k, v in enumerate(values):
        if isinstance(v, (Const, Var)):
            idx.append(v)
        else:
            var = Var(f"i{k}", INDEX_DTYPE)
            lets.append(LetStmt(var, v))
            idx.append(var)
    # a symbolic extent (a dim scalar) counts as more than one tile
    kind = "parallel" if (not isinstance(total, int) or total > 1) and split != "serial" \
        else "serial"
    return For(t, const(0), as_expr(total, INDEX_DTYPE), kind, seq(*lets, body(*idx)))


def _unflatten(t: Var, extents: Sequence[int]) -> list[PrimExpr]:
    """The tile indices of flat index `t`, the last dimension fastest."""
    values: list[PrimExpr] = []
    rest: PrimExpr = t
    for k in range(len(extents) - 1, -1, -1):
        e = extents[k]
        if isinstance(e, int) and e == 1:
            values.append(const(0))
        elif k == 0:
            values.append(rest)
        else:
            values.append(rest % e)
            rest = rest // e
    values.reverse()
    return values


def _unflatten_inner(t: Var, extents: Sequence[int]) -> list[PrimExpr]:
    """The tile indices of flat index `t`, dimension 1 fastest, then 2, ..., the last,
    and the batch (dimension 0, which may be symbolic) slowest."""
    order = [*range(1, len(extents)), 0]
    real = [k for k in order if not (isinstance(extents[k], int) and extents[k] == 1)]
    values: dict[int, PrimExpr] = {}
    rest: PrimExpr = t
    for k in order:
        e = extents[k]
        if k not in real:
            values[k] = const(0)
        elif k == real[-1]:
            values[k] = rest
        else:
            values[k] = rest % e
            rest = rest // e
    return [values[k] for k in range(len(extents))]


def parallel_when(build: Callable[[], Stmt], work: int | PrimExpr, unit: str = "madd",
                  dtype: str = "float32", *, isa: ISA) -> Stmt:
    """The loop `build()` makes (a `parallel` For) run in parallel only when `work`
    (in `unit`s of `dtype`: "madd" or "element", kiln.kernels.parallel_work) is at
    least PARALLEL_MIN_NS of work on `isa`: serial when `work` is a
    smaller int; for a symbolic `work` (sizes known at run time) built twice, parallel
    and serial, chosen at run time, since a launch costs more than a small loop gains.
    (Built twice, not copied: each copy binds its own variables and buffers.)"""
    built = build()
    if not isinstance(built, For) or built.kind != "parallel" or _SPLIT.get() is not None:
        return built  # a tuned split goes parallel (or not) whatever the work
    threshold = min_parallel_work(unit, isa, dtype)
    if isinstance(work, int):
        return built if work >= threshold else For(built.var, built.start, built.extent,
                                                    "serial", built.body)
    again = build()
    assert isinstance(again, For)
    serial = For(again.var, again.start, again.extent, "serial", again.body)
    return IfThenElse(as_expr(work, INDEX_DTYPE) >= threshold, built, serial)


def with_lanes(isa: ISA, lanes: int) -> ISA:
    """`isa` with vectors of `lanes` float32 values (a pass's explicit override)."""
    return replace(isa, vector_bits=32 * lanes)

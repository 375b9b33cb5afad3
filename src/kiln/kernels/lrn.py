"""LRN's hand-built kernel for static float32 shapes: onnxruntime's running channel sum
and Eigen's float32 `pow`, step for step as kiln.ops.lrn's reference (its docstring
says the rule); a kiln.kernels.lowering.Lowering.

On a `precision=bf16` target (kiln.target.precision), whose convolutions round their
inputs to 8 significant bits, the usual `beta` 0.75 takes `s ** -0.75` as
`1 / (sqrt(s) * sqrt(sqrt(s)))`: three correctly rounded operations and a product, a
few float32 ulps from Eigen's `pow`, at a fraction of its vector code (GoogLeNet's two
LRN layers were a quarter of its bfloat16 call).

`lrn_nchwc`'s kernel (`LrnNchwcLowering`) sums each window directly across the channel
blocks of an NCHW{b}c tensor (kiln.ops.lrn says its rounding)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln.ir import graph as g
from kiln.ir import tensor as t
from kiln.kernels.tiles import const, lanes_loop, loop, parallel_tiles, parallel_when
from kiln.ops import te
from kiln.ops.lrn import F32, I32, I64, lrn_params, lrn_window
from kiln.ops.ort_pow import powf
from kiln.ops.registry import Attrs
from kiln.target.isa import ISA

# x + 1.5 * 2^23 for an integer-valued float32 |x| < 2^22 has the bits _ROUNDER_BITS + x.
_ROUNDER, _ROUNDER_BITS = 12582912.0, 0x4B400000


class LrnLowering:
    """`lrn` on float32 alone (not fused), the batch static or symbolic and every other
    axis static; the te definition otherwise."""

    #: A symbolic batch is the extent of the kernel's outermost loop (exporters leave the
    #: batch dynamic); the channel and image axes shape its chunks and must be static.
    supports_symbolic = True
    fuses_producers = False

    def builds(self, call: g.Call) -> bool:
        """Float32 calls whose axes after the batch are static."""
        (arg,) = call.args
        shape = getattr(arg.type, "shape", None)
        return getattr(arg.type, "dtype", None) == F32 and shape is not None and \
            len(shape) >= 2 and all(isinstance(d, int) for d in shape[1:])

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Mapping[str, Any], anchor: te.Tensor | None,
                    result: te.Tensor | None, name: str, isa: ISA) -> t.PrimFunc | None:
        """The kernel of one `lrn` call (any ISA: the backends split its vectors); None
        for a fused chain or another dtype."""
        (x_t,) = args
        if result is not None or anchor is not None or x_t.dtype != F32:
            return None
        if not all(isinstance(d, int) for d in x_t.shape[1:]):
            return None
        shape = tuple(x_t.shape)
        x = t.Buffer("x0", shape, F32)
        out = t.Buffer("out", shape, F32)
        return t.PrimFunc((x, out), _kernel(x, out, attrs, roots=_by_roots(attrs, isa),
                                                  fma=isa.fma, lanes=chunk_lanes(isa)))


LRN = LrnLowering()


def _by_roots(attrs: Attrs, isa: ISA) -> bool:
    """Whether the scale's power is taken by square roots (see the module docstring)."""
    return isa.precision == "bf16" and lrn_params(attrs)[1] == 0.75


class _IRArith:
    """kiln.ops.ort_pow's `Arith` building float32 IR; every intermediate is a
    let in `lets` (the expression would otherwise be a DAG copied out as a tree); with
    `fma` (the target's ISA has it) exact products take a fused multiply-add."""

    def __init__(self, fma: bool = False) -> None:
        self.lets: list[t.Stmt] = []
        self.fma = fma

    def const(self, v: float) -> t.PrimExpr:
        return t.Const(float(np.float32(v)), F32)

    def bind(self, x: t.PrimExpr) -> t.PrimExpr:
        if isinstance(x, (t.Var, t.Const)):
            return x
        v = t.Var(f"p{len(self.lets)}", x.dtype)
        self.lets.append(t.LetStmt(v, x))
        return v

    def round(self, x: t.PrimExpr) -> t.PrimExpr:
        return t.intrin("round", x)

    def floor(self, x: t.PrimExpr) -> t.PrimExpr:
        return t.intrin("floor", x)

    def frexp(self, x: t.PrimExpr) -> tuple[t.PrimExpr, t.PrimExpr]:
        # subnormals are scaled into the normal range first (their exponent field is 0)
        sub = x < self.const(2.0 ** -126)
        xs = self.bind(t.select(sub, x * self.const(2.0 ** 24), x))
        bits = self.bind(t.reinterpret(xs, I32))
        m = t.reinterpret((bits & t.Const(0x007FFFFF, I32)) | t.Const(0x3F000000, I32), F32)
        e = t.Cast(F32, t.binary("shr", bits, t.Const(23, I32)) - t.Const(126, I32))
        return self.bind(m), self.bind(e - t.select(sub, self.const(24.0), self.const(0.0)))

    def _exp2i(self, n: t.PrimExpr) -> t.PrimExpr:
        # 2^n for an integer-valued float n: n + 1.5 2^23 holds n in its low bits (no
        # float-to-int conversion, which is not vector code), shifted into the exponent
        low = t.reinterpret(n + self.const(_ROUNDER), I32) - t.Const(_ROUNDER_BITS, I32)
        return t.reinterpret((low + t.Const(127, I32)) << t.Const(23, I32), F32)

    def ldexp(self, x: t.PrimExpr, n: t.PrimExpr) -> t.PrimExpr:
        # two factors 2^h 2^(n-h): exact for every normal result, no exponent overflow
        h = self.bind(t.intrin("floor", n * self.const(0.5)))
        return self.bind(self.bind(x * self._exp2i(h)) * self._exp2i(n - h))

    def select(self, cond: t.PrimExpr, a: t.PrimExpr, b: t.PrimExpr) -> t.PrimExpr:
        return t.select(cond, a, b)

    def less(self, a: t.PrimExpr, b: t.PrimExpr) -> t.PrimExpr:
        return a < b

    def recip(self, x: t.PrimExpr) -> t.PrimExpr:
        return self.const(1.0) / x

    def equal(self, a: t.PrimExpr, b: t.PrimExpr) -> t.PrimExpr:
        return t.compare("eq", a, b)

    def product_error(self, x: t.PrimExpr, y: t.PrimExpr, hi: t.PrimExpr
                      ) -> t.PrimExpr | None:
        return t.intrin("fma", x, y, -hi) if self.fma else None


# Lanes of one vector chunk of the last axis at least (the backends split it on
# narrower targets).
MIN_LANES = 16


def chunk_lanes(isa: ISA) -> int:
    """Lanes of one chunk on `isa`: two of its vectors at least, so that the power's
    long dependency chain runs two independent vectors side by side (one leaves the
    core waiting on latencies; docs/performance.md, "Float32 LRN (Inception)")."""
    return max(MIN_LANES, 2 * isa.lanes(F32))


def _kernel(x: t.Buffer, out: t.Buffer, attrs: Attrs, roots: bool = False,
            fma: bool = False, lanes: int = MIN_LANES) -> t.Stmt:
    """Per chunk of up to `lanes` elements of the last axis (and per index of the axes
    between C and it): the running-sum scale of every channel into `out`, each channel
    reading the previous one, then `out = x * scale ** -beta` (by square roots with
    `roots`, beta 0.75; exact products by fused multiply-adds with `fma`). Chunks are
    independent (the parallel loop); the lanes of a chunk are vector code."""
    shape = x.shape  # the batch may be symbolic (LrnLowering), the rest is static
    channels, rest = int(shape[1]), tuple(int(d) for d in shape[2:])
    n = t.Var("n", I64)
    outer = [t.Var(f"i{k}", I64) for k in range(len(rest) - 1)]

    def chunk(start: t.PrimExpr, count: int) -> t.Stmt:
        def at(c: t.PrimExpr, v: t.Var) -> tuple[t.PrimExpr, ...]:
            last = (start + v,) if rest else ()
            return (n, c, *outer, *last)

        def vector(body: Callable[[t.Var], t.Stmt]) -> t.Stmt:
            v = t.Var("v", I64)  # a fresh variable per loop (the IR binds each once)
            return _loop(v, count, body(v), "vectorized")

        return _chunk_body(x, out, at, channels, count, attrs, vector, roots, fma)

    if rest:
        width = rest[-1]
        w0 = t.Var("w0", I64)
        inner = [_loop(w0, width // lanes, chunk(w0 * t.Const(lanes, I64), lanes))] \
            if width >= lanes else []
        if width % lanes:
            inner.append(chunk(t.Const(width - width % lanes, I64), width % lanes))
        nest = t.seq(*inner)
        for var, extent in reversed(list(zip(outer, rest[:-1]))):
            nest = _loop(var, extent, nest)
    else:
        nest = chunk(t.Const(0, I64), 1)
    if not isinstance(shape[0], int):
        return t.For(n, t.Const(0, I64), t.as_expr(shape[0], I64), "serial", nest)
    return _loop(n, shape[0], nest)


def _loop(var: t.Var, extent: int, body: t.Stmt, kind: str = "serial", start: int = 0) -> t.Stmt:
    return t.For(var, t.Const(start, I64), t.Const(extent - start, I64), kind, body)


def _chunk_body(x: t.Buffer, out: t.Buffer, at: Any, channels: int, count: int,
                attrs: Attrs, vector: Callable[[Callable[[t.Var], t.Stmt]], t.Stmt],
                roots: bool, fma: bool) -> t.Stmt:
    """One chunk of `count` lanes: channel 0's scale, the running sum over channels
    1.., the normalization; `vector(body)` is the chunk's vector loop around
    `body(lane)`, and `at(c, lane)` the index of channel `c` in it."""
    _, before, after = lrn_window(attrs)
    a, beta, bias = lrn_params(attrs)
    zero = t.Const(0.0, F32)
    # the previous channel's scale, per lane, in a stack buffer: reading it back from
    # `out` would hide from the vector-loop analysis that the lanes are independent
    prev = t.Buffer("prev", (count,), F32, "local")

    def term(ch: t.PrimExpr, lane: t.Var, valid: t.PrimExpr | None) -> t.PrimExpr:
        # a * x^2 of channel `ch`; a channel outside the tensor adds 0 (onnxruntime's
        # zero padding: s + 0 == s for the positive scale)
        idx = ch if valid is None else t.max_(t.min_(ch, t.Const(channels - 1, I64)),
                                             t.Const(0, I64))
        v = x[at(idx, lane)]
        sq = t.Const(a, F32) * (v * v)
        return sq if valid is None else t.select(valid, sq, zero)

    def keep(c: t.PrimExpr, lane: t.Var, value: t.PrimExpr) -> t.Stmt:
        s = t.Var("s", F32)
        return t.seq(t.LetStmt(s, value), t.Store(prev, s, (lane,)),
                     t.Store(out, s, at(c, lane)))

    def first(lane: t.Var) -> t.Stmt:
        total: t.PrimExpr = t.Const(float(np.float32(bias)), F32)
        for k in range(-before, after + 1):
            if 0 <= k < channels:
                total = total + term(t.Const(k, I64), lane, None)
        return keep(t.Const(0, I64), lane, total)

    c1, c2 = t.Var("c", I64), t.Var("c", I64)

    def step(lane: t.Var) -> t.Stmt:
        head, tail = c1 + t.Const(after, I64), c1 - t.Const(1 + before, I64)
        value = (prev[lane] + term(head, lane, head < t.Const(channels, I64))) \
            - term(tail, lane, tail >= t.Const(0, I64))
        return keep(c1, lane, value)

    def normalize(lane: t.Var) -> t.Stmt:
        ar = _IRArith(fma)
        scale = ar.bind(out[at(c2, lane)])
        if roots:
            root = ar.bind(t.intrin("sqrt", scale))
            value = ar.recip(root * t.intrin("sqrt", root))
        else:
            value = powf(ar, scale, -beta)
        return t.seq(*ar.lets, t.Store(out, x[at(c2, lane)] * value, at(c2, lane)))

    return t.seq(t.Allocate(prev), vector(first),
                 _loop(c1, channels, vector(step), start=1),
                 _loop(c2, channels, vector(normalize)))




class LrnNchwcLowering(LrnLowering):
    """`lrn_nchwc` (kiln.ops.lrn) on float32 alone, the batch static or symbolic and the
    other axes static: per row of an image, for each position, every channel's
    `a x^2` into a stack row with `before` and `after` zeros around it (one vector per
    channel block), then each block's window sums as `size` unaligned vector loads of
    that row, the scale's power and the product in the same vector loop. Rows are the
    parallel loop."""

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor],
                    attrs: Mapping[str, Any], anchor: te.Tensor | None,
                    result: te.Tensor | None, name: str, isa: ISA) -> t.PrimFunc | None:
        """The kernel of one `lrn_nchwc` call; None for a fused chain or a symbolic axis
        past the batch."""
        (x_t,) = args
        if result is not None or anchor is not None or x_t.dtype != F32 \
                or not all(isinstance(d, int) for d in x_t.shape[1:]):
            return None
        x = t.Buffer("x0", tuple(x_t.shape), F32)
        out = t.Buffer("out", tuple(x_t.shape), F32)
        return t.PrimFunc((x, out), _nchwc_kernel(x, out, attrs, isa))


LRN_NCHWC = LrnNchwcLowering()


def _nchwc_kernel(x: t.Buffer, out: t.Buffer, attrs: Attrs, isa: ISA) -> t.Stmt:
    """The loop nest of `LrnNchwcLowering` (its docstring)."""
    batch, blocks, height, width, block = x.shape
    size, before, after = lrn_window(attrs)
    a, beta, bias = lrn_params(attrs)
    roots = bool(attrs.get("roots"))
    channels = int(blocks) * int(block)

    def row(n: t.PrimExpr, h: t.PrimExpr) -> t.Stmt:
        sq = t.Buffer("sq", (before + channels + after,), F32, "local")
        zeros = [t.Store(sq, t.Const(0.0, F32), (const(k),))
                 for k in (*range(before), *range(before + channels, before + channels + after))]

        def squares(w: t.PrimExpr, cb: t.PrimExpr) -> t.Stmt:
            def lane(v: t.PrimExpr) -> t.Stmt:
                value = x[n, cb, h, w, v]
                return t.Store(sq, t.Const(a, F32) * (value * value),
                               (cb * const(block) + v + const(before),))
            return lanes_loop("v", int(block), lane)

        def normalize(w: t.PrimExpr, cb: t.PrimExpr) -> t.Stmt:
            def lane(v: t.PrimExpr) -> t.Stmt:
                ar = _IRArith(isa.fma)
                total: t.PrimExpr = t.Const(float(np.float32(bias)), F32)
                for k in range(size):
                    total = total + sq[cb * const(block) + v + const(k)]
                s = ar.bind(total)
                if roots:
                    root = ar.bind(t.intrin("sqrt", s))
                    value = ar.recip(root * t.intrin("sqrt", root))
                else:
                    value = powf(ar, s, -beta)
                idx = (n, cb, h, w, v)
                return t.seq(*ar.lets, t.Store(out, x[idx] * value, idx))
            return lanes_loop("v", int(block), lane)

        def position(w: t.PrimExpr) -> t.Stmt:
            return t.seq(loop("cb", int(blocks), lambda cb: squares(w, cb)),
                         loop("cb", int(blocks), lambda cb: normalize(w, cb)))

        return t.seq(t.Allocate(sq), *zeros, loop("w", int(width), position))

    return parallel_when(lambda: parallel_tiles((batch, height), row),
                         batch * channels * height * width * size, "element", isa=isa)

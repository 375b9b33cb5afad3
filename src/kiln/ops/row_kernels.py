"""Row kernels: softmax, log_softmax, layer_norm and reductions over trailing axes, by hand.

Their tensor-expression definitions (kiln.ops.reduce) materialize a row max and
a row sum (softmax) or a mean and a variance (layer_norm) in global arrays, each
in its own loop nest, then normalize in a third. These kernels walk one row at
a time instead, every row's statistics held in `lanes` stack accumulators (the
innermost loops are `vectorized` of constant extent, lanes along the row):

- softmax: pass 1 the row max; pass 2 `e = exp(x - max)` stored into the
  output while summing; pass 3, over the output only (in cache), `e * (1/sum)`.
  One `exp` per element (an online max/sum in two passes would need three: two
  while rescaling the running sum, one to normalize);
- log_softmax: pass 1 the max; pass 2 the sum of `exp(x - max)`; pass 3
  `x - max - log(sum)`;
- layer_norm: pass 1 the mean, shifted (`k + sum(x - k) / n`, `k` the row's
  first element; a row whose sum overflows sums `x / n` again), pass 2 the sum
  of squared deviations from it (two passes: float32 keeps its accuracy when
  the mean is large against the spread, and rows whose squares overflow get
  onnxruntime's 0, not inf - inf), pass 3 `(x - mean) * rsqrt(var + eps) *
  scale + bias`; the sums in several vectors of accumulators (independent add
  chains);
  marked `residual` (recognize-composites: its input is a residual sum), as
  onnxruntime's SkipLayerNormalization computes it instead (layer_norm_welford_rows),
  so that a quantized model's next DynamicQuantizeLinear sees onnxruntime's values;
  marked `like_onnxruntime` (the other layer norms of a quantized model), as
  onnxruntime's LayerNormalization computes it with MLAS's AVX2 kernel on an x86 target
  with AVX2 and FMA (layer_norm_mlas_row: a float64 mean, then centred FMA squares);
- softmax's lane sums are added up as onnxruntime's MLAS kernels add theirs
  (`folded_sum`), its `exp` being MLAS's softmax exp too on CPU targets
  (kiln.ops.kernels.math.softmax_exp_f32: `x - max` clamped at -88.38, one `2^n`);
- reductions over trailing axes (reduce_sum/mean/max/..., global pooling): one
  pass, `lanes` partial results combined at the end (a single accumulator
  would be a serial chain the backend cannot vectorize).

Rows split over threads: the row loops write disjoint slices of the output, so
the `parallelize` pass marks one `parallel` when the work pays for it. FuseOps
may hand these kernels an elementwise chain on each side (`lower_fused`):
producers are inlined where the row is read (a scale, a mask, a residual add),
consumers where the result is stored.
Other dtypes and axes keep the tensor-expression definitions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from kiln.errors import IRError
from kiln.ir import graph as g
from kiln.ir.attrs import ATTR_ROW_KERNEL
from kiln.ir.dtype import INDEX_DTYPE
from kiln.ir.shape_expr import dim_product
from kiln.ir.tensor import (
    Allocate,
    Buffer,
    Cast,
    Const,
    DeclBuffer,
    For,
    IfThenElse,
    LetStmt,
    PrimExpr,
    PrimFunc,
    Stmt,
    Store,
    Var,
    as_expr,
    intrin,
    max_,
    min_,
    seq,
)
from kiln.ir.types import TensorType
from kiln.ops import nan_order, te
from kiln.ops.epilogue import SubstituteLoad
from kiln.ops.kernels.tiles import parallel_when, tile_lanes
from kiln.ops.registry import HandBuiltOp
from kiln.target.isa import ISA

Attrs = Mapping[str, Any]
SOFTMAX, LOG_SOFTMAX, LAYER_NORM = "softmax", "log_softmax", "layer_norm"
#: layer_norm's attribute asking for onnxruntime's LayerNormalization arithmetic where the
#: target runs MLAS's kernel (recognize-composites sets it where activations are quantized).
LIKE_ONNXRUNTIME = "like_onnxruntime"
F32 = "float32"
FLT_MAX = float.fromhex("0x1.fffffep+127")
#: Independent vector accumulators of a row's sums (latency: see _stat_loops).
STAT_CHAINS = 4
#: Vectors of rows whose Welford chains (a division each step) run side by side.
WELFORD_VECTORS = 4

Reader = Callable[[PrimExpr], PrimExpr]  # the row's element j (an index expression)


def _c(v: int) -> Const:
    return Const(v, INDEX_DTYPE)


def _tree(values: Sequence[PrimExpr], combine: Callable[[PrimExpr, PrimExpr], PrimExpr]
          ) -> PrimExpr:
    """`values` combined pairwise (a balanced tree: shallow, and sums stay accurate)."""
    items = list(values)
    while len(items) > 1:
        items = [combine(items[k], items[k + 1]) if k + 1 < len(items) else items[k]
                 for k in range(0, len(items), 2)]
    return items[0]


@dataclass(frozen=True)
class RowLoops:
    """Loops over one row of `n` elements in chunks of `lanes` (vectorized) plus a tail;
    `n` may be symbolic (a dim scalar of the kernel): then so are the loop extents."""

    n: int | PrimExpr
    lanes: int

    def each(self, body: Callable[[PrimExpr, PrimExpr], Stmt]) -> Stmt:
        """`body(j, lane)` for every element j of the row, lane = j's accumulator."""
        if not isinstance(self.n, int):
            n = as_expr(self.n, INDEX_DTYPE)
            c, lane, t = Var("c", INDEX_DTYPE), Var("l", INDEX_DTYPE), Var("t", INDEX_DTYPE)
            count, let_count = _let("chunks", n // self.lanes)
            vector = For(lane, _c(0), _c(self.lanes), "vectorized",
                         body(c * self.lanes + lane, lane))
            # the tail has fewer than `lanes` elements: the bound says so to `parallelize`
            rest = For(t, _c(0), min_(self.lanes - 1, n - count * self.lanes), "serial",
                       body(t + count * self.lanes, t))
            return seq(let_count, For(c, _c(0), count, "serial", vector), rest)
        chunks, tail = divmod(self.n, self.lanes)
        parts: list[Stmt] = []
        if chunks:
            c, lane = Var("c", INDEX_DTYPE), Var("l", INDEX_DTYPE)
            inner = For(lane, _c(0), _c(self.lanes), "vectorized",
                        body(c * self.lanes + lane, lane))
            parts.append(For(c, _c(0), _c(chunks), "serial", inner) if chunks > 1 else
                         _bind_zero(c, inner))
        if tail:
            lane = Var("t", INDEX_DTYPE)
            parts.append(For(lane, _c(0), _c(tail), "serial",
                             body(lane + chunks * self.lanes, lane)))
        return seq(*parts)

    def accumulators(self, name: str, init: PrimExpr) -> tuple[Buffer, list[Stmt]]:
        """A stack array of one accumulator per lane, and the statements setting it."""
        acc = Buffer(name, (self.lanes,), init.dtype, "local")
        lane = Var("l", INDEX_DTYPE)
        return acc, [Allocate(acc), For(lane, _c(0), _c(self.lanes), "vectorized",
                                        Store(acc, init, (lane,)))]

    def combined(self, acc: Buffer, combine: Callable[[PrimExpr, PrimExpr], PrimExpr]
                 ) -> PrimExpr:
        return _tree([acc[_c(k)] for k in range(self.lanes)], combine)

    def folded_sum(self, acc: Buffer) -> PrimExpr:
        """The lanes' sum in the order of onnxruntime's MLAS softmax kernels, so equal lane
        sums give its row sum bit for bit: AVX-512 (16 lanes) adds the upper half of the
        vector onto the lower half, then neighbours pairwise (its `vhaddps`); AVX2 (8
        lanes, MlasComputeSumExpF32KernelFma3) neighbours pairwise from the start (two
        `vhaddps`, then the two 128-bit halves)."""
        lanes: list[PrimExpr] = [acc[_c(k)] for k in range(self.lanes)]
        if self.lanes > 8:
            half = self.lanes // 2
            lanes = [lanes[k] + lanes[k + half] for k in range(half)]
        return _tree(lanes, _add)


def _bind_zero(var: Var, body: Stmt) -> Stmt:
    return seq(LetStmt(var, _c(0)), body)


def _let(name: str, value: PrimExpr) -> tuple[Var, Stmt]:
    v = Var(name, value.dtype)
    return v, LetStmt(v, value)


def _row_max(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """max(a, b) that skips a NaN `b` (one `maxps`, against three instructions for the
    NaN-propagating `max`): a row with a NaN still gives NaN everywhere, through
    `exp(NaN - max)` in its sum."""
    return nan_order.max_keep_first(a, b)


def _softmax_exp(x: PrimExpr, lets: list[Stmt], *, isa: ISA) -> PrimExpr:
    """`exp(x)` of softmax's `x - max`: on a CPU target (`isa.kind`), float32, as
    onnxruntime's softmax computes it (kiln.ops.kernels.math.softmax_exp_f32, its
    intermediate values let variables appended to `lets`); elsewhere the `exp` intrinsic."""
    from kiln.ops.kernels.math import CPU_KINDS, softmax_exp_f32

    if isa.kind not in CPU_KINDS or x.dtype != F32:
        return intrin("exp", x)

    def bind(e: PrimExpr) -> PrimExpr:
        if isinstance(e, (Var, Const)):
            return e
        v = Var(f"x{len(lets)}", e.dtype)
        lets.append(LetStmt(v, e))
        return v

    return softmax_exp_f32(x, fused=isa.fma, bind=bind)


def softmax_row(loops: RowLoops, read: Reader, out_at: Callable[[PrimExpr], Any],
                store: Callable[[PrimExpr, PrimExpr], Stmt], log: bool, *, isa: ISA) -> Stmt:
    """One row of softmax (or log_softmax): `read(j)` is the input element j,
    `store(j, v)` writes result element j (applying any epilogue), `out_at(j)` reads
    back what pass 2 stored (softmax only)."""
    m, init_m = loops.accumulators("row_max", te.lowest_value(F32))
    s, init_s = loops.accumulators("row_sum", as_expr(0.0, F32))
    pass1 = loops.each(lambda j, lane: Store(m, _row_max(m[lane], read(j)), (lane,)))
    mx, let_mx = _let("mx", loops.combined(m, _row_max))
    if log:
        pass2 = loops.each(lambda j, lane: Store(
            s, s[lane] + intrin("exp", read(j) - mx), (lane,)))
        log_sum, let_shift = _let("log_sum", intrin("log", loops.folded_sum(s)))
        # (x - max) first: max + log_sum would round away the low bits of large inputs
        pass3 = loops.each(lambda j, lane: store(j, (read(j) - mx) - log_sum))
        return seq(*init_m, pass1, let_mx, *init_s, pass2, let_shift, pass3)

    def exp_and_sum(j: PrimExpr, lane: PrimExpr) -> Stmt:
        lets: list[Stmt] = []
        e, let_e = _let("e", _softmax_exp(read(j) - mx, lets, isa=isa))
        buf, idx = out_at(j)
        return seq(*lets, let_e, Store(buf, e, idx), Store(s, s[lane] + e, (lane,)))

    pass2 = loops.each(exp_and_sum)
    inv, let_inv = _let("inv", as_expr(1.0, F32) / loops.folded_sum(s))

    def scale(j: PrimExpr, lane: PrimExpr) -> Stmt:
        buf, idx = out_at(j)
        return store(j, buf[idx] * inv)

    return seq(*init_m, pass1, let_mx, *init_s, pass2, let_inv, loops.each(scale))


def layer_norm_row(loops: RowLoops, read: Reader, store: Callable[[PrimExpr, PrimExpr], Stmt],
                   affine: Callable[[PrimExpr, PrimExpr], PrimExpr], eps: float,
                   fused: bool = False, stats: RowLoops | None = None) -> Stmt:
    """One row of layer_norm in three passes, like onnxruntime's kernel: the mean, the sum
    of squared deviations from it, then `affine(j, (x - mean) * rstd)` (scale and bias of
    normalized element j). `stats`: the loops of the two sums (more lanes than `loops`:
    independent add chains); `fused`: multiply-adds.

    The mean is `k + sum(x - k) / n`, `k` the row's first element (float32 keeps its
    digits when the mean is far from zero against the spread); a row whose sum
    overflows (+-3e38) sums `x / n` again instead (`_scaled_mean`). The variance is the
    sum over `n`, infinite when the squares overflow: then every normalized value is 0,
    as onnxruntime's. A row holding inf or NaN gives NaN."""
    stats = stats or loops
    n = as_expr(float(loops.n), F32) if isinstance(loops.n, int) else Cast(F32, loops.n)
    k, let_k = _let("k", read(_c(0)))
    s1, init1 = stats.accumulators("sum", as_expr(0.0, F32))
    s2, init2 = stats.accumulators("sum_sq", as_expr(0.0, F32))
    pass1 = stats.each(lambda j, lane: Store(s1, s1[lane] + (read(j) - k), (lane,)))
    mean_at = Buffer("mean", (1,), F32, "local")
    total, let_total = _let("total", _lane_sum(stats, s1))
    # only finite rows overflow to +-inf here (inf or NaN in the row makes the sum NaN)
    overflow = intrin("abs", total) > as_expr(FLT_MAX, F32)
    shifted = seq(Allocate(mean_at), Store(mean_at, k + total / n, (_c(0),)),
                  IfThenElse(overflow, _scaled_mean(stats, read, n, mean_at, fused)))
    mean, let_mean = _let("m", mean_at[_c(0)])

    def add_square(j: PrimExpr, lane: PrimExpr) -> Stmt:
        d, let_d = _let("d", read(j) - mean)
        return seq(let_d, Store(s2, _mul_add(d, d, s2[lane], fused), (lane,)))

    var = _lane_sum(stats, s2) / n
    rstd, let_rstd = _let("rstd", intrin("rsqrt", var + as_expr(eps, F32)))
    pass3 = loops.each(lambda j, lane: store(j, affine(j, (read(j) - mean) * rstd)))
    return seq(let_k, *init1, pass1, let_total, shifted, let_mean, *init2,
               stats.each(add_square), let_rstd, pass3)


def _scaled_mean(stats: RowLoops, read: Reader, n: PrimExpr, mean_at: Buffer,
                 fused: bool) -> Stmt:
    """`mean_at[0] = sum(x / n)`: a row's mean where the sum of `x` overflows."""
    inv_n, let_inv_n = _let("inv_n", as_expr(1.0, F32) / n)
    acc, init = stats.accumulators("sum_scaled", as_expr(0.0, F32))
    step = stats.each(lambda j, lane: Store(acc, _mul_add(read(j), inv_n, acc[lane], fused),
                                            (lane,)))
    return seq(let_inv_n, *init, step, Store(mean_at, _lane_sum(stats, acc), (_c(0),)))


def _lane_sum(loops: RowLoops, acc: Buffer) -> PrimExpr:
    """The sum of `loops`' accumulators: a power of two of them upper half onto lower, as
    vector registers add (one vector add per level), others pairwise."""
    if loops.lanes & (loops.lanes - 1) == 0:
        return _halving_sum(acc, loops.lanes)
    return loops.combined(acc, _add)


def _mul_add(a: PrimExpr, b: PrimExpr, c: PrimExpr, fused: bool) -> PrimExpr:
    return intrin("fma", a, b, c) if fused else a * b + c


def layer_norm_welford_rows(count: int, read: Callable[[PrimExpr, PrimExpr], PrimExpr],
                            n: int, eps: float,
                            normalize: Callable[[PrimExpr, PrimExpr, PrimExpr], Stmt]) -> Stmt:
    """`count` rows of layer_norm, lane `l` of the statistics loop on row `l`: Welford's
    running mean and sum of squared deviations, element by element in row order, then
    `normalize(l, mean, std)` for each row (`std = sqrt(var + eps)`). This is
    onnxruntime's SkipLayerNormalization on float32, step for step (its kernel's
    `mean += d / k`, `m2 += d * (x - mean)`, then `(x - mean) / std * gamma + beta`), so
    the two agree bit for bit; a row's elements are read `count` rows apart, but the
    serial chain through the mean, not the loads, bounds the loop, and `count` rows run
    it side by side."""
    lane = Var("l", INDEX_DTYPE)
    kind = "vectorized" if count > 1 else "serial"
    mean = Buffer("w_mean", (count,), F32, "local")
    m2 = Buffer("w_m2", (count,), F32, "local")
    k = Var("k", INDEX_DTYPE)
    zero = as_expr(0.0, F32)
    init = For(lane, _c(0), _c(count), kind, seq(Store(mean, zero, (lane,)),
                                                 Store(m2, zero, (lane,))))
    x, let_x = _let("x", read(lane, k))
    d, let_d = _let("d", x - mean[lane])
    m, let_m = _let("m", mean[lane] + d / Cast(F32, k + _c(1)))
    step = For(k, _c(0), _c(n), "serial", For(lane, _c(0), _c(count), kind, seq(
        let_x, let_d, let_m, Store(mean, m, (lane,)),
        Store(m2, m2[lane] + d * (x - m), (lane,)))))
    # the statistics leave the stack (a loop over rows reading stack arrays could not be
    # split over threads: parallelize may outline it)
    stats = Buffer("w_stats", (2, count), F32)
    keep = For(lane, _c(0), _c(count), kind, seq(
        Store(stats, mean[lane], (_c(0), lane)),
        Store(stats, intrin("sqrt", m2[lane] / as_expr(float(n), F32) + as_expr(eps, F32)),
              (_c(1), lane))))
    r = Var("r", INDEX_DTYPE)
    rows = For(r, _c(0), _c(count), "serial", normalize(r, stats[_c(0), r], stats[_c(1), r]))
    return seq(Allocate(mean), Allocate(m2), Allocate(stats), init, step, keep, rows)


#: The shortest row onnxruntime's MLAS LayerNorm kernel takes (shorter ones run its
#: scalar code, which `layer_norm_mlas_row` does not repeat).
MLAS_LAYER_NORM_MIN = 8


def mlas_layer_norm(isa: ISA) -> bool:
    """Whether onnxruntime runs LayerNormalization with MLAS's AVX2 kernel on a CPU of `isa`
    (x86 with AVX2 and FMA: MLAS picks it from the CPU, on AVX-512 ones too)."""
    return isa.arch in ("x86_64", "i386", "i686") and isa.fma and "avx2" in isa.features


def _halving_sum(acc: Buffer, lanes: int) -> PrimExpr:
    """The lanes' sum as a vector register is reduced: the upper half added onto the lower
    until one lane is left (`(a0 + a2) + (a1 + a3)` for 4 lanes)."""
    items: list[PrimExpr] = [acc[_c(k)] for k in range(lanes)]
    while len(items) > 1:
        half = len(items) // 2
        items = [items[k] + items[k + half] for k in range(half)]
    return items[0]


def _chunks(n: int, lanes: int, body: Callable[[PrimExpr, PrimExpr], Stmt]) -> Stmt:
    """`body(j, lane)` over the first `n // lanes` chunks of `lanes` elements (vectorized)."""
    chunks = n // lanes
    if not chunks:
        return seq()
    c, lane = Var("c", INDEX_DTYPE), Var("l", INDEX_DTYPE)
    inner = For(lane, _c(0), _c(lanes), "vectorized", body(c * lanes + lane, lane))
    return For(c, _c(0), _c(chunks), "serial", inner) if chunks > 1 else _bind_zero(c, inner)


def _serial(start: int, stop: int, body: Callable[[PrimExpr], Stmt]) -> Stmt:
    if stop <= start:
        return seq()
    j = Var("j", INDEX_DTYPE)
    return For(j, _c(0), _c(stop - start), "serial", body(j + start))


def layer_norm_mlas_row(n: int, read: Reader, store: Callable[[PrimExpr, PrimExpr], Stmt],
                        affine: Callable[[PrimExpr, PrimExpr], PrimExpr], eps: float) -> Stmt:
    """One row of layer_norm as onnxruntime's LayerNormalization computes it on x86 with
    AVX2 and FMA (MLAS's AVX2 LayerNorm kernel, rows of `MLAS_LAYER_NORM_MIN` or more),
    step for step, so the two agree bit for bit (probed on onnxruntime 1.32's outputs and
    its Mean / InvStdDev outputs, docs/quantization.md):

    - the mean in float64: 4 lanes over chunks of 4, reduced upper half onto lower, the
      last `n % 4` elements added in order, divided by `n` and rounded to float32;
    - the centred squares `d = x - mean` in float32: 8 lanes over chunks of 8 with FMA,
      reduced upper half onto lower; of the last `n % 8`, whole groups of 4 add their
      rounded squares in order (its compiler's vectorized tail), the rest with FMA;
    - `inv = 1 / sqrt(var / n + eps)` in float32, then `affine(j, (x - mean) * inv)`
      (`fma(y, gamma, beta)`: the caller's)."""
    f64 = "float64"
    dacc, init_d = RowLoops(n, 4).accumulators("sum_f64", as_expr(0.0, f64))
    dsum = Buffer("mean_f64", (1,), f64, "local")
    zero = (_c(0),)
    pass1 = seq(*init_d, _chunks(n, 4, lambda j, lane: Store(
        dacc, dacc[lane] + Cast(f64, read(j)), (lane,))),
        Allocate(dsum), Store(dsum, _halving_sum(dacc, 4), zero),
        _serial(n - n % 4, n, lambda j: Store(dsum, dsum[zero] + Cast(f64, read(j)), zero)))
    mean, let_mean = _let("mean", Cast(F32, dsum[zero] / as_expr(float(n), f64)))

    vacc, init_v = RowLoops(n, 8).accumulators("centred", as_expr(0.0, F32))
    var = Buffer("var", (1,), F32, "local")
    tail = n - n % 8
    rounded = tail + (n % 8) // 4 * 4  # the tail's groups of 4: rounded squares

    def square(j: PrimExpr) -> tuple[Var, Stmt]:
        return _let("d", read(j) - mean)

    def lanes_step(j: PrimExpr, lane: PrimExpr) -> Stmt:
        d, let_d = square(j)
        return seq(let_d, Store(vacc, intrin("fma", d, d, vacc[lane]), (lane,)))

    def rounded_step(j: PrimExpr) -> Stmt:
        d, let_d = square(j)
        return seq(let_d, Store(var, var[zero] + d * d, zero))

    def fused_step(j: PrimExpr) -> Stmt:
        d, let_d = square(j)
        return seq(let_d, Store(var, intrin("fma", d, d, var[zero]), zero))

    pass2 = seq(*init_v, _chunks(n, 8, lanes_step), Allocate(var),
                Store(var, _halving_sum(vacc, 8), zero), _serial(tail, rounded, rounded_step),
                _serial(rounded, n, fused_step))
    inv, let_inv = _let("inv", as_expr(1.0, F32) / intrin(
        "sqrt", var[zero] / as_expr(float(n), F32) + as_expr(eps, F32)))
    loops = RowLoops(n, 8)
    pass3 = loops.each(lambda j, lane: store(j, affine(j, (read(j) - mean) * inv)))
    return seq(pass1, let_mean, pass2, let_inv, pass3)


def _stat_loops(n: int | PrimExpr, lanes: int) -> RowLoops:
    """The loops of a row's sums: `STAT_CHAINS` vectors of `lanes` accumulators where the
    row holds them without a longer scalar tail, so that many independent add chains
    hide the adds' latency (one chain of `lanes` makes each sum latency-bound)."""
    if not isinstance(n, int):
        return RowLoops(n, lanes)
    chains = next(k for k in (STAT_CHAINS, 2, 1) if k == 1 or (
        n >= k * lanes and n % (k * lanes) < lanes))
    return RowLoops(n, lanes * chains)


def _add(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    return a + b


def _row_index(flat: PrimExpr, outer: Sequence[int]) -> tuple[PrimExpr, ...]:
    """The index of row `flat` (< the row count) over the static dims `outer`: like
    te.unflatten_index, without the remainder for the outermost dim of more than one
    row (a BERT's (1, 128) rows are (0, flat), a plain stride the loads vectorize on)."""
    index = list(te.unflatten_index(flat, outer))
    lead = next((k for k, d in enumerate(outer) if d > 1), None)
    if lead is not None:
        index[lead] = flat // math.prod(outer[lead + 1:]) if lead + 1 < len(outer) else flat
    return tuple(index)


def mean_of(total: PrimExpr, count: int | PrimExpr) -> PrimExpr:
    """`total / count`; a symbolic `count` (a product of int64 dim scalars) is converted to
    the total's dtype first."""
    return total / (count if isinstance(count, int) else Cast(total.dtype, count))


@dataclass(frozen=True)
class Rows:
    """The loop nest over the rows (`outer`, the dims before the reduced ones), loops of
    extent 1 left out. Static loops are `serial`; each row writes its own slice of the
    output, so the `parallelize` pass splits them over threads when the work pays for a
    launch (its `min_work`). Symbolic row counts: see `around`."""

    outer: tuple[int | PrimExpr, ...]
    row_work: int | PrimExpr = 1  # elements of one row (a symbolic row count's loop)

    def around(self, row: Callable[[tuple[PrimExpr, ...]], Stmt], *, isa: ISA) -> Stmt:
        """The loops over every row around `row(index)`, the statements of one row."""
        if all(isinstance(d, int) for d in self.outer):
            index_vars = [Var(f"i{k}", INDEX_DTYPE) for k in range(len(self.outer))]
            body = row(tuple(v if _loops(d) else _c(0)
                             for v, d in zip(index_vars, self.outer)))
            for v, d in reversed(list(zip(index_vars, self.outer))):
                if _loops(d):
                    body = For(v, _c(0), as_expr(d, INDEX_DTYPE), "serial", body)
            return body
        # Symbolic row counts: one parallel loop over every row, not a loop per dim (the
        # outermost, which threads would split, may be 1 at run time: a batch of one).
        # Rows are independent; `parallelize` cannot see it through the divisions that
        # recover the row's index, so the loop is marked here, and taken only when the
        # rows hold enough work (`parallel_when`).
        count = dim_product(self.outer)

        def loop() -> For:
            r = Var("row", INDEX_DTYPE)
            lets: list[Stmt] = []
            index: list[PrimExpr] = []
            for k, (i, d) in enumerate(zip(te.unflatten_index(r, self.outer),
                                           self.outer)):
                v = Var(f"i{k}", INDEX_DTYPE)
                if _loops(d):
                    lets.append(LetStmt(v, i))
                index.append(v if _loops(d) else _c(0))
            return For(r, _c(0), as_expr(count, INDEX_DTYPE), "parallel",
                       seq(*lets, row(tuple(index))))

        return parallel_when(loop, count * self.row_work, "element", isa=isa)


def _loops(d: int | PrimExpr) -> bool:
    """Whether a row dim needs a loop: more than one row, or a symbolic count (a dim
    scalar of the kernel)."""
    return not isinstance(d, int) or d > 1


@dataclass(frozen=True)
class RowOp(HandBuiltOp):
    """softmax / log_softmax / layer_norm with hand-built row kernels (`lower_fused`).

    `fuses_producers`: FuseOps may fuse an elementwise chain producing the row
    input into the kernel, not only one consuming its result.
    """

    fuses_producers = True
    #: Symbolic row counts and row lengths are loop extents (static vector chunks).
    supports_symbolic: ClassVar[bool] = True

    def builds(self, call: g.Call) -> bool:
        t = call.args[0].type if call.args else None
        if not (isinstance(t, TensorType) and t.dtype == F32 and t.shape):
            return False
        axis = call.attrs.get("axis", -1)
        return isinstance(axis, int) and axis % len(t.shape) == len(t.shape) - 1

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                    anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        """The kernel computing `result` (an elementwise chain over `anchor`, this op
        applied to `args`, which may be elementwise chains over `params`; None: the op
        alone) with buffer parameters `params` + the output; None when the hand-built
        kernel does not apply (another dtype or axis, a chain needing statements)."""
        x = args[0]
        final = result if result is not None else anchor
        # MLAS's layer norm writes its output once, in the last pass: a consumer chain
        # may end in another type there (a QuantizeLinear's bytes)
        mlas = self._mlas(attrs, x.shape[-1] if x.ndim else 0, isa=isa)
        if x.dtype != F32 or (final is not None and final.dtype != F32 and not mlas) or \
                any(t.dtype != F32 for t in args[1:]):
            return None
        axis = int(attrs.get("axis", -1)) % max(x.ndim, 1)
        if x.ndim == 0 or axis != x.ndim - 1 or \
                not all(isinstance(d, int) for t in args[1:] for d in t.shape):
            return None
        n = x.shape[-1]
        outer = x.shape[:-1]
        buffers = {t: Buffer(t.name, t.shape, t.dtype) for t in params}
        out = Buffer("out", x.shape, final.dtype if final is not None else F32)
        value_buf = Buffer("row_value", x.shape, F32)
        mapping = dict(buffers)
        if anchor is not None:
            mapping[anchor] = value_buf
        zero = (_c(0),) * x.ndim
        try:  # a chain needing statements (a reduction, a table) is not fused here
            te.inline_expr(x, zero, buffers)
            if result is not None:
                te.inline_expr(result, zero, mapping)
        except IRError:
            return None
        if self.name == LAYER_NORM and not isinstance(n, int):
            return None  # its shift reads element 0, which an empty row lacks
        if self.name == LAYER_NORM and isinstance(n, int) and \
                all(isinstance(d, int) for d in outer) and attrs.get("residual"):
            kernel = self._welford_groups(x, args, attrs, n, buffers, mapping, value_buf,
                                          out, result, isa=isa)
        else:
            kernel = Rows(tuple(outer), n).around(
                lambda o: self._row(o, x, args, attrs, n, buffers, mapping, value_buf, out,
                                    result, isa=isa), isa=isa)
        return PrimFunc((*(buffers[t] for t in params), out), kernel,
                        {ATTR_ROW_KERNEL: self.name})

    def _welford_groups(self, x: te.Tensor, args: Sequence[te.Tensor], attrs: Attrs, n: int,
                        buffers: dict[te.Tensor, Buffer], mapping: dict[te.Tensor, Buffer],
                        value_buf: Buffer, out: Buffer, result: te.Tensor | None, *,
                        isa: ISA) -> Stmt:
        """layer_norm over static rows in groups of `lanes` rows
        (layer_norm_welford_rows), the groups split over threads like rows."""
        outer = [int(d) for d in x.shape[:-1]]
        total = math.prod(outer)
        vector = tile_lanes(isa)
        lanes = vector * WELFORD_VECTORS
        eps = float(attrs.get("epsilon", 1e-5))
        loops = RowLoops(n, min(vector, max(n, 1)))

        def group(base: PrimExpr, count: int) -> Stmt:
            def index(row: PrimExpr, j: PrimExpr) -> tuple[PrimExpr, ...]:
                return (*_row_index(base + row, outer), j)

            def normalize(row: PrimExpr, mean: PrimExpr, std: PrimExpr) -> Stmt:
                def at(j: PrimExpr, lane: PrimExpr) -> Stmt:
                    idx = index(row, j)
                    y = self._affine(args, idx, x.ndim, buffers, (out[idx] - mean) / std)
                    if result is not None:
                        y = SubstituteLoad(value_buf, y).visit_expr(
                            te.inline_expr(result, idx, mapping))
                    return Store(out, y, idx)
                return loops.each(at)

            # the input (the residual sum) stored into the output row by row first: the
            # statistics then read one array, `n` apart, and the normalization reads it back
            r = Var("r", INDEX_DTYPE)
            inputs = For(r, _c(0), _c(count), "serial", loops.each(
                lambda j, lane: Store(out, te.inline_expr(x, index(r, j), buffers),
                                      index(r, j))))
            return seq(inputs, layer_norm_welford_rows(
                count, lambda row, j: out[index(row, j)], n, eps, normalize))

        groups, rest = divmod(total, lanes)
        parts: list[Stmt] = []
        if groups:
            gv = Var("g", INDEX_DTYPE)
            parts.append(parallel_when(
                lambda: For(gv, _c(0), _c(groups), "parallel", group(gv * lanes, lanes)),
                groups * lanes * n, "element", isa=isa))
        if rest:
            parts.append(group(_c(groups * lanes), rest))
        return seq(*parts)

    def _mlas(self, attrs: Attrs, n: int | PrimExpr, *, isa: ISA) -> bool:
        """Whether this op's rows are onnxruntime's LayerNormalization on MLAS's kernel
        (layer_norm_mlas_row): marked `like_onnxruntime`, rows of static length it takes,
        a target CPU it runs on."""
        return self.name == LAYER_NORM and bool(attrs.get(LIKE_ONNXRUNTIME)) and \
            not attrs.get("residual") and isinstance(n, int) and \
            n >= MLAS_LAYER_NORM_MIN and mlas_layer_norm(isa)

    @staticmethod
    def _affine(args: Sequence[te.Tensor], idx: tuple[PrimExpr, ...], ndim: int,
                buffers: dict[te.Tensor, Buffer], y: PrimExpr, fused: bool = False
                ) -> PrimExpr:
        """`y * scale + bias` at output index `idx` (layer_norm's optional operands); with
        both and `fused`, `fma(y, scale, bias)` (one rounding, as MLAS's kernel)."""
        def operand(k: int) -> PrimExpr | None:
            t = args[k] if len(args) > k else None
            return None if t is None else te.inline_expr(t, tuple(idx[ndim - t.ndim:]), buffers)

        scale, bias = operand(1), operand(2)
        if fused and scale is not None and bias is not None:
            return intrin("fma", y, scale, bias)
        if scale is not None:
            y = y * scale
        return y + bias if bias is not None else y

    def _row(self, o: tuple[PrimExpr, ...], x: te.Tensor, args: Sequence[te.Tensor],
             attrs: Attrs, n: int | PrimExpr, buffers: dict[te.Tensor, Buffer],
             mapping: dict[te.Tensor, Buffer], value_buf: Buffer, out: Buffer,
             result: te.Tensor | None, *, isa: ISA) -> Stmt:
        """The statements of the row at outer index `o`."""

        def index(j: PrimExpr) -> tuple[PrimExpr, ...]:
            return (*o, j)

        def read(j: PrimExpr) -> PrimExpr:
            return te.inline_expr(x, index(j), buffers)

        def store(j: PrimExpr, v: PrimExpr) -> Stmt:
            if result is not None:
                v = SubstituteLoad(value_buf, v).visit_expr(
                    te.inline_expr(result, index(j), mapping))
            return Store(out, v, index(j))

        lanes = tile_lanes(isa)
        loops = RowLoops(n, min(lanes, max(n, 1)) if isinstance(n, int) else lanes)
        if self.name == LAYER_NORM:
            eps = float(attrs.get("epsilon", 1e-5))
            if self._mlas(attrs, n, isa=isa):
                assert isinstance(n, int)
                return layer_norm_mlas_row(n, read, store, lambda j, y: self._affine(
                    args, index(j), x.ndim, buffers, y, fused=True), eps)

            def affine(j: PrimExpr, y: PrimExpr) -> PrimExpr:
                return self._affine(args, index(j), x.ndim, buffers, y)

            return layer_norm_row(loops, read, store, affine, eps, fused=isa.fma,
                                  stats=_stat_loops(n, loops.lanes))
        return softmax_row(loops, read, lambda j: (out, index(j)), store,
                           self.name == LOG_SOFTMAX, isa=isa)


# --------------------------------------------------------------------------- reductions

_COMBINE: dict[str, Callable[[PrimExpr, PrimExpr], PrimExpr]] = {
    "sum": _add, "prod": lambda a, b: a * b, "max": max_, "min": min_,
    "scan_max": nan_order.max_keep_first, "scan_min": nan_order.min_keep_first}


def _identity(kind: str) -> PrimExpr:
    if kind in ("max", "scan_max"):
        return te.lowest_value(F32)
    if kind in ("min", "scan_min"):
        return te.highest_value(F32)
    return as_expr(1.0 if kind == "prod" else 0.0, F32)


def reduce_row(loops: RowLoops, read: Reader, kind: str,
               pre: Callable[[PrimExpr], PrimExpr] | None) -> tuple[list[Stmt], PrimExpr]:
    """Statements reducing one row with `kind` over `pre(read(j))`, and the total."""
    combine = _COMBINE[kind]
    acc, init = loops.accumulators("partial", _identity(kind))

    def step(j: PrimExpr, lane: PrimExpr) -> Stmt:
        v = read(j)
        return Store(acc, combine(acc[lane], pre(v) if pre else v), (lane,))

    total_value = loops.combined(acc, combine)
    if kind in ("scan_max", "scan_min"):
        # the lanes skip every NaN; onnxruntime's scan keeps a leading one
        total_value = nan_order.with_leading_nan(read(_c(0)), total_value)
    total, let_total = _let("total", total_value)
    return [*init, loops.each(step), let_total], total


@dataclass(frozen=True)
class RowReduceOp(HandBuiltOp):
    """A reduction whose kernel is built by hand when its axes are the trailing ones (a
    contiguous block per output element): `kind` combines `pre(x)` over the block, then
    `post(total, count)`; `axes_of(attrs, ndim)` are the reduced axes."""

    kind: str = "sum"
    pre: Callable[[PrimExpr], PrimExpr] | None = None
    post: Callable[[PrimExpr, Any], PrimExpr] | None = None
    axes_of: Callable[[Attrs, int], tuple[int, ...]] | None = None

    fuses_producers = True
    #: Symbolic row counts and reduced extents are loop extents (static vector chunks).
    supports_symbolic: ClassVar[bool] = True

    def _trailing_axes(self, shape: Sequence[Any], attrs: Attrs) -> bool:
        assert self.axes_of is not None
        axes = self.axes_of(attrs, len(shape))
        return bool(axes) and axes == tuple(range(len(shape) - len(axes), len(shape)))

    def builds(self, call: g.Call) -> bool:
        t = call.args[0].type if call.args else None
        return (isinstance(t, TensorType) and t.dtype == F32 and 0 not in t.shape
                and self._trailing_axes(t.shape, call.attrs))

    def lower_fused(self, params: Sequence[te.Tensor], args: Sequence[te.Tensor], attrs: Attrs,
                    anchor: te.Tensor | None, result: te.Tensor | None,
                    name: str, isa: ISA) -> PrimFunc | None:
        x = args[0]
        out_t = result if result is not None else anchor
        assert self.axes_of is not None
        axes = self.axes_of(attrs, x.ndim)
        if x.dtype != F32 or (out_t is not None and out_t.dtype != F32) or not axes or \
                axes != tuple(range(x.ndim - len(axes), x.ndim)) or 0 in x.shape:
            return None
        inner = x.shape[x.ndim - len(axes):]
        outer = x.shape[:x.ndim - len(axes)]
        reduced = self.infer([TensorType(x.shape, x.dtype)], attrs)
        assert isinstance(reduced, TensorType)
        out_shape = tuple(reduced.shape)
        buffers = {t: Buffer(t.name, t.shape, t.dtype) for t in params}
        # A row over several static trailing dims of a parameter is read through a view
        # of it with those dims merged: consecutive elements, one vector load per chunk
        # (the unflattened index's divisions made every chunk a gather).
        flat = (Buffer(x.name + "_rows", (*outer, dim_product(inner)), x.dtype)
                if x in buffers and len(inner) > 1 and all(isinstance(d, int) for d in inner)
                else None)
        out = Buffer("out", out_shape, F32)
        value_buf = Buffer("row_value", out_shape, F32)
        mapping = dict(buffers)
        if anchor is not None:
            mapping[anchor] = value_buf
        zero = (_c(0),) * x.ndim
        try:
            te.inline_expr(x, zero, buffers)
            if result is not None:
                te.inline_expr(result, (_c(0),) * len(out_shape), mapping)
        except IRError:
            return None
        count = dim_product(inner)  # an expression of the dim scalars when symbolic

        def row(o: tuple[PrimExpr, ...]) -> Stmt:
            # the output keeps the row dims, then 1s for the reduced ones with keepdims
            out_idx = (*o, *(_c(0),) * (len(out_shape) - len(o)))

            def read(j: PrimExpr) -> PrimExpr:
                if flat is not None:
                    return flat[(*o, j)]
                idx = (j,) if len(inner) == 1 else te.unflatten_index(j, inner)
                return te.inline_expr(x, (*o, *idx), buffers)

            lanes = tile_lanes(isa)
            loops = RowLoops(count, min(lanes, count) if isinstance(count, int) else lanes)
            stmts, total = reduce_row(loops, read, self.kind, self.pre)
            v = self.post(total, count) if self.post else total
            v = v if v.dtype == F32 else Cast(F32, v)
            if result is not None:
                v = SubstituteLoad(value_buf, v).visit_expr(
                    te.inline_expr(result, tuple(out_idx), mapping))
            return seq(*stmts, Store(out, v, out_idx))

        body = Rows(tuple(outer), count).around(row, isa=isa)
        if flat is not None:
            body = seq(DeclBuffer(flat, buffers[x], 0), body)
        return PrimFunc((*(buffers[t] for t in params), out), body,
                        {ATTR_ROW_KERNEL: self.name})
